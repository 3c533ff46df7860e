"""The benchmarks of issue 5 built so far: each runs its baseline and fxgate alternately in one run.

Every sample is one round of `bench.harness` (fresh broker, queued session, timed drain). A
benchmark returns one result document; `bench.report` writes it out. Numbers come only from the
samples taken here; the texts under "bound" are assembled from those numbers.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil

from actors.config.schema import LedgerConfig
from actors.devtools.simulate import TagEventGenerator
from bench import machine
from bench.diagnostics import fsync_latency, receive_maximum_overshoot
from bench.harness import (
    BARE_CLIENT_ID,
    FXGATE_CLIENT_ID,
    PUBLISHING_READERS,
    READERS_TOPIC,
    GatewayWorker,
    LoadMeter,
    fresh_broker,
    fxgate_env,
    prequeue,
    py_spy,
    run_bare_subscriber,
    wait_for_quiet,
)
from bench.profiling import summarize_raw

log = logging.getLogger(__name__)

PY_SPY_RATE = 200

# Issue 16's targets: ingest as a ratio to the bare subscriber per QoS; batched reads/s.
INGEST_TARGET = {1: 0.9, 2: 1.0}
BATCHED_TARGET = 100_000
# fxgate's default [ledger] intake_max_messages: what its mailbox should never exceed.
INTAKE_MAX_MESSAGES = LedgerConfig().intake_max_messages


# Before each sample, wait (at most Settings.quiet_timeout s) until the rest of the machine uses
# less than this many cores: other people's test suites share this box.
QUIET_OTHER_CORES = 0.3


@dataclass(frozen=True)
class Settings:
    quick: bool
    rounds: int
    profile: bool
    results_dir: Path
    work_dir: Path
    quiet_timeout: float = 30.0  # per sample
    quiet_budget: float = 60.0  # for the whole run
    extra_rounds: int = 2
    # No extra rounds once the run is this old (monotonic seconds since `started`).
    extra_rounds_until: float = 420.0
    started: float = field(default_factory=time.monotonic)


@dataclass
class Context:
    settings: Settings
    _workers: dict[str, GatewayWorker] = field(default_factory=dict)
    _warmed: set[tuple[str, bool]] = field(default_factory=set)
    _seq: itertools.count = field(default_factory=lambda: itertools.count(1))
    quiet_waited: float = 0.0
    code_versions: set[str] = field(default_factory=set)

    def next_dir(self, label: str) -> Path:
        return self.settings.work_dir / f"{next(self._seq):03d}-{label}"

    def seed(self) -> int:
        return next(self._seq) * 7919

    def worker(self, spark_env: dict[str, str], batch: int = 1) -> GatewayWorker:
        """A warm gateway worker for these Spark settings (one JVM per distinct setting),
        warmed up for this kind of payload (single reads or arrays) by one unmeasured run."""
        key = json.dumps(spark_env, sort_keys=True)
        worker = self._workers.get(key)
        if worker is None or not worker.alive:
            directory = self.next_dir("worker")
            log.info("gateway worker (Spark settings %s) in %s", spark_env or "defaults", directory)
            worker = GatewayWorker(directory, spark_env)
            self._workers[key] = worker
            self.code_versions.add(machine.git_state()["product_commit"])
        kind = (key, batch > 1)
        if kind not in self._warmed:
            # Not measured: the first Spark job of a JVM costs 3-5 s of JIT (DESIGN §4), and
            # the first arrays take the parser's other path.
            fxgate_sample(
                self,
                worker,
                qos=1,
                messages=4000 if batch == 1 else 40_000 // batch,
                batch=batch,
                overrides=dict(spark_env),
                label="warmup",
            )
            self._warmed.add(kind)
        return worker

    def background_cpu(self) -> float:
        """CPU seconds so far of every gateway worker and its children (the JVMs)."""
        total = 0.0
        for worker in self._workers.values():
            try:
                process = psutil.Process(worker.pid)
                for p in (process, *process.children(recursive=True)):
                    times = p.cpu_times()
                    total += times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return total

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()


# -- one sample -----------------------------------------------------------------------------


def fxgate_sample(
    ctx: Context,
    worker: GatewayWorker,
    *,
    qos: int,
    messages: int,
    batch: int,
    overrides: dict[str, str],
    label: str,
    timeout: float = 150.0,
) -> dict:
    directory = ctx.next_dir(label)
    with fresh_broker(directory / "broker") as broker:
        queued = prequeue(broker, FXGATE_CLIENT_ID, messages, qos, batch, ctx.seed())
        env = fxgate_env(broker, directory / "data", qos, **overrides)
        result = worker.ingest(env, qos, messages, messages * batch, broker.pid, timeout=timeout)
    shutil.rmtree(directory, ignore_errors=True)
    rows = messages * batch
    return {
        "messages_per_second": messages / result["ack_seconds"],
        "reads_per_second_to_table": rows / result["table_seconds"],
        "reads_per_second_sustained": sustained_rate(result["batches"]),
        "config_overrides": overrides,
        "queued": queued,
        **result,
    }


def sustained_rate(batches: list[list[float]]) -> float | None:
    """Rows/s into the table from the first PUBLISH to the commit of the next-to-last batch.

    The last batch of a finite backlog is usually a remainder that waited out
    `spark.batch_max_seconds` (1 s by default) before its job: end-to-end figures then depend on
    how the sample size divides into jobs. Leaving that batch out measures what the Spark leg
    keeps up while there is a backlog; both figures are reported."""
    if len(batches) < 2:
        return None
    *before_last, _ = batches
    at, landed = before_last[-1][0], sum(r for _, r in before_last)
    return landed / at if at > 0 else None


def bare_sample(ctx: Context, *, qos: int, messages: int, batch: int, label: str) -> dict:
    directory = ctx.next_dir(label)
    with fresh_broker(directory / "broker") as broker:
        queued = prequeue(broker, BARE_CLIENT_ID, messages, qos, batch, ctx.seed())
        # The idle gateway workers (and their JVMs) share the machine with the baseline: say
        # how much CPU they took meanwhile, so a disturbed baseline would show.
        background = ctx.background_cpu()
        began = time.monotonic()
        result = run_bare_subscriber(broker, qos, messages, parse=batch > 1)
        background_seconds = ctx.background_cpu() - background
        window = time.monotonic() - began
    shutil.rmtree(directory, ignore_errors=True)
    return {
        "messages_per_second": messages / result["seconds"],
        "reads_per_second": result["reads"] / result["seconds"],
        "queued": queued,
        "background_cpu_seconds": round(background_seconds, 3),
        "background_window_seconds": round(window, 3),
        **result,
    }


def alternate(
    ctx: Context,
    contestants: list[tuple[str, Callable[[], dict]]],
    value: Callable[[dict], float],
    rounds: int | None = None,
) -> list[dict]:
    """Round 1: A, B; round 2: A, B; ... Every sample keeps its round, its place in the run and
    the load the rest of the machine put on it. A round in which other processes took
    QUIET_OTHER_CORES or more is "disturbed"; up to `settings.extra_rounds` more rounds are run
    to get `rounds` undisturbed ones (`summarize` then uses those)."""
    raw: list[dict] = []
    settings = ctx.settings
    rounds = rounds or settings.rounds
    clean = 0
    round_number = 0
    while clean < rounds and round_number < rounds + settings.extra_rounds:
        if (
            round_number >= rounds
            and time.monotonic() - settings.started > settings.extra_rounds_until
        ):
            print("    (no time left for another round)", flush=True)
            break
        round_number += 1
        disturbed = False
        for role, take in contestants:
            budget = max(0.0, min(settings.quiet_timeout, settings.quiet_budget - ctx.quiet_waited))
            quiet = wait_for_quiet(QUIET_OTHER_CORES, budget)
            ctx.quiet_waited += max(0.0, quiet["waited_seconds"] - 1.0)
            if not quiet["quiet"]:
                print(
                    f"    (other processes still use {quiet['other_cores_before']:.2f} cores "
                    f"after {quiet['waited_seconds']:.0f} s; sampling anyway)",
                    flush=True,
                )
            started = datetime.now(UTC).isoformat(timespec="seconds")
            load = LoadMeter()
            sample = take()
            sample.update(
                role=role,
                round=round_number,
                order=len(raw) + 1,
                started=started,
                machine_load={**load.stop(), "before": quiet},
            )
            raw.append(sample)
            busy = sample["machine_load"]["other_cores"] >= QUIET_OTHER_CORES
            disturbed |= busy
            flag = "  (disturbed)" if busy else ""
            print(f"    round {round_number} {role:>8}: {value(sample):>12,.0f}{flag}", flush=True)
        for sample in raw[-len(contestants) :]:
            sample["round_disturbed"] = disturbed
        clean += not disturbed
    return raw


# -- summaries ------------------------------------------------------------------------------


def samples_used(raw: list[dict]) -> list[dict]:
    """The samples of the undisturbed rounds when two or more are, else all (as `summarize`)."""
    clean = {s["round"] for s in raw if not s.get("round_disturbed")}
    rounds = clean if len(clean) >= 2 else {s["round"] for s in raw}
    return [s for s in raw if s["round"] in rounds]


def median_of(samples: list[dict], pick: Callable[[dict], float | None]) -> float | None:
    values = [v for v in (pick(s) for s in samples) if v is not None]
    return statistics.median(values) if values else None


def _dig(sample: dict, *path: str) -> float | None:
    node: object = sample
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, int | float) else None


def cpu_story(fx: list[dict], base: list[dict] | None, messages: int) -> dict:
    """Median CPU use in fxgate's ack window (and the baseline's drain), per 1,000 messages."""
    window = "cpu_ack_window"
    threads: dict[str, float] = {}
    roles = {r for s in fx for r in s.get(window, {}).get("python_threads_cpu_seconds", {})}
    for role in sorted(roles):
        value = median_of(fx, lambda s, r=role: _dig(s, window, "python_threads_cpu_seconds", r))
        if value is not None:
            threads[role] = round(1e6 * value / messages, 1)
    story = {
        "fxgate_python_cores": median_of(fx, lambda s: _dig(s, window, "python_cores")),
        "fxgate_python_ms_per_1000_messages": round(
            1e6 * median_of(fx, lambda s: _dig(s, window, "python_cpu_seconds")) / messages, 1
        ),
        "fxgate_thread_ms_per_1000_messages": threads,
        "fxgate_jvm_cores": median_of(fx, lambda s: _dig(s, window, "jvm_cores")),
        "broker_cores_during_fxgate": median_of(fx, lambda s: _dig(s, window, "broker_cores")),
    }
    if base:
        story.update(
            baseline_cores=median_of(base, lambda s: s.get("cores")),
            baseline_ms_per_1000_messages=round(
                1e6 * median_of(base, lambda s: s.get("cpu_seconds")) / messages, 1
            ),
            background_cpu_seconds_during_baseline=median_of(
                base, lambda s: s.get("background_cpu_seconds")
            ),
            broker_cores_during_baseline=median_of(base, lambda s: s.get("broker_cores")),
        )
    return story


def describe_bound(story: dict, nproc: int | None, other: float | None = None) -> str:
    """A sentence built from the measured CPU figures: which resource is at its ceiling."""
    python = story.get("fxgate_python_cores") or 0.0
    jvm = story.get("fxgate_jvm_cores") or 0.0
    broker = story.get("broker_cores_during_fxgate") or 0.0
    threads = story.get("fxgate_thread_ms_per_1000_messages", {})
    # bench-* threads are the worker's own instrumentation, not fxgate.
    ranked = sorted(
        ((role, ms) for role, ms in threads.items() if not role.startswith("bench-")),
        key=lambda kv: -kv[1],
    )
    busiest = ", ".join(f"{role} {ms} ms" for role, ms in ranked[:4])
    parts = [
        f"fxgate's Python process ran at {python:.2f} cores in the ack window "
        f"({story.get('fxgate_python_ms_per_1000_messages')} ms CPU per 1,000 messages: "
        f"{busiest})",
        f"the Spark JVM at {jvm:.2f} cores, mosquitto at {broker:.2f} cores",
    ]
    if "baseline_cores" in story:
        parts.append(
            f"the bare subscriber ran at {story['baseline_cores']:.2f} cores and "
            f"{story['baseline_ms_per_1000_messages']} ms CPU per 1,000 messages"
        )
    total = python + jvm + broker
    if other is not None and nproc and total + other >= 0.85 * nproc and other >= 0.3:
        verdict = (
            f"the machine was saturated: other processes took {other:.2f} cores (median over "
            "the fxgate samples), so this figure measures contention more than fxgate"
        )
    elif python >= 0.85:
        verdict = (
            "Python is at one core, the GIL's ceiling: fxgate is bound by its Python CPU per "
            "message (threads above), not by the broker or the disk"
        )
    elif nproc and total >= 0.85 * nproc:
        verdict = f"the machine's {nproc} cores are busy ({total:.2f} cores in all)"
    else:
        verdict = (
            f"no process is at a core ({total:.2f} cores in all): the time goes to waiting "
            "(round trips within the in-flight window, commits)"
        )
    return "; ".join(parts) + ". " + verdict + "."


def summarize(
    *,
    name: str,
    title: str,
    metric: str,
    unit: str,
    raw: list[dict],
    value: Callable[[dict], float],
    baseline_label: str,
    fxgate_label: str,
    target: dict | None,
    setup: dict,
) -> dict:
    for sample in raw:
        sample["value"] = value(sample)
    used = samples_used(raw)
    used_rounds = sorted({s["round"] for s in used})
    base = [s for s in used if s["role"] == "baseline"]
    fx = [s for s in used if s["role"] == "fxgate"]
    b_med = statistics.median(s["value"] for s in base) if base else None
    f_med = statistics.median(s["value"] for s in fx)
    paired = [
        f["value"] / b["value"] for b in base for f in fx if f["round"] == b["round"] and b["value"]
    ]
    ratio = f_med / b_med if b_med else None
    met = None
    if target is not None:
        if target["kind"] == "ratio_at_least":
            met = ratio is not None and ratio >= target["value"]
        elif target["kind"] == "fxgate_at_least":
            met = f_med >= target["value"]
    return {
        "kind": "fxgate-bench",
        "name": name,
        "title": title,
        "metric": metric,
        "unit": unit,
        "setup": setup,
        "baseline": {
            "label": baseline_label,
            "samples": [s["value"] for s in base],
            "median": b_med,
        },
        "fxgate": {"label": fxgate_label, "samples": [s["value"] for s in fx], "median": f_med},
        "ratio": ratio,
        "paired_ratios": paired,
        "paired_ratio_median": statistics.median(paired) if paired else None,
        "target": target,
        "met": met,
        "rounds_used": used_rounds,
        "rounds_disturbed": sorted({s["round"] for s in raw if s.get("round_disturbed")}),
        "raw": raw,
    }


def profile_sentence(profile: dict) -> str:
    """What the --gil profile says, in one sentence built from its numbers."""
    summary = profile.get("gil_samples")
    if not summary:
        return ""
    threads = ", ".join(
        f"{role} {share:.0%}" for role, share in list(summary["per_thread"].items())[:4]
    )
    leaves = "; ".join(f"{frame} {share:.0%}" for frame, share in summary["top_leaf_frames"][:6])
    return (
        f" py-spy --gil (an extra run): of the samples in which a thread held the GIL, "
        f"{threads}; hottest frames: {leaves} (flame graph: {profile['flamegraph']})."
    )


def used(result: dict, role: str) -> list[dict]:
    """The samples of `role` in the rounds the medians were taken from."""
    return [s for s in result["raw"] if s["role"] == role and s["round"] in result["rounds_used"]]


def profile_run(ctx: Context, name: str, take: Callable[[], dict], worker: GatewayWorker) -> dict:
    """Two more fxgate runs, not counted: one under `py-spy record` for a flame graph
    (bench/results/<name>-profile.svg), one with --gil to see which thread holds the GIL.
    A failure here is reported in the result; it never discards the measured samples."""
    print(f"    {name}: target missed; profiling two more fxgate runs with py-spy", flush=True)
    try:
        return _profile_run(ctx, name, take, worker)
    except Exception as error:
        log.exception("profiling %s failed", name)
        return {"error": f"{type(error).__name__}: {error}"}


def _profile_run(ctx: Context, name: str, take: Callable[[], dict], worker: GatewayWorker) -> dict:
    svg = ctx.settings.results_dir / f"{name}-profile.svg"
    raw = ctx.settings.work_dir / f"{name}-profile-gil.txt"
    # The worker's Python children too: the forward process, when it has one.
    with py_spy(worker.pid, svg, "flamegraph", ("--subprocesses",)):
        take()
    began = time.monotonic()
    with py_spy(worker.pid, raw, "raw", ("--gil", "--subprocesses")):
        sample = take()
    recorded = time.monotonic() - began
    summary = summarize_raw(raw, PY_SPY_RATE)
    return {
        "flamegraph": svg.name,
        "how": f"py-spy record --pid <worker> --subprocesses --threads --rate {PY_SPY_RATE} "
        "(flame graph); "
        "the same with --gil --format raw for the GIL summary (runs not counted)",
        "gil_run_seconds_recorded": round(recorded, 2),
        "gil_held_seconds_sampled": summary["sampled_seconds"],
        "gil_run_ack_seconds": sample.get("ack_seconds"),
        "gil_run_table_seconds": sample.get("table_seconds"),
        "gil_samples": summary,
    }


# -- the benchmarks -------------------------------------------------------------------------


def payload_bytes(batch: int) -> float:
    generator = TagEventGenerator("fx9600-01", seed=1)
    sizes = [len(generator.next_payload(batch)) for _ in range(50)]
    return round(statistics.mean(sizes), 1)


def common_setup(qos: int, messages: int, batch: int) -> dict:
    return {
        "qos": qos,
        "messages_per_sample": messages,
        "reads_per_message": batch,
        "payload_bytes_mean": payload_bytes(batch),
        "topic": READERS_TOPIC.replace("+", "fx9600-NN"),
        "publishers": f"actors.devtools.simulate.simulate: {PUBLISHING_READERS} readers, paho, "
        "window 20 each, rate 0; every message acknowledged by the broker before the drain starts",
        "broker": "actors.devtools.mosquitto.MosquittoProcess (mosquitto, loopback, persistence "
        "on, autosave 1 s, max_queued_messages 1M, max_inflight_messages 1000), fresh per sample",
        "timed": "first PUBLISH decoded by the drainer -> its N-th final ack (PUBACK at QoS 1, "
        "PUBCOMP at QoS 2) handed to paho",
        "baseline_client": "bench/bare_subscriber.py: paho 2.2 Client, MQTT 5, manual_ack, "
        "persistent session, ack in on_message; no Receive Maximum sent (paho default)",
        "fxgate_process": "bench/gateway_worker.py: actors.app.daemon.Gateway (the daemon's code: "
        "Supervisor, actors, status.json every 1 s) in its own process with one warm Spark "
        "session reused by every run; fresh ledger and tables per sample; Receive Maximum 200 "
        "(packs.max_messages)",
    }


# Queued messages per sample. QoS 2 stays short on purpose: mosquitto 2.0.11's CPU per QoS 2
# message grows with the queue it drains (see `queue_length_scan` in ingest-qos2.json), and past
# ~16k queued it, not the client, sets the pace for both contestants.
INGEST_MESSAGES = {1: 40_000, 2: 10_000}
INGEST_MESSAGES_QUICK = {1: 20_000, 2: 8_000}
QUEUE_SCAN = (4_000, 8_000, 16_000, 32_000)


def queue_length_scan(ctx: Context, qos: int) -> list[dict]:
    """The bare subscriber once per queue length: its rate, its CPU and the broker's."""
    scan = []
    for messages in QUEUE_SCAN:
        sample = bare_sample(ctx, qos=qos, messages=messages, batch=1, label="scan")
        scan.append(
            {
                "queued": messages,
                "messages_per_second": round(sample["messages_per_second"]),
                "subscriber_cores": sample.get("cores"),
                "broker_cores": sample.get("broker_cores"),
            }
        )
        print(
            f"    scan: {messages:>6} queued -> {sample['messages_per_second']:>8,.0f} msg/s "
            f"(subscriber {sample.get('cores')} cores, broker {sample.get('broker_cores')})",
            flush=True,
        )
    return scan


