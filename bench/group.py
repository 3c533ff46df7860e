"""A shared group's landing (issue 34, DESIGN §7.12): two members landing insert-if-absent into one
Delta table against one gateway appending, after a simulated day of commits; and publish -> row
latency of two real daemons in one shared group against one alone.

Part 1, landing rows/s (no broker). First a table that holds what a day of the default daemon
leaves: 4 readers at 100 reads/s each, a batch per `batch_max_seconds` window (1 s: 400 rows a
batch, 86,400 batches and 34.6 million rows a day), each batch one Delta commit by
spark.tables.ArrowTableWriter with its transaction id, the reads' event times spread over the
day (12:00 to 12:00 UTC, so the table has a closed date and an open one), and a
spark.maintenance.DeltaMaintainer pass at the daemon's cadence (`interval_seconds`, 300 s of
simulated time) whose "now" is the simulated time: the closed date compacted into 128 MiB
files, the open date into 16 MiB ones, VACUUM, checkpoints, log clean-up.
How the day is built, honestly and fast (bench/delta_log.py does the same for a month). The last
`log_retention_hours` (1 h) of the day is committed as it arrives, a commit per 1 s batch, so
the log, the checkpoint's tombstones and the files VACUUM keeps are the ones a day of service
leaves there. Before that, each real commit stands for `BULK_BATCHES` batches (their reads, in
one file): a commit per batch for 23 hours would take the better part of an hour here, hardly
any of those commits is left in the log at the end of the day, and none of their files outside
the compacted ones (the passes compact the same bytes at the same simulated times). Two clocks
are moved by hand: before each pass every log entry's modification time is set to now minus its
simulated age (as delta-month does), so the log clean-up deletes what the day would have
deleted by then; and delta-rs stamps a compaction's removals with the real clock, so during the
23 bulk hours the tombstone and VACUUM retentions are 0 (each pass forgets what the one before
compacted, as an hour would), and the daemon's 1 h from the last hour on (what that hour
compacted stays in the checkpoint and on the disk, as in service). The day ends with a pass.
During the rounds below no clock is moved: their few minutes stand for themselves. Every writer
here leaves the expired log entries to its passes, as the daemon's do when it maintains its
tables (spark.tables.ArrowTableWriter, `log_cleanup`).

Then, alternately (the run's rounds), each contestant in a copy of that table (data files hard-
linked, the log copied with its modification times): the next batches, half a pass interval of
them untimed (the table then holds the small files that contestant's own writer leaves since
the last pass), then a whole pass interval of them timed (`PASS_BATCHES`: every layout between
two passes once), with the daemon's next pass in the middle, between the writes of the one who
runs it. Every contestant is a process of its own, on one vCPU of its own (`pin`): a member of
a real group has a gateway of its own, and the same two vCPUs that run one gateway here cannot
also run two as they would run; the disk is shared. The same pair with every process on the
whole machine is reported beside it (`shared`, report only): there the two members take each
other's CPU, which a group never does in service.
- baseline: the gateway that landed the day goes on appending each 1 s batch
  (ArrowTableWriter), and runs the pass;
- group: two spark.tables.GroupTableWriter members (own application ids, own member names, own
  batch ids) in two processes, as on two gateways, each landing its share of the same
  batches: the members split the readers, two each (as EMQX's
  `hash_clientid` deals them out; mosquitto's strict turn would give each member half of every
  reader's reads: as many rows, over the same event times), and `REDISPATCH_SHARE` (1 %) of
  each member's reads also reach the other one window later (a re-dispatch, DESIGN §4), so both
  race to land them. Member a1 runs the pass (its OPTIMIZEs claimed, spark/maintenance.py).
  The group adopts the day's table first (spark.tables.check_group), as a group that grows
  out of one gateway does.
Reported: rows/s of each (distinct rows of the window / the window's wall time, the pass
included), their ratio (target >= 0.5), the time of each write_batch (a landing with its
retries, an append), the data files each landing read the identities of against the table's
live files (`take_files_read`: the event-time statistics prune the rest), the landings retried
and the reads another member had landed first (`take_merge_counts`), and each table's row
count against the expected one (exactly once).

Part 2, publish -> row latency (bench/latency.py's machinery: its ingest ceiling, publisher
processes and Delta-log watcher): at 50 % of the QoS 1 ingest ceiling, the default daemon alone
(latency's own 50 % sample) against two daemons in one shared group (`$share/fxgate-env-a/...`,
instance ids a1 and a2, a data directory each, one `spark.tables_dir`), each in a warm
bench.gateway_worker process of its own, on a fresh mosquitto. mosquitto 2.0.11 deals a
shared group's messages to its members in strict turn (subs.c, `subs__shared_process`), so each
member acknowledges and lands exactly half; the group's batches are told apart by
`(landed_by, batch_id)`. Target: the group's p99 <= linger + 2 s (3 s), as latency's. Each
member parses its batches in its writer's thread, natively (issue 36; before it, a parse
worker and a niced helper per daemon, which on two daemons sharing two vCPUs waited behind
the other daemon: the group then ran with `parse_helpers = 0`, and a report-only role sampled
it with the default helper).
What this cannot show: the members share one broker, one disk and two vCPUs with the publishers
and the watcher; no member fails, so the broker re-dispatches nothing there (part 1 stands in
for that). `--quick` builds a 4-hour "day" (22:00 to 02:00) with a 10-minute tail, lands
shorter windows with a pass every `PASS_BATCHES[True]` batches, and runs one latency round.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from actors.config.schema import CompactionConfig, SparkConfig, load_config
from bench import machine
from bench.benchmarks import Benchmark, Context, alternate, fxgate_sample, samples_used
from bench.compaction import log_state, reads_rows
from bench.delta_log import SimulatedLog
from bench.harness import PUBLISHING_READERS, GatewayWorker
from bench.latency import (
    QUANTILES,
    SECONDS,
    TARGET_LOAD,
    Landing,
    ceiling,
    defaults,
    landing_figures,
    publish_and_land,
    sample,
    sample_messages,
    summarize_level,
)
from spark.tables import (
    BATCH_ID,
    LANDED_BY,
    READS,
    application_id,
    read_table_arrow,
    table_path,
    table_properties,
)

log = logging.getLogger(__name__)

NAME = "group-landing"
_SPARK = SparkConfig()
_COMPACTION = CompactionConfig()
BATCH_SECONDS = _SPARK.batch_max_seconds
READERS = PUBLISHING_READERS
READS_PER_READER_SECOND = 100
ROWS_PER_BATCH = round(READERS * READS_PER_READER_SECOND * BATCH_SECONDS)
# The daemon's pass every interval_seconds; --quick lands shorter windows, a pass every minute.
PASS_BATCHES = {False: round(_COMPACTION.interval_seconds / BATCH_SECONDS), True: 60}
PASS_SECONDS = _COMPACTION.interval_seconds
# The day: noon to noon (a closed date, an open one); --quick: 22:00 to 02:00.
DAY_START = {
    False: datetime(2026, 11, 23, 12, tzinfo=UTC).timestamp(),
    True: datetime(2026, 11, 23, 22, tzinfo=UTC).timestamp(),
}
DAY_SECONDS = {False: 86_400, True: 4 * 3600}
# The day's end committed batch by batch: the log's retention (what the log still holds).
TAIL_SECONDS = {False: round(3600 * _COMPACTION.log_retention_hours), True: 600}
# Before it, a real commit per this many batches (a divisor of the pass interval).
BULK_BATCHES = {False: 60, True: 300}
REDISPATCH_SHARE = 0.01
LANDING_TARGET = 0.5
# Part 2's contestants: the gateway alone and the group's two daemons, default settings.
LATENCY_ROLES = ("alone", "group")
GROUP_ENV = {
    "FXGATE__SOURCE__SHARED_SUBSCRIPTION_GROUP": "fxgate",
    "FXGATE__SOURCE__ENVIRONMENT_ID": "env-a",
}
MEMBERS = ("a1", "a2")
DAY_APP_ID = application_id("bench-group-day")
MEMBER_APP_IDS = {member: application_id(f"bench-group-{member}") for member in MEMBERS}
_VACUUM_HOURS = _COMPACTION.vacuum_retention_hours
# The bulk hours' properties: the daemon's, but for the tombstones' retention (see the module).
BULK_PROPERTIES = table_properties(
    checkpoint_interval=_COMPACTION.checkpoint_interval,
    log_retention_hours=_COMPACTION.log_retention_hours,
    deleted_file_retention_hours=0,
)
DAEMON_PROPERTIES = _COMPACTION.table_properties()


def member_config(member: str, tables_dir: Path | None = None):
    """The daemon's configuration of group member `member` (its client id, share name, group)."""
    environ = {**GROUP_ENV, "FXGATE__SOURCE__INSTANCE_ID": member}
    if tables_dir is not None:
        environ["FXGATE__SPARK__TABLES_DIR"] = str(tables_dir)
    return load_config(None, environ=environ, hostname="bench")


