"""Compaction (issue 15): a day of landing, read by Spark before and after a compaction pass.

A day at a 2 s batch window (`batch_max_seconds`, the default until issue 16 made it 1 s: then
about 53,000-62,000, README "Benchmarks"), reads flowing, is about 36,000 batch partitions per
table (the issue's measured figure; 43,200 if every batch waited the full 2 s), at
about 400 rows each (the issue's 5,000 partitions held 2 million rows). Landing them through Spark
costs 0.25 s a batch, 2.5 hours for a day, so the batches are written the way Spark's job commit
leaves them -- one `date=D/batch_id=N/part-00000.parquet` per batch, the partition columns in the
path, the `reads` columns of spark/schema.py in the file -- straight with pyarrow. The real writer
writes one file per Spark task that held rows of the date (up to 2 on `local[2]`), so this is
the kinder case for "before". On this 2-vCPU machine, shared with others, a whole day takes too
long to read even once "before" (the issue measured 18-27 s for 5,000 partitions), so the day is
scaled: `SCALE` of its batches, the same rows per batch; the JSON and the table say the scale.

Then, in one Spark session with the daemon's settings (`local[2]`, 512m driver):
- "before": `spark.read.parquet(<table>)`, a count and a filtered count (antenna 2, peak RSSI
  above -60 dBm), each run timed from the read (listing included) to the last result;
- the pass: `Compactor.run` over the day, as the daemon runs it (its own time);
- "after": the same query on the compacted table, alternating with the same query on one
  Parquet file holding the same rows (the reference the target is stated against).
Target: after at most twice one file (medians of `RUNS` runs each).
"""

from __future__ import annotations

import logging
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.benchmarks import Benchmark, Context

log = logging.getLogger(__name__)

DAY_BATCHES = 36_000
ROWS_PER_BATCH = 400
SCALE = 1  # the whole day: 36,000 partitions
QUICK_SCALE = 1 / 40
RUNS = 3
TARGET_RATIO = 2.0
DATE = "2026-11-23"
DAY_START_US = 1_795_392_000_000_000  # 2026-11-23T00:00:00Z


