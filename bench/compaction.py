"""Compaction (DESIGN §7.7): a day of Delta commits, read before and after OPTIMIZE.

A day at the default 1 s batch window (`batch_max_seconds`), reads flowing, is about 54,000
batches per table: the benchmarks (docs/pages/benchmarks.md) measured about 53,000 a day at half
the ingest ceiling (a batch every 1.63 s) and about 62,000 at a trickle (each batch waits out
its 1 s window plus a turn of ~0.4 s); 86,400 only if every batch took exactly 1 s. Each batch
is one Delta commit that adds one Parquet file per date to each table it touches
(spark.tables.ArrowTableWriter), at about 400 rows each (DESIGN §4's 5,000 batches held 2
million rows).

How the day is built, honestly and fast. Committing 54,000 batches one by one is how a day
arrives, but not a way to build one here: each delta-rs append updates its snapshot, and that
grows with the live file count (DESIGN §7: 31-55 ms per append after 300-600 commits without
compaction; near 50,000 files a commit took 0.5-1 s here), so a day of single commits would take
hours. So the day's `DAY_BATCHES` batch files are written with pyarrow, one per batch as the
writer writes them (the `reads` columns of spark/schema.py cast with spark.tables.as_written, the
partition column `date` in the path, not synced), and committed in `COMMITS` commits of
`FILES_PER_COMMIT` add actions, each carrying a transaction id (application id, last batch id in
it) as the writer's commits do. The files are a day's; only the commits are chunked. That does
not flatter "before": a read pays for the live files (the day's 54,000 either way, each opened)
and for the log from the last checkpoint, and delta-rs writes a checkpoint every 10 commits
(`delta.checkpointInterval`), so a fresh open reads one checkpoint of most of the day's adds plus
a few JSON commits of `FILES_PER_COMMIT` adds each (slower to parse than the same adds in a
checkpoint), where the real day's table has a checkpoint plus at most 9 JSON commits of one add.
What the chunks leave out, before and after alike: the real day's `_delta_log` holds the JSON
commits of the last `log_retention_hours` (about 2,250 at the 1 h default), which every open
lists; `delta-month` (bench/delta_log.py) measures that.

Then, alternately, the run's rounds (3; 2 with `--quick`) of each reader:
- "before": a count and a filtered count (antenna 2, peak RSSI above -60 dBm) from a fresh open
  of the table, through Spark (`format("delta")`, the session of spark.session.build_session
  with the daemon's settings: local[2], 512m driver; delta-spark's snapshot cache cleared before
  each run, as a new `fxgate sql` process starts without it) and through delta-rs without a JVM
  (`DeltaTable(path).to_pyarrow_dataset()`, the counts by pyarrow). A day of small files is
  slow to read, so these runs stop once another would end past `BEFORE_BUDGET_SECONDS` (after
  one run each at least; the JSON has every run);
- the pass: `DeltaMaintainer.run` with the day closed (OPTIMIZE into 128 MiB files, VACUUM,
  checkpoint, log clean-up), as the daemon runs it, timed;
- "after": the same queries on the compacted table, alternating with "one file, Delta": the
  same rows written by delta-rs in one file of a Delta table, the reference the target
  is stated against (the engine's fixed cost of opening a Delta table, about 1 s of Spark's
  first job whatever the table holds, on both sides), and with "one file": the same rows in
  one plain Parquet file (`spark.read.parquet`, `pyarrow.dataset`), reported beside. "After"
  is the table as readers find it from an hour after the pass on, for as long as they query
  the day: a checkpoint without the replaced files' tombstones (their
  `delta.deletedFileRetentionDuration`, 1 h by default, is over; `expire_tombstones`). Reported
  beside, not in the target: "after, pass's hour", the same queries within that hour, whose
  checkpoint still lists the day's 54,000 replaced files as tombstones that every open reads,
  and through Spark "after cached", the same query on the snapshot it just built (what a
  session that keeps the table open pays).
Each run's time is split into the open (for Delta, the log as far as the engine reads it before
a job: delta-spark builds its list of files in the first job, the count), the count and the
filtered count. Target: after at most twice one file, Delta (medians), for each reader.
Where Spark cannot read Delta (no delta-spark on the session), only delta-rs is measured, and
the JSON says why. `--quick` scales the day down (`QUICK_SCALE` of its batches, the same rows
per batch and the same number of commits, so the log has the same shape); the JSON and the
table say the scale.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from bench.benchmarks import Benchmark, Context
from spark.schema import READS_SCHEMA
from spark.tables import (
    DATE,
    READS,
    UTC_MICROS,
    application_id,
    as_written,
    delta_schema,
    table_path,
    table_properties,
)

log = logging.getLogger(__name__)

DAY_BATCHES = 54_000
ROWS_PER_BATCH = 400
FILES_PER_COMMIT = 500
COMMITS = DAY_BATCHES // FILES_PER_COMMIT  # 108: a checkpoint every 10th, as the writer's
QUICK_SCALE = 1 / 40
# "before" is slow (a day of files, read twice per run): its runs stop once another would end
# past this many seconds of the phase (at least one run each), so a full run stays near 10 min.
BEFORE_BUDGET_SECONDS = {False: 300.0, True: 120.0}
# pyarrow encodes and writes outside the GIL: the day's files are written two at a time.
WRITERS = 2
TARGET_RATIO = 2.0
DAY = "2026-11-23"
DAY_START_US = 1_795_392_000_000_000  # 2026-11-23T00:00:00Z
APP_ID = application_id("bench-compaction")
# pq.write_table's default row group: "one file" is written as one pq.write_table of the day
# would write it, in groups of this many rows.
ONE_FILE_ROW_GROUP = 1 << 20
READERS = ("spark", "delta-rs")
# The same rows in one file of a Delta table, written by delta-rs: the reference the target is
# stated against (the engine's fixed cost of opening a Delta table is paid by both sides).
ONE_DELTA = "one file, Delta"
PHASES = ("before", "after", ONE_DELTA, "one file")
# Spark only, after each "after": the same query again, on the snapshot the run just built.
CACHED = "after cached"
# "After" within the hour of the pass: its checkpoint still lists the day's replaced files as
# tombstones (`delta.deletedFileRetentionDuration`, 1 h by default), which every open reads.
WITHIN_HOUR = "after, pass's hour"
SAMPLED = (*PHASES, CACHED, WITHIN_HOUR)

_TOPICS = pa.array([f"zebra/fx/fx9600-0{r}/reads" for r in range(1, 5)])
_READER_IDS = pa.array([f"fx9600-0{r}" for r in range(1, 5)])
_EPCS = pa.array([f"e28011606000020{t:09x}" for t in range(5_000)])


def reads_rows(
    seq: np.ndarray, batch_ids: np.ndarray, micros: np.ndarray, date: str, rng
) -> pa.Table:
    """Inventory reads with the writer's columns (spark/schema.py READS_SCHEMA) as the writer
    lands them (spark.tables.as_written): ledger seq `seq`, landing batch `batch_ids`, read at
    `micros` (UTC microseconds) on `date`. The FX9600 fields a plain read lacks stay null."""
    n = len(seq)
    tags = rng.integers(0, len(_EPCS), n)
    readers = rng.integers(0, len(_TOPICS), n)
    columns = {
        "message_id": pc.binary_join_element_wise("k", pa.array(seq).cast(pa.string()), ":0", ""),
        "topic": _TOPICS.take(readers),
        "reader_id": _READER_IDS.take(readers),
        "epc": _EPCS.take(tags),
        "antenna": pa.array(rng.integers(1, 5, n).astype(np.int32)),
        "peak_rssi": pa.array(rng.integers(-80, -35, n).astype(np.float64)),
        "channel": pa.array(rng.choice([902.75, 915.25, 927.25], n)),
        "phase": pa.array(rng.uniform(0, 180, n)),
        "event_num": pa.array(seq),
        "event_time": pa.array(micros, UTC_MICROS),
        "received_time": pa.array(micros + 150_000, UTC_MICROS),
        "qos": pa.array(np.ones(n, dtype=np.int8)),
        "pack_id": pa.array(seq // 200 + 1),
        "batch_id": pa.array(batch_ids),
        DATE: pa.repeat(pa.scalar(date), n),
        "seq": pa.array(seq),
    }
    arrays = [
        columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in READS_SCHEMA
    ]
    return as_written(pa.Table.from_arrays(arrays, schema=READS_SCHEMA))


class _OneFile:
    """The day's rows in one Parquet file, written chunk by chunk in the row groups one
    `pq.write_table` of the whole day would make."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = pq.ParquetWriter(path, schema, compression="snappy")
        self._pending: list[pa.Table] = []
        self._rows = 0

    def write(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._rows += table.num_rows
        while self._rows >= ONE_FILE_ROW_GROUP:
            rows = pa.concat_tables(self._pending)
            self._writer.write_table(
                rows.slice(0, ONE_FILE_ROW_GROUP), row_group_size=ONE_FILE_ROW_GROUP
            )
            rest = rows.slice(ONE_FILE_ROW_GROUP)
            self._pending, self._rows = [rest], rest.num_rows

    def close(self) -> None:
        if self._rows:
            self._writer.write_table(pa.concat_tables(self._pending))
        self._writer.close()


def land_day(
    table_dir: Path, one_delta: Path, one_file: Path, batches: int, files_per_commit: int
) -> dict:
    """The day's batch files and their chunked commits (see the module), the same rows in
    the plain Parquet `one_file` and in the one file of the Delta table `one_delta`; the
    seconds each part took."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.transaction import AddAction

    rng = np.random.default_rng(15)
    step = 86_400_000_000 // (batches * ROWS_PER_BATCH)
    schema = delta_schema(READS_SCHEMA)
    table = DeltaTable.create(
        str(table_dir),
        schema=schema,
        partition_by=[DATE],
        configuration=table_properties(),
    )
    (table_dir / f"{DATE}={DAY}").mkdir(parents=True, exist_ok=True)
    single = _OneFile(one_file, schema)
    writing = committing = 0.0
    commits = 0
    with ThreadPoolExecutor(WRITERS, thread_name_prefix="bench-day-writer") as pool:
        for first in range(0, batches, files_per_commit):
            count = min(files_per_commit, batches - first)
            started = time.perf_counter()
            seq = np.arange(
                first * ROWS_PER_BATCH + 1, (first + count) * ROWS_PER_BATCH + 1, dtype=np.int64
            )
            rows = reads_rows(
                seq, (seq - 1) // ROWS_PER_BATCH + 1, DAY_START_US + seq * step, DAY, rng
            )
            single.write(rows)
            body = rows.drop_columns([DATE])

            def write(index: int, body: pa.Table = body) -> AddAction:
                # Named as ArrowTableWriter names its files: a fresh token per batch.
                relative = f"{DATE}={DAY}/part-00000-{uuid.uuid4().hex}.c000.snappy.parquet"
                path = table_dir / relative
                pq.write_table(
                    body.slice(index * ROWS_PER_BATCH, ROWS_PER_BATCH), path, compression="snappy"
                )
                stat = path.stat()
                return AddAction(
                    relative,
                    stat.st_size,
                    {DATE: DAY},
                    int(stat.st_mtime * 1000),
                    True,
                    json.dumps({"numRecords": ROWS_PER_BATCH}),
                )

            adds = list(pool.map(write, range(count)))
            writing += time.perf_counter() - started
            started = time.perf_counter()
            table.create_write_transaction(
                adds,
                mode="append",
                schema=table.schema(),
                partition_by=[DATE],
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(APP_ID, first + count)]
                ),
            )
            table.update_incremental()
            committing += time.perf_counter() - started
            commits += 1
    started = time.perf_counter()
    single.close()
    # Written by delta-rs as OPTIMIZE writes the compacted files (zstd, each file's column
    # statistics in its add action, which every reader's open takes in), in one file.
    write_deltalake(
        str(one_delta),
        ds.dataset(one_file, format="parquet").scanner().to_reader(),
        partition_by=[DATE],
        target_file_size=1 << 40,
        configuration=table_properties(),
    )
    writing += time.perf_counter() - started
    if len(DeltaTable(str(one_delta)).file_uris()) != 1:
        raise RuntimeError(f"the one-file Delta table {one_delta} holds more than one file")
    version = table.version()
    del table
    gc.collect()
    return {
        "commits": commits,
        "version": version,
        "writing_seconds": round(writing, 1),
        "committing_seconds": round(committing, 1),
    }


def log_state(table_dir: Path) -> dict:
    """What a fresh open of the table reads: its last checkpoint, the JSON commits after it,
    and how many entries the log directory holds."""
    log_dir = table_dir / "_delta_log"
    names = os.listdir(log_dir)
    versions = sorted(int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit())
    checkpoints = sorted(int(n[:20]) for n in names if ".checkpoint." in n and n[:20].isdigit())
    last = None
    marker = log_dir / "_last_checkpoint"
    if marker.exists():
        found = json.loads(marker.read_text())
        version = found.get("version")
        last = {
            "version": version,
            "actions": found.get("size"),
            "bytes": sum(
                (log_dir / n).stat().st_size
                for n in names
                if n.startswith(f"{version:020d}.checkpoint.")
            ),
        }
    since = checkpoints[-1] if checkpoints else -1
    return {
        "version": versions[-1] if versions else None,
        "log_entries": len(names),
        "log_bytes": sum((log_dir / n).stat().st_size for n in names),
        "json_commits": len(versions),
        "checkpoints": len(checkpoints),
        "last_checkpoint": last,
        "json_commits_after_checkpoint": sum(1 for v in versions if v > since),
    }


def live_files(table_dir: Path) -> tuple[int, int]:
    """Files and bytes of the table's current snapshot."""
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(str(table_dir)).get_add_actions(flatten=True))
    return actions.num_rows, int(pc.sum(actions.column("size_bytes")).as_py() or 0)


