"""Memory through a long upstream outage (issue 5, item 6; DESIGN §3.4 bounded memory).

One run, no baseline: the claim is about fxgate alone. `fxgate run` (the daemon as shipped, a
subprocess) forwards to an upstream mosquitto through `tests.harness.proxy.FaultProxy`; simulated
readers publish at a steady rate to the source mosquitto. After a warm-up with the upstream up,
the proxy refuses and cuts every connection (the upstream broker looks down) for the outage, then
lets them through again, and the backlog drains.

Every second the bench samples the RSS of the daemon's Python processes (its own and its Python
children: the forward process, which holds tier 2 by default, and the parse workers) and of its
Spark JVM (its `java` descendant) with psutil, and reads the daemon's `status.json` (tier-2 depth,
both sinks' lag in the ledger, the disk budget). With small tier-2 caps tier 2 is full within
seconds of the cut; from then on the upstream's backlog waits in the inbound ledger on disk (issue
12: the ledger is the buffer), the source stays acknowledged and the table keeps landing, so the
daemon's memory must stay flat however long the outage lasts. The target: the Python RSS growth
over the outage's second half (least-squares fit) stays under the tier-2 byte cap plus a small,
stated slack, the source is never paused (only the disk budget may pause it, and it is far away
here), and afterwards every published read arrives upstream once (the route forwards at QoS 2) and
lands in the `reads` table once. (`bench.outage` runs the same kind of outage at the source
broker's shipped queue limits and measures lag, ledger growth and the drain.)
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import matplotlib
import matplotlib.ticker
import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from actors.devtools.mosquitto import MosquittoProcess
from actors.devtools.simulate import SimulationResult, expected_read_ids, simulate
from actors.mqtt.upstream import IDEMPOTENCY_PROPERTY
from bench.benchmarks import Benchmark, Context
from bench.harness import READERS_TOPIC, BenchError, LoadMeter
from spark.report import Comparison, compare, landed_ids_arrow
from tests.harness.checks import wait_until_landed
from tests.harness.daemon import DaemonProcess
from tests.harness.proxy import FaultProxy

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

NAME = "memory"
MIB = 1024 * 1024

RATE = 300.0  # messages/s in total, QoS 1, from READERS simulated FX9600s
READERS = 4
SOURCE_QOS = 1
ROUTE_QOS = 2  # exactly once upstream: the broker de-duplicates a re-sent QoS 2 packet id
SAMPLE_SECONDS = 1.0  # the daemon rewrites status.json every second, too

# (warm-up, outage) seconds
FULL_TIMING = (60.0, 600.0)
QUICK_TIMING = (20.0, 60.0)

# Small caps so that a ~250-byte read fills the byte cap within seconds of the cut: the caps, not
# the outage's length, must be what bounds the daemon. The byte cap binds first (~2,000 reads).
# (There is no high watermark any more: a full tier 2 takes no more from the ledger.)
TIER2_MAX_MESSAGES = 4000
TIER2_MAX_BYTES = 512 * 1024
LOW_WATERMARK = 0.5
# What a flat process still moves by: pymalloc arenas, SQLite's page cache (2 MiB by default per
# connection) and the status writer's garbage. Stated before measuring, not fitted to a run.
RSS_SLACK_BYTES = 4 * MIB
# The upstream reconnect backoff is capped low so that the drain measures fxgate draining, not
# the default 120 s backoff after a 10-minute outage.
UPSTREAM_MAX_BACKOFF = 5.0

# The default (RETRY_ALL, 3 retries): an outage does not count against a pack's retries (it did
# once: a 100 s outage dead-lettered the 180 reads in flight at the cut), so the defaults must
# deliver every read after a 10-minute outage.
PACK_RETRIES = 3

UPSTREAM_SUBSCRIBER_ID = "bench-memory-upstream"
# The drain counts as stuck when nothing new arrives upstream for this long.
DRAIN_STALL_SECONDS = 60.0


# -- the upstream side: who received what -------------------------------------------------------


class UpstreamTally:
    """A paho subscriber on the upstream broker (not through the proxy, so it stays connected
    through the outage), counting each message by the idempotency key fxgate puts on it, with
    the wall time each key first arrived and the payload of the latest arrival."""

    def __init__(self, broker: MosquittoProcess) -> None:
        self._broker = broker
        self._cond = threading.Condition()
        self.keys: Counter[str] = Counter()
        self.arrived: dict[str, float] = {}
        self.last_payload: bytes | None = None
        self.without_key = 0
        self._subscribed = threading.Event()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            UPSTREAM_SUBSCRIBER_ID,
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self._client.on_message = self._on_message
        self._client.on_subscribe = lambda *_args: self._subscribed.set()

    def start(self, timeout: float = 10.0) -> None:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        self._client.connect(
            self._broker.host,
            self._broker.port,
            clean_start=True,
            properties=properties,
        )
        self._client.loop_start()
        # QoS 2 as well: a QoS 1 subscription could itself duplicate and blur fxgate's count.
        self._client.subscribe(READERS_TOPIC, qos=2)
        if not self._subscribed.wait(timeout):
            raise BenchError("upstream subscriber: no SUBACK")

    def stop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def _on_message(self, client, userdata, message) -> None:
        key = dict(getattr(message.properties, "UserProperty", None) or []).get(
            IDEMPOTENCY_PROPERTY
        )
        at = time.time()
        with self._cond:
            self.last_payload = message.payload
            if key is None:
                self.without_key += 1
            else:
                self.keys[key] += 1
                self.arrived.setdefault(key, at)
            self._cond.notify_all()

    @property
    def received(self) -> int:
        with self._cond:
            return self.keys.total() + self.without_key

    def wait_for(self, expected: set[str], timeout: float, stall: float) -> bool:
        """Until every key in `expected` arrived; gives up at `timeout`, or once nothing new
        has arrived for `stall` seconds (a read given up on upstream never comes)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not expected <= self.keys.keys():
                seen = self.keys.total()
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait_for(
                    lambda seen=seen: self.keys.total() != seen, min(stall, left)
                ):
                    return False
            return True

    def compare(self, expected: set[str]) -> dict:
        with self._cond:
            return {
                "expected": len(expected),
                "received": self.keys.total() + self.without_key,
                "missing": len(expected - self.keys.keys()),
                "duplicates": sum(1 for k, n in self.keys.items() if n > 1),
                "unexpected": len(self.keys.keys() - expected),
                "without_key": self.without_key,
            }


