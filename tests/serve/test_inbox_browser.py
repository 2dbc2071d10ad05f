"""The inbox in a real browser: log in, see the pending call, approve, deny, edit, and meet the four-eyes rule."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from proctor.approval.tokens import TokenFile
from proctor.serve.app import create_app
from proctor.store.base import RunStore

from .browser import chromium, serving
from .inbox_helpers import SENT, THROUGH_A_HELPER, TWO_CALLS, Inbox, background, suspend_program

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def server(inbox: Inbox) -> Iterator[tuple[str, RunStore]]:
    store = RunStore.open(inbox.store_url)
    with serving(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers)) as url:
        yield url, store
    store.close()


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (NoSuchElementException, StaleElementReferenceException):
            value = None  # the page is between a form's POST and the page it leads to: look again
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def log_in(driver: WebDriver, url: str, token: str) -> None:
    driver.get(url + "/")
    assert "/login" in driver.current_url
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait_for(lambda: "/login" not in driver.current_url, "the login to finish")


def open_pending(driver: WebDriver, url: str) -> None:
    driver.get(url + "/")
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "a.approval-link"), "a pending approval")
    driver.find_element(By.CSS_SELECTOR, "a.approval-link").click()
    wait_for(lambda: driver.find_elements(By.ID, "status"), "the approval page")


def test_approve_in_the_browser_and_see_the_run_finish(inbox: Inbox, server: tuple[str, RunStore],
                                                       tmp_path: Path) -> None:
    """bob logs in, reads the call in context, approves it, and the waiting run finishes having sent once."""
    url, store = server
    agent = inbox.agent(store, wait="240s")
    thread, out = background(lambda: agent.run("Send carol her invoice", principal="alice"))
    with chromium(tmp_path / "profile") as driver:
        log_in(driver, url, inbox.tokens["bob"])
        open_pending(driver, url)
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "send" in body and "external" in body and "outbound-mail" in body
        assert "Send carol her invoice" in body and "carol@partner.org" in body
        # marked where the worker reported the call: line 2, the call expression itself
        marked = driver.find_elements(By.CSS_SELECTOR, ".program .marked")
        assert [m.get_attribute("data-line") for m in marked] == ["2"]
        assert driver.find_element(By.ID, "pending-call").text == "send(to='carol@partner.org', body='your invoice')"
        assert "lookup" in driver.find_element(By.CSS_SELECTOR, "table.calls").text
        shots = os.environ.get("PROCTOR_SCREENSHOTS")
        if shots:
            driver.save_screenshot(str(Path(shots) / "inbox-approval.png"))
        driver.find_element(By.ID, "confirm").send_keys("send")  # an external call: its name, typed
        driver.find_element(By.ID, "approve").click()
        wait_for(lambda: driver.find_element(By.ID, "status").text == "answered", "the answer to be shown")
        thread.join(timeout=120)
        assert out and not isinstance(out[0], BaseException), out
        result = out[0]
        assert result.status == "done" and SENT == [("carol@partner.org", "your invoice")]
        driver.get(f"{url}/runs/{result.run_id}")
        assert driver.find_element(By.ID, "run-status").text == "done"
        step_text = driver.find_element(By.CSS_SELECTOR, "section.step").text
        assert "approve by bob from 127.0.0.1" in step_text
    agent.close()


def test_deny_with_a_reason_and_edit_in_the_browser(inbox: Inbox, server: tuple[str, RunStore],
                                                   tmp_path: Path) -> None:
    """A deny carries its reason to the store; an edit runs the call with the approver's arguments."""
    url, store = server
    first = inbox.suspend()
    with chromium(tmp_path / "profile") as driver:
        log_in(driver, url, inbox.tokens["bob"])
        driver.get(f"{url}/approvals/{first}")
        driver.find_element(By.ID, "deny-reason").send_keys("not this customer")
        driver.find_element(By.ID, "deny").click()
        wait_for(lambda: driver.find_element(By.ID, "status").text == "answered", "the deny to be stored")
        answer = store.get_approval(first).answer
        assert answer is not None and (answer.verdict, answer.reason) == ("deny", "not this customer")

        second = inbox.suspend(task="Send carol her invoice again")
        driver.get(f"{url}/approvals/{second}")
        driver.find_element(By.CSS_SELECTOR, "#edit-form").find_element(By.XPATH, "..").find_element(
            By.TAG_NAME, "summary").click()
        box = driver.find_element(By.ID, "edit-args")
        box.clear()
        box.send_keys('{"to": "billing@partner.org", "body": "your invoice"}')
        driver.find_element(By.ID, "edit-confirm").send_keys("send")
        driver.find_element(By.ID, "edit").click()
        wait_for(lambda: driver.find_element(By.ID, "status").text == "answered", "the edit to be stored")
    assert inbox.resume(store.get_approval(second).run_id).status == "done"
    assert SENT == [("billing@partner.org", "your invoice")]


