"""Compaction: the many `batch_id=N` partitions of a closed date become a few files, exactly once.

The writer lands one `date=D/batch_id=N` directory per table per batch, one every 2-3 s while reads
flow (about 36,000 a day per table), and a table of 5,000 of them took Spark 18-27 s to count and
filter against 0.38 s for the same rows in one file (DESIGN §4). A pass rewrites each closed date
of each table into one new directory, `date=D/batch_id=C`, where C comes from a range of its own
(`COMPACTED_BASE` and up; the ledger's batch ids count up from 1 and would take millions of years
to reach it), so the layout stays `date=/batch_id=` (DESIGN §7.7) and every tool that reads a
hive-partitioned Parquet dataset reads it with nothing from us, date pruning included.

Each row keeps where it landed: its pack in `pack_id` (already a column) and its batch in the
ordinary column `landing_batch_id` (added here: the partition `batch_id` of a compacted row is C).
Landing files have no such column, so for them the landing batch is the partition `batch_id`;
`coalesce(landing_batch_id, batch_id)` is the landing batch of any row. The files are rewritten
into the table's current schema (spark/schema.py): a column added since a date landed is there,
null (schema changes are additive, so nothing is ever dropped; a column the files hold and the
schema does not is kept too).

One date of one table, step by step (a SIGKILL may come between any two):
1. A Spark job writes the date's rows into `<table>/.compacting-date=D-batch_id=C/batch_id=C/`, a
   hidden name: Spark, pyarrow and DuckDB's `date=*/batch_id=*` glob never list it. The files are
   fsynced, their row count is checked against the sources' Parquet footers, and the marker
   `.compaction.json` (hidden too) goes beside them: the landing batch ids it absorbed, as ranges.
2. `renameat2(RENAME_EXCHANGE)` swaps the staged directory with `date=D` in one step: a reader
   sees either every old partition or the new one, never both and never neither.
3. What now sits under the staged name is the old date; it is renamed to
   `<table>/.replaced-date=D-batch_id=C-<epoch>` and kept for `grace_seconds`, then removed.
A killed pass leaves a `.compacting-*` directory: if `date=D/batch_id=C` exists the swap happened
and the leftover is the old date (retired as in 3), otherwise it is a half-made new one (removed).
The next pass starts with that, before anything else, so every reader sees each row once at every
moment, and after the next pass the disk holds no more than the grace period asks.

A date is only compacted whole: if one of its batch directories belongs to a batch that is not
committed yet (the caller says which: `exclude_batches`), the date waits for a later pass. A
replay of a batch whose date was compacted all the same (`fxgate compact --include-open` with a
ledger it could not read) asks `absorbed_dates` first and does not write those partitions again
(`without_absorbed`): what was absorbed was a whole partition (Spark's job commit renames each
partition directory as a whole), the same rows as the replay's.

The swap in 2. holds the tables' read lock exclusively (spark/readlock.py): a reader that listed
a date's batch directories before the swap and descends into them after it would find them gone,
and Spark, pyarrow and DuckDB all pass over a vanished directory without an error, so that date
would be silently missing from its answer. Readers holding the lock shared (`fxgate sql`, `audit`,
`report`, and any tool run under `flock -s`) never see that; when they hold it for longer than
`swap_wait_seconds` the date waits for the next pass. A reader without the lock that listed a
date's files before the swap and opens them after it sees files gone (Spark and pyarrow raise
FileNotFoundError, DuckDB "Cannot open file") and retries (DESIGN §7.7: Spark's own behaviour on a
changed table); one that already opened a file finishes reading it (POSIX keeps an unlinked
file's data while it is open; the grace period covers file systems that do not, and readers that
open lazily). The README's "Compaction" says what differs on HDFS and S3.

One process compacts at a time: `CompactionLock` (flock on `<tables_dir>/.compaction.lock`).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark.readlock import SWAP_WAIT_SECONDS, swapping
from spark.tables import (
    BATCH_ID,
    DATE,
    DEAD_LETTERS,
    EVENTS,
    LANDING_BATCH_ID,
    READER_EVENTS,
    READS,
    fsync_path,
)

logger = logging.getLogger(__name__)

# Batch ids at or above this are compacted directories; below it, landing batches.
COMPACTED_BASE = 10**15
MARKER = ".compaction.json"
STAGING_PREFIX = ".compacting-"
REPLACED_PREFIX = ".replaced-"
LOCK_FILE = ".compaction.lock"
# One file per this many bytes of input: Spark splits its reads at 128 MiB
# (spark.sql.files.maxPartitionBytes), Parquet's default row group is 128 MiB and so is an HDFS
# block, so a file of that size is one read task, one row group and one block; smaller files
# cost a task and a footer each, bigger ones are split anyway.
TARGET_FILE_BYTES = 128 * 1024 * 1024
DEFAULT_GRACE_SECONDS = 3600.0

_DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
_BATCH_DIR = re.compile(r"^batch_id=(\d+)$")
_STAGED = re.compile(r"^\.compacting-date=(\d{4}-\d{2}-\d{2})-batch_id=(\d+)$")
_REPLACED = re.compile(r"^\.replaced-date=(\d{4}-\d{2}-\d{2})-batch_id=(\d+)-(\d+)$")

# Crash points (actors/crashpoints.py names them; this module only calls `checkpoint`).
AFTER_WRITE_BEFORE_SWAP = "compaction_after_write_before_swap"
AFTER_SWAP_BEFORE_RETIRE = "compaction_after_swap_before_retire"


def current_schemas() -> dict[str, pa.Schema]:
    """The current schema of each table the writer lands (spark/schema.py owns them)."""
    from spark.schema import (
        DEAD_LETTERS_SCHEMA,
        EVENTS_SCHEMA,
        READER_EVENTS_SCHEMA,
        READS_SCHEMA,
    )

    return {
        READS: READS_SCHEMA,
        DEAD_LETTERS: DEAD_LETTERS_SCHEMA,
        EVENTS: EVENTS_SCHEMA,
        READER_EVENTS: READER_EVENTS_SCHEMA,
    }


# -- the swap ----------------------------------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2():
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux renameat2 RENAME_EXCHANGE); False where the
    kernel, the C library or the file system cannot (then `swap_in` falls back)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(error, os.strerror(error), str(a))


def swap_in(staged: Path, target: Path) -> None:
    """Make `staged` the content of `target`, leaving the old `target` under `staged`'s name."""
    if exchange(staged, target):
        return
    # No atomic exchange (not Linux, or a file system without it): two renames, and a reader
    # listing in the instant between them misses the date. Logged: it is not what the README
    # promises for a local Linux file system.
    logger.warning("no atomic directory exchange here: %s is absent for an instant", target)
    aside = staged.with_name(staged.name + ".old")
    os.rename(target, aside)
    os.rename(staged, target)
    os.rename(aside, staged)


