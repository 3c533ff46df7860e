"""Issue 5 item 2, the forward leg: messages/s forwarded upstream, QoS 1 and QoS 2.

Three contestants per round, in this order, each on fresh brokers:

- baseline: a bare paho-mqtt 2.2 publisher (this module run as `python -m bench.forward
  publish ...`) with max_inflight 20, publishing N pre-generated simulator payloads (~200 B)
  straight to the upstream broker: the ceiling of one paho client with fxgate's window;
- fxgate: the daemon's own Gateway (bench.gateway_worker, warm Spark) with [upstream] and one
  route at the run's QoS, draining a source session that holds N queued messages;
- bridge: a mosquitto bridging the same N queued messages from the source broker to the
  upstream broker (bench.bridge.BridgeBroker).

Every contestant is timed by the same instrument on the upstream broker (bench.bridge.
ArrivalCounter): first -> N-th arrival, which is the forwarder's first PUBLISH -> last ack to
within a loopback round trip. The bare publisher also times itself (first publish() -> N-th
on_publish) as a check on that instrument.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from actors.simulate import simulate
from bench.benchmarks import Benchmark, Context, alternate, common_setup, summarize, used
from bench.bridge import ArrivalCounter, BridgeBroker
from bench.harness import (
    FXGATE_CLIENT_ID,
    PUBLISHING_READERS,
    BenchError,
    fresh_broker,
    fxgate_env,
    prequeue,
)

REPO = Path(__file__).resolve().parent.parent
MODULE = "bench.forward"
WINDOW = 20  # the bare publisher's max_inflight, and fxgate's default upstream.window

MESSAGES = {1: 20_000, 2: 10_000}
MESSAGES_QUICK = {1: 8_000, 2: 4_000}
ROLES = ("baseline", "fxgate", "bridge")


# -- the bare publisher (a process of its own) -------------------------------------------------


def publisher_main(argv: list[str]) -> int:
    """Publish N payloads with one paho client, at most WINDOW unacknowledged, and print one
    JSON line: seconds from the first publish() to the N-th on_publish, CPU, failures."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    from actors.simulate import TagEventGenerator, reader_names

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
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"bare publisher said nothing (exit {done.returncode}):\n{done.stderr}")
    result = json.loads(lines[-1])
    if not result.get("ok"):
        raise BenchError(f"bare publisher failed: {result}\n{done.stderr[-2000:]}")
    return result


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
        "payload_bytes_mean": published.get("payload_bytes_mean"),
    }