def test_four_eyes_and_keyboard_in_the_browser(inbox: Inbox, server: tuple[str, RunStore], tmp_path: Path) -> None:
    """alice cannot answer her own run's call; for bob the `a` key alone does not approve an external call
    (it moves to the confirmation), `a`, the tool's name and Enter do; the page fits a phone."""
    url, store = server
    approval_id = inbox.suspend(principal="alice")
    with chromium(tmp_path / "alice") as driver:
        log_in(driver, url, inbox.tokens["alice"])
        driver.get(f"{url}/approvals/{approval_id}")
        assert "four eyes" in driver.find_element(By.ID, "four-eyes").text
        assert driver.find_elements(By.ID, "approve") == []
    with chromium(tmp_path / "bob", width=390, height=844) as driver:
        log_in(driver, url, inbox.tokens["bob"])
        driver.get(f"{url}/approvals/{approval_id}")
        overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow}px wider than a phone screen"
        driver.find_element(By.TAG_NAME, "body").send_keys("a")
        wait_for(lambda: driver.switch_to.active_element.get_attribute("id") == "confirm", "the confirmation field")
        time.sleep(0.5)
        assert store.get_approval(approval_id).status == "pending"  # one key never lets it run
        driver.switch_to.active_element.send_keys("send\n")
        wait_for(lambda: driver.find_element(By.ID, "status").text == "answered", "the confirmed approval")
    answer = store.get_approval(approval_id).answer
    assert answer is not None and answer.verdict == "approve" and answer.approver == "bob"


def test_the_page_marks_the_reported_call_and_shows_edits_reasons_and_the_deadline(
        inbox: Inbox, server: tuple[str, RunStore], tmp_path: Path) -> None:
    """A real run calls one tool on two lines (the first allowed, it ran): only the pending call is marked,
    at the line and columns the worker reported; the thought, the deadline and what the call takes from each
    budget are shown; an edit with a reason is shown beside the original arguments, with what happens next."""
    url, store = server
    approval_id = suspend_program(inbox, TWO_CALLS)
    run_id = store.get_approval(approval_id).run_id
    shots = os.environ.get("PROCTOR_SCREENSHOTS")
    with chromium(tmp_path / "bob", height=1500) as driver:
        log_in(driver, url, inbox.tokens["bob"])
        driver.get(f"{url}/approvals/{approval_id}")
        marked = driver.find_elements(By.CSS_SELECTOR, ".program .marked")
        assert len(marked) == 1 and "y = send(to='ceo@partner.org'" in marked[0].text
        assert driver.find_element(By.ID, "pending-call").text == "send(to='ceo@partner.org', body='second')"
        assert driver.find_element(By.ID, "pending-line").get_attribute("data-line") == "3"
        assert "line 3, column 9" in driver.find_element(By.ID, "position").text
        assert driver.find_element(By.ID, "thought").text == "Thought: two."
        expires = store.get_approval(approval_id).as_dict()["expires_at"]
        assert expires in driver.find_element(By.ID, "deadline").text
        budgets = driver.find_element(By.ID, "budgets").text
        assert "calls: takes 1 of 1 left → 0; cost: takes 5 of 15 left → 10" in budgets and "run-calls" in budgets
        if shots:
            driver.save_screenshot(str(Path(shots) / "inbox-two-calls.png"))
        driver.find_element(By.CSS_SELECTOR, "#edit-form").find_element(By.XPATH, "..").find_element(
            By.TAG_NAME, "summary").click()
        box = driver.find_element(By.ID, "edit-args")
        box.clear()
        box.send_keys('{"to": "cfo@partner.org", "body": "second"}')
        driver.find_element(By.CSS_SELECTOR, "#edit-form input[name=reason]").send_keys("the CFO signs these")
        driver.find_element(By.ID, "edit-confirm").send_keys("send")
        driver.find_element(By.ID, "edit").click()
        wait_for(lambda: driver.find_element(By.ID, "status").text == "answered", "the edit to be stored")
        answer = driver.find_element(By.ID, "answer").text
        assert "edit by bob" in answer and "the CFO signs these" in answer
        assert "cfo@partner.org" in driver.find_element(By.ID, "edited-args").text
        assert "ceo@partner.org" in driver.find_element(By.ID, "args").text  # the original, beside it
        assert f"proctor runs resume {run_id}" in driver.find_element(By.ID, "next").text
        if shots:
            driver.save_screenshot(str(Path(shots) / "inbox-edit.png"))


def test_a_call_made_in_a_helper_from_a_loop_is_marked_in_the_helper(
        inbox: Inbox, server: tuple[str, RunStore], tmp_path: Path) -> None:
    """The program calls `send` through a helper it defined, from a loop: the page marks the call in the
    helper's body (line 2, where the program's text makes it), not the loop's line nor the first call's."""
    url, _ = server
    approval_id = suspend_program(inbox, THROUGH_A_HELPER)
    with chromium(tmp_path / "bob", height=1200) as driver:
        log_in(driver, url, inbox.tokens["bob"])
        driver.get(f"{url}/approvals/{approval_id}")
        marked = driver.find_elements(By.CSS_SELECTOR, ".program .marked")
        assert [m.get_attribute("data-line") for m in marked] == ["2"]
        assert driver.find_element(By.ID, "pending-call").text == "send(to=who, body='hello')"
        assert "line 2, column 12" in driver.find_element(By.ID, "position").text
        assert "ceo@partner.org" in driver.find_element(By.ID, "args").text
