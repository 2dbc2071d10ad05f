"""Halts in the inbox: active ones on its pages, and an approver of the right group halting a run from its page.

Over raw HTTP (a real uvicorn server on a loopback port, httpx) and in headless Chromium; the halt
lands in the run store's `halts` table, which a real gate's `StoreHalts` channel reads.
"""

from __future__ import annotations

import html
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By

from proctor.approval.tokens import TokenFile, add_token
from proctor.audit.lines import read_records
from proctor.audit.log import AuditLog
from proctor.errors import ToolDenied
from proctor.gate import Gate
from proctor.halt import new_halt
from proctor.halt.sql import StoreHaltBackend, StoreHalts
from proctor.policy import Policy
from proctor.serve.app import create_app
from proctor.store.base import RunStore

from .browser import chromium, serving
from .inbox_helpers import POLICY, Inbox, lookup, send
from .test_inbox_browser import log_in as browser_log_in
from .test_inbox_browser import wait_for

pytestmark = pytest.mark.timeout(300)


@dataclass
class Served:
    url: str
    store: RunStore
    halts: StoreHaltBackend
    audit_path: Path
    approval_id: str
    run_id: str
    carol: str  # a token of carol's, in the group that may halt


@pytest.fixture
def served(inbox: Inbox) -> Iterator[Served]:
    approval_id = inbox.suspend()
    carol = add_token(inbox.tokens_path, "carol", ("sre-leads",))
    store = RunStore.open(inbox.store_url)
    halts = StoreHaltBackend(inbox.store_url)
    audit_path = inbox.tmp / "inbox-audit.jsonl"
    audit = AuditLog(audit_path)
    app = create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers, halts=halts, audit=audit,
                     halt_groups=("sre-leads",))
    with serving(app) as url:
        yield Served(url, store, halts, audit_path, approval_id, store.get_approval(approval_id).run_id, carol)
    audit.close()
    halts.close()
    store.close()


def session(url: str, token: str) -> tuple[httpx.Client, str]:
    """A browser-like session over raw HTTP: logged in, with its CSRF token read from a page."""
    client = httpx.Client(base_url=url, follow_redirects=False, timeout=30)
    assert client.post("/login", data={"token": token}).status_code == 303
    page = client.get("/")
    return client, page.text.split('name="csrf" value="')[1].split('"')[0]


