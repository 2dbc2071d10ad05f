"""The browser as the attacker: a page on another port of the same host frames an approval nearly invisibly
while bob, logged in to the inbox, presses keys on it. The frame must be refused; and even where a frame
did load (the headers stripped on the way, as a misconfigured proxy would), one keypress never approves."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from proctor.approval.tokens import TokenFile
from proctor.serve.app import create_app
from proctor.store.base import RunStore

from .browser import chromium, free_port, serving
from .inbox_helpers import Inbox

pytestmark = pytest.mark.timeout(300)


@contextmanager
def attacker(page: Callable[[], str]) -> Iterator[str]:
    """A web server on another localhost port serving `page()` at /: the hostile site."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def strip_framing_headers(app: Any) -> Any:
    """The inbox behind a proxy that drops its CSP and X-Frame-Options (the control case)."""

    async def stripped(scope: Any, receive: Any, send: Any) -> None:
        async def send_stripped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [(k, v) for k, v in message["headers"]
                                      if k.lower() not in (b"content-security-policy", b"x-frame-options")]
            await send(message)

        await app(scope, receive, send_stripped)

    return stripped


def hostile_page(inbox_url: str, approval_id: str) -> str:
    # The frame sits under the pointer, almost transparent; the page asks for a key press.
    return (f"<!doctype html><title>win a prize</title><p>Press <b>a</b> to claim your prize!</p>"
            f'<iframe id="victim" src="{inbox_url}/approvals/{approval_id}" '
            'style="opacity:0.02;position:absolute;top:0;left:0;width:1000px;height:700px;border:0"></iframe>'
            "<script>var f=document.getElementById('victim');f.addEventListener('load',function(){f.focus();});"
            "</script>")


def log_in(driver: WebDriver, url: str, token: str) -> None:
    driver.get(url + "/login")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    deadline = time.monotonic() + 60
    while "/login" in driver.current_url:
        assert time.monotonic() < deadline, "the login did not finish"
        time.sleep(0.1)


def press_everywhere(driver: WebDriver, keys: str) -> None:
    """Key presses on the hostile page, and inside the frame when the browser let it load."""
    driver.find_element(By.TAG_NAME, "body").send_keys(keys)
    frame = driver.find_element(By.ID, "victim")
    driver.switch_to.frame(frame)
    try:
        for body in driver.find_elements(By.TAG_NAME, "body"):
            body.send_keys(keys)
    finally:
        driver.switch_to.default_content()


def frame_location(driver: WebDriver) -> str:
    driver.switch_to.frame(driver.find_element(By.ID, "victim"))
    try:
        return str(driver.execute_script("return document.location.href"))
    finally:
        driver.switch_to.default_content()


def test_a_hostile_page_cannot_frame_an_approval(inbox: Inbox, tmp_path: Path) -> None:
    approval_id = inbox.suspend()
    store = RunStore.open(inbox.store_url)
    try:
        with serving(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers)) as url, \
                attacker(lambda: hostile_page(url, approval_id)) as evil, chromium(tmp_path / "bob") as driver:
            log_in(driver, url, inbox.tokens["bob"])  # bob's SameSite=Strict cookie goes to the same site
            driver.get(evil + "/")
            deadline = time.monotonic() + 60
            while (where := frame_location(driver)) in ("about:blank", ""):  # until navigated (or refused)
                assert time.monotonic() < deadline, "the frame never navigated"
                time.sleep(0.2)
            assert not where.startswith(url), f"the inbox loaded inside the hostile page's frame: {where}"
            assert where.startswith("chrome-error://"), where  # Chromium's page for a refused frame
            driver.switch_to.frame(driver.find_element(By.ID, "victim"))
            assert driver.find_elements(By.ID, "approve-form") == []
            driver.switch_to.default_content()
            press_everywhere(driver, "a")
            press_everywhere(driver, "a\n")
            time.sleep(1)
            assert store.get_approval(approval_id).status == "pending"
    finally:
        store.close()


def test_even_a_frame_that_loads_is_not_approved_by_a_keypress(inbox: Inbox, tmp_path: Path) -> None:
    """The control: with the framing headers stripped the frame loads, bob's session is in it, and still
    `a` (and Enter) only move to the confirmation of an external call, which the hostile page cannot type."""
    approval_id = inbox.suspend()
    store = RunStore.open(inbox.store_url)
    try:
        app = strip_framing_headers(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers))
        with serving(app) as url, attacker(lambda: hostile_page(url, approval_id)) as evil, \
                chromium(tmp_path / "bob") as driver:
            log_in(driver, url, inbox.tokens["bob"])
            driver.get(evil + "/")
            deadline = time.monotonic() + 60
            while not frame_location(driver).startswith(f"{url}/approvals/"):
                assert time.monotonic() < deadline, "the control frame never loaded"
                time.sleep(0.2)
            driver.switch_to.frame(driver.find_element(By.ID, "victim"))
            assert driver.find_elements(By.ID, "approve-form"), "bob's session should be in the frame"
            driver.switch_to.default_content()
            press_everywhere(driver, "a")
            press_everywhere(driver, "a\n")
            press_everywhere(driver, "\n")
            time.sleep(1)
            assert store.get_approval(approval_id).status == "pending"
    finally:
        store.close()