# -- sampling -----------------------------------------------------------------------------------


class Sampler:
    """Every SAMPLE_SECONDS: the daemon's RSS, its JVM's RSS and its status.json, on a thread.

    `fields` picks what to keep of status.json (a dict; {} when there is none yet); the default
    is this benchmark's `status_fields`."""

    def __init__(
        self,
        daemon: DaemonProcess,
        status_file: Path,
        t0: float,
        progress,
        fields: Callable[[dict], dict] | None = None,
    ) -> None:
        self._daemon = daemon
        self._status_file = status_file
        self._t0 = t0
        self._progress = progress  # () -> dict of the bench's own counters
        self._fields = fields or status_fields
        self._stop = threading.Event()
        self.died = threading.Event()
        self.samples: list[dict] = []
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            sample = self._take()
            if sample is None:
                self.died.set()
                return
            self.samples.append(sample)
            self._stop.wait(SAMPLE_SECONDS)

    def _take(self) -> dict | None:
        at = time.monotonic() - self._t0
        try:
            daemon = psutil.Process(self._daemon.pid)
            python_rss = daemon.memory_info().rss
            descendants = daemon.children(recursive=True)
        except psutil.NoSuchProcess:
            return None
        # The daemon's Python children (the forward process, which holds tier 2 by default,
        # and the parse workers) count as Python: the bound is on the gateway, not one process.
        jvm_rss, jvms, children_rss = 0, 0, 0
        for child in descendants:
            try:
                if child.name() == "java":
                    jvm_rss += child.memory_info().rss
                    jvms += 1
                else:
                    children_rss += child.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        python_rss += children_rss
        # The bench reaps these by PID when it ends, whatever happened to the daemon.
        self._daemon.spawned |= {child.pid for child in descendants}
        return {
            "t": round(at, 2),
            "python_rss": python_rss,
            "python_children_rss": children_rss,
            **_rss_kinds(self._daemon.pid),
            "jvm_rss": jvm_rss if jvms else None,
            "jvms": jvms,
            **self._status(),
            **self._progress(),
        }

    def _status(self) -> dict:
        try:
            status = json.loads(self._status_file.read_text())
        except (OSError, json.JSONDecodeError):
            return {"status_age": None, **self._fields({})}
        return {
            # How old the daemon's snapshot is: it is written every second by its main loop.
            "status_age": round(time.time() - status.get("wall_time", 0.0), 1),
            **self._fields(status),
        }


def status_fields(status: dict) -> dict:
    """What this benchmark keeps of one status.json (actors.supervisor `status()`; the ledger's
    part is actors.ledger `stats()`, tier 2's actors.buffer `status()`)."""
    buffer = status.get("buffer") or {}
    ledger = status.get("ledger") or {}
    lag = ledger.get("lag") or {}
    budget = ledger.get("budget") or {}
    outbound = status.get("outbound") or {}
    intake = status.get("intake") or {}
    return {
        "tier2_messages": buffer.get("tier2_messages"),
        "tier2_bytes": buffer.get("tier2_bytes"),
        "tier2_credit_out": buffer.get("credit_out"),
        # Only the disk budget pauses the source now; `paused_by` names what holds it.
        "paused_by": ledger.get("paused_by"),
        "budget_paused": budget.get("paused"),
        "ledger_used_bytes": budget.get("used_bytes"),
        # Messages the table has not landed yet (`pending`), and the upstream's backlog: what
        # waits in the ledger for tier 2 while the upstream is away.
        "ledger_pending": ledger.get("pending"),
        "table_lag_messages": (lag.get("table") or {}).get("messages"),
        "table_lag_seconds": (lag.get("table") or {}).get("oldest_age_seconds"),
        "upstream_lag_messages": (lag.get("upstream") or {}).get("messages"),
        "upstream_lag_seconds": (lag.get("upstream") or {}).get("oldest_age_seconds"),
        # Reads decoded off the source socket and not yet taken by the ledger (the intake
        # bound, where the daemon has one).
        "intake_waiting_messages": intake.get("waiting_messages"),
        "intake_waiting_bytes": intake.get("waiting_bytes"),
        "in_flight": outbound.get("in_flight"),
        "dead": outbound.get("dead"),
        "forwarded": outbound.get("forwarded"),
        "upstream_state": (status.get("upstream") or {}).get("state"),
        "batches_written": status.get("batches_written"),
    }