def fxgate_sample(ctx: Context, qos: int, messages: int) -> dict:
    worker = ctx.worker({})
    directory = ctx.next_dir(f"forward-qos{qos}-fx")
    try:
        with (
            fresh_broker(directory / "source") as source,
            fresh_broker(directory / "upstream") as upstream,
        ):
            queued = prequeue(source, FXGATE_CLIENT_ID, messages, qos, 1, ctx.seed())
            env = fxgate_env(
                source,
                directory / "data",
                qos,
                FXGATE__UPSTREAM__HOST=upstream.host,
                FXGATE__UPSTREAM__PORT=str(upstream.port),
                FXGATE__ROUTES__0__SOURCE="zebra/fx/+/reads",
                FXGATE__ROUTES__0__QOS=str(qos),
            )
            counter = ArrivalCounter(upstream, directory / "counter", messages)
            try:
                run = worker.ingest(env, qos, messages, messages, source.pid, timeout=180)
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
            ("bridge", lambda: bridge_sample(ctx, qos, messages)),
        ],
        value,
    )
    result = summarize(
        name=name,
        title=f"Forward leg, QoS {qos}: messages/s reaching the upstream broker",
        metric="N / (N-th - first arrival at a QoS 0 mosquitto_sub on the upstream broker) = "
        "the forwarder's first PUBLISH -> last ack, within a loopback round trip",
        unit="msg/s",
        raw=raw,
        value=value,
        baseline_label=f"bare paho 2.2 publisher, max_inflight {WINDOW}, payloads pre-generated",
        fxgate_label="fxgate: queued source session -> ledger -> packs -> outbound ledger -> "
        f"upstream (window {WINDOW}), daemon running whole",
        target={
            "kind": "ratio_at_least",
            "value": 0.9,
            "description": ">= 0.9x the bare paho publisher",
        },
        setup={
            **common_setup(qos, messages, 1),
            "fxgate_config": "defaults + [upstream] (fresh broker) + one route "
            f"zebra/fx/+/reads -> {{topic}} at QoS {qos}",
            "bridge_config": "mosquitto 2.0.11, deliberate config (persistence, autosave 1 s, "
            "max_inflight_messages 1000, 1M queued); bridge `in` from the source and `out` to "
            f"the upstream, mqttv311, cleansession false, QoS {qos} (bench/bridge.py)",
            "timed": "first -> N-th arrival at mosquitto_sub -q 0 on the upstream broker "
            "(same instrument for all three)",
        },
    )
    result["module"] = MODULE
    # summarize() took the complete runs only through `value`; a stalled bridge run would
    # count its partial rate, so the bridge gets a summary of its own.
    bridges = used(result, "bridge")
    complete = [s["value"] for s in bridges if s["complete"]]
    bridge_median = statistics.median(complete) if complete else None
    result["bridge"] = {
        "label": "mosquitto 2.0.11 bridge (in from source, out to upstream)",
        "samples": [s["value"] for s in bridges],
        "complete": [s["complete"] for s in bridges],
        "arrived": [s["arrived"] for s in bridges],
        "median": bridge_median,
    }
    f_med = result["fxgate"]["median"]
    result["ratio_vs_bridge"] = f_med / bridge_median if bridge_median else None
    fx = used(result, "fxgate")
    base = used(result, "baseline")
    for sample in result["raw"]:
        sample.setdefault("complete", True)
    if any(not s["complete"] for s in fx + base):
        # A contestant that did not deliver all N has no rate to compare.
        result["met"] = False
        result["incomplete"] = [s["role"] for s in fx + base if not s["complete"]]
    pub = statistics.median(s["publisher_messages_per_second"] for s in base)
    result["instrument_check"] = {
        "what": "the bare publisher timed itself (first publish() -> N-th on_publish) and was "
        "timed by the upstream arrival counter in the same runs",
        "publisher_side_median": pub,
        "arrival_side_median": result["baseline"]["median"],
    }
    result["bound"] = bound_sentence(result, fx, base, bridges, messages)
    result["headline"] = (
        f"bare publisher {result['baseline']['median']:,.0f}, fxgate {f_med:,.0f}, bridge "
        + (
            f"{bridge_median:,.0f}"
            if bridge_median
            else f"stalled ({max(result['bridge']['arrived'])} of {messages:,} arrived)"
        )
        + f" msg/s; fxgate/bare {result['ratio']:.2f}"
        + (f", fxgate/bridge {result['ratio_vs_bridge']:.2f}" if result["ratio_vs_bridge"] else "")
    )
    return result


def bound_sentence(result: dict, fx: list, base: list, bridges: list, messages: int) -> str:
    f_med = result["fxgate"]["median"]
    ack = statistics.median(s["source_ack_seconds"] for s in fx)
    upstream = statistics.median(s["arrival_seconds"] for s in fx)
    table = statistics.median(s["table_seconds"] for s in fx)
    cores = [s["cpu_table_window"].get("python_cores") for s in fx]
    cores = [c for c in cores if c is not None]
    threads: dict[str, list[float]] = {}
    for s in fx:
        for role, seconds in s["cpu_table_window"].get("python_threads_cpu_seconds", {}).items():
            if not role.startswith("bench-"):
                threads.setdefault(role, []).append(seconds)
    busiest = sorted(((r, statistics.median(v)) for r, v in threads.items()), key=lambda kv: -kv[1])
    per_1000 = ", ".join(f"{r} {1e6 * v / messages:.0f} ms" for r, v in busiest[:4])
    pub_cores = statistics.median(s.get("publisher_cores") or 0.0 for s in base)
    parts = [
        f"fxgate took the {messages:,} queued messages from the source in {ack:.2f} s (ledger "
        f"commits, acks) but needed {upstream:.2f} s from its first to its last upstream "
        f"arrival ({f_med:,.0f} msg/s) and {table:.2f} s to the table",
        f"its Python process ran at {statistics.median(cores):.2f} cores from the first source "
        f"PUBLISH to the table (CPU per 1,000 messages: {per_1000})"
        if cores
        else "",
        f"the bare publisher, with the same {WINDOW} in flight, ran at {pub_cores:.2f} cores",
    ]
    other = [s["machine_load"]["other_cores"] for s in fx if "machine_load" in s]
    if other and statistics.median(other) >= 0.3:
        parts.append(
            f"other processes on the machine took {statistics.median(other):.2f} cores "
            "(median over the fxgate samples), so the absolute figures carry their contention"
        )
    stalled = [s for s in bridges if not s["complete"]]
    if stalled:
        parts.append(
            f"the bridge stalled in {len(stalled)} of {len(bridges)} runs: "
            f"{', '.join(str(s['arrived']) for s in stalled)} of {messages:,} arrived, then "
            "nothing for the stall timeout while the source had handed it everything"
        )
    return "; ".join(p for p in parts if p) + "."


