"""Small measurements that explain a benchmark's figure rather than being one.

`receive_maximum_overshoot`: how many unacknowledged PUBLISHes mosquitto sends a client that
drains a queued session while acking steadily. fxgate advertises Receive Maximum 200 and relies on
it to bound what is in flight (DESIGN §3.4: held acks stop the flow); the ingest runs showed the
ledger's mailbox holding tens of thousands of PUBLISHes, so this checks the broker directly with a
plain paho client: MQTT 5 §4.9 allows at most Receive Maximum unacknowledged QoS 1/2 PUBLISHes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from bench.harness import fresh_broker, prequeue

CLIENT_ID = "bench-receive-maximum"


class _CountingClient(mqtt.Client):
    """paho with manual acks that counts PUBLISHes as they come off the wire."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.received = 0
        self.acked = 0
        self.most_unacked = 0

    def _handle_publish(self):
        with self.lock:
            self.received += 1
            self.most_unacked = max(self.most_unacked, self.received - self.acked)
        return super()._handle_publish()


def receive_maximum_overshoot(
    directory: Path,
    qos: int = 1,
    messages: int = 8000,
    receive_maximum: int = 20,
    ack_interval: float = 0.05,
    hold_first: float = 0.5,
) -> dict:
    """Queue `messages`, resume the session with `receive_maximum`, hold every ack for
    `hold_first` s (the broker must stop at the maximum), then ack what has arrived every
    `ack_interval` s; report the most PUBLISHes ever unacknowledged at once."""
    with fresh_broker(directory) as broker:
        prequeue(broker, CLIENT_ID, messages, qos, 1, seed=4242)
        client = _CountingClient(
            CallbackAPIVersion.VERSION2,
            CLIENT_ID,
            protocol=MQTTProtocolVersion.MQTTv5,
            manual_ack=True,
        )
        arrived: list[tuple[int, int]] = []
        client.on_message = lambda _c, _u, m: arrived.append((m.mid, m.qos))
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        properties.ReceiveMaximum = receive_maximum
        client.connect(broker.host, broker.port, clean_start=False, properties=properties)
        client.loop_start()
        pause = threading.Event()
        try:
            pause.wait(hold_first)
            with client.lock:
                held = client.most_unacked
            deadline = time.monotonic() + 60
            while client.acked < messages and time.monotonic() < deadline:
                pause.wait(ack_interval)
                # list.pop(0) from another thread is safe under the GIL; paho appends.
                while arrived:
                    mid, q = arrived.pop(0)
                    client.ack(mid, q)
                    with client.lock:
                        client.acked += 1
        finally:
            client.disconnect()
            client.loop_stop()
    return {
        "what": "plain paho client, manual acks, drains a queued session: most PUBLISHes "
        "unacknowledged at once",
        "qos": qos,
        "queued": messages,
        "receive_maximum_sent": receive_maximum,
        "unacked_with_acks_held": held,
        "ack_interval_seconds": ack_interval,
        "unacked_max": client.most_unacked,
        "received": client.received,
    }


def fsync_latency(directory: Path, syncs: int = 50, size: int = 4096) -> dict:
    """Milliseconds per append + fdatasync of `size` bytes in `directory`: what each commit costs
    at durability=power (SQLite in WAL mode with synchronous=FULL syncs the WAL at every commit;
    with NORMAL only at checkpoints)."""
    import os
    import statistics

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fsync-probe"
    block = os.urandom(size)
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(syncs):
            began = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            times.append(1000 * (time.perf_counter() - began))
    finally:
        os.close(fd)
        path.unlink()
    times.sort()
    return {
        "what": f"{syncs} appends of {size} B, each followed by fdatasync, in the bench's "
        "scratch directory (same filesystem as the ledgers)",
        "ms_median": round(statistics.median(times), 3),
        "ms_p90": round(times[int(0.9 * (len(times) - 1))], 3),
    }