# -- the run ------------------------------------------------------------------------------------


def forwarding_config(
    data: Path, source: MosquittoProcess, proxy: FaultProxy, instance_id: str, extra: str = ""
) -> str:
    """The config file both outage benchmarks give the daemon: QoS 1 in, one QoS 2 route out
    through the proxy, the upstream's backoff capped; `extra` sections appended."""
    return f"""\
[gateway]
data_dir = "{data}"

[source]
host = "{source.host}"
port = {source.port}
qos = {SOURCE_QOS}
environment_id = "bench"
instance_id = "{instance_id}"

[upstream]
host = "{proxy.host}"
port = {proxy.port}
reconnect_max_delay_seconds = {UPSTREAM_MAX_BACKOFF}

[[routes]]
source = "{READERS_TOPIC}"
qos = {ROUTE_QOS}
{extra}"""


def write_config(path: Path, data: Path, source: MosquittoProcess, proxy: FaultProxy) -> str:
    text = forwarding_config(
        data,
        source,
        proxy,
        "memory",
        f"""
[packs]
retries = {PACK_RETRIES}

[buffer]
max_messages = {TIER2_MAX_MESSAGES}
max_bytes = {TIER2_MAX_BYTES}
low_watermark = {LOW_WATERMARK}
""",
    )
    path.write_text(text)
    return text


def outage_run(ctx: Context) -> dict:
    quick = ctx.settings.quick
    warmup, outage = QUICK_TIMING if quick else FULL_TIMING
    per_reader = int(RATE * (warmup + outage) / READERS)
    directory = ctx.next_dir(NAME)
    data = directory / "data"
    directory.mkdir(parents=True, exist_ok=True)
    source = MosquittoProcess(directory / "source")
    upstream = MosquittoProcess(directory / "upstream")
    proxy = FaultProxy(upstream.host, upstream.port)
    tally = UpstreamTally(upstream)
    marks: dict[str, float] = {}
    failed = threading.Event()
    outcome: dict = {}
    sent = {"n": 0}

    def progress() -> dict:
        return {"sent": sent["n"], "upstream_received": tally.received}

    def publish() -> None:
        try:
            outcome["published"] = simulate(
                source.host,
                source.port,
                readers=READERS,
                rate=RATE,
                count=per_reader,
                qos=SOURCE_QOS,
                seed=ctx.seed(),
                client_id_prefix="bench-memory",
                progress=lambda n: sent.__setitem__("n", n),
                ack_timeout=60.0,
            )
        except Exception as error:  # reported by the main thread
            outcome["publish_error"] = repr(error)
            failed.set()

    def now() -> float:
        return round(time.monotonic() - t0, 2)

    def hold_until(t: float) -> None:
        """Wait until `t` on the run's clock, or fail as soon as the publisher or daemon does."""
        while (left := t - (time.monotonic() - t0)) > 0:
            if failed.wait(min(left, 1.0)) or sampler.died.is_set():
                raise BenchError(
                    f"run broke at t={now()}: {outcome.get('publish_error') or 'daemon exited'}"
                    f"\ndaemon log tail:\n{_tail(daemon)}"
                )

    source.start()
    daemon: DaemonProcess | None = None
    sampler: Sampler | None = None
    publisher = threading.Thread(target=publish, name="memory-publisher", daemon=True)
    try:
        upstream.start()
        proxy.start()
        config_text = write_config(directory / "fxgate.toml", data, source, proxy)
        tally.start()
        daemon = DaemonProcess(directory, {}, directory / "fxgate.toml")
        t0, wall0 = time.monotonic(), time.time()
        daemon.start()
        daemon.wait_for_log(r"source: subscribed", timeout=240)
        daemon.wait_for_log(r"upstream: connected", timeout=60)
        marks["ready"] = now()
        sampler = Sampler(daemon, data / "status.json", t0, progress)
        sampler.start()
        meter = LoadMeter()
        publisher.start()
        marks["publish_start"] = now()
        hold_until(marks["publish_start"] + warmup)

        marks["outage_start"] = now()
        proxy.refuse()
        cut = proxy.cut()
        hold_until(marks["outage_start"] + outage)

        mark = daemon.mark()
        marks["outage_end"] = now()
        proxy.accept()
        daemon.wait_for_log(r"upstream: connected", timeout=3 * UPSTREAM_MAX_BACKOFF, after=mark)
        marks["upstream_reconnected"] = now()
        publisher.join(120)
        if publisher.is_alive() or "published" not in outcome:
            raise BenchError(f"publisher did not finish: {outcome.get('publish_error')}")
        marks["publish_done"] = now()
        published: SimulationResult = outcome["published"]
        keys = {r.message_key for r in published.published}
        read_ids = expected_read_ids(published.published)

        # Generous: the backlog drains at the forward leg's pace (QoS 2, window 20).
        drain_timeout = 120.0 + len(keys) / 100.0
        complete = tally.wait_for(keys, drain_timeout, stall=DRAIN_STALL_SECONDS)
        if complete:
            marks["upstream_complete"] = now()
        try:
            # Reads missing upstream never land (the table records what reached upstream).
            wait_until_landed(
                daemon,
                data,
                len(read_ids),
                timeout=drain_timeout if complete else DRAIN_STALL_SECONDS,
            )
            marks["table_complete"] = now()
        except AssertionError as stalled:
            outcome["landing_error"] = str(stalled).splitlines()[0]
        # A few more samples after the drain: memory once the backlog is gone.
        hold_until(now() + 5 * SAMPLE_SECONDS)
        load = meter.stop()
        sampler.stop()
        exit_code = daemon.terminate()
        marks["stopped"] = now()
    finally:
        if sampler is not None:
            sampler.stop()
        if daemon is not None:
            daemon.reap()
            # Kept with the scratch directory (--keep-work) for whoever reads the numbers.
            (directory / "daemon.log").write_text(daemon.output())
        tally.stop()
        proxy.close()
        upstream.stop()
        source.stop()

    upstream_check = tally.compare(keys)
    ids, _ = landed_ids_arrow(data / "tables")
    table = compare(read_ids, ids)
    return assemble(
        quick=quick,
        warmup=warmup,
        outage=outage,
        samples=sampler.samples,
        marks=marks,
        published=published,
        upstream_check=upstream_check,
        table=table,
        landing_error=outcome.get("landing_error"),
        exit_code=exit_code,
        cut=cut,
        load=load,
        config_text=config_text,
        pauses=pause_log(daemon.output(), wall0),
        receive_maximum=receive_maximum(daemon.output()),
    )