def disk_bytes(table_dir: Path) -> int:
    return sum(p.stat().st_size for p in table_dir.glob(f"{DATE}=*/*.parquet"))


# -- the queries ------------------------------------------------------------------------------

_STRONG = (pc.field("antenna") == 2) & (pc.field("peak_rssi") > -60)


class Counted(NamedTuple):
    """One run of the query: seconds in all and per step, and the two counts."""

    seconds: float
    open_seconds: float  # the table opened (for Delta: its log read, as far as the engine
    # reads it before a job: delta-spark builds its file list in the first job)
    count_seconds: float
    filtered_seconds: float
    total: int
    strong: int


def _counted(open_table: Callable[[], object], count, filtered) -> Counted:
    started = time.perf_counter()
    table = open_table()
    opened = time.perf_counter()
    total = count(table)
    counted = time.perf_counter()
    strong = filtered(table)
    done = time.perf_counter()
    return Counted(
        done - started, opened - started, counted - opened, done - counted, total, strong
    )


def arrow_counts(open_dataset: Callable[[], ds.Dataset]) -> Counted:
    """From the open (the Delta log read, for a table) to both counts, with pyarrow."""
    return _counted(
        open_dataset,
        lambda dataset: dataset.count_rows(),
        lambda dataset: dataset.count_rows(filter=_STRONG),
    )


