"""The SQLite run store passes the store contract, and opens by path or sqlite:// URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_conformance import StoreConformance, StoreForgeryConformance

from proctor.errors import StoreError
from proctor.store import RunRecord, RunStore
from proctor.store.sqlite import SQLiteRunStore


class TestSQLiteStore(StoreConformance):
    """The conformance suite against a fresh SQLite file."""

    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/runs.db"


class TestSQLiteStoreForgery(StoreForgeryConformance):
    """The forgery cases against the same kind of store."""

    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/runs.db"


def test_plain_path_and_url_open_the_same_file(tmp_path: Path) -> None:
    """A bare path and its sqlite:/// URL are the same store."""
    a = RunStore.open(tmp_path / "runs.db")
    a.create_run(RunRecord("run_a", "t"))
    b = RunStore.open(f"sqlite:///{tmp_path}/runs.db")
    assert isinstance(b, SQLiteRunStore) and b.get_run("run_a").task == "t"
    a.close()
    b.close()


@pytest.mark.parametrize("url", ["", "sqlite:///:memory:", "sqlite://runs.db", "mysql://x/y"])
def test_bad_urls_are_refused_with_what_to_write(url: str) -> None:
    """Empty, in-memory, malformed and unknown URLs raise StoreError."""
    with pytest.raises(StoreError):
        RunStore.open(url)


def test_missing_directory_is_a_store_error(tmp_path: Path) -> None:
    """A store in a directory that does not exist is refused, not created somewhere else."""
    with pytest.raises(StoreError, match="does not exist"):
        RunStore.open(tmp_path / "nope" / "runs.db")


def test_wal_mode(tmp_path: Path) -> None:
    """The file is in WAL mode, so readers never block the writer."""
    store = SQLiteRunStore(str(tmp_path / "runs.db"))
    assert store._query("PRAGMA journal_mode")[0][0] == "wal"
    store.close()
