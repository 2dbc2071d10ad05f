"""Finding the program in a model's answer.

Accepted, in this order: fenced ```python / ```py blocks (also a bare ``` fence),
and smolagents' ``<code>…</code>`` tags. Several blocks in one answer are joined in
order, as models often split a program. A block left open at the end (the stop
sequence cut it) is taken to the end of the text.
"""

from __future__ import annotations

import re

from proctor.errors import CodeParseError

__all__ = ["CodeParseError", "extract_code"]

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"<code>\s*\n?(.*?)(?:</code>|\Z)", re.DOTALL | re.IGNORECASE)

FORMAT_HINT = (
    "Write your next program in a fenced block:\n"
    "Thought: what you will do and why.\n"
    "```python\n# your code\n```\n"
    "End the task by calling final_answer(...) inside a program."
)


def extract_code(text: str) -> str:
    """The program in `text`; raise `CodeParseError` when there is none."""
    blocks = [m.group(1) for m in _FENCE.finditer(text) if m.group(1).strip()]
    if not blocks:
        blocks = [m.group(1) for m in _TAG.finditer(text) if m.group(1).strip()]
    if not blocks:
        raise CodeParseError("Error: your answer had no code block, so nothing ran.\n" + FORMAT_HINT)
    return "\n\n".join(b.rstrip() for b in blocks)
