"""Decoding an inbound MQTT 5 PUBLISH: only what the ledger needs, without paho's objects.

paho's own decoder builds a `Properties` object for every PUBLISH and fills in every property
field; in the ingest benchmark that alone was about a fifth of the network thread's time (py-spy:
Properties.__init__ and Properties.clear were its two hottest frames). The ledger needs one
property, the Message Expiry Interval; the others are stepped over, and a packet that paho would
reject as malformed is rejected here too (MQTT 5 §3.3.2, §2.2.2).
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
