"""Facts about mosquitto 2.0.11 that fxgate's defaults depend on, kept as tests so a broker
upgrade that changes them is noticed."""

import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.harness.mqtt import publish_all

pytestmark = pytest.mark.broker


def persistent_subscriber(broker, topic_filter, received):
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="facts-sub", protocol=MQTTProtocolVersion.MQTTv5
    )
    subscribed = threading.Event()
    cond = threading.Condition()

    def on_message(_c, _u, message):
        with cond:
            received.append(message.payload)
            cond.notify_all()

    client.on_subscribe = lambda *_a: subscribed.set()
    client.on_message = on_message
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    client.connect(broker.host, broker.port, clean_start=False, properties=properties)
    client.loop_start()
    return client, subscribed, cond


def queued_after_restart(broker, topic_filter) -> int:
    """Subscribe with a persistent session, leave, restart the broker gracefully, publish 10,
    come back without subscribing again: how many of the 10 were kept for us?"""
    first: list[bytes] = []
    client, subscribed, _ = persistent_subscriber(broker, topic_filter, first)
    client.subscribe(topic_filter, qos=1)
    assert subscribed.wait(10)
    client.disconnect()
    client.loop_stop()

    broker.restart()
    publish_all(broker.host, broker.port, [("facts/t", b"m%d" % i) for i in range(10)], qos=1)

    again: list[bytes] = []
    mark = broker.line_count()
    client, _, cond = persistent_subscriber(broker, topic_filter, again)
    assert broker.wait_for_output("as facts-sub", 10, start=mark)
    # Queued messages follow CONNACK at once; a marker published now arrives after them.
    publish_all(broker.host, broker.port, [("facts/t", b"marker")], qos=1)
    with cond:
        cond.wait_for(lambda: b"marker" in again, 5)
    client.disconnect()
    client.loop_stop()
    return len([m for m in again if m != b"marker"])


def test_a_plain_persistent_subscription_keeps_queueing_across_a_broker_restart(mosquitto):
    assert queued_after_restart(mosquitto, "facts/t") == 10


def test_mosquitto_forgets_a_shared_subscription_across_a_restart(mosquitto):
    # Why shared_subscription_group defaults to "": with a group, these reads would be lost.
    assert queued_after_restart(mosquitto, "$share/g/facts/t") == 0
