"""The Delta log over a month (DESIGN §7): opening a table that commits every second, with the
log cleaned up as the daemon cleans it, against the same table without the clean-up.

A table at the default 1 s batch window commits about 54,000 times a day (bench/compaction.py
says why), about 1.6 million times a month. The claim: with a checkpoint every
`checkpoint_interval` (10) commits and the log clean-up (commits older than
`log_retention_hours`, 1 h by default, go at a pass), opening the table reads one checkpoint plus
at most `checkpoint_interval` JSON commits and lists a log of bounded size (an hour of commits:
about 2,250 JSON files at the default window), however old the table is; without the clean-up
the log directory keeps every commit, and every open lists it (delta-rs lists the whole
directory of a local log: its open time grows with the entries, below).

One run makes `COMMITS` real commits (small batches of `ROWS_PER_COMMIT` reads) with
spark.tables.ArrowTableWriter, as the daemon's writer makes them, each with its transaction id,
spread over a simulated 30 days (batch N is read at `MONTH_START + N * 30 days / COMMITS`, so
the table has a date partition per day), with a spark.maintenance.DeltaMaintainer pass every
`PASS_EVERY` commits (the commits of the default `interval_seconds`, 300 s, at the 1 s window)
whose "now" is the simulated time. `COMMITS` stands for the month: each commit is
1.6 million / `COMMITS` of the real ones.

The clock, honestly. The log clean-up deletes the log entries older than the retention by their
files' modification times; so before each pass every log entry's modification time is set to
now minus its simulated age (os.utime), and the clean-up deletes what a month would have deleted
by then. delta-rs also cleans the log at each checkpoint it writes while appending
(`delta.enableExpiredLogCleanup`); here that is off and the pass alone cleans, so the log holds up
to `PASS_EVERY` more commits than the daemon's would. What the bench cannot move is the clock
delta-rs stamps removals with: a compaction's tombstones stay in every checkpoint for
`deletedFileRetentionDuration` (24 h) of real time, so in a few minutes' run every file it
compacted would stay in every checkpoint (30 simulated days' worth instead of one); here the
tombstones and the VACUUM retention are 0, so they go at the next pass. A real table's
checkpoint also carries the last day's tombstones (about a day's batch files), which
`compaction-day`'s "after" reads.

"Without clean-up" is the same table with every log entry the clean-up deleted: each entry is
hard-linked aside before each pass, and at each measuring point the table is copied (hard links)
with them put back: the same commits, checkpoints, compactions and data files; only the log's
clean-up left out. At N/4, N/2 and N (right after that pass), for both, alternately:
- `DeltaTable(path)`: a fresh open (`OPEN_RUNS` runs);
- `update_incremental()` of a table opened before one more commit (`UPDATE_RUNS` commits): what
  a reader that keeps the table open pays per new commit, and what the daemon's writer pays
  before every append (ArrowTableWriter brings its open table up to date that way);
- a count from a fresh open (`to_pyarrow_dataset().count_rows()`);
- the log's entries (JSON commits, checkpoints) and the live data files.
Target: with the clean-up, opening at N takes at most `GROWTH_TARGET` times what it took at N/4.
The open and update times against the log's entries (least squares over every point) are
projected to the log a real table keeps with the clean-up, which a month of N commits here cannot
reach, or exceeds: `log_retention_hours` of commits (REAL_LOG_ENTRIES). `--quick` makes
fewer commits (`COMMITS[True]`).
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from actors.config.schema import CompactionConfig, SparkConfig
from bench.benchmarks import Benchmark, Context
from bench.compaction import DAY_BATCHES, reads_rows
from spark.tables import READS, application_id, table_path, table_properties

log = logging.getLogger(__name__)

NAME = "delta-month"
MONTH_DAYS = 30
MONTH_COMMITS = DAY_BATCHES * MONTH_DAYS  # ~1.6 million commits per table
_COMPACTION = CompactionConfig()
# The daemon's pass every interval_seconds, between batches that come every batch_max_seconds.
PASS_EVERY = round(_COMPACTION.interval_seconds / SparkConfig().batch_max_seconds)
# Multiples of 4 * PASS_EVERY, so that N/4, N/2 and N each come right after a pass.
COMMITS = {False: 7_200, True: 1_200}
ROWS_PER_COMMIT = 40
OPEN_RUNS = 11
UPDATE_RUNS = 3
COUNT_RUNS = 3
GROWTH_TARGET = 1.5
MONTH_START = datetime(2026, 10, 1, tzinfo=UTC).timestamp()
APP_ID = application_id("bench-month")
# The daemon's table properties but for the two clocks the bench cannot move (see above).
PROPERTIES = {
    **table_properties(
        checkpoint_interval=_COMPACTION.checkpoint_interval,
        log_retention_hours=_COMPACTION.log_retention_hours,
        deleted_file_retention_hours=0,
    ),
    "delta.enableExpiredLogCleanup": "false",
}
# What a real table keeps with the clean-up: log_retention_hours of commits at DAY_BATCHES a day.
REAL_LOG_ENTRIES = round(DAY_BATCHES * _COMPACTION.log_retention_hours / 24)


def _version(name: str) -> int | None:
    """The version of a log entry (`NNNNNNNNNNNNNNNNNNNN.json`, `....checkpoint.parquet`)."""
    head = name[:20]
    return int(head) if len(name) > 20 and head.isdigit() and name[20] == "." else None


class SimulatedLog:
    """The simulated time of every version of one table, the log's modification times set from
    it, and every log entry hard-linked aside before a clean-up can delete it."""

    def __init__(self, log_dir: Path, aside: Path) -> None:
        self._log_dir = log_dir
        self._aside = aside
        self._aside.mkdir(parents=True, exist_ok=True)
        self.version = 0  # the table is created (version 0) by the first write
        self._at = {0: MONTH_START}

    def committed(self, at: float, commits: int = 1) -> None:
        for _ in range(commits):
            self.version += 1
            self._at[self.version] = at

    def maintained(self, version: int | None, at: float) -> None:
        """A pass left the table at `version`: its commits (OPTIMIZE) are at `at`."""
        if version is None or version < self.version:
            raise RuntimeError(
                f"table at version {version} after a pass, expected >= {self.version}"
            )
        self.committed(at, version - self.version)

    def set_aside(self) -> None:
        """Hard-link the log's entries not yet set aside."""
        have = set(os.listdir(self._aside))
        for entry in os.scandir(self._log_dir):
            if entry.name not in have and _version(entry.name) is not None:
                os.link(entry.path, self._aside / entry.name)

    def stamp(self, now: float) -> None:
        """Modification time of each entry = this moment minus its simulated age at `now`."""
        real = time.time()
        for entry in os.scandir(self._log_dir):
            version = _version(entry.name)
            if version is None:
                continue
            if version not in self._at:
                raise RuntimeError(f"log entry {entry.name} of a version the bench did not count")
            stamp = real - (now - self._at[version])
            os.utime(entry.path, (stamp, stamp))

    def copy_without_cleanup(self, table_dir: Path, target: Path) -> None:
        """`table_dir` hard-linked into `target`, with every log entry the clean-up deleted."""
        for root, _dirs, files in os.walk(table_dir):
            here = target / Path(root).relative_to(table_dir)
            here.mkdir(parents=True, exist_ok=True)
            for name in files:
                os.link(Path(root) / name, here / name)
        log_dir = target / "_delta_log"
        for entry in os.scandir(self._aside):
            if not (log_dir / entry.name).exists():
                os.link(entry.path, log_dir / entry.name)


