"""WalCheckpointer: the ledger's WAL checkpoints, on a connection and thread of their own.

SQLite checkpoints the WAL on the connection whose commit took it past 1,000 pages, inside that
commit: the commit then copies the WAL into the database file and, at `durability = "process"`,
pays the database file's fsync as well. The ledger commits on paho's network thread when the
window is small (actors.ledger, InlineIntake), where an ack must not wait for that. So the
ledger's own connection never checkpoints (`wal_autocheckpoint = 0`), and asks this thread to,
every so many commits. A PASSIVE checkpoint takes no lock a writer needs: the ledger's commits go
on meanwhile.

But a PASSIVE checkpoint alone never bounds the WAL under steady load. SQLite writes the WAL from
its start again only when a write transaction begins while every frame in it is copied, and the
ledger's commits append frames while the checkpoint copies the older ones; the race is lost every
time. A 10-minute outage at 300 messages/s left a 4.7 GB WAL (bench memory, 2026-12-06), and its
index (`-shm`), mapped into the process, grew by 1 MiB a minute. So once a PASSIVE checkpoint
leaves more than `restart_pages` in the WAL, a RESTART checkpoint follows: it waits for the
ledger's transaction under way, holds back the next one while it copies the few frames added
since and syncs, and leaves the WAL to be written from its start (then cut back to
`journal_size_limit`, persistence.database). The ledger's commit waits for that at most once per
`restart_pages` of WAL.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from sqlalchemy import Engine

from persistence.database import WAL_SIZE_LIMIT
from persistence.storage_faults import describe

log = logging.getLogger(__name__)


# A PASSIVE checkpoint that leaves more pages than this in the WAL is followed by a RESTART one:
# the WAL's journal_size_limit (persistence.database) in SQLite's 4 KiB pages.
RESTART_PAGES = WAL_SIZE_LIMIT // 4096


class WalCheckpointer:
    """A thread that runs `PRAGMA wal_checkpoint(PASSIVE)` on its own connection of `engine`
    each time it is asked (asks that come while it works make one more checkpoint, not many),
    and a RESTART one when the WAL holds more than `restart_pages` (module docstring)."""

    def __init__(self, engine: Engine, path: Path, restart_pages: int = RESTART_PAGES) -> None:
        self._engine = engine
        self._path = path
        self._restart_pages = restart_pages
        self._asked = threading.Event()
        self._closing = False
        self.checkpoints = 0
        self.restarts = 0
        self.failures = 0
        self._thread = threading.Thread(
            target=self._run, name=f"wal-checkpoint {Path(path).name}", daemon=True
        )
        self._thread.start()

    def request(self) -> None:
        self._asked.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread, after the checkpoint under way if any (SQLite checkpoints once
        more when the last connection to the file closes)."""
        self._closing = True
        self._asked.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        # The connection is made here: it belongs to this thread alone.
        with self._engine.connect() as conn:
            raw = conn.connection.driver_connection
            while True:
                self._asked.wait()
                self._asked.clear()
                if self._closing:
                    return
                try:
                    busy, log_pages, copied = raw.execute(
                        "PRAGMA wal_checkpoint(PASSIVE)"
                    ).fetchone()
                    if log_pages > self._restart_pages:
                        busy, log_pages, copied = raw.execute(
                            "PRAGMA wal_checkpoint(RESTART)"
                        ).fetchone()
                        if not busy:
                            self.restarts += 1
                except Exception as error:
                    # The next commits ask again; a storage fault is the ledger's to report.
                    self.failures += 1
                    log.debug("WAL checkpoint of %s failed: %s", self._path, describe(error))
                    continue
                self.checkpoints += 1
                log.debug(
                    "WAL checkpoint of %s: %d of %d page(s) copied%s",
                    self._path,
                    copied,
                    log_pages,
                    " (a reader held the rest)" if busy or copied < log_pages else "",
                )