def _tail(daemon: DaemonProcess | None, lines: int = 40) -> str:
    return "" if daemon is None else "\n".join(daemon.output().splitlines()[-lines:])


# -- reading the series -------------------------------------------------------------------------


def fit_growth(samples: list[dict], key: str, start: float, end: float) -> dict | None:
    """Least-squares slope of `key` over [start, end], and the growth it implies there."""
    points = [(s["t"], s[key]) for s in samples if start <= s["t"] <= end and s.get(key)]
    if len(points) < 3:
        return None
    xs, ys = zip(*points, strict=True)
    slope, _ = statistics.linear_regression(xs, ys)
    return {
        "from_t": xs[0],
        "to_t": xs[-1],
        "samples": len(points),
        "slope_bytes_per_second": round(slope, 1),
        "growth_bytes": round(slope * (xs[-1] - xs[0])),
        "first_bytes": ys[0],
        "last_bytes": ys[-1],
        "min_bytes": min(ys),
        "max_bytes": max(ys),
    }


# The daemon's log format (actors.app.daemon.configure_logging): asctime first, local time.
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
# Since issue 12 only the disk budget pauses the source ("ledger at its disk budget (...): source
# paused, ..." / "ledger back within its disk budget (...): source resumed"); the tier-2 form
# "source paused (tier2): holding acknowledgements" is the code before it (60ff810).
_PAUSE_LINE = re.compile(r"source (paused|resumed)(?: \((\w+)\))?")
_SOURCE_RECEIVE_MAXIMUM = re.compile(r"source: client id .*receive maximum (\d+)")


def pause_log(output: str, wall0: float) -> list[dict]:
    """Every pause and resume of the source, from the inbound ledger's own log lines (ms
    precision): a resume and the next pause can fall between two 1-second status snapshots."""
    events = []
    for line in output.splitlines():
        found, stamp = _PAUSE_LINE.search(line), _LOG_TIME.match(line)
        if found and stamp:
            wall = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            events.append(
                {
                    "t": round(wall - wall0, 3),
                    "event": found.group(1),
                    "reason": found.group(2) or "budget",
                }
            )
    return events


def receive_maximum(output: str) -> int | None:
    found = _SOURCE_RECEIVE_MAXIMUM.search(output)
    return int(found.group(1)) if found else None


def transitions(samples: list[dict]) -> list[dict]:
    """When the disk budget paused and resumed the source, as seen in status.json (1 s)."""
    found, before = [], False
    for s in samples:
        paused = s.get("budget_paused")
        if paused is None:
            continue
        if paused != before:
            found.append({"t": s["t"], "event": "paused" if paused else "resumed"})
            before = paused
    return found


def largest_step(samples: list[dict], key: str, start: float, end: float) -> dict | None:
    """The largest rise between two consecutive samples in [start, end]: a flat series that
    moved in one step (an allocator arena, a cache) reads as a slope on a least-squares fit."""
    points = [(s["t"], s[key]) for s in samples if start <= s["t"] <= end and s.get(key)]
    if len(points) < 2:
        return None
    pairs = list(itertools.pairwise(points))
    rise, at = max((b[1] - a[1], b[0]) for a, b in pairs)
    others = sum(max(0, b[1] - a[1]) for a, b in pairs) - rise
    return {"rise_bytes": rise, "at_t": at, "other_rises_bytes": others}


