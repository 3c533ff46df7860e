"""`make bench` / `python -m bench.run [--only NAME ...] [--quick]`: issue 5's benchmarks.

Each benchmark runs its baseline and fxgate alternately in this one run on a real mosquitto and
writes `bench/results/<name>.json` (every raw sample, medians, ratio, the machine, the command),
`bench/results/<name>.png`, rebuilds `bench/results/README-table.md` and puts it in the
documentation's benchmarks page (docs/pages/benchmarks.md).
Where a target is missed it profiles one more fxgate run with py-spy (`<name>-profile.svg`,
summary in the JSON).

`--quick` runs fewer, smaller rounds of the main benchmarks and writes to `bench/results/quick/`
so a smoke run never overwrites the full results.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench import machine
from bench.benchmarks import Context, Settings
from bench.registry import BENCHMARKS
from bench.report import plot_result, update_page, write_result, write_table

RESULTS = Path(__file__).resolve().parent / "results"
BENCHMARKS_PAGE = RESULTS.parent.parent / "docs" / "pages" / "benchmarks.md"


def headline(result: dict) -> str:
    """One line for the console: a module's own `headline`, else baseline vs fxgate."""
    met = "" if result.get("met") is None else f", target met: {result['met']}"
    if result.get("headline"):
        return result["headline"] + met
    ratio = result.get("ratio")
    return (
        f"baseline {result['baseline']['median']:,.0f}, fxgate "
        f"{result['fxgate']['median']:,.0f} {result['unit']}"
        + (f", ratio {ratio:.2f}" if ratio else "")
        + met
    )


def select(only: list[str] | None, quick: bool) -> list:
    if not only:
        return [b for b in BENCHMARKS if b.quick or not quick]
    chosen = [b for b in BENCHMARKS if any(b.name == n or b.name.startswith(n) for n in only)]
    unknown = [n for n in only if not any(b.name == n or b.name.startswith(n) for b in BENCHMARKS)]
    if unknown:
        names = ", ".join(b.name for b in BENCHMARKS)
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; known: {names}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only",
        nargs="+",
        action="extend",
        metavar="NAME",
        help="benchmarks to run (a name or a prefix: ingest, forward, batched, latency, "
        "recovery, memory, outage, durability, loss)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 rounds of smaller runs, no profiling; results in results/quick/",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3, quick 2)")
    parser.add_argument("--no-profile", action="store_true", help="skip py-spy on missed targets")
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument(
        "--keep-work",
        action="store_true",
        help="keep the scratch directory (brokers, ledgers, worker logs)",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    chosen = select(args.only, args.quick)
    results_dir = args.results_dir or (RESULTS / "quick" if args.quick else RESULTS)
    results_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="fxgate-bench-"))
    settings = Settings(
        quick=args.quick,
        rounds=args.rounds or (2 if args.quick else 3),
        profile=not args.no_profile and not args.quick,
        results_dir=results_dir,
        work_dir=work_dir,
        quiet_timeout=5.0 if args.quick else 30.0,
        quiet_budget=15.0 if args.quick else 60.0,
        extra_rounds=1 if args.quick else 2,
        extra_rounds_until=100.0 if args.quick else 420.0,
    )
    command = "python -m bench.run" + ("" if not argv else " " + shlex.join(argv))
    about = machine.describe(work_dir)
    print(
        f"fxgate benchmarks: {', '.join(b.name for b in chosen)}; {settings.rounds} rounds; "
        f"scratch {work_dir}; results {results_dir}",
        flush=True,
    )
    print(
        f"machine: {about['nproc']} vCPU {about['cpu_model']}, mosquitto {about['mosquitto']}, "
        f"paho {about['paho_mqtt']}, pyspark {about['pyspark']}",
        flush=True,
    )

    ctx = Context(settings)
    failures = 0
    began = time.monotonic()
    try:
        for bench in chosen:
            print(f"== {bench.name}", flush=True)
            started = time.monotonic()
            code_before = machine.git_state()
            try:
                result = bench.run(ctx)
            except Exception:
                failures += 1
                print(f"   {bench.name} FAILED:\n{traceback.format_exc()}", flush=True)
                continue
            result.update(
                generated=datetime.now(UTC).isoformat(timespec="seconds"),
                seconds=round(time.monotonic() - started, 1),
                quick=settings.quick,
                rounds=settings.rounds,
                command=command,
                make_command="make bench"
                + (f" BENCH_ARGS={shlex.quote(shlex.join(argv))}" if argv else ""),
                machine=about,
                code={
                    "before": code_before,
                    "after": machine.git_state(),
                    "gateway_workers_started_at": sorted(ctx.code_versions),
                },
            )
            write_result(results_dir, result)
            plot_result(results_dir, result)
            print(f"   {bench.name}: {headline(result)} ({result['seconds']:.0f} s)", flush=True)
    finally:
        ctx.close()
        table = write_table(results_dir)
        print(f"table: {table}  (total {time.monotonic() - began:.0f} s)", flush=True)
        # Only a run into the committed results updates the page (never --quick).
        if results_dir == RESULTS and update_page(BENCHMARKS_PAGE, table):
            print(f"benchmarks page's table updated: {BENCHMARKS_PAGE}", flush=True)
        if failures or args.keep_work:
            print(f"scratch kept for inspection: {work_dir}", flush=True)
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    print(table.read_text(), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
