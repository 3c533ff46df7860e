"""`fxgate audit`: every `eventNum` that never reached the `reads` table, per reader and range.

Loss before the gateway leaves no trace in it — a broker that dropped past `max_queued_messages`
(mosquitto says so once, in its log, and the publisher still saw success), a QoS 0 hop, a reader
that buffered past its retention (DESIGN §3.8). What does leave a trace is the reader's own event
counter: every FX9600 tag data event carries `eventNum`, one up per event, so a number absent
between two present ones is a read that was made and never landed.

The rules are spark/gaps.py's (DESIGN §7.9); here they run over whole tables, in Spark:

- **Order** per reader and gateway: the ledger `seq` (arrival order at that gateway), then
  `event_num`; rows of partitions written before `seq` existed (null there) come first, by
  `received_time`. A gateway is a tables directory, or, in a shared group's one table (DESIGN
  §7.12), a member (`landed_by`): each member's `seq` is its own ledger's.
- **Epochs**: each number is compared with the one before it in that order; a drop of more than
  half starts a new epoch (a counter reset), and gaps are sought within an epoch only. Over
  several gateways (the members of a shared group land their shares into one table; several
  directories are several gateways too) each finds the resets in its own exact order, and the
  gateways' epochs are put on one count by when each first saw the reader
  (`spark.gaps.epoch_offsets`); the numbers of an epoch are then the union of every gateway's.
  Interleaving the gateways' reads by `received_time` instead, and applying the rule to that, was
  tried and made false resets: two gateways of one group on one machine took reads 1..100 of a
  reader published flat out, and one stamped 48 60 ms after the other had stamped 98 (its own
  latency, not the reader's order): 98 then 48 is a drop of more than half, and the audit reported
  a reset and 33 false gaps. A clock only orders reads as well as its gateway's latency allows,
  which is poorly for a counter that is still small (after every reader reboot).
- **Missing**: within an epoch, the numbers between two present ones that are absent, as
  inclusive ranges, one per run.
- **Duplicates**: a number present more than once in an epoch, with the same content (epc,
  antenna, event_time, peak_rssi, channel, phase) — a re-sent read — or a **conflict** when the
  contents differ (two different reads under one number: a reset the rule did not see, or two
  readers publishing under one reader id).
- Rows without an eventNum are counted (`without_event_num`) and otherwise not audited.

A shared group's one table is the reader's whole stream (every member lands its share into it);
a table of one gateway of a group that lands apart would have the other gateways' shares as
gaps, so such tables are audited together (several directories). The work is a few Spark jobs
(one window sort per reader's rows); what comes back to Python is one row per reader and epoch
and one per gap, never the reads themselves.

**Management events** (DESIGN §7.9): a number is present when it is in `reads` or in
`reader_events` for that reader, so the numbered management events of each directory are
unioned in with the reads (their tag columns null): a heartbeat numbered on the reader's one
counter is then no gap. The rule assumes one counter for both kinds of event, which nothing here
shows of a real FX9600 (docs/pages/operating/reader-health.md).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark.gaps import epoch_offsets, range_size
from spark.location import Location, local_path, object_store, spark_uri
from spark.progress import NO_PROGRESS, Progress
from spark.tables import (
    LANDED_BY,
    READER_EVENTS,
    READS,
    is_delta_table,
    read_delta_frame,
    table_path,
)

log = logging.getLogger(__name__)

# The columns the audit needs; a table lacking one of REQUIRED is not a reads table.
REQUIRED = {"reader_id": "string", "event_num": "bigint", "received_time": "timestamp"}
# Absent from older partitions or tables: read as nulls of their type.
OPTIONAL = {
    "seq": "bigint",
    "epc": "string",
    "antenna": "int",
    "event_time": "timestamp",
    "peak_rssi": "double",
    "channel": "double",
    "phase": "double",
}
# What makes two rows under one event number the same read.
CONTENT = ("epc", "antenna", "event_time", "peak_rssi", "channel", "phase")

# How many missing ranges a text line shows per reader before "...".
SHOWN_RANGES = 5

# The gateway a row came from: its tables directory's index, and in a group's table the member
# that landed it (LANDED_BY), whose ledger `seq` orders it.
_DIR = "_dir"
_EPOCH = "_epoch"
_PREVIOUS = "_previous"
_RESET = "_reset"
_OFFSET = "_offset"
# Exact for any int64 event number: Spark runs in ANSI mode, where long arithmetic that
# overflows raises instead of wrapping.
_WIDE = "decimal(21,0)"


class AuditError(Exception):
    """The audit could not be made (exit status 2): no such directory, no reads table."""


@dataclass(frozen=True)
class EpochReport:
    """One run of a reader's counter between two resets."""

    epoch: int
    first_event_num: int
    last_event_num: int
    received: int  # rows
    distinct: int  # distinct event numbers
    missing: tuple[tuple[int, int], ...]
    duplicates: int
    conflicts: int
    started: datetime  # received_time of the epoch's earliest row

    @property
    def missing_count(self) -> int:
        return sum(range_size(first, last) for first, last in self.missing)

    def to_json(self) -> dict:
        return {
            "epoch": self.epoch,
            "first_event_num": self.first_event_num,
            "last_event_num": self.last_event_num,
            "received": self.received,
            "distinct": self.distinct,
            "missing": [[first, last] for first, last in self.missing],
            "missing_count": self.missing_count,
            "duplicates": self.duplicates,
            "conflicts": self.conflicts,
            "started": self.started.isoformat().replace("+00:00", "Z"),
        }


