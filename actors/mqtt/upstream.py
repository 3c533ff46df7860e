"""The paho-mqtt client of the upstream connection, with the outbound protocol taken over.

paho 2.2 keeps outbound state only in memory, re-sends everything at once after a reconnect
(ignoring Receive Maximum), has no hook when PUBREC arrives, and treats a PUBREC or PUBACK with a
reason code >= 0x80 as success (DESIGN §4). So this client keeps no outbound state at all: the
outbound ledger allocates packet ids, persists each state before the packet leaves, and sends
PUBLISH and PUBREL through `send_publish` / `send_pubrel`. Incoming PUBACK, PUBREC and PUBCOMP are
translated into `OutboundAck` messages, reason code included, for the ledger to judge.
"""

from __future__ import annotations

import enum
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.client import PUBLISH, PUBREL
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from actors.mqtt.client import EpochClient
from actors.mqtt.wire import decode_ack, encode_publish, encode_pubrel

log = logging.getLogger(__name__)

IDEMPOTENCY_PROPERTY = "fxgate-key"
IDEMPOTENCY_KEY_BYTES = IDEMPOTENCY_PROPERTY.encode("ascii")


class AckType(enum.Enum):
    PUBACK = "PUBACK"
    PUBREC = "PUBREC"
    PUBCOMP = "PUBCOMP"


_ACK_PACKET_TYPE = {
    AckType.PUBACK: PacketTypes.PUBACK,
    AckType.PUBREC: PacketTypes.PUBREC,
    AckType.PUBCOMP: PacketTypes.PUBCOMP,
}


@dataclass(frozen=True, slots=True)
class OutboundAck:
    epoch: int
    packet_id: int
    kind: AckType
    reason_code: int
    reason: str

    @property
    def failed(self) -> bool:
        return self.reason_code >= 0x80


@dataclass(frozen=True, slots=True)
class OutboundPublish:
    """One PUBLISH as the outbound ledger decided it."""

    packet_id: int
    topic: str
    payload: bytes
    qos: int
    dup: bool
    message_key: str
    expiry_interval: int | None = None

    def sent_as(self, packet_id: int, dup: bool, expiry_interval: int | None) -> OutboundPublish:
        # Spelled out: dataclasses.replace cost twice as much, once per message (py-spy).
        return OutboundPublish(
            packet_id, self.topic, self.payload, self.qos, dup, self.message_key, expiry_interval
        )


def _without_nagle(client: mqtt.Client, userdata: object, sock: object) -> None:
    """The forward leg is a window of small PUBLISHes, each freed slot refilled when its ack
    comes: with Nagle's algorithm (paho leaves it on) each small write waits for the TCP ack of
    the last one. Off here, as brokers do on their side (mosquitto's `set_tcp_nodelay`, EMQX's
    `nodelay`). The source connection keeps it: there acks go out in groups, and coalescing
    them was measured cheaper (docs/pages/operating/forwarding.md)."""
    setsockopt = getattr(sock, "setsockopt", None)  # a websocket wrapper has none
    if setsockopt is None:
        return
    try:
        setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as error:
        log.debug("TCP_NODELAY not set: %s", error)


def _reason_name(kind: AckType, code: int) -> str:
    """The reason code's MQTT 5 name. A code MQTT 5 does not define for this packet gets a
    name of its own: paho's ReasonCode raises for it (on the network thread, which then dies),
    and Mochi MQTT 2.7.9 answers every QoS 1 PUBLISH with PUBACK 0x01 (its Granted QoS 1).
    Below 0x80 it is a success all the same (MQTT 5 §2.4)."""
    try:
        return str(ReasonCode(_ACK_PACKET_TYPE[kind], identifier=code))
    except ValueError:
        return f"reason code 0x{code:02x}, not defined for {kind.name}"


class UpstreamClient(EpochClient):
    def __init__(
        self,
        client_id: str,
        on_acks: Callable[[list[OutboundAck]], None],
        monotonic: Callable[[], float],
    ) -> None:
        """`on_acks` gets the acks read, in order, a list at each hand-over (the socket is read
        in bursts: actors.mqtt.client)."""
        super().__init__(client_id, monotonic, manual_ack=False, on_arrived=on_acks)
        self.on_socket_open = _without_nagle

    def send_publish(self, epoch: int, message: OutboundPublish) -> bool:
        return self.send_publishes(epoch, (message,))

    def send_publishes(self, epoch: int, messages: Sequence[OutboundPublish]) -> bool:
        """PUBLISHes as one queued write, each with the `fxgate-key` user property that lets a
        cloud consumer drop the duplicates QoS 1 allows. paho is told nothing of them (its
        on_publish never fires): QoS 0 is done once queued, QoS 1/2 when its ack comes."""
        wire = b"".join(
            encode_publish(
                m.packet_id,
                m.topic.encode("utf-8"),
                m.payload,
                m.qos,
                m.dup,
                (IDEMPOTENCY_KEY_BYTES, m.message_key.encode("utf-8")),
                m.expiry_interval,
            )
            for m in messages
        )
        return self._on_epoch(
            epoch,
            f"{len(messages)} PUBLISH(es)",
            lambda: self._packet_queue(PUBLISH, wire, 0, 1),
        )

    def send_pubrel(self, epoch: int, packet_id: int) -> bool:
        return self.send_pubrels(epoch, (packet_id,))

    def send_pubrels(self, epoch: int, packet_ids: Sequence[int]) -> bool:
        wire = b"".join(encode_pubrel(packet_id) for packet_id in packet_ids)
        return self._on_epoch(
            epoch, f"{len(packet_ids)} PUBREL(s)", lambda: self._packet_queue(PUBREL, wire, 0, 1)
        )

    # Network thread: translate only.

    def _ack(self, kind: AckType) -> MQTTErrorCode:
        packet_id, code = decode_ack(self._in_packet["packet"])
        # The reason's name only when it says more than "Success" (paho's ReasonCode is costly).
        reason = "Success"
        if code:
            reason = _reason_name(kind, code)
        self._arrive(OutboundAck(self.epoch, packet_id, kind, code, reason))
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _handle_pubackcomp(self, cmd) -> MQTTErrorCode:
        return self._ack(AckType(cmd))

    def _handle_pubrec(self) -> MQTTErrorCode:
        return self._ack(AckType.PUBREC)
