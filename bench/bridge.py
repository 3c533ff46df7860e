"""The upstream side of the forwarding benchmarks: the mosquitto bridge baseline and two observers.

- `BridgeBroker`: a third mosquitto, the project's deliberate config (persistence, autosave every
  second, big queues), with two bridge connections: `in` from the source broker (a persistent
  session there, like fxgate's) and `out` to the upstream broker. It is what an operator would
  set up instead of fxgate to carry reads from the readers' broker to a site broker.
- `ArrivalCounter`: `mosquitto_sub` (C, QoS 0) on the upstream broker, noting the wall time of
  every arrival. The same instrument times every contestant: at QoS 0 mosquitto hands a message
  to its subscribers while it handles the PUBLISH (QoS 1) or the PUBREL (QoS 2), just before the
  PUBACK / PUBCOMP leaves, so first -> last arrival is the forwarder's first PUBLISH -> last ack
  within a loopback round trip, and a C client keeps up with any Python publisher here.
- `UpstreamCollector`: a paho subscriber with a persistent session at the run's QoS that keeps
  the idempotency key of every message it gets (loss and duplicates under kill).

mosquitto 2.0.11 bridge facts found while writing this (bench/results/forward-qos2.json keeps
the numbers): with `bridge_protocol_version mqttv50` the bridge's session on the remote broker
ends when the bridge disconnects (the remote broker queued nothing while it was down), so the
bridge here speaks MQTT 3.1.1 with cleansession false; and a bridge that takes QoS 2 messages
`in` from a remote broker forwards only about 2 x max_inflight_messages of a backlog, then stops
forwarding while it goes on acknowledging (PUBCOMP) the source.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from actors.devtools.mosquitto import MosquittoProcess
from persistence.keys import message_key

READERS_TOPIC = "zebra/fx/+/reads"
BRIDGE_IN_CLIENT_ID = "bench-bridge-in"
BRIDGE_OUT_CLIENT_ID = "bench-bridge-out"


class BridgeError(RuntimeError):
    pass


def bridge_lines(source: MosquittoProcess, upstream: MosquittoProcess, qos: int) -> list[str]:
    """Two bridge connections: `in` from the source broker, `out` to the upstream broker."""
    lines: list[str] = []
    for name, broker, client_id, direction in (
        ("from-source", source, BRIDGE_IN_CLIENT_ID, "in"),
        ("to-upstream", upstream, BRIDGE_OUT_CLIENT_ID, "out"),
    ):
        lines += [
            f"connection {name}",
            f"address {broker.host}:{broker.port}",
            # mqttv50 bridges send no session expiry in 2.0.11: the source broker dropped the
            # bridge's session at each disconnect and queued nothing for it (module docstring).
            "bridge_protocol_version mqttv311",
            f"remote_clientid {client_id}",
            # Both sides keep their sessions: the source queues for the bridge while it is
            # down, and the bridge keeps its local subscription (and queue) for the upstream.
            "cleansession false",
            "local_cleansession false",
            "start_type automatic",
            # Reconnect after 1 s, not the 5-30 s jitter default, like fxgate's first backoff.
            "restart_timeout 1",
            "try_private false",
            "notifications false",
            f"topic {READERS_TOPIC} {direction} {qos}",
        ]
    return lines


class BridgeBroker:
    """The bridging mosquitto. `start` returns once both bridge connections are up."""

    def __init__(
        self, directory: Path, source: MosquittoProcess, upstream: MosquittoProcess, qos: int
    ):
        self.source = source
        self.upstream = upstream
        self.qos = qos
        self.broker = MosquittoProcess(directory, extra=bridge_lines(source, upstream, qos))
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self.broker.pid

    def start(self, timeout: float = 20.0) -> float:
        """Start and wait until the bridge has subscribed on the source and connected upstream;
        returns the seconds that took."""
        began = time.monotonic()
        source_mark = self.source.line_count()
        upstream_mark = self.upstream.line_count()
        self.broker.start(timeout)
        # mosquitto's `subscribe` log line: "<client id> <qos> <filter>".
        subscribed = self.source.wait_for_output(
            f"{BRIDGE_IN_CLIENT_ID} {self.qos} {READERS_TOPIC}", timeout, start=source_mark
        )
        connected = self.upstream.wait_for_output(
            f"as {BRIDGE_OUT_CLIENT_ID} ", timeout, start=upstream_mark
        )
        if not (subscribed and connected):
            raise BridgeError(
                f"bridge not up within {timeout} s (subscribed on source: {subscribed}, "
                f"connected upstream: {connected}):\n{self.broker.output()[-2000:]}"
            )
        return time.monotonic() - began

    def stop(self) -> None:
        self.broker.stop()

    def kill(self) -> None:
        self.broker.kill()

    def restart_after_kill(self) -> float:
        self.restarts += 1
        return self.start()


class ArrivalCounter:
    """`mosquitto_sub -C N` on the upstream broker at QoS 0, one timestamp line per arrival."""

    def __init__(self, upstream: MosquittoProcess, directory: Path, expected: int) -> None:
        self.upstream = upstream
        self.expected = expected
        self.path = directory / "arrivals.txt"
        directory.mkdir(parents=True, exist_ok=True)
        self.client_id = f"bench-counter-{upstream.port}"
        binary = shutil.which("mosquitto_sub") or "/usr/bin/mosquitto_sub"
        argv = [
            binary,
            "-h",
            upstream.host,
            "-p",
            str(upstream.port),
            "-i",
            self.client_id,
            "-t",
            READERS_TOPIC,
            "-q",
            "0",
            "-C",
            str(expected),
            # seconds.nanoseconds of the wall clock at each arrival (@N is mosquitto_sub's own).
            "-F",
            "@s.@N",
        ]
        if shutil.which("stdbuf"):
            # Line-buffered, so that what arrived is on disk even if we must end it early.
            argv = ["stdbuf", "-oL", *argv]
        mark = upstream.line_count()
        self._out = self.path.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT)
        if not upstream.wait_for_output(f"{self.client_id} 0 {READERS_TOPIC}", 10, start=mark):
            self.close()
            raise BridgeError(f"arrival counter did not subscribe on {upstream.port}")

    def _arrivals(self) -> list[float]:
        if not self._out.closed:
            self._out.flush()
        times = []
        for line in self.path.read_text().splitlines():
            try:
                times.append(float(line.strip()))
            except ValueError:
                continue  # a line of mosquitto_sub's own (an error), not a timestamp
        return times

    def wait(self, timeout: float, stall_seconds: float) -> dict:
        """Until all `expected` arrived, or nothing new came for `stall_seconds` (a stalled
        forwarder), or `timeout`. Returns counts and the first -> last arrival time."""
        deadline = time.monotonic() + timeout
        seen, changed = 0, time.monotonic()
        stalled = False
        while True:
            try:
                self.proc.wait(min(1.0, max(0.01, deadline - time.monotonic())))
                break  # -C N reached: every expected message arrived
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            count = len(self._arrivals())
            if count != seen:
                seen, changed = count, now
            elif count and now - changed >= stall_seconds:
                stalled = True
                break
            if now >= deadline:
                stalled = True
                break
        self.close()
        times = self._arrivals()
        result = {"arrived": len(times), "expected": self.expected, "stalled": stalled}
        if len(times) >= 2:
            seconds = times[-1] - times[0]
            result["arrival_seconds"] = seconds
            result["arrival_rate"] = (len(times) - 1) / seconds if seconds > 0 else None
        return result

    def close(self) -> None:
        if self._out.closed:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()


class UpstreamCollector:
    """Every message the upstream broker delivers, by idempotency key (topic + payload: fxgate
    and the bridge both forward the payload unchanged to the same topic). A persistent session
    at the run's QoS, so nothing is lost on the collector's side; it is never killed."""

    def __init__(self, upstream: MosquittoProcess, qos: int, client_id: str) -> None:
        self.keys: Counter[str] = Counter()
        self.arrivals = 0
        self.last_arrival: float | None = None
        self.times: list[float] = []  # monotonic, one per arrival (for the timeline plot)
        self._cond = threading.Condition()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id, protocol=MQTTProtocolVersion.MQTTv5
        )
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_args: subscribed.set()
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        self.client.connect(
            upstream.host, upstream.port, keepalive=60, clean_start=True, properties=properties
        )
        self.client.loop_start()
        self.client.subscribe(READERS_TOPIC, qos=qos)
        if not subscribed.wait(10):
            self.close()
            raise BridgeError("upstream collector got no SUBACK")

    def _on_message(self, _client, _userdata, message) -> None:
        key = message_key(message.topic, message.payload)
        with self._cond:
            self.keys[key] += 1
            self.arrivals += 1
            self.last_arrival = time.monotonic()
            self.times.append(self.last_arrival)
            self._cond.notify_all()

    def count(self) -> int:
        with self._cond:
            return self.arrivals

    def wait_for_more_than(self, count: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.arrivals > count, timeout)

    def wait_settled(self, expected: set[str], quiet: float, timeout: float) -> bool:
        """Until every expected key arrived, or nothing arrived for `quiet` seconds; True if
        every key arrived."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if expected <= self.keys.keys():
                    return True
                now = time.monotonic()
                last = self.last_arrival or now
                if now - last >= quiet or now >= deadline:
                    return False
                self._cond.wait(min(quiet - (now - last), deadline - now))

    def snapshot(self) -> tuple[Counter[str], list[float]]:
        with self._cond:
            return Counter(self.keys), list(self.times)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
