"""A QA agent that looks at screenshots: images for a vision model, governed and audited by digest.

    python examples/vision_agent.py                               # scripted model, offline
    python examples/vision_agent.py --model openai/gpt-4o-mini    # a real vision model

The task comes with a mock-up of the checkout page; the `screenshot` tool returns what the
page looks like now (a PIL image). The sandboxed program only ever holds a text handle for
it; the model sees the picture with the next observation. Filing a bug on the public tracker
is refused by the policy; the internal tracker is allowed. At the end the run is printed a
second time from its audit log alone — as `proctor audit show LOG --run RUN_ID` does — with
each image's format, size and digest (the log never holds an image's bytes).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proctor import tool
from proctor.agent import CodeAgent, LiteLLMModel, Message, Model, ScriptedModel
from proctor.agent.render import print_run
from proctor.agent.replay import run_from_log
from proctor.policy import Policy
from proctor.telemetry.logging import configure_logging

POLICY = Policy.from_dict({
    "version": 1,
    "default": "deny",
    "rules": [
        {"name": "look", "match": {"tool": "screenshot"}, "decision": "allow"},
        {"name": "internal-tracker", "match": {"tool": "file_bug"}, "when": "args.tracker == 'internal'",
         "decision": "allow"},
        {"name": "no-public-bugs", "match": {"tool": "file_bug"}, "when": "args.tracker != 'internal'",
         "decision": "deny", "reason": "bugs go to the internal tracker first"},
    ],
})


def _page(button: tuple[int, int, int]) -> Any:
    from PIL import Image, ImageDraw

    page = Image.new("RGB", (320, 200), (245, 245, 245))
    draw = ImageDraw.Draw(page)
    draw.rectangle((20, 20, 300, 60), fill=(40, 40, 40))  # the header
    draw.rectangle((200, 140, 300, 180), fill=button)  # the "Pay" button
    return page


@tool(side_effect="read")
def screenshot(url: str) -> Any:
    """A screenshot of a page as it renders now.

    Args:
        url: The page's address.
    """
    return _page(button=(245, 245, 245))  # the button is drawn in the background colour: invisible


@tool(side_effect="external")
def file_bug(tracker: str, title: str, body: str) -> str:
    """File a bug report.

    Args:
        tracker: "internal" or "public".
        title: One line.
        body: What is wrong.
    """
    return f"filed on the {tracker} tracker: {title}"


def _saw_two_pages(messages: Sequence[Message]) -> str:
    """The scripted model's second answer, given only once the screenshot reached it as an image."""
    pictures = [part for m in messages if isinstance(m.get("content"), list) for part in m["content"]
                if part.get("type") == "image_url"]
    if len(pictures) != 2:
        raise SystemExit(f"the model was shown {len(pictures)} image(s), expected the mock-up and the screenshot")
    return '''Thought: In the screenshot the Pay button has the page's background colour: it is invisible.
```python
for tracker in ["public", "internal"]:
    try:
        print(file_bug(tracker=tracker, title="Checkout: Pay button invisible",
                       body="The Pay button renders in the background colour (see screenshot)."))
    except ToolDenied as e:
        print("not filed:", e)
final_answer("bug filed on the internal tracker: the Pay button is invisible")
```'''


SCRIPT: list[Any] = [
    '''Thought: Compare the live page with the mock-up.
```python
shot = screenshot(url="https://shop.example/checkout")
print("got", shot)
```''',
    _saw_two_pages,
]

TASK = "Compare the checkout page with the attached mock-up and file a bug if something is missing."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a litellm vision model id (default: scripted, offline)")
    parser.add_argument("--audit", default="vision-audit.jsonl", help="audit log path")
    args = parser.parse_args(argv)
    configure_logging(level="error")
    model: Model = LiteLLMModel(args.model) if args.model else ScriptedModel(SCRIPT)
    mockup = _page(button=(30, 120, 220))
    with CodeAgent([screenshot, file_bug], model, POLICY, audit=args.audit, sandbox="auto") as agent:
        result = agent.run(TASK, images=[mockup])
        print("\n=== the run, from the agent's memory (agent.replay()) ===")
        agent.replay(file=sys.stdout)
    print(f"\n=== the same run, from {Path(args.audit).name} alone (proctor audit show LOG --run RUN_ID) ===")
    replayed = run_from_log(args.audit, result.run_id)
    print_run(replayed.result, file=sys.stdout, notes=replayed.notes)
    return 0 if result.status == "done" else 1


if __name__ == "__main__":
    raise SystemExit(main())
