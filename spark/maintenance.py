"""Table maintenance through Delta's own operations: OPTIMIZE, VACUUM, checkpoints, log clean-up.

The writer appends one small file per date per table per batch (one every second or two while
reads flow), and a table read through thousands of small files is slow (DESIGN §4: 1,000 appends
counted in 0.94 s before OPTIMIZE, 0.01 s after), and so is every append, whose snapshot update
grows with the live file count. A pass, on the daemon's schedule and between its writes:
1. OPTIMIZE (bin-packing compaction) of each table: the closed dates into files of up to
   `target_file_bytes`, the open date (today's, still landing) into files of up to
   `open_file_bytes`, smaller, so a pass does not rewrite the whole day every time; once the
   date is closed, the next pass packs it whole. A compaction commit changes no data
   (`dataChange = false`), keeps the table's transaction identifiers, and readers go on reading
   the snapshot they opened: nothing of ours to lock.
2. VACUUM: the files a compaction replaced are deleted once they are older than
   `vacuum_retention_hours` (a reader that opened an older snapshot within that time finds its
   files), and so are files that no commit lists (a write killed between its files and its
   commit) once as old.
3. A checkpoint and log clean-up: commits older than the table's `delta.logRetentionDuration`
   go, so a table that commits every second for a year opens from one checkpoint and a bounded
   number of JSON commits.

In a shared group's tables (DESIGN §7.12) any member may run a pass, with no lock between them:
each OPTIMIZE is preceded by the member's claim (`MAINTAINED_BY`, a table property, so a metadata
commit) and reads the snapshot of that claim. delta-rs fails a commit whose window holds a
metadata change, and does not fail an OPTIMIZE over files another OPTIMIZE replaced (measured:
both committed, every row of those files twice); with the claims, of two OPTIMIZEs that overlap
the one that read first meets the other's claim and fails, and is skipped until the next pass.
A member's merge in flight at a claim is merged again (spark/tables.py). VACUUM deletes only
files older than the retention that no snapshot within it lists, whoever runs it; two at once
delete the same files, which is no harm.

`DeltaMaintainer` does it with delta-rs in this process, with no JVM, for tables on this disk
whichever path lands them; `SparkMaintainer` with delta-spark, for remote tables only. A pass
is safe to kill at any point: each step is a Delta commit or a deletion of files no snapshot
within the retention lists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from spark.location import Location, delta_location, spark_uri
from spark.progress import NO_PROGRESS, Progress
from spark.tables import DATE, MAINTAINED_BY, TABLES, is_delta_table, table_path

logger = logging.getLogger(__name__)

# One file per this many bytes of a closed date: Spark splits its reads at 128 MiB
# (spark.sql.files.maxPartitionBytes), Parquet's default row group is 128 MiB and so is an HDFS
# block, so a file of that size is one read task, one row group and one block.
TARGET_FILE_BYTES = 128 * 1024 * 1024
# The open date's files: small enough that a pass every few minutes rewrites little.
OPEN_FILE_BYTES = 16 * 1024 * 1024
DEFAULT_VACUUM_RETENTION_HOURS = 1

# Crash points (actors/crashpoints.py names them; this module only calls `checkpoint` and
# `soon`: the latter arms a kill a moment after an operation starts, to land inside it).
INSIDE_OPTIMIZE = "maintenance_inside_optimize"
INSIDE_VACUUM = "maintenance_inside_vacuum"
AFTER_OPTIMIZE_BEFORE_VACUUM = "maintenance_after_optimize_before_vacuum"
# A group member's claim is committed, its OPTIMIZE not begun (a test runs another member's
# pass here, to make two OPTIMIZEs overlap).
CLAIMED_BEFORE_OPTIMIZE = "maintenance_claimed_before_optimize"


def utc_date(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d")


@dataclass(frozen=True, slots=True)
class TableMaintained:
    table: str
    files_removed: int = 0  # small files a compaction replaced
    files_added: int = 0
    files_vacuumed: int = 0
    version: int | None = None  # the table's version after the pass
    # OPTIMIZEs that lost to another group member's commit (skipped until the next pass).
    optimizes_lost: int = 0


@dataclass(frozen=True, slots=True)
class PassResult:
    tables: tuple[TableMaintained, ...] = field(default_factory=tuple)
    seconds: float = 0.0

    @property
    def files_compacted(self) -> int:
        return sum(t.files_removed for t in self.tables)

    @property
    def files_vacuumed(self) -> int:
        return sum(t.files_vacuumed for t in self.tables)

    @property
    def optimizes_lost(self) -> int:
        return sum(t.optimizes_lost for t in self.tables)

    def summary(self) -> str:
        if not self.tables:
            return "no table yet"
        parts = [
            f"{t.table}: {t.files_removed} file(s) into {t.files_added}, "
            f"{t.files_vacuumed} vacuumed, version {t.version}"
            + (
                f", {t.optimizes_lost} OPTIMIZE(s) lost to another member"
                if t.optimizes_lost
                else ""
            )
            for t in self.tables
        ]
        return f"{'; '.join(parts)} ({self.seconds:.2f} s)"


def _no_crash(name: str) -> None:
    return None


def _no_timer(name: str):
    return None


class DeltaMaintainer:
    """One maintenance pass over the tables on this disk or an object store, with delta-rs (no
    JVM)."""

    def __init__(
        self,
        tables_dir: Path | str,
        *,
        target_file_bytes: int = TARGET_FILE_BYTES,
        open_file_bytes: int = OPEN_FILE_BYTES,
        vacuum_retention_hours: int = DEFAULT_VACUUM_RETENTION_HOURS,
        checkpoint: Callable[[str], None] = _no_crash,
        soon: Callable[[str], object] = _no_timer,
        tables: Iterable[str] = TABLES,
        properties: Mapping[str, str] | None = None,
        claim: str | None = None,
    ) -> None:
        root = delta_location(tables_dir)
        if root is None:
            raise ValueError(
                f"{tables_dir} is on a file system only Spark reaches: use SparkMaintainer"
            )
        # A group member's name (or, on an object store, the gateway's application id): each
        # OPTIMIZE is claimed first (see the module). None: the tables have one writer, this
        # process, under the writer lock.
        self._claim = claim
        self._tables_dir = root
        self._target = target_file_bytes
        self._open_target = min(open_file_bytes, target_file_bytes)
        self._retention = vacuum_retention_hours
        self._checkpoint = checkpoint
        self._soon = soon
        self._tables = tuple(tables)
        # The table properties the settings give (spark.tables.table_properties): a table made
        # under other settings is brought in line first, so that its checkpoints drop a removed
        # file's record when VACUUM deletes the file, and not a day later.
        self._properties = dict(properties or {})

    def run(self, now: float, progress: Progress = NO_PROGRESS) -> PassResult:
        """Compact, vacuum and checkpoint every table that exists; `now` is wall time (the
        injected clock's), which says which date is still open. `progress` counts tables, and
        the files each OPTIMIZE replaced (`files`) and each VACUUM deleted (`vacuumed`)."""
        started = time.perf_counter()
        today = utc_date(now)
        present = [
            (name, path)
            for name in self._tables
            if is_delta_table(path := table_path(self._tables_dir, name))
        ]
        progress.expect(len(present))
        done = []
        for name, path in present:
            done.append(self._maintain(name, path, today, progress))
            progress.advance(1)
        return PassResult(tuple(done), time.perf_counter() - started)

    def _maintain(self, name: str, path: str, today: str, progress: Progress) -> TableMaintained:
        from deltalake import DeltaTable
        from deltalake.exceptions import CommitFailedError

        table = DeltaTable(path)
        try:
            _align_properties(table, self._properties)
        except CommitFailedError:
            if self._claim is None:
                raise
            # Another member's commit came first (perhaps its own alignment): the next pass.
            table.update_incremental()
        removed = added = lost = 0
        timer = self._soon(INSIDE_OPTIMIZE)
        try:
            for filters, target, dates in (
                ([(DATE, "<", today)], self._target, "closed dates"),
                ([(DATE, ">=", today)], self._open_target, "open date"),
            ):
                progress.advance(0, note=f"{name}: compacting the {dates}")
                metrics = self._optimize(table, filters, target)
                if metrics is None:
                    lost += 1
                    continue
                removed += int(metrics.get("numFilesRemoved", 0))
                added += int(metrics.get("numFilesAdded", 0))
                progress.advance(0, files=int(metrics.get("numFilesRemoved", 0)))
        finally:
            _cancel(timer)
        self._checkpoint(AFTER_OPTIMIZE_BEFORE_VACUUM)
        progress.advance(0, note=f"{name}: vacuuming")
        timer = self._soon(INSIDE_VACUUM)
        try:
            # full: files no commit lists (a write killed before its commit) go too, once as
            # old as the retention; enforce off: the retention is ours to set, below Delta's
            # 7-day default, for a small disk.
            vacuumed = table.vacuum(
                retention_hours=self._retention,
                dry_run=False,
                enforce_retention_duration=False,
                full=True,
            )
        finally:
            _cancel(timer)
        progress.advance(0, vacuumed=len(vacuumed), note=f"{name}: checkpointing the log")
        table.update_incremental()
        table.create_checkpoint()
        table.cleanup_metadata()
        return TableMaintained(name, removed, added, len(vacuumed), table.version(), lost)

    def _optimize(self, table, filters, target: int) -> dict | None:
        """One OPTIMIZE; in a group, claimed first and None when another member's commit came
        between the claim and this commit (nothing of it is committed)."""
        from deltalake.exceptions import CommitFailedError

        if self._claim is None:
            return table.optimize.compact(partition_filters=filters, target_size=target)
        try:
            table.update_incremental()
            table.alter.set_table_properties(
                {MAINTAINED_BY: self._claim}, raise_if_not_exists=False
            )
            self._checkpoint(CLAIMED_BEFORE_OPTIMIZE)
            # `table` still stands at its claim's version: the compaction reads that snapshot.
            return table.optimize.compact(partition_filters=filters, target_size=target)
        except CommitFailedError as error:
            first = (str(error).splitlines() or ["a concurrent commit"])[0]
            logger.info(
                "Delta table %s: OPTIMIZE skipped, another member's commit came first (%s); "
                "the next pass compacts what is left",
                table.table_uri,
                first,
            )
            table.update_incremental()
            return None


class SparkMaintainer:
    """The same pass with delta-spark, for tables Spark reaches (a cluster, HDFS, S3)."""

    def __init__(
        self,
        session,
        tables_dir: Location,
        *,
        vacuum_retention_hours: int = DEFAULT_VACUUM_RETENTION_HOURS,
        tables: Iterable[str] = TABLES,
    ) -> None:
        self._session = session
        self._tables_dir = spark_uri(tables_dir)
        self._retention = vacuum_retention_hours
        self._tables = tuple(tables)

    def run(self, now: float, progress: Progress = NO_PROGRESS) -> PassResult:
        """As DeltaMaintainer.run; `progress` counts the tables looked at (a remote table's
        existence is Spark's to tell, table by table) and the files compacted (`files`)."""
        from delta.tables import DeltaTable

        started = time.perf_counter()
        # Ours to set, as in DeltaMaintainer: Spark refuses a retention below 7 days otherwise.
        self._session.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        progress.expect(len(self._tables))
        done = []
        for name in self._tables:
            path = table_path(self._tables_dir, name)
            if not DeltaTable.isDeltaTable(self._session, path):
                progress.advance(1)
                continue
            table = DeltaTable.forPath(self._session, path)
            progress.advance(0, note=f"{name}: compacting")
            metrics = table.optimize().executeCompaction().collect()[0]["metrics"]
            progress.advance(0, files=int(metrics["numFilesRemoved"]), note=f"{name}: vacuuming")
            table.vacuum(float(self._retention))
            version = table.history(1).collect()[0]["version"]
            done.append(
                TableMaintained(
                    name, int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"]), 0, version
                )
            )
            progress.advance(1)
        return PassResult(tuple(done), time.perf_counter() - started)


def _align_properties(table, wanted: Mapping[str, str]) -> None:
    current = table.metadata().configuration
    changed = {key: value for key, value in wanted.items() if current.get(key) != value}
    if changed:
        table.alter.set_table_properties(changed)
        table.update_incremental()
        logger.info("Delta table %s: properties set: %s", table.table_uri, changed)


def _cancel(timer) -> None:
    if timer is not None:
        timer.cancel()
