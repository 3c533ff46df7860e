"""Issue 5 item 2, the forward leg: messages/s forwarded upstream, QoS 1 and QoS 2.

Four contestants per round, in this order, each on fresh brokers:

- baseline: a bare paho-mqtt 2.2 publisher (this module run as `python -m bench.forward
  publish ...`) with max_inflight 20, publishing N pre-generated simulator payloads (~200 B)
  straight to the upstream broker: the ceiling of one paho client with fxgate's window;
- fxgate (the primary figure): the daemon's own Gateway (bench.gateway_worker, warm Spark) with
  [upstream] and one route at the run's QoS, forwarding N reads already stored in its ledger.
  The upstream broker is not running while fxgate takes the N messages from a queued source
  session (its upstream connection retries with backoff, capped here at RECONNECT_MAX_DELAY);
  once the daemon's status says all N are in its ledger, the upstream broker starts and fxgate
  forwards them from tier 2 (and tier 1 for what did not fit). Like the bare publisher, it only
  moves messages it already has: ingest is not in the timed window;
- draining: the same daemon forwarding while it drains the source session, the upstream broker
  up from the start: ingest (a ledger commit and a source ack per message) in the daemon's
  process, the forward leg in its own (the default, `[upstream] process = "own"`);
- shared (QoS 1, report only): `draining` again with the forward leg in the daemon's process
  (`process = "shared"`): ingest and forwarding on one interpreter, as before it had its own;
- bridge: a mosquitto bridging the same N queued messages from the source broker to the
  upstream broker (bench.bridge.BridgeBroker), like `draining` taking from the source as it
  forwards.

Every contestant is timed by the same instrument on the upstream broker (bench.bridge.
ArrivalCounter): first -> N-th arrival, which is the forwarder's first PUBLISH -> last ack to
within a loopback round trip (so fxgate's reconnect delay is not in it). The bare publisher
also times itself (first publish() -> N-th on_publish) as a check on that instrument.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import resource
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib
import matplotlib.ticker
import psutil

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from actors.app.daemon import STATUS_FILE
from actors.devtools.mosquitto import MosquittoProcess
from actors.devtools.simulate import simulate
from bench.benchmarks import (
    Benchmark,
    Context,
    alternate,
    common_setup,
    profile_run,
    profile_sentence,
    summarize,
    used,
)
from bench.bridge import ArrivalCounter, BridgeBroker
from bench.harness import (
    ENVIRONMENT_ID,
    FXGATE_CLIENT_ID,
    INSTANCE_ID,
    PUBLISHING_READERS,
    READERS_TOPIC,
    BenchError,
    GatewayWorker,
    fresh_broker,
    fxgate_env,
    prequeue,
    run_json_command,
)

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
MODULE = "bench.forward"
WINDOW = 20  # the bare publisher's max_inflight, and fxgate's default upstream.window

# Multiples of the pack size (200), so that no last pack waits out the 20 s pack timeout. The
# tier-2 buffer pauses the source at 80 % of its 10,000-message cap; of 8,000 stored messages
# the outbound ledger holds the first pack, so tier 2 stays at 7,800, just under that mark.
MESSAGES = {1: 8_000, 2: 5_000}
MESSAGES_QUICK = {1: 6_000, 2: 3_000}
ROLES = ("baseline", "fxgate", "draining", "bridge", "shared")

# fxgate's upstream retries every 1 s, 2 s, 4 s, ... up to 120 s (jitter 25 %) by default;
# capped here so that the stored-forward sample does not wait minutes for the next attempt.
RECONNECT_MAX_DELAY = 2.0
# `{client_id}-{environment}-{instance}` of the upstream connection (DESIGN §5).
UPSTREAM_CLIENT_ID = f"fxgate-upstream-{ENVIRONMENT_ID}-{INSTANCE_ID}"
# actors.connection logs this when an attempt failed and the next one is scheduled.
RETRY_LINE = re.compile(r"upstream: reconnecting in ([0-9.]+) s")
POLL_SECONDS = 0.05
RUN_TIMEOUT = 120.0  # per gateway run (the worker's own limit for the acks, then the table)
# Issue 16: forwarding while draining the source, QoS 1, at least this ratio to the bare publisher.
DRAINING_TARGET = 0.8


# -- the bare publisher (a process of its own) -------------------------------------------------


def publisher_main(argv: list[str]) -> int:
    """Publish N payloads with one paho client, at most WINDOW unacknowledged, and print one
    JSON line: seconds from the first publish() to the N-th on_publish, CPU, failures."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    from actors.devtools.simulate import TagEventGenerator, reader_names

    parser = argparse.ArgumentParser(prog="python -m bench.forward publish")
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--qos", type=int, required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)

    # Generated before the clock starts: fxgate and the bridge only move payloads too.
    generators = [TagEventGenerator(r, seed=args.seed) for r in reader_names(PUBLISHING_READERS)]
    payloads = [
        (f"zebra/fx/{g.reader}/reads", g.next_payload())
        for _ in range(args.messages // len(generators))
        for g in generators
    ]
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, "bench-bare-publisher", protocol=MQTTProtocolVersion.MQTTv5
    )
    client.max_inflight_messages_set(WINDOW)
    # Our own window too: paho's queue scan is quadratic in what it holds (DESIGN §4).
    window = threading.Semaphore(WINDOW)
    connected = threading.Event()
    finished = threading.Event()
    state = {"acked": 0, "failed": 0, "done": None}

    def on_connect(*_args) -> None:
        connected.set()

    def on_publish(_client, _userdata, _mid, reason_code, _properties) -> None:
        state["acked"] += 1
        state["failed"] += bool(reason_code.is_failure)
        window.release()
        if state["acked"] == len(payloads):
            state["done"] = time.monotonic()
            finished.set()

    client.on_connect = on_connect
    client.on_publish = on_publish
    client.connect(args.host, args.port, keepalive=60, clean_start=True)
    client.loop_start()
    result: dict = {"ok": False, "messages": len(payloads)}
    try:
        if not connected.wait(10):
            result["error"] = "no CONNACK"
            return 1
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        first = time.monotonic()
        for topic, payload in payloads:
            if not window.acquire(timeout=args.timeout):
                result["error"] = f"window stuck with {state['acked']} acked"
                return 1
            client.publish(topic, payload, qos=args.qos)
        if not finished.wait(args.timeout):
            result["error"] = f"{state['acked']} of {len(payloads)} acked"
            return 1
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        seconds = state["done"] - first
        cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
        result.update(
            ok=state["failed"] == 0,
            seconds=seconds,
            failed=state["failed"],
            cpu_seconds=round(cpu, 3),
            cores=round(cpu / seconds, 3),
            payload_bytes_mean=round(statistics.mean(len(p) for _, p in payloads), 1),
        )
        return 0 if result["ok"] else 1
    finally:
        client.disconnect()
        client.loop_stop()
        print(json.dumps(result), flush=True)