# -- what is where -----------------------------------------------------------------------------


def batch_dirs(date_dir: Path) -> dict[int, Path]:
    """The visible `batch_id=N` directories of a date directory."""
    found = {}
    try:
        entries = list(os.scandir(date_dir))
    except FileNotFoundError:
        return {}
    for entry in entries:
        match = _BATCH_DIR.match(entry.name)
        if match and entry.is_dir():
            found[int(match.group(1))] = Path(entry.path)
    return found


def date_dirs(table_dir: Path) -> dict[str, Path]:
    found = {}
    try:
        entries = list(os.scandir(table_dir))
    except FileNotFoundError:
        return {}
    for entry in entries:
        match = _DATE_DIR.match(entry.name)
        if match and entry.is_dir():
            found[match.group(1)] = Path(entry.path)
    return found


def table_dirs(tables_dir: Path) -> dict[str, Path]:
    try:
        entries = list(os.scandir(tables_dir))
    except FileNotFoundError:
        return {}
    return {
        e.name: Path(e.path)
        for e in entries
        if e.is_dir() and not e.name.startswith((".", "_")) and "=" not in e.name
    }


def data_files(directory: Path) -> list[Path]:
    """The Parquet files a reader sees in a leaf directory (no `.`/`_` names)."""
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and p.suffix == ".parquet" and not p.name.startswith((".", "_"))
    )