def ingest(ctx: Context, qos: int) -> dict:
    name = f"ingest-qos{qos}"
    messages = (INGEST_MESSAGES_QUICK if ctx.settings.quick else INGEST_MESSAGES)[qos]
    worker = ctx.worker({})

    def take_fx() -> dict:
        return fxgate_sample(
            ctx, worker, qos=qos, messages=messages, batch=1, overrides={}, label=f"{name}-fx"
        )

    raw = alternate(
        ctx,
        [
            (
                "baseline",
                lambda: bare_sample(ctx, qos=qos, messages=messages, batch=1, label=f"{name}-bare"),
            ),
            ("fxgate", take_fx),
        ],
        lambda s: s["messages_per_second"],
    )
    result = summarize(
        name=name,
        title=f"Ingest ceiling, QoS {qos}, single-read messages",
        metric="messages/s from the first PUBLISH to the last final ack (ledger committed first "
        "for fxgate)",
        unit="msg/s",
        raw=raw,
        value=lambda s: s["messages_per_second"],
        baseline_label="bare paho 2.2 subscriber, manual ack",
        fxgate_label="fxgate source -> ledger (commit) -> ack, daemon running whole",
        # Issue 16's bars: 0.9x at QoS 1, 1.0x at QoS 2.
        target={
            "kind": "ratio_at_least",
            "value": INGEST_TARGET[qos],
            "description": f">= {INGEST_TARGET[qos]}x the bare paho subscriber",
        },
        setup={
            **common_setup(qos, messages, 1),
            "fxgate_config": "defaults (configs/gateway.toml)",
        },
    )
    fx = used(result, "fxgate")
    result["time_to_table"] = {
        "what": "first PUBLISH -> every row in the Delta `reads` table (batch committed), "
        "same fxgate runs, default batching (a commit per 20,000 messages, 8 MiB or 1 s; "
        "linger 1 s)",
        "seconds_samples": [s["table_seconds"] for s in fx],
        "seconds_median": median_of(fx, lambda s: s["table_seconds"]),
        "rows_per_second_samples": [s["reads_per_second_to_table"] for s in fx],
        "rows_per_second_median": median_of(fx, lambda s: s["reads_per_second_to_table"]),
    }
    base = used(result, "baseline")
    story = cpu_story(fx, base, messages)
    result["cpu"] = story
    inbox = median_of(fx, lambda s: _dig(s, "during_ingest", "ledger_inbox_max"))
    waiting = median_of(fx, lambda s: _dig(s, "during_ingest", "ledger_waiting_publishes_max"))
    rss = median_of(fx, lambda s: _dig(s, "during_ingest", "python_rss_max_bytes"))
    result["ledger_mailbox"] = {
        "what": "deepest the InboundLedger's mailbox got in each fxgate run (sampled every "
        "100 ms), in actor messages and in PUBLISHes handed over and not yet taken (the source "
        "hands them over up to 100 per message), with fxgate's Receive Maximum at 200; and the "
        "daemon's largest RSS",
        "max_depth_samples": [_dig(s, "during_ingest", "ledger_inbox_max") for s in fx],
        "max_depth_median": inbox,
        "max_publishes_waiting_samples": [
            _dig(s, "during_ingest", "ledger_waiting_publishes_max") for s in fx
        ],
        "max_publishes_waiting_median": waiting,
        "python_rss_max_bytes_median": rss,
        # When the first Spark batch committed vs when the last ack left: a first batch after
        # the acks means the writer's flush (due 2 s in) waited behind the mailbox.
        "first_spark_batch_seconds_median": median_of(
            fx, lambda s: s["batches"][0][0] if s.get("batches") else None
        ),
        "ack_seconds_median": median_of(fx, lambda s: s["ack_seconds"]),
    }
    check = receive_maximum_overshoot(ctx.next_dir("receive-maximum"), qos=qos)
    result["receive_maximum_check"] = check
    other = median_of(fx, lambda s: _dig(s, "machine_load", "other_cores"))
    limit = INTAKE_MAX_MESSAGES
    result["bound"] = (
        describe_bound(story, os.cpu_count(), other)
        + f" Flow: a plain paho client that advertised Receive Maximum "
        f"{check['receive_maximum_sent']} had {check['unacked_with_acks_held']} unacknowledged "
        f"while holding its acks but up to {check['unacked_max']:,} once it acked every "
        f"{check['ack_interval_seconds']} s: mosquitto overshoots the Receive Maximum while a "
        f"queued session drains. fxgate's intake gate (at most {limit:,} PUBLISHes handed to "
        f"the ledger and not yet taken, handed over up to 100 at a time) held its mailbox to "
        f"{waiting or 0:,.0f} PUBLISHes in {inbox or 0:,.0f} messages (median of the runs' "
        "deepest)"
        + (
            " (group-commit flushes and asks come on top)."
            if waiting is not None and waiting < limit + 100
            else f", above the gate's limit of {limit:,}: the gate did not hold."
        )
    )
    if qos == 2 and not ctx.settings.quick:
        result["queue_length_scan"] = {
            "what": "bare subscriber, one sample per queue length: why QoS 2 samples queue "
            f"{messages:,} messages",
            "samples": queue_length_scan(ctx, qos),
        }
    if result["met"] is False and ctx.settings.profile:
        result["profile"] = profile_run(ctx, name, take_fx, worker)
        result["bound"] += profile_sentence(result["profile"])
    return result