def run_publisher(upstream, qos: int, messages: int, seed: int) -> dict:
    argv = [sys.executable, "-m", MODULE, "publish", upstream.host, str(upstream.port)]
    argv += ["--qos", str(qos), "--messages", str(messages), "--seed", str(seed)]
    return run_json_command(argv, "bare publisher", 300)


# -- one sample per contestant ---------------------------------------------------------------


def _stall_seconds(ctx: Context) -> float:
    return 3.0 if ctx.settings.quick else 5.0


def _arrivals(counter: ArrivalCounter, ctx: Context, messages: int) -> dict:
    arrived = counter.wait(timeout=180.0, stall_seconds=_stall_seconds(ctx))
    seconds = arrived.get("arrival_seconds")
    arrived["messages_per_second"] = (
        arrived["arrived"] / seconds if seconds else 0.0
    )  # over what arrived; a stalled run is flagged and kept out of the median
    arrived["complete"] = arrived["arrived"] >= messages and not arrived["stalled"]
    return arrived


def bare_sample(ctx: Context, qos: int, messages: int) -> dict:
    directory = ctx.next_dir(f"forward-qos{qos}-bare")
    try:
        with fresh_broker(directory / "upstream") as upstream:
            counter = ArrivalCounter(upstream, directory / "counter", messages)
            try:
                published = run_publisher(upstream, qos, messages, ctx.seed())
            finally:
                arrived = _arrivals(counter, ctx, messages)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {
        **arrived,
        "publisher_seconds": published["seconds"],
        "publisher_messages_per_second": messages / published["seconds"],
        "publisher_cores": published.get("cores"),
        "publisher_cpu_seconds": published.get("cpu_seconds"),
        "payload_bytes_mean": published.get("payload_bytes_mean"),
    }


def _route_env(source, upstream: MosquittoProcess, data: Path, qos: int, **extra: str) -> dict:
    return fxgate_env(
        source,
        data,
        qos,
        FXGATE__UPSTREAM__HOST=upstream.host,
        FXGATE__UPSTREAM__PORT=str(upstream.port),
        FXGATE__ROUTES__0__SOURCE=READERS_TOPIC,
        FXGATE__ROUTES__0__QOS=str(qos),
        **extra,
    )