def spark_counts(session, load: Callable[[], object]) -> Counted:
    from pyspark.sql import functions as F

    return _counted(
        load,
        lambda df: df.count(),
        lambda df: df.filter((F.col("antenna") == 2) & (F.col("peak_rssi") > -60)).count(),
    )


def delta_spark(work_dir: Path, table_uri: str, one_file: Path):
    """The daemon's session (local[2], 512m driver) warmed up on both files (the first jobs of
    a JVM cost seconds of JIT), or None and why it cannot read the Delta table."""
    from spark.session import build_session, stop_session

    try:
        session = build_session("local[2]", work_dir, driver_memory="512m")
    except Exception as error:
        return None, f"no Spark session: {type(error).__name__}: {_first_line(error)}"
    try:
        spark_counts(session, lambda: session.read.parquet(f"file://{one_file}"))
        session.read.format("delta").load(table_uri).limit(1).collect()
    except Exception as error:
        stop_session(session)
        return None, f"Spark did not read the Delta table: {type(error).__name__}: " + (
            _first_line(error)
        )
    return session, None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


def _forget_snapshots(session) -> None:
    """delta-spark keeps each table's log state in a JVM-wide cache: a fresh open starts
    without it, as a new `fxgate sql` or report would."""
    session.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


# -- the benchmark ----------------------------------------------------------------------------


