"""Owner-only permissions of the data directory and the SQLite files (issue 7, security)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from persistence.database import connect_sqlite, open_engine
from persistence.permissions import private_directory, private_file


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def permissive_umask():
    """A umask that would leave everything world-writable: the modes must not depend on it."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def test_connect_sqlite_creates_an_owner_only_directory_and_database_with_private_wal_and_shm(
    tmp_path, permissive_umask
):
    data = tmp_path / "data"
    db = connect_sqlite(data / "outbound.sqlite", "process", "CREATE TABLE t (x INTEGER);")
    try:
        db.execute("INSERT INTO t VALUES (1)")
        db.commit()
        assert mode(data) == 0o700
        for name in ("outbound.sqlite", "outbound.sqlite-wal", "outbound.sqlite-shm"):
            assert (data / name).exists(), name
            assert mode(data / name) == 0o600, name
    finally:
        db.close()


def test_the_ledger_engine_creates_private_files_too(tmp_path, permissive_umask):
    data = tmp_path / "data"
    engine = open_engine(data / "ledger.sqlite")
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO counters (name, value) VALUES ('x', 1)"))
        assert mode(data) == 0o700
        for name in ("ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"):
            assert mode(data / name) == 0o600, name
    finally:
        engine.dispose()


def test_an_existing_open_directory_and_database_are_tightened_and_keep_their_rows(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    db = connect_sqlite(data / "lifecycle.sqlite", "process", "CREATE TABLE t (x INTEGER);")
    db.execute("INSERT INTO t VALUES (7)")
    db.commit()
    db.close()
    # As an earlier version (or a careless copy) left them.
    data.chmod(0o755)
    for path in data.iterdir():
        path.chmod(0o644)

    db = connect_sqlite(data / "lifecycle.sqlite", "process", "CREATE TABLE IF NOT EXISTS t (x);")
    try:
        assert db.execute("SELECT x FROM t").fetchall() == [(7,)]
        assert mode(data) == 0o700
        assert {p.name: mode(p) for p in data.iterdir()} == {
            "lifecycle.sqlite": 0o600,
            "lifecycle.sqlite-wal": 0o600,
            "lifecycle.sqlite-shm": 0o600,
        }
    finally:
        db.close()


def test_a_shared_sticky_directory_is_left_alone_with_a_warning(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: a mistaken data_dir must not lock others out of it
    private_directory(shared)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert any("not the daemon's own to change" in r.getMessage() for r in caplog.records)


def test_private_file_never_truncates_an_existing_file(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"content")
    path.chmod(0o664)
    private_file(path)
    assert path.read_bytes() == b"content"
    assert mode(path) == 0o600
