"""The ledger is the buffer (issue 12): an upstream outage with the source broker at its shipped
queue limits, against the code before issue 12 where that applies.

The scenario of issue 12. `fxgate run` (the daemon as shipped, a subprocess, default
configuration but for the upstream's reconnect backoff) reads QoS 1 tag reads that four
simulated FX9600s publish at 300 msg/s in total to a source mosquitto configured as mosquitto
ships (`max_queued_messages 1000`, `max_inflight_messages 20`: past its queue it drops silently,
also for a connected session that holds its acks). fxgate forwards them at QoS 2 through
`tests.harness.proxy.FaultProxy` to an upstream mosquitto and lands them in the `reads` table.
One run:

1. settle (the JVM's first, slow jobs; not measured), then a window with the upstream up: the
   table's lag without an outage;
2. an upstream outage as long as that window (the proxy refuses and cuts every connection);
3. the upstream returns while the readers keep publishing at 300 msg/s: the drain of the
   upstream's backlog, and the table's lag of live reads meanwhile; then a short tail.

Measured from the outside: every message's publish time (when paho took it), the moment its
batch's commit appeared in the `reads` table's Delta log (a watcher follows the log every 0.1 s;
bench.latency says how) and the moment its key first arrived at a subscriber on the upstream
broker. Table lag = commit first seen - published (over-stated by at most one poll interval);
the daemon's own view, `status.json` `ledger.lag.table.oldest_age_seconds` sampled every second,
is reported next to it. The drain ends when the last message published before the upstream's
return arrives upstream. Every second the bench also samples the RSS of the daemon's Python
process and of its Spark JVM, the ledger's used bytes (`ledger.budget.used_bytes`) and its
files' sizes.

Side by side with today's behaviour where it applies: the same scenario with a 100-second outage
runs against the code of commit OLD_COMMIT (a paused source and upstream-gated landing; DESIGN §2
quotes 20,600 of 30,000 reads lost), in a `git worktree` outside the repository that the daemon
imports through PYTHONPATH, and against today's code; then today's code alone through the
10-minute outage of the issue.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np

from actors.app.daemon import STATUS_FILE
from actors.devtools.mosquitto import SHIPPED_LIMITS, MosquittoProcess
from actors.devtools.simulate import expected_read_ids
from bench.benchmarks import QUIET_OTHER_CORES, Benchmark, Context
from bench.harness import REPO, BenchError, LoadMeter, wait_for_quiet
from bench.latency import TableWatcher, join, publish_times
from bench.memory import (
    ROUTE_QOS,
    SOURCE_QOS,
    UPSTREAM_MAX_BACKOFF,
    Sampler,
    UpstreamTally,
    fit_growth,
    forwarding_config,
    span,
    status_fields,
)
from bench.recovery import SteadyPublisher
from spark.report import compare, landed_ids_arrow
from spark.tables import READS, table_path
from tests.harness.checks import wait_until_landed
from tests.harness.daemon import CLI_MODULE, DaemonProcess
from tests.harness.proxy import FaultProxy

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

NAME = "outage"
MIB = 1024 * 1024

RATE = 300.0  # messages/s in total, from bench.harness.PUBLISHING_READERS simulated FX9600s
# From bench.memory, as its config: QoS 1 in (SteadyPublisher publishes at QoS 1), QoS 2 upstream
# ("each once" is checkable there), the upstream's backoff capped (the drain measures fxgate
# draining, not a 120 s backoff after a long outage).
# mosquitto's shipped defaults (DESIGN §4): the point of the benchmark.
SOURCE_LIMITS = SHIPPED_LIMITS
# The code before issue 12 (the last commit before "the ledger is the buffer").
OLD_COMMIT = "60ff810"

# The publisher runs the simulator in chunks of this many seconds so that it can be stopped.
PUBLISH_CHUNK_SECONDS = 20.0
WATCH_SECONDS = 0.1

# Targets (issue 12). Stated before measuring.
DRAIN_TARGET_MESSAGES = 150_000
DRAIN_TARGET_SECONDS = 60.0
DRAIN_TARGET_RATE = DRAIN_TARGET_MESSAGES / DRAIN_TARGET_SECONDS  # 2,500 msg/s
LIVE_TABLE_LAG_TARGET = 3.0  # seconds, live reads while the backlog drains
# "No worse than without an outage": p99 during the outage <= (1 + this) x p99 without one.
LAG_TOLERANCE = 0.10
# Flat: the Python RSS's least-squares growth over the outage's second half stays under this
# (pymalloc arenas, SQLite's page caches, the status writer's garbage), plus whatever tier 2
# itself took on in that half (it fills to its caps within ~35 s of the cut at 300 msg/s).
RSS_SLACK_BYTES = 8 * MIB

# The drain counts as seen (online, to end the live phase) once the latest message to arrive
# upstream was published at most this long before, twice in a row.
LIVE_UPSTREAM_SECONDS = 3.0
DRAIN_STALL_SECONDS = 60.0


@dataclass(frozen=True)
class Scenario:
    label: str
    code: str  # "new" (the working tree) or "old" (OLD_COMMIT)
    settle: float  # seconds from the first batch written to the measured window, not measured
    window: float  # seconds without an outage, then seconds of outage
    tail: float  # seconds of live traffic after the drain was seen
    drain_timeout: float


FULL = (
    Scenario("old-100s", "old", 60.0, 100.0, 30.0, 600.0),
    Scenario("new-100s", "new", 60.0, 100.0, 30.0, 600.0),
    Scenario("new-600s", "new", 60.0, 600.0, 30.0, 900.0),
)
QUICK = (
    Scenario("old-40s", "old", 15.0, 40.0, 10.0, 240.0),
    Scenario("new-40s", "new", 15.0, 40.0, 10.0, 240.0),
)


# -- the code before issue 12 -------------------------------------------------------------------


@contextlib.contextmanager
def old_code(work_dir: Path) -> Iterator[dict]:
    """A worktree of OLD_COMMIT outside the repository (the only git operation here), removed
    afterwards. The daemon imports it through PYTHONPATH: sys.path comes before the editable
    install's finder, which is appended to sys.meta_path."""
    tree = work_dir / f"fxgate-{OLD_COMMIT}"
    git = ["git", "-C", str(REPO)]
    added = subprocess.run(
        [*git, "worktree", "add", "--detach", str(tree), OLD_COMMIT],
        capture_output=True,
        text=True,
        check=False,
    )
    if added.returncode != 0:
        yield {"error": f"git worktree add failed: {added.stderr.strip()}"}
        return
    try:
        commit = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        yield {"tree": tree, "commit": commit}
    finally:
        subprocess.run(
            [*git, "worktree", "remove", "--force", str(tree)], capture_output=True, check=False
        )