def durability(ctx: Context, qos: int) -> dict:
    name = f"durability-qos{qos}"
    messages = (INGEST_MESSAGES_QUICK if ctx.settings.quick else INGEST_MESSAGES)[qos]
    worker = ctx.worker({})

    def take(level: str) -> Callable[[], dict]:
        return lambda: fxgate_sample(
            ctx,
            worker,
            qos=qos,
            messages=messages,
            batch=1,
            overrides={"FXGATE__GATEWAY__DURABILITY": level},
            label=f"{name}-{level}",
        )

    raw = alternate(
        ctx,
        [("baseline", take("process")), ("fxgate", take("power"))],
        lambda s: s["messages_per_second"],
        # fxgate against itself: the difference is small next to run-to-run spread, so two
        # more rounds than the others (full runs only).
        rounds=ctx.settings.rounds + (0 if ctx.settings.quick else 2),
    )
    result = summarize(
        name=name,
        title=f"Durability cost, QoS {qos}: durability=power vs process",
        metric="fxgate ingest messages/s (first PUBLISH -> last final ack)",
        unit="msg/s",
        raw=raw,
        value=lambda s: s["messages_per_second"],
        baseline_label="fxgate, durability=process (WAL, synchronous=NORMAL)",
        fxgate_label="fxgate, durability=power (synchronous=FULL)",
        target=None,
        setup={
            **common_setup(qos, messages, 1),
            "fxgate_config": "defaults but FXGATE__GATEWAY__DURABILITY",
        },
    )
    result["target"] = {"kind": "report", "description": "measured cost (no target)"}
    commits = {
        role: median_of(used(result, role), lambda s: _dig(s, "ledger", "commits"))
        for role in ("baseline", "fxgate")
    }
    result["ledger_commits_median"] = {"process": commits["baseline"], "power": commits["fxgate"]}
    sync = fsync_latency(ctx.next_dir("fsync"))
    power_seconds = median_of(used(result, "fxgate"), lambda s: s["ack_seconds"])
    result["fsync"] = sync
    syncing = (commits["fxgate"] or 0) * sync["ms_median"] / 1000

    def spread(role: str) -> float:
        values = [s["value"] for s in used(result, role)]
        return (max(values) - min(values)) / statistics.median(values)

    result["spread"] = {"process": spread("baseline"), "power": spread("fxgate")}
    result["bound"] = (
        f"durability=power syncs the WAL at each group commit: {commits['fxgate']:.0f} commits "
        f"per run (median) x {sync['ms_median']:.2f} ms per fdatasync here = about "
        f"{syncing:.2f} s of a {power_seconds:.2f} s ingest, "
        f"{100 * syncing / power_seconds:.1f} % expected; the samples themselves spread "
        f"{100 * result['spread']['process']:.0f} % (process) and "
        f"{100 * result['spread']['power']:.0f} % (power) from lowest to highest, so the "
        "ratio is within run-to-run noise. The group commit (up to 200 messages or 5 ms) keeps "
        "syncs few; on a disk whose syncs are slower the cost "
        "is commits x sync latency."
    )
    for role, level in (("baseline", "process"), ("fxgate", "power")):
        samples = used(result, role)
        result[f"cpu_{level}"] = cpu_story(samples, None, messages)
    return result