def maintainer(tables: Path, *, bulk: bool = False, claim: str | None = None):
    """A DeltaMaintainer of the `reads` table with the daemon's settings (in the bulk hours:
    tombstones and VACUUM at 0, see the module)."""
    from spark.maintenance import DeltaMaintainer

    return DeltaMaintainer(
        tables,
        target_file_bytes=_COMPACTION.target_file_mb * 1024 * 1024,
        open_file_bytes=_COMPACTION.open_file_mb * 1024 * 1024,
        vacuum_retention_hours=0 if bulk else _VACUUM_HOURS,
        tables=(READS,),
        properties=BULK_PROPERTIES if bulk else DAEMON_PROPERTIES,
        claim=claim,
    )


def batch_rows(first_batch: int, batches: int, at: float, rng) -> pa.Table:
    """The reads of `batches` windows from simulated time `at` on (`ROWS_PER_BATCH` a window,
    spread evenly over it), numbered on from batch `first_batch`; all in the last batch's id (a
    commit carries one)."""
    from spark.maintenance import utc_date

    n = batches * ROWS_PER_BATCH
    first = (first_batch - 1) * ROWS_PER_BATCH + 1
    seq = np.arange(first, first + n, dtype=np.int64)
    span = round(batches * BATCH_SECONDS * 1e6)
    micros = round(at * 1e6) + np.arange(n, dtype=np.int64) * span // n
    last = np.full(n, first_batch + batches - 1, dtype=np.int64)
    return reads_rows(seq, last, micros, utc_date(at), rng)


# -- the day -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Day:
    tables: Path
    start: float
    end: float
    last_batch: int
    rows: int
    built: dict