# -- what one run samples -----------------------------------------------------------------------


def sampled_fields(status: dict) -> dict:
    """bench.memory's fields, and those only the code before issue 12 has (held acks, a paused
    source, packs spilled past tier 2): the same sampler serves both."""
    ledger = status.get("ledger") or {}
    buffer = status.get("buffer") or {}
    return {
        **status_fields(status),
        "held_acks": ledger.get("held_acks"),
        "paused_source": buffer.get("paused_source"),
        "tier1_waiting_packs": buffer.get("tier1_waiting_packs"),
    }


def file_bytes(data: Path, name: str) -> int | None:
    """A SQLite file and its write-ahead log, in bytes on disk (apparent size)."""
    total, found = 0, False
    for path in (data / name, data / f"{name}-wal"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size
            found = True
    return total if found else None


_TIMESTAMP = re.compile(rb'"timestamp":"([^"]+)"')


def payload_time(payload: bytes | None) -> float | None:
    """The FX9600 event's own timestamp (the simulator stamps it as it publishes)."""
    found = _TIMESTAMP.search(payload or b"")
    if found is None:
        return None
    return datetime.strptime(found.group(1).decode(), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def ledger_settled(path: Path) -> tuple[int, int] | None:
    """(rows not landed, batches open) in a ledger of either schema, read-only."""
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        pending = connection.execute(
            "SELECT count(*) FROM inbound WHERE landed_time IS NULL"
        ).fetchone()[0]
        open_batches = connection.execute(
            "SELECT count(*) FROM batches WHERE state = 'writing'"
        ).fetchone()[0]
        return pending, open_batches
    except sqlite3.Error:
        return None
    finally:
        connection.close()


def write_config(path: Path, data: Path, source: MosquittoProcess, proxy: FaultProxy) -> str:
    """Valid for both codes: nothing but what both know. Tier 2, packs, the writer and (new) the
    disk budget keep their defaults."""
    text = forwarding_config(data, source, proxy, "outage")
    path.write_text(text)
    return text


# -- one run ------------------------------------------------------------------------------------


def run_scenario(ctx: Context, scenario: Scenario, old: dict | None) -> dict:
    directory = ctx.next_dir(f"{NAME}-{scenario.label}")
    data = directory / "data"
    directory.mkdir(parents=True, exist_ok=True)
    source = MosquittoProcess(directory / "source", **SOURCE_LIMITS)
    upstream = MosquittoProcess(directory / "upstream")
    proxy = FaultProxy(upstream.host, upstream.port)
    tally = UpstreamTally(upstream)
    tables = data / "tables"
    watcher = TableWatcher(Path(table_path(tables, READS)), interval=WATCH_SECONDS)
    env = {"PYTHONPATH": str(old["tree"])} if scenario.code == "old" else {}
    marks: dict[str, float] = {}
    loads: dict[str, dict] = {}
    outcome: dict = {}
    daemon: DaemonProcess | None = None
    sampler: Sampler | None = None
    publisher: SteadyPublisher | None = None
    t0 = time.monotonic()
    wall0 = time.time()

    def now() -> float:
        return round(time.monotonic() - t0, 2)

    def progress() -> dict:
        return {
            "sent": len(publisher.clock.times) if publisher is not None else 0,
            "upstream_received": tally.received,
            "table_visible": watcher.visible_rows(),
            "ledger_file_bytes": file_bytes(data, "ledger.sqlite"),
            "outbound_file_bytes": file_bytes(data, "outbound.sqlite"),
        }

    def check() -> None:
        if publisher is not None and publisher.error is not None:
            raise BenchError(f"publisher failed at t={now()}: {publisher.error!r}")
        if sampler is not None and sampler.died.is_set():
            raise BenchError(f"daemon exited at t={now()}\ndaemon log tail:\n{_tail(daemon)}")

    pause = threading.Event()

    def hold_until(t: float) -> None:
        while (left := t - (time.monotonic() - t0)) > 0:
            check()
            pause.wait(min(left, 1.0))

    source.start()
    try:
        upstream.start()
        proxy.start()
        config_text = write_config(directory / "fxgate.toml", data, source, proxy)
        tally.start()
        daemon = DaemonProcess(
            directory,
            env,
            directory / "fxgate.toml",
            # The command line lived in actors/cli.py before the house was restructured.
            cli_module="actors.cli" if scenario.code == "old" else CLI_MODULE,
        )
        t0, wall0 = time.monotonic(), time.time()
        daemon.start()
        daemon.wait_for_log(r"source: subscribed", timeout=240)
        daemon.wait_for_log(r"upstream: connected", timeout=60)
        daemon.wait_for_log(r"fxgate started", timeout=240)
        marks["ready"] = now()
        sampler = Sampler(daemon, data / STATUS_FILE, t0, progress, fields=sampled_fields)
        sampler.start()
        watcher.start()
        publisher = SteadyPublisher(
            source.host,
            source.port,
            RATE,
            ctx.seed(),
            chunk_seconds=PUBLISH_CHUNK_SECONDS,
            client_id_prefix=f"bench-outage-{scenario.label}",
        ).start()
        marks["publish_start"] = now()
        whole = LoadMeter()
        # The Spark session starts after "fxgate started" and its first jobs are slow: the
        # settle counts from the first batch written.
        daemon.wait_for_log(r"batch \d+ written", timeout=240)
        marks["first_batch"] = now()
        hold_until(marks["first_batch"] + scenario.settle)

        marks["window_start"] = now()
        meter = LoadMeter()
        hold_until(marks["window_start"] + scenario.window)
        loads["no_outage"] = meter.stop()

        marks["outage_start"] = now()
        meter = LoadMeter()
        proxy.refuse()
        outcome["connections_cut"] = proxy.cut()
        hold_until(marks["outage_start"] + scenario.window)
        loads["outage"] = meter.stop()

        mark = daemon.mark()
        marks["outage_end"] = now()
        meter = LoadMeter()
        proxy.accept()
        daemon.wait_for_log(
            r"upstream: connected", timeout=3 * UPSTREAM_MAX_BACKOFF + 30, after=mark
        )
        marks["upstream_reconnected"] = now()
        seen = wait_live(tally, scenario.drain_timeout, check)
        if seen is not None:
            marks["drain_seen"] = round(seen - t0, 2)
        else:
            outcome["drain_error"] = "the upstream did not catch up with live traffic"
        loads["drain"] = meter.stop()
        hold_until(now() + scenario.tail)
        publisher.stop()
        marks["publish_done"] = now()
        loads["whole_run"] = whole.stop()

        sent = publish_times(publisher.records, publisher.clock.times)
        keys = set(sent)
        read_ids = expected_read_ids(publisher.records)
        if tally.wait_for(keys, 300.0, stall=DRAIN_STALL_SECONDS if old is None else 20.0):
            marks["upstream_complete"] = now()
        try:
            if old is None:
                wait_until_landed(daemon, data, len(read_ids), timeout=300.0)
            else:
                wait_settled(data / "ledger.sqlite", timeout=300.0, check=check)
            marks["table_complete"] = now()
        except (AssertionError, BenchError) as stalled:
            outcome["landing_error"] = str(stalled).splitlines()[0]
        hold_until(now() + 3.0)
        sampler.stop()
        watcher.stop()
        outcome["exit_code"] = daemon.terminate()
        marks["stopped"] = now()
    finally:
        if sampler is not None:
            sampler.stop()
        watcher.stop()
        if publisher is not None and marks.get("publish_done") is None:
            with contextlib.suppress(Exception):
                publisher.stop()
        if daemon is not None:
            daemon.reap()
            (directory / "daemon.log").write_text(daemon.output())
        tally.stop()
        proxy.close()
        upstream.stop()
        source.stop()

    joined = join(tables, watcher.first_seen, sent)
    ids, _ = landed_ids_arrow(tables)
    return summarize(
        scenario=scenario,
        old=old,
        wall0=wall0,
        marks=marks,
        loads=loads,
        outcome=outcome,
        sent=sent,
        joined=joined,
        table=compare(read_ids, ids),
        upstream_check=tally.compare(keys),
        arrived=dict(tally.arrived),
        samples=sampler.samples,
        source_log=source.log_path,
        daemon_log=daemon.output(),
        config_text=config_text,
    )


def wait_live(tally: UpstreamTally, timeout: float, check) -> float | None:
    """Until the upstream has caught up with live traffic (the latest arrival was published at
    most LIVE_UPSTREAM_SECONDS before, at two looks 0.5 s apart); the monotonic time, or None
    at `timeout` or when nothing arrives upstream for DRAIN_STALL_SECONDS."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    streak, last_count, last_change = 0, tally.received, time.monotonic()
    while time.monotonic() < deadline:
        check()
        count = tally.received
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > DRAIN_STALL_SECONDS:
            return None
        published = payload_time(tally.last_payload)
        if published is not None and time.time() - published <= LIVE_UPSTREAM_SECONDS:
            streak += 1
            if streak >= 2:
                return time.monotonic()
        else:
            streak = 0
        pause.wait(0.5)
    return None


def wait_settled(ledger: Path, timeout: float, check) -> None:
    """For the code before issue 12 (its ledger's schema, and reads it lost): until nothing is
    pending in its ledger and no batch is open, at two looks 2 s apart."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    streak, state = 0, None
    while time.monotonic() < deadline:
        check()
        state = ledger_settled(ledger)
        streak = streak + 1 if state == (0, 0) else 0
        if streak >= 2:
            return
        pause.wait(2.0)
    raise BenchError(f"ledger not settled after {timeout} s: (pending, open batches) = {state}")


def _tail(daemon: DaemonProcess | None, lines: int = 40) -> str:
    return "" if daemon is None else "\n".join(daemon.output().splitlines()[-lines:])


# -- reading one run ----------------------------------------------------------------------------


def stats(values) -> dict:
    array = np.asarray(list(values), dtype=float)
    if array.size == 0:
        return {"count": 0}
    return {
        "count": int(array.size),
        "p50": round(float(np.percentile(array, 50)), 3),
        "p90": round(float(np.percentile(array, 90)), 3),
        "p99": round(float(np.percentile(array, 99)), 3),
        "max": round(float(array.max()), 3),
        "mean": round(float(array.mean()), 3),
    }


_LOG_LEVEL = re.compile(r" (WARNING|ERROR|CRITICAL) ")
_LOG_PREFIX = re.compile(r"^\S+ \S+ ")


def log_findings(output: str) -> dict:
    """Warnings and errors in the daemon's log, counted by message (time stamps and numbers
    folded), so that anything odd is in the result."""
    counted: dict[str, int] = {}
    tracebacks = 0
    for line in output.splitlines():
        if line.startswith("Traceback"):
            tracebacks += 1
        if _LOG_LEVEL.search(line):
            text = re.sub(r"\d+(\.\d+)?", "N", _LOG_PREFIX.sub("", line))[:200]
            counted[text] = counted.get(text, 0) + 1
    top = sorted(counted.items(), key=lambda item: -item[1])[:25]
    return {
        "warning_or_error_lines": sum(counted.values()),
        "tracebacks": tracebacks,
        "by_message": [{"count": n, "line": text} for text, n in top],
    }


def dropped_lines(log_path: Path) -> list[str]:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if "dropped" in line.lower()]


def windows(marks: dict) -> dict[str, tuple[float, float]]:
    """Phases of the run, in seconds since the daemon started; a read belongs to the phase it was
    published in."""
    end_of_drain = marks.get("drain_done", marks.get("drain_seen", marks["outage_end"]))
    return {
        "no_outage": (marks["window_start"], marks["outage_start"]),
        "outage": (marks["outage_start"], marks["outage_end"]),
        "drain": (marks["outage_end"], end_of_drain),
        "after_drain": (end_of_drain, marks["publish_done"]),
    }


def summarize(
    *,
    scenario: Scenario,
    old: dict | None,
    wall0: float,
    marks: dict,
    loads: dict,
    outcome: dict,
    sent: dict[str, float],
    joined: dict,
    table,
    upstream_check: dict,
    arrived: dict[str, float],
    samples: list[dict],
    source_log: Path,
    daemon_log: str,
    config_text: str,
) -> dict:
    start, end = marks["outage_start"], marks["outage_end"]
    published_at = {key: at - wall0 for key, at in sent.items()}
    arrived_at = {key: at - wall0 for key, at in arrived.items()}
    visible_at = {key: at - wall0 for key, at in joined["visible"].items()}

    # The drain: every message published before the upstream's return that had not arrived
    # upstream by then; it ends when the last of them arrives.
    backlog = [k for k, p in published_at.items() if p < end and arrived_at.get(k, end) >= end]
    backlog_arrived = [arrived_at[k] for k in backlog if k in arrived_at]
    drain: dict = {
        "backlog_messages": len(backlog),
        "backlog_never_arrived": len(backlog) - len(backlog_arrived),
    }
    if backlog_arrived:
        done = max(backlog_arrived)
        marks["drain_done"] = round(done, 2)
        from_return = done - end
        from_reconnect = done - marks["upstream_reconnected"]
        drain.update(
            seconds_from_return=round(from_return, 2),
            seconds_from_reconnect=round(from_reconnect, 2),
            rate_from_return=round(len(backlog_arrived) / from_return, 1)
            if from_return > 0
            else None,
            rate_from_reconnect=round(len(backlog_arrived) / from_reconnect, 1)
            if from_reconnect > 0
            else None,
        )
    # The daemon's own view (1 s): when its upstream lag was first empty, or only live.
    after = [s for s in samples if s["t"] >= end]
    drain["status_upstream_lag_zero_at"] = next(
        (round(s["t"] - end, 1) for s in after if s.get("upstream_lag_messages") == 0), None
    )
    drain["status_upstream_lag_live_at"] = next(
        (
            round(s["t"] - end, 1)
            for s in after
            if s.get("upstream_lag_seconds") is not None
            and s["upstream_lag_seconds"] <= LIVE_UPSTREAM_SECONDS
        ),
        None,
    )
    phases = windows(marks)

    # Table lag per read: commit first seen - published, by the phase it was published in.
    lags: dict[str, list[float]] = {phase: [] for phase in phases}
    for key, seen in visible_at.items():
        at = published_at[key]
        for phase, (a, b) in phases.items():
            if a <= at < b:
                lags[phase].append(seen - at)
                break
    table_lag = {phase: stats(values) for phase, values in lags.items()}
    # The daemon's own figure: the oldest read the table has not landed, every second.
    table_lag_status = {
        phase: stats(
            s["table_lag_seconds"]
            for s in samples
            if a <= s["t"] < b and s.get("table_lag_seconds") is not None
        )
        for phase, (a, b) in phases.items()
    }
    by_second = lag_by_second(published_at, visible_at)
    published_in = {
        phase: sum(1 for p in published_at.values() if a <= p < b)
        for phase, (a, b) in phases.items()
    }
    landed_in_outage = sum(1 for v in visible_at.values() if start <= v < end)
    landed_in_outage_of_outage = sum(
        1 for k, v in visible_at.items() if start <= v < end and start <= published_at[k] < end
    )
    forwarded_in_outage = sum(1 for v in arrived_at.values() if start <= v < end)

    # Memory over the outage: flat = the fit over its second half stays under the slack plus
    # what tier 2 took on in that half.
    middle = (start + end) / 2
    python_half = fit_growth(samples, "python_rss", middle, end)
    jvm_half = fit_growth(samples, "jvm_rss", middle, end)
    tier2_half = span(samples, "tier2_bytes", middle, end)
    tier2_growth = max(0, (tier2_half.get("last") or 0) - (tier2_half.get("first") or 0))
    rss_bound = RSS_SLACK_BYTES + tier2_growth
    rss_growth = python_half["growth_bytes"] if python_half else None
    rss_phases = {**phases, "whole_run": (0.0, marks.get("stopped", marks["publish_done"]))}
    rss = {
        process: {phase: span(samples, key, a, b) for phase, (a, b) in rss_phases.items()}
        for process, key in (("python", "python_rss"), ("jvm", "jvm_rss"))
    }

    # The ledger's growth: used pages (the disk budget's measure) and its files, during the
    # outage and, for comparison, without one. With both sinks up it grows too: a landed row's
    # key stays for the redelivery retention (actors.ledger, ~70 min); during the
    # outage every payload stays as well, until the upstream has it.
    outage_rate = published_in["outage"] / (end - start) if end > start else None
    ledger_growth: dict[str, dict] = {}
    for phase in ("no_outage", "outage", "after_drain"):
        a, b = phases[phase]
        rate = published_in[phase] / (b - a) if b > a else None
        for key in ("ledger_used_bytes", "ledger_file_bytes"):
            fit = fit_growth(samples, key, a, b)
            if fit is None:
                continue
            per_second = fit["slope_bytes_per_second"]
            ledger_growth.setdefault(phase, {})[key] = {
                **fit,
                "bytes_per_hour": round(per_second * 3600),
                "bytes_per_message": round(per_second / rate, 1) if rate else None,
            }

    dropped = dropped_lines(source_log)
    lost = len(table.missing)
    delivered = (
        table.exact
        and upstream_check["missing"] == 0
        and upstream_check["duplicates"] == 0
        and upstream_check["unexpected"] == 0
        and not dropped
        and outcome.get("landing_error") is None
    )
    pauses = [s["t"] for s in samples if s.get("budget_paused") or s.get("paused_source")]
    return {
        "label": scenario.label,
        "code": scenario.code,
        "commit": old["commit"] if old else None,
        "scenario": asdict(scenario),
        "config": config_text,
        "marks": marks,
        "published": {
            "messages": len(sent),
            "by_phase": published_in,
            "rate_in_outage": round(outage_rate, 1) if outage_rate else None,
        },
        "table": {
            "landed_distinct": table.published - lost,
            "rows": table.landed,
            "missing": lost,
            "duplicates": len(table.duplicates),
            "unexpected": len(table.unexpected),
            "rows_landed_during_outage": landed_in_outage,
            "outage_reads_landed_during_outage": landed_in_outage_of_outage,
            "landing_error": outcome.get("landing_error"),
            "timing": {k: joined[k] for k in ("missing", "duplicates", "unobserved")},
        },
        "upstream": {**upstream_check, "forwarded_during_outage": forwarded_in_outage},
        "lost": lost,
        "delivered_once": delivered,
        "source_mosquitto_dropped_lines": dropped[:10],
        "source_mosquitto_dropped_count": len(dropped),
        "table_lag": table_lag,
        "table_lag_status": table_lag_status,
        "table_lag_by_second": by_second,
        "drain": drain,
        "drain_error": outcome.get("drain_error"),
        "python_rss_growth_second_half": python_half,
        "jvm_rss_growth_second_half": jvm_half,
        "tier2_bytes_growth_second_half": tier2_growth,
        "rss_bound_bytes": rss_bound,
        "rss_flat": rss_growth is not None and rss_growth < rss_bound,
        "rss_bytes": rss,
        "ledger_growth": ledger_growth,
        "tier2_max_messages": max((s.get("tier2_messages") or 0 for s in samples), default=0),
        "upstream_lag_max_messages": max(
            (s.get("upstream_lag_messages") or 0 for s in samples), default=0
        ),
        "held_acks_max": max((s.get("held_acks") or 0 for s in samples), default=0),
        "source_paused_seconds": len(pauses),
        "connections_cut": outcome.get("connections_cut"),
        "daemon_exit_code": outcome.get("exit_code"),
        "daemon_log": log_findings(daemon_log),
        "machine_load": loads,
        "series": [trim(s) for s in samples],
    }


SERIES_KEYS = (
    "t",
    "python_rss",
    "jvm_rss",
    "sent",
    "upstream_received",
    "table_visible",
    "ledger_used_bytes",
    "ledger_file_bytes",
    "outbound_file_bytes",
    "tier2_messages",
    "tier2_bytes",
    "table_lag_messages",
    "table_lag_seconds",
    "upstream_lag_messages",
    "upstream_lag_seconds",
    "held_acks",
    "paused_source",
    "budget_paused",
    "status_age",
)


def trim(sample: dict) -> dict:
    return {k: sample.get(k) for k in SERIES_KEYS}


def lag_by_second(published_at: dict[str, float], visible_at: dict[str, float]) -> list[list]:
    """Per second of publishing: [second, reads, p50, max] of the table lag of its reads."""
    buckets: dict[int, list[float]] = {}
    for key, seen in visible_at.items():
        buckets.setdefault(int(published_at[key]), []).append(seen - published_at[key])
    return [
        [second, len(values), round(float(np.median(values)), 3), round(max(values), 3)]
        for second, values in sorted(buckets.items())
    ]


# -- the benchmark ------------------------------------------------------------------------------


def outage(ctx: Context) -> dict:
    scenarios = QUICK if ctx.settings.quick else FULL
    runs: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    with old_code(ctx.settings.work_dir) as old:
        for scenario in scenarios:
            print(f"   {NAME}: {scenario.label} ...", flush=True)
            if scenario.code == "old" and "error" in old:
                skipped[scenario.label] = old["error"]
                continue
            # As before every sample of the other benchmarks: other people's test suites share
            # this machine (each phase's load is in the run's `machine_load`).
            quiet = wait_for_quiet(QUIET_OTHER_CORES, ctx.settings.quiet_timeout)
            run = run_scenario(ctx, scenario, old if scenario.code == "old" else None)
            run["quiet_before"] = quiet
            runs[scenario.label] = run
            print(f"   {NAME}: {scenario.label}: {run_line(run)}", flush=True)
    return assemble(ctx, runs, skipped)


def run_line(run: dict) -> str:
    lag = run["table_lag"]
    drain = run["drain"]
    return (
        f"{run['published']['messages']:,} published, {run['lost']:,} lost, table dup "
        f"{run['table']['duplicates']}, upstream missing {run['upstream']['missing']:,} dup "
        f"{run['upstream']['duplicates']}; table lag p99 {lag['no_outage'].get('p99')} s "
        f"without / {lag['outage'].get('p99')} s during the outage; "
        f"{run['table']['rows_landed_during_outage']:,} rows landed during it; drain "
        f"{drain['backlog_messages']:,} in {drain.get('seconds_from_return')} s"
    )


def assemble(ctx: Context, runs: dict[str, dict], skipped: dict[str, str]) -> dict:
    new_runs = [r for r in runs.values() if r["code"] == "new"]
    if not new_runs:
        raise BenchError("no run of today's code finished")
    main = max(new_runs, key=lambda r: r["scenario"]["window"])
    lag = main["table_lag"]
    no_outage_p99, outage_p99 = lag["no_outage"].get("p99"), lag["outage"].get("p99")
    drain = main["drain"]
    live = lag["drain"]
    parts = {
        "zero_lost_each_once": all(r["delivered_once"] for r in new_runs),
        "table_lag_p99_not_worse": no_outage_p99 is not None
        and outage_p99 is not None
        and outage_p99 <= no_outage_p99 * (1 + LAG_TOLERANCE),
        "python_rss_flat": main["rss_flat"],
        "drain_rate": (drain.get("rate_from_return") or 0) >= DRAIN_TARGET_RATE,
        "live_table_lag_during_drain": live.get("p99") is not None
        and live["p99"] <= LIVE_TABLE_LAG_TARGET,
    }
    met = all(parts.values())
    length = duration(main["scenario"]["window"])
    old_run = next((r for r in runs.values() if r["code"] == "old"), None)
    pair = (
        next(
            (r for r in new_runs if r["scenario"]["window"] == old_run["scenario"]["window"]),
            None,
        )
        if old_run
        else None
    )
    growth = main["ledger_growth"].get("outage", {})
    growth = growth.get("ledger_used_bytes") or growth.get("ledger_file_bytes")
    half = main["python_rss_growth_second_half"] or {}
    headline = (
        f"{length} outage at {RATE:.0f} msg/s, source mosquitto at its limits: "
        f"{main['published']['messages']:,} published, {main['lost']:,} lost; table lag p99 "
        f"{outage_p99} s during the outage vs {no_outage_p99} s without; Python RSS "
        f"{(half.get('growth_bytes') or 0) / MIB:+.1f} MiB over the outage's second half; "
        f"ledger +{(growth or {}).get('bytes_per_hour', 0) / MIB:,.0f} MiB/h; drain "
        f"{drain['backlog_messages']:,} in {drain.get('seconds_from_return')} s "
        f"({drain.get('rate_from_return')} msg/s), live table lag p99 {live.get('p99')} s"
        + (
            f"; {OLD_COMMIT} through {old_run['scenario']['window']:.0f} s: "
            f"{old_run['lost']:,} of {old_run['published']['messages']:,} lost"
            if old_run
            else ""
        )
    )
    return {
        "kind": "fxgate-bench",
        "name": NAME,
        "module": __name__,
        "title": (
            f"A {length} upstream outage at {RATE:.0f} msg/s (QoS {SOURCE_QOS} in, "
            f"QoS {ROUTE_QOS} upstream), source mosquitto max_queued_messages "
            f"{SOURCE_LIMITS['max_queued_messages']}"
        ),
        "unit": "seconds",
        "headline": headline,
        "met": met,
        "met_parts": parts,
        "target": {
            "description": (
                f"0 lost and each read once (table and upstream, every run of today's code; "
                f"no 'dropped' in the source mosquitto's log); table lag p99 during the outage "
                f"<= {1 + LAG_TOLERANCE:.2f} x the p99 without one; Python RSS growth over the "
                f"outage's second half < {RSS_SLACK_BYTES // MIB} MiB + what tier 2 took on "
                f"then; the backlog drained at >= {DRAIN_TARGET_RATE:,.0f} msg/s "
                f"({DRAIN_TARGET_MESSAGES:,} in {DRAIN_TARGET_SECONDS:.0f} s) from the upstream's "
                f"return, with live traffic on; live reads' table lag p99 during the drain "
                f"<= {LIVE_TABLE_LAG_TARGET:.0f} s"
            ),
        },
        "bound": bound_sentence(main, old_run, pair, skipped),
        "main_run": main["label"],
        "old_commit": OLD_COMMIT,
        "skipped": skipped,
        "setup": {
            "quick": ctx.settings.quick,
            "rate_messages_per_second": RATE,
            "source_qos": SOURCE_QOS,
            "route_qos": ROUTE_QOS,
            "source_mosquitto": SOURCE_LIMITS,
            "upstream_max_backoff_seconds": UPSTREAM_MAX_BACKOFF,
            "scenarios": [asdict(s) for s in (QUICK if ctx.settings.quick else FULL)],
            "table_lag": "per read: its batch's commit first seen in the reads table's Delta "
            f"log (followed every {WATCH_SECONDS} s) - its publish time (when paho took it); by "
            "the phase it was published in. `table_lag_status`: status.json "
            "ledger.lag.table.oldest_age_seconds, sampled every second",
            "drain": "from the upstream's return (the proxy accepts again) until the last "
            "message published before it arrives at the upstream subscriber; rate = those "
            "messages / that time",
            "ledger_growth": "least-squares slope, per phase (no_outage, outage, "
            "after_drain), of status.json ledger.budget.used_bytes (used pages) and of "
            "ledger.sqlite + -wal's size; per message: / the publish rate in that phase",
            "publisher": "bench.recovery.SteadyPublisher: actors.devtools.simulate in "
            f"{PUBLISH_CHUNK_SECONDS:.0f}-s chunks, 4 readers, paced, QoS 1",
            "outage": "FaultProxy between fxgate and the upstream mosquitto: refuse() and cut(), "
            "then accept(); the upstream subscriber connects directly",
            "old_code": f"git worktree of {OLD_COMMIT} outside the repository, imported by the "
            "daemon through PYTHONPATH; same config file",
        },
        "runs": runs,
    }


def load_sentence(run: dict) -> str:
    load = run.get("machine_load") or {}
    if not load:
        return ""
    cores = " / ".join(
        f"{(load.get(phase) or {}).get('other_cores', float('nan')):.2f}"
        for phase in ("no_outage", "outage", "drain")
    )
    return (
        f" Other processes on the machine (other people's test suites) used {cores} cores "
        "during the window without an outage / the outage / the drain (busy cores beyond "
        "this bench's own process tree): the drain and the lags shared the CPU with them."
    )


def other_load(run: dict) -> str:
    """' (other load a to b cores)': what the rest of the machine used over the run's phases."""
    values = [
        phase["other_cores"]
        for name, phase in (run.get("machine_load") or {}).items()
        if name != "whole_run" and phase.get("other_cores") is not None
    ]
    if not values:
        return ""
    return f" (other load {min(values):.2f} to {max(values):.2f} cores)"


def bound_sentence(main: dict, old_run: dict | None, pair: dict | None, skipped: dict) -> str:
    lag, lag_status = main["table_lag"], main["table_lag_status"]
    drain = main["drain"]
    growth = main["ledger_growth"]
    used = growth.get("outage", {}).get("ledger_used_bytes") or {}
    files = growth.get("outage", {}).get("ledger_file_bytes") or {}
    used_before = growth.get("no_outage", {}).get("ledger_used_bytes") or {}
    half = main["python_rss_growth_second_half"] or {}
    jvm = main["jvm_rss_growth_second_half"] or {}
    window = main["scenario"]["window"]
    text = (
        f"Today's code, {duration(window)} outage: {main['published']['messages']:,} "
        f"published, {main['table']['missing']:,} missing and {main['table']['duplicates']} "
        f"duplicated in the table, {main['upstream']['missing']:,} missing and "
        f"{main['upstream']['duplicates']} duplicated upstream; the source mosquitto logged "
        f"{main['source_mosquitto_dropped_count']} 'dropped' line(s). The table kept landing "
        f"during the outage ({main['table']['rows_landed_during_outage']:,} rows): table lag "
        f"p50/p99 {lag['outage'].get('p50')}/{lag['outage'].get('p99')} s against "
        f"{lag['no_outage'].get('p50')}/{lag['no_outage'].get('p99')} s in the "
        f"{window:.0f} s before it (the daemon's oldest-unlanded age, sampled each second: "
        f"p99 {lag_status['outage'].get('p99')} s vs {lag_status['no_outage'].get('p99')} s). "
        f"Python RSS {(half.get('growth_bytes') or 0) / MIB:+.1f} MiB over the outage's "
        f"second half (bound {main['rss_bound_bytes'] / MIB:.1f} MiB), JVM "
        f"{(jvm.get('growth_bytes') or 0) / MIB:+.1f} MiB. During the outage the ledger grew "
        f"by {used.get('bytes_per_hour', 0) / MIB:,.0f} MiB/h in used pages "
        f"({used.get('bytes_per_message')} B/message) and its files by "
        f"{files.get('bytes_per_hour', 0) / MIB:,.0f} MiB/h; in the window before it, with "
        f"both sinks up, by {used_before.get('bytes_per_hour', 0) / MIB:,.0f} MiB/h "
        f"({used_before.get('bytes_per_message')} B/message: each landed read's key row stays "
        "for the redelivery retention, ~70 min). After the upstream returned, "
        f"the {drain['backlog_messages']:,}-message backlog was upstream "
        f"{drain.get('seconds_from_return')} s later ({drain.get('seconds_from_reconnect')} s "
        f"after fxgate reconnected): {drain.get('rate_from_return')} msg/s with "
        f"{RATE:.0f} msg/s live; live reads meanwhile reached the table in p50/p99/max "
        f"{lag['drain'].get('p50')}/{lag['drain'].get('p99')}/{lag['drain'].get('max')} s. "
        "Live reads published during the drain queue behind the backlog upstream (DESIGN "
        "§7.6): the daemon's upstream lag (status.json, oldest unforwarded read) was down to "
        f"live traffic (<= {LIVE_UPSTREAM_SECONDS:.0f} s old) "
        f"{drain.get('status_upstream_lag_live_at')} s after the return." + load_sentence(main)
    )
    if old_run is not None:
        text += (
            f" The code of {OLD_COMMIT}, same scenario with a "
            f"{old_run['scenario']['window']:.0f} s outage: {old_run['lost']:,} of "
            f"{old_run['published']['messages']:,} reads lost (the source mosquitto logged "
            f"{old_run['source_mosquitto_dropped_count']} 'dropped' line(s)), "
            f"{old_run['table']['rows_landed_during_outage']:,} rows landed during the outage"
            + (
                f"; today's code in the same scenario: {pair['lost']:,} of "
                f"{pair['published']['messages']:,} lost, "
                f"{pair['table']['rows_landed_during_outage']:,} rows landed during the outage"
                if pair
                else ""
            )
            + "."
        )
    for label, reason in skipped.items():
        text += f" Run {label} skipped: {reason}."
    return text


# -- the table rows and the plot ---------------------------------------------------------------


def duration(seconds: float) -> str:
    """'10-min' or '100-s': an outage's length as the tables name it."""
    return f"{seconds / 60:.0f}-min" if seconds >= 120 and seconds % 60 == 0 else f"{seconds:.0f}-s"


def _s(value) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _yes(value: bool) -> str:
    return "yes" if value else "**no**"


def rows(result: dict) -> list[list[str]]:
    runs = result["runs"]
    main = runs[result["main_run"]]
    parts = result["met_parts"]
    name = f"`{result['name']}`"
    window = main["scenario"]["window"]
    context = (
        f"{duration(window)} upstream outage at {RATE:.0f} msg/s QoS {SOURCE_QOS}, source "
        f"mosquitto max_queued_messages {SOURCE_LIMITS['max_queued_messages']} / "
        f"max_inflight {SOURCE_LIMITS['max_inflight_messages']}, default fxgate config"
    )
    lag = main["table_lag"]
    drain = main["drain"]
    half = main["python_rss_growth_second_half"] or {}
    jvm_half = main["jvm_rss_growth_second_half"] or {}
    used = main["ledger_growth"].get("outage", {}).get("ledger_used_bytes") or {}
    files = main["ledger_growth"].get("outage", {}).get("ledger_file_bytes") or {}
    used_before = main["ledger_growth"].get("no_outage", {}).get("ledger_used_bytes") or {}
    up, table = main["upstream"], main["table"]
    out = [
        [
            f"{name} loss",
            f"{context}: published vs landed vs forwarded (QoS {ROUTE_QOS}) after the drain",
            "—",
            f"{main['published']['messages']:,} published: table {table['missing']:,} missing / "
            f"{table['duplicates']} dup; upstream {up['missing']:,} missing / "
            f"{up['duplicates']} dup; mosquitto 'dropped' lines: "
            f"{main['source_mosquitto_dropped_count']}",
            "—",
            "0 lost, each once",
            _yes(parts["zero_lost_each_once"]),
            "1 run" + other_load(main),
        ],
        [
            f"{name} table lag",
            "publish → row visible in `reads`, p50 / p99, reads published during the outage; "
            f"baseline: the {window:.0f} s before it, upstream up",
            f"{_s(lag['no_outage'].get('p50'))} / {_s(lag['no_outage'].get('p99'))}",
            f"{_s(lag['outage'].get('p50'))} / {_s(lag['outage'].get('p99'))} "
            f"({table['rows_landed_during_outage']:,} rows landed during the outage)",
            (
                f"{lag['outage']['p99'] / lag['no_outage']['p99']:.2f}\u00d7"
                if lag["outage"].get("p99") and lag["no_outage"].get("p99")
                else "—"
            ),
            f"p99 ≤ {1 + LAG_TOLERANCE:.1f}\u00d7 baseline",
            _yes(parts["table_lag_p99_not_worse"]),
            f"{lag['outage'].get('count', 0):,}+{lag['no_outage'].get('count', 0):,} reads",
        ],
        [
            f"{name} memory",
            "daemon (Python) RSS growth over the outage's second half (least-squares); JVM in "
            "brackets; baseline: Python RSS at the cut",
            f"{(main['rss_bytes']['python']['outage'].get('first') or 0) / MIB:,.1f} MiB",
            f"{(half.get('growth_bytes') or 0) / MIB:+.1f} MiB (JVM "
            f"{(jvm_half.get('growth_bytes') or 0) / MIB:+.1f} MiB, max "
            f"{(main['rss_bytes']['jvm']['whole_run'].get('max') or 0) / MIB:,.0f} MiB)",
            "—",
            f"< {main['rss_bound_bytes'] / MIB:.1f} MiB",
            _yes(parts["python_rss_flat"]),
            f"{len(main['series'])} samples" + other_load(main),
        ],
        [
            f"{name} ledger growth",
            "the inbound ledger during the outage (least-squares): used pages "
            "(`ledger.budget.used_bytes`), the file + WAL in brackets; baseline: used pages "
            "in the window before, both sinks up (key rows kept ~70 min for redeliveries)",
            f"{used_before.get('bytes_per_hour', 0) / MIB:,.0f} MiB/h, "
            f"{used_before.get('bytes_per_message')} B/msg",
            f"{used.get('bytes_per_hour', 0) / MIB:,.0f} MiB/h, "
            f"{used.get('bytes_per_message')} B/msg ({files.get('bytes_per_hour', 0) / MIB:,.0f} "
            f"MiB/h, {files.get('bytes_per_message')} B/msg)",
            (
                f"{used['bytes_per_hour'] / used_before['bytes_per_hour']:.2f}\u00d7"
                if used.get("bytes_per_hour") and used_before.get("bytes_per_hour")
                else "—"
            ),
            "report only",
            "—",
            f"{len(main['series'])} samples",
        ],
        [
            f"{name} drain",
            f"the upstream's backlog after the outage, {RATE:.0f} msg/s live on: upstream's "
            "return → last backlog message upstream; live reads' table lag p99 / max meanwhile",
            "—",
            f"{drain['backlog_messages']:,} msgs in {_s(drain.get('seconds_from_return'))} "
            f"({drain.get('rate_from_return') or 0:,.0f} msg/s); live table lag "
            f"{_s(lag['drain'].get('p99'))} / {_s(lag['drain'].get('max'))}",
            "—",
            f"≥ {DRAIN_TARGET_RATE:,.0f} msg/s ({DRAIN_TARGET_MESSAGES:,} in "
            f"{DRAIN_TARGET_SECONDS:.0f} s); live p99 ≤ {LIVE_TABLE_LAG_TARGET:.0f} s",
            _yes(parts["drain_rate"] and parts["live_table_lag_during_drain"]),
            "1 run" + other_load(main),
        ],
    ]
    old = next((r for r in runs.values() if r["code"] == "old"), None)
    if old is not None:
        pair = next(
            (
                r
                for r in runs.values()
                if r["code"] == "new" and r["scenario"]["window"] == old["scenario"]["window"]
            ),
            None,
        )

        def cell(run: dict) -> str:
            return (
                f"{run['lost']:,} of {run['published']['messages']:,} lost; "
                f"{run['table']['rows_landed_during_outage']:,} rows landed during the outage; "
                f"'dropped' lines {run['source_mosquitto_dropped_count']}"
            )

        out.append(
            [
                f"{name} vs {result['old_commit']}",
                f"same scenario, {duration(old['scenario']['window'])} outage: the code before "
                f"issue 12 (baseline: {result['old_commit']}, a full tier 2 paused the source "
                "and only upstream-acked packs landed) and today's",
                cell(old),
                cell(pair) if pair else "—",
                "—",
                "0 lost (today's)",
                _yes(pair is not None and pair["delivered_once"]),
                "1+1 runs" + (other_load(old) if old else ""),
            ]
        )
    return out


def plot(results_dir: Path, result: dict) -> Path:
    path = results_dir / f"{result['name']}.png"
    runs = result["runs"]
    main = runs[result["main_run"]]
    series = main["series"]
    marks = main["marks"]
    t = [s["t"] for s in series]
    fig = plt.figure(figsize=(11, 12), dpi=110)
    grid = fig.add_gridspec(4, 1, height_ratios=(1, 1, 1.2, 1))
    memory = fig.add_subplot(grid[0])
    ledger = fig.add_subplot(grid[1], sharex=memory)
    lag = fig.add_subplot(grid[2], sharex=memory)
    side = fig.add_subplot(grid[3])

    def values(key: str, scale: float = 1.0, run: list[dict] = series) -> list[float | None]:
        return [None if s.get(key) is None else s[key] / scale for s in run]

    memory.plot(t, values("python_rss", MIB), color="tab:orange", label="daemon (Python) RSS")
    memory.set_ylabel("Python RSS (MiB)")
    jvm = memory.twinx()
    jvm.plot(t, values("jvm_rss", MIB), color="tab:blue", alpha=0.7, label="Spark JVM RSS")
    jvm.set_ylabel("JVM RSS (MiB)")

    ledger.plot(
        t, values("ledger_used_bytes", MIB), color="tab:green", label="ledger used pages (MiB)"
    )
    ledger.plot(
        t,
        values("ledger_file_bytes", MIB),
        color="tab:olive",
        linestyle="--",
        label="ledger.sqlite + WAL size (MiB)",
    )
    ledger.set_ylabel("MiB")
    backlog = ledger.twinx()
    backlog.plot(
        t,
        values("upstream_lag_messages"),
        color="tab:brown",
        alpha=0.6,
        label="upstream's lag (messages)",
    )
    backlog.plot(
        t, values("table_lag_messages"), color="tab:cyan", alpha=0.6, label="table's lag (msgs)"
    )
    backlog.set_ylabel("messages")
    backlog.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))

    lag.plot(
        t,
        values("upstream_lag_seconds"),
        color="tab:brown",
        label="upstream: oldest unforwarded read's age (status.json)",
    )
    lag.plot(
        t,
        values("table_lag_seconds"),
        color="tab:cyan",
        label="table: oldest unlanded read's age (status.json)",
    )
    by_second = main["table_lag_by_second"]
    lag.plot(
        [row[0] for row in by_second],
        [row[3] for row in by_second],
        color="black",
        linewidth=0.6,
        alpha=0.7,
        label="table lag per read, max per second published",
    )
    lag.axhline(LIVE_TABLE_LAG_TARGET, color="tab:red", linewidth=0.8, linestyle=":")
    lag.set_yscale("symlog", linthresh=1.0)
    lag.set_ylim(bottom=0)
    lag.set_ylabel("seconds")
    lag.set_xlabel("seconds since the daemon started")

    for index, ax in enumerate((memory, ledger, lag)):
        ax.axvspan(
            marks["outage_start"],
            marks["outage_end"],
            color="tab:red",
            alpha=0.08,
            label="upstream outage" if index == 0 else None,
        )
        if "drain_done" in marks:
            ax.axvspan(
                marks["outage_end"],
                marks["drain_done"],
                color="tab:green",
                alpha=0.1,
                label="drain" if index == 0 else None,
            )
        ax.axvline(marks["window_start"], color="grey", linewidth=0.6, linestyle="--")
        ax.grid(alpha=0.3)
    memory.set_ylim(bottom=0)
    jvm.set_ylim(bottom=0)
    ledger.set_ylim(bottom=0)
    backlog.set_ylim(bottom=0)
    for ax, twin in ((memory, jvm), (ledger, backlog), (lag, None)):
        handles, labels = ax.get_legend_handles_labels()
        if twin is not None:
            more_handles, more_labels = twin.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
        ax.legend(handles, labels, fontsize=7, loc="upper left", frameon=False)

    # Side by side: the old code's run and today's in the same scenario (else the main run).
    old = next((r for r in runs.values() if r["code"] == "old"), None)
    shown = (
        [r for r in runs.values() if r["scenario"]["window"] == old["scenario"]["window"]]
        if old is not None
        else [main]
    )
    styles = {"old": "--", "new": "-"}
    for run in shown:
        cut = run["marks"]["outage_start"]
        xs = [s["t"] - cut for s in run["series"]]
        tag = run["commit"][:7] if run["commit"] else "today's code"
        style = styles[run["code"]]
        for key, color, what in (
            ("sent", "grey", "published"),
            ("table_visible", "tab:blue", "rows visible in the table"),
            ("upstream_received", "tab:purple", "received upstream"),
        ):
            side.plot(
                xs,
                values(key, run=run["series"]),
                color=color,
                linestyle=style,
                label=f"{tag}: {what}",
            )
        side.axvspan(
            0,
            run["marks"]["outage_end"] - cut,
            color="tab:red",
            alpha=0.05,
        )
    side.set_xlabel("seconds since the outage began (shaded: the outage)")
    side.set_ylabel("messages")
    side.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    side.grid(alpha=0.3)
    side.legend(fontsize=6, loc="upper left", frameon=False, ncol=2)
    fig.suptitle(f"{result['title']}\nmet: {result['met']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, outage, True),)