def to_ranges(ids: Iterable[int]) -> list[list[int]]:
    """Sorted ids as [first, last] runs: a day's 36,000 batch ids are a few runs."""
    runs: list[list[int]] = []
    for value in sorted(set(ids)):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return runs


def in_ranges(value: int, ranges: Iterable[Iterable[int]]) -> bool:
    return any(first <= value <= last for first, last in ranges)


def read_marker(compacted_dir: Path) -> dict | None:
    try:
        return json.loads((compacted_dir / MARKER).read_text())
    except FileNotFoundError:
        return None


def absorbed_ids(date_dir: Path) -> dict[int, list[list[int]]]:
    """Each compacted directory of a date and the landing batch ids it absorbed (ranges)."""
    out = {}
    for batch_id, path in batch_dirs(date_dir).items():
        if batch_id >= COMPACTED_BASE:
            marker = read_marker(path)
            out[batch_id] = [] if marker is None else marker["absorbed"]
    return out


def absorbed_dates(tables_dir: Path, batch_id: int, tables: Iterable[str]) -> dict[str, set[str]]:
    """For each of `tables`, the dates whose compacted directory holds landing batch
    `batch_id`: a replay of that batch must not write those partitions again."""
    found: dict[str, set[str]] = {}
    for table in tables:
        for date, date_dir in date_dirs(Path(tables_dir) / table).items():
            if any(in_ranges(batch_id, r) for r in absorbed_ids(date_dir).values()):
                found.setdefault(table, set()).add(date)
    return found


def without_absorbed(
    tables_dir: Path, batch_id: int, tables: Mapping[str, pa.Table]
) -> tuple[dict[str, pa.Table], dict[str, set[str]]]:
    """`tables` less the rows of dates where batch `batch_id` was compacted already, and those
    dates per table. The rows dropped are the same rows (a replay is built from the same
    ledger records), already in the compacted files."""
    import pyarrow.compute as pc

    absorbed = absorbed_dates(tables_dir, batch_id, tables)
    out = dict(tables)
    for name, dates in absorbed.items():
        table = tables[name]
        keep = pc.invert(pc.is_in(table.column(DATE), pa.array(sorted(dates), pa.string())))
        out[name] = table.filter(keep)
    return out, absorbed


# -- the lock ----------------------------------------------------------------------------------


class CompactionBusy(RuntimeError):
    """Another process holds the tables directory's compaction lock."""

    def __init__(self, holder: dict) -> None:
        self.holder = holder
        who = holder.get("role", "a process")
        super().__init__(
            f"the tables directory is locked for compaction by {who} (pid {holder.get('pid')})"
        )


