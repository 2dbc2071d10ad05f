"""`proctor serve`: the approval inbox as a FastAPI application (pages and a JSON API over one run store).

Pages (server-rendered, Jinja2; a small script adds keyboard shortcuts): ``/`` pending
approvals (filter by tool, principal, run label), ``/approvals/{id}``, ``/runs``,
``/runs/{id}``, ``/login``; ``POST /runs/{id}/halt`` and ``POST /halts/{id}/lift`` (an
approver in ``--halt-groups`` halts a run, or lifts a run's halt, its id typed as
confirmation: `proctor.serve.halting`). API: ``GET /api/approvals``, ``GET
/api/approvals/{id}``, ``POST /api/approvals/{id}`` with ``{decision, binding, reason,
args?, grant?}``, ``GET /api/runs``, ``GET /api/runs/{id}``, ``GET /api/halts``, ``POST
/api/runs/{id}/halt`` and ``POST /api/halts/{id}/lift`` with ``{reason, confirm?}``. Status
codes: 401 without valid credentials, 403 for four eyes, a missing CSRF token, a cross-origin
post or an approver outside the halt groups, 404 unknown id, 409 a binding that does not
match (or an approval no longer pending), 422 an answer that cannot be taken, 413 a body
over the limit, 415 a body of a type the route does not take, 503 halting not set up.

Hardened as a web app (`proctor.serve.guard`): every response forbids framing and any
script but the inbox's own; bodies are bounded before anything parses them, and a
request's credentials are checked (from its headers) before its body is read. An
external or destructive call is approved in the browser only with its tool name typed
as confirmation: no single keypress, and nothing a framing or scripting page can give.
There are no interactive API docs (no third-party script runs in the inbox's origin);
``--openapi`` serves the schema, to approvers only, at ``/api/openapi.json``.
See docs/approvals.md.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from proctor.approval.answers import answer, believed, grant_preview, take_back_forged
from proctor.approval.tokens import TokenFile
from proctor.audit.base import AuditSink
from proctor.errors import (
    ApprovalConflict,
    ApprovalNotFound,
    ConfigurationError,
    FourEyes,
    InvalidAnswer,
    RunNotFound,
    StoreError,
)
from proctor.halt import HaltBackend
from proctor.jsoninput import loads_bounded
from proctor.serve.auth import COOKIE, Identity, Sessions, cross_origin, csrf_ok, identify
from proctor.serve.guard import DEFAULT_MAX_BODY, ASGIApp, RequestGuard
from proctor.serve.halting import HaltDesk, HaltRefused
from proctor.serve.views import approval_view, display_fields, filter_approvals, run_view
from proctor.store.answerseal import AnswerSeal
from proctor.store.base import RunStore
from proctor.store.refusals import RefusalSink
from proctor.termsafe import marked_html

__all__ = ["CONFIRMED_CLASSES", "AnswerBody", "HaltBody", "InboxApp", "create_app"]

HERE = Path(__file__).parent
#: Side-effect classes whose approval in the browser needs the tool's name typed as confirmation.
CONFIRMED_CLASSES = frozenset({"external", "destructive"})
_FORM_FIELDS = 16  # the most fields any of the inbox's forms has, with room


class InboxApp(FastAPI):
    """The inbox's FastAPI app, with `RequestGuard` outside everything (Starlette's error pages included)."""

    max_body: int = DEFAULT_MAX_BODY

    def build_middleware_stack(self) -> ASGIApp:
        return RequestGuard(super().build_middleware_stack(), max_body=self.max_body)


class AnswerBody(BaseModel):
    """An answer through the API (the same fields as the approval page's form)."""

    decision: str
    binding: str
    reason: str = ""
    args: dict[str, Any] | None = None
    grant: dict[str, Any] | None = None
    #: With a session (a browser): the tool's name, typed, to approve an external or destructive call.
    confirm: str = ""


class HaltBody(BaseModel):
    """A halt of a run through the API: why, and (with a session: a browser) the run's id typed."""

    reason: str
    confirm: str = ""


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_STATUS = ((FourEyes, 403), (ApprovalConflict, 409), (InvalidAnswer, 422), (ApprovalNotFound, 404),
           (RunNotFound, 404), (StoreError, 503))


def _status_of(exc: StoreError) -> int:
    return next(code for kind, code in _STATUS if isinstance(exc, kind))


def create_app(store: RunStore, tokens: TokenFile, *, proxy_header: str | None = None,
               sessions: Sessions | None = None, trusted_proxies: int | None = None,
               max_body: int = DEFAULT_MAX_BODY, resumes: bool = False, openapi: bool = False,
               halts: HaltBackend | None = None, audit: AuditSink | None = None,
               halt_groups: Collection[str] = (), refusals: RefusalSink | None = None,
               answers: AnswerSeal) -> FastAPI:
    """The inbox over `store`, accepting the approvers in `tokens` (and a trusted proxy's header, if named).

    `answers` seals every answer the inbox stores (`proctor.store.answerseal`): the key of the runs' audit
    trail for answers, which the runs' gates check; an answer under any other key is not believed.

    `trusted_proxies`: how many reverse proxies stand before the server (the client's address is
    the entry of ``X-Forwarded-For`` the outermost one wrote); default 1 with `proxy_header`, else 0.
    `max_body`: the largest request body, in bytes. `resumes`: this server resumes answered runs
    (``--resume``), as the pages then say. `openapi`: serve the schema at ``/api/openapi.json``.
    `halts`: where the fleet's halts are (shown on every page); approvers in `halt_groups` may halt
    a run from its page, recorded in `audit` (`proctor.serve.halting`).
    `refusals`: where an answer refused for who gave it or what it echoes is recorded (``approval_refused``;
    `proctor serve` gives the runs' audit trail: `audit` when it holds it open, else
    `proctor.store.refusals.AuditTrail`); without it, only the inbox's log says so.
    """
    hops = trusted_proxies if trusted_proxies is not None else (1 if proxy_header is not None else 0)
    if hops < 0:
        raise ConfigurationError("trusted_proxies must be 0 or more")
    app = InboxApp(title="proctor approval inbox", docs_url=None, redoc_url=None, openapi_url=None)
    app.max_body = max_body
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False, default=str)
    templates.env.filters["tojson_edit"] = _editable_json
    templates.env.filters["iso"] = _iso
    # Compact JSON text for display (through `m` after it); Jinja's own `tojson` writes \\uXXXX for every
    # non-ASCII character, which would hide a look-alike behind an escape nobody reads.
    templates.env.filters["json_text"] = lambda v: json.dumps(v, ensure_ascii=False, default=str)
    # Untrusted text in element content goes through `m`: escaped, look-alikes and invisibles marked.
    templates.env.filters["m"] = lambda v: Markup(marked_html("" if v is None else v))
    sessions = sessions or Sessions()
    def principal_of(run_id: str) -> str | None:
        try:
            return store.get_run(run_id).principal or ""
        except RunNotFound:
            return None

    desk = HaltDesk(halts, audit, frozenset(halt_groups), principal_of)

    def who(request: Request) -> Identity | None:
        return identify(request, tokens, sessions, proxy_header, hops)

    def page(request: Request, name: str, identity: Identity | None, status: int = 200, **context: Any
             ) -> HTMLResponse:
        if identity is not None and "halts" not in context:  # the banner of active halts, on every page
            context["halts"], context["halt_error"] = desk.active()
        if identity is not None:  # whether the banner offers to lift a run's halt
            context["halt_lift"] = desk.refusal(tokens.groups.get(identity.name)) is None
        return templates.TemplateResponse(request, name, {"me": identity, **context}, status_code=status)

    def halt_context(identity: Identity, run_id: str, principal: str | None, agent: str | None, back: str,
                     tool: str | None = None) -> dict[str, Any]:
        """What a run's or an approval's page shows of halts: those stopping it, and the halt form or why not."""
        active, error = desk.active()
        refusal = desk.refusal(tokens.groups.get(identity.name))
        return {"halts": active, "halt_error": error,
                "run_halts": desk.stopping(active, run_id, principal, agent, tool),
                "halt_form": {"run_id": run_id, "back": back} if refusal is None else None,
                # an approver who may halt but cannot here (503: not set up) is told why; one who may not sees no form
                "halt_note": str(refusal) if refusal is not None and refusal.status == 503 else None}

    def guard_post(request: Request) -> Identity:
        """The checks of an unsafe request that need no body: origin, then credentials."""
        if cross_origin(request):
            raise _Refused(403, "cross-origin request refused")
        identity = who(request)
        if identity is None:
            raise _Refused(401, "not signed in: log in, or send Authorization: Bearer TOKEN")
        return identity

    def check_csrf(identity: Identity, csrf: str | None) -> None:
        if not csrf_ok(identity, csrf):
            raise _Refused(403, "missing or wrong CSRF token: reload the page and try again")

    async def form_of(request: Request) -> Any:
        # The body is bounded (and its type checked) by RequestGuard before this reads it.
        return await request.form(max_files=0, max_fields=_FORM_FIELDS)

    @app.exception_handler(_Refused)
    async def refused(request: Request, exc: _Refused) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        if exc.status == 401:
            return RedirectResponse(f"/login?next={request.url.path}", status_code=303)
        return page(request, "error.html", who(request), exc.status, message=str(exc), code=exc.status)

    @app.exception_handler(HaltRefused)
    async def halt_refused(request: Request, exc: HaltRefused) -> Response:
        return await refused(request, _Refused(exc.status, str(exc)))

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> Response:
        return await refused(request, _Refused(_status_of(exc), str(exc)))

    def need(request: Request) -> Identity:
        identity = who(request)
        if identity is None:
            raise _Refused(401, "not signed in: log in, or send Authorization: Bearer TOKEN")
        return identity

    # -- login ----------------------------------------------------------------------------------

    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request, next: str = "/") -> HTMLResponse:
        return page(request, "login.html", None, next=_local(next))

    @app.post("/login")
    async def login(request: Request) -> Response:
        if cross_origin(request):
            raise _Refused(403, "cross-origin request refused")
        form = await form_of(request)
        name = tokens.who(str(form.get("token", "")).strip())
        target = _local(str(form.get("next", "/")))
        fingerprint = tokens.fingerprint(name) if name is not None else None
        if name is None or fingerprint is None:
            return page(request, "login.html", None, 401, next=target, failed=True)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, sessions.open(name, fingerprint), httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path="/")
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        identity = guard_post(request)
        form = await form_of(request)
        check_csrf(identity, str(form.get("csrf", "")))
        sid = request.cookies.get(COOKIE)
        if sid and identity.via == "session":
            sessions.close(sid)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- pages ----------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse)
    def pending(request: Request, tool: str = "", principal: str = "", label: str = "") -> HTMLResponse:
        identity = need(request)
        take_back_forged(store, answers, refusals)  # a hand-written answer hides no call from the list
        items = filter_approvals(store.list_approvals(status="pending"), tool=tool, principal=principal, label=label)
        return page(request, "approvals.html", identity, approvals=[a.as_dict() for a in items],
                    filters={"tool": tool, "principal": principal, "label": label})

    @app.get("/approvals/{approval_id}", response_class=HTMLResponse)
    def approval_page(request: Request, approval_id: str) -> HTMLResponse:
        identity = need(request)
        view = approval_view(store, believed(store, store.get_approval(approval_id), answers, refusals),
                             resumes=resumes)
        own = view["approval"]["principal"] is not None and view["approval"]["principal"] == identity.name
        confirm = view["approval"]["side_effect"] in CONFIRMED_CLASSES
        a = view["approval"]
        try:  # (an approval whose run the store does not hold is still shown, as `approval_view` does)
            run = store.get_run(a["run_id"])
            principal, agent = run.principal, run.agent
        except StoreError:
            principal, agent = a["principal"], None
        halting = halt_context(identity, a["run_id"], principal, agent, f"/approvals/{approval_id}", tool=a["tool"])
        return page(request, "approval.html", identity, own=own, confirm=confirm, **halting, **view)

    @app.post("/approvals/{approval_id}")
    async def answer_form(request: Request, approval_id: str) -> Response:
        identity = guard_post(request)
        form = await form_of(request)
        check_csrf(identity, str(form.get("csrf", "")))
        decision = str(form.get("decision", ""))
        args = _json(str(form.get("args", "")), "edited arguments") if decision == "edit" else None
        grant = {"args": _json(str(form.get("grant", "") or "{}"), "grant patterns")} if decision == "grant" else None
        confirm = str(form.get("confirm", ""))
        await run_in_threadpool(_confirmed, approval_id, decision, confirm)
        await run_in_threadpool(answer, store, approval_id, approver=identity.name, address=identity.address,
                                decision=decision, binding=str(form.get("binding", "")),
                                reason=str(form.get("reason", "")), args=args, grant=grant,
                                method=identity.via, groups=tokens.groups.get(identity.name), refusals=refusals,
                                seal=answers)
        return RedirectResponse(f"/approvals/{approval_id}", status_code=303)

    def _confirmed(approval_id: str, decision: str, confirm: str) -> None:
        """An external or destructive call runs only if the approver typed its tool's name (a browser's answer)."""
        if decision == "deny":
            return
        current = store.get_approval(approval_id)
        if current.side_effect in CONFIRMED_CLASSES and confirm.strip() != current.tool:
            raise _Refused(422, f"{current.tool} is {current.side_effect}: type its name, {current.tool}, "
                                "in the confirmation field to let it run")

    @app.get("/runs", response_class=HTMLResponse)
    def runs_page(request: Request, status: str = "") -> HTMLResponse:
        identity = need(request)
        runs = store.list_runs(status=status or None)  # type: ignore[arg-type]
        return page(request, "runs.html", identity, runs=[r.as_dict() for r in runs], selected=status)

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(request: Request, run_id: str) -> HTMLResponse:
        identity = need(request)
        run = store.get_run(run_id)
        halting = halt_context(identity, run.run_id, run.principal, run.agent, f"/runs/{run.run_id}")
        return page(request, "run.html", identity, **halting, **run_view(store, run))

    @app.post("/runs/{run_id}/halt")
    async def halt_form(request: Request, run_id: str) -> Response:
        identity = guard_post(request)
        form = await form_of(request)
        check_csrf(identity, str(form.get("csrf", "")))
        run = await run_in_threadpool(store.get_run, run_id)  # 404 for a run the store does not hold
        await run_in_threadpool(desk.halt_run, run.run_id, str(form.get("reason", "")), str(form.get("confirm", "")),
                                approver=identity.name, address=identity.address, method=identity.via,
                                approver_groups=tokens.groups.get(identity.name))
        return RedirectResponse(_local(str(form.get("back", "") or f"/runs/{run.run_id}")), status_code=303)

    @app.post("/halts/{halt_id}/lift")
    async def lift_form(request: Request, halt_id: str) -> Response:
        identity = guard_post(request)
        form = await form_of(request)
        check_csrf(identity, str(form.get("csrf", "")))
        await run_in_threadpool(desk.lift, halt_id, str(form.get("reason", "")), str(form.get("confirm", "")),
                                approver=identity.name, address=identity.address, method=identity.via,
                                approver_groups=tokens.groups.get(identity.name))
        return RedirectResponse(_local(str(form.get("back", "") or "/")), status_code=303)

    # -- API ------------------------------------------------------------------------------------

    @app.get("/api/approvals")
    def api_approvals(request: Request, tool: str = "", principal: str = "", label: str = "",
                      status: str = "pending") -> list[dict[str, Any]]:
        need(request)
        take_back_forged(store, answers, refusals)
        items = store.list_approvals(status=None if status == "all" else status)  # type: ignore[arg-type]
        return [{**a.as_dict(), "display": display_fields(a, a.shown_args if a.shown_args is not None else a.args,
                                                          None)}
                for a in filter_approvals(items, tool=tool, principal=principal, label=label)]

    @app.get("/api/approvals/{approval_id}")
    def api_approval(request: Request, approval_id: str) -> dict[str, Any]:
        need(request)
        return approval_view(store, believed(store, store.get_approval(approval_id), answers, refusals),
                             resumes=resumes)

    # The body is parsed here, bounded in size (RequestGuard) and depth, not by FastAPI (deep JSON
    # would be a 500), and only once the request's credentials hold.
    @app.post("/api/approvals/{approval_id}")
    async def api_answer(request: Request, approval_id: str) -> dict[str, Any]:
        identity = guard_post(request)
        check_csrf(identity, request.headers.get("x-csrf-token"))
        raw = await request.body()
        try:
            body = AnswerBody.model_validate(_json(raw.decode("utf-8", "replace"), "answer"))
        except ValidationError as exc:
            raise _Refused(422, f"answer: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        if identity.via == "session":  # a browser: the same confirmation as the page's forms
            await run_in_threadpool(_confirmed, approval_id, body.decision, body.confirm)
        return await run_in_threadpool(_answer_api, identity, approval_id, body)

    def _answer_api(identity: Identity, approval_id: str, body: AnswerBody) -> dict[str, Any]:
        answered = answer(store, approval_id, approver=identity.name, address=identity.address,
                          decision=body.decision, binding=body.binding, reason=body.reason, args=body.args,
                          grant=body.grant, method=identity.via, groups=tokens.groups.get(identity.name),
                          refusals=refusals, seal=answers)
        return answered.as_dict()

    @app.get("/api/approvals/{approval_id}/grant-preview")
    def api_grant_preview(request: Request, approval_id: str, patterns: str = "{}") -> dict[str, Any]:
        need(request)
        parsed = _json(patterns, "patterns")
        if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
            raise _Refused(422, 'patterns must be a JSON object of argument names to patterns')
        return {"admits": grant_preview(store.get_approval(approval_id), parsed)}

    @app.get("/api/runs")
    def api_runs(request: Request, status: str = "") -> list[dict[str, Any]]:
        need(request)
        return [r.as_dict() for r in store.list_runs(status=status or None)]  # type: ignore[arg-type]

    @app.get("/api/runs/{run_id}")
    def api_run(request: Request, run_id: str) -> dict[str, Any]:
        need(request)
        return run_view(store, store.get_run(run_id))

    @app.get("/api/halts")
    def api_halts(request: Request) -> dict[str, Any]:
        need(request)
        active, error = desk.active()
        if error is not None:
            raise _Refused(503, error)
        return {"halts": active}

    @app.post("/api/runs/{run_id}/halt")
    async def api_halt(request: Request, run_id: str) -> dict[str, Any]:
        identity = guard_post(request)
        check_csrf(identity, request.headers.get("x-csrf-token"))
        raw = await request.body()
        try:
            body = HaltBody.model_validate(_json(raw.decode("utf-8", "replace"), "halt"))
        except ValidationError as exc:
            raise _Refused(422, f"halt: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        run = await run_in_threadpool(store.get_run, run_id)
        # A token (a script, `curl`) names the run in the URL; a browser's session types it, as the page does.
        confirm = body.confirm if identity.via == "session" else run.run_id
        halt = await run_in_threadpool(desk.halt_run, run.run_id, body.reason, confirm, approver=identity.name,
                                       address=identity.address, method=identity.via,
                                       approver_groups=tokens.groups.get(identity.name))
        return {"halt": halt.as_dict()}

    @app.post("/api/halts/{halt_id}/lift")
    async def api_lift(request: Request, halt_id: str) -> dict[str, Any]:
        identity = guard_post(request)
        check_csrf(identity, request.headers.get("x-csrf-token"))
        raw = await request.body()
        try:
            body = HaltBody.model_validate(_json(raw.decode("utf-8", "replace"), "lift"))
        except ValidationError as exc:
            raise _Refused(422, f"lift: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        confirm = body.confirm if identity.via == "session" else halt_id  # as for a halt: a browser types it
        lifted = await run_in_threadpool(desk.lift, halt_id, body.reason, confirm, approver=identity.name,
                                         address=identity.address, method=identity.via,
                                         approver_groups=tokens.groups.get(identity.name))
        return {"lifted": lifted.as_dict()}

    if openapi:
        @app.get("/api/openapi.json", include_in_schema=False)
        def api_schema(request: Request) -> dict[str, Any]:
            need(request)
            schema: dict[str, Any] = app.openapi()
            return schema

    app.state.store = store
    return app


def _json(text: str, what: str) -> Any:
    """JSON from a form field or a request body, bounded in size and depth (a 422 naming where it is wrong)."""
    try:
        return loads_bounded(text, what)
    except ConfigurationError as exc:
        raise _Refused(422, str(exc)) from None


def _iso(ns: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc).isoformat(timespec="milliseconds")


def _editable_json(value: Any) -> str:
    """JSON for a text box the approver edits: every invisible character written as its JSON escape
    (``\\u202e``), so the box shows it and it parses back to the same value; the rest as is."""
    from proctor.termsafe import is_invisible

    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    out = []
    for ch in text:
        if is_invisible(ch) and ch not in "\n\t":  # the layout's own newlines stay
            code = ord(ch)
            if code > 0xFFFF:  # JSON writes a character beyond the BMP as a surrogate pair
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def _local(target: str) -> str:
    """A redirect target on this site only (an open redirect would let a link log someone in elsewhere)."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"