def step_sentence(samples: list[dict], start: float, end: float) -> str:
    step = largest_step(samples, "python_rss", start, end)
    if step is None or step["rise_bytes"] <= 0:
        return ""
    return (
        f" Over the whole outage the Python RSS rose in steps: the largest "
        f"{step['rise_bytes'] / MIB:.1f} MiB at {step['at_t'] - start:.0f} s into it, all "
        f"other rises together {step['other_rises_bytes'] / MIB:.1f} MiB."
    )


# The daemon process's resident memory by kind (/proc/PID/status): its heap and other private
# memory (anon: Python objects, delta-rs and Arrow buffers), mapped files (file: libraries, and
# the ledger's WAL index) and shared memory (shmem): which of them grows tells a leak from a cache.
_RSS_KINDS = (
    # (/proc/PID/status field, sample key, what it holds)
    ("RssAnon", "daemon_rss_anon", "heap and other private memory"),
    ("RssFile", "daemon_rss_file", "mapped files"),
    ("RssShmem", "daemon_rss_shmem", "shared memory"),
)


def _rss_kinds(pid: int) -> dict:
    keys = {field: key for field, key, _ in _RSS_KINDS}
    kinds = dict.fromkeys(keys.values())
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return kinds
    for line in lines:
        name, _, value = line.partition(":")
        if name in keys:
            kinds[keys[name]] = int(value.split()[0]) * 1024
    return kinds


def _kinds_sentence(by_kind: dict) -> str:
    parts = [
        f"{label} {fit['growth_bytes'] / MIB:+.1f} MiB"
        for _, key, label in _RSS_KINDS
        if (fit := by_kind.get(key))
    ]
    if not parts:
        return ""
    return f" The daemon process alone grew in that half by: {', '.join(parts)}."


def span(samples: list[dict], key: str, start: float, end: float) -> dict:
    values = [s[key] for s in samples if start <= s["t"] <= end and s.get(key) is not None]
    if not values:
        return {}
    return {
        "first": values[0],
        "last": values[-1],
        "min": min(values),
        "max": max(values),
    }