class CompactionLock:
    """`<tables_dir>/.compaction.lock`, held with flock: the kernel lets it go when its process
    dies (SIGKILL included), so a stale lock never blocks the next start. The file says who
    holds it (`role`: daemon or command, `pid`), for `fxgate compact` to tell which."""

    def __init__(self, tables_dir: Path, role: str) -> None:
        self.path = Path(tables_dir) / LOCK_FILE
        self.role = role
        self._fd: int | None = None

    def acquire(self, wait: bool = False) -> CompactionLock:
        """Take the lock; CompactionBusy when another process holds it, unless `wait`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise CompactionBusy(lock_holder(self.path.parent) or {}) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"role": self.role, "pid": os.getpid()}).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> CompactionLock:
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


# -- closed dates ------------------------------------------------------------------------------


def utc_date(epoch_seconds: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(epoch_seconds))


def closed_before(now: float, oldest_owed: float | None) -> str:
    """Dates before the returned one are closed (DESIGN §7.7): the clock has passed them and the
    ledger holds nothing older (`oldest_owed`: the receive time of the oldest row not yet in the
    table, None when there is none)."""
    today = utc_date(now)
    if oldest_owed is None:
        return today
    return min(today, utc_date(oldest_owed))


# -- a pass ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DateCompacted:
    table: str
    date: str
    batch_id: int
    partitions: int  # batch directories absorbed
    files_before: int
    files: int
    rows: int
    seconds: float


@dataclass
class PassResult:
    compacted: list[DateCompacted] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # table, date, why
    recovered: int = 0  # leftovers of a killed pass put right
    removed: int = 0  # replaced directories past their grace period
    seconds: float = 0.0

    def summary(self) -> str:
        partitions = sum(c.partitions for c in self.compacted)
        files = sum(c.files for c in self.compacted)
        before = sum(c.files_before for c in self.compacted)
        return (
            f"{len(self.compacted)} date(s) compacted: {partitions} partition(s) "
            f"({before} file(s)) -> {files} file(s), "
            f"{sum(c.rows for c in self.compacted)} rows, in {self.seconds:.2f} s; "
            f"{len(self.skipped)} date(s) left open, {self.recovered} interrupted step(s) "
            f"finished, {self.removed} replaced director(ies) removed"
        )


class Compactor:
    """Compacts the closed dates of every table under a local `tables_dir`.

    `wall` is the injected clock's wall time (names of replaced directories, the grace period);
    `checkpoint(name)` is called at each named crash point (the actors arm them). The caller
    holds the `CompactionLock`.
    """

    def __init__(
        self,
        session: SparkSession | Callable[[], SparkSession],
        tables_dir: Path,
        *,
        wall: Callable[[], float] = time.time,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        target_file_bytes: int = TARGET_FILE_BYTES,
        schemas: Mapping[str, pa.Schema] | None = None,
        checkpoint: Callable[[str], None] = lambda name: None,
        swap_wait_seconds: float = SWAP_WAIT_SECONDS,
    ) -> None:
        # A session, or what gives one when the first date is rewritten: a pass with nothing
        # to rewrite needs no Spark (the daemon starts its session only then).
        self._session: SparkSession | None = None if callable(session) else session
        self._session_source = session
        self._tables_dir = Path(tables_dir)
        self._wall = wall
        self._grace = grace_seconds
        self._target = target_file_bytes
        self._schemas = current_schemas() if schemas is None else dict(schemas)
        self._checkpoint = checkpoint
        self._swap_wait = swap_wait_seconds
        if self._session is not None:
            _write_micros(self._session)

    def _spark(self) -> SparkSession:
        if self._session is None:
            self._session = _write_micros(self._session_source())
        return self._session

    def run(
        self,
        closed_before: str | None,
        exclude_batches: Collection[int] = (),
        tables: Iterable[str] | None = None,
    ) -> PassResult:
        """One pass: finish what a killed pass left, compact every date before `closed_before`
        ('YYYY-MM-DD'; None: every date, the open one too), remove replaced directories past
        their grace period."""
        started = time.perf_counter()
        result = PassResult()
        found = table_dirs(self._tables_dir)
        names = sorted(found) if tables is None else [t for t in tables if t in found]
        for name in names:
            result.recovered += self.recover(found[name])
        excluded = set(exclude_batches)
        for name in names:
            for date, date_dir in sorted(date_dirs(found[name]).items()):
                if closed_before is not None and date >= closed_before:
                    continue
                why = self._compact_date(name, found[name], date, date_dir, excluded, result)
                if why:
                    result.skipped.append((name, date, why))
        for name in names:
            result.removed += self.remove_expired(found[name])
        result.seconds = time.perf_counter() - started
        return result

    # -- leftovers ------------------------------------------------------------------------

    def recover(self, table_dir: Path) -> int:
        """Finish or undo what a killed pass left in `table_dir`; how many it found."""
        count = 0
        for entry in sorted(os.listdir(table_dir)):
            match = _STAGED.match(entry)
            if match is None:
                continue
            count += 1
            staged, date, batch_id = table_dir / entry, match.group(1), int(match.group(2))
            if (table_dir / f"date={date}" / f"batch_id={batch_id}").is_dir():
                logger.info("compaction of %s/%s was swapped in: retiring the old", entry, date)
                self._retire(table_dir, staged, date, batch_id)
            else:
                logger.info("compaction of %s date %s was cut short: removing it", table_dir, date)
                shutil.rmtree(staged)
        return count

    def remove_expired(self, table_dir: Path) -> int:
        removed = 0
        now = self._wall()
        for entry in os.listdir(table_dir):
            match = _REPLACED.match(entry)
            if match and now - int(match.group(3)) >= self._grace:
                shutil.rmtree(table_dir / entry, ignore_errors=True)
                removed += 1
        return removed

    def _retire(self, table_dir: Path, staged: Path, date: str, batch_id: int) -> None:
        replaced = (
            table_dir / f"{REPLACED_PREFIX}date={date}-batch_id={batch_id}-{int(self._wall())}"
        )
        os.rename(staged, replaced)
        fsync_path(table_dir)

    # -- one date -------------------------------------------------------------------------

    def _compact_date(
        self,
        table: str,
        table_dir: Path,
        date: str,
        date_dir: Path,
        excluded: set[int],
        result: PassResult,
    ) -> str | None:
        """Compact one date; returns why it was left as it is (None: compacted or nothing to
        do)."""
        dirs = batch_dirs(date_dir)
        if not dirs:
            return None
        waiting = sorted(excluded & set(dirs))
        if waiting:
            return f"batch(es) {to_ranges(waiting)} not committed yet"
        schema = self._target_schema(table)
        if len(dirs) == 1:
            (only,) = dirs
            if only >= COMPACTED_BASE and self._current(dirs[only], schema):
                return None  # compacted already, in the current schema
        started = time.perf_counter()
        sources = {n: data_files(p) for n, p in dirs.items()}
        files_before = sum(len(f) for f in sources.values())
        rows = sum(pq.ParquetFile(f).metadata.num_rows for fs in sources.values() for f in fs)
        if rows == 0:
            return "no rows"
        absorbed = [n for n in dirs if n < COMPACTED_BASE]
        for n in dirs:
            if n >= COMPACTED_BASE:
                marker = read_marker(dirs[n]) or {"absorbed": []}
                for first, last in marker["absorbed"]:
                    absorbed.extend(range(first, last + 1))
        batch_id = max([COMPACTED_BASE, *dirs]) + 1
        staged = table_dir / f"{STAGING_PREFIX}date={date}-batch_id={batch_id}"
        if staged.exists():  # a leftover `recover` could not judge (should not happen)
            shutil.rmtree(staged)
        out_dir = staged / f"{BATCH_ID}={batch_id}"
        files = self._write(table_dir, {n: f for n, f in sources.items() if f}, schema, out_dir)
        written = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        if written != rows:
            shutil.rmtree(staged)
            raise RuntimeError(
                f"compaction of {table} {date} wrote {written} rows for {rows}: left as it was"
            )
        marker = {
            "table": table,
            "date": date,
            "batch_id": batch_id,
            "absorbed": to_ranges(absorbed),
            "replaced": sorted(dirs),
            "rows": rows,
            "files": [f.name for f in files],
            "columns": schema.names,
            "compacted_time": self._wall(),
        }
        tmp = out_dir / (MARKER + ".tmp")
        tmp.write_text(json.dumps(marker, indent=1))
        for f in [*files, tmp]:
            fsync_path(f)
        os.rename(tmp, out_dir / MARKER)
        fsync_path(out_dir)
        fsync_path(staged)
        self._checkpoint(AFTER_WRITE_BEFORE_SWAP)
        with swapping(self._tables_dir, self._swap_wait) as held:
            if held:
                swap_in(staged, date_dir)
                fsync_path(table_dir)
        if not held:
            shutil.rmtree(staged)
            return f"readers held the tables' read lock for {self._swap_wait:g} s"
        self._checkpoint(AFTER_SWAP_BEFORE_RETIRE)
        self._retire(table_dir, staged, date, batch_id)
        done = DateCompacted(
            table,
            date,
            batch_id,
            len(dirs),
            files_before,
            len(files),
            rows,
            time.perf_counter() - started,
        )
        result.compacted.append(done)
        logger.info(
            "compacted %s date=%s: %d partition(s), %d file(s) -> batch_id=%d, %d file(s), "
            "%d rows in %.2f s",
            table,
            date,
            done.partitions,
            files_before,
            batch_id,
            done.files,
            rows,
            done.seconds,
        )
        return None

    def _target_schema(self, table: str) -> pa.Schema:
        """The table's current columns without the partition columns, plus `landing_batch_id`;
        for a table spark/schema.py does not know, just `landing_batch_id` (the files' own
        columns are kept in any case)."""
        known = self._schemas.get(table)
        fields = [] if known is None else [f for f in known if f.name not in (DATE, BATCH_ID)]
        return pa.schema([*fields, pa.field(LANDING_BATCH_ID, pa.int64())])

    @staticmethod
    def _current(directory: Path, schema: pa.Schema) -> bool:
        files = data_files(directory)
        if not files:
            return True
        names = set(pq.read_schema(files[0]).names)
        return all(name in names for name in schema.names)

    def _write(
        self, table_dir: Path, sources: Mapping[int, list[Path]], schema: pa.Schema, out_dir: Path
    ) -> list[Path]:
        """Write the rows of `sources` (batch id -> its files) into `out_dir`, one Spark job per
        output file of about the target size, each over a run of consecutive batches.

        One job for a whole day ran the daemon's 512m JVM out of heap (36,000 partitions,
        925 MB: the range shuffle and sort of 14 million rows at once); a job per file reads its
        batches in one task and streams them out, so the memory a pass needs does not grow with
        the day. Rows keep their batch run per file, not a sort within it."""
        runs: list[list[int]] = [[]]
        run_bytes = 0
        for batch_id in sorted(sources):
            size = sum(f.stat().st_size for f in sources[batch_id])
            if runs[-1] and run_bytes + size > self._target:
                runs.append([])
                run_bytes = 0
            runs[-1].append(batch_id)
            run_bytes += size
        for run in runs:
            paths = [_uri(f.parent) for batch_id in run for f in sources[batch_id][:1]]
            self._write_run(table_dir, paths, schema, out_dir)
        return data_files(out_dir)

    def _write_run(
        self, table_dir: Path, paths: list[str], schema: pa.Schema, out_dir: Path
    ) -> None:
        from pyspark.sql.pandas.types import from_arrow_type

        df = (
            self._spark()
            .read.option("mergeSchema", "true")
            .option("basePath", _uri(table_dir))
            .parquet(*paths)
        )
        landing = F.col(BATCH_ID).cast("long")
        if LANDING_BATCH_ID in df.columns:
            landing = F.coalesce(F.col(LANDING_BATCH_ID), landing)
        df = df.withColumn(LANDING_BATCH_ID, landing)
        columns = []
        for f in schema:
            if f.name in df.columns:
                columns.append(F.col(f.name).cast(from_arrow_type(f.type)).alias(f.name))
            else:
                columns.append(F.lit(None).cast(from_arrow_type(f.type)).alias(f.name))
        extra = [c for c in df.columns if c not in schema.names and c not in (DATE, BATCH_ID)]
        df.select(*columns, *extra).coalesce(1).write.mode("append").parquet(_uri(out_dir))


def _write_micros(session: SparkSession) -> SparkSession:
    session.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    return session


def _uri(path: Path) -> str:
    # Not Path.as_uri(): it escapes '=' (date%3D...), and Hadoop takes the escape literally.
    return f"file://{Path(path).resolve()}"
