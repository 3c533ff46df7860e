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