def assemble(
    *,
    quick: bool,
    warmup: float,
    outage: float,
    samples: list[dict],
    marks: dict,
    published: SimulationResult,
    upstream_check: dict,
    table: Comparison,
    landing_error: str | None,
    exit_code: int,
    cut: int,
    load: dict,
    config_text: str,
    pauses: list[dict],
    receive_maximum: int | None,
) -> dict:
    start, end = marks["outage_start"], marks["outage_end"]
    middle = (start + end) / 2
    python_half = fit_growth(samples, "python_rss", middle, end)
    jvm_half = fit_growth(samples, "jvm_rss", middle, end)
    python_whole = fit_growth(samples, "python_rss", start, end)
    daemon_half_by_kind = {key: fit_growth(samples, key, middle, end) for _, key, _ in _RSS_KINDS}
    drained_at = max(
        (marks[k] for k in ("upstream_complete", "table_complete") if k in marks),
        default=marks.get("stopped", end),
    )
    phases = {
        "before_outage": (marks["ready"], start),
        "outage": (start, end),
        "drain": (end, drained_at),
        "whole_run": (0.0, marks.get("stopped", drained_at)),
    }
    rss = {
        process: {phase: span(samples, key, a, b) for phase, (a, b) in phases.items()}
        for process, key in (("python", "python_rss"), ("jvm", "jvm_rss"))
    }
    tier2 = {
        "max_messages": max((s.get("tier2_messages") or 0 for s in samples), default=0),
        "max_bytes": max((s.get("tier2_bytes") or 0 for s in samples), default=0),
    }
    # When tier 2 first came within 10 % of either cap during the outage (status.json, 1 s):
    # the next message would not fit.
    tier2_full_at = next(
        (
            s["t"]
            for s in samples
            if start <= s["t"] <= end
            and (
                (s.get("tier2_messages") or 0) >= 0.9 * TIER2_MAX_MESSAGES
                or (s.get("tier2_bytes") or 0) >= 0.9 * TIER2_MAX_BYTES
            )
        ),
        None,
    )
    pause_events = pauses
    # Since issue 12 nothing but the disk budget pauses the source: the outage must not.
    pauses_seen = [e["t"] for e in pause_events if e["event"] == "paused"] + [
        s["t"] for s in samples if s.get("budget_paused") or s.get("paused_by")
    ]
    never_paused = not pauses_seen
    upstream_backlog = {
        phase: span(samples, "upstream_lag_messages", a, b).get("max")
        for phase, (a, b) in phases.items()
    }
    table_lag_seconds = {
        phase: span(samples, "table_lag_seconds", a, b).get("max")
        for phase, (a, b) in phases.items()
    }
    intake = {
        phase: span(samples, "intake_waiting_messages", a, b).get("max")
        for phase, (a, b) in phases.items()
    }
    bound = TIER2_MAX_BYTES + RSS_SLACK_BYTES
    growth = python_half["growth_bytes"] if python_half else None
    flat = growth is not None and growth < bound
    delivered = (
        upstream_check["missing"] == 0
        and upstream_check["duplicates"] == 0
        and upstream_check["unexpected"] == 0
        and table.exact
        and landing_error is None
    )
    met = flat and delivered and never_paused
    messages = len(published.published)
    half_seconds = end - middle
    # What the second half brought in: what an unbounded tier 2 would have had to hold.
    # Payload bytes per message as tier 2 itself counted them.
    per_message = (
        statistics.fmean(
            s["tier2_bytes"] / s["tier2_messages"] for s in samples if s.get("tier2_messages")
        )
        if any(s.get("tier2_messages") for s in samples)
        else None
    )
    inbound_half_bytes = RATE * half_seconds * per_message if per_message else None
    # The publisher stops with the outage: the drain is the upstream's backlog alone.
    drain_seconds = (
        round(marks["upstream_complete"] - end, 1) if "upstream_complete" in marks else None
    )
    backlog = upstream_backlog.get("whole_run") or 0

    def mib(value: float | None) -> str:
        return "—" if value is None else f"{value / MIB:,.1f} MiB"

    headline = (
        f"Python RSS {mib(rss['python']['outage'].get('first'))} at the cut, "
        f"{'+' if (growth or 0) >= 0 else ''}{mib(growth)} over the outage's second half "
        f"(bound {mib(bound)}), max {mib(rss['python']['whole_run'].get('max'))}; "
        f"JVM max {mib(rss['jvm']['whole_run'].get('max'))}; tier 2 max "
        f"{tier2['max_messages']:,} msgs / {tier2['max_bytes'] / 1024:,.0f} KiB; source "
        f"paused: {'no' if never_paused else 'yes'}; upstream drain {drain_seconds} s; "
        f"upstream missing {upstream_check['missing']} dup {upstream_check['duplicates']}, "
        f"table missing {len(table.missing)} dup {len(table.duplicates)}"
    )
    sentence = (
        f"With tier 2 capped at {TIER2_MAX_MESSAGES:,} messages / {TIER2_MAX_BYTES // 1024} KiB "
        + (
            f"tier 2 was full {tier2_full_at - start:.0f} s after the cut"
            if tier2_full_at is not None
            else "tier 2 never reached its caps (the run does not test them)"
        )
        + f" (it peaked at {tier2['max_messages']:,} messages, "
        f"{tier2['max_bytes'] / 1024:,.0f} KiB); from then on the upstream's backlog waited in "
        f"the ledger (up to {backlog:,} messages) while the source stayed acknowledged "
        + ("(never paused" if never_paused else f"(paused at t = {sorted(pauses_seen)[:5]} s")
        + (
            f"; the table's oldest unlanded read was at most {table_lag_seconds['outage']:.1f} s "
            "old during the outage)"
            if table_lag_seconds.get("outage") is not None
            else ")"
        )
        + f". Over the outage's last {half_seconds:.0f} s the daemon's RSS grew by "
        f"{mib(growth)} on a least-squares fit "
        + (
            f"({python_half['slope_bytes_per_second'] / 1024 * 60:,.1f} KiB/min), "
            if python_half
            else ""
        )
        + f"against a bound of {mib(bound)} (the tier-2 byte cap plus {mib(RSS_SLACK_BYTES)} "
        f"of allocator and SQLite slack), while that half brought in about "
        f"{mib(inbound_half_bytes)} of payloads at {RATE:.0f} msg/s that now waited in the "
        f"ledger on disk.{_kinds_sentence(daemon_half_by_kind)} The JVM went from "
        f"{mib(rss['jvm']['outage'].get('first'))} to "
        f"{mib(rss['jvm']['outage'].get('last'))} during the outage (the table keeps landing "
        f"then) and peaked at {mib(rss['jvm']['whole_run'].get('max'))}. "
        + (
            f"After the upstream came back, the {messages:,} published messages were all "
            f"upstream {drain_seconds} s later; the Python RSS peaked at "
            f"{mib(rss['python']['drain'].get('max'))} while draining."
            + (
                f" At most {intake['drain']:,} decoded reads waited for the ledger (the "
                "daemon's intake) while draining."
                if intake.get("drain") is not None
                else ""
            )
            if drain_seconds is not None
            else f"The drain did not finish: {landing_error}."
        )
        + f" Upstream: {upstream_check['missing']} missing, {upstream_check['duplicates']} "
        f"duplicated; table: {len(table.missing)} missing, {len(table.duplicates)} duplicated."
        + step_sentence(samples, start, end)
    )
    return {
        "kind": "fxgate-bench",
        "name": NAME,
        "module": __name__,
        "title": (
            f"Memory through a {outage / 60:.0f}-minute upstream outage at {RATE:.0f} msg/s "
            f"(QoS {SOURCE_QOS} in, QoS {ROUTE_QOS} upstream), small tier-2 caps"
        ),
        "unit": "bytes",
        "headline": headline,
        "met": met,
        "met_parts": {
            "python_rss_flat": flat,
            "delivered_once": delivered,
            "source_never_paused": never_paused,
        },
        "target": {
            "kind": "python_rss_growth_below",
            "value": bound,
            "description": (
                f"Python RSS growth over the outage's second half < tier-2 byte cap "
                f"({TIER2_MAX_BYTES // 1024} KiB) + {RSS_SLACK_BYTES // MIB} MiB, the source "
                "never paused, and every read once upstream and once in the table"
            ),
        },
        "bound": sentence,
        "setup": {
            "quick": quick,
            "warmup_seconds": warmup,
            "outage_seconds": outage,
            "rate_messages_per_second": RATE,
            "readers": READERS,
            "source_qos": SOURCE_QOS,
            "route_qos": ROUTE_QOS,
            "sample_seconds": SAMPLE_SECONDS,
            "tier2_max_messages": TIER2_MAX_MESSAGES,
            "tier2_max_bytes": TIER2_MAX_BYTES,
            "low_watermark": LOW_WATERMARK,
            "rss_slack_bytes": RSS_SLACK_BYTES,
            "pack_retries": PACK_RETRIES,
            "outage": "FaultProxy between fxgate and the upstream mosquitto: refuse() new "
            "connections and cut() the live one; accept() to end it. The upstream subscriber "
            "connects directly and stays connected.",
            "daemon": "`python -m actors.app.cli run --config fxgate.toml` (a subprocess; Spark "
            "defaults: local[2], 512m driver)",
            "brokers": "two mosquitto (actors.devtools.mosquitto.MosquittoProcess: 1M queued "
            "messages per client, autosave every second) on free loopback ports",
            "publisher": "actors.devtools.simulate.simulate: paced, window 20 per reader; "
            "publishes for warm-up + outage, then stops",
            "fxgate_config": config_text,
        },
        "marks": marks,
        "published": {
            "messages": messages,
            "failed": published.failed,
            "seconds": round(published.seconds, 1),
        },
        "connections_cut": cut,
        "python_rss_growth_second_half": python_half,
        "python_rss_growth_whole_outage": python_whole,
        # The daemon process alone (no children), by kind of memory: see _RSS_KINDS.
        "daemon_rss_growth_second_half_by_kind": daemon_half_by_kind,
        "jvm_rss_growth_second_half": jvm_half,
        "rss_bytes": rss,
        "tier2": tier2,
        "tier2_full_at": tier2_full_at,
        "upstream_backlog_max": upstream_backlog,
        "table_lag_seconds_max": table_lag_seconds,
        "intake_waiting_max": intake,
        "pause_events": pause_events,
        "pause_transitions_in_status": transitions(samples),
        "source_receive_maximum": receive_maximum,
        "drain_seconds": drain_seconds,
        "upstream": upstream_check,
        "table": {
            "published_reads": table.published,
            "landed": table.landed,
            "missing": len(table.missing),
            "duplicates": len(table.duplicates),
            "unexpected": len(table.unexpected),
            "landing_error": landing_error,
        },
        "daemon_exit_code": exit_code,
        "machine_load": load,
        "series": samples,
    }


