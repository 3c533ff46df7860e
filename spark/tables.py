"""Idempotent batch writes of the Parquet tables, and the two ways to read them back.

Two writers keep one contract (`write_batch`): `TableWriter` runs a Spark job per table, and
`ArrowTableWriter` writes the same files with pyarrow in this process and renames them into
place. The daemon uses the second with a local master and the tables on this disk (`[spark]
landing = "auto"`), the first otherwise; tests/spark/test_tables.py runs the contract against
both and reads one's files with the other's types.

Layout: ``{tables_dir}/{table}/date=YYYY-MM-DD/batch_id=N/part-*.parquet``, where `tables_dir` is a
local path or any Hadoop URI the cluster reaches (spark/location.py); Spark is always handed a
URI, and the pyarrow reader opens what it can (local paths, `file:` URIs). Every write is an
overwrite in *dynamic* partition mode, so writing batch N again replaces exactly the
``batch_id=N`` partitions it contains and leaves every other batch alone. That is what makes the
Spark leg exactly-once: the caller may replay a batch any number of times (after a crash, a
restart, a failed job) and the table still holds each row once. The mode is passed as an option
on every write, not only in the session conf, because a static overwrite of a partitioned path
deletes the whole table (DESIGN §4); a session whose conf someone changed must not do that.

What a killed write leaves behind (observed with pyspark 4.3, local[2], a 100k-row write
killed while its tasks were writing): tasks write under
``{table}/.spark-staging-<job uuid>/_temporary/0/_temporary/attempt_*/date=../batch_id=../
part-*.parquet``; only the job commit moves finished partition directories into place, one
rename per partition. SIGKILL of the Python process alone left nothing: the JVM sees EOF on
its stdin, exits through its shutdown hooks, and those abort the job and delete the staging
directory. SIGKILL of Python *and* the JVM (a process-group kill, the OOM killer, power loss)
left the whole ``.spark-staging-*`` tree with complete-looking Parquet files in it, and nothing
of the batch in the table proper. Both readers skip such leftovers: Spark's file index ignores
every path component starting with ``.`` or ``_``, and ``pyarrow.dataset`` ignores the same
prefixes (``ignore_prefixes`` default) -- tests/spark/test_tables.py checks both. A kill in the
middle of the commit can leave some partitions of the batch renamed and others not (a batch
that spans two dates is then half visible): replaying the batch heals that, as it heals a crash
between the tables of one batch. `clean_staging` removes leftovers to reclaim the disk space;
call it only while no write is running (at start-up).

Type round trip (Spark writes, `read_table_arrow` reads; both seen in tests/spark/test_tables.py):
string, int8, int16, int32, int64, float64 and binary come back as the same Arrow types;
``timestamp[us, tz=UTC]`` comes back as ``timestamp[us, tz=UTC]`` because the session writes
TIMESTAMP_MICROS (Spark's INT96 default would come back as naive nanoseconds). Tz-naive Arrow
timestamps are taken as UTC by Spark (the session time zone) and come back tz-aware. Through
Spark (`read_table(...).collect()`) timestamps arrive as naive UTC datetimes. The partition
columns come back as ``date: string`` and ``batch_id: int64`` from both readers, last in column
order.

Size of a batch (measured, local[2], 512m driver, 250-byte rows over two dates, warm JVM):
200 rows 0.25 s, 4k 0.29 s, 20k 0.35 s, 50k 0.5 s, 100k 0.84 s per `write_batch`, replays alike;
the first write after start takes 3-5 s more. The rows travel inside the Spark task, so 200k
such rows exhausted the 512m heap (the JVM then exits, see spark/session.py): keep a batch to
tens of thousands of rows or raise the driver memory (at 1g 200k rows took 1.5 s).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.location import Location, local_path, spark_uri

logger = logging.getLogger(__name__)

READS = "reads"
DEAD_LETTERS = "dead_letters"
EVENTS = "events"
READER_EVENTS = "reader_events"

DATE = "date"
BATCH_ID = "batch_id"
# A compacted row's landing batch (spark/compaction.py); null in landing files, where the
# partition `batch_id` is the landing batch.
LANDING_BATCH_ID = "landing_batch_id"
PARTITION_COLUMNS = (DATE, BATCH_ID)
PARTITION_SCHEMA = pa.schema([(DATE, pa.string()), (BATCH_ID, pa.int64())])
# Timestamps as the session writes them (TIMESTAMP_MICROS, UTC).
UTC_MICROS = pa.timestamp("us", tz="UTC")
# Hidden names of ArrowTableWriter's commit: a batch's files before the swap, and a replayed
# partition's old files during it. Both readers skip them; clean_staging removes them.
LANDING_PREFIX = ".landing-"
OVERWRITTEN_PREFIX = ".overwritten-"
# ArrowTableWriter's crash point: a table's files written and synced, none swapped in.
LANDED_NOT_SWAPPED = "landing_after_write_before_swap"
_LEFTOVER_PREFIXES = (".spark-staging", LANDING_PREFIX, OVERWRITTEN_PREFIX)

_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_DATE_VALUE = r"^\d{4}-\d{2}-\d{2}$"
# Spark says this when the path does not exist or holds no data file yet.
_NO_DATA_CONDITIONS = frozenset({"PATH_NOT_FOUND", "UNABLE_TO_INFER_SCHEMA"})


def table_path(tables_dir: Location, name: str) -> str:
    """Location of table `name`; `tables_dir` may be a local path or any Hadoop URI."""
    if not _TABLE_NAME.match(name):
        raise ValueError(f"invalid table name {name!r}")
    return f"{str(tables_dir).rstrip('/')}/{name}"


class TablesNotReadable(ValueError):
    """The tables are not on this machine's disk (`hdfs://`, `s3a://`...): only Spark reads
    them, and the readers that start no JVM (status, dead-letters list) cannot."""


class TableWriter:
    """Writes one batch of tables; a replayed batch id replaces what that id wrote before."""

    def __init__(self, session: SparkSession, tables_dir: Location) -> None:
        self._session = session
        self._tables_dir = spark_uri(tables_dir)
        # build_session sets this too; a session built elsewhere would write INT96 (Spark's
        # default), which the non-Spark readers see as naive nanoseconds.
        session.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")

    def cancel(self) -> None:
        """Cancel the running Spark job (from another thread): its write_batch raises."""
        self._session.sparkContext.cancelAllJobs()

    def write_batch(self, batch_id: int, tables: Mapping[str, pa.Table]) -> dict[str, int]:
        """Write every table of batch `batch_id`; return the rows written per table.

        Each table needs a string column `date` ('YYYY-MM-DD'); a `batch_id` column is added
        when missing (and must equal `batch_id` when present). Empty tables start no job and
        count 0. Tables are written one after the other, each in its own Spark job, so a crash
        can leave the batch written to some tables only: the caller heals that by replaying the
        whole batch. Everything is validated before the first write.
        """
        return _write_tables(self._tables_dir, batch_id, tables, self._write)

    def _write(self, path: str, table: pa.Table) -> None:
        (
            self._session.createDataFrame(table)
            .write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy(*PARTITION_COLUMNS)
            .parquet(path)
        )


class ArrowTableWriter:
    """Writes one batch of tables with pyarrow, in this process: the same layout, files and
    replay contract as `TableWriter`, without a Spark job.

    For a tables directory on this machine's disk with a local Spark master (the defaults):
    a Spark write turns the Arrow rows back into JVM rows on the driver, sorts them by
    partition and writes them, about 40,000 rows/s on the JVM's one busy core (bench
    `batched-*`); pyarrow writes the same rows as Parquet in C++, several times faster and
    mostly outside the interpreter lock. Spark still reads, compacts and reports on the tables.

    The commit mirrors Spark's dynamic overwrite. Each table's partitions of the batch are
    written under a hidden ``{table}/.landing-<id>/`` directory and synced; then each
    ``date=D/batch_id=N`` already there is renamed aside to a hidden
    ``.overwritten-<id>-date=D-batch_id=N`` and the new one renamed into place, and the aside
    one removed. Every hidden name is skipped by both readers (Spark's file index and
    `pyarrow.dataset` skip ``.`` and ``_`` paths) and removed by `clean_staging` at start. A
    kill between the two renames leaves the partition missing until the replay of the batch,
    which the ledger owes because the batch was not yet committed: the same window as a Spark
    job killed inside its commit.

    The files hold what Spark would have written from the same Arrow table (the same column
    types and nullability; timestamps as UTC microseconds, a tz-naive one taken as UTC as
    Spark takes it) and no partition columns; tests/spark/test_tables.py compares the two.
    """

    def __init__(
        self,
        session: object,
        tables_dir: Location,
        checkpoint: Callable[[str], None] = lambda name: None,
    ) -> None:
        local = local_path(tables_dir)
        if local is None:
            raise TablesNotReadable(
                f"{tables_dir} is not on this machine's disk: batches go through Spark there"
            )
        self._tables_dir = local
        # Called at LANDED_NOT_SWAPPED (the actors arm their crash point of that name there).
        self._checkpoint = checkpoint

    def cancel(self) -> None:
        """Nothing runs that another thread could cancel: a local write ends or raises."""

    def write_batch(self, batch_id: int, tables: Mapping[str, pa.Table]) -> dict[str, int]:
        """As `TableWriter.write_batch`: every table of batch `batch_id`, validated first,
        written one after the other; a replay replaces exactly the batch's partitions."""
        return _write_tables(
            str(self._tables_dir),
            batch_id,
            tables,
            lambda path, table: _land_partitions(Path(path), batch_id, table, self._checkpoint),
        )