def month_rows(batch: int, at: float, rng) -> pa.Table:
    """Batch `batch`'s reads, read at simulated time `at`."""
    from spark.maintenance import utc_date

    seq = np.arange((batch - 1) * ROWS_PER_COMMIT + 1, batch * ROWS_PER_COMMIT + 1, dtype=np.int64)
    micros = int(at * 1e6) + np.arange(ROWS_PER_COMMIT, dtype=np.int64) * 1_000
    return reads_rows(
        seq, np.full(ROWS_PER_COMMIT, batch, dtype=np.int64), micros, utc_date(at), rng
    )


def log_entries(table_dir: Path) -> dict:
    log_dir = table_dir / "_delta_log"
    names = os.listdir(log_dir)
    return {
        "log_entries": len(names),
        "log_bytes": sum((log_dir / n).stat().st_size for n in names),
        "json_commits": sum(1 for n in names if n.endswith(".json")),
        "checkpoints": sum(1 for n in names if ".checkpoint." in n),
    }


def _timed(call) -> tuple[float, object]:
    started = time.perf_counter()
    value = call()
    return time.perf_counter() - started, value


def delta_month(ctx: Context) -> dict:
    from deltalake import DeltaTable

    from spark.maintenance import DeltaMaintainer
    from spark.tables import ArrowTableWriter

    commits = COMMITS[ctx.settings.quick]
    points = (commits // 4, commits // 2, commits)
    step = MONTH_DAYS * 86_400 / commits  # simulated seconds per commit
    work = ctx.settings.work_dir / "delta-month"
    shutil.rmtree(work, ignore_errors=True)
    tables = work / "tables"
    table_dir = Path(table_path(tables, READS))
    clock = SimulatedLog(table_dir / "_delta_log", work / "log-set-aside")
    writer = ArrowTableWriter(None, tables, APP_ID, properties=PROPERTIES)
    maintainer = DeltaMaintainer(tables, tables=(READS,), vacuum_retention_hours=0)
    rng = np.random.default_rng(31)
    appends: list[tuple[int, float]] = []
    passes: list[dict] = []
    measured: list[dict] = []
    batch = 0
    began = time.perf_counter()

    def append() -> tuple[int, pa.Table]:
        nonlocal batch
        batch += 1
        at = MONTH_START + batch * step
        rows = month_rows(batch, at, rng)
        seconds, _ = _timed(lambda: writer.write_batch(batch, {READS: rows}))
        clock.committed(at)
        appends.append((batch, seconds))
        return batch, rows

    def maintain() -> None:
        at = MONTH_START + batch * step
        clock.set_aside()
        clock.stamp(at)
        outcome = maintainer.run(at)
        clock.maintained(outcome.tables[0].version, at)
        done = outcome.tables[0]
        passes.append(
            {
                "after_commit": batch,
                "seconds": round(outcome.seconds, 3),
                "files_compacted": done.files_removed,
                "files_vacuumed": done.files_vacuumed,
                "log_entries": log_entries(table_dir)["log_entries"],
            }
        )

    def measure_point() -> dict:
        at_commit = batch
        copy_tables = work / f"no-cleanup-{batch}"
        copy_dir = Path(table_path(copy_tables, READS))
        clock.copy_without_cleanup(table_dir, copy_dir)
        variants = {"maintained": table_dir, "no_log_cleanup": copy_dir}
        found = {name: {**log_entries(path), "open_seconds": []} for name, path in variants.items()}
        for path in variants.values():  # not measured: one-time costs fall on neither variant
            DeltaTable(str(path)).to_pyarrow_dataset().count_rows()
        for _ in range(OPEN_RUNS):
            for name, path in variants.items():
                found[name]["open_seconds"].append(_timed(lambda p=path: DeltaTable(str(p)))[0])
        for name in variants:
            found[name]["count_seconds"] = []
        for _ in range(COUNT_RUNS):
            for name, path in variants.items():
                seconds, rows = _timed(
                    lambda p=path: DeltaTable(str(p)).to_pyarrow_dataset().count_rows()
                )
                found[name]["count_seconds"].append(seconds)
                found[name]["rows"] = rows
        for name, path in variants.items():
            found[name]["live_files"] = len(DeltaTable(str(path)).file_uris())
            found[name]["update_seconds"] = []
        # One more commit each: the same batch into the table and into its copy.
        copy_writer = ArrowTableWriter(None, copy_tables, APP_ID, properties=PROPERTIES)
        try:
            for _ in range(UPDATE_RUNS):
                observers = {name: DeltaTable(str(path)) for name, path in variants.items()}
                number, rows = append()
                copy_writer.write_batch(number, {READS: rows})
                for name, observer in observers.items():
                    found[name]["update_seconds"].append(_timed(observer.update_incremental)[0])
                del observers
        finally:
            copy_writer.close()
        shutil.rmtree(copy_tables, ignore_errors=True)
        for values in found.values():
            for key in ("open_seconds", "count_seconds", "update_seconds"):
                values[key] = [round(v, 5) for v in values[key]]
                values[key.replace("_seconds", "_median")] = statistics.median(values[key])
        return {
            "commits": at_commit,
            "simulated_day": round(at_commit * step / 86_400, 2),
            **found,
        }

    try:
        while batch < commits:
            append()
            if batch % PASS_EVERY == 0:
                maintain()
                if batch in points:
                    measured.append(measure_point())
                    m, c = measured[-1]["maintained"], measured[-1]["no_log_cleanup"]
                    print(
                        f"    {batch:>7,} commits ({time.perf_counter() - began:.0f} s): open "
                        f"{1000 * m['open_median']:.1f} ms with clean-up ({m['log_entries']} "
                        f"log entries), {1000 * c['open_median']:.1f} ms without "
                        f"({c['log_entries']})",
                        flush=True,
                    )
    finally:
        writer.close()
        gc.collect()
    seconds = time.perf_counter() - began
    shutil.rmtree(work, ignore_errors=True)
    return summarize(commits, step, measured, appends, passes, seconds)


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares: seconds = intercept + slope * log entries."""
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def summarize(commits, step, measured, appends, passes, seconds) -> dict:
    first, last = measured[0], measured[-1]
    growth = {
        name: round(last[name]["open_median"] / first[name]["open_median"], 3)
        for name in ("maintained", "no_log_cleanup")
    }
    projection = {
        "what": "least squares over every point of seconds on log entries, taken to the log a "
        f"real table keeps with the clean-up: {_COMPACTION.log_retention_hours:g} h of commits "
        f"at {DAY_BATCHES:,} a day (projected, not measured; null where no growth was measured)",
        "log_entries": REAL_LOG_ENTRIES,
    }
    for kind in ("open", "update"):
        intercept, slope = _fit(
            [
                (p[name]["log_entries"], p[name][f"{kind}_median"])
                for p in measured
                for name in growth
            ]
        )
        projection[kind] = {
            "intercept_ms": round(1000 * intercept, 3),
            "ms_per_1000_log_entries": round(1e6 * slope, 3),
            "ms": round(1000 * (intercept + slope * REAL_LOG_ENTRIES), 1) if slope > 0 else None,
        }
    quarter = max(1, len(appends) // 4)
    append_ms = [
        round(1000 * statistics.median(s for _, s in appends[i : i + quarter]), 2)
        for i in range(0, quarter * 4, quarter)
    ]
    pass_seconds = [p["seconds"] for p in passes]
    met = growth["maintained"] <= GROWTH_TARGET and all(
        p["maintained"]["rows"] == p["no_log_cleanup"]["rows"] for p in measured
    )
    opens = {
        name: " / ".join(f"{1000 * p[name]['open_median']:.1f}" for p in measured)
        for name in growth
    }
    return {
        "kind": "fxgate-bench",
        "module": "bench.delta_log",
        "name": NAME,
        "title": "a month of Delta commits: opening the table with and without log clean-up",
        "unit": "ms",
        "setup": {
            "commits": commits,
            "month_commits_per_table": MONTH_COMMITS,
            "commit_stands_for": round(MONTH_COMMITS / commits),
            "simulated_seconds_per_commit": round(step, 1),
            "rows_per_commit": ROWS_PER_COMMIT,
            "pass_every_commits": PASS_EVERY,
            "table_properties": PROPERTIES,
            "vacuum_retention_hours": 0,
            "writer": "spark.tables.ArrowTableWriter (one commit per batch, transaction id)",
            "maintenance": "spark.maintenance.DeltaMaintainer.run(simulated now) every "
            f"{PASS_EVERY} commits: OPTIMIZE, VACUUM, checkpoint, log clean-up",
            "clock": "before each pass every log entry's mtime = now - its simulated age "
            "(os.utime); delta-rs's own clean-up at its checkpoints off, the pass cleans; "
            "tombstone and VACUUM retention 0 (delta-rs stamps removals with the real clock)",
            "no_log_cleanup": "the same table, hard-linked, with every log entry the clean-up "
            "deleted put back",
            "open": f"DeltaTable(path), median of {OPEN_RUNS}, alternating with the copy",
            "update": f"update_incremental() of a table opened before one more commit, "
            f"{UPDATE_RUNS} commits",
            "count": f"DeltaTable(path).to_pyarrow_dataset().count_rows(), median of {COUNT_RUNS}",
        },
        "points": measured,
        "growth": growth,
        "projection": projection,
        "appends": {
            "median_ms_by_quarter": append_ms,
            "max_ms": round(1000 * max(s for _, s in appends), 1),
            "count": len(appends),
        },
        "passes": {
            "count": len(passes),
            "median_seconds": statistics.median(pass_seconds) if pass_seconds else None,
            "max_seconds": max(pass_seconds) if pass_seconds else None,
            "all": passes,
        },
        "run_seconds": round(seconds, 1),
        "target": {
            "kind": "growth_at_most",
            "value": GROWTH_TARGET,
            "description": f"with the clean-up, open at N <= {GROWTH_TARGET:g}x open at N/4",
        },
        "met": met,
        "headline": (
            f"{commits:,} commits (1/{MONTH_COMMITS / commits:.0f} of a month), open at "
            f"N/4, N/2, N: {opens['maintained']} ms with the clean-up "
            f"({last['maintained']['log_entries']} log entries at N), {opens['no_log_cleanup']} "
            f"ms without ({last['no_log_cleanup']['log_entries']}); {_projected(projection)}"
        ),
    }


def _projected(projection: dict) -> str:
    ms = {step: projection[step]["ms"] for step in ("open", "update")}
    if ms["open"] is None:
        return "no growth with the log's entries measured"
    update = "" if ms["update"] is None else f", update_incremental {ms['update']:.0f} ms"
    return (
        f"projected for a {projection['log_entries']:,}-entry log "
        f"({_COMPACTION.log_retention_hours:g} h): open {ms['open']:.0f} ms" + update
    )


def rows(result: dict) -> list[list[str]]:
    setup, points = result["setup"], result["points"]
    opens = {
        name: " / ".join(f"{1000 * p[name]['open_median']:.1f}" for p in points)
        for name in ("maintained", "no_log_cleanup")
    }
    last = points[-1]
    return [
        [
            "`delta-month`",
            f"{setup['commits']:,} ArrowTableWriter commits over a simulated month (each for "
            f"{setup['commit_stands_for']:,} of a month's {setup['month_commits_per_table']:,}), "
            f"a maintenance pass every {setup['pass_every_commits']} commits: fresh DeltaTable "
            "open at N/4 / N/2 / N; baseline: the same table without log clean-up "
            f"({last['no_log_cleanup']['log_entries']:,} vs "
            f"{last['maintained']['log_entries']:,} log entries at N; "
            f"{_projected(result['projection'])})",
            f"{opens['no_log_cleanup']} ms (no log clean-up)",
            f"{opens['maintained']} ms",
            f"{result['growth']['maintained']:.2f}\u00d7 (N vs N/4)",
            f"≤ {result['target']['value']:g}\u00d7 from N/4 to N",
            "yes" if result["met"] else "**no**",
            f"{sum(len(p['maintained']['open_seconds']) for p in points)}+"
            f"{sum(len(p['no_log_cleanup']['open_seconds']) for p in points)}",
        ]
    ]


def plot(results_dir: Path, result: dict) -> Path:
    import matplotlib.pyplot as plt

    path = results_dir / f"{result['name']}.png"
    fig, (opened, entries) = plt.subplots(1, 2, figsize=(10, 4.6), dpi=110)
    styles = {
        "maintained": ("tab:green", "with clean-up"),
        "no_log_cleanup": ("tab:red", "without"),
    }
    for name, (color, label) in styles.items():
        x = [p["commits"] for p in result["points"]]
        for p in result["points"]:
            opened.plot(
                [p["commits"]] * len(p[name]["open_seconds"]),
                [1000 * s for s in p[name]["open_seconds"]],
                ".",
                color=color,
                alpha=0.4,
            )
        opened.plot(
            x,
            [1000 * p[name]["open_median"] for p in result["points"]],
            "o-",
            color=color,
            label=label,
        )
        entries.plot(
            x, [p[name]["log_entries"] for p in result["points"]], "o-", color=color, label=label
        )
    opened.set_xlabel("commits")
    opened.set_ylabel("DeltaTable(path) open, ms")
    opened.set_ylim(bottom=0)
    entries.set_xlabel("commits")
    entries.set_ylabel("entries in _delta_log")
    for ax in (opened, entries):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(result["headline"], fontsize=7, wrap=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, delta_month, False),)
