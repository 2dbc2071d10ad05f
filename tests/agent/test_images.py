"""Images: the task's and tools' reach the model as content parts, the program as a handle, the log as digests."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from proctor.agent import CodeAgent, ScriptedModel, ToolCallingAgent
from proctor.agent.models import ModelResponse
from proctor.cli import main
from proctor.errors import ImageError
from proctor.images import MAX_IMAGE_BYTES, MAX_IMAGES_PER_RUN, load_image
from proctor.policy import Policy
from proctor.telemetry.base import set_capture_content
from proctor.testing import SpanCapture
from proctor.tools import tool

ALLOW = Policy.from_dict({"version": 1, "default": "allow", "rules": []})


@tool(side_effect="read")
def screenshot(page: str) -> Any:
    """Take a screenshot of a page.

    Args:
        page: Which page.
    """
    return Image.new("RGB", (40, 30), (200, 10, 10))


@tool(side_effect="read")
def gallery(n: int) -> Any:
    """Several pictures with a caption.

    Args:
        n: How many.
    """
    return {"caption": "tiles", "pictures": [Image.new("L", (8, 8), i * 20) for i in range(n)]}


@tool(side_effect="read")
def huge(page: str) -> Any:
    """A picture over the pixel limit.

    Args:
        page: Which page.
    """
    return Image.new("1", (6000, 6000))


def _png(size: tuple[int, int] = (20, 10), colour: tuple[int, int, int] = (0, 0, 255)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def _images_in(message: dict[str, Any]) -> list[bytes]:
    out = []
    for part in _parts(message):
        if part["type"] == "image_url":
            head, _, payload = part["image_url"]["url"].partition(",")
            assert head == "data:image/png;base64"
            out.append(base64.b64decode(payload))
    return out


def _step_records(log: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == "step"]


def test_task_images_go_to_the_model_as_content_parts_and_the_log_keeps_digests(tmp_path: Path) -> None:
    """A PIL image and a path reach the model as data-URI parts of the task message; the log holds their sizes."""
    path = tmp_path / "blue.png"
    path.write_bytes(_png())
    red = Image.new("RGB", (64, 48), (255, 0, 0))
    model = ScriptedModel(['Thought: done.\n```python\nfinal_answer("red and blue")\n```'])
    log = tmp_path / "audit.jsonl"
    with CodeAgent([screenshot], model, ALLOW, audit=str(log), sandbox="auto") as agent:
        result = agent.run("Which colours?", images=[red, path])
    assert result.status == "done"
    task = model.calls[0][-1]
    assert task["role"] == "user" and _parts(task)[0] == {"type": "text", "text": "New task:\nWhich colours?"}
    sent = _images_in(task)
    assert len(sent) == 2 and sent[1] == path.read_bytes()
    assert Image.open(io.BytesIO(sent[0])).size == (64, 48)
    [step] = _step_records(log)
    assert [(i["from"], i["format"], i["width"], i["height"], i["bytes"]) for i in step["images"]] == [
        ("task", "PNG", 64, 48, len(sent[0])), ("task", "PNG", 20, 10, len(sent[1]))]
    assert step["images"][1]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    text = log.read_text()
    assert base64.b64encode(sent[1]).decode() not in text and "base64" not in text


def test_a_tools_image_reaches_the_program_as_a_handle_and_the_model_as_an_image(tmp_path: Path) -> None:
    """The worker prints a text handle (no bytes); the next observation carries the image; the log its digest."""
    model = ScriptedModel(["```python\nshot = screenshot('home')\nprint(type(shot).__name__, shot)\n```",
                           "```python\nfinal_answer('red')\n```"])
    log = tmp_path / "audit.jsonl"
    with CodeAgent([screenshot], model, ALLOW, audit=str(log), sandbox="auto") as agent:
        result = agent.run("What colour is the home page?")
    assert result.status == "done"
    observation = model.calls[1][-1]
    text = _parts(observation)[0]["text"]
    assert "str <image #1: PNG 40x30" in text and "shown to the model with the next observation" in text
    [image] = _images_in(observation)
    assert Image.open(io.BytesIO(image)).getpixel((0, 0)) == (200, 10, 10)
    first, second = _step_records(log)
    [described] = first["images"]
    assert described["from"] == "call" and described["tool"] == "screenshot"
    assert described["call_id"] == result.steps[0].tool_calls[0].call_id
    assert (described["width"], described["height"], described["bytes"]) == (40, 30, len(image))
    assert described["sha256"] == hashlib.sha256(image).hexdigest() and "images" not in second
    assert base64.b64encode(image).decode() not in log.read_text()


def test_images_inside_a_result_each_get_a_handle(tmp_path: Path) -> None:
    """Images in a dict or list result are swapped one by one; the rest of the result is kept."""
    model = ScriptedModel(["```python\ng = gallery(3)\nprint(g['caption'], len(g['pictures']), g['pictures'][2])\n```",
                           "```python\nfinal_answer('ok')\n```"])
    with CodeAgent([gallery], model, ALLOW, sandbox="auto") as agent:
        result = agent.run("Look")
    text = _parts(model.calls[1][-1])[0]["text"]
    assert "tiles 3 <image #3: PNG 8x8" in text
    assert len(_images_in(model.calls[1][-1])) == 3 and len(result.steps[0].images) == 3


def test_an_image_over_the_pixel_limit_is_not_shown_and_the_program_is_told(tmp_path: Path) -> None:
    """A tool's 36-megapixel image fails closed: the program's handle says why, the model gets no image."""
    model = ScriptedModel(["```python\nprint(huge('x'))\n```", "```python\nfinal_answer('no')\n```"])
    with CodeAgent([huge], model, ALLOW, sandbox="auto") as agent:
        result = agent.run("Look")
    observation = model.calls[1][-1]
    assert _images_in(observation) == [] and result.steps[0].images == []
    assert "image not shown to the model" in _parts(observation)[0]["text"]
    assert "MAX_IMAGE_PIXELS" in _parts(observation)[0]["text"]


def test_task_images_that_cannot_be_used_raise_before_the_run(tmp_path: Path) -> None:
    """Too many images, a file that is no image, one over the byte limit, or a wrong type: ImageError, no run."""
    model = ScriptedModel([])
    not_image = tmp_path / "notes.txt"
    not_image.write_text("hello")
    big = tmp_path / "big.png"
    big.write_bytes(b"\x89PNG" + b"\0" * MAX_IMAGE_BYTES)
    with CodeAgent([screenshot], model, ALLOW, sandbox="auto") as agent:
        with pytest.raises(ImageError, match="MAX_IMAGES_PER_RUN"):
            agent.run("x", images=[_png()] * (MAX_IMAGES_PER_RUN + 1))
        with pytest.raises(ImageError, match=r"images\[0\] \(.*notes.txt\): not a readable image"):
            agent.run("x", images=[not_image])
        with pytest.raises(ImageError, match="MAX_IMAGE_BYTES"):
            agent.run("x", images=[big])
        with pytest.raises(ImageError, match="expected a PIL image, a path or bytes, got int"):
            agent.run("x", images=[3])
        with pytest.raises(ImageError, match="BMP images are not passed to models"):
            agent.run("x", images=[_bmp()])
    assert model.calls == [] and agent.last_run is None


def _bmp() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, format="BMP")
    return out.getvalue()


def test_tool_calling_agent_puts_tool_images_in_a_user_message_after_the_tool_messages(tmp_path: Path) -> None:
    """Tool messages hold the handle as text; the images follow in one user message."""
    model = ScriptedModel([ModelResponse.calling(("screenshot", {"page": "home"})),
                           ModelResponse.calling(("final_answer", {"answer": "red"}))])
    with ToolCallingAgent([screenshot], model, ALLOW) as agent:
        result = agent.run("What colour?", images=[_png()])
    assert result.status == "done"
    sent = model.calls[1]
    assert len(_images_in(sent[1])) == 1  # the task's
    tool_message, images_message = sent[-2], sent[-1]
    assert tool_message["role"] == "tool" and "<image #2: PNG 40x30" in tool_message["content"]
    assert images_message["role"] == "user" and len(_images_in(images_message)) == 1
    assert [i["from"] for i in result.steps[0].images] == ["task", "call"]


def test_spans_carry_image_digests_never_their_data(tmp_path: Path) -> None:
    """With content capture on, the chat span's input and the step span name images by digest and size."""
    capture = SpanCapture()
    set_capture_content(True)
    try:
        model = ScriptedModel(["```python\nscreenshot('home')\n```", "```python\nfinal_answer('red')\n```"])
        with CodeAgent([screenshot], model, ALLOW, tracer=capture.tracer, sandbox="auto") as agent:
            agent.run("What colour?", images=[_png()])
    finally:
        set_capture_content(False)
    task_png = _png()
    chats = capture.spans("chat")
    captured = " ".join(str(s.attributes.get("gen_ai.input.messages")) for s in chats)
    assert hashlib.sha256(task_png).hexdigest() in captured and "base64," not in captured
    steps = [s for s in capture.spans("step") if s.attributes.get("proctor.step.images")]
    assert steps and all("base64" not in str(s.attributes["proctor.step.images"]) for s in steps)
    assert '"tool": "screenshot"' in str(steps[0].attributes["proctor.step.images"]) or \
        '"tool": "screenshot"' in str(steps[-1].attributes["proctor.step.images"])
    [call] = capture.spans("execute_tool screenshot")
    shot = load_image(screenshot.fn("home"))
    result = str(call.attributes.get("gen_ai.tool.call.result"))
    assert shot.sha256 in result and '"width":40' in result and "base64" not in result