def _write_tables(
    tables_dir: str,
    batch_id: int,
    tables: Mapping[str, pa.Table],
    write: Callable[[str, pa.Table], None],
) -> dict[str, int]:
    """Both writers' `write_batch`: validate every table first, then `write(path, table)` each
    table that has rows, one after the other; the rows per table."""
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
        raise ValueError(f"batch_id must be a non-negative int, got {batch_id!r}")
    prepared = {
        table_path(tables_dir, name): (name, _with_partition_columns(table, batch_id))
        for name, table in tables.items()
    }
    started = time.perf_counter()
    written: dict[str, int] = {}
    for path, (name, table) in prepared.items():
        written[name] = table.num_rows
        if table.num_rows:
            write(path, table)
    logger.info(
        "Batch %s written in %.2f s: %s",
        batch_id,
        time.perf_counter() - started,
        ", ".join(f"{name}={rows}" for name, rows in written.items()),
    )
    return written


def _land_partitions(
    table_dir: Path, batch_id: int, table: pa.Table, checkpoint: Callable[[str], None]
) -> None:
    """Write `table`'s rows of batch `batch_id`, one file per date, then swap them in."""
    token = uuid.uuid4().hex
    staging = table_dir / f"{LANDING_PREFIX}{batch_id}-{token}"
    data = _as_spark_writes(table.drop_columns(list(PARTITION_COLUMNS)))
    dates = table.column(DATE)
    try:
        staged: list[Path] = []
        for date in sorted(pc.unique(dates).to_pylist()):
            partition = Path(f"{DATE}={date}") / f"{BATCH_ID}={batch_id}"
            directory = staging / partition
            directory.mkdir(parents=True)
            rows = data.filter(pc.equal(dates, date))
            with open(directory / f"part-00000-{token}.snappy.parquet", "wb") as file:
                pq.write_table(rows, file, compression="snappy")
                file.flush()
                os.fsync(file.fileno())
            staged.append(partition)
        checkpoint(LANDED_NOT_SWAPPED)
        for partition in staged:
            _swap_in(table_dir, staging / partition, table_dir / partition, token)
    except Exception:
        # A failed write is retried as a whole: what it staged must not pile up meanwhile.
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging)


