"""Landing into tables on an object store (issue 35): the daemon's writer committing each batch
into a table on Azurite, Microsoft's Azure Storage emulator, against the same writer on this
machine's disk, at the default 1 s batch window.

Each contestant is spark.tables.ArrowTableWriter as the daemon's writer runs it (its application
id, a transaction id per batch, the table's properties, the log clean-up left to the passes), on a
table of its own: `WARMUP_BATCHES` batches untimed (the table's creation, the first opens), then
`BATCHES[quick]` batches of `ROWS_PER_BATCH` reads (4 readers at 100 reads/s: one 1 s window),
back to back. The contestants alternate in each round:
- baseline: the table on this disk (`tables_dir` a path);
- fxgate: the table on Azurite (`tables_dir = "az://..."`), reached over loopback HTTP as Azure is
  reached, the storage account variables in the environment: each batch a Parquet blob put whole
  (obstore) and a commit by delta-rs (a conditional create of the next log entry);
- group (report only): a GroupTableWriter landing the same batches insert-if-absent on Azurite,
  as a shared group's member would there.
Reported: the time of each write_batch (p50, p99), rows/s (rows / the timed batches' wall time)
and their ratio. Target: the p99 of a batch's landing on the store within the batch window (1 s),
so that the writer keeps up with a batch a second with room to spare.
What this cannot show: a real account's latency. Azurite answers on loopback and keeps its blobs
on this disk; Azure answers in milliseconds to tens of milliseconds a request from a gateway's
network, and a landing makes several requests (the log's listing, the blob, the commit), so on
Azure each landing costs that many round trips more than here.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from actors.devtools.azurite import AzuriteProcess
from bench.benchmarks import Benchmark, Context, alternate, samples_used
from bench.compaction import reads_rows

log = logging.getLogger(__name__)

NAME = "object-store-landing"
ROWS_PER_BATCH = 400  # 4 readers at 100 reads/s in a 1 s window (bench/compaction.py)
BATCH_SECONDS = 1.0
WARMUP_BATCHES = 5
BATCHES = {False: 300, True: 60}
TARGET_P99_SECONDS = BATCH_SECONDS
ROLES = ("baseline", "fxgate", "group")
START = 1_795_900_000.0  # a fixed simulated time: the same rows in every sample


def batch(number: int, rng) -> object:
    """Batch `number`'s reads: one window's, spread over it."""
    from spark.maintenance import utc_date

    first = (number - 1) * ROWS_PER_BATCH + 1
    seq = np.arange(first, first + ROWS_PER_BATCH, dtype=np.int64)
    at = START + (number - 1) * BATCH_SECONDS
    micros = round(at * 1e6) + np.arange(ROWS_PER_BATCH, dtype=np.int64) * 1_000_000 // 400
    ids = np.full(ROWS_PER_BATCH, number, dtype=np.int64)
    return reads_rows(seq, ids, micros, utc_date(at), rng)


def writer_for(role: str, tables: str):
    from spark.tables import ArrowTableWriter, GroupTableWriter, application_id

    app_id = application_id(f"bench-object-store-{role}")
    if role == "group":
        return GroupTableWriter(
            None, tables, app_id, group="bench-env-a", member="bench-a1", log_cleanup=False
        )
    return ArrowTableWriter(None, tables, app_id, log_cleanup=False)


def land(role: str, tables: str, quick: bool) -> dict:
    """One sample: a fresh table at `tables`, the warm-up, then the timed batches."""
    from spark.tables import READS, count_rows

    rng = np.random.default_rng(7)
    batches = [batch(n, rng) for n in range(1, WARMUP_BATCHES + BATCHES[quick] + 1)]
    writer = writer_for(role, tables)
    try:
        for number, rows in enumerate(batches[:WARMUP_BATCHES], start=1):
            writer.write_batch(number, {READS: rows})
        seconds = []
        began = time.perf_counter()
        for number, rows in enumerate(batches[WARMUP_BATCHES:], start=WARMUP_BATCHES + 1):
            started = time.perf_counter()
            writer.write_batch(number, {READS: rows})
            seconds.append(time.perf_counter() - started)
        wall = time.perf_counter() - began
    finally:
        writer.close()
    landed = count_rows(tables, READS)
    expected = len(batches) * ROWS_PER_BATCH
    if landed != expected:
        raise RuntimeError(f"{role}: {landed} rows in {tables}, expected {expected}")
    ordered = sorted(seconds)
    return {
        "rows_per_second": round(len(seconds) * ROWS_PER_BATCH / wall, 1),
        "landing_ms_median": round(1000 * statistics.median(ordered), 2),
        "landing_ms_p99": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2),
        "landing_ms_max": round(1000 * ordered[-1], 2),
        "batches": len(seconds),
        "rows": landed,
    }


@contextmanager
def azurite_in_environment(work: Path):
    """An Azurite of the run's own, and this process's environment pointed at it (as the
    daemon's would be), restored after."""
    emulator = AzuriteProcess(work / "azurite")
    emulator.start()
    saved = {name: os.environ.get(name) for name in emulator.environment()}
    os.environ.update(emulator.environment())
    try:
        yield emulator
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        emulator.kill()


def object_store_landing(ctx: Context) -> dict:
    quick = ctx.settings.quick
    work = ctx.next_dir("object-store")
    work.mkdir(parents=True, exist_ok=True)
    samples = itertools.count(1)
    with azurite_in_environment(work) as emulator:

        def sample(role: str) -> dict:
            number = next(samples)
            if role == "baseline":
                tables = work / f"local-{number}"
                try:
                    return {**land(role, str(tables), quick), "store": "local disk"}
                finally:
                    shutil.rmtree(tables, ignore_errors=True)
            container = emulator.create_root(f"bench{number}")
            return {**land(role, f"{container}/env-a", quick), "store": "Azurite"}

        raw = alternate(
            ctx,
            [(role, lambda r=role: sample(r)) for role in ROLES],
            lambda s: s["rows_per_second"],
            rounds=2 if quick else ctx.settings.rounds,
        )
    shutil.rmtree(work, ignore_errors=True)
    used = samples_used(raw)
    levels = {
        role: {
            key: statistics.median(s[key] for s in used if s["role"] == role)
            for key in ("rows_per_second", "landing_ms_median", "landing_ms_p99", "landing_ms_max")
        }
        | {"samples": sum(s["role"] == role for s in used)}
        for role in ROLES
    }
    base, store = levels["baseline"], levels["fxgate"]
    met = store["landing_ms_p99"] <= 1000 * TARGET_P99_SECONDS
    result = {
        "kind": "fxgate-bench",
        "module": "bench.object_store",
        "name": NAME,
        "title": "Landing into a table on an object store (Azurite) beside the local disk",
        "unit": "rows/s",
        "method": __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
        "setup": {
            "rows_per_batch": ROWS_PER_BATCH,
            "batch_seconds": BATCH_SECONDS,
            "batches_timed": BATCHES[quick],
            "warmup_batches": WARMUP_BATCHES,
        },
        "baseline": base,
        "fxgate": store,
        "group": levels["group"],
        "ratio": round(store["rows_per_second"] / base["rows_per_second"], 3),
        "target": {
            "kind": "p99_at_most_ms",
            "value": 1000 * TARGET_P99_SECONDS,
            "description": "a batch's landing on the store, p99, within the 1 s batch window",
        },
        "met": met,
        "raw": raw,
    }
    result["headline"] = (
        f"{ROWS_PER_BATCH} reads a batch: local disk {base['rows_per_second']:,.0f} rows/s "
        f"(landing p50 / p99 {base['landing_ms_median']:.0f} / {base['landing_ms_p99']:.0f} ms), "
        f"Azurite {store['rows_per_second']:,.0f} rows/s ({store['landing_ms_median']:.0f} / "
        f"{store['landing_ms_p99']:.0f} ms) = {result['ratio']:.2f}x; a group member's "
        f"insert-if-absent on Azurite {levels['group']['rows_per_second']:,.0f} rows/s "
        f"({levels['group']['landing_ms_median']:.0f} / {levels['group']['landing_ms_p99']:.0f} "
        f"ms); target p99 <= {1000 * TARGET_P99_SECONDS:.0f} ms"
    )
    result["bound"] = (
        f"At the 1 s window a gateway of 4 readers lands {ROWS_PER_BATCH} reads a second: the "
        f"store's p99 of {store['landing_ms_p99']:.0f} ms leaves "
        f"{1000 * BATCH_SECONDS - store['landing_ms_p99']:.0f} ms of each window; a store "
        "further away than loopback adds its round trips to every landing."
    )
    return result


def rows(result: dict) -> list[list[str]]:
    base, store, group = result["baseline"], result["fxgate"], result["group"]
    setup = result["setup"]
    return [
        [
            f"`{NAME}`",
            f"{setup['batches_timed']} batches of {setup['rows_per_batch']} reads (the "
            f"{setup['batch_seconds']:g} s window), each a commit with its transaction id; "
            "baseline: the table on this disk; fxgate: on Azurite (`az://`, loopback); landing "
            f"p50 / p99 {base['landing_ms_median']:.0f} / {base['landing_ms_p99']:.0f} ms vs "
            f"{store['landing_ms_median']:.0f} / {store['landing_ms_p99']:.0f} ms; a group "
            f"member on Azurite {group['rows_per_second']:,.0f} rows/s (p99 "
            f"{group['landing_ms_p99']:.0f} ms, report only)",
            f"{base['rows_per_second']:,.0f} rows/s (local disk)",
            f"{store['rows_per_second']:,.0f} rows/s (Azurite)",
            f"{result['ratio']:.2f}\u00d7",
            f"p99 ≤ {result['target']['value']:.0f} ms",
            "yes" if result["met"] else "**no**",
            f"{store['samples']}+{base['samples']}",
        ]
    ]


def plot(results_dir: Path, result: dict) -> Path:
    import matplotlib.pyplot as plt

    path = results_dir / f"{result['name']}.png"
    fig, axis = plt.subplots(figsize=(8, 4.2), dpi=110)
    colors = {"baseline": "tab:blue", "fxgate": "tab:orange", "group": "tab:gray"}
    labels = {"baseline": "local disk", "fxgate": "Azurite", "group": "group member, Azurite"}
    for role in ROLES:
        mine = [s for s in result["raw"] if s["role"] == role]
        for key, marker, which in (
            ("landing_ms_p99", "o", "p99"),
            ("landing_ms_median", "x", "median"),
        ):
            axis.plot(
                [s["order"] for s in mine],
                [s[key] for s in mine],
                marker,
                color=colors[role],
                label=f"{labels[role]}: {which}",
            )
    axis.axhline(result["target"]["value"], color="black", linestyle=":", linewidth=0.8)
    axis.set_yscale("log")
    axis.set_xlabel("sample, in run order")
    axis.set_ylabel("landing of one batch (ms)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    fig.suptitle(result["headline"], fontsize=7, wrap=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, object_store_landing, True),)