def _cpu(pid: int) -> tuple[float, float]:
    """CPU seconds so far of the gateway worker's Python processes (its own, the forward
    process, the parse workers) and of its JVM."""
    process = psutil.Process(pid)
    times = process.cpu_times()
    python, jvm = times.user + times.system, 0.0
    for child in process.children(recursive=True):
        try:
            child_times = child.cpu_times()
            spent = child_times.user + child_times.system
            if "java" in child.name():
                jvm += spent
            else:
                python += spent
        except psutil.NoSuchProcess:
            continue
    return python, jvm


class _Run:
    """`GatewayWorker.ingest` in a thread of its own: the bench watches the daemon meanwhile.

    The worker answers once the source acks are out, every row is in the table and nothing is
    owed upstream any more (the table lands on its own, before the upstream has them)."""

    def __init__(self, worker: GatewayWorker, env: dict, qos: int, messages: int, source_pid):
        self.answer: dict | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run,
            args=(worker, env, qos, messages, source_pid),
            name="bench-forward-run",
            daemon=True,
        )
        self._thread.start()

    def _run(self, worker, env, qos, messages, source_pid) -> None:
        try:
            self.answer = worker.ingest(
                env, qos, messages, messages, source_pid, RUN_TIMEOUT, wait_upstream=True
            )
        except BaseException as error:  # handed to the bench's thread in result()
            self.error = error

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def result(self) -> dict:
        # The worker's own limits (RUN_TIMEOUT for the acks, again for the table) end the run.
        self._thread.join(2 * RUN_TIMEOUT + 300)
        if self.error is not None:
            raise self.error
        if self.answer is None:
            raise BenchError("the gateway worker did not answer")
        return self.answer


def _poll(
    run: _Run,
    what: str,
    timeout: float,
    check: Callable[[], object],
    interval: float = POLL_SECONDS,
) -> object:
    """`check()` every `interval` s until it returns something, the run ends, or `timeout`."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        found = check()
        if found is not None:
            return found
        if not run.running:
            run.result()  # raises the run's own error if it has one
            raise BenchError(f"the gateway run ended while waiting for {what}")
        if time.monotonic() >= deadline:
            raise BenchError(f"no {what} within {timeout:.0f} s")
        pause.wait(interval)


def _all_stored(status_file: Path, messages: int) -> dict | None:
    """The daemon's status (written every second) once its ledger holds all N messages."""
    try:
        status = json.loads(status_file.read_text())
    except (OSError, ValueError):
        return None  # not written yet
    ledger = status.get("ledger") or {}
    return status if ledger.get("accepted", 0) >= messages else None


def _next_retry(log_path: Path, offset: int) -> float | None:
    """The delay of the first upstream retry logged after `offset`: an attempt just failed."""
    with log_path.open("rb") as log_file:
        log_file.seek(offset)
        found = RETRY_LINE.search(log_file.read().decode(errors="replace"))
    return float(found.group(1)) if found else None


def _line_index(lines: list[str], text: str) -> int | None:
    return next((i for i, line in enumerate(lines) if text in line), None)


