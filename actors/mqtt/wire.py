"""The MQTT 5 packets fxgate handles per message, coded without paho's objects.

paho builds a `Properties` object (and a `ReasonCode`) for every PUBLISH and every ack it decodes
or encodes; in the ingest benchmark that alone was about a fifth of the network thread's time
(py-spy: Properties.__init__ and Properties.clear were its two hottest frames). What fxgate needs
is small: of an inbound PUBLISH, one property (Message Expiry Interval), the others stepped over,
and a packet paho would reject as malformed rejected here too (MQTT 5 §3.3.2, §2.2.2); of an
outbound ack, its packet id and reason code; and outbound PUBLISH / PUBREL encoded so that many
can go to paho's queue as one write.
"""

from __future__ import annotations

from dataclasses import dataclass

from paho.mqtt.exception import MalformedPacket

MESSAGE_EXPIRY_INTERVAL = 0x02

# How long the value of each PUBLISH property is (MQTT 5 §2.2.2.2): a fixed width, or a kind.
_FIXED = {0x01: 1, 0x02: 4, 0x23: 2}  # payload format indicator, expiry, topic alias
_STRING = {0x03, 0x08, 0x09}  # content type, response topic, correlation data (binary)
_STRING_PAIR = 0x26  # user property
_VARINT = 0x0B  # subscription identifier


@dataclass(frozen=True, slots=True)
class Publish:
    dup: bool
    qos: int
    retain: bool
    topic: bytes
    packet_id: int
    expiry_interval: int | None
    payload: bytes


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for shift in (0, 7, 14, 21):
        if at >= len(data):
            raise MalformedPacket("variable byte integer runs past the packet")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
    raise MalformedPacket("variable byte integer longer than 4 bytes")


def _length_prefixed(data: bytes, at: int, end: int) -> int:
    if at + 2 > end:
        raise MalformedPacket("string length runs past the properties")
    return at + 2 + int.from_bytes(data[at : at + 2], "big")


def decode_publish(header: int, packet: bytes) -> Publish:
    """`header` is the fixed header's first byte, `packet` everything after the remaining length."""
    qos = (header & 0x06) >> 1
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    size = len(packet)
    if size < 2:
        raise MalformedPacket("PUBLISH shorter than its topic length")
    at = 2 + int.from_bytes(packet[0:2], "big")
    topic = packet[2:at]
    packet_id = 0
    if at + (2 if qos else 0) > size:
        raise MalformedPacket("PUBLISH topic or packet id runs past the packet")
    if qos:
        packet_id = int.from_bytes(packet[at : at + 2], "big")
        at += 2
    props_length, at = _varint(packet, at)
    end = at + props_length
    if end > size:
        raise MalformedPacket("PUBLISH properties run past the packet")
    expiry = None
    while at < end:
        identifier, at = _varint(packet, at)
        if identifier in _FIXED:
            width = _FIXED[identifier]
            if identifier == MESSAGE_EXPIRY_INTERVAL:
                expiry = int.from_bytes(packet[at : at + 4], "big")
            at += width
        elif identifier in _STRING:
            at = _length_prefixed(packet, at, end)
        elif identifier == _STRING_PAIR:
            at = _length_prefixed(packet, _length_prefixed(packet, at, end), end)
        elif identifier == _VARINT:
            _, at = _varint(packet, at)
        else:
            raise MalformedPacket(f"property 0x{identifier:02x} is not allowed in PUBLISH")
    if at != end:
        raise MalformedPacket("PUBLISH properties overrun their length")
    return Publish(
        dup=bool(header & 0x08),
        qos=qos,
        retain=bool(header & 0x01),
        topic=bytes(topic),
        packet_id=packet_id,
        expiry_interval=expiry,
        payload=bytes(packet[end:]),
    )


# -- the outbound side: what the upstream connection sends and gets back ----------------------

PUBLISH = 0x30
PUBREL = 0x62  # type 6 with the reserved flags 0010 (MQTT 5 §3.6.1)
USER_PROPERTY = 0x26


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _utf8(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def encode_publish(
    packet_id: int,
    topic: bytes,
    payload: bytes,
    qos: int,
    dup: bool,
    user_property: tuple[bytes, bytes] | None = None,
    expiry_interval: int | None = None,
) -> bytes:
    """One MQTT 5 PUBLISH, as bytes for the wire. QoS 0 carries no packet id and never DUP
    (MQTT 5 §2.2.1, §3.3.1.1: a QoS 0 PUBLISH with DUP is a protocol violation)."""
    if not qos and dup:
        raise ValueError("a QoS 0 PUBLISH must not have DUP set")
    properties = b""
    if expiry_interval is not None:
        properties += bytes((MESSAGE_EXPIRY_INTERVAL,)) + expiry_interval.to_bytes(4, "big")
    if user_property is not None:
        properties += bytes((USER_PROPERTY,)) + _utf8(user_property[0]) + _utf8(user_property[1])
    body = (
        _utf8(topic)
        + (packet_id.to_bytes(2, "big") if qos else b"")
        + _varint_bytes(len(properties))
        + properties
        + payload
    )
    header = PUBLISH | (0x08 if dup else 0) | (qos << 1)
    return bytes((header,)) + _varint_bytes(len(body)) + body


def encode_pubrel(packet_id: int) -> bytes:
    return bytes((PUBREL, 2)) + packet_id.to_bytes(2, "big")


def decode_ack(packet: bytes) -> tuple[int, int]:
    """PUBACK, PUBREC, PUBREL or PUBCOMP after the fixed header: (packet id, reason code).
    MQTT 5 lets a success stop after the packet id (§3.4.2.1); the properties are not needed."""
    if len(packet) < 2:
        raise MalformedPacket("acknowledgement shorter than its packet id")
    packet_id = int.from_bytes(packet[0:2], "big")
    return packet_id, packet[2] if len(packet) > 2 else 0
