"""Tests for finding the program in a model's answer."""

from __future__ import annotations

import pytest

from proctor.agent.parsing import CodeParseError, extract_code


def test_python_fence() -> None:
    """A ```python block is the program, without the prose around it."""
    text = "Thought: look it up.\n```python\nx = get(1)\nprint(x)\n```\nThat is all."
    assert extract_code(text) == "x = get(1)\nprint(x)"


def test_py_and_bare_fences() -> None:
    """```py and bare ``` fences are accepted too."""
    assert extract_code("```py\na = 1\n```") == "a = 1"
    assert extract_code("```\nb = 2\n```") == "b = 2"


def test_smolagents_code_tags() -> None:
    """smolagents' <code>…</code> tags are accepted."""
    assert extract_code("Thought: x\n<code>\nfinal_answer(3)\n</code>") == "final_answer(3)"


def test_several_blocks_are_joined_in_order() -> None:
    """Two blocks in one answer run as one program, in order."""
    assert extract_code("```python\na = 1\n```\nthen\n```python\nb = a + 1\n```") == "a = 1\n\nb = a + 1"


def test_unclosed_block_runs_to_the_end() -> None:
    """A block cut by the stop sequence is taken to the end of the text."""
    assert extract_code("```python\nprint('hi')\n") == "print('hi')"


def test_other_languages_are_not_programs() -> None:
    """A ```json block alone is not a program."""
    with pytest.raises(CodeParseError):
        extract_code('Here:\n```json\n{"a": 1}\n```')


def test_no_code_explains_the_format() -> None:
    """An answer without code raises a message that shows the expected format."""
    with pytest.raises(CodeParseError, match="```python"):
        extract_code("I think the answer is 42.")