def fxgate_sample(ctx: Context, qos: int, messages: int) -> dict:
    """fxgate forwards N messages it already holds: upstream down while it takes them."""
    worker = ctx.worker({})
    directory = ctx.next_dir(f"forward-qos{qos}-fx")
    upstream = MosquittoProcess(directory / "upstream")  # its port now; started later
    run: _Run | None = None
    try:
        with fresh_broker(directory / "source") as source:
            queued = prequeue(source, FXGATE_CLIENT_ID, messages, qos, 1, ctx.seed())
            data = directory / "data"
            env = _route_env(
                source,
                upstream,
                data,
                qos,
                FXGATE__UPSTREAM__RECONNECT_MAX_DELAY_SECONDS=str(RECONNECT_MAX_DELAY),
            )
            run = _Run(worker, env, qos, messages, source.pid)
            began = time.monotonic()
            status = _poll(
                run,
                "ledger holding all messages",
                RUN_TIMEOUT,
                lambda: _all_stored(data / STATUS_FILE, messages),
            )
            stored_at = time.monotonic() - began
            # Start the upstream broker just after an attempt failed: the next one is at least
            # 0.75 s away, time for the broker to start and the counter to subscribe first.
            offset = worker.log_path.stat().st_size
            delay = _poll(
                run,
                "failed upstream attempt",
                4 * RECONNECT_MAX_DELAY,
                lambda: _next_retry(worker.log_path, offset),
            )
            upstream.start()
            counter = ArrivalCounter(upstream, directory / "counter", messages)
            try:
                lines = upstream.output().splitlines()
                subscribed = _line_index(lines, f"{counter.client_id} 0 {READERS_TOPIC}")
                connected = _line_index(lines, f" as {UPSTREAM_CLIENT_ID} ")
                late = connected is not None and (subscribed is None or connected < subscribed)
                # The forward window's CPU starts at the first arrival (to within a poll).
                _poll(
                    run,
                    "first upstream arrival",
                    RUN_TIMEOUT,
                    lambda: True if counter.path.stat().st_size else None,
                    interval=0.01,
                )
                cpu0 = _cpu(worker.pid)
            finally:
                arrived = _arrivals(counter, ctx, messages)
            cpu1 = _cpu(worker.pid)
            answer = run.result()
    finally:
        if run is not None and run.running:
            # The sample failed: let the daemon finish rather than wait out its timeouts for an
            # upstream, so the worker is free for the next sample. The first error is reported.
            try:
                upstream.start()
                run.result()
            except Exception:
                log.exception("forward sample: the gateway run after a failure")
        upstream.stop()
        shutil.rmtree(directory, ignore_errors=True)
    if late:
        # Messages forwarded before the counter subscribed were not counted.
        arrived["complete"] = False
    buffer = status.get("buffer") or {}
    return {
        **arrived,
        "queued": queued,
        "counter_late": late,
        "stored_seconds": round(stored_at, 3),
        "retry_delay_seconds": delay,
        "stored_status": {
            "ledger_accepted": status["ledger"].get("accepted"),
            "upstream_lag": ((status["ledger"].get("lag") or {}).get("upstream") or {}).get(
                "messages"
            ),
            "tier2_messages": buffer.get("tier2_messages"),
        },
        "forward_cpu": {
            "window": "first upstream arrival (polled every 10 ms) -> last arrival",
            "python_cpu_seconds": round(cpu1[0] - cpu0[0], 3),
            "jvm_cpu_seconds": round(cpu1[1] - cpu0[1], 3),
        },
        "source_ack_seconds": answer["ack_seconds"],
        "table_seconds": answer["table_seconds"],
    }


def draining_sample(ctx: Context, qos: int, messages: int, process: str = "own") -> dict:
    """fxgate drains a queued source session and forwards at the same time, its forward leg in
    its own process or (`process` "shared") in the daemon's."""
    worker = ctx.worker({})
    directory = ctx.next_dir(f"forward-qos{qos}-drain-{process}")
    try:
        with (
            fresh_broker(directory / "source") as source,
            fresh_broker(directory / "upstream") as upstream,
        ):
            queued = prequeue(source, FXGATE_CLIENT_ID, messages, qos, 1, ctx.seed())
            env = _route_env(
                source, upstream, directory / "data", qos, FXGATE__UPSTREAM__PROCESS=process
            )
            counter = ArrivalCounter(upstream, directory / "counter", messages)
            try:
                run = worker.ingest(
                    env, qos, messages, messages, source.pid, RUN_TIMEOUT, wait_upstream=True
                )
            finally:
                arrived = _arrivals(counter, ctx, messages)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    table = run.get("cpu_table_window") or {}
    return {
        **arrived,
        "queued": queued,
        "source_ack_seconds": run["ack_seconds"],
        "table_seconds": run["table_seconds"],
        "cpu_table_window": table,
    }


def bridge_sample(ctx: Context, qos: int, messages: int) -> dict:
    directory = ctx.next_dir(f"forward-qos{qos}-bridge")
    bridge: BridgeBroker | None = None
    try:
        with (
            fresh_broker(directory / "source") as source,
            fresh_broker(directory / "upstream") as upstream,
        ):
            bridge = BridgeBroker(directory / "bridge", source, upstream, qos)
            try:
                # The bridge makes its own persistent session on the source, then goes away
                # (saving its state) while the N messages are queued for it there.
                bridge.start()
                bridge.stop()
                published = simulate(
                    source.host,
                    source.port,
                    readers=PUBLISHING_READERS,
                    rate=0,
                    count=messages // PUBLISHING_READERS,
                    qos=qos,
                    seed=ctx.seed(),
                    client_id_prefix="bench-pub",
                    ack_timeout=60.0,
                )
                if len(published.published) != messages:
                    raise BenchError(f"pre-queue: {len(published.published)} of {messages}")
                counter = ArrivalCounter(upstream, directory / "counter", messages)
                try:
                    bridge.start()
                finally:
                    arrived = _arrivals(counter, ctx, messages)
            finally:
                bridge.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return arrived