def test_an_approver_of_the_group_halts_a_run_from_its_page_over_http(inbox: Inbox, served: Served) -> None:
    client, csrf = session(served.url, served.carol)
    run_page = client.get(f"/runs/{served.run_id}")
    assert 'id="halt-form"' in run_page.text and f"type {served.run_id} to confirm" in run_page.text
    post = f"/runs/{served.run_id}/halt"
    # A destructive action is never one keypress: the reason and the run's id, typed, are both needed.
    assert client.post(post, data={"csrf": csrf, "reason": "runaway mail", "confirm": ""}).status_code == 422
    assert client.post(post, data={"csrf": csrf, "reason": "runaway mail", "confirm": "run_other"}).status_code == 422
    assert client.post(post, data={"csrf": csrf, "reason": " ", "confirm": served.run_id}).status_code == 422
    assert client.post(post, data={"reason": "runaway mail", "confirm": served.run_id}).status_code == 403  # no CSRF
    cross = client.post(post, data={"csrf": csrf, "reason": "x", "confirm": served.run_id},
                        headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403
    assert served.halts.list_halts() == []
    done = client.post(post, data={"csrf": csrf, "reason": "runaway mail", "confirm": served.run_id,
                                   "back": f"/approvals/{served.approval_id}"})
    assert done.status_code == 303 and done.headers["location"] == f"/approvals/{served.approval_id}"
    (halt,) = served.halts.list_halts()
    assert (halt.scope, halt.value, halt.reason, halt.by) == ("run", served.run_id, "runaway mail", "carol")
    # Shown: the banner on the list page, and the run's own pages say its calls are refused.
    listing = client.get("/").text
    assert 'id="halts"' in listing and halt.id in listing and "runaway mail" in listing and "carol" in listing
    for path in (f"/runs/{served.run_id}", f"/approvals/{served.approval_id}"):
        assert 'id="run-halted"' in client.get(path).text
    api = client.get("/api/halts", headers={"Authorization": f"Bearer {inbox.tokens['bob']}"}).json()
    assert [h["id"] for h in api["halts"]] == [halt.id]
    # Audited with who, why and from where.
    records, bad = read_records(served.audit_path)
    assert bad == 0
    (record,) = [r for r in records if r["kind"] == "halt_set"]
    assert (record["halt_id"], record["by"], record["reason"], record["via"], record["method"]) == (
        halt.id, "carol", "runaway mail", "inbox", "session")
    assert record["address"] == "127.0.0.1"
    # And a gate reading the store's halts refuses the run's calls, naming the halt.
    channel = StoreHalts(inbox.store_url, refresh_s=0.02)
    try:
        gate = Gate(Policy.from_dict(POLICY), tools=[lookup, send], halts=channel)
        with pytest.raises(ToolDenied, match=f"halted by {halt.id}: runaway mail"):
            gate.call("lookup", {"customer": "carol"}, context=gate.start_run(run_id=served.run_id))
        assert gate.call("lookup", {"customer": "carol"}, context=gate.start_run()).startswith("carol")
    finally:
        channel.close()
    client.close()


def test_who_may_halt(inbox: Inbox, served: Served) -> None:
    bob_headers = {"Authorization": f"Bearer {inbox.tokens['bob']}"}
    with httpx.Client(base_url=served.url, timeout=30) as c:
        # bob is an approver, not in the group: no form, and the API refuses him.
        page = c.get(f"/runs/{served.run_id}", headers=bob_headers).text
        assert 'id="halt-form"' not in page
        refused = c.post(f"/api/runs/{served.run_id}/halt", json={"reason": "x"}, headers=bob_headers)
        assert refused.status_code == 403 and "sre-leads" in refused.json()["error"]
        assert c.post(f"/api/runs/{served.run_id}/halt", json={"reason": "x"}).status_code == 401
        assert c.post("/api/runs/run_nope/halt", json={"reason": "x"},
                      headers={"Authorization": f"Bearer {served.carol}"}).status_code == 404
        # carol with her token: the run is named in the URL (no page, no typed confirmation).
        ok = c.post(f"/api/runs/{served.run_id}/halt", json={"reason": "stop it"},
                    headers={"Authorization": f"Bearer {served.carol}"})
        assert ok.status_code == 200 and ok.json()["halt"]["value"] == served.run_id
    # A browser session through the API types the run's id, as the page does.
    client, csrf = session(served.url, served.carol)
    untyped = client.post(f"/api/runs/{served.run_id}/halt", json={"reason": "again"}, headers={"X-CSRF-Token": csrf})
    assert untyped.status_code == 422
    client.close()


def test_halts_set_elsewhere_are_shown_and_no_audit_log_means_no_halting(inbox: Inbox, tmp_path: Path) -> None:
    inbox.suspend()
    carol = add_token(inbox.tokens_path, "carol", ("sre-leads",))
    store = RunStore.open(inbox.store_url)
    halts = StoreHaltBackend(inbox.store_url)
    try:
        elsewhere = halts.set(new_halt("tool", "send", "mail provider incident", "ops-dan"))
        app = create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers, halts=halts,
                         halt_groups=("sre-leads",))
        run_id = store.list_runs()[0].run_id
        with serving(app) as url:
            client, csrf = session(url, carol)
            listing = client.get("/").text
            assert elsewhere.id in listing and "tool send" in listing and "ops-dan" in listing
            page = client.get(f"/runs/{run_id}").text
            assert 'id="halt-form"' not in page and "needs an audit log" in page
            r = client.post(f"/runs/{run_id}/halt", data={"csrf": csrf, "reason": "x", "confirm": run_id})
            assert r.status_code == 503 and "audit log" in r.text
            client.close()
        assert [h.id for h in halts.list_halts()] == [elsewhere.id]
    finally:
        halts.close()
        store.close()


