"""One writing process per tables directory: the daemon, or `fxgate compact` while it is stopped.

Delta commits are atomic, so two writers could not corrupt a table; but the exactly-once
protocol (spark/tables.py) rests on one writer committing a gateway's batches in order, and
maintenance runs between that writer's appends (DESIGN §7: keep one writing process per table).
Readers take no lock of ours: they read Delta snapshots.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

LOCK_FILE = ".fxgate-writer.lock"


class WriterBusy(RuntimeError):
    """Another process holds the tables directory's writer lock."""

    def __init__(self, holder: dict) -> None:
        self.holder = holder
        who = holder.get("role", "a process")
        super().__init__(f"the tables are being written by {who} (pid {holder.get('pid')})")


class WriterLock:
    """`<tables_dir>/.fxgate-writer.lock`, held with flock: the kernel lets it go when its
    process dies (SIGKILL included), so a stale lock never blocks the next start. The file says
    who holds it (`role`: daemon or command, `pid`), for `fxgate compact` to tell which."""

    def __init__(self, tables_dir: Path, role: str) -> None:
        self.path = Path(tables_dir) / LOCK_FILE
        self.role = role
        self._fd: int | None = None

    def acquire(self, wait: bool = False) -> WriterLock:
        """Take the lock; WriterBusy when another process holds it, unless `wait`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise WriterBusy(lock_holder(self.path.parent) or {}) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"role": self.role, "pid": os.getpid()}).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_holder(tables_dir: Path) -> dict | None:
    """Who holds the lock ({"role", "pid"}), or None when nobody does."""
    path = Path(tables_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 4096, 0).decode(errors="replace")
            try:
                return json.loads(text)
            except ValueError:
                return {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