# -- the benchmark ---------------------------------------------------------------------------


def value(sample: dict) -> float:
    return sample["messages_per_second"]


def _side(result: dict, role: str, label: str) -> dict:
    """Median of the complete runs of a report-only contestant: summarize() takes the rates of
    every run, and a stalled one would count its partial rate."""
    samples = used(result, role)
    complete = [s["value"] for s in samples if s["complete"]]
    return {
        "label": label,
        "samples": [s["value"] for s in samples],
        "complete": [s["complete"] for s in samples],
        "arrived": [s["arrived"] for s in samples],
        "median": statistics.median(complete) if complete else None,
    }


def forward(ctx: Context, qos: int) -> dict:
    name = f"forward-qos{qos}"
    messages = (MESSAGES_QUICK if ctx.settings.quick else MESSAGES)[qos]
    # Start (and warm up) the gateway worker outside the timed rounds.
    ctx.worker({})
    raw = alternate(
        ctx,
        [
            ("baseline", lambda: bare_sample(ctx, qos, messages)),
            ("fxgate", lambda: fxgate_sample(ctx, qos, messages)),
            ("draining", lambda: draining_sample(ctx, qos, messages)),
            ("bridge", lambda: bridge_sample(ctx, qos, messages)),
            # The forward leg in the daemon's process, for comparison where the bar is (QoS 1).
            *(
                [("shared", lambda: draining_sample(ctx, qos, messages, "shared"))]
                if qos == 1
                else []
            ),
        ],
        value,
    )
    for sample in raw:
        sample.setdefault("complete", True)
    result = summarize(
        name=name,
        title=f"Forward leg, QoS {qos}: messages/s reaching the upstream broker",
        metric="N / (N-th - first arrival at a QoS 0 mosquitto_sub on the upstream broker) = "
        "the forwarder's first PUBLISH -> last ack, within a loopback round trip",
        unit="msg/s",
        raw=raw,
        value=value,
        baseline_label=f"bare paho 2.2 publisher, max_inflight {WINDOW}, payloads pre-generated",
        fxgate_label="fxgate forwarding reads already in its ledger: tier 2 (tier 1 beyond "
        f"it) -> outbound ledger -> upstream (window {WINDOW}), daemon running whole",
        target={
            "kind": "ratio_at_least",
            "value": 0.9,
            "description": ">= 0.9x the bare paho publisher",
        },
        setup={
            **common_setup(qos, messages, 1),
            "fxgate_config": "defaults + [upstream] (fresh broker) + one route "
            f"{READERS_TOPIC} -> {{topic}} at QoS {qos}",
            "fxgate_stored": "the upstream broker is not running while fxgate takes the N "
            "queued messages from the source; once status.json says the ledger accepted all N, "
            "the bench waits for the next failed upstream attempt, starts the upstream broker "
            "and the arrival counter, and fxgate forwards at its next attempt. "
            f"FXGATE__UPSTREAM__RECONNECT_MAX_DELAY_SECONDS={RECONNECT_MAX_DELAY:g} (default "
            "120) so that attempt comes within seconds; the delay is not timed",
            "fxgate_draining": "same daemon and config (default backoff), upstream broker up "
            "from the start: fxgate drains the queued source session (ledger commits, source "
            "acks) and forwards, its forward leg in a process of its own (the default)",
            "fxgate_shared": 'QoS 1 only: the draining run with [upstream] process = "shared": '
            "the forward leg in the daemon's process, one interpreter for both legs",
            "bridge_config": "mosquitto 2.0.11, deliberate config (persistence, autosave 1 s, "
            "max_inflight_messages 1000, 1M queued); bridge `in` from the source and `out` to "
            f"the upstream, mqttv311, cleansession false, QoS {qos} (bench/bridge.py)",
            "timed": "first -> N-th arrival at mosquitto_sub -q 0 on the upstream broker "
            "(same instrument for all four)",
        },
    )
    result["module"] = MODULE
    result["draining"] = _side(
        result, "draining", "fxgate draining a queued source session while forwarding"
    )
    result["bridge"] = _side(
        result, "bridge", "mosquitto 2.0.11 bridge (in from source, out to upstream)"
    )
    result["shared"] = (
        _side(result, "shared", "fxgate draining, forward leg in the daemon's process")
        if qos == 1
        else None
    )
    b_med = result["baseline"]["median"]
    d_med = result["draining"]["median"]
    bridge_median = result["bridge"]["median"]
    result["ratio_draining"] = d_med / b_med if d_med and b_med else None
    # Issue 16's bar for forwarding while draining holds for QoS 1; QoS 2 is reported.
    result["draining_target"] = DRAINING_TARGET if qos == 1 else None
    result["draining_met"] = (
        None if qos != 1 else (result["ratio_draining"] or 0) >= DRAINING_TARGET
    )
    # Like for like: the bridge too takes the messages from the source while it forwards.
    result["ratio_vs_bridge"] = d_med / bridge_median if d_med and bridge_median else None
    s_med = result["shared"]["median"] if result["shared"] else None
    result["ratio_shared"] = s_med / b_med if s_med and b_med else None
    fx = used(result, "fxgate")
    base = used(result, "baseline")
    if any(not s["complete"] for s in fx + base):
        # A contestant that did not deliver all N has no rate to compare.
        result["met"] = False
        result["incomplete"] = [s["role"] for s in fx + base if not s["complete"]]
    pub = statistics.median(s["publisher_messages_per_second"] for s in base)
    result["instrument_check"] = {
        "what": "the bare publisher timed itself (first publish() -> N-th on_publish) and was "
        "timed by the upstream arrival counter in the same runs",
        "publisher_side_median": pub,
        "arrival_side_median": b_med,
    }
    result["bound"] = bound_sentence(result, messages)
    if result["met"] is False and ctx.settings.profile:
        # Where the stored forward leg's CPU goes: two more runs under py-spy, not counted.
        result["profile"] = profile_run(
            ctx, name, lambda: fxgate_sample(ctx, qos, messages), ctx.worker({})
        )
        result["bound"] += profile_sentence(result["profile"])
    if result["draining_met"] is False and ctx.settings.profile:
        result["profile_draining"] = profile_run(
            ctx,
            f"{name}-draining",
            lambda: draining_sample(ctx, qos, messages),
            ctx.worker({}),
        )
        sentence = profile_sentence(result["profile_draining"])
        if sentence:
            result["bound"] += " While draining (the whole run, start included):" + sentence
    result["headline"] = (
        f"bare publisher {_n(b_med)}, fxgate (stored) {_n(result['fxgate']['median'])}, fxgate "
        f"while draining {_n(d_med)}, bridge "
        + (
            _n(bridge_median)
            if bridge_median
            else f"stalled ({max(result['bridge']['arrived'])} of {messages:,} arrived)"
        )
        + f"; fxgate/bare {result['ratio']:.2f}"
        + (f", draining/bare {result['ratio_draining']:.2f}" if result["ratio_draining"] else "")
        + (
            f", draining/bridge {result['ratio_vs_bridge']:.2f}"
            if result["ratio_vs_bridge"]
            else ""
        )
        + (
            f", draining with the forward leg in the daemon's process/bare "
            f"{result['ratio_shared']:.2f}"
            if result["ratio_shared"]
            else ""
        )
    )
    return result


