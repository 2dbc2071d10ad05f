from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .inbox_helpers import SENT, Inbox


@pytest.fixture
def inbox(tmp_path: Path) -> Iterator[Inbox]:
    SENT.clear()
    yield Inbox(tmp_path)