# -- the table rows and the plot ---------------------------------------------------------------


def rows(result: dict) -> list[list[str]]:
    setup = result["setup"]
    half = result.get("python_rss_growth_second_half") or {}
    jvm_half = result.get("jvm_rss_growth_second_half") or {}
    rss = result["rss_bytes"]
    parts = result["met_parts"]
    n = len(result["series"])

    def mib(value: float | None, sign: bool = False) -> str:
        if value is None:
            return "—"
        return f"{value / MIB:{'+' if sign else ''},.1f} MiB"

    minutes = setup["outage_seconds"] / 60
    context = (
        f"{minutes:.0f}-min upstream outage, {setup['rate_messages_per_second']:.0f} msg/s "
        f"QoS {setup['source_qos']} in, tier 2 capped at {setup['tier2_max_messages']:,} msgs / "
        f"{setup['tier2_max_bytes'] // 1024} KiB"
    )
    up, table = result["upstream"], result["table"]
    if "source_never_paused" in parts:
        paused = f"source paused: {'no' if parts['source_never_paused'] else '**yes**'}"
    else:  # a result of the code before issue 12, when a full tier 2 paused the source
        paused = (
            "tier-2 paused the source: "
            f"{'yes' if parts.get('source_paused_during_outage') else 'no'}"
        )
    return [
        [
            f"`{result['name']}` Python",
            f"daemon RSS growth over the outage's second half (least-squares; {context}); "
            "baseline column: RSS at the cut",
            mib(rss["python"]["outage"].get("first")),
            f"{mib(half.get('growth_bytes'), sign=True)} (max "
            f"{mib(rss['python']['whole_run'].get('max'))})",
            "—",
            f"< {mib(result['target']['value'])}",
            "yes" if parts["python_rss_flat"] else "**no**",
            f"{n} samples, 1 run",
        ],
        [
            f"`{result['name']}` JVM",
            "Spark JVM RSS growth over the same half ("
            + (
                "the table keeps landing during the outage"
                if "source_never_paused" in parts
                else "no writes during the outage"
            )
            + "); baseline column: RSS at the cut",
            mib(rss["jvm"]["outage"].get("first")),
            f"{mib(jvm_half.get('growth_bytes'), sign=True)} (max "
            f"{mib(rss['jvm']['whole_run'].get('max'))})",
            "—",
            "report only",
            "—",
            f"{n} samples, 1 run",
        ],
        [
            f"`{result['name']}` drain",
            f"after the outage: {result['published']['messages']:,} published messages to "
            f"upstream (QoS {setup['route_qos']}) and the `reads` table; {paused}",
            "—",
            (
                f"{result['drain_seconds']} s; upstream {up['missing']} missing / "
                f"{up['duplicates']} dup; table {table['missing']} missing / "
                f"{table['duplicates']} dup"
            ),
            "—",
            "each read once",
            "yes" if parts["delivered_once"] else "**no**",
            "1 run",
        ],
    ]