def _med(samples: list[dict], pick: Callable[[dict], float | None]) -> float | None:
    values = [v for v in (pick(s) for s in samples) if v is not None]
    return statistics.median(values) if values else None


def bound_sentence(result: dict, messages: int) -> str:
    fx = used(result, "fxgate")
    base = used(result, "baseline")
    drains = used(result, "draining")
    bridges = used(result, "bridge")
    b_med = result["baseline"]["median"]
    f_med = result["fxgate"]["median"]
    stored = _med(fx, lambda s: s["stored_seconds"])
    tier2 = _med(fx, lambda s: s["stored_status"].get("tier2_messages"))
    tier1 = _med(fx, lambda s: s["stored_status"].get("upstream_lag"))
    fx_cpu = _med(fx, lambda s: s["forward_cpu"]["python_cpu_seconds"])
    fx_seconds = _med(fx, lambda s: s.get("arrival_seconds"))
    pub_cpu = _med(base, lambda s: s.get("publisher_cpu_seconds"))
    pub_cores = _med(base, lambda s: s.get("publisher_cores"))
    held = f"tier 2 then held {tier2:,.0f} messages, the outbound ledger its first pack"
    if tier1:
        held += f"; {tier1:,.0f} owed upstream in all, the rest waiting in tier 1"
    parts = [
        f"forward leg alone: fxgate forwarded {messages:,} messages it already held (all in its "
        f"ledger {stored:.1f} s after the run started, median, as seen in status.json; {held}) "
        f"at {_n(f_med)}, {result['ratio']:.2f}\u00d7 the bare publisher's {_n(b_med)} with the "
        f"same {WINDOW} in flight"
    ]
    if fx_cpu is not None and fx_seconds:
        sentence = (
            f"its Python processes used {1e6 * fx_cpu / messages:.0f} ms CPU per 1,000 messages "
            f"from the first to the last arrival ({fx_cpu / fx_seconds:.2f} cores; the Spark "
            "writer's work on acknowledged packs included)"
        )
        if pub_cpu and pub_cores is not None:
            sentence += (
                f", the bare publisher {1e6 * pub_cpu / messages:.0f} ms ({pub_cores:.2f} cores): "
                f"{fx_cpu / pub_cpu:.2f}\u00d7 its CPU per message"
            )
        parts.append(sentence)
    d_med = result["draining"]["median"]
    if drains:
        ack = _med(drains, lambda s: s["source_ack_seconds"])
        upstream = _med(drains, lambda s: s.get("arrival_seconds"))
        cores = _med(drains, lambda s: s["cpu_table_window"].get("python_cores"))
        parts.append(
            f"forwarding while it drained the source (ingest: a ledger commit and a source ack "
            f"per message, in the daemon's process; the forward leg in its own) it reached "
            f"{_n(d_med)}"
            + (f" ({result['ratio_draining']:.2f}\u00d7)" if result["ratio_draining"] else "")
            + f": it took the {messages:,} messages from the source in {ack:.2f} s and needed "
            f"{upstream:.2f} s from its first to its last upstream arrival"
            + (
                f", the daemon's own process (its forward process not counted) at {cores:.2f} "
                "cores from the first source PUBLISH to the last row in the table"
                if cores is not None
                else ""
            )
        )
    shared = used(result, "shared")
    if shared and result.get("ratio_shared"):
        ack = _med(shared, lambda s: s["source_ack_seconds"])
        upstream = _med(shared, lambda s: s.get("arrival_seconds"))
        parts.append(
            f'with the forward leg in the daemon\'s process (`process = "shared"`, the same '
            f"rounds) it reached {_n(result['shared']['median'])} "
            f"({result['ratio_shared']:.2f}\u00d7): the source taken in {ack:.2f} s, "
            f"{upstream:.2f} s from the first to the last upstream arrival"
        )
    late = [s for s in fx if s.get("counter_late")]
    if late:
        parts.append(
            f"in {len(late)} stored run(s) fxgate connected upstream before the counter "
            "subscribed: those runs are marked incomplete"
        )
    other = [s["machine_load"]["other_cores"] for s in fx + base if "machine_load" in s]
    if other and statistics.median(other) >= 0.3:
        parts.append(
            f"other processes on the machine took {statistics.median(other):.2f} cores "
            "(median over the fxgate and baseline samples), so the absolute figures carry "
            "their contention"
        )
    stalled = [s for s in bridges if not s["complete"]]
    if stalled:
        parts.append(
            f"the bridge stalled in {len(stalled)} of {len(bridges)} runs: "
            f"{', '.join(str(s['arrived']) for s in stalled)} of {messages:,} arrived, then "
            "nothing for the stall timeout while the source had handed it everything"
        )
    return "; ".join(parts) + "."


