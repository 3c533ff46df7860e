"""The ledger's WAL stays bounded while its writer commits without a pause, its checkpoints on
a connection and thread of their own (persistence.wal_checkpoint)."""

import os

import pytest

from persistence.database import WAL_SIZE_LIMIT, open_engine
from persistence.wal_checkpoint import WalCheckpointer

PAGE = 4096
COMMITS = 4000  # some 50 MB of WAL if nothing restarts it
ASK_EVERY = 16  # commits between checkpoint requests, as the ledger's CHECKPOINT_COMMITS
RESTART_PAGES = 64


def commit_steadily(tmp_path, restart_pages):
    """A writer that never leaves the WAL idle: each commit adds a page. The largest WAL file
    seen, and the checkpointer's counters."""
    path = tmp_path / "ledger.sqlite"
    engine = open_engine(path)
    largest = 0
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        raw.isolation_level = None
        raw.execute("PRAGMA wal_autocheckpoint=0")  # as the ledger's own connection
        raw.execute("CREATE TABLE rows (body BLOB)")
        checkpointer = WalCheckpointer(engine, path, restart_pages=restart_pages)
        try:
            for n in range(1, COMMITS + 1):
                raw.execute("BEGIN")
                raw.execute("INSERT INTO rows VALUES (?)", (os.urandom(PAGE - 200),))
                raw.execute("COMMIT")
                if n % ASK_EVERY == 0:
                    checkpointer.request()
                largest = max(largest, os.path.getsize(f"{path}-wal"))
        finally:
            checkpointer.close()
    engine.dispose()
    return largest, checkpointer


def test_a_writer_that_never_pauses_leaves_the_wal_bounded_by_restart_checkpoints(tmp_path):
    largest, checkpointer = commit_steadily(tmp_path, RESTART_PAGES)
    assert checkpointer.failures == 0
    assert checkpointer.restarts >= 1
    # Reused from its start after each restart, the file stays at its largest size so far,
    # which is the threshold plus the checkpointer's lag behind the writer (4-12 MB here);
    # SQLite cuts it back to this limit only when it is restarted.
    assert largest <= WAL_SIZE_LIMIT, largest


@pytest.mark.parametrize("restart_pages", [10**9])
def test_passive_checkpoints_alone_let_the_wal_grow_under_the_same_writer(tmp_path, restart_pages):
    """Why the restarts exist: the measurement above is one that can fail."""
    largest, checkpointer = commit_steadily(tmp_path, restart_pages)
    assert checkpointer.checkpoints >= 1 and checkpointer.restarts == 0
    assert largest > 2 * WAL_SIZE_LIMIT, largest
