"""Simulated FX9600 readers that keep publishing through broker restarts, for the soak.

Each reader is a paho client with a persistent session that reconnects by itself; a message counts
as published only when the broker acknowledged it (PUBACK / PUBCOMP). paho re-sends unacknowledged
messages after a reconnect, so every message is acknowledged in the end unless the broker refuses
it. `acked` is the publisher's own record that the checker compares the table with.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from actors.clock import Clock, RealClock
from actors.devtools.simulate import PublishedRecord, TagEventGenerator, reader_names
from persistence.keys import message_key

WINDOW = 20


@dataclass
class _Reader:
    name: str
    topic: str
    client: mqtt.Client
    generator: TagEventGenerator
    pending: dict[int, PublishedRecord]
    early: dict[int, bool]  # acks that came before publish() returned: packet id -> refused


class SoakPublisher:
    def __init__(
        self,
        host: str,
        port: int,
        readers: int = 4,
        qos: int = 1,
        rate: float = 200.0,
        seed: int = 0,
        clock: Clock | None = None,
    ) -> None:
        self.qos = qos
        self.rate = rate
        self._clock = clock or RealClock()
        self._cond = threading.Condition()
        self._running = threading.Event()
        self._stopping = False
        self.acked: list[PublishedRecord] = []
        self.refused: list[PublishedRecord] = []
        self.sent = 0
        self._readers = [self._reader(host, port, name, seed) for name in reader_names(readers)]
        self._thread = threading.Thread(
            target=self._publish_loop, name="soak-publisher", daemon=True
        )

    def _reader(self, host: str, port: int, name: str, seed: int) -> _Reader:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"soak-{name}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        client.max_inflight_messages_set(WINDOW)
        client.reconnect_delay_set(0.1, 1.0)
        reader = _Reader(
            name, f"zebra/fx/{name}/reads", client, TagEventGenerator(name, seed), {}, {}
        )
        client.on_publish = lambda _c, _u, mid, reason, _p: self._settle(reader, mid, reason)
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        client.connect(host, port, clean_start=False, properties=properties)
        client.loop_start()
        return reader

    def _settle(self, reader: _Reader, mid: int, reason) -> None:
        # Runs on paho's thread while it holds its outbound mutex: never call into paho here.
        with self._cond:
            record = reader.pending.pop(mid, None)
            if record is None:
                reader.early[mid] = reason.is_failure
            else:
                (self.refused if reason.is_failure else self.acked).append(record)
            self._cond.notify_all()

    def start(self) -> None:
        self._running.set()
        self._thread.start()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def _publish_loop(self) -> None:
        gap = 1.0 / self.rate
        wake = threading.Event()
        for reader in itertools.cycle(self._readers):
            self._running.wait()
            with self._cond:
                # Keep each reader's unacknowledged messages within its window.
                self._cond.wait_for(lambda r=reader: len(r.pending) < WINDOW or self._stopping)
                if self._stopping:
                    return
            payload = reader.generator.next_payload()
            record = PublishedRecord(reader.topic, message_key(reader.topic, payload), 1)
            # Not under our lock: paho takes its own, and its thread takes ours in on_publish.
            # Queued by paho even while disconnected; it goes out after the reconnect.
            info = reader.client.publish(reader.topic, payload, qos=self.qos)
            with self._cond:
                refused = reader.early.pop(info.mid, None)
                if refused is None:
                    reader.pending[info.mid] = record
                else:
                    (self.refused if refused else self.acked).append(record)
                self.sent += 1
                self._cond.notify_all()
            wake.wait(gap)

    def wait_for_acks(self, count: int, timeout: float = 60.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.acked) >= count, timeout)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Until every message handed to paho so far is settled."""
        with self._cond:
            return self._cond.wait_for(lambda: not any(r.pending for r in self._readers), timeout)

    def stop(self, timeout: float = 120.0) -> None:
        self.pause()
        idle = self.wait_idle(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._running.set()
        self._thread.join(timeout)
        for reader in self._readers:
            reader.client.disconnect()
            reader.client.loop_stop()
        if not idle:
            raise TimeoutError(f"{sum(len(r.pending) for r in self._readers)} publishes unsettled")