def compaction_day(ctx: Context) -> dict:
    from deltalake import DeltaTable

    from spark.location import spark_uri
    from spark.maintenance import DeltaMaintainer
    from spark.session import stop_session

    scale = QUICK_SCALE if ctx.settings.quick else 1
    runs = ctx.settings.rounds
    batches = round(DAY_BATCHES * scale)
    files_per_commit = math.ceil(batches / COMMITS)
    work = ctx.settings.work_dir / "compaction"
    shutil.rmtree(work, ignore_errors=True)
    tables = work / "tables"
    table_dir = Path(table_path(tables, READS))
    one_delta = work / "one-file-delta" / READS
    one_file = work / "one-file" / "reads.parquet"
    landing = land_day(table_dir, one_delta, one_file, batches, files_per_commit)
    files_before, bytes_before = live_files(table_dir)
    log_before = log_state(table_dir)
    print(
        f"   {batches:,} batch files ({batches * ROWS_PER_BATCH:,} rows, "
        f"{bytes_before / 1e6:.0f} MB) written in {landing['writing_seconds']:.0f} s, "
        f"committed in {landing['commits']} commits in {landing['committing_seconds']:.0f} s; "
        f"log: {log_before}",
        flush=True,
    )

    uri = spark_uri(table_dir)
    one_delta_uri = spark_uri(one_delta)
    session, spark_missing = delta_spark(work / "spark", uri, one_file)
    if spark_missing:
        print(f"   Spark not measured: {spark_missing}", flush=True)
    failed: dict[str, str] = {}
    if spark_missing:
        failed["spark"] = spark_missing
    samples: dict[str, dict[str, list]] = {r: {p: [] for p in SAMPLED} for r in READERS}

    def spark_delta(table_uri: str):
        _forget_snapshots(session)
        return session.read.format("delta").load(table_uri)

    queries: dict[tuple[str, str], Callable[[], Counted]] = {
        ("spark", "table"): lambda: spark_counts(session, lambda: spark_delta(uri)),
        ("spark", ONE_DELTA): lambda: spark_counts(session, lambda: spark_delta(one_delta_uri)),
        ("spark", CACHED): lambda: spark_counts(
            session, lambda: session.read.format("delta").load(uri)
        ),
        ("spark", "one file"): lambda: spark_counts(
            session, lambda: session.read.parquet(f"file://{one_file}")
        ),
        ("delta-rs", "table"): lambda: arrow_counts(
            lambda: DeltaTable(str(table_dir)).to_pyarrow_dataset()
        ),
        ("delta-rs", ONE_DELTA): lambda: arrow_counts(
            lambda: DeltaTable(str(one_delta)).to_pyarrow_dataset()
        ),
        ("delta-rs", "one file"): lambda: arrow_counts(
            lambda: ds.dataset(one_file, format="parquet")
        ),
    }

    def take(reader: str, phase: str) -> None:
        if reader in failed:
            return
        try:
            sample = queries[reader, phase if (reader, phase) in queries else "table"]()
        except Exception as error:
            failed[reader] = f"{phase}: {type(error).__name__}: {_first_line(error)}"
            print(f"   {reader} {phase} FAILED: {failed[reader]}", flush=True)
            return
        samples[reader][phase].append(sample)
        print(
            f"    {reader:>8} {phase:>12}: {sample.seconds:8.2f} s (open "
            f"{sample.open_seconds:.2f}, count {sample.count_seconds:.2f}, filtered "
            f"{sample.filtered_seconds:.2f})",
            flush=True,
        )

    try:
        arrow_counts(lambda: ds.dataset(one_file, format="parquet"))  # not measured: warm-up
        began = time.perf_counter()
        for run in range(runs):
            started = time.perf_counter()
            for reader in READERS:
                take(reader, "before")
            spent, last = time.perf_counter() - began, time.perf_counter() - started
            if run + 1 < runs and spent + last > BEFORE_BUDGET_SECONDS[ctx.settings.quick]:
                print(f"   (no time for another 'before' run: {spent:.0f} s spent)", flush=True)
                break
        maintainer = DeltaMaintainer(tables, tables=(READS,))
        # The next day, 01:00 UTC: the day is closed, so it is packed into full-size files.
        outcome = maintainer.run(DAY_START_US / 1e6 + 86_400 + 3_600)
        print(f"   pass: {outcome.seconds:.1f} s: {outcome.summary()}", flush=True)
        for _ in range(runs):
            for reader in READERS:
                take(reader, WITHIN_HOUR)  # reported beside, not in the target
                if reader == "spark":
                    take(reader, CACHED)  # not part of the target: what a warm session pays
        expire_tombstones(table_dir)
        for _ in range(runs):
            for reader in READERS:
                take(reader, "after")
                take(reader, ONE_DELTA)
                take(reader, "one file")
    finally:
        if session is not None:
            stop_session(session)
        gc.collect()
    files_after, bytes_after = live_files(table_dir)
    log_after = log_state(table_dir)
    disk_after = disk_bytes(table_dir)

    per_reader = {}
    counts: set[tuple[int, int]] = set()
    for reader in READERS:
        taken = samples[reader]
        if not all(taken[phase] for phase in PHASES):
            continue
        seconds = {phase: [round(s.seconds, 3) for s in taken[phase]] for phase in PHASES}
        medians = {phase: statistics.median(values) for phase, values in seconds.items()}
        found = {(s.total, s.strong) for phase in SAMPLED for s in taken[phase]}
        counts |= found
        per_reader[reader] = {
            "before_seconds": seconds["before"],
            "after_seconds": seconds["after"],
            "one_file_delta_seconds": seconds[ONE_DELTA],
            "one_file_seconds": seconds["one file"],
            "before_median": round(medians["before"], 3),
            "after_median": round(medians["after"], 3),
            "one_file_delta_median": round(medians[ONE_DELTA], 3),
            "one_file_median": round(medians["one file"], 3),
            # The target's: against the same rows in one file of a Delta table.
            "ratio": round(medians["after"] / medians[ONE_DELTA], 3),
            # Beside it: against one plain Parquet file, the engine's cost of a Delta open in.
            "ratio_to_parquet": round(medians["after"] / medians["one file"], 3),
            "speedup": round(medians["before"] / medians["after"], 1),
            "counts": sorted(found),
            "after_cached_seconds": [round(x.seconds, 3) for x in taken[CACHED]],
            "after_within_hour_seconds": [round(x.seconds, 3) for x in taken[WITHIN_HOUR]],
            # Where the time went: medians per step (open, count, filtered count).
            "steps_median": {
                phase: {
                    step: round(statistics.median(getattr(x, f"{step}_seconds") for x in done), 3)
                    for step in ("open", "count", "filtered")
                }
                for phase, done in taken.items()
                if done
            },
        }
    if not per_reader:
        raise RuntimeError(f"no reader measured every phase: {failed}")
    primary = "spark" if "spark" in per_reader else "delta-rs"
    main = per_reader[primary]
    counts_agree = len(counts) == 1 and next(iter(counts))[0] == batches * ROWS_PER_BATCH
    met = counts_agree and all(r["ratio"] <= TARGET_RATIO for r in per_reader.values())
    shutil.rmtree(work, ignore_errors=True)
    setup = {
        "day_batches_per_table": DAY_BATCHES,
        "scale": scale,
        "batches": batches,
        "rows_per_batch": ROWS_PER_BATCH,
        "rows": batches * ROWS_PER_BATCH,
        "files_per_commit": files_per_commit,
        "runs": runs,
        "before_budget_seconds": BEFORE_BUDGET_SECONDS[ctx.settings.quick],
        "commits": landing["commits"],
        "built": "a day's batch files, one Parquet file per batch written with pyarrow (the "
        "`reads` columns, spark.tables.as_written, not synced), committed in chunks of "
        f"{files_per_commit} add actions per Delta commit, each with a transaction id "
        "(delta-rs create_write_transaction): the files are the day's, the commits are "
        "chunked because single appends slow with the live file count (DESIGN §7); a read "
        "pays for the live files and the log from the last checkpoint (one every "
        f"{table_properties()['delta.checkpointInterval']} commits) either way, see the "
        "module's docstring",
        "table_properties": table_properties(),
        "log_before": log_before,
        "log_after": log_after,
        "files_before": files_before,
        "bytes_before": bytes_before,
        "files_after": files_after,
        "bytes_after": bytes_after,
        "bytes_on_disk_after": disk_after,
        "writing_seconds": landing["writing_seconds"],
        "committing_seconds": landing["committing_seconds"],
        "spark": "local[2], 512m driver (the daemon's defaults), format('delta'), delta-spark's "
        "snapshot cache cleared before each run"
        if "spark" in per_reader
        else f"not measured: {failed.get('spark')}",
        "delta_rs": "DeltaTable(path).to_pyarrow_dataset(), counted by pyarrow (no JVM)",
        "query": "count(*) and count(*) WHERE antenna = 2 AND peak_rssi > -60, from a fresh "
        "open of the table (the log read included); one file, Delta: the same on the day's "
        "rows written by delta-rs (write_deltalake) in one file of a Delta table (the "
        "target's reference); "
        "one file: spark.read.parquet / pyarrow.dataset of the same rows in one plain "
        "Parquet file",
    }
    return {
        "kind": "fxgate-bench",
        "module": "bench.compaction",
        "name": "compaction-day",
        "title": "a day of Delta commits, count-and-filter before/after OPTIMIZE",
        "unit": "s",
        "setup": setup,
        "primary_reader": primary,
        "readers": per_reader,
        "reader_failures": failed,
        "before_seconds": main["before_seconds"],
        "after_seconds": main["after_seconds"],
        "one_file_delta_seconds": main["one_file_delta_seconds"],
        "one_file_seconds": main["one_file_seconds"],
        "before_median": main["before_median"],
        "after_median": main["after_median"],
        "one_file_delta_median": main["one_file_delta_median"],
        "one_file_median": main["one_file_median"],
        "pass_seconds": round(outcome.seconds, 2),
        "pass": outcome.summary(),
        "counts_agree": counts_agree,
        "counts": sorted(counts),
        "ratio": main["ratio"],
        "speedup": main["speedup"],
        "target": {"kind": "ratio_at_most", "value": TARGET_RATIO},
        "met": met,
        "headline": (
            f"{batches:,} batch files ({_share(setup)}): "
            + "; ".join(
                f"{reader} before {r['before_median']:.2f} s, after {r['after_median']:.2f} s, "
                f"one file {r['one_file_delta_median']:.2f} s as Delta ({r['ratio']:.2f}x), "
                f"{r['one_file_median']:.2f} s as Parquet ({r['ratio_to_parquet']:.2f}x)"
                for reader, r in per_reader.items()
            )
            + f"; the pass {outcome.seconds:.1f} s"
        ),
    }


