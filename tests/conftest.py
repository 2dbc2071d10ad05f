"""Suite-wide test settings."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_per_module() -> Iterator[None]:
    """Collect garbage after each module, so a leaked socket or event loop fails the module that leaked it.

    Without this, `filterwarnings = error` turns a ResourceWarning into a failure of
    whichever unrelated test happens to be running when the collector runs.
    """
    yield
    gc.collect()