def paused_spans(result: dict, last_t: float) -> list[tuple[float, float]]:
    """(paused, resumed) pairs from the pause log; one still open ends at `last_t`."""
    spans, since = [], None
    for event in result["pause_events"]:
        if event["event"] == "paused" and since is None:
            since = event["t"]
        elif event["event"] == "resumed" and since is not None:
            spans.append((since, event["t"]))
            since = None
    if since is not None:
        spans.append((since, last_t))
    return spans


def plot(results_dir: Path, result: dict) -> Path:
    path = results_dir / f"{result['name']}.png"
    series = result["series"]
    marks = result["marks"]
    t = [s["t"] for s in series]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), dpi=110, sharex=True)

    def mib(key: str) -> list[float | None]:
        return [None if s.get(key) is None else s[key] / MIB for s in series]

    top.plot(t, mib("python_rss"), color="tab:orange", label="daemon (Python) RSS")
    half = result.get("python_rss_growth_second_half")
    if half:
        slope = half["slope_bytes_per_second"]
        middle = [s for s in series if half["from_t"] <= s["t"] <= half["to_t"]]
        mean_t = statistics.fmean(s["t"] for s in middle)
        mean_y = statistics.fmean(s["python_rss"] for s in middle)
        xs = [half["from_t"], half["to_t"]]
        top.plot(
            xs,
            [(mean_y + slope * (x - mean_t)) / MIB for x in xs],
            color="black",
            linewidth=1.2,
            linestyle="--",
            label=f"fit over the outage's second half: {half['growth_bytes'] / MIB:+.2f} MiB",
        )
        # How far the fit could have climbed and still met the target.
        start_y = (mean_y + slope * (xs[0] - mean_t)) / MIB
        top.plot(
            xs,
            [start_y + result["target"]["value"] / MIB] * 2,
            color="tab:red",
            linewidth=1.0,
            linestyle=":",
            label=f"bound: +{result['target']['value'] / MIB:.1f} MiB over that half",
        )
    top.set_ylabel("RSS (MiB)")
    depth = top.twinx()
    depth.step(
        t,
        [s.get("tier2_messages") for s in series],
        where="post",
        color="tab:green",
        alpha=0.6,
        label="tier-2 depth (messages)",
    )
    depth.axhline(
        result["setup"]["tier2_max_messages"],
        color="tab:green",
        linewidth=0.6,
        linestyle=":",
        label="tier-2 message cap",
    )
    depth.set_ylabel("tier-2 messages")
    depth.set_ylim(bottom=0)

    bottom.plot(t, mib("jvm_rss"), color="tab:blue", label="Spark JVM RSS")
    bottom.set_ylabel("RSS (MiB)")
    received = bottom.twinx()
    received.plot(
        t,
        [s.get("upstream_received") for s in series],
        color="tab:purple",
        alpha=0.6,
        label="received upstream (messages)",
    )
    received.plot(
        t,
        [s.get("sent") for s in series],
        color="grey",
        alpha=0.6,
        label="published (messages)",
    )
    received.plot(
        t,
        [s.get("upstream_lag_messages") for s in series],
        color="tab:brown",
        alpha=0.6,
        label="upstream's backlog in the ledger (messages)",
    )
    received.set_ylabel("messages")
    received.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    bottom.set_xlabel("seconds since the daemon started")

    for index, ax in enumerate((top, bottom)):
        ax.axvspan(
            marks["outage_start"],
            marks["outage_end"],
            color="tab:red",
            alpha=0.08,
            label="upstream outage" if index == 0 else None,
        )
        # Bands, not lines: a source paused at the disk budget resumes and pauses again.
        for number, (paused, resumed) in enumerate(paused_spans(result, t[-1] if t else 0.0)):
            ax.axvspan(
                paused,
                resumed,
                ymax=0.04,
                color="tab:red",
                alpha=0.8,
                label="source paused (disk budget)" if index == number == 0 else None,
            )
        if "table_complete" in marks:
            ax.axvline(
                marks["table_complete"],
                color="black",
                linewidth=0.8,
                label="all reads in the table" if index == 0 else None,
            )
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    # One legend per panel, with both axes' lines.
    for ax, twin in ((top, depth), (bottom, received)):
        handles, labels = ax.get_legend_handles_labels()
        more_handles, more_labels = twin.get_legend_handles_labels()
        unique = dict(zip(labels + more_labels, handles + more_handles, strict=True))
        # Outside, right of the twin axis: inside, it would hide the lines it explains.
        ax.legend(
            unique.values(),
            unique.keys(),
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.1, 1.0),
            frameon=False,
        )
    fig.suptitle(f"{result['title']}\nmet: {result['met']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, outage_run, True),)