def _within_hour(reader: dict) -> str:
    within = reader.get("after_within_hour_seconds")
    if not within:
        return ""
    return (
        f"within the pass's hour, tombstones in the checkpoint: {statistics.median(within):.2f} s; "
    )


def expire_tombstones(table_dir: Path) -> None:
    """What the first pass an hour after this one leaves: a checkpoint without the tombstones
    of the files the compaction replaced (their `delta.deletedFileRetentionDuration` is over).
    The benchmark cannot wait the hour, so the retention is set to 0 and a checkpoint written:
    one metadata commit more than the daemon's table has, and the same checkpoint."""
    from deltalake import DeltaTable

    table = DeltaTable(str(table_dir))
    table.alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 0 seconds"})
    table.create_checkpoint()
    del table
    gc.collect()


def _share(setup: dict) -> str:
    if setup["scale"] == 1:
        return "a whole day at the 1 s batch window"
    return f"{setup['scale']:g} of a day's {setup['day_batches_per_table']:,}"


def rows(result: dict) -> list[list[str]]:
    setup = result["setup"]
    if "readers" not in result:
        return _layout_rows(result)
    found = []
    for reader, r in result.get("readers", {}).items():
        found.append(
            [
                f"`compaction-day` ({reader})",
                f"{setup['batches']:,} batch files of {setup['rows_per_batch']} reads "
                f"({_share(setup)}; {setup['rows']:,} rows, {setup['commits']} Delta commits "
                f"of {setup['files_per_commit']} files): count + filtered count from a fresh "
                f"open, before → after OPTIMIZE ({setup['files_before']:,} → "
                f"{setup['files_after']} file(s)); baseline: the same rows in one file of a "
                "Delta table",
                f"{r['one_file_delta_median']:.2f} s (one file, Delta; "
                f"{r['one_file_median']:.2f} s as plain Parquet)",
                f"{r['after_median']:.2f} s compacted (before: {r['before_median']:.2f} s; "
                f"{_within_hour(r)}the pass: {result['pass_seconds']:.1f} s)",
                f"{r['ratio']:.2f}\u00d7 ({r['ratio_to_parquet']:.2f}\u00d7 plain Parquet)",
                f"≤ {result['target']['value']:g}\u00d7 one file",
                "yes"
                if r["ratio"] <= result["target"]["value"] and result["counts_agree"]
                else "**no**",
                f"{len(r['after_seconds'])}+{len(r['one_file_delta_seconds'])}",
            ]
        )
    return found