def _swap_in(table_dir: Path, staged: Path, target: Path, token: str) -> None:
    """Put the `staged` partition directory in place of `target` (there or not)."""
    date_dir = target.parent
    if not date_dir.exists():
        date_dir.mkdir(parents=True, exist_ok=True)
        fsync_path(table_dir)
    aside = table_dir / f"{OVERWRITTEN_PREFIX}{token}-{date_dir.name}-{target.name}"
    try:
        target.rename(aside)
    except FileNotFoundError:
        aside = None
    try:
        staged.rename(target)
    except OSError:
        if aside is not None:
            aside.rename(target)  # as it was: the batch's retry replaces it
        raise
    fsync_path(date_dir)
    if aside is not None:
        shutil.rmtree(aside)


def _as_spark_writes(table: pa.Table) -> pa.Table:
    """`table` with the column types a Spark write would have given it."""
    fields = []
    for field in table.schema:
        kind = field.type
        if pa.types.is_timestamp(kind):
            kind = UTC_MICROS
        elif pa.types.is_large_string(kind):
            kind = pa.string()
        elif pa.types.is_large_binary(kind):
            kind = pa.binary()
        fields.append(field.with_type(kind))
    schema = pa.schema(fields)
    # A nanosecond timestamp loses its last digits, as Spark's microseconds lose them.
    return table if schema == table.schema else table.cast(schema, safe=False)