# -- table rows and plot --------------------------------------------------------------------


def _n(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} msg/s"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}\u00d7"


def _side_text(side: dict, messages: int) -> str:
    stalled = [a for a, c in zip(side["arrived"], side["complete"], strict=True) if not c]
    if not stalled:
        return _n(side["median"])
    return (
        f"{_n(side['median'])}; stalled in {len(stalled)} of {len(side['complete'])} runs "
        f"({', '.join(f'{a:,}' for a in stalled)} of {messages:,} arrived)"
    )


def rows(result: dict) -> list[list[str]]:
    table = _rows(result)
    shared = result.get("shared")
    if shared:
        n_base = len(result["baseline"]["samples"])
        messages = result["setup"]["messages_per_sample"]
        table.append(
            [
                f"`{result['name']}` while draining, one process",
                "same rounds: the draining run with the forward leg in the daemon's process "
                '(`[upstream] process = "shared"`): ingest and forward on one interpreter',
                f"{_n(result['baseline']['median'])} (bare paho publisher, max_inflight {WINDOW})",
                f"{_side_text(shared, messages)} (fxgate while draining, one process)",
                _ratio(result.get("ratio_shared")),
                "report only",
                "—",
                f"{len(shared['samples'])}+{n_base}",
            ]
        )
    return table