def test_replay_from_the_log_lists_each_steps_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`audit show --run` names every image a step brought in, by format, size and digest."""
    model = ScriptedModel(["```python\nscreenshot('home')\n```", "```python\nfinal_answer('red')\n```"])
    log = tmp_path / "audit.jsonl"
    with CodeAgent([screenshot], model, ALLOW, audit=str(log), sandbox="auto") as agent:
        run_id = agent.run("What colour?", images=[_png()]).run_id
    assert main(["audit", "show", str(log), "--run", run_id]) == 0
    out = capsys.readouterr().out
    assert "image with the task: PNG 20x10" in out and "image from screenshot: PNG 40x30" in out
    assert load_image(_png()).sha256[:16] in out


def test_a_streamed_run_takes_images_and_a_bad_one_raises_in_the_caller(tmp_path: Path) -> None:
    """`stream=True` passes the task's images on; an unusable image raises before the iterator exists."""
    model = ScriptedModel(['```python\nfinal_answer("blue")\n```'])
    with CodeAgent([screenshot], model, ALLOW, sandbox="auto") as agent:
        with pytest.raises(ImageError, match="not a readable image"):
            agent.run("x", stream=True, images=[b"not an image"])
        *_, result = agent.run("Which colour?", stream=True, images=[_png()])
    assert result.status == "done" and len(_images_in(model.calls[0][-1])) == 1


