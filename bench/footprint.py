"""The daemon's footprint on the box it runs on (issue 36): memory, processes and CPU per read.

One run, no baseline: the targets are absolute, set from what the edge agents operators compare
us with spend. `fxgate run` (the daemon as shipped, a subprocess, its defaults) subscribes to a
fresh mosquitto; two simulated FX9600s publish single reads at QoS 1, 1,000 reads/s in all. Three
variants: landing only; landing plus a forwarding route to a second mosquitto; and the same route
with the forward leg in the daemon's process (`[upstream] process = "shared"`; the default is a
process of its own), report only: which of the two the default should be. And, report only, the
floor under all of them: the bare paho subscriber (bench.bare_subscriber: paho 2.2, `json.loads`
of each payload, a manual ack, nothing stored) on the same traffic, measured the same way.

Per variant, on the daemon's whole process tree (the daemon and every process it started: a
forward process, a JVM when it lands through Spark) sampled with psutil every second:
- start: spawn -> the "source: subscribed" log line, and the tree's CPU seconds from the spawn
  until the start has settled (`SETTLE_SECONDS` after "fxgate started");
- idle: CPU over a quiet spell after that, as a share of one core;
- under load: PSS (proportional set size: shared pages counted once across the tree) median and
  maximum, the most processes seen, and CPU per read: the tree's CPU seconds from the first
  publish until every read is in the table (and upstream, with the route), over the reads.

Targets: PSS <= 120 MiB (160 with forwarding), <= 40 us of CPU a read (80 with forwarding), idle
<= 1 % of a core. `FXGATE_FOOTPRINT_CODE=<checkout>` runs the daemon from another checkout of
fxgate (its cwd, so `-m actors.app.cli` imports that code) with this virtualenv: the same bench
on an earlier commit, for a before/after in one run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from actors.devtools.mosquitto import MosquittoProcess
from actors.devtools.simulate import simulate
from bench.benchmarks import Benchmark, Context
from bench.harness import READERS_TOPIC, BenchError
from bench.memory import UpstreamTally
from tests.harness.checks import wait_until_landed
from tests.harness.daemon import DaemonProcess

NAME = "footprint"
MIB = 1024 * 1024

READERS = 2
RATE = 1000.0  # reads/s in all: single reads, QoS 1
SOURCE_QOS = 1
SAMPLE_SECONDS = 1.0
# (idle, load) seconds
FULL_TIMING = (30.0, 60.0)
QUICK_TIMING = (10.0, 20.0)
LANDED_TIMEOUT = 180.0
# After "fxgate started", what the start left running (a child's imports) settles for this long
# before the idle spell is measured; its CPU is in the start's figure, not the idle one.
SETTLE_SECONDS = 10.0

TARGETS = {
    "landing": {"pss_mib": 120.0, "cpu_us_per_read": 40.0},
    "forwarding": {"pss_mib": 160.0, "cpu_us_per_read": 80.0},
    "forwarding-shared": {"pss_mib": 160.0, "cpu_us_per_read": 80.0},
    "bare-paho": {"pss_mib": 120.0, "cpu_us_per_read": 40.0},
}
# Variant -> where its forward leg runs (`[upstream] process`); None: no forwarding.
FORWARD_PROCESS = {"landing": None, "forwarding": "own", "forwarding-shared": "shared"}
BARE = "bare-paho"
VARIANTS = (*FORWARD_PROCESS, BARE)
# Not held to the targets: the default's alternative, measured to choose between them, and the
# bare subscriber, the floor a Python MQTT client on this machine stands on.
REPORT_ONLY = frozenset({"forwarding-shared", BARE})
BARE_CLIENT_ID = "bench-footprint-bare"
IDLE_TARGET_PERCENT = 1.0


class TreeSampler:
    """The daemon's process tree, sampled on a thread: PSS of the tree, its process count, and
    each process's CPU seconds as last seen (a process that ends keeps its last figure)."""

    def __init__(self, root_pid: int) -> None:
        self._root = psutil.Process(root_pid)
        self._cpu: dict[int, float] = {}
        self._lock = threading.Lock()
        self.pss: list[tuple[float, int]] = []  # (monotonic, bytes)
        self.processes: list[int] = []
        self.names: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="footprint-sampler", daemon=True)

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sample()

    def cpu_seconds(self) -> float:
        """The tree's CPU seconds up to now (sampled now)."""
        self.sample(record=False)
        with self._lock:
            return sum(self._cpu.values())

    def sample(self, record: bool = True) -> None:
        try:
            tree = [self._root, *self._root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        pss = 0
        alive = 0
        for process in tree:
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    if record:
                        pss += process.memory_full_info().pss
                        self.names.add(process.name())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            alive += 1
            with self._lock:
                self._cpu[process.pid] = times.user + times.system
        if record:
            self.pss.append((time.monotonic(), pss))
            self.processes.append(alive)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.sample()


def _config(
    directory: Path,
    data: Path,
    source: MosquittoProcess,
    upstream: MosquittoProcess | None,
    forward_process: str = "own",
) -> Path:
    """The defaults, except where the daemon finds its brokers and keeps its data."""
    text = f"""\
[gateway]
data_dir = "{data}"

[source]
host = "{source.host}"
port = {source.port}
environment_id = "bench"
instance_id = "footprint"
"""
    if upstream is not None:
        text += f"""
[upstream]
host = "{upstream.host}"
port = {upstream.port}
process = "{forward_process}"

[[routes]]
source = "{READERS_TOPIC}"
"""
    path = directory / "fxgate.toml"
    path.write_text(text)
    return path


def _publish(ctx: Context, source: MosquittoProcess, per_reader: int):
    """The load: READERS simulated FX9600s, `per_reader` single reads each at RATE in all."""
    published = simulate(
        source.host,
        source.port,
        readers=READERS,
        rate=RATE,
        count=per_reader,
        qos=SOURCE_QOS,
        seed=ctx.seed(),
        client_id_prefix="bench-footprint",
        ack_timeout=60.0,
    )
    if len(published.published) != per_reader * READERS:
        raise BenchError(f"{len(published.published)} of {per_reader * READERS} reads acknowledged")
    return published


def _under_load(sampler: TreeSampler, load_from: float, cpu: float, reads: int) -> dict:
    """Memory and processes sampled since `load_from`, and `cpu` seconds over `reads`."""
    loaded = [b for t, b in sampler.pss if load_from <= t]
    if not loaded:
        raise BenchError("no memory sample under load")
    return {
        "pss_median_mib": round(statistics.median(loaded) / MIB, 1),
        "pss_max_mib": round(max(loaded) / MIB, 1),
        "processes": max(sampler.processes),
        "process_names": sorted(sampler.names),
        "cpu_seconds": round(cpu, 3),
        "cpu_us_per_read": round(cpu / reads * 1e6, 1),
    }


def one_variant(ctx: Context, variant: str) -> dict:
    quick = ctx.settings.quick
    idle_seconds, load_seconds = QUICK_TIMING if quick else FULL_TIMING
    per_reader = int(RATE * load_seconds / READERS)
    total = per_reader * READERS
    directory = ctx.next_dir(f"{NAME}-{variant}")
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "data"
    code = os.environ.get("FXGATE_FOOTPRINT_CODE")
    workdir = Path(code) if code else directory
    source = MosquittoProcess(directory / "source")
    forward_process = FORWARD_PROCESS[variant]
    upstream = MosquittoProcess(directory / "upstream") if forward_process else None
    tally = UpstreamTally(upstream) if upstream is not None else None
    daemon: DaemonProcess | None = None
    sampler: TreeSampler | None = None
    source.start()
    try:
        if upstream is not None:
            upstream.start()
            tally.start()
        config = _config(directory, data, source, upstream, forward_process or "own")
        daemon = DaemonProcess(workdir, {}, config)
        spawned = time.monotonic()
        daemon.start()
        daemon.wait_for_log(r"source: subscribed", timeout=240)
        start_seconds = time.monotonic() - spawned
        if upstream is not None:
            daemon.wait_for_log(r"upstream: connected", timeout=60)
        daemon.wait_for_log(r"fxgate started", timeout=60)
        sampler = TreeSampler(daemon.proc.pid)
        sampler.start()
        time.sleep(SETTLE_SECONDS)  # a measured spell, like the idle one: no synchronisation
        start_cpu = sampler.cpu_seconds()
        # Idle: after the start has settled, nothing published.
        idle_from_cpu, idle_from = start_cpu, time.monotonic()
        time.sleep(idle_seconds)  # the measured spell itself, not a synchronisation
        idle_cpu = sampler.cpu_seconds() - idle_from_cpu
        idle_percent = 100.0 * idle_cpu / (time.monotonic() - idle_from)
        load_from = time.monotonic()
        cpu_before = sampler.cpu_seconds()
        published = _publish(ctx, source, per_reader)
        publish_seconds = time.monotonic() - load_from
        wait_until_landed(daemon, data, total, timeout=LANDED_TIMEOUT)
        if tally is not None:
            keys = {record.message_key for record in published.published}
            if not tally.wait_for(keys, LANDED_TIMEOUT, stall=30.0):
                raise BenchError(f"forwarded upstream: {tally.compare(keys)}")
        done_seconds = time.monotonic() - load_from
        cpu = sampler.cpu_seconds() - cpu_before
        sampler.stop()
        return {
            "variant": variant,
            "reads": total,
            "start_to_subscribed_seconds": round(start_seconds, 2),
            "start_cpu_seconds": round(start_cpu, 2),
            "idle_seconds": idle_seconds,
            "idle_cpu_percent": round(idle_percent, 3),
            "publish_seconds": round(publish_seconds, 2),
            "landed_seconds": round(done_seconds, 2),
            **_under_load(sampler, load_from, cpu, total),
        }
    finally:
        if sampler is not None:
            sampler.stop()
        if daemon is not None:
            daemon.terminate()
        if tally is not None:
            tally.stop()
        if upstream is not None:
            upstream.stop()
        source.stop()


def bare_variant(ctx: Context) -> dict:
    """The bare paho subscriber on the same traffic, its process sampled as the daemon's tree."""
    quick = ctx.settings.quick
    _idle_seconds, load_seconds = QUICK_TIMING if quick else FULL_TIMING
    per_reader = int(RATE * load_seconds / READERS)
    total = per_reader * READERS
    directory = ctx.next_dir(f"{NAME}-{BARE}")
    directory.mkdir(parents=True, exist_ok=True)
    source = MosquittoProcess(directory / "source")
    source.start()
    subscriber: subprocess.Popen[str] | None = None
    sampler: TreeSampler | None = None
    try:
        subscriber = subprocess.Popen(
            [
                *(sys.executable, "-m", "bench.bare_subscriber"),
                *(source.host, str(source.port), BARE_CLIENT_ID),
                *("--qos", str(SOURCE_QOS), "--messages", str(total), "--parse"),
                *("--subscribe", READERS_TOPIC, "--timeout", str(LANDED_TIMEOUT + load_seconds)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        if not source.wait_for_output(f"{BARE_CLIENT_ID} {SOURCE_QOS} {READERS_TOPIC}", 60):
            raise BenchError("the bare subscriber did not subscribe")
        sampler = TreeSampler(subscriber.pid)
        sampler.start()
        load_from = time.monotonic()
        _publish(ctx, source, per_reader)
        out, _ = subscriber.communicate(timeout=LANDED_TIMEOUT)
        result = json.loads(out.strip().splitlines()[-1])
        if not result["ok"] or result["messages"] != total:
            raise BenchError(f"the bare subscriber took {result['messages']} of {total}")
        # Its own count, first PUBLISH -> last ack: the process is gone before a last sample.
        cpu = result["cpu_seconds"]
        sampler.stop()
        return {
            "variant": BARE,
            "reads": total,
            **_under_load(sampler, load_from, cpu, total),
        }
    finally:
        if sampler is not None:
            sampler.stop()
        if subscriber is not None and subscriber.poll() is None:
            subscriber.kill()
            subscriber.wait()
        source.stop()


def footprint(ctx: Context) -> dict:
    variants = {variant: one_variant(ctx, variant) for variant in FORWARD_PROCESS}
    variants[BARE] = bare_variant(ctx)
    met = {}
    for variant, measured in variants.items():
        target = TARGETS[variant]
        met[variant] = {
            "pss": measured["pss_median_mib"] <= target["pss_mib"],
            "cpu": measured["cpu_us_per_read"] <= target["cpu_us_per_read"],
        }
        if "idle_cpu_percent" in measured:
            met[variant]["idle"] = measured["idle_cpu_percent"] <= IDLE_TARGET_PERCENT
    landing, forwarding = variants["landing"], variants["forwarding"]
    return {
        "kind": "fxgate-bench",
        "module": "bench.footprint",
        "name": NAME,
        "title": "the daemon's process tree at 1,000 single reads/s: PSS, processes, CPU a read",
        "setup": {
            "readers": READERS,
            "rate": RATE,
            "qos": SOURCE_QOS,
            "daemon": "fxgate run, default configuration; with forwarding: one route to a "
            "second mosquitto, its defaults",
            "code": os.environ.get("FXGATE_FOOTPRINT_CODE") or "this checkout",
        },
        "variants": variants,
        "targets": TARGETS,
        "idle_target_percent": IDLE_TARGET_PERCENT,
        "met_by_variant": met,
        "report_only": sorted(REPORT_ONLY),
        "met": all(all(m.values()) for v, m in met.items() if v not in REPORT_ONLY),
        "headline": (
            f"landing: {landing['pss_median_mib']:.0f} MiB PSS (max "
            f"{landing['pss_max_mib']:.0f}) in {landing['processes']} processes, "
            f"{landing['cpu_us_per_read']:.0f} us/read; forwarding: "
            f"{forwarding['pss_median_mib']:.0f} MiB in {forwarding['processes']}, "
            f"{forwarding['cpu_us_per_read']:.0f} us/read; idle {landing['idle_cpu_percent']:.2f} "
            f"% of a core; start {landing['start_to_subscribed_seconds']:.1f} s"
            + _shared_text(variants)
        ),
    }


def _shared_text(variants: dict) -> str:
    text = ""
    shared = variants.get("forwarding-shared")
    if shared is not None:
        text += (
            f"; forward leg in the daemon's process: {shared['pss_median_mib']:.0f} MiB in "
            f"{shared['processes']}, {shared['cpu_us_per_read']:.0f} us/read"
        )
    bare = variants.get(BARE)
    if bare is not None:
        text += (
            f"; bare paho: {bare['pss_median_mib']:.0f} MiB, {bare['cpu_us_per_read']:.0f} us/read"
        )
    return text


def rows(result: dict) -> list[list[str]]:
    found = []
    for variant, measured in result["variants"].items():
        target = result["targets"][variant]
        met = result["met_by_variant"][variant]
        if variant == BARE:
            what = (
                "the bare paho subscriber (`json.loads` of each payload, a manual ack, nothing "
                "stored) on the same 1,000 reads/s: its process's PSS median (max "
                f"{measured['pss_max_mib']:.0f} MiB); CPU a read: the floor under fxgate"
            )
        else:
            what = (
                "`fxgate run` at 1,000 single reads/s (2 readers, QoS 1), whole process tree: "
                f"PSS median (max {measured['pss_max_mib']:.0f} MiB) in "
                f"{measured['processes']} processes; CPU a read; idle "
                f"{measured['idle_cpu_percent']:.2f} % of a core; spawn -> subscribed "
                f"{measured['start_to_subscribed_seconds']:.1f} s"
            )
        found.append(
            [
                f"`{NAME}` ({variant})",
                what,
                "—",
                f"{measured['pss_median_mib']:.0f} MiB, {measured['cpu_us_per_read']:.0f} µs",
                "—",
                "report only"
                if variant in result.get("report_only", ())
                else f"≤ {target['pss_mib']:.0f} MiB, ≤ {target['cpu_us_per_read']:.0f} µs, "
                f"idle ≤ {result['idle_target_percent']:g} %",
                "—"
                if variant in result.get("report_only", ())
                else ("yes" if all(met.values()) else "**no**"),
                "1",
            ]
        )
    return found


def plot(results_dir: Path, result: dict) -> Path:
    import matplotlib.pyplot as plt

    path = results_dir / f"{NAME}.png"
    fig, (memory, cpu) = plt.subplots(1, 2, figsize=(9, 4.2), dpi=110)
    names = list(result["variants"])
    measured = [result["variants"][n] for n in names]
    memory.bar(names, [m["pss_median_mib"] for m in measured], color="tab:blue", label="median")
    memory.plot(names, [m["pss_max_mib"] for m in measured], "v", color="black", label="max")
    memory.plot(names, [result["targets"][n]["pss_mib"] for n in names], "_", ms=40, color="red")
    memory.set_ylabel("PSS of the process tree (MiB)")
    memory.legend()
    cpu.bar(names, [m["cpu_us_per_read"] for m in measured], color="tab:orange")
    cpu.plot(names, [result["targets"][n]["cpu_us_per_read"] for n in names], "_", ms=40, c="red")
    cpu.set_ylabel("CPU per read (µs), target in red")
    fig.suptitle(result["headline"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, footprint, True),)