def day_rows(batches: int, rows_per_batch: int, seed: int = 15) -> pa.Table:
    """The reads of `batches` batches of `rows_per_batch`, with the writer's columns."""
    from spark.schema import READS_SCHEMA

    rng = np.random.default_rng(seed)
    n = batches * rows_per_batch
    seq = np.arange(1, n + 1, dtype=np.int64)
    micros = DAY_START_US + (seq * (86_400_000_000 // max(n, 1))).astype(np.int64)
    tags = rng.integers(0, 5_000, n)
    readers = rng.integers(1, 5, n)
    columns = {
        "message_id": pa.array([f"k{s}:0" for s in seq.tolist()]),
        "topic": pa.array([f"zebra/fx/fx9600-0{r}/reads" for r in readers.tolist()]),
        "reader_id": pa.array([f"fx9600-0{r}" for r in readers.tolist()]),
        "epc": pa.array([f"e28011606000020{t:09x}" for t in tags.tolist()]),
        "antenna": pa.array(rng.integers(1, 5, n).astype(np.int32)),
        "peak_rssi": pa.array(rng.integers(-80, -35, n).astype(np.float64)),
        "channel": pa.array(rng.choice([902.75, 915.25, 927.25], n)),
        "phase": pa.array(rng.uniform(0, 180, n)),
        "event_num": pa.array(seq),
        "event_time": pa.array(micros, pa.timestamp("us", tz="UTC")),
        "received_time": pa.array(micros + 150_000, pa.timestamp("us", tz="UTC")),
        "qos": pa.array(np.ones(n, dtype=np.int8)),
        "pack_id": pa.array(seq // 200 + 1),
        "batch_id": pa.array(seq // rows_per_batch + 1),  # dropped below: it is the path
        "date": pa.array([DATE] * n),
        "seq": pa.array(seq),
    }
    # The FX9600 fields a plain inventory read does not carry stay null.
    arrays = [
        columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in READS_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=READS_SCHEMA)


def land(table_dir: Path, rows: pa.Table, batches: int, rows_per_batch: int) -> float:
    """One `batch_id=N` partition per batch, as the writer's job commit leaves them."""
    started = time.perf_counter()
    body = rows.drop_columns(["date", "batch_id"])
    for index in range(batches):
        directory = table_dir / f"date={DATE}" / f"batch_id={index + 1}"
        directory.mkdir(parents=True)
        pq.write_table(
            body.slice(index * rows_per_batch, rows_per_batch), directory / "part-00000.parquet"
        )
    return time.perf_counter() - started


def count_and_filter(session, table_dir: Path) -> tuple[float, int, int]:
    """Seconds from the read (listing included) to both counts, and the counts."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    df = session.read.parquet(f"file://{table_dir}")
    total = df.count()
    strong = df.filter((F.col("antenna") == 2) & (F.col("peak_rssi") > -60)).count()
    return time.perf_counter() - started, total, strong


def compaction_day(ctx: Context) -> dict:
    from spark.compaction import Compactor
    from spark.session import build_session, stop_session

    scale = QUICK_SCALE if ctx.settings.quick else SCALE
    batches = round(DAY_BATCHES * scale)
    work = ctx.settings.work_dir / "compaction"
    shutil.rmtree(work, ignore_errors=True)
    tables, single = work / "tables", work / "single"
    rows = day_rows(batches, ROWS_PER_BATCH)
    landing_seconds = land(tables / "reads", rows, batches, ROWS_PER_BATCH)
    one = single / "reads" / f"date={DATE}" / "batch_id=1"
    one.mkdir(parents=True)
    pq.write_table(rows.drop_columns(["date", "batch_id"]), one / "part-00000.parquet")
    files_before = len(list((tables / "reads").glob("date=*/batch_id=*/*.parquet")))
    bytes_before = sum(p.stat().st_size for p in (tables / "reads").rglob("*.parquet"))
    print(
        f"   landed {batches:,} batch partitions ({rows.num_rows:,} rows, "
        f"{bytes_before / 1e6:.0f} MB) in {landing_seconds:.0f} s",
        flush=True,
    )

    session = build_session("local[2]", work / "spark", driver_memory="512m")
    try:
        count_and_filter(session, single / "reads")  # warm the JVM (first job 3-5 s more)
        before = [count_and_filter(session, tables / "reads") for _ in range(RUNS)]
        print(f"   before: {[round(b[0], 2) for b in before]} s", flush=True)
        compactor = Compactor(session, tables, grace_seconds=0)
        started = time.perf_counter()
        result = compactor.run(closed_before=None)
        pass_seconds = time.perf_counter() - started
        print(f"   pass: {pass_seconds:.1f} s: {result.summary()}", flush=True)
        after, reference = [], []
        for _ in range(RUNS):
            after.append(count_and_filter(session, tables / "reads"))
            reference.append(count_and_filter(session, single / "reads"))
    finally:
        stop_session(session)
    counts = {(b[1], b[2]) for b in before + after + reference}
    files_after = len(list((tables / "reads").glob("date=*/batch_id=*/*.parquet")))
    bytes_after = sum(
        p.stat().st_size for p in (tables / "reads").glob("date=*/batch_id=*/*.parquet")
    )
    before_median = statistics.median(b[0] for b in before)
    after_median = statistics.median(a[0] for a in after)
    reference_median = statistics.median(r[0] for r in reference)
    ratio = after_median / reference_median
    share = _share({"scale": scale, "day_batches_per_table": DAY_BATCHES})
    shutil.rmtree(work, ignore_errors=True)
    return {
        "kind": "fxgate-bench",
        "module": "bench.compaction",
        "name": "compaction-day",
        "title": "a day of batch partitions, Spark count-and-filter before/after compaction",
        "unit": "s",
        "setup": {
            "day_batches_per_table": DAY_BATCHES,
            "scale": scale,
            "batches": batches,
            "rows_per_batch": ROWS_PER_BATCH,
            "rows": rows.num_rows,
            "files_before": files_before,
            "bytes_before": bytes_before,
            "files_after": files_after,
            "bytes_after": bytes_after,
            "landing_seconds": round(landing_seconds, 1),
            "spark": "local[2], 512m driver (the daemon's defaults)",
            "query": "count(*) and count(*) WHERE antenna = 2 AND peak_rssi > -60, from "
            "spark.read.parquet (listing included)",
        },
        "before_seconds": [round(b[0], 3) for b in before],
        "after_seconds": [round(a[0], 3) for a in after],
        "one_file_seconds": [round(r[0], 3) for r in reference],
        "before_median": round(before_median, 3),
        "after_median": round(after_median, 3),
        "one_file_median": round(reference_median, 3),
        "pass_seconds": round(pass_seconds, 2),
        "pass": result.summary(),
        "counts_agree": len(counts) == 1,
        "counts": sorted(counts),
        "ratio": round(ratio, 3),
        "speedup": round(before_median / after_median, 1),
        "target": {"kind": "ratio_at_most", "value": TARGET_RATIO},
        "met": ratio <= TARGET_RATIO and len(counts) == 1,
        "headline": (
            f"{batches:,} partitions ({share}): before {before_median:.2f} s, after "
            f"{after_median:.2f} s, one file {reference_median:.2f} s (after/one file "
            f"{ratio:.2f}); the pass {pass_seconds:.1f} s"
        ),
    }


def _share(setup: dict) -> str:
    if setup["scale"] == 1:
        return "a whole day at a 2 s batch window"
    return f"{setup['scale']:g} of a day's {setup['day_batches_per_table']:,}"


def rows(result: dict) -> list[list[str]]:
    setup = result["setup"]
    return [
        [
            "`compaction-day`",
            f"{setup['batches']:,} batch partitions of {setup['rows_per_batch']} reads "
            f"({_share(setup)}; {setup['rows']:,} rows): Spark count + filtered count, listing "
            "included, before "
            f"→ after a compaction pass ({setup['files_before']:,} → {setup['files_after']} "
            f"file(s)); baseline: the same rows in one file",
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
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    groups = [
        ("before", result["before_seconds"], "tab:red"),
        ("after", result["after_seconds"], "tab:green"),
        ("one file", result["one_file_seconds"], "tab:blue"),
    ]
    for index, (label, values, color) in enumerate(groups):
        ax.plot([index] * len(values), values, "o", color=color, label=label)
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log)")
    ax.set_title(result["headline"], fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark("compaction-day", compaction_day, False),)