def _layout_rows(result: dict) -> list[list[str]]:
    """The row of a result measured on the layout before Delta (`date=/batch_id=` partitions,
    spark.read.parquet), kept in the table until the benchmark is run again."""
    setup = result["setup"]
    return [
        [
            "`compaction-day` (layout before Delta)",
            f"{setup['batches']:,} batch partitions of {setup['rows_per_batch']} reads "
            f"({setup['rows']:,} rows): Spark count + filtered count, listing included, before "
            f"→ after a compaction pass ({setup['files_before']:,} → {setup['files_after']} "
            "file(s)); baseline: the same rows in one file",
            f"{result['one_file_median']:.2f} s (one file)",
            f"{result['after_median']:.2f} s compacted (before: {result['before_median']:.2f} s; "
            f"the pass: {result['pass_seconds']:.1f} s)",
            f"{result['ratio']:.2f}\u00d7",
            f"≤ {result['target']['value']:g}\u00d7 one file",
            "yes" if result["met"] else "**no**",
            f"{len(result['after_seconds'])}+{len(result['one_file_seconds'])}",
        ]
    ]


def plot(results_dir: Path, result: dict) -> Path:
    import matplotlib.pyplot as plt

    path = results_dir / f"{result['name']}.png"
    readers = result.get("readers", {})
    fig, axes = plt.subplots(1, len(readers), figsize=(4.5 * len(readers), 4.6), dpi=110)
    axes = list(np.atleast_1d(axes))
    for ax, (reader, r) in zip(axes, readers.items(), strict=True):
        groups = [
            ("before", r["before_seconds"], "tab:red"),
            ("after", r["after_seconds"], "tab:green"),
            (ONE_DELTA, r["one_file_delta_seconds"], "tab:cyan"),
            ("one file", r["one_file_seconds"], "tab:blue"),
        ]
        if r.get("after_cached_seconds"):
            groups.insert(2, ("after cached", r["after_cached_seconds"], "tab:olive"))
        for index, (label, values, color) in enumerate(groups):
            ax.plot([index] * len(values), values, "o", color=color, label=label)
        ax.set_xticks(range(len(groups)), [g[0] for g in groups])
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.set_title(reader)
        ax.grid(alpha=0.3)
    fig.suptitle(result["headline"], fontsize=7, wrap=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark("compaction-day", compaction_day, False),)
