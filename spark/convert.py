"""Conversion of the tables of the previous layout into Delta tables, in place, exactly once.

The previous fxgate wrote each table as plain hive-partitioned Parquet:
``{table}/date=D/batch_id=N/part-*.parquet``, the partition values only in the path. A landing
directory's rows are of landing batch N; a compacted date is one directory ``batch_id=C`` with C
at or above `COMPACTED_BASE`, whose files carry each row's landing batch in the ordinary column
`landing_batch_id`. Readers counted only the visible ``date=D/batch_id=N`` directories; every
hidden name (``.compacting-*``, ``.landing-*``, ``_temporary``...) was a leftover, never data.

`convert_tables` turns each such table into the Delta table at the same path (DESIGN §7.7): the
rows of every legacy directory are appended with delta-rs, as the new layout holds them (`date`
from the directory name, `batch_id` the row's landing batch, `landing_batch_id` gone), and only
when all of them are committed are the legacy directories removed.

Exactly once through the table's own log, as the daemon's batches are: legacy batches are
appended in increasing batch id, several directories per commit, each commit carrying the Delta
transaction identifier (`LEGACY_APP_ID`, the largest batch id of the commit). Before each commit
the batches at or below the table's last `LEGACY_APP_ID` version are skipped: they are in. A
SIGKILL anywhere leaves the table in one of three states, each of which a rerun finishes:
- files written and not committed (`CONVERT_AFTER_WRITE_BEFORE_COMMIT`): no snapshot lists them
  (VACUUM deletes them); the rerun writes the same batches again and commits them once;
- some commits made (`CONVERT_AFTER_COMMIT`): the rerun skips their batches and goes on;
- all committed, removal begun (`CONVERT_DURING_REMOVAL`): every legacy directory left is at or
  below the version, so the rerun converts nothing and removes the rest.

Partitions of the batches the ledger began and never committed (`open_batches`) are not
converted: the daemon replays those batches into Delta itself (under its own application id),
so their rows land once, from the replay. For the same reason the rows of an open batch inside a
compacted directory (`fxgate compact --include-open`) are left out of its conversion. They are
removed with the rest.

Only pyarrow and delta-rs run here: no JVM. A local tables directory only (the old layout on
HDFS or S3 is not converted here). A compacted date of millions of rows streams through in
record batches, so memory does not grow with the size of a legacy directory.

Until a table is converted, nothing but this module may write to it or VACUUM it: a full VACUUM
(spark/maintenance.py, or delta-spark's) deletes every visible file no commit lists, and the
legacy Parquet files are such files. `legacy_tables` tells which tables still need this.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark.location import Location, local_path
from spark.progress import NO_PROGRESS, Progress
from spark.tables import (
    BATCH_ID,
    DATE,
    PARTITION_COLUMNS,
    TablesNotReadable,
    add_new_columns,
    as_written,
    commit_files,
    delta_schema,
    table_properties,
)

logger = logging.getLogger(__name__)

# The Delta application id of the conversion's commits; its version is the largest legacy batch
# id committed so far. Distinct from every ledger's (`fxgate-ledger-...`), so a ledger replaying
# batch N is never skipped for a legacy batch N, nor the other way round.
LEGACY_APP_ID = "fxgate-legacy-layout"
# Legacy batch ids at or above this are compacted directories (the previous compaction's range).
COMPACTED_BASE = 10**15
# A compacted row's landing batch, in the previous layout's compacted files.
LANDING_BATCH_ID = "landing_batch_id"

# Crash points (the tests arm them; this module only calls `checkpoint`).
CONVERT_AFTER_WRITE_BEFORE_COMMIT = "convert_after_write_before_commit"
CONVERT_AFTER_COMMIT = "convert_after_commit"
CONVERT_DURING_REMOVAL = "convert_during_removal"

# Bounds of one commit: a day of 36,000 tiny batch directories is a few dozen commits, not
# 36,000 (each commit costs a log entry, and opening a table reads its log). A single batch id
# bigger than this (a compacted date) is still one commit: its version covers it whole.
CHUNK_ROWS = 500_000
CHUNK_DIRECTORIES = 1_000
# Rows buffered before a row group is written (tiny legacy batches would make tiny row groups).
_ROW_GROUP_ROWS = 128 * 1024
_READ_BATCH_ROWS = 64 * 1024

_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
_BATCH_DIR = re.compile(r"^batch_id=(\d+)$")
# What the previous writers, compaction and Spark left that no reader counted: staging and
# replaced directories, Spark's job leftovers and its success marker.
_LEFTOVER_PREFIXES = (
    ".compacting-",
    ".replaced-",
    ".landing-",
    ".overwritten-",
    ".spark-staging",
    "._SUCCESS",
)
_LEFTOVER_NAMES = frozenset({"_temporary", "_SUCCESS"})
# The previous compaction's lock and the readers' swap lock, in the tables directory.
LEGACY_LOCK_FILES = (".compaction.lock", ".swap.lock", ".swap.gate")


@dataclass(frozen=True)
class TableConversion:
    """What one call did to one table."""

    table: str
    rows: int  # rows appended to the Delta table
    batches: int  # legacy batch ids appended
    commits: int
    open_partitions: int  # directories of open batches left for the ledger's replay
    removed: int  # legacy directories and leftovers removed
    seconds: float

    @property
    def done(self) -> bool:
        return bool(self.commits or self.removed)


@dataclass
class ConversionResult:
    """What one `convert_tables` call did: per table that held anything of the previous
    layout, and the lock files it removed."""

    tables: dict[str, TableConversion] = field(default_factory=dict)
    lock_files_removed: int = 0
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        """Whether anything was converted or removed."""
        return bool(self.lock_files_removed) or any(t.done for t in self.tables.values())

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())

    @property
    def batches(self) -> int:
        return sum(t.batches for t in self.tables.values())

    @property
    def commits(self) -> int:
        return sum(t.commits for t in self.tables.values())

    def summary(self) -> str:
        if not self.done:
            return "no table of the previous layout"
        tables = [t for t in self.tables.values() if t.done]
        return (
            f"{len(tables)} table(s) of the previous layout converted to Delta: {self.rows} rows "
            f"of {self.batches} legacy batch(es) in {self.commits} commit(s); "
            f"{sum(t.open_partitions for t in tables)} open batch partition(s) left to the "
            f"ledger's replay; {sum(t.removed for t in tables) + self.lock_files_removed} "
            f"legacy entr(ies) removed; {self.seconds:.2f} s"
        )


@dataclass
class _Legacy:
    """What of the previous layout one table directory holds."""

    batches: dict[int, list[tuple[str, Path]]]  # batch id -> its (date, directory)s
    leftovers: list[Path]

    def __bool__(self) -> bool:
        return bool(self.batches or self.leftovers)


def convert_tables(
    tables_dir: Location,
    open_batches: Collection[int] = (),
    checkpoint: Callable[[str], None] = lambda name: None,
    *,
    chunk_rows: int = CHUNK_ROWS,
    chunk_directories: int = CHUNK_DIRECTORIES,
    properties: Mapping[str, str] | None = None,
    progress: Progress = NO_PROGRESS,
) -> ConversionResult:
    """Convert every table of the previous layout under `tables_dir` into a Delta table in
    place; see the module. Safe to kill at any point and run again; a run over tables that are
    Delta already reads no Parquet file and changes nothing.

    `open_batches`: the ledger's batches begun and not committed (their partitions are left to
    the replay). It must be the same set on a rerun, as it is while nothing commits a batch
    before the conversion ends. `properties`: the Delta table properties of a table this creates
    (default `spark.tables.table_properties()`). `progress` counts the legacy partitions
    (``date=D/batch_id=N`` directories) converted, open ones left out, and the rows appended.
    """
    if chunk_rows < 1 or chunk_directories < 1:
        raise ValueError("chunk bounds must be positive")
    local = local_path(tables_dir)
    if local is None:
        raise TablesNotReadable(
            f"{tables_dir} is not on this machine's disk: the previous layout is converted "
            "only on a local tables directory"
        )
    started = time.perf_counter()
    result = ConversionResult()
    opened = frozenset(int(b) for b in open_batches)
    configuration = dict(table_properties() if properties is None else properties)
    found = [
        (name, table_dir, legacy)
        for name, table_dir in sorted(_table_dirs(local).items())
        if (legacy := _find_legacy(table_dir))
    ]
    progress.expect(sum(_partitions(legacy, opened) for _, _, legacy in found))
    for name, table_dir, legacy in found:
        converted = _convert_table(
            name,
            table_dir,
            legacy,
            opened,
            checkpoint,
            (chunk_rows, chunk_directories),
            configuration,
            before_removal=lambda: _remove_lock_files(local, result),
            progress=progress,
        )
        result.tables[name] = converted
    result.seconds = time.perf_counter() - started
    if result.done:
        logger.info("Conversion of the previous layout: %s", result.summary())
    return result


def legacy_tables(tables_dir: Location) -> list[str]:
    """The tables under a local `tables_dir` that still hold anything of the previous layout
    (a conversion not run or not finished). Reads directory listings only."""
    local = local_path(tables_dir)
    if local is None:
        return []
    return sorted(name for name, path in _table_dirs(local).items() if _find_legacy(path))


def _partitions(legacy: _Legacy, opened: frozenset[int]) -> int:
    """The legacy partitions of a table a conversion appends (those of open batches it leaves)."""
    return sum(len(places) for batch_id, places in legacy.batches.items() if batch_id not in opened)


# -- one table ---------------------------------------------------------------------------------


def _convert_table(
    name: str,
    table_dir: Path,
    legacy: _Legacy,
    opened: frozenset[int],
    checkpoint: Callable[[str], None],
    bounds: tuple[int, int],
    configuration: dict[str, str],
    before_removal: Callable[[], None],
    progress: Progress = NO_PROGRESS,
) -> TableConversion:
    started = time.perf_counter()
    open_ids = sorted(opened & legacy.batches.keys())
    pending = sorted(b for b in legacy.batches if b not in opened)
    delta = _open_delta(table_dir)
    footers = _Footers()
    rows = batches = commits = 0
    # Batches a run killed before committed: in already, nothing to append.
    done = None if delta is None else delta.transaction_version(LEGACY_APP_ID)
    if done is not None:
        committed = pending[: bisect.bisect_right(pending, done)]
        progress.advance(sum(len(legacy.batches[b]) for b in committed))
    while pending:
        done = None if delta is None else delta.transaction_version(LEGACY_APP_ID)
        todo = pending if done is None else pending[bisect.bisect_right(pending, done) :]
        if not todo:
            break
        chunk = _take_chunk(legacy.batches, todo, bounds, footers)
        progress.advance(0, note=f"{name}: legacy batches {chunk[0]}-{chunk[-1]}")
        places = sorted(
            (date, batch_id, path) for batch_id in chunk for date, path in legacy.batches[batch_id]
        )
        delta, written = _commit_chunk(
            table_dir, delta, chunk, places, footers, opened, bounds[0], configuration, checkpoint
        )
        footers.forget(path for _, _, path in places)
        rows += written
        batches += len(chunk)
        commits += 1
        progress.advance(len(places), rows=written)
        checkpoint(CONVERT_AFTER_COMMIT)
    if commits:
        logger.info(
            "Table %s converted to Delta: %d rows of %d legacy batch(es) in %d commit(s), %.2f s",
            name,
            rows,
            batches,
            commits,
            time.perf_counter() - started,
        )
    if pending:
        # Removal starts only here, once the log says every legacy batch but the open ones is
        # in: so a rerun after a kill during removal finds every remaining non-open directory
        # at or below the version (skipped, removed), never one above it that was never
        # converted, and no directory is removed whose rows are not in a commit.
        delta.update_incremental()
        done = delta.transaction_version(LEGACY_APP_ID)
        if done is None or done < pending[-1]:
            raise RuntimeError(
                f"conversion of {table_dir}: legacy batch {pending[-1]} is not committed "
                f"(version {done}); nothing removed"
            )
    before_removal()
    progress.advance(0, note=f"{name}: removing the previous layout's directories")
    removed = _remove_legacy(table_dir, legacy, checkpoint)
    logger.info(
        "Table %s: the previous layout's directories removed (%d entries%s)",
        name,
        removed,
        f"; open batch(es) {_ranges(open_ids)} left to the ledger's replay" if open_ids else "",
    )
    return TableConversion(
        name,
        rows,
        batches,
        commits,
        sum(len(legacy.batches[b]) for b in open_ids),
        removed,
        time.perf_counter() - started,
    )


def _take_chunk(
    batches: Mapping[int, list[tuple[str, Path]]],
    todo: list[int],
    bounds: tuple[int, int],
    footers: _Footers,
) -> list[int]:
    """The first batch ids of `todo` that fit the bounds (at least one: a batch is never split,
    its version covers it whole). Rows are counted from the Parquet footers."""
    max_rows, max_dirs = bounds
    chunk: list[int] = []
    rows = dirs = 0
    for batch_id in todo:
        places = batches[batch_id]
        more = sum(footers.rows(path) for _, path in places)
        if chunk and (rows + more > max_rows or dirs + len(places) > max_dirs):
            break
        chunk.append(batch_id)
        rows += more
        dirs += len(places)
    return chunk


def _commit_chunk(
    table_dir: Path,
    delta,
    chunk: list[int],
    places: list[tuple[str, int, Path]],
    footers: _Footers,
    opened: frozenset[int],
    file_rows: int,
    configuration: dict[str, str],
    checkpoint: Callable[[str], None],
):
    """Append the rows of the legacy batches `chunk` (`places`: their (date, batch id,
    directory)s, sorted) in one commit; (the table, rows)."""
    from deltalake import DeltaTable

    columns = _unified_columns(footers.schemas(path for _, _, path in places))
    if delta is None:
        schema = pa.schema([*columns, pa.field(DATE, pa.string()), pa.field(BATCH_ID, pa.int64())])
        delta = DeltaTable.create(
            str(table_dir),
            schema=schema,
            partition_by=list(PARTITION_COLUMNS),
            mode="ignore",
            configuration=configuration,
        )
        logger.info("Delta table created: %s", table_dir)
    else:
        add_new_columns(delta, pa.schema([*columns, pa.field(BATCH_ID, pa.int64())]))
    target = pa.schema(
        [f for f in delta_schema(pa.schema(delta.schema())) if f.name not in PARTITION_COLUMNS]
    )
    adds, rows = _write_files(table_dir, places, footers, target, opened, file_rows)
    checkpoint(CONVERT_AFTER_WRITE_BEFORE_COMMIT)
    version = chunk[-1]
    commit_files(
        delta, adds, LEGACY_APP_ID, version, {"fxgate.legacyBatches": f"{chunk[0]}-{chunk[-1]}"}
    )
    delta.update_incremental()
    # Anything else would make the next round take these batches again (another writer on the
    # table, or a log that did not keep the transaction): stop before appending them twice.
    done = delta.transaction_version(LEGACY_APP_ID)
    if done != version:
        raise RuntimeError(
            f"conversion of {table_dir}: committed legacy batches up to {version}, but the log "
            f"says {done}"
        )
    return delta, rows


def _open_delta(table_dir: Path):
    from deltalake import DeltaTable

    if not (table_dir / "_delta_log").is_dir():
        return None
    delta = DeltaTable(str(table_dir))
    partitions = list(delta.metadata().partition_columns)
    if partitions != list(PARTITION_COLUMNS):
        raise ValueError(
            f"{table_dir} is a Delta table partitioned by {partitions}, not by "
            f"{list(PARTITION_COLUMNS)}: not converting the previous layout into it"
        )
    return delta


# -- rows --------------------------------------------------------------------------------------


def _unified_columns(file_schemas: Iterable[pa.Schema]) -> list[pa.Field]:
    """The columns the Delta table holds for these legacy files: each file's own columns as
    written to Delta (without the partition and landing batch columns), unified over the files
    (an older generation lacks some)."""
    schemas: list[pa.Schema] = []
    for schema in file_schemas:
        kept = [
            f
            for f in schema
            if f.name not in (DATE, BATCH_ID, LANDING_BATCH_ID) and not pa.types.is_null(f.type)
        ]
        written = delta_schema(pa.schema(kept))
        if written not in schemas:  # a thousand directories are a generation or two
            schemas.append(written)
    unified = pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])
    return list(unified)


def _conformed(
    batch: pa.RecordBatch, batch_id: int, target: pa.Schema, opened: frozenset[int]
) -> pa.Table:
    """A legacy record batch as the Delta table holds it: `batch_id` = the row's landing batch
    (`landing_batch_id` where a compacted file has it, else the directory's), rows of open
    batches left out, every column of `target` (absent ones null), types as written. A `date`
    or `batch_id` inside a file (none of fxgate's writers left one) yields to the directory's,
    as it did for the previous layout's readers."""
    table = pa.Table.from_batches([batch])
    names = table.schema.names
    landing = pa.repeat(pa.scalar(batch_id, pa.int64()), table.num_rows)
    if LANDING_BATCH_ID in names:
        landing = pc.coalesce(
            table.column(LANDING_BATCH_ID).cast(pa.int64()), pa.scalar(batch_id, pa.int64())
        )
    table = table.drop_columns([n for n in (DATE, BATCH_ID, LANDING_BATCH_ID) if n in names])
    table = table.append_column(pa.field(BATCH_ID, pa.int64()), landing)
    if opened:
        open_ids = pa.array(sorted(opened), pa.int64())
        table = table.filter(pc.invert(pc.is_in(table.column(BATCH_ID), value_set=open_ids)))
    table = as_written(table)
    unknown = [
        f.name for f in table.schema if f.name not in target.names and not pa.types.is_null(f.type)
    ]
    if unknown:
        raise ValueError(f"legacy column(s) {unknown} missing from the Delta schema")
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.schema.names
        else pa.nulls(table.num_rows, f.type)
        for f in target
    ]
    return pa.Table.from_arrays(columns, schema=target)


def _write_files(
    table_dir: Path,
    places: list[tuple[str, int, Path]],
    footers: _Footers,
    target: pa.Schema,
    opened: frozenset[int],
    file_rows: int,
) -> tuple[list, int]:
    """The rows of `places` ((date, batch id, directory), sorted by date) as Parquet files
    under ``date=D/`` (fresh names no snapshot lists, synced); their add actions and rows."""
    token = uuid.uuid4().hex
    adds: list = []
    rows = 0
    by_date: dict[str, list[tuple[int, Path]]] = {}
    for date, batch_id, path in places:
        by_date.setdefault(date, []).append((batch_id, path))
    for date, sources in by_date.items():
        out = _DateFiles(table_dir, date, token, target, file_rows)
        try:
            for batch_id, directory in sources:
                for batch in footers.read(directory):
                    piece = _conformed(batch, batch_id, target, opened)
                    rows += piece.num_rows
                    out.write(piece)
            adds.extend(out.close())
        except BaseException:
            out.abort()  # what it wrote is listed by no commit: VACUUM removes it
            raise
    return adds, rows


class _Footers:
    """The Parquet footers of legacy directories, each read once: for a chunk's row count, its
    schema and its read (a day of tiny batch directories is mostly footers)."""

    def __init__(self) -> None:
        self._found: dict[Path, list[tuple[Path, pq.FileMetaData]]] = {}

    def of(self, directory: Path) -> list[tuple[Path, pq.FileMetaData]]:
        found = self._found.get(directory)
        if found is None:
            found = [(path, pq.read_metadata(path)) for path in _data_files(directory, warn=True)]
            self._found[directory] = found
        return found

    def rows(self, directory: Path) -> int:
        return sum(metadata.num_rows for _, metadata in self.of(directory))

    def schemas(self, directories: Iterable[Path]) -> Iterator[pa.Schema]:
        for directory in directories:
            for _, metadata in self.of(directory):
                yield metadata.schema.to_arrow_schema()

    def read(self, directory: Path) -> Iterator[pa.RecordBatch]:
        for path, metadata in self.of(directory):
            parquet = pq.ParquetFile(path, metadata=metadata)
            try:
                yield from parquet.iter_batches(batch_size=_READ_BATCH_ROWS)
            finally:
                parquet.close()

    def forget(self, directories: Iterable[Path]) -> None:
        for directory in directories:
            self._found.pop(directory, None)


class _DateFiles:
    """The Parquet files of one date of one commit: row groups of about `_ROW_GROUP_ROWS`, a
    new file past `file_rows`; one file open at a time."""

    def __init__(
        self, table_dir: Path, date: str, token: str, schema: pa.Schema, file_rows: int
    ) -> None:
        self._table_dir = table_dir
        self._date = date
        self._token = token
        self._schema = schema
        self._file_rows = file_rows
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self._file = None
        self._writer: pq.ParquetWriter | None = None
        self._relative = ""
        self._in_file = 0
        self._count = 0
        self._adds: list = []

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self._buffer.append(table)
        self._buffered += table.num_rows
        if self._buffered >= _ROW_GROUP_ROWS:
            self._flush()

    def close(self) -> list:
        self._flush()
        self._finish_file()
        if self._adds:
            _fsync_path(self._table_dir / f"{DATE}={self._date}")
        return self._adds

    def abort(self) -> None:
        if self._file is not None:
            try:
                self._writer.close()
            finally:
                self._file.close()
                self._writer = self._file = None

    def _flush(self) -> None:
        if not self._buffer:
            return
        rows = pa.concat_tables(self._buffer)
        self._buffer, self._buffered = [], 0
        if self._writer is None:
            self._start_file()
        self._writer.write_table(rows, row_group_size=max(rows.num_rows, 1))
        self._in_file += rows.num_rows
        if self._in_file >= self._file_rows:
            self._finish_file()

    def _start_file(self) -> None:
        self._relative = (
            f"{DATE}={self._date}/part-{self._count:05d}-{self._token}.c000.snappy.parquet"
        )
        self._count += 1
        full = self._table_dir / self._relative
        if not full.parent.exists():
            full.parent.mkdir(parents=True, exist_ok=True)
            _fsync_path(self._table_dir)
        self._file = open(full, "wb")  # noqa: SIM115 (closed in _finish_file)
        self._writer = pq.ParquetWriter(self._file, self._schema, compression="snappy")
        self._in_file = 0

    def _finish_file(self) -> None:
        from deltalake.transaction import AddAction

        if self._writer is None:
            return
        self._writer.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._writer = self._file = None
        stat = (self._table_dir / self._relative).stat()
        self._adds.append(
            AddAction(
                self._relative,
                stat.st_size,
                {DATE: self._date},
                int(stat.st_mtime * 1000),
                True,
                json.dumps({"numRecords": self._in_file}),
            )
        )


# -- what is where -----------------------------------------------------------------------------


def _table_dirs(tables_dir: Path) -> dict[str, Path]:
    try:
        entries = list(os.scandir(tables_dir))
    except FileNotFoundError:
        return {}
    return {e.name: Path(e.path) for e in entries if _TABLE_NAME.match(e.name) and e.is_dir()}


def _find_legacy(table_dir: Path) -> _Legacy:
    """The visible ``date=D/batch_id=N`` directories of `table_dir` and the leftovers of the
    previous writers beside them (at the table's top level and in its date directories)."""
    legacy = _Legacy({}, [])
    for entry in os.scandir(table_dir):
        if _is_leftover(entry.name):
            legacy.leftovers.append(Path(entry.path))
            continue
        match = _DATE_DIR.match(entry.name)
        if match is None or not entry.is_dir():
            continue
        for inner in os.scandir(entry.path):
            if _is_leftover(inner.name):
                legacy.leftovers.append(Path(inner.path))
                continue
            batch = _BATCH_DIR.match(inner.name)
            if batch is not None and inner.is_dir():
                places = legacy.batches.setdefault(int(batch.group(1)), [])
                places.append((match.group(1), Path(inner.path)))
    return legacy


def _is_leftover(name: str) -> bool:
    return name in _LEFTOVER_NAMES or name.startswith(_LEFTOVER_PREFIXES)


def _data_files(directory: Path, warn: bool = False) -> list[Path]:
    """The Parquet files a reader of the previous layout counted in a batch directory."""
    files, ignored = [], []
    for path in sorted(directory.iterdir()):
        if path.name.startswith((".", "_")) or not path.is_file():
            continue
        (files if path.suffix == ".parquet" else ignored).append(path)
    if ignored and warn:
        logger.warning("Not Parquet, not converted: %s", ", ".join(map(str, ignored)))
    return files


# -- removal -----------------------------------------------------------------------------------


def _remove_legacy(table_dir: Path, legacy: _Legacy, checkpoint: Callable[[str], None]) -> int:
    """Remove the leftovers, then the legacy directories (a date directory left empty too).

    Leftovers go first: while any legacy directory is left a rerun comes back here, so a table
    with none left has no leftover either."""
    removed = 0
    for path in sorted(legacy.leftovers):
        removed += _remove(path)
    dates: set[Path] = set()
    for batch_id in sorted(legacy.batches):
        for _, path in legacy.batches[batch_id]:
            removed += _remove(path)
            if not dates:
                checkpoint(CONVERT_DURING_REMOVAL)
            dates.add(path.parent)
    for date_dir in sorted(dates):
        try:
            date_dir.rmdir()  # only when empty: Delta's files of that date stay
        except OSError:
            pass
    _fsync_path(table_dir)
    return removed


def _remove_lock_files(tables_dir: Path, result: ConversionResult) -> None:
    """The previous layout's lock files go before its first directory: a kill after that leaves
    legacy directories, so the rerun comes back here."""
    for name in LEGACY_LOCK_FILES:
        try:
            (tables_dir / name).unlink()
        except FileNotFoundError:
            continue
        result.lock_files_removed += 1


def _remove(path: Path) -> int:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        return 0
    return 1


def _fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _ranges(ids: list[int]) -> str:
    runs: list[list[int]] = []
    for value in ids:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