def test_litellm_sends_the_images_to_an_openai_compatible_server(tmp_path: Path) -> None:
    """Through real litellm, the request body carries the task's image as an image_url data-URI part."""
    from proctor.agent.models import LiteLLMModel

    from .openai_server import completion, serve

    png = _png((12, 12), (0, 255, 0))
    with serve([completion('```python\nfinal_answer("green")\n```')]) as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.base, api_key="test")
        with CodeAgent([screenshot], model, ALLOW, sandbox="auto") as agent:
            result = agent.run("Which colour?", images=[png])
    assert result.status == "done" and result.answer == "green"
    [task] = [m for m in fake.requests[0]["body"]["messages"] if m["role"] == "user"]
    assert _images_in(task) == [png]


def test_proctor_run_image_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor run --image PATH` shows the model the image; an unreadable one exits 2 before anything runs."""
    from .openai_server import completion, serve

    picture = tmp_path / "p.png"
    picture.write_bytes(_png())
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\ndefault: allow\nrules: []\n")
    base = ["run", "Which colour?", "--tools", "examples.tools_demo:get_ticket", "--policy", str(policy),
            "--model", "openai/gpt-4o-mini", "--model-arg", "api_key=test", "--audit", str(tmp_path / "a.jsonl"),
            "--json"]
    with serve([completion('```python\nfinal_answer("blue")\n```')]) as fake:
        assert main([*base, "--model-arg", f"api_base={fake.base}", "--image", str(picture)]) == 0
    [task] = [m for m in fake.requests[0]["body"]["messages"] if m["role"] == "user"]
    assert _images_in(task) == [picture.read_bytes()]
    capsys.readouterr()
    assert main([*base, "--image", str(tmp_path / "missing.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("proctor run: --image: cannot read ") and "missing.png: No such file" in err
    assert len(err.strip().splitlines()) == 1


@tool(side_effect="external")
def send(to: str) -> str:
    """Send the picture.

    Args:
        to: Who gets it.
    """
    return f"sent to {to}"


def test_a_resumed_run_shows_a_journaled_tool_image_again(tmp_path: Path) -> None:
    """A tool image from before a suspension is kept in the journal and reaches the model after the resume."""
    from proctor import InboxApprover, RunStore
    from proctor.store import AnswerSeal, ApprovalAnswer

    policy = Policy.from_dict({"version": 1, "default": "deny", "rules": [
        {"name": "reads", "match": {"tool": "screenshot"}, "decision": "allow"},
        {"name": "mail", "match": {"tool": "send"}, "decision": "require_approval"}]})
    step = "```python\nshot = screenshot('home')\nprint(shot)\nsend('bob')\n```"
    store = RunStore.open(f"sqlite:///{tmp_path}/runs.db")
    try:
        with CodeAgent([screenshot, send], ScriptedModel([step]), policy, approver=InboxApprover(store, wait="0s"),
                       store=store, sandbox="auto", audit=str(tmp_path / "audit.jsonl")) as agent:
            first = agent.run("Send bob the home page")
        assert first.status == "suspended"
        [pending] = store.list_approvals()
        store.answer_approval(pending.id, AnswerSeal.of_trail(str(tmp_path / "audit.jsonl")).sealed(
            pending, ApprovalAnswer("approve", "carol")), binding=pending.binding)
        model = ScriptedModel(['```python\nfinal_answer("sent")\n```'])
        with CodeAgent([screenshot, send], model, policy, approver=InboxApprover(store, wait="0s"), store=store,
                       sandbox="auto", audit=str(tmp_path / "audit.jsonl")) as agent:
            second = agent.resume(first.run_id)
    finally:
        store.close()
    assert second.status == "done" and second.answer == "sent"
    observation = model.calls[0][-1]
    assert "<image #1: PNG 40x30" in _parts(observation)[0]["text"]
    [image] = _images_in(observation)
    assert Image.open(io.BytesIO(image)).size == (40, 30)


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` pixels, with one tiny compressed row: a decompression bomb."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [6000, 10_000, 20_000])
def test_a_decompression_bomb_is_refused_from_its_header(side: int) -> None:
    """A few hundred bytes claiming 36 to 400 million pixels are refused before any pixel is decoded."""
    bomb = _png_header(side, side)
    assert len(bomb) < 200
    with pytest.raises(ImageError, match="MAX_IMAGE_PIXELS"):
        load_image(bomb, "images[0]")