def fsync_path(path: Path) -> None:
    """Sync a file's data, or a directory's entries, to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _with_partition_columns(table: pa.Table, batch_id: int) -> pa.Table:
    names = table.schema.names
    if DATE not in names:
        raise ValueError(f"table has no {DATE!r} column (columns: {names})")
    date = table.column(DATE)
    if not (pa.types.is_string(date.type) or pa.types.is_large_string(date.type)):
        raise ValueError(f"column {DATE!r} must be a 'YYYY-MM-DD' string, not {date.type}")
    if table.num_rows and (
        date.null_count or not pc.all(pc.match_substring_regex(date, _DATE_VALUE)).as_py()
    ):
        raise ValueError(f"column {DATE!r} holds a null or a value not shaped 'YYYY-MM-DD'")
    table = table.set_column(names.index(DATE), DATE, date.cast(pa.string()))

    if BATCH_ID not in names:
        return table.append_column(
            pa.field(BATCH_ID, pa.int64(), nullable=False),
            pa.repeat(pa.scalar(batch_id, pa.int64()), table.num_rows),
        )
    ids = table.column(BATCH_ID).cast(pa.int64())
    if table.num_rows and (ids.null_count or not pc.all(pc.equal(ids, batch_id)).as_py()):
        raise ValueError(f"column {BATCH_ID!r} holds values other than {batch_id}")
    return table.set_column(names.index(BATCH_ID), BATCH_ID, ids)


def clean_staging(tables_dir: Path) -> list[Path]:
    """Delete what killed write jobs left under `tables_dir`; return the removed paths.

    Removes `.spark-staging-*` and `_temporary` entries (Spark's) and `.landing-*` and
    `.overwritten-*` ones (ArrowTableWriter's) at any depth. Both readers already
    ignore them; this only reclaims space. Never call it while a write is running: those
    directories are then the running job's output.

    With a cluster master the dead driver's executors live on until their worker ends them, and
    one may still be writing its task's files while they are removed: what cannot be removed
    now is left (with a warning) for the next start.
    """
    removed: list[Path] = []
    for root, dirnames, filenames in os.walk(tables_dir):
        for name in list(dirnames) + filenames:
            if not (name.startswith(_LEFTOVER_PREFIXES) or name == "_temporary"):
                continue
            path = Path(root) / name
            try:
                if name in dirnames:
                    dirnames.remove(name)  # do not walk into what is being deleted
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except FileNotFoundError:
                pass  # its writer removed it first: gone all the same
            except OSError as error:
                logger.warning("Could not remove %s yet: %s", path, error)
                continue
            removed.append(path)
    if removed:
        logger.info("Removed %s leftovers of killed Spark jobs under %s", len(removed), tables_dir)
    return sorted(removed)


def read_table(
    session: SparkSession,
    tables_dir: Location,
    name: str,
    schema: pa.Schema | None = None,
) -> DataFrame:
    """Table `name` through Spark; `date` is a string and `batch_id` a long, as written.

    A table with no data yet is an empty DataFrame with `schema` (an Arrow schema holding the
    partition columns) or, without it, just the two partition columns.
    """
    try:
        # Schema changes are additive: a column added later is null in older files, not absent.
        df = session.read.option("mergeSchema", "true").parquet(
            table_path(spark_uri(tables_dir), name)
        )
    except AnalysisException as error:
        if error.getCondition() not in _NO_DATA_CONDITIONS:
            raise
        return session.createDataFrame(_empty_table(schema))
    # Spark infers partition value types: 'date=2024-05-01' would come back as a DateType.
    return df.withColumns(
        {DATE: F.col(DATE).cast("string"), BATCH_ID: F.col(BATCH_ID).cast("long")}
    )


def read_table_arrow(tables_dir: Location, name: str, schema: pa.Schema | None = None) -> pa.Table:
    """Table `name` read with plain pyarrow (hive partitioning), the way non-Spark readers do.

    Sees exactly what Spark's reader sees (both skip `.`/`_` paths). A table with no data yet
    is an empty table with `schema` or, without it, just the two partition columns. Tables
    that are not on the local disk raise `TablesNotReadable`.
    """
    local = local_path(tables_dir)
    if local is None:
        # Not pyarrow's own remote file systems: its hdfs:// loads a JVM into this process, and
        # s3a:// (Hadoop's S3 client, configured in Spark) is not one of them.
        raise TablesNotReadable(
            f"table {name} at {table_path(tables_dir, name)} is not on this machine's disk; "
            "only Spark reads it (`fxgate report`)"
        )
    filesystem, path = pafs.LocalFileSystem(), table_path(local, name)
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return _empty_table(schema)
    dataset = ds.dataset(
        path,
        filesystem=filesystem,
        format="parquet",
        partitioning=ds.partitioning(PARTITION_SCHEMA, flavor="hive"),
        # With a schema, a column added later reads as null from older files (pyarrow would
        # otherwise take the first file's columns and drop the newer ones).
        schema=None if schema is None else pa.unify_schemas([schema, PARTITION_SCHEMA]),
    )
    if not dataset.files:
        return _empty_table(schema)
    return dataset.to_table()


def _empty_table(schema: pa.Schema | None) -> pa.Table:
    return (schema if schema is not None else PARTITION_SCHEMA).empty_table()