def build_day(work: Path, quick: bool) -> Day:
    from deltalake import DeltaTable

    from spark.tables import ArrowTableWriter

    start, end = DAY_START[quick], DAY_START[quick] + DAY_SECONDS[quick]
    tail_from = end - TAIL_SECONDS[quick]
    bulk = BULK_BATCHES[quick]
    tables = work / "day"
    table_dir = Path(table_path(tables, READS))
    # delta-month's clock of the log (its set-aside directory stays empty here: nothing is put
    # back; version 0, the table's creation, counts as a month old and goes at the first
    # clean-up, as it would after a day).
    clock = SimulatedLog(table_dir / "_delta_log", work / "day-log-unused")
    writer = ArrowTableWriter(
        None, tables, DAY_APP_ID, properties=BULK_PROPERTIES, log_cleanup=False
    )
    passes = {"bulk": maintainer(tables, bulk=True), "tail": maintainer(tables)}
    rng = np.random.default_rng(34)
    batch, at, next_pass = 0, start, start + PASS_SECONDS
    done = {
        phase: {"commits": 0, "commit_seconds": 0.0, "passes": [], "commit_ms": []}
        for phase in passes
    }
    began = time.perf_counter()
    report_every = 6 * 3600 if not quick else 3600
    next_report = start + report_every
    try:
        while at < end:
            phase = "bulk" if at < tail_from else "tail"
            size = bulk if phase == "bulk" else 1
            rows = batch_rows(batch + 1, size, at, rng)
            started = time.perf_counter()
            writer.write_batch(batch + size, {READS: rows})
            seconds = time.perf_counter() - started
            batch += size
            at += size * BATCH_SECONDS
            clock.committed(at)
            done[phase]["commits"] += 1
            done[phase]["commit_seconds"] += seconds
            if phase == "tail":
                done[phase]["commit_ms"].append(round(1000 * seconds, 2))
            if at >= next_pass:
                clock.stamp(next_pass)
                outcome = passes[phase].run(next_pass)
                maintained = outcome.tables[0]
                clock.maintained(maintained.version, next_pass)
                done[phase]["passes"].append(
                    (outcome.seconds, maintained.files_removed, maintained.files_vacuumed)
                )
                next_pass += PASS_SECONDS
            if at >= next_report or at == tail_from:
                print(
                    f"    day: {(at - start) / 3600:5.2f} h simulated, {batch:,} batches in "
                    f"{sum(d['commits'] for d in done.values()):,} commits, "
                    f"{sum(len(d['passes']) for d in done.values())} passes "
                    f"({time.perf_counter() - began:.0f} s)",
                    flush=True,
                )
                next_report += report_every
    finally:
        writer.close()
        gc.collect()
    table = DeltaTable(str(table_dir))
    actions = pa.table(table.get_add_actions(flatten=True))
    by_date = {}
    for date, size in zip(
        actions.column("partition.date").to_pylist(),
        actions.column("size_bytes").to_pylist(),
        strict=True,
    ):
        files, total = by_date.get(date, (0, 0))
        by_date[date] = (files + 1, total + size)
    rows = table.count()
    del table
    gc.collect()
    built = {
        "seconds": round(time.perf_counter() - began, 1),
        "simulated": f"{datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M} to "
        f"{datetime.fromtimestamp(end, UTC):%Y-%m-%d %H:%M} UTC",
        "batches": batch,
        "rows": rows,
        "live_files": actions.num_rows,
        "live_bytes": sum(actions.column("size_bytes").to_pylist()),
        "files_by_date": {
            date: {"files": n, "mib": round(total / 2**20, 1)}
            for date, (n, total) in sorted(by_date.items())
        },
        "log": log_state(table_dir),
    }
    for phase, d in done.items():
        pass_seconds = [p[0] for p in d["passes"]]
        built[phase] = {
            "commits": d["commits"],
            "batches_per_commit": bulk if phase == "bulk" else 1,
            "commit_seconds": round(d["commit_seconds"], 1),
            "passes": len(d["passes"]),
            "pass_seconds_median": round(statistics.median(pass_seconds), 3)
            if pass_seconds
            else None,
            "pass_seconds_max": round(max(pass_seconds), 2) if pass_seconds else None,
            "files_compacted": sum(p[1] for p in d["passes"]),
            "files_vacuumed": sum(p[2] for p in d["passes"]),
        }
    tail_ms = done["tail"]["commit_ms"]
    if tail_ms:
        built["tail"]["append_ms_median"] = statistics.median(tail_ms)
    shutil.rmtree(work / "day-log-unused", ignore_errors=True)
    return Day(tables, start, end, batch, rows, built)


def copy_table(source: Path, target: Path) -> None:
    """`source`'s tables in `target`: data files hard-linked (never changed once written), the
    Delta log copied with its modification times (delta-rs rewrites `_last_checkpoint`, and
    the log clean-up reads the times)."""
    for root, _dirs, names in os.walk(source):
        here = target / Path(root).relative_to(source)
        here.mkdir(parents=True, exist_ok=True)
        in_log = Path(root).name == "_delta_log"
        for name in names:
            if in_log:
                shutil.copy2(Path(root) / name, here / name)
            else:
                os.link(Path(root) / name, here / name)


# -- the next batches, for each contestant -------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The batches after the day: the gateway alone's, and each member's share of them."""

    alone: list[tuple[int, pa.Table]]  # (its batch id, rows)
    shares: dict[str, list[pa.Table]]  # member -> its batches, its ids 1, 2, ...
    prelude: int
    window: int
    pass_after: int  # the pass comes after this many batches (prelude included)
    pass_at: float  # its simulated "now"
    copies: int  # reads of the timed batches that reach both members


