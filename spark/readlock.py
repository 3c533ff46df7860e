"""The tables' read lock: readers that hold it never see a compaction swap half way.

A reader of a hive-partitioned table by path lists in steps: the table, then each `date=D`
directory, then each `batch_id=N` directory in it, then opens the files. Compaction replaces a
whole `date=D` directory in one rename (spark/compaction.py), so a reader that lists first or
afterwards sees every row once; but a reader that listed `date=D`'s batch directories before
the swap and descends into them after it finds them gone, and Spark, pyarrow and DuckDB all pass
over a directory that vanished mid-listing without an error: that date's rows are silently
missing from the answer. No order of renames avoids it (whatever a late step of such a listing
can reach, a fresh listing reaches too), so the swap and the readers agree on a lock instead.

`<tables_dir>/.swap.lock`, held with flock (the kernel lets it go when its holder dies, SIGKILL
included): a reader holds it shared from its listing to its last file read (`reading`); the
compactor holds it exclusively only for the rename itself (`swapping`), microseconds, so readers
hardly ever wait and a reader holding it for a long query only delays the swap. Readers that
follow one another without a pause would hold a shared lock without a gap for ever (measured: two
reading in a loop kept a swap out for 30 s), so a swap first takes `<tables_dir>/.swap.gate` and
our readers pass through the gate (take it, take the lock, let the gate go): a waiting swap lets
no new reader in, and goes as soon as the readers already in are done. `fxgate sql`,
`fxgate audit` and `fxgate report` read that way; other tools can hold the lock alone, e.g.
`flock -s <tables_dir>/.swap.lock duckdb ...` (the README says so): safe, though a tool that never
lets go for long keeps dates uncompacted. Names starting with `.` are hidden from every reader of
the tables.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from spark.location import Location, local_path

logger = logging.getLogger(__name__)

SWAP_LOCK_FILE = ".swap.lock"
SWAP_GATE_FILE = ".swap.gate"
READ_WAIT_SECONDS = 60.0
"""How long a reader waits for the lock: a swap holds it for a rename and an fsync, but may hold
the gate while it waits (at most SWAP_WAIT_SECONDS) for the readers already in."""
SWAP_WAIT_SECONDS = 30.0
"""How long the compactor waits for readers to let go before it leaves a date for the next pass."""
_POLL_SECONDS = 0.01


class TablesBusy(RuntimeError):
    """The tables' read lock could not be had in time."""


def swap_lock_path(tables_dir: Path) -> Path:
    return Path(tables_dir) / SWAP_LOCK_FILE


def swap_gate_path(tables_dir: Path) -> Path:
    return Path(tables_dir) / SWAP_GATE_FILE


def _open(path: Path) -> int | None:
    """A descriptor to lock `path` through, made if missing; None where that cannot be."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return None


def _take(fd: int, kind: int, wait_seconds: float) -> bool:
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            # A kernel lock held by another process: nothing to wait on but the lock itself.
            time.sleep(_POLL_SECONDS)


@contextlib.contextmanager
def reading(tables_dir: Location, wait_seconds: float | None = None) -> Iterator[None]:
    """Hold the read lock of `tables_dir` (shared) for the block: list and read in it.

    Tables not on this machine's disk are never compacted (`fxgate compact` refuses them), so
    there is nothing to hold. Nor is there where the lock file cannot be opened or made (a
    reader without write access to a tables directory no compactor has run on yet).
    Raises TablesBusy when a swap holds it past `wait_seconds` (default READ_WAIT_SECONDS)."""
    wait_seconds = READ_WAIT_SECONDS if wait_seconds is None else wait_seconds
    local = local_path(tables_dir)
    gate = None if local is None else _open(swap_gate_path(local))
    fd = None if local is None else _open(swap_lock_path(local))
    if gate is None or fd is None:
        for held in (gate, fd):
            if held is not None:
                os.close(held)
        yield
        return
    try:
        deadline = time.monotonic() + wait_seconds
        try:
            if not (
                _take(gate, fcntl.LOCK_EX, wait_seconds)
                and _take(fd, fcntl.LOCK_SH, max(0.0, deadline - time.monotonic()))
            ):
                raise TablesBusy(
                    f"{swap_lock_path(local)} was held for a compaction swap for more than "
                    f"{wait_seconds:g} s"
                )
        finally:
            os.close(gate)  # through the gate: the next reader may pass
        yield
    finally:
        os.close(fd)  # closing drops the flock


@contextlib.contextmanager
def swapping(tables_dir: Path, wait_seconds: float = SWAP_WAIT_SECONDS) -> Iterator[bool]:
    """Hold the read lock of `tables_dir` exclusively for the block; yields False (and holds
    nothing) when readers held it past `wait_seconds`."""
    path = swap_lock_path(tables_dir)
    gate = os.open(swap_gate_path(tables_dir), os.O_RDWR | os.O_CREAT, 0o644)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_seconds
        held = _take(gate, fcntl.LOCK_EX, wait_seconds) and _take(
            fd, fcntl.LOCK_EX, max(0.0, deadline - time.monotonic())
        )
        if not held:
            logger.warning(
                "readers held %s for %g s: the swap waits for the next pass", path, wait_seconds
            )
        yield held
    finally:
        os.close(fd)
        os.close(gate)