# -- README rows and plot --------------------------------------------------------------------


def _n(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} msg/s"


def rows(result: dict) -> list[list[str]]:
    setup = result["setup"]
    qos = setup["qos"]
    n_fx = len(result["fxgate"]["samples"])
    ratio = result.get("ratio")
    bridge = result["bridge"]
    stalled = [a for a, c in zip(bridge["arrived"], bridge["complete"], strict=True) if not c]
    bridge_text = (
        _n(bridge["median"])
        if not stalled
        else (
            f"{_n(bridge['median'])}; stalled in {len(stalled)} of {len(bridge['complete'])} "
            f"runs ({', '.join(f'{a:,}' for a in stalled)} of {setup['messages_per_sample']:,} "
            "arrived)"
        )
    )
    what = (
        f"forward leg, QoS {qos}: {setup['messages_per_sample']:,} single-read messages "
        f"(~{setup['payload_bytes_mean']:.0f} B) to the upstream broker, first → last arrival "
        "there"
    )
    met = result.get("met")
    return [
        [
            f"`{result['name']}`",
            what + "; fxgate drains a queued source session",
            f"{_n(result['baseline']['median'])} (bare paho publisher, max_inflight {WINDOW})",
            f"{_n(result['fxgate']['median'])} (fxgate)",
            "—" if ratio is None else f"{ratio:.2f}\u00d7",
            "≥ 0.9\u00d7",
            "—" if met is None else ("yes" if met else "**no**"),
            f"{n_fx}+{len(result['baseline']['samples'])}",
        ],
        [
            f"`{result['name']}` vs bridge",
            "same rounds: a mosquitto 2.0.11 bridge draining the same queued messages from the "
            "source broker to the upstream broker",
            f"{bridge_text} (mosquitto bridge)",
            f"{_n(result['fxgate']['median'])} (fxgate)",
            "—"
            if result.get("ratio_vs_bridge") is None
            else f"{result['ratio_vs_bridge']:.2f}\u00d7",
            "report only",
            "—",
            f"{n_fx}+{len(bridge['samples'])}",
        ],
    ]


def plot(results_dir: Path, result: dict) -> Path:
    path = results_dir / f"{result['name']}.png"
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    styles = {
        "baseline": ("tab:blue", "o"),
        "fxgate": ("tab:orange", "s"),
        "bridge": ("tab:green", "^"),
    }
    labels = {
        "baseline": f"bare paho publisher (median {_n(result['baseline']['median'])})",
        "fxgate": f"fxgate (median {_n(result['fxgate']['median'])})",
        "bridge": f"mosquitto bridge (median of complete runs {_n(result['bridge']['median'])})",
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
                label=f"{role}: stalled run (rate while it flowed)",
            )
    tops = [y for line in ax.get_lines() for y in line.get_ydata()]
    ax.set_ylim(0, 1.15 * max(tops) if tops else None)
    ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("sample, in run order (bare, fxgate, bridge, ...)")
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