def _rows(result: dict) -> list[list[str]]:
    setup = result["setup"]
    qos = setup["qos"]
    messages = setup["messages_per_sample"]
    n_fx = len(result["fxgate"]["samples"])
    n_base = len(result["baseline"]["samples"])
    draining = result["draining"]
    bridge = result["bridge"]
    what = (
        f"forward leg, QoS {qos}: {messages:,} single-read messages "
        f"(~{setup['payload_bytes_mean']:.0f} B) to the upstream broker, first → last arrival "
        "there"
    )
    met = result.get("met")
    baseline = f"{_n(result['baseline']['median'])} (bare paho publisher, max_inflight {WINDOW})"
    return [
        [
            f"`{result['name']}`",
            what + "; fxgate forwards reads already in its ledger (upstream down while it took "
            "them from the source)",
            baseline,
            f"{_n(result['fxgate']['median'])} (fxgate)",
            _ratio(result.get("ratio")),
            "≥ 0.9\u00d7",
            "—" if met is None else ("yes" if met else "**no**"),
            f"{n_fx}+{n_base}",
        ],
        [
            f"`{result['name']}` while draining",
            "same rounds: fxgate forwarding while it drains a queued source session (ingest "
            "in the daemon's process, the forward leg in its own)",
            baseline,
            f"{_side_text(draining, messages)} (fxgate while draining)",
            _ratio(result.get("ratio_draining")),
            "report only"
            if result.get("draining_target") is None
            else f"≥ {result['draining_target']}\u00d7",
            "—"
            if result.get("draining_met") is None
            else ("yes" if result["draining_met"] else "**no**"),
            f"{len(draining['samples'])}+{n_base}",
        ],
        [
            f"`{result['name']}` vs bridge",
            "same rounds: a mosquitto 2.0.11 bridge draining the same queued messages from the "
            "source broker to the upstream broker, against fxgate while draining",
            f"{_side_text(bridge, messages)} (mosquitto bridge)",
            f"{_n(draining['median'])} (fxgate while draining)",
            _ratio(result.get("ratio_vs_bridge")),
            "report only",
            "—",
            f"{len(draining['samples'])}+{len(bridge['samples'])}",
        ],
    ]


def plot(results_dir: Path, result: dict) -> Path:
    path = results_dir / f"{result['name']}.png"
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    styles = {
        "baseline": ("tab:blue", "o"),
        "fxgate": ("tab:orange", "s"),
        "draining": ("tab:red", "D"),
        "bridge": ("tab:green", "^"),
        "shared": ("tab:purple", "v"),
    }
    labels = {
        "baseline": f"bare paho publisher (median {_n(result['baseline']['median'])})",
        "fxgate": f"fxgate, reads already in its ledger (median {_n(result['fxgate']['median'])})",
        "draining": "fxgate while draining the source (median of complete runs "
        f"{_n(result['draining']['median'])})",
        "bridge": f"mosquitto bridge (median of complete runs {_n(result['bridge']['median'])})",
        "shared": "fxgate while draining, forward leg in the daemon's process (median of "
        f"complete runs {_n((result.get('shared') or {}).get('median'))})",
    }
    for role in ROLES:
        samples = [s for s in result["raw"] if s["role"] == role]
        color, marker = styles[role]
        done = [s for s in samples if s.get("complete", True)]
        partial = [s for s in samples if not s.get("complete", True)]
        ax.plot(
            [s["order"] for s in done],
            [s["value"] for s in done],
            marker,
            color=color,
            label=labels[role],
        )
        if partial:
            ax.plot(
                [s["order"] for s in partial],
                [s["value"] for s in partial],
                marker,
                color=color,
                markerfacecolor="none",
                label=f"{role}: incomplete run (rate while it flowed)",
            )
    tops = [y for line in ax.get_lines() for y in line.get_ydata()]
    ax.set_ylim(0, 1.15 * max(tops) if tops else None)
    ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel(
        "sample, in run order (bare, fxgate, fxgate while draining, bridge, [one process], ...)"
    )
    ax.set_ylabel("msg/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    fig.suptitle(result["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("forward-qos1", lambda ctx: forward(ctx, 1), True),
    Benchmark("forward-qos2", lambda ctx: forward(ctx, 2), True),
)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "publish":
        sys.exit(publisher_main(sys.argv[2:]))
    sys.exit(f"usage: python -m {MODULE} publish HOST PORT --qos Q --messages N")
