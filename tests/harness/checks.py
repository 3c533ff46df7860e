"""Waiting for a gateway's data directory to settle: every read landed, nothing pending."""

from __future__ import annotations

import time
from pathlib import Path

from persistence.database import open_engine
from spark.tables import READS, read_table_arrow


def settled(data: Path, tables: Path | str | None = None) -> tuple[int, int, int]:
    """(rows in the reads table, ledger rows not yet landed, batches begun and not committed);
    the tables are <data>/tables unless `tables` names another place (a path or a URI)."""
    rows = read_table_arrow(data / "tables" if tables is None else tables, READS).num_rows
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


def wait_until_landed(
    daemon, data: Path, expected: int, timeout: float = 120.0, tables: Path | str | None = None
) -> None:
    """Wait, on the daemon's 'batch written' log lines, until the table holds `expected` rows and
    the ledger has nothing pending (a replayed batch is committed, not just rewritten); `tables`
    as for `settled`."""
    deadline = time.monotonic() + timeout
    daemon.wait_for_log(r"fxgate started", timeout=timeout)
    while True:
        mark = daemon.mark()
        state = settled(data, tables)
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


# How long the union wait listens to one gateway's log before it looks at the others: no one
# condition spans the logs of several processes, so it takes turns.
_TURN_SECONDS = 1.0


def wait_until_landed_union(
    gateways, expected: int, timeout: float = 240.0, tables: Path | None = None
) -> None:
    """Wait until the tables of several gateways together hold `expected` rows and none of their
    ledgers has anything pending or a batch open: the members of one shared group each land their
    share, into `tables` when they share that one (DESIGN §7.12), else each into its own.
    `gateways` holds (daemon, data dir) pairs; a 'batch written' line of the daemon whose turn it
    is re-checks at once. Fails at once when a daemon has exited."""
    deadline = time.monotonic() + timeout
    for daemon, _ in gateways:
        daemon.wait_for_log(r"fxgate started", timeout=max(deadline - time.monotonic(), 0.1))
    turn = 0
    while True:
        marks = [daemon.mark() for daemon, _ in gateways]
        states = [settled(data, tables) for _, data in gateways]
        rows = (
            sum(state[0] for state in states)
            if tables is None
            else read_table_arrow(tables, READS).num_rows
        )
        if rows == expected and all(state[1:] == (0, 0) for state in states):
            return
        remaining = deadline - time.monotonic()
        ended = [data.name for daemon, data in gateways if daemon.proc.poll() is not None]
        if remaining <= 0 or ended:
            shown = ", ".join(
                f"{data.name} {state}" for (_, data), state in zip(gateways, states, strict=True)
            )
            tails = "\n".join(
                f"--- {data.name}:\n" + "\n".join(daemon.output().splitlines()[-30:])
                for daemon, data in gateways
            )
            cause = f"exited: {', '.join(ended)}" if ended else f"after {timeout} s"
            raise AssertionError(
                f"(rows, pending, open batches) per gateway: {shown}; expected {expected} rows "
                f"in all, {cause}; daemon log tails:\n{tails}"
            )
        index = turn % len(gateways)
        turn += 1
        try:
            gateways[index][0].wait_for_log(
                r"batch \d+ written", timeout=min(remaining, _TURN_SECONDS), after=marks[index]
            )
        except AssertionError:
            continue  # another gateway's turn; the checks above report a real stall


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
