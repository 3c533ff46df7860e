"""Bare paho clients for tests: publish and confirm, with every ack awaited on a condition."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion


def publish_all(
    host: str,
    port: int,
    messages: Iterable[tuple[str, bytes]],
    qos: int = 1,
    client_id: str = "test-publisher",
    timeout: float = 30.0,
) -> int:
    """Publish every (topic, payload) and wait until the broker acknowledged each one."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )
    connected = threading.Event()
    cond = threading.Condition()
    acked: set[int] = set()
    failed: list[int] = []

    def on_publish(_c, _u, mid, reason_code, _p):
        with cond:
            if reason_code.is_failure:
                failed.append(mid)
            else:
                acked.add(mid)
            cond.notify_all()

    client.on_connect = lambda *_args: connected.set()
    client.on_publish = on_publish
    client.connect(host, port)
    client.loop_start()
    try:
        if not connected.wait(timeout):
            raise TimeoutError("publisher did not connect")
        mids = [client.publish(topic, payload, qos=qos).mid for topic, payload in messages]
        if qos == 0:
            return len(mids)
        with cond:
            if not cond.wait_for(lambda: len(acked) + len(failed) >= len(mids), timeout):
                raise TimeoutError(f"{len(acked)} of {len(mids)} publishes acknowledged")
        if failed:
            raise RuntimeError(f"{len(failed)} publishes refused")
        return len(acked)
    finally:
        client.disconnect()
        client.loop_stop()


class Collector:
    """A persistent-session subscriber that records every message it gets (the cloud side)."""

    def __init__(
        self,
        host: str,
        port: int,
        topic_filter: str,
        qos: int = 2,
        client_id: str = "test-collector",
    ) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.messages: list[tuple[str, bytes, dict[str, str]]] = []
        self.qos_seen: set[int] = set()
        self.cond = threading.Condition()
        subscribed = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_a: subscribed.set()
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        self.client.connect(host, port, clean_start=False, properties=properties)
        self.client.loop_start()
        self.client.subscribe(topic_filter, qos=qos)
        if not subscribed.wait(10):
            raise TimeoutError("collector did not subscribe")

    def _on_message(self, _client, _userdata, message) -> None:
        props = dict(getattr(message.properties, "UserProperty", []) or [])
        with self.cond:
            self.qos_seen.add(message.qos)
            self.messages.append((message.topic, bytes(message.payload), props))
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float = 60.0) -> list:
        with self.cond:
            self.cond.wait_for(lambda: len(self.messages) >= count, timeout)
            return list(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
