"""`fxgate compact`: one table maintenance pass from the command line, or a request to the daemon.

The command takes the tables directory's writer lock (spark/writer_lock.py). Held by the daemon,
the daemon maintains its tables between its own writes: the command leaves it a request
(persistence/compaction_request.py) and is done. Held by another `fxgate compact`, it is refused.
Otherwise it runs the pass itself (spark/maintenance.py): OPTIMIZE, VACUUM, checkpoints and log
clean-up, each a Delta commit or a deletion no snapshot within the retention needs, so it takes
no lock of the readers and no ledger state. With the tables on this disk or an object store it
starts no JVM; for tables only Spark reaches (a cluster's HDFS, s3a) it runs the pass through
delta-spark. A shared group's members hold no writer lock (DESIGN §7.12), nor does anything on an
object store: beside them the command runs its pass itself, each OPTIMIZE claimed as theirs are.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from actors.app.command_session import command_session
from actors.app.progress import ProgressReporter
from actors.config.schema import Config
from actors.crashpoints import (
    MAINTENANCE_CRASH_DELAY,
    CrashPointError,
    arm_from_environ,
    crash_point,
    crash_soon,
)
from persistence.compaction_request import write_compaction_request
from spark.location import local_path, object_store

log = logging.getLogger(__name__)


class CompactRefused(RuntimeError):
    """The pass cannot run here or now; the message says why (exit status 2)."""


def compact_tables(config: Config, progress: ProgressReporter | None = None) -> str:
    """Run the pass here, or hand it to the daemon; the line that says which. `progress`
    reports the pass (tables, files compacted), not the hand-over, which takes no time."""
    from spark.writer_lock import WriterBusy, WriterLock

    progress = progress or ProgressReporter(enabled=False)

    try:
        arm_from_environ()
    except CrashPointError as error:
        raise CompactRefused(str(error)) from None
    location = config.spark.tables_path(config.gateway.data_path)
    tables = local_path(location)
    if tables is None and object_store(location) is not None:
        # No lock file on a store: the pass claims each OPTIMIZE, beside any writer there.
        maintainer = _delta_maintainer(
            config, str(location), f"{config.identity.client_id} (fxgate compact)"
        )
        with progress.start("compact", unit="tables", counts=("files", "vacuumed")):
            result = maintainer.run(time.time(), progress)
        return f"maintenance pass: {result.summary()}"
    if tables is None:
        return _spark_pass(config, location, progress)
    lock = WriterLock(tables, "fxgate compact")
    try:
        lock.acquire()
    except WriterBusy as busy:
        if busy.holder.get("role") != "daemon":
            raise CompactRefused(f"{busy}; try again when it has finished") from None
        request = write_compaction_request(config.gateway.data_path)
        return (
            f"the daemon (pid {busy.holder.get('pid')}) maintains the tables while it runs: "
            f"maintenance requested ({request}); its log says `maintenance pass` when done"
        )
    try:
        _refuse_legacy_layout(tables)
        log.info("maintaining the Delta tables in %s", tables)
        maintainer = _delta_maintainer(
            config,
            tables,
            # A shared group's members maintain its tables while they run, with no lock between
            # them: the command claims each OPTIMIZE as they do (spark/maintenance.py).
            None
            if config.group_tables is None
            else f"{config.identity.client_id} (fxgate compact)",
        )
        with progress.start("compact", unit="tables", counts=("files", "vacuumed")):
            result = maintainer.run(time.time(), progress)
    finally:
        lock.release()
    return f"maintenance pass: {result.summary()}"


def _delta_maintainer(config: Config, tables: Path | str, claim: str | None):
    """A pass with delta-rs over the tables on this disk or an object store, with the
    configuration's sizes and retention; each OPTIMIZE claimed as `claim` (None: the lock)."""
    from spark.maintenance import DeltaMaintainer

    return DeltaMaintainer(
        tables,
        target_file_bytes=config.compaction.target_file_mb * 1024 * 1024,
        open_file_bytes=config.compaction.open_file_mb * 1024 * 1024,
        vacuum_retention_hours=config.compaction.vacuum_retention_hours,
        checkpoint=crash_point,
        soon=lambda name: crash_soon(name, delay=MAINTENANCE_CRASH_DELAY),
        properties=config.compaction.table_properties(),
        claim=claim,
    )


def _refuse_legacy_layout(tables: Path) -> None:
    """Tables of the layout before Delta are the daemon's to convert (it knows which batches
    its ledger has not committed); a pass over them would see no Delta table."""
    from spark.convert import legacy_tables

    found = legacy_tables(tables)
    if found:
        raise CompactRefused(
            f"{', '.join(found)} in {tables} still in the layout before Delta: start the daemon "
            "once, it converts them in place before its first write"
        )


def _spark_pass(config: Config, location, progress: ProgressReporter) -> str:
    """Remote tables: the pass through delta-spark (the daemon's own passes run the same way);
    refused, saying what to install, where Spark is not installed."""
    from spark.maintenance import SparkMaintainer
    from spark.session import SparkNotInstalled, check_spark, stop_session

    try:
        check_spark()
    except SparkNotInstalled as error:
        raise CompactRefused(f"{location} is maintained through Spark: {error}") from None

    with progress.start("compact", unit="tables", counts=("files",), note="starting Spark"):
        session = command_session(config, "compact")
        try:
            result = SparkMaintainer(
                session,
                location,
                vacuum_retention_hours=config.compaction.vacuum_retention_hours,
            ).run(time.time(), progress)
        finally:
            stop_session(session)
    return f"maintenance pass: {result.summary()}"