@dataclass(frozen=True)
class ReaderReport:
    reader_id: str
    received: int  # rows with an eventNum
    without_event_num: int
    epochs: tuple[EpochReport, ...] = ()

    @property
    def missing(self) -> tuple[tuple[int, int], ...]:
        return tuple(r for epoch in self.epochs for r in epoch.missing)

    @property
    def missing_count(self) -> int:
        return sum(epoch.missing_count for epoch in self.epochs)

    @property
    def resets(self) -> int:
        return max(len(self.epochs) - 1, 0)

    @property
    def duplicates(self) -> int:
        return sum(epoch.duplicates for epoch in self.epochs)

    @property
    def conflicts(self) -> int:
        return sum(epoch.conflicts for epoch in self.epochs)

    @property
    def first_event_num(self) -> int | None:
        """The lowest number of the first epoch (where the audited stream starts)."""
        return self.epochs[0].first_event_num if self.epochs else None

    @property
    def last_event_num(self) -> int | None:
        """The highest number of the last epoch (where the counter stands)."""
        return self.epochs[-1].last_event_num if self.epochs else None

    def to_json(self) -> dict:
        return {
            "received": self.received,
            "missing": [[first, last] for first, last in self.missing],
            "resets": self.resets,
            "missing_count": self.missing_count,
            "duplicates": self.duplicates,
            "conflicts": self.conflicts,
            "without_event_num": self.without_event_num,
            "first_event_num": self.first_event_num,
            "last_event_num": self.last_event_num,
            "epochs": [epoch.to_json() for epoch in self.epochs],
        }

    def line(self, shown: int = SHOWN_RANGES) -> str:
        missing = self.missing
        ranges = ", ".join(_range_text(r) for r in missing[:shown])
        if len(missing) > shown:
            ranges += f", ... ({len(missing) - shown} more)"
        numbers = (
            f"eventNum {self.first_event_num}..{self.last_event_num}"
            if self.epochs
            else "no eventNum"
        )
        return (
            f"{self.reader_id}: {self.received} received, {self.missing_count} missing"
            + (f" in {len(missing)} range(s) ({ranges})" if missing else "")
            + f", {self.resets} reset(s), {self.duplicates} duplicate(s), "
            f"{self.conflicts} conflict(s), {self.without_event_num} without eventNum; {numbers}"
        )


