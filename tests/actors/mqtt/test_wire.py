import random

import pytest
from paho.mqtt import _packet
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.exception import MalformedPacket
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from actors.mqtt.wire import decode_ack, decode_publish, encode_publish, encode_pubrel


def random_properties(rng: random.Random) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    if rng.random() < 0.5:
        props.MessageExpiryInterval = rng.randrange(0, 2**32)
    if rng.random() < 0.3:
        props.PayloadFormatIndicator = rng.randrange(2)
    if rng.random() < 0.3:
        props.ContentType = "application/json"
    if rng.random() < 0.3:
        props.ResponseTopic = "reply/" + "x" * rng.randrange(40)
    if rng.random() < 0.3:
        props.CorrelationData = rng.randbytes(rng.randrange(20))
    if rng.random() < 0.3:
        props.UserProperty = [(f"k{i}", "v" * rng.randrange(5)) for i in range(rng.randrange(4))]
    if rng.random() < 0.3:
        props.SubscriptionIdentifier = [rng.randrange(1, 2**28)]
    if rng.random() < 0.2:
        props.TopicAlias = rng.randrange(1, 2**16)
    return props


def encode(topic: bytes, qos: int, packet_id: int, props: Properties, payload: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic
    if qos:
        body += packet_id.to_bytes(2, "big")
    return body + bytes(props.pack()) + payload


def test_decodes_every_publish_as_paho_does():
    rng = random.Random(20261121)
    for _ in range(3000):
        qos = rng.randrange(3)
        header = 0x30 | (qos << 1) | (rng.randrange(2) << 3) | rng.randrange(2)
        topic = f"zebra/fx/{rng.randrange(1000)}/reads".encode() + rng.randbytes(rng.randrange(3))
        payload = rng.randbytes(rng.randrange(400))
        packet = encode(topic, qos, rng.randrange(1, 2**16), random_properties(rng), payload)

        ours = decode_publish(header, packet)
        paho = _packet.decode_publish(header, packet, MQTTProtocolVersion.MQTTv5)
        assert (ours.dup, ours.qos, ours.retain, ours.topic, ours.packet_id, ours.payload) == (
            paho.dup,
            paho.qos,
            paho.retain,
            paho.topic,
            paho.mid,
            paho.payload,
        )
        assert ours.expiry_interval == getattr(paho.properties, "MessageExpiryInterval", None)


@pytest.mark.parametrize(
    ("header", "packet", "reason"),
    [
        (0x36, b"\x00\x01a\x00\x01\x00", "QoS 3"),
        (0x30, b"\x00", "shorter than its topic length"),
        (0x32, b"\x00\x05ab", "runs past the packet"),
        (0x30, b"\x00\x01a\x05\x02\x00", "run past the packet"),
        (0x30, b"\x00\x01a\x02\x2a\x00", "not allowed in PUBLISH"),
        (0x30, b"\x00\x01a\x02\x03\x00", "string length runs past"),
        (0x30, b"\x00\x01a\x80\x80\x80\x80\x01", "longer than 4 bytes"),
        (0x30, b"\x00\x01a\x03\x02\x00\x00\x00\x00payload", "overrun their length"),
    ],
)
def test_a_malformed_publish_is_refused_as_paho_refuses_it(header, packet, reason):
    with pytest.raises(MalformedPacket, match=reason):
        decode_publish(header, packet)


def test_an_encoded_publish_reads_back_the_same_through_paho():
    rng = random.Random(7)
    for _ in range(500):
        qos = rng.choice((1, 2))
        dup = rng.random() < 0.5
        expiry = rng.choice((None, rng.randrange(2**32)))
        topic = f"cloud/site-{rng.randrange(99)}/fx9600-{rng.randrange(99)}".encode()
        payload = rng.randbytes(rng.randrange(20_000))  # past 16 KiB: a 3-byte length
        wire = encode_publish(7, topic, payload, qos, dup, (b"fxgate-key", b"abc"), expiry)
        header, length = wire[0], 0
        for shift, byte in enumerate(wire[1:5]):
            length |= (byte & 0x7F) << (7 * shift)
            if not byte & 0x80:
                body = wire[2 + shift :]
                break
        assert len(body) == length
        paho = _packet.decode_publish(header, body, MQTTProtocolVersion.MQTTv5)
        assert (paho.qos, paho.dup, paho.topic, paho.mid, paho.payload) == (
            qos,
            dup,
            topic,
            7,
            payload,
        )
        assert paho.properties.UserProperty == [("fxgate-key", "abc")]
        assert getattr(paho.properties, "MessageExpiryInterval", None) == expiry


def test_a_pubrel_carries_the_reserved_flags_and_its_packet_id():
    assert encode_pubrel(0x1234) == b"\x62\x02\x12\x34"


@pytest.mark.parametrize(
    ("packet", "expected"),
    [
        (b"\x00\x07", (7, 0)),  # success, reason code left out (MQTT 5 §3.4.2.1)
        (b"\x00\x07\x97", (7, 0x97)),
        (b"\x01\x00\x92\x00", (256, 0x92)),  # with an empty property length
    ],
)
def test_an_ack_gives_its_packet_id_and_reason_code(packet, expected):
    assert decode_ack(packet) == expected


def test_an_ack_without_a_whole_packet_id_is_malformed():
    with pytest.raises(MalformedPacket):
        decode_ack(b"\x00")
