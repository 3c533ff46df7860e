"""The three test brokers as the fixtures start them: each grants its shipped in-flight window,
and keeps a persistent session's queued messages through a graceful restart and a SIGKILL
after they were saved."""

from __future__ import annotations

import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from actors.devtools.mosquitto import SHIPPED_LIMITS
from tests.harness.mqtt import Collector, publish_all

pytestmark = pytest.mark.broker

SHIPPED = {
    # mosquitto as it ships (the suite's default broker holds far more, on purpose).
    "mosquitto": SHIPPED_LIMITS,
    "hivemq": {},
    "mochi": {},
}


def connack_properties(host: str, port: int) -> dict:
    connected = threading.Event()
    found: dict = {}

    def on_connect(_client, _userdata, _flags, reason_code, properties):
        found.update(reason=reason_code, properties=properties.json() if properties else {})
        connected.set()

    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="window-probe", protocol=MQTTProtocolVersion.MQTTv5
    )
    client.on_connect = on_connect
    client.connect(host, port)
    client.loop_start()
    try:
        assert connected.wait(30), "no CONNACK"
    finally:
        client.disconnect()
        client.loop_stop()
    assert not found["reason"].is_failure, found
    return found["properties"]


@pytest.mark.parametrize(("kind", "window"), [("mosquitto", 20), ("hivemq", 10), ("mochi", 1024)])
def test_each_broker_grants_its_shipped_receive_maximum(broker_factory, kind, window):
    broker = broker_factory(kind, **SHIPPED[kind])
    assert connack_properties(broker.host, broker.port).get("ReceiveMaximum") == window


@pytest.mark.parametrize("kind", ["mosquitto", "hivemq", "mochi"])
@pytest.mark.parametrize("end", ["stop", "kill"])
def test_each_broker_keeps_a_persistent_sessions_queue_through_a_restart(broker_factory, kind, end):
    broker = broker_factory(kind, **SHIPPED[kind])
    client_id = f"keeper-{kind}-{end}"
    Collector(broker.host, broker.port, "t/#", qos=1, client_id=client_id).close()
    sent = [(f"t/{i}", f"m{i}".encode()) for i in range(5)]
    assert publish_all(broker.host, broker.port, sent, qos=1) == len(sent)
    if end == "kill":
        if kind == "mosquitto":
            # mosquitto saves every `autosave_interval` (1 s here) and at a graceful stop:
            # a SIGKILL before the next save loses what came since. Saved on request instead.
            broker.stop()
            broker.start()
        broker.kill()
    else:
        broker.stop()
    broker.start()
    collector = Collector(broker.host, broker.port, "t/#", qos=1, client_id=client_id)
    try:
        got = collector.wait_for(len(sent), timeout=30)
    finally:
        collector.close()
    assert sorted(payload for _, payload, _ in got) == sorted(payload for _, payload in sent)
