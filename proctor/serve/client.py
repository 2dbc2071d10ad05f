"""The inbox's JSON API from Python and the terminal (`proctor approvals … --server URL --token T`).

Stdlib HTTP only, so a terminal elsewhere needs no server extra. Refusals come back as the
store's own errors: 401 → `StoreError`, 403 → `FourEyes` (or a refusal naming CSRF/origin),
404 → `ApprovalNotFound`, 409 → `ApprovalConflict`, 422 → `InvalidAnswer`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from proctor.errors import ApprovalConflict, ApprovalNotFound, FourEyes, InvalidAnswer, StoreError

__all__ = ["InboxClient"]

_ERRORS: dict[int, type[StoreError]] = {403: FourEyes, 404: ApprovalNotFound, 409: ApprovalConflict,
                                        422: InvalidAnswer}


class InboxClient:
    """Talks to `proctor serve` at `url` as the approver whose bearer `token` this is."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 30.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise StoreError(f"--server {url!r}: expected http(s)://HOST[:PORT]")
        if not token:
            raise StoreError("an inbox server needs a token: --token T or $PROCTOR_TOKEN")
        self.url, self.token, self.timeout_s = url.rstrip("/"), token, timeout_s

    def approvals(self, *, status: str = "pending", run_id: str | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._call("GET", f"/api/approvals?status={urllib.parse.quote(status)}")
        return [a for a in items if run_id is None or a.get("run_id") == run_id]

    def approval(self, approval_id: str) -> dict[str, Any]:
        view: dict[str, Any] = self._call("GET", f"/api/approvals/{urllib.parse.quote(approval_id)}")
        return view

    def answer(self, approval_id: str, *, decision: str, binding: str, reason: str = "",
               args: Mapping[str, Any] | None = None, grant: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = {"decision": decision, "binding": binding, "reason": reason, "args": args, "grant": grant}
        answered: dict[str, Any] = self._call("POST", f"/api/approvals/{urllib.parse.quote(approval_id)}", body)
        return answered

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                message = str(json.loads(exc.read()).get("error") or exc.reason)
            except ValueError:
                message = str(exc.reason)
            if exc.code == 401:
                raise StoreError(f"{self.url}: the token was refused (401): check --token") from None
            raise _ERRORS.get(exc.code, StoreError)(f"{self.url}: {message} ({exc.code})") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise StoreError(f"cannot reach the inbox at {self.url}: {exc}") from None