def plan_batches(day: Day, quick: bool) -> Plan:
    interval = PASS_BATCHES[quick]
    prelude, window = interval // 2, interval
    rng = np.random.default_rng(3434)
    alone = []
    for k in range(1, prelude + window + 1):
        batch_id = day.last_batch + k
        alone.append((batch_id, batch_rows(batch_id, 1, day.end + (k - 1) * BATCH_SECONDS, rng)))
    readers = sorted(set(alone[0][1].column("reader_id").to_pylist()))
    halves = {MEMBERS[0]: readers[: len(readers) // 2], MEMBERS[1]: readers[len(readers) // 2 :]}
    shares: dict[str, list[pa.Table]] = {member: [] for member in MEMBERS}
    carried: dict[str, pa.Table | None] = dict.fromkeys(MEMBERS)
    copies = 0
    late = pa.scalar(round(BATCH_SECONDS * 1e6), pa.duration("us"))
    for k, (_, rows) in enumerate(alone, start=1):
        mine = {
            member: rows.filter(pc.is_in(rows.column("reader_id"), pa.array(halves[member])))
            for member in MEMBERS
        }
        for member in MEMBERS:
            parts = [mine[member]] + ([carried[member]] if carried[member] is not None else [])
            batch = pa.concat_tables(parts)
            ids = pa.array(np.full(batch.num_rows, k, dtype=np.int64))
            shares[member].append(
                batch.set_column(batch.schema.get_field_index(BATCH_ID), BATCH_ID, ids)
            )
        # A re-dispatch: some of each member's reads reach the other too, a window later.
        for member, other in (MEMBERS, MEMBERS[::-1]):
            picked = mine[member].filter(
                pa.array(rng.random(mine[member].num_rows) < REDISPATCH_SHARE)
            )
            index = picked.schema.get_field_index("received_time")
            carried[other] = picked.set_column(
                index, "received_time", pc.add(picked.column(index), late)
            )
            if prelude < k + 1 <= len(alone):  # it arrives in a timed batch
                copies += picked.num_rows
    return Plan(
        alone=alone,
        shares=shares,
        prelude=prelude,
        window=window,
        pass_after=interval,
        pass_at=day.end + interval * BATCH_SECONDS,
        copies=copies,
    )


# -- one round of each --------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def _pass(outcome) -> dict:
    done = outcome.tables[0]
    return {
        "seconds": round(outcome.seconds, 3),
        "files_compacted": done.files_removed,
        "files_vacuumed": done.files_vacuumed,
        "optimizes_lost": done.optimizes_lost,
    }


def _table_rows(tables: Path) -> int:
    from deltalake import DeltaTable

    table = DeltaTable(table_path(tables, READS))
    rows = table.count()
    del table
    gc.collect()
    return rows


def pin(cpus: frozenset[int] | None) -> None:
    """Every thread of this process, and so every thread it starts, on `cpus` (None: as it
    is): a contestant with the CPU of a gateway of its own (see the module)."""
    if cpus is None:
        return
    for task in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(task), cpus)


def contestant_cpus() -> tuple[frozenset[int], frozenset[int]] | None:
    """Two vCPUs of this machine, one for each member (and the first for the gateway alone);
    None with fewer than two."""
    cpus = sorted(os.sched_getaffinity(0))
    return (frozenset({cpus[0]}), frozenset({cpus[1]})) if len(cpus) >= 2 else None


def run_processes(jobs: list[tuple[Callable, object]]) -> list[dict]:
    """Each (target, run) in a spawned process of its own, released together by one barrier;
    what each put on the queue. A process that fails ends the round."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(len(jobs)), spawn.Queue()
    processes = [
        spawn.Process(target=_contestant, args=(target, run, barrier, results))
        for target, run in jobs
    ]
    reports: list[dict] = []
    try:
        for process in processes:
            process.start()
        while len(reports) < len(jobs):
            try:
                reports.append(results.get(timeout=5))
            except queue.Empty:
                if not any(process.is_alive() for process in processes):
                    break  # one died without a report
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
                process.join()
    errors = [r["error"] for r in reports if "error" in r]
    if errors or len(reports) < len(jobs):
        raise RuntimeError(f"a contestant failed: {errors or 'no report'}")
    return reports


def _contestant(target: Callable, run, barrier, results) -> None:
    """One contestant's process: pinned to its vCPUs, `target(run, barrier)`'s figures (or its
    error, which releases the others from the barrier) put on the queue."""
    pin(run.cpus)
    try:
        found = target(run, barrier)
    except BaseException as error:
        barrier.abort()
        found = {"error": f"{type(error).__name__}: {error}"}
    results.put(found)


def timed_batches(writer, batches, barrier, passer=None, pass_after=None, pass_at=0.0) -> dict:
    """Released by `barrier`, write each (k, batch id, rows) of `batches`, timing each, with the
    pass after batch `pass_after`; the window's figures."""
    barrier.wait()
    found: dict = {"began": time.perf_counter()}  # CLOCK_MONOTONIC: one clock for every process
    seconds = found["commit_seconds"] = []
    for k, batch_id, rows in batches:
        started = time.perf_counter()
        writer.write_batch(batch_id, {READS: rows})
        seconds.append(time.perf_counter() - started)
        if k == pass_after:
            found["pass"] = _pass(passer.run(pass_at))
    found["ended"] = time.perf_counter()
    return found


@dataclass(frozen=True)
class AppendRun:
    """What the gateway alone's process is given."""

    tables: Path
    batches: list[tuple[int, pa.Table]]  # (its batch id, rows)
    prelude: int
    pass_after: int
    pass_at: float
    cpus: frozenset[int] | None


def append_batches(run: AppendRun, barrier) -> dict:
    """The gateway that landed the day, in a process of its own: its prelude, then its timed
    batches with the pass among them."""
    from spark.tables import ArrowTableWriter

    writer = ArrowTableWriter(
        None, run.tables, DAY_APP_ID, properties=DAEMON_PROPERTIES, log_cleanup=False
    )
    try:
        for batch_id, rows in run.batches[: run.prelude]:
            writer.write_batch(batch_id, {READS: rows})
        timed = [
            (k, batch_id, rows)
            for k, (batch_id, rows) in enumerate(run.batches[run.prelude :], run.prelude + 1)
        ]
        return timed_batches(
            writer, timed, barrier, maintainer(run.tables), run.pass_after, run.pass_at
        )
    finally:
        writer.close()


def append_round(ctx: Context, day: Day, plan: Plan, cpus: frozenset[int] | None) -> dict:
    """The gateway that landed the day appends the next batches and runs the pass, in a process
    of its own (on `cpus`, or the whole machine)."""
    directory = ctx.next_dir("group-landing-append")
    tables = directory / "tables"
    copy_table(day.tables, tables)
    (found,) = run_processes(
        [
            (
                append_batches,
                AppendRun(tables, plan.alone, plan.prelude, plan.pass_after, plan.pass_at, cpus),
            )
        ]
    )
    seconds = found["commit_seconds"]
    elapsed = found["ended"] - found["began"]
    landed = plan.window * ROWS_PER_BATCH
    expected = day.rows + (plan.prelude + plan.window) * ROWS_PER_BATCH
    in_table = _table_rows(tables)
    shutil.rmtree(directory, ignore_errors=True)
    return {
        "cpus": sorted(cpus) if cpus is not None else "all",
        "rows": landed,
        "seconds": round(elapsed, 3),
        "rows_per_second": landed / elapsed,
        "commit_seconds": [round(s, 5) for s in seconds],
        "commit_ms_median": 1000 * statistics.median(seconds),
        "commit_ms_p99": 1000 * _quantile(seconds, 99),
        "pass": found["pass"],
        "table_rows": in_table,
        "expected_rows": expected,
        "exactly_once": in_table == expected,
    }


@dataclass(frozen=True)
class MemberRun:
    """What one member's process is given: its share of the batches and when to run the pass."""

    member: str
    name: str  # its client id, the rows' `landed_by`
    group: str
    tables: Path
    batches: list[pa.Table]
    prelude: int
    pass_after: int | None  # the member that runs the pass: after this batch
    pass_at: float
    cpus: frozenset[int] | None


def land_share(run: MemberRun, barrier) -> dict:
    """One member, in a process of its own (a gateway of its own): its prelude, then, released
    with the other by `barrier`, its timed batches."""
    from spark.tables import GroupTableWriter

    writer = GroupTableWriter(
        None,
        run.tables,
        MEMBER_APP_IDS[run.member],
        properties=DAEMON_PROPERTIES,
        group=run.group,
        member=run.name,
        log_cleanup=False,  # its passes clean the log, as the daemon's do
    )
    passer = maintainer(run.tables, claim=run.name) if run.pass_after is not None else None
    try:
        for batch_id, rows in enumerate(run.batches[: run.prelude], start=1):
            writer.write_batch(batch_id, {READS: rows})
        writer.take_merge_counts()  # the prelude's
        writer.take_files_read()
        timed = [
            (batch_id, batch_id, rows)
            for batch_id, rows in enumerate(run.batches[run.prelude :], run.prelude + 1)
        ]
        found = timed_batches(writer, timed, barrier, passer, run.pass_after, run.pass_at)
        found["member"] = run.member
        found["retried"], found["already_landed"] = writer.take_merge_counts()
        found["files_read"] = writer.take_files_read()
        return found
    finally:
        writer.close()


def group_round(
    ctx: Context, day: Day, plan: Plan, cpus: tuple[frozenset[int], frozenset[int]] | None
) -> dict:
    """Two members land their shares of the next batches, each in a process of its own (as on
    two gateways: no interpreter lock between them; each on one of `cpus`, or both on the
    whole machine); member a1 runs the pass between its writes."""
    from deltalake import DeltaTable

    from spark.tables import check_group

    directory = ctx.next_dir("group-landing-members")
    tables = directory / "tables"
    copy_table(day.tables, tables)
    path = table_path(tables, READS)
    configs = {member: member_config(member) for member in MEMBERS}
    group = configs[MEMBERS[0]].group_tables
    names = {member: config.identity.client_id for member, config in configs.items()}
    # A group that grows out of the gateway that landed the day adopts its table.
    check_group(tables, group)
    reports = run_processes(
        [
            (
                land_share,
                MemberRun(
                    member=member,
                    name=names[member],
                    group=group,
                    tables=tables,
                    batches=plan.shares[member],
                    prelude=plan.prelude,
                    pass_after=plan.pass_after if member == MEMBERS[0] else None,
                    pass_at=plan.pass_at,
                    cpus=None if cpus is None else cpus[index],
                ),
            )
            for index, member in enumerate(MEMBERS)
        ]
    )
    found = {r["member"]: r for r in reports}
    elapsed = max(f["ended"] for f in found.values()) - min(f["began"] for f in found.values())
    landed = plan.window * ROWS_PER_BATCH
    expected = day.rows + (plan.prelude + plan.window) * ROWS_PER_BATCH
    in_table = _table_rows(tables)
    live_files = len(DeltaTable(path).file_uris())
    shutil.rmtree(directory, ignore_errors=True)
    seconds = [s for f in found.values() for s in f["commit_seconds"]]
    scanned = [n for f in found.values() for n in f["files_read"]]
    return {
        "cpus": [sorted(c) for c in cpus] if cpus is not None else "all",
        "rows": landed,
        "seconds": round(elapsed, 3),
        "rows_per_second": landed / elapsed,
        "members": {
            member: {
                "client_id": names[member],
                "batches": len(f["commit_seconds"]),
                "rows": sum(t.num_rows for t in plan.shares[member][plan.prelude :]),
                "seconds": round(f["ended"] - f["began"], 3),
                "merges_retried": f["retried"],
                "reads_already_landed": f["already_landed"],
                "commit_seconds": [round(s, 5) for s in f["commit_seconds"]],
            }
            for member, f in found.items()
        },
        "commit_ms_median": 1000 * statistics.median(seconds),
        "commit_ms_p99": 1000 * _quantile(seconds, 99),
        "files_read_per_landing_median": statistics.median(scanned) if scanned else None,
        "files_read_per_landing_p99": _quantile(scanned, 99),
        "files_read_per_landing_max": max(scanned) if scanned else None,
        "live_files_after": live_files,
        "merges_retried": sum(f["retried"] for f in found.values()),
        "reads_already_landed": sum(f["already_landed"] for f in found.values()),
        "pass": found[MEMBERS[0]].get("pass"),
        "table_rows": in_table,
        "expected_rows": expected,
        "exactly_once": in_table == expected,
    }


def _median(samples: list[dict], key: str) -> float | None:
    values = [s[key] for s in samples if s.get(key) is not None]
    return statistics.median(values) if values else None


def landing_part(ctx: Context) -> dict:
    quick = ctx.settings.quick
    work = ctx.next_dir("group-day")
    day = build_day(work, quick)
    layout = day.built
    dates = ", ".join(f"{date}: {v['files']}" for date, v in layout["files_by_date"].items())
    print(
        f"    day built in {layout['seconds']:.0f} s: {day.rows:,} rows, {layout['live_files']} "
        f"live files ({dates}), {layout['log']['log_entries']:,} log entries",
        flush=True,
    )
    plan = plan_batches(day, quick)
    cpus = contestant_cpus()
    try:
        raw = alternate(
            ctx,
            [
                ("baseline", lambda: append_round(ctx, day, plan, cpus and cpus[0])),
                ("group", lambda: group_round(ctx, day, plan, cpus)),
                ("baseline-shared", lambda: append_round(ctx, day, plan, None)),
                ("group-shared", lambda: group_round(ctx, day, plan, None)),
            ],
            lambda s: s["rows_per_second"],
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    used = samples_used(raw)
    shared = {
        role: _median([s for s in used if s["role"] == role], "rows_per_second")
        for role in ("baseline-shared", "group-shared")
    }
    base = [s for s in used if s["role"] == "baseline"]
    group = [s for s in used if s["role"] == "group"]
    b_med, g_med = _median(base, "rows_per_second"), _median(group, "rows_per_second")
    paired = [
        g["rows_per_second"] / b["rows_per_second"]
        for b in base
        for g in group
        if g["round"] == b["round"]
    ]
    append_seconds = [x for s in base for x in s["commit_seconds"]]
    group_seconds = [x for s in group for m in s["members"].values() for x in m["commit_seconds"]]
    ratio = g_med / b_med if b_med else None
    exactly_once = all(s["exactly_once"] for s in raw)
    return {
        "day": layout,
        "setup": {
            "readers": READERS,
            "reads_per_reader_second": READS_PER_READER_SECOND,
            "batch_seconds": BATCH_SECONDS,
            "rows_per_batch": ROWS_PER_BATCH,
            "pass_every_batches": PASS_BATCHES[quick],
            "prelude_batches": plan.prelude,
            "window_batches": plan.window,
            "pass_after_batch": plan.pass_after,
            "redispatch_share": REDISPATCH_SHARE,
            "reads_received_twice_per_window": plan.copies,
            "members": list(MEMBERS),
            "day_tail_seconds": TAIL_SECONDS[quick],
            "day_bulk_batches_per_commit": BULK_BATCHES[quick],
            "table_properties": DAEMON_PROPERTIES,
            "bulk_table_properties": BULK_PROPERTIES,
        },
        "baseline": {
            "label": "one gateway, ArrowTableWriter append per batch",
            "samples": [s["rows_per_second"] for s in base],
            "median": b_med,
            "commit_ms_median": 1000 * statistics.median(append_seconds),
            "commit_ms_p99": 1000 * _quantile(append_seconds, 99),
            "pass_seconds_median": statistics.median(s["pass"]["seconds"] for s in base),
        },
        "group": {
            "label": "two GroupTableWriter members, insert-if-absent per batch",
            "samples": [s["rows_per_second"] for s in group],
            "median": g_med,
            "commit_ms_median": 1000 * statistics.median(group_seconds),
            "commit_ms_p99": 1000 * _quantile(group_seconds, 99),
            "files_read_per_landing_median": _median(group, "files_read_per_landing_median"),
            "files_read_per_landing_p99": _median(group, "files_read_per_landing_p99"),
            "files_read_per_landing_max": max(
                (s["files_read_per_landing_max"] or 0) for s in group
            ),
            "live_files_after_median": _median(group, "live_files_after"),
            "merges_retried_median": _median(group, "merges_retried"),
            "reads_already_landed_median": _median(group, "reads_already_landed"),
            "pass_seconds_median": statistics.median(
                s["pass"]["seconds"] for s in group if s.get("pass")
            ),
            "optimizes_lost": sum(s["pass"]["optimizes_lost"] for s in group if s.get("pass")),
        },
        "ratio": ratio,
        "paired_ratios": paired,
        "cpus": {"baseline": sorted(cpus[0]), "members": [sorted(c) for c in cpus]}
        if cpus is not None
        else "all (fewer than 2 vCPUs: nothing pinned)",
        "shared": {
            "label": "report only: the same pair, every process on the whole machine (the "
            "members share its vCPUs with each other)",
            "baseline_median": shared["baseline-shared"],
            "group_median": shared["group-shared"],
            "ratio": shared["group-shared"] / shared["baseline-shared"]
            if shared["baseline-shared"] and shared["group-shared"]
            else None,
        },
        "target": {
            "kind": "ratio_at_least",
            "value": LANDING_TARGET,
            "description": f"group rows/s >= {LANDING_TARGET:g}x the append's",
        },
        "exactly_once": exactly_once,
        "met": ratio is not None and ratio >= LANDING_TARGET and exactly_once,
        "rounds_used": sorted({s["round"] for s in used}),
        "rounds_disturbed": sorted({s["round"] for s in raw if s.get("round_disturbed")}),
        "raw": raw,
    }


# -- part 2: publish -> row latency ---------------------------------------------------------------


def group_sample(ctx: Context, workers: list[GatewayWorker], rate: float, seconds: float) -> dict:
    """Two daemons of one shared group on a fresh mosquitto; `rate` msg/s published for
    `seconds`; every row's latency, the batch told by `(landed_by, batch_id)`."""
    messages = sample_messages(rate, seconds)
    directory = ctx.next_dir("group-latency")
    seed = ctx.seed()
    tables = directory / "tables"
    landings = []
    for member, worker in zip(MEMBERS, workers, strict=True):
        config = member_config(member, tables)
        overrides = {
            **GROUP_ENV,
            "FXGATE__SOURCE__INSTANCE_ID": member,
            "FXGATE__SPARK__TABLES_DIR": str(tables),
        }
        landings.append(
            Landing(
                worker,
                overrides,
                config.identity.client_id,
                config.identity.subscriptions[0],
                # mosquitto deals the group's messages in strict turn: half each.
                messages // len(MEMBERS),
                directory / member,
            )
        )
    run = publish_and_land(
        directory, landings, tables, rate, messages, seconds, seed, keys=(LANDED_BY, BATCH_ID)
    )
    figures = landing_figures(run, landings)
    landed_by = read_table_arrow(tables, READS).column(LANDED_BY)
    shares = {
        counted["values"]: counted["counts"] for counted in pc.value_counts(landed_by).to_pylist()
    }
    shutil.rmtree(directory, ignore_errors=True)
    return {
        "config": "group",
        "load": TARGET_LOAD,
        "rate_requested": rate,
        "rows_landed_by": shares,
        **figures,
    }


def latency_part(ctx: Context) -> dict:
    quick = ctx.settings.quick
    top = ceiling(ctx)
    rate = TARGET_LOAD * top["messages_per_second"]
    seconds = SECONDS[quick]
    target = defaults()["linger_seconds"] + 2.0
    print(
        f"    ceiling {top['messages_per_second']:,.0f} msg/s; {TARGET_LOAD:.0%} = {rate:,.0f} "
        "msg/s",
        flush=True,
    )
    first = ctx.worker({})
    # The second member's worker: a process of its own, warmed up as ctx.worker warms one.
    second = GatewayWorker(ctx.next_dir("group-worker"), {})
    ctx.code_versions.add(machine.git_state()["product_commit"])
    try:
        fxgate_sample(
            ctx, second, qos=1, messages=4000, batch=1, overrides={}, label="warmup-group"
        )
        raw = alternate(
            ctx,
            [
                ("alone", lambda: sample(ctx, first, TARGET_LOAD, rate, seconds)),
                ("group", lambda: group_sample(ctx, [first, second], rate, seconds)),
            ],
            lambda s: 1000 * s["latency"]["p99"],
            rounds=1 if quick else ctx.settings.rounds,
        )
    finally:
        second.close()
    used = samples_used(raw)
    levels = {
        role: summarize_level(
            [s for s in used if s["role"] == role],
            "default" if role == "alone" else role,
            TARGET_LOAD,
            rate,
            target,
        )
        for role in LATENCY_ROLES
    }
    for role, level in levels.items():
        level["rows_landed_by"] = [
            s.get("rows_landed_by") for s in used if s["role"] == role and "rows_landed_by" in s
        ]
    return {
        "ceiling": top,
        "rate": rate,
        "seconds_per_sample": seconds,
        "alone": levels["alone"],
        "group": levels["group"],
        "target": {
            "kind": "p99_at_most",
            "value": target,
            "description": f"group p99 <= linger + 2 s = {target:g} s at {TARGET_LOAD:.0%} "
            "of the ingest ceiling",
        },
        "met": levels["group"]["met"],
        "rounds_used": sorted({s["round"] for s in used}),
        "rounds_disturbed": sorted({s["round"] for s in raw if s.get("round_disturbed")}),
        "raw": raw,
    }


# -- the benchmark ---------------------------------------------------------------------------------


def group_landing(ctx: Context) -> dict:
    landing = landing_part(ctx)
    try:
        latency = latency_part(ctx)
    except Exception as error:  # part 1 stands on its own; the table says part 2 failed
        log.exception("group-landing: the latency part failed")
        latency = {"error": f"{type(error).__name__}: {error}", "met": False}
    result = {
        "kind": "fxgate-bench",
        "module": "bench.group",
        "name": NAME,
        "title": "A shared group's landing: two members merging against one gateway appending",
        "unit": "rows/s",
        "method": __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
        "landing": landing,
        "latency": latency,
        "met": bool(landing["met"] and latency.get("met")),
        "raw": [
            *({**s, "part": "landing"} for s in landing["raw"]),
            *({**s, "part": "latency"} for s in latency.get("raw", [])),
        ],
    }
    for part in (landing, latency):
        part.pop("raw", None)
    result["headline"] = headline(result)
    result["bound"] = bound(result)
    return result


def _latency_text(latency: dict) -> str:
    if "error" in latency:
        return f"latency part failed: {latency['error']}"
    alone, group = latency["alone"], latency["group"]
    return (
        f"publish -> row at {TARGET_LOAD:.0%} ({latency['rate']:,.0f} msg/s) p50 / p99: alone "
        f"{alone['p50_median']:.2f} / {alone['p99_median']:.2f} s, group "
        f"{group['p50_median']:.2f} / {group['p99_median']:.2f} s (target p99 <= "
        f"{latency['target']['value']:g} s)" + _helpers_text(latency)
    )


def headline(result: dict) -> str:
    landing = result["landing"]
    base, group = landing["baseline"], landing["group"]
    return (
        f"after {_day_text(landing)}: append {base['median']:,.0f} rows/s, group of 2 "
        f"{group['median']:,.0f} rows/s = {landing['ratio']:.2f}x (target >= "
        f"{LANDING_TARGET:g}x); landing p50 / p99 {group['commit_ms_median']:.0f} / "
        f"{group['commit_ms_p99']:.0f} ms vs append {base['commit_ms_median']:.0f} / "
        f"{base['commit_ms_p99']:.0f} ms, {group['files_read_per_landing_median']} file(s) read "
        f"per landing (median), {group['merges_retried_median']:.0f} landings retried per "
        "window; " + _latency_text(result["latency"])
    )


def _day_text(landing: dict) -> str:
    day = landing["day"]
    hours = (day["batches"] * landing["setup"]["batch_seconds"]) / 3600
    return (
        f"a simulated {hours:g} h ({day['rows']:,} rows, {day['live_files']} live files, "
        f"{day['log']['log_entries']:,} log entries)"
    )


def bound(result: dict) -> str:
    landing = result["landing"]
    base, group = landing["baseline"], landing["group"]
    setup = landing["setup"]
    share = setup["rows_per_batch"] / len(setup["members"])
    text = (
        f"Each batch of {setup['rows_per_batch']} reads is one commit for the gateway alone "
        f"({base['commit_ms_median']:.1f} ms median, an append that reads nothing), and two "
        f"commits of about {share:.0f} reads each for the group: a landing took "
        f"{group['commit_ms_median']:.0f} ms median in write_batch ({group['commit_ms_p99']:.0f} "
        f"ms p99, retries included), reading the identities of "
        f"{group['files_read_per_landing_median']} data file(s) per landing (median; "
        f"{group['files_read_per_landing_max']} at most) of the "
        f"{group['live_files_after_median']} live ones, the rest skipped by their event-time "
        f"statistics; {group['merges_retried_median']:.0f} landings per window lost a commit "
        f"race and were made again. At those medians one gateway would land about "
        f"{setup['rows_per_batch'] / base['commit_ms_median'] * 1000:,.0f} rows/s and two "
        f"members side by side about {2 * share / group['commit_ms_median'] * 1000:,.0f}; "
        f"measured {base['median']:,.0f} and {group['median']:,.0f} (slow landings, retries and "
        f"the pass included). {_cpus_text(landing)}"
    )
    latency = result["latency"]
    if "error" not in latency:
        group_level = latency["group"]
        text += (
            f" At {TARGET_LOAD:.0%} of the ingest ceiling the group's members batched "
            f"{group_level['rows_per_batch_median'] or 0:,.0f} rows per batch "
            f"(writer's turn {group_level['job_seconds_median'] or 0:.2f} s median) against "
            f"{latency['alone']['rows_per_batch_median'] or 0:,.0f} "
            f"({latency['alone']['job_seconds_median'] or 0:.2f} s) alone."
        )
    return text


def _cpus_text(landing: dict) -> str:
    shared = landing["shared"]
    pinned = (
        "Each contestant was a process on one vCPU of its own (the gateway alone on "
        f"{landing['cpus']['baseline']}, the members on {landing['cpus']['members']}), as a "
        "gateway of its own gives each member in service; they shared the disk."
        if isinstance(landing["cpus"], dict)
        else f"Nothing was pinned: {landing['cpus']}."
    )
    if shared["ratio"] is None:
        return pinned
    return (
        f"{pinned} With every process on the whole machine (the members sharing its "
        f"{os.cpu_count()} vCPUs with each other; report only): append "
        f"{shared['baseline_median']:,.0f}, group {shared['group_median']:,.0f} rows/s, "
        f"{shared['ratio']:.2f}x."
    )


def rows(result: dict) -> list[list[str]]:
    landing = result["landing"]
    base, group = landing["baseline"], landing["group"]
    setup = landing["setup"]
    out = [
        [
            f"`{NAME}` rows/s",
            f"after {_day_text(landing)} at the {setup['batch_seconds']:g} s batch window "
            f"({setup['rows_per_batch']} reads a batch): the next {setup['window_batches']} "
            f"batches with a maintenance pass among them, each process on one vCPU; baseline: "
            f"one gateway appending; fxgate: 2 members landing insert-if-absent on "
            f"`message_id`, "
            f"{100 * setup['redispatch_share']:g} % of the reads received by both; landing "
            f"p50 / p99 {group['commit_ms_median']:.0f} / {group['commit_ms_p99']:.0f} ms, "
            f"{group['files_read_per_landing_median']} file(s) read per landing, "
            f"{group['merges_retried_median']:.0f} landings retried",
            f"{base['median']:,.0f} rows/s (append)",
            f"{group['median']:,.0f} rows/s (group of 2)",
            f"{landing['ratio']:.2f}\u00d7",
            f"≥ {LANDING_TARGET:g}\u00d7",
            "yes" if landing["met"] else "**no**",
            f"{len(group['samples'])}+{len(base['samples'])}",
        ]
    ]
    latency = result["latency"]
    if "error" in latency:
        out.append(
            [
                f"`{NAME}` latency",
                f"publish → row, group of 2 vs one gateway: {latency['error']}",
                "—",
                "—",
                "—",
                "p99 ≤ 3 s",
                "**no**",
                "0",
            ]
        )
        return out
    alone, grouped = latency["alone"], latency["group"]
    out.append(
        [
            f"`{NAME}` latency",
            f"publish → row visible, QoS 1 single reads at {TARGET_LOAD:.0%} of the ingest "
            f"ceiling ({latency['ceiling']['messages_per_second']:,.0f} msg/s): "
            f"{latency['rate']:,.0f} msg/s asked; baseline: one gateway; fxgate: 2 daemons of "
            "one shared group on the same 2 vCPUs, one table"
            + _helpers_text(latency)
            + "; p50 / p99",
            f"{alone['p50_median']:.2f} s / {alone['p99_median']:.2f} s",
            f"{grouped['p50_median']:.2f} s / {grouped['p99_median']:.2f} s",
            "—",
            f"p99 ≤ {latency['target']['value']:g} s",
            "yes" if latency["met"] else "**no**",
            f"{grouped['samples']}+{alone['samples']}",
        ]
    )
    return out


def _helpers_text(latency: dict) -> str:
    """The report-only group with a parse helper per daemon, in results from before issue 36
    (which removed the parse worker and its helpers; their group ran with `parse_helpers = 0`)."""
    helpers = latency.get("group_helpers")
    if helpers is None:
        return ""
    return (
        f" (parse_helpers = 0; with the default helper each: p99 {helpers['p99_median']:.2f} s, "
        "report only)"
    )


def plot(results_dir: Path, result: dict) -> Path:
    import matplotlib.pyplot as plt

    path = results_dir / f"{result['name']}.png"
    fig, (landed, latency) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=110)
    styles = {
        "baseline": ("tab:blue", "o", "one gateway, append"),
        "group": ("tab:orange", "s", "group of 2, insert-if-absent"),
    }
    used = set(result["landing"].get("rounds_used") or [])
    for role, (color, marker, label) in styles.items():
        samples = [s for s in result["raw"] if s["part"] == "landing" and s["role"] == role]
        for kept, face, text in ((True, color, label), (False, "none", f"{label}: not in median")):
            mine = [s for s in samples if (s["round"] in used) == kept]
            if mine:
                landed.plot(
                    [s["order"] for s in mine],
                    [s["rows_per_second"] for s in mine],
                    marker,
                    color=color,
                    markerfacecolor=face,
                    label=text,
                )
    landed.set_xlabel("sample, in run order")
    landed.set_ylabel("rows/s landed")
    landed.set_ylim(bottom=0)
    landed.grid(alpha=0.3)
    landed.legend(fontsize=7)
    colors = {"alone": "tab:blue", "group": "tab:orange", "group-helpers": "tab:gray"}
    labelled: set[str] = set()
    for s in result["raw"]:
        if s["part"] != "latency" or not s.get("latency_quantiles"):
            continue
        role = s["role"]
        latency.plot(
            s["latency_quantiles"],
            [q / 100 for q in QUANTILES],
            color=colors[role],
            linewidth=1,
            linestyle=":" if role == "group-helpers" else "-",
            label=None if role in labelled else role,
        )
        labelled.add(role)
    if "target" in result["latency"]:
        value = result["latency"]["target"]["value"]
        latency.axvline(value, color="black", linestyle=":", linewidth=0.8, label=f"{value:g} s")
    latency.axhline(0.99, color="gray", linewidth=0.5)
    latency.set_xlabel("publish → visible in the table (s)")
    latency.set_ylabel("fraction of reads")
    latency.set_ylim(0, 1.01)
    latency.set_xlim(0, None)
    latency.grid(alpha=0.3)
    latency.legend(fontsize=7, loc="lower right")
    fig.suptitle(result["headline"], fontsize=7, wrap=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, group_landing, False),)