def test_halt_a_run_in_the_browser(inbox: Inbox, served: Served, tmp_path: Path) -> None:
    with chromium(tmp_path / "profile") as driver:
        browser_log_in(driver, served.url, served.carol)
        driver.get(f"{served.url}/approvals/{served.approval_id}")
        wait_for(lambda: driver.find_elements(By.ID, "halt-details"), "the halt form")
        assert driver.find_elements(By.ID, "halts") == []  # nothing halted yet: no banner
        driver.find_element(By.CSS_SELECTOR, "#halt-details summary").click()
        driver.find_element(By.ID, "halt-reason").send_keys("runaway mail")
        driver.find_element(By.ID, "halt-confirm").send_keys("run_wrong")
        driver.find_element(By.ID, "halt-run").click()
        wait_for(lambda: "type its id" in driver.find_element(By.TAG_NAME, "body").text, "the refusal")
        assert served.halts.list_halts() == []
        driver.get(f"{served.url}/approvals/{served.approval_id}")
        wait_for(lambda: driver.find_elements(By.ID, "halt-details"), "the halt form")
        driver.find_element(By.CSS_SELECTOR, "#halt-details summary").click()
        driver.find_element(By.ID, "halt-reason").send_keys("runaway mail")
        driver.find_element(By.ID, "halt-confirm").send_keys(served.run_id)
        driver.find_element(By.ID, "halt-run").send_keys("\n")  # Enter in the form: submitted once, typed
        banner = wait_for(lambda: driver.find_elements(By.ID, "halts"), "the banner of active halts")
        (halt,) = served.halts.list_halts()
        assert halt.id in banner[0].text and "runaway mail" in banner[0].text and "carol" in banner[0].text
        assert f"/approvals/{served.approval_id}" in driver.current_url
        assert halt.id in driver.find_element(By.ID, "run-halted").text
        driver.get(f"{served.url}/")
        wait_for(lambda: driver.find_elements(By.ID, "halts"), "the banner on the list page")
        deadline = time.monotonic() + 10
        while not [r for r in read_records(served.audit_path)[0] if r["kind"] == "halt_set"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_runs_halt_is_lifted_from_the_inbox_recorded_first(inbox: Inbox, served: Served) -> None:
    client, csrf = session(served.url, served.carol)
    assert client.post(f"/runs/{served.run_id}/halt", data={"csrf": csrf, "reason": "runaway mail",
                                                            "confirm": served.run_id}).status_code == 303
    (halt,) = served.halts.list_halts()
    wide = served.halts.set(new_halt("tool", "send", "mail provider incident", "ops-dan"))
    page = client.get("/").text
    assert f'action="/halts/{halt.id}/lift"' in page and f'action="/halts/{wide.id}/lift"' not in page
    lift = f"/halts/{halt.id}/lift"
    assert client.post(lift, data={"csrf": csrf, "reason": "fixed", "confirm": "halt_other"}).status_code == 422
    assert client.post(lift, data={"csrf": csrf, "reason": "", "confirm": halt.id}).status_code == 422
    assert client.post(lift, data={"reason": "fixed", "confirm": halt.id}).status_code == 403  # no CSRF
    widened = client.post(f"/halts/{wide.id}/lift", data={"csrf": csrf, "reason": "x", "confirm": wide.id})
    assert widened.status_code == 403 and "proctor halt --lift" in widened.text
    # the command to run, whole: the inbox's own backend, so it lifts this halt and not one elsewhere
    assert (f"proctor halt --lift {wide.id} --reason TEXT --store {shlex.quote(served.halts.shown)} --audit LOG"
            in html.unescape(widened.text)), widened.text
    bob = httpx.post(f"{served.url}/api/halts/{halt.id}/lift", json={"reason": "x"},
                     headers={"Authorization": f"Bearer {inbox.tokens['bob']}"})
    assert bob.status_code == 403
    assert {h.id for h in served.halts.list_halts()} == {halt.id, wide.id}
    done = client.post(lift, data={"csrf": csrf, "reason": "mail fixed", "confirm": halt.id, "back": "/runs"})
    assert done.status_code == 303 and done.headers["location"] == "/runs"
    assert [h.id for h in served.halts.list_halts()] == [wide.id]
    assert client.post(lift, data={"csrf": csrf, "reason": "again", "confirm": halt.id}).status_code == 404
    records, _ = read_records(served.audit_path)
    (lifted,) = [r for r in records if r["kind"] == "halt_lifted"]
    assert (lifted["halt_id"], lifted["by"], lifted["reason"], lifted["via"], lifted["halt_reason"]) == (
        halt.id, "carol", "mail fixed", "inbox", "runaway mail")
    client.close()


def test_a_halt_the_log_cannot_record_is_said_to_be_in_force_and_such_a_lift_does_not_happen(inbox: Inbox) -> None:
    from fastapi.testclient import TestClient

    from proctor.testing import InMemoryAudit

    inbox.suspend()
    carol = add_token(inbox.tokens_path, "carol", ("sre-leads",))
    store = RunStore.open(inbox.store_url)
    halts = StoreHaltBackend(inbox.store_url)
    run_id = store.list_runs()[0].run_id
    try:
        for failing in ("halt_set", "halt_lifted"):
            app = create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers, halts=halts,
                             audit=InMemoryAudit(fail_on=(failing,)), halt_groups=("sre-leads",))
            with TestClient(app, base_url="http://inbox.test") as c:
                auth = {"Authorization": f"Bearer {carol}"}
                made = c.post(f"/api/runs/{run_id}/halt", json={"reason": "runaway"}, headers=auth)
                if failing == "halt_set":
                    assert made.status_code == 500 and "IS IN FORCE" in made.json()["error"]
                    (halt,) = halts.list_halts()  # in force all the same
                    halts.lift(halt.id)
                    continue
                halt_id = made.json()["halt"]["id"]
                lifted = c.post(f"/api/halts/{halt_id}/lift", json={"reason": "fine"}, headers=auth)
                assert lifted.status_code == 500 and "not lifted" in lifted.json()["error"]
                assert [h.id for h in halts.list_halts()] == [halt_id]
    finally:
        halts.close()
        store.close()


