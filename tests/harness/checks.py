"""Waiting for a gateway's data directory to settle: every read landed, nothing pending."""

from __future__ import annotations

import time
from pathlib import Path

from persistence.database import open_engine
from spark.tables import READS, read_table_arrow


def settled(data: Path) -> tuple[int, int, int]:
    """(rows in the reads table, ledger rows not yet landed, batches begun and not committed)."""
    rows = read_table_arrow(data / "tables", READS).num_rows
    engine = open_engine(data / "ledger.sqlite", readonly=True)
    try:
        with engine.connect() as conn:
            pending = conn.exec_driver_sql(
                "SELECT count(*) FROM inbound WHERE landed_time IS NULL"
            ).scalar()
            open_batches = conn.exec_driver_sql(
                "SELECT count(*) FROM batches WHERE state = 'writing'"
            ).scalar()
    finally:
        engine.dispose()
    return rows, pending, open_batches


def wait_until_landed(daemon, data: Path, expected: int, timeout: float = 120.0) -> None:
    """Wait, on the daemon's 'batch written' log lines, until the table holds `expected` rows and
    the ledger has nothing pending (a replayed batch is committed, not just rewritten)."""
    deadline = time.monotonic() + timeout
    daemon.wait_for_log(r"fxgate started", timeout=timeout)
    while True:
        mark = daemon.mark()
        state = settled(data)
        if state == (expected, 0, 0):
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            tail = "\n".join(daemon.output().splitlines()[-60:])
            raise AssertionError(
                f"(rows, pending, open batches) = {state}, expected {expected} rows, "
                f"after {timeout} s; daemon log tail:\n{tail}"
            )
        try:
            daemon.wait_for_log(r"batch \d+ written", timeout=remaining, after=mark)
        except AssertionError:
            continue  # the deadline check above reports it, with the state


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Re-check `predicate` until it holds or `timeout` passes: for state that only an actor's
    answer can show (no event to wait on). Returns whether it held."""
    import threading

    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            return False
        pause.wait(interval)
    return True