@dataclass(frozen=True)
class AuditReport:
    tables: tuple[str, ...]
    readers: dict[str, ReaderReport] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Nothing missing (duplicates and conflicts are reported, not counted as loss)."""
        return all(reader.missing_count == 0 for reader in self.readers.values())

    def to_json(self) -> dict:
        return {
            "readers": {name: self.readers[name].to_json() for name in sorted(self.readers)},
            "complete": self.complete,
            "tables": list(self.tables),
        }

    def lines(self, shown: int = SHOWN_RANGES) -> list[str]:
        out = [self.readers[name].line(shown) for name in sorted(self.readers)]
        readers = self.readers.values()
        missing = sum(r.missing_count for r in readers)
        ranges = sum(len(r.missing) for r in readers)
        verdict = "complete" if self.complete else "INCOMPLETE"
        out.append(
            f"{verdict}: {len(self.readers)} reader(s), {missing} eventNum missing in "
            f"{ranges} range(s), {sum(r.resets for r in readers)} reset(s), "
            f"{sum(r.duplicates for r in readers)} duplicate(s), "
            f"{sum(r.conflicts for r in readers)} conflict(s), "
            f"{sum(r.without_event_num for r in readers)} without eventNum "
            f"(tables: {', '.join(self.tables)})"
        )
        return out


def _range_text(missing: tuple[int, int]) -> str:
    first, last = missing
    return str(first) if first == last else f"{first}-{last}"


def check_tables_dir(tables_dir: Location) -> None:
    """Raise AuditError unless `tables_dir` is a readable directory holding a `reads` directory.

    Checked before any JVM starts, so a wrong path fails in a moment: a local directory, or an
    object store's (through delta-rs); on a cluster file system (hdfs://, s3a://) Spark says it
    when it reads.
    """
    if object_store(tables_dir) is not None:
        reads = table_path(str(tables_dir), READS)
        try:
            found = is_delta_table(reads)
        except OSError as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise AuditError(f"cannot reach {tables_dir}: {first}") from None
        if not found:
            raise AuditError(f"{tables_dir} holds no reads table: no Delta log at {reads}")
        return
    local = local_path(tables_dir)
    if local is None:
        return
    _check_directory(local, f"tables directory {local}")
    _check_directory(local / READS, f"{local} holds no reads table: {local / READS}")
    try:
        os.listdir(local / READS)
    except OSError as error:
        raise AuditError(f"cannot read {local / READS}: {error.strerror}") from None


def _check_directory(path, what: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise AuditError(f"{what} does not exist") from None
    except OSError as error:
        raise AuditError(f"cannot read {path}: {error.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise AuditError(f"{what} is not a directory")


def read_reads(session: SparkSession, tables_dir: Location) -> DataFrame | None:
    """The reads table of `tables_dir` with the audit's columns, or None when the table exists
    but holds no data yet; AuditError when there is no reads table there or it lacks a column
    the audit needs."""
    check_tables_dir(tables_dir)
    path = table_path(spark_uri(tables_dir), READS)
    df = _read_delta(session, path)
    if df is None:
        raise AuditError(f"no reads table at {path} (no Delta log there)")
    if not df.columns:  # the table exists, created before its first rows
        return None
    lacking = sorted(set(REQUIRED) - set(df.columns))
    if lacking:
        raise AuditError(f"{path} is not a reads table: no column {', '.join(lacking)}")
    return _audit_columns(df)


def _audit_columns(df: DataFrame) -> DataFrame:
    """The audit's columns of a reads or reader_events table: REQUIRED, OPTIONAL (null where
    the table lacks one), and `landed_by` where the table has it (a group's)."""
    columns = {name: F.col(name).cast(kind) for name, kind in REQUIRED.items()}
    for name, kind in OPTIONAL.items():
        columns[name] = (F.col(name) if name in df.columns else F.lit(None)).cast(kind)
    if LANDED_BY in df.columns:
        columns[LANDED_BY] = F.col(LANDED_BY).cast("string")
    return df.select(*(column.alias(name) for name, column in columns.items()))


def read_numbered_reader_events(session: SparkSession, tables_dir: Location) -> DataFrame | None:
    """The management events of `tables_dir` that carry an eventNum, with the audit's columns
    (the tag columns null), or None when there is no `reader_events` table (yet)."""
    path = table_path(spark_uri(tables_dir), READER_EVENTS)
    df = _read_delta(session, path)
    if df is None or "event_num" not in df.columns:
        return None
    return _audit_columns(df.where(F.col("event_num").isNotNull()))


def _read_delta(session: SparkSession, path: str) -> DataFrame | None:
    """The Delta table at `path` as one snapshot, or None when there is none (no log). Schema
    changes are additive (DESIGN §7.7): a column added later is in the table's schema, null in
    older rows. On an object store, delta-rs reads it (spark.tables.read_delta_frame)."""
    return read_delta_frame(session, path)


def audit_tables(
    session: SparkSession, tables_dirs: Sequence[Location], progress: Progress = NO_PROGRESS
) -> AuditReport:
    """Audit the union of the reads tables of `tables_dirs` (one gateway's, or every gateway's
    of one shared group), with their numbered management events. Raises AuditError when a
    directory holds no reads table.

    `progress` counts steps: each tables directory opened, then each Spark job of
    `audit_frame`; and the rows scanned (`rows`) and readers found (`readers`)."""
    if not tables_dirs:
        raise ValueError("no tables directory to audit")
    progress.expect(len(tables_dirs) + audit_steps(True))
    frames = []
    grouped = False  # a shared group's table: its rows come from several gateways
    for index, tables_dir in enumerate(tables_dirs):
        progress.advance(0, note=f"opening {tables_dir}")
        for df in (
            read_reads(session, tables_dir),
            read_numbered_reader_events(session, tables_dir),
        ):
            if df is None:
                continue
            grouped = grouped or LANDED_BY in df.columns
            gateway = (
                F.coalesce(F.col(LANDED_BY), F.lit("")) if LANDED_BY in df.columns else F.lit("")
            )
            frames.append(
                df.withColumn(_DIR, F.concat_ws("/", F.lit(str(index)), gateway)).drop(LANDED_BY)
            )
        progress.advance(1)
    several = len(tables_dirs) > 1 or grouped
    if not several:
        progress.expect(len(tables_dirs) + audit_steps(several))
    names = tuple(str(tables_dir) for tables_dir in tables_dirs)
    if not frames:
        progress.advance(audit_steps(several))
        return AuditReport(names)
    union = frames[0]
    for df in frames[1:]:
        union = union.unionByName(df)
    return audit_frame(union, names, several=several, progress=progress)


def audit_steps(several: bool) -> int:
    """The Spark jobs `audit_frame` runs, each a step of its progress: the rows per reader,
    the alignment of several directories' epochs, the epochs, the gaps."""
    return 4 if several else 3


def audit_frame(
    reads: DataFrame,
    tables: Sequence[str],
    several: bool = False,
    progress: Progress = NO_PROGRESS,
) -> AuditReport:
    """Audit `reads` (the REQUIRED and OPTIONAL columns; with `several`, also `_dir`, the index
    of the tables directory each row came from). `progress` advances by one step per Spark
    job (`audit_steps`), and counts the rows scanned and the readers."""
    started = time.perf_counter()
    reads = reads.withColumn("reader_id", F.coalesce(F.col("reader_id"), F.lit("")))
    if _DIR not in reads.columns:
        reads = reads.withColumn(_DIR, F.lit("0"))
    progress.advance(0, note="counting the rows of each reader")
    counts = {
        row["reader_id"]: (row["received"], row["without"])
        for row in reads.groupBy("reader_id")
        .agg(
            F.count("event_num").alias("received"),
            _count_where(F.col("event_num").isNull()).alias("without"),
        )
        .collect()
    }
    progress.advance(
        1,
        rows=sum(received + without for received, without in counts.values()),
        readers=len(counts),
        note="ordering each reader's rows and finding the counter resets",
    )

    # Resets are found in each gateway's own exact order; several gateways' epochs are then
    # aligned (spark.gaps.epoch_offsets). Interleaving gateways by their clocks instead made
    # false resets: see the module docstring.
    arrival = Window.partitionBy("reader_id", _DIR).orderBy(*_arrival_order())
    numbered = (
        reads.where(F.col("event_num").isNotNull())
        .withColumn(
            _RESET,
            F.when(_is_reset(F.lag("event_num").over(arrival), F.col("event_num")), 1).otherwise(0),
        )
        .withColumn(
            _EPOCH,
            F.sum(_RESET).over(arrival.rowsBetween(Window.unboundedPreceding, Window.currentRow)),
        )
    )
    cached: list[DataFrame] = []
    try:
        if several:
            numbered = numbered.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(numbered)
            numbered = _aligned(numbered)
            progress.advance(1, note="counting each epoch's numbers")
        per_number = (
            numbered.groupBy("reader_id", _EPOCH, "event_num")
            .agg(
                F.count(F.lit(1)).alias("rows"),
                F.count_distinct(F.struct(*CONTENT)).alias("variants"),
                F.min("received_time").alias("first_received"),
            )
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        cached.append(per_number)
        repeated = F.col("rows") > 1
        epoch_rows = (
            per_number.groupBy("reader_id", _EPOCH)
            .agg(
                F.min("event_num").alias("first"),
                F.max("event_num").alias("last"),
                F.sum("rows").alias("received"),
                F.count(F.lit(1)).alias("distinct"),
                _count_where(repeated & (F.col("variants") == 1)).alias("duplicates"),
                _count_where(repeated & (F.col("variants") > 1)).alias("conflicts"),
                F.unix_micros(F.min("first_received")).alias("started"),
            )
            .collect()
        )
        progress.advance(1, note="finding the gaps")
        ascending = Window.partitionBy("reader_id", _EPOCH).orderBy("event_num")
        gap_rows = (
            per_number.select(
                "reader_id",
                _EPOCH,
                "event_num",
                F.lag("event_num").over(ascending).alias(_PREVIOUS),
            )
            .where(F.col("event_num").cast(_WIDE) - F.col(_PREVIOUS).cast(_WIDE) > F.lit(1))
            .collect()
        )
        progress.advance(1)
    finally:
        for frame in cached:
            frame.unpersist()

    gaps: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for row in gap_rows:
        gaps.setdefault((row["reader_id"], row[_EPOCH]), []).append(
            (row[_PREVIOUS] + 1, row["event_num"] - 1)
        )
    epochs: dict[str, list[EpochReport]] = {}
    for row in epoch_rows:
        key = (row["reader_id"], row[_EPOCH])
        epochs.setdefault(row["reader_id"], []).append(
            EpochReport(
                epoch=row[_EPOCH],
                first_event_num=row["first"],
                last_event_num=row["last"],
                received=row["received"],
                distinct=row["distinct"],
                missing=tuple(sorted(gaps.get(key, ()))),
                duplicates=row["duplicates"],
                conflicts=row["conflicts"],
                started=datetime.fromtimestamp(row["started"] / 1_000_000, UTC),
            )
        )
    readers = {
        reader: ReaderReport(
            reader_id=reader,
            received=received,
            without_event_num=without,
            epochs=tuple(sorted(epochs.get(reader, ()), key=lambda e: e.epoch)),
        )
        for reader, (received, without) in counts.items()
    }
    report = AuditReport(tuple(tables), readers)
    log.info(
        "Audit of %s: %d reader(s), %d eventNum missing, %d reset(s), in %.1f s",
        ", ".join(tables),
        len(readers),
        sum(r.missing_count for r in readers.values()),
        sum(r.resets for r in readers.values()),
        time.perf_counter() - started,
    )
    return report


def _aligned(numbered: DataFrame) -> DataFrame:
    """`numbered` (rows of several tables directories, each with its own epoch count) with the
    epochs of every directory on one count: a gateway whose first read of a reader came after
    another gateway had seen that reader's counter reset starts at that epoch, not at 0."""
    by_dir = (
        numbered.groupBy("reader_id", _DIR)
        .agg(
            F.unix_micros(F.min("received_time")).alias("first"),
            F.collect_list(F.when(F.col(_RESET) == 1, F.unix_micros(F.col("received_time")))).alias(
                "resets"
            ),
        )
        .collect()
    )
    starts: dict[str, dict[int, int]] = {}
    observed: dict[str, dict[int, list[int]]] = {}
    for row in by_dir:
        starts.setdefault(row["reader_id"], {})[row[_DIR]] = row["first"]
        observed.setdefault(row["reader_id"], {})[row[_DIR]] = row["resets"]
    shifts = [
        (reader, directory, offset)
        for reader, first in starts.items()
        for directory, offset in epoch_offsets(first, observed[reader]).items()
        if offset
    ]
    if not shifts:
        return numbered
    offsets = numbered.sparkSession.createDataFrame(
        shifts, f"reader_id string, {_DIR} string, {_OFFSET} int"
    )
    return (
        numbered.join(F.broadcast(offsets), ["reader_id", _DIR], "left")
        .withColumn(_EPOCH, F.col(_EPOCH) + F.coalesce(F.col(_OFFSET), F.lit(0)))
        .drop(_OFFSET)
    )


def _arrival_order() -> list[Column]:
    """The order of one reader's reads within one tables directory: the ledger's arrival order.
    Partitions written before `seq` existed (null there) hold the older rows, in receive order."""
    return [
        F.col("seq").isNotNull().asc(),
        F.col("seq").asc(),
        F.col("received_time").asc_nulls_first(),
        F.col("event_num").asc(),
    ]


def _count_where(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0))


def _is_reset(previous: Column, new: Column) -> Column:
    """spark.gaps.is_reset as a Spark expression (`2 * new < previous`, computed wide)."""
    return previous.isNotNull() & (new.cast(_WIDE) * F.lit(2) < previous.cast(_WIDE))