def batched_value(sample: dict) -> float:
    if sample["role"] == "baseline":
        return sample["reads_per_second"]
    sustained = sample.get("reads_per_second_sustained")
    return sustained if sustained is not None else sample["reads_per_second_to_table"]


def batched(ctx: Context, batch: int) -> dict:
    name = f"batched-{batch}"
    reads = 300_000 if not ctx.settings.quick else 200_000
    messages = reads // batch
    worker = ctx.worker({}, batch=batch)

    def take_fx() -> dict:
        return fxgate_sample(
            ctx, worker, qos=1, messages=messages, batch=batch, overrides={}, label=f"{name}-fx"
        )

    raw = alternate(
        ctx,
        [
            (
                "baseline",
                lambda: bare_sample(
                    ctx, qos=1, messages=messages, batch=batch, label=f"{name}-bare"
                ),
            ),
            ("fxgate", take_fx),
        ],
        batched_value,
    )
    result = summarize(
        name=name,
        title=f"Batched payloads: {batch} tag events per message, QoS 1, into the table",
        metric="reads/s: fxgate sustained into the `reads` table (first PUBLISH -> commit of "
        "the next-to-last batch, see sustained_rate; end-to-end in `end_to_end`); the "
        "baseline from the first PUBLISH to the last ack, JSON-decoding each message",
        unit="reads/s",
        raw=raw,
        value=batched_value,
        baseline_label="bare paho 2.2 subscriber, manual ack, json.loads per message (no table)",
        fxgate_label="fxgate source -> ledger -> packs -> Spark `reads` table",
        target={
            "kind": "fxgate_at_least",
            "value": BATCHED_TARGET,
            "description": f">= {BATCHED_TARGET:,} reads/s into the table",
        },
        setup={
            **common_setup(1, messages, batch),
            "reads_per_sample": reads,
            "fxgate_config": "defaults (configs/gateway.toml): Spark local[2] (batches written "
            "by pyarrow, parsed natively in the writer's thread), a batch per 20,000 messages, "
            "8 MiB of payloads or 1 s",
        },
    )
    fx = used(result, "fxgate")
    result["end_to_end"] = {
        "what": "same fxgate runs: all reads / (last row in the table - first PUBLISH); the last "
        "batch usually waits out batch_max_seconds first",
        "reads_per_second_samples": [s["reads_per_second_to_table"] for s in fx],
        "reads_per_second_median": median_of(fx, lambda s: s["reads_per_second_to_table"]),
        "seconds_median": median_of(fx, lambda s: s["table_seconds"]),
        "spark_batches": [s.get("batches") for s in fx],
    }
    result["ack_rate"] = {
        "what": "same fxgate runs: reads/s from the first PUBLISH to the last ack (ledger only)",
        "reads_per_second_median": median_of(fx, lambda s: batch * s["messages_per_second"]),
    }
    jobs = [s.get("batches_written") for s in fx]
    result["spark_jobs_per_sample"] = jobs
    window = "cpu_table_window"
    result["cpu"] = {
        "window": "first PUBLISH -> last row in the table",
        "spark_jobs_per_sample": jobs,
        "fxgate_python_cores": median_of(fx, lambda s: _dig(s, window, "python_cores")),
        "fxgate_jvm_cores": median_of(fx, lambda s: _dig(s, window, "jvm_cores")),
        "spark_writer_thread_cpu_seconds": median_of(
            fx, lambda s: _dig(s, window, "python_threads_cpu_seconds", "SparkWriterActor")
        ),
        "jvm_cpu_seconds": median_of(fx, lambda s: _dig(s, window, "jvm_cpu_seconds")),
        "table_seconds": median_of(fx, lambda s: s["table_seconds"]),
        "ack_seconds": median_of(fx, lambda s: s["ack_seconds"]),
    }
    c = result["cpu"]
    leg = (
        "the table leg bounds it"
        if c["table_seconds"] > 2 * c["ack_seconds"]
        else "the ingest leg is as slow as the table leg"
    )
    result["bound"] = (
        f"all {reads:,} reads were acked in {c['ack_seconds']:.2f} s but reached the table in "
        f"{c['table_seconds']:.2f} s: {leg}. In that window the SparkWriterActor thread used "
        f"{c['spark_writer_thread_cpu_seconds']:.1f} CPU-s (parsing payloads into Arrow, "
        "natively, and writing the files with pyarrow and delta-rs: "
        f"{statistics.median(jobs):.0f} batches per sample), "
        f"the JVM {c['jvm_cpu_seconds']:.1f} CPU-s, and the daemon's process "
        f"{c['fxgate_python_cores']:.2f} cores, all on the same two cores."
    )
    if result["met"] is False and ctx.settings.profile:
        result["profile"] = profile_run(ctx, name, take_fx, worker)
        result["bound"] += profile_sentence(result["profile"])
    return result


@dataclass(frozen=True)
class Benchmark:
    name: str
    run: Callable[[Context], dict]
    quick: bool  # part of --quick


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("ingest-qos1", lambda ctx: ingest(ctx, 1), True),
    Benchmark("ingest-qos2", lambda ctx: ingest(ctx, 2), True),
    Benchmark("durability-qos1", lambda ctx: durability(ctx, 1), True),
    Benchmark("durability-qos2", lambda ctx: durability(ctx, 2), False),
    Benchmark("batched-100", lambda ctx: batched(ctx, 100), True),
    Benchmark("batched-50", lambda ctx: batched(ctx, 50), False),
)