def test_the_approver_who_started_a_run_does_not_lift_its_halt_from_the_inbox(inbox: Inbox) -> None:
    """Four eyes on the kill switch: dave may halt and lift runs, but not lift the halt on a run he started; a halt
    on a run this store does not hold (`proctor halt --run`) has nobody to compare, so it is lifted with the CLI."""
    from fastapi.testclient import TestClient

    from proctor.testing import InMemoryAudit

    inbox.suspend(principal="dave")
    dave = add_token(inbox.tokens_path, "dave", ("sre-leads",))
    carol = add_token(inbox.tokens_path, "carol", ("sre-leads",))
    store = RunStore.open(inbox.store_url)
    halts = StoreHaltBackend(inbox.store_url)
    run_id = store.list_runs()[0].run_id
    try:
        app = create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers, halts=halts,
                         audit=InMemoryAudit(), halt_groups=("sre-leads",))
        with TestClient(app, base_url="http://inbox.test") as c:
            def post(path: str, token: str) -> httpx.Response:
                return c.post(path, json={"reason": "checked"}, headers={"Authorization": f"Bearer {token}"})

            halt_id = post(f"/api/runs/{run_id}/halt", dave).json()["halt"]["id"]  # halting one's own run is fine
            mine = post(f"/api/halts/{halt_id}/lift", dave)
            assert mine.status_code == 403 and "four eyes" in mine.json()["error"]
            assert [h.id for h in halts.list_halts()] == [halt_id]
            assert post(f"/api/halts/{halt_id}/lift", carol).status_code == 200  # another approver
            elsewhere = halts.set(new_halt("run", "run_not_in_this_store", "runaway", "ops-dan"))
            unknown = post(f"/api/halts/{elsewhere.id}/lift", carol)
            assert unknown.status_code == 403 and "proctor halt --lift" in unknown.json()["error"]
    finally:
        halts.close()
        store.close()
