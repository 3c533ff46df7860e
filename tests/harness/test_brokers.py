"""The three test brokers as the fixtures start them: each grants its shipped in-flight window,
keeps a persistent session's queued messages through a graceful restart and a SIGKILL after
they were saved, and (all but Mochi) what is published while the session's client reconnects."""

from __future__ import annotations

import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from actors.devtools.mosquitto import SHIPPED_LIMITS
from actors.devtools.simulate import simulate
from persistence.keys import message_key
from tests.harness.mqtt import Collector, publish_all

READS = "zebra/fx/+/reads"

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
    kept = sorted(payload for _, payload, _ in got)
    if kind == "mochi" and end == "kill" and len(kept) < len(sent):
        # Mochi 2.7.9 writes the PUBACK before it stores the message for its subscribers
        # (tests/brokers/test_core_guarantees.py, `restart`): a SIGKILL right after the last
        # acks can lose the last of them (seen: m4 of m0..m4 in one fresh-clone run), never one
        # before a message it kept.
        published = [payload for _, payload in sent]
        assert kept == published[: len(kept)], kept
        pytest.xfail(f"Mochi lost the last {len(sent) - len(kept)} acknowledged message(s)")
    assert kept == sorted(payload for _, payload in sent)


@pytest.mark.parametrize("kind", ["mosquitto", "hivemq", "mochi"])
def test_what_each_broker_queues_while_a_persistent_subscriber_reconnects(broker_factory, kind):
    """A gateway reconnects with its session (clean start 0) while the readers keep publishing.
    mosquitto and HiveMQ deliver everything. Mochi 2.7.9 drops what is published while it
    hands the old session over to the new connection: `inheritClientSession` copies the old
    client's in-flight messages, later clears them, and what the old client got in between is
    gone (53 of 600 at 300 msg/s across one reconnect, with a bare paho subscriber too). No
    client can prevent it; the audit names such losses (docs/pages/operating/brokers.md)."""
    # Queues long enough for everything (this is about the hand-over, not the queue limits).
    broker = broker_factory(kind, **({"max_queue_size": 100_000} if kind == "hivemq" else {}))
    client_id = f"reconnecting-{kind}"
    collector = Collector(broker.host, broker.port, READS, qos=1, client_id=client_id)
    results: list = []
    # The FX9600 simulator keeps within each broker's Receive Maximum (HiveMQ's 10: paho's
    # own publisher would send 20 and be disconnected with 0x93).
    publisher = threading.Thread(
        target=lambda: results.append(
            simulate(broker.host, broker.port, readers=2, rate=1000, count=1500, qos=1)
        )
    )
    publisher.start()
    try:
        assert len(collector.wait_for(300, timeout=30)) >= 300
        collector.close()  # DISCONNECT: the session stays, the broker queues for it
        before = collector.wait_for(0)  # all it got, up to its last PUBACK
        collector = Collector(broker.host, broker.port, READS, qos=1, client_id=client_id)
        publisher.join(120)
        [result] = results
        assert not result.failed and len(result.published) == 3000
        published = {record.message_key for record in result.published}
        got = {message_key(topic, payload) for topic, payload, _ in before}

        def missing() -> set[str]:
            return published - got - {message_key(t, p) for t, p, _ in collector.messages}

        # Everything queued arrives within seconds; what has not after 10 s is not coming.
        # (Counted by key: the first connection's last messages come again, with DUP.)
        with collector.cond:
            collector.cond.wait_for(lambda: not missing(), timeout=10)
            lost = missing()
    finally:
        collector.close()
        publisher.join(120)
    if kind == "mochi" and lost:
        # A race: 8 of 9 runs here lost some, one none. The break is expected, not required.
        pytest.xfail(f"Mochi 2.7.9 lost {len(lost)} of 3000 across the reconnect (docstring)")
    assert not lost
