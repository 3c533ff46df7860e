"""`fxgate compact`: one compaction pass from the command line, or a request to the daemon.

The command takes the tables directory's compaction lock (spark/compaction.py). Held by the
daemon, the daemon compacts: the command leaves it a request (persistence/compaction_request.py)
and is done; `--include-open` is then refused, since the open date is the one the daemon writes
to. Held by another `fxgate compact`, it is refused too. Otherwise it reads the ledger (read
only, as `fxgate status` does) for the batches begun and not committed and the oldest row not yet
in the table, and compacts the dates before that in its own Spark session.
"""

from __future__ import annotations

import logging
import time

from actors.config.schema import Config
from actors.crashpoints import CrashPointError, arm_from_environ, crash_point
from persistence.compaction_request import write_compaction_request
from spark.location import local_path

log = logging.getLogger(__name__)


class CompactRefused(RuntimeError):
    """The pass cannot run here or now; the message says why (exit status 2)."""


def _ledger_state(config: Config) -> tuple[list[int], float | None]:
    """(batches begun and not committed, receive time of the oldest row not in the table)."""
    from persistence.database import open_engine
    from persistence.ledger_store import LedgerStore
    from persistence.records import TABLE

    path = config.gateway.ledger_path
    if not path.exists():
        return [], None
    engine = open_engine(path, readonly=True)
    store = LedgerStore(engine, path)
    try:
        return list(store.open_batches()), store.lag(TABLE).oldest_received_time
    finally:
        store.close()
        engine.dispose()


def compact_tables(config: Config, include_open: bool) -> str:
    from spark.compaction import CompactionBusy, CompactionLock, Compactor, closed_before

    try:
        arm_from_environ()
    except CrashPointError as error:
        raise CompactRefused(str(error)) from None
    tables = local_path(config.spark.tables_path(config.gateway.data_path))
    if tables is None:
        raise CompactRefused(
            "the tables are not on this machine's disk: compaction renames directories, which "
            "an object store cannot do atomically (README, Compaction)"
        )
    lock = CompactionLock(tables, "fxgate compact")
    try:
        lock.acquire()
    except CompactionBusy as busy:
        if busy.holder.get("role") != "daemon":
            raise CompactRefused(f"{busy}; try again when it has finished") from None
        if include_open:
            raise CompactRefused(
                f"{busy}: the daemon is running, and the open date is the one it writes to; "
                "stop it first to compact the open date"
            ) from None
        request = write_compaction_request(config.gateway.data_path)
        return (
            f"the daemon (pid {busy.holder.get('pid')}) compacts the tables while it runs: "
            f"compaction requested ({request}); its log says `compaction pass` when done"
        )
    try:
        open_batches, oldest = _ledger_state(config)
        boundary = None if include_open else closed_before(time.time(), oldest)
        from spark.session import build_session, stop_session

        session = build_session(
            config.spark.master,
            config.gateway.data_path / "spark-compact",
            driver_memory=config.spark.driver_memory,
            class_data_archive=config.spark.class_data_archive,
            conf={"spark.hadoop.fs.permissions.umask-mode": "077", **config.spark.conf},
        )
        try:
            log.info(
                "compacting %s: %s%s",
                tables,
                "every date" if boundary is None else f"the dates before {boundary}",
                f", not the dates of uncommitted batch(es) {open_batches}" if open_batches else "",
            )
            result = Compactor(
                session,
                tables,
                grace_seconds=config.compaction.grace_seconds,
                target_file_bytes=config.compaction.target_file_mb * 1024 * 1024,
                checkpoint=crash_point,
            ).run(boundary, exclude_batches=open_batches)
        finally:
            stop_session(session)
    finally:
        lock.release()
    return f"compaction pass: {result.summary()}"
