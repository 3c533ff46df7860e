"""Daemon start to Spark ready, with and without the JVM's class data archive (issue 16).

Each round starts `fxgate run` twice as a subprocess on the default configuration with
`[spark] landing = "spark"` against one fresh mosquitto, alternately without the archive
(`FXGATE__SPARK__CLASS_DATA_ARCHIVE=""`) and with the one `make` wrote (spark/cds.py), each on a
fresh data directory, and stops it with SIGTERM once its log says "spark writer ready". Per
start: spawn -> "spark writer ready" (the daemon's whole start: Python imports, the ledger, the
source connection, the JVM and the session), and the JVM's own part as the "Spark session
started: ... in N s" line states it.
Target: the archive makes spawn -> Spark ready at least 30 % faster (ratio <= 0.7).

`landing = "spark"`: with the default pyarrow landing the daemon starts no JVM at all (delta-rs
commits the batches and maintains the tables, actors/writer.py), so "spark writer ready" would
not wait for one. Landing through Spark starts the session with the daemon, as every daemon did
when this target was set.
"""

from __future__ import annotations

import logging
import re
import statistics
import time
from pathlib import Path

from bench.benchmarks import Benchmark, Context
from bench.harness import fresh_broker, fxgate_env
from bench.recovery import phases
from tests.harness.daemon import DaemonProcess

log = logging.getLogger(__name__)

NAME = "spark-start"
ROUNDS = {False: 5, True: 2}
TARGET_RATIO = 0.7
START_TIMEOUT = 180.0
_SESSION = re.compile(r"Spark session started: master \S+ in (\d+\.\d) s")


def one_start(directory: Path, env: dict) -> dict:
    daemon = DaemonProcess(directory, env)
    spawned = time.time()
    daemon.start()
    try:
        daemon.wait_for_log(r"spark writer ready", timeout=START_TIMEOUT)
        found = phases(daemon, spawned)
        output = daemon.output()
    finally:
        daemon.terminate()
    session = _SESSION.search(output)
    return {
        "spark_ready_seconds": found["spark_ready_seconds"],
        "jvm_seconds": float(session.group(1)) if session else None,
        "archive_used": "(class data archive " in output,
    }


def spark_start(ctx: Context) -> dict:
    from spark.cds import DEFAULT_ARCHIVE
    from spark.cds_archive import make_archive

    made_seconds = None
    if not DEFAULT_ARCHIVE.is_file():
        made_seconds = round(make_archive(DEFAULT_ARCHIVE), 1)
    rounds = ROUNDS[ctx.settings.quick]
    directory = ctx.next_dir(NAME)
    samples: dict[str, list[dict]] = {"without": [], "with": []}
    with fresh_broker(directory / "broker") as broker:
        for number in range(rounds):
            for kind, archive in (("without", ""), ("with", str(DEFAULT_ARCHIVE))):
                env = fxgate_env(
                    broker,
                    directory / f"data-{kind}-{number}",
                    1,
                    FXGATE__SPARK__CLASS_DATA_ARCHIVE=archive,
                    FXGATE__SPARK__LANDING="spark",
                )
                sample = one_start(directory, env)
                samples[kind].append(sample)
                print(
                    f"   {kind} the archive: Spark ready {sample['spark_ready_seconds']} s after "
                    f"the spawn (the JVM's part {sample['jvm_seconds']} s)",
                    flush=True,
                )
    without = statistics.median(s["spark_ready_seconds"] for s in samples["without"])
    with_archive = statistics.median(s["spark_ready_seconds"] for s in samples["with"])
    jvm_without = statistics.median(s["jvm_seconds"] for s in samples["without"])
    jvm_with = statistics.median(s["jvm_seconds"] for s in samples["with"])
    used = all(s["archive_used"] for s in samples["with"]) and not any(
        s["archive_used"] for s in samples["without"]
    )
    ratio = with_archive / without
    return {
        "kind": "fxgate-bench",
        "module": "bench.start",
        "name": NAME,
        "title": "daemon start to Spark ready, with and without the class data archive",
        "unit": "s",
        "setup": {
            "archive": str(DEFAULT_ARCHIVE),
            "archive_bytes": DEFAULT_ARCHIVE.stat().st_size,
            "archive_made_seconds": made_seconds,
            "rounds": rounds,
            "daemon": 'fxgate run, default configuration with [spark] landing = "spark" (the '
            "session starts with the daemon), fresh data directory, one mosquitto",
        },
        "without": samples["without"],
        "with": samples["with"],
        "without_median": round(without, 3),
        "with_median": round(with_archive, 3),
        "jvm_without_median": jvm_without,
        "jvm_with_median": jvm_with,
        "archive_used_exactly_when_asked": used,
        "ratio": round(ratio, 3),
        "target": {"kind": "ratio_at_most", "value": TARGET_RATIO},
        "met": ratio <= TARGET_RATIO and used,
        "headline": (
            f"spawn -> Spark ready: {without:.2f} s without the archive, {with_archive:.2f} s "
            f"with it ({(1 - ratio) * 100:.0f} % faster); the JVM's part {jvm_without:.1f} -> "
            f"{jvm_with:.1f} s"
        ),
    }


def rows(result: dict) -> list[list[str]]:
    return [
        [
            f"`{NAME}`",
            '`fxgate run` (landing = "spark": the session starts with the daemon), spawn -> '
            '"spark writer ready" '
            f"(the JVM's part: {result['jvm_without_median']:.1f} -> "
            f"{result['jvm_with_median']:.1f} s); baseline: the same start without the class "
            "data archive",
            f"{result['without_median']:.2f} s",
            f"{result['with_median']:.2f} s",
            f"{result['ratio']:.2f}\u00d7",
            f"≤ {TARGET_RATIO:g}\u00d7 (30 % faster)",
            "yes" if result["met"] else "**no**",
            f"{len(result['without'])}+{len(result['with'])}",
        ]
    ]


def plot(results_dir: Path, result: dict) -> Path:
    import matplotlib.pyplot as plt

    path = results_dir / f"{NAME}.png"
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    for index, (kind, color) in enumerate((("without", "tab:red"), ("with", "tab:green"))):
        values = [s["spark_ready_seconds"] for s in result[kind]]
        ax.plot([index] * len(values), values, "o", color=color, label=kind)
    ax.set_xticks([0, 1], ["without the archive", "with the archive"])
    ax.set_ylabel("spawn -> Spark ready (s)")
    ax.set_ylim(bottom=0)
    ax.set_title(result["headline"], fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, spark_start, True),)
