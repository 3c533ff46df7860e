"""The paho-mqtt client, made to leave every inbound acknowledgement to the ledger.

paho 2.2 sends PUBREC the moment a QoS 2 PUBLISH arrives and keeps the message only in memory until
PUBREL; `manual_ack` defers PUBACK/PUBCOMP but never PUBREC (DESIGN §4). A crash in between loses
the message. So this subclass takes over inbound PUBLISH and PUBREL: it turns each packet into an
immutable message for the ledger and sends nothing. The ledger sends PUBACK / PUBREC / PUBCOMP
through `send_ack` only after the row is committed.

Acknowledgements are tagged with the connection epoch they belong to. After a reconnect the broker
may give the same packet id to a different message (always, when the session was lost), so an ack
decided for the previous connection must never go out on the new one.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.client import PUBACK, PUBCOMP, PUBREC
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from actors.mqtt.wire import decode_ack, decode_publish

log = logging.getLogger(__name__)


class AckKind(enum.Enum):
    PUBACK = "PUBACK"
    PUBREC = "PUBREC"
    PUBCOMP = "PUBCOMP"


# Fixed header of each ack: packet type, then remaining length 2 (the packet id; MQTT 5 §3.4.2.1
# lets a success ack without properties leave out the reason code).
_ACK_HEADER = {
    AckKind.PUBACK: bytes((PUBACK, 2)),
    AckKind.PUBREC: bytes((PUBREC, 2)),
    AckKind.PUBCOMP: bytes((PUBCOMP, 2)),
}


@dataclass(frozen=True, slots=True)
class InboundPublish:
    """One PUBLISH as it came off the wire."""

    epoch: int
    packet_id: int
    qos: int
    dup: bool
    retain: bool
    topic: str
    topic_valid_utf8: bool
    payload: bytes
    expiry_interval: int | None
    received_monotonic: float


@dataclass(frozen=True, slots=True)
class InboundPubrel:
    epoch: int
    packet_id: int


class AckSender:
    """What the ledger needs from a connection: send one ack, if the connection is still the one
    the message arrived on."""

    def send_ack(self, epoch: int, kind: AckKind, packet_id: int) -> bool:
        raise NotImplementedError

    def send_acks(self, epoch: int, acks: Sequence[tuple[AckKind, int]]) -> bool:
        """Several acks of one connection, in order (a group commit releases hundreds)."""
        sent = True
        for kind, packet_id in acks:
            sent = self.send_ack(epoch, kind, packet_id) and sent
        return sent


class EpochClient(mqtt.Client):
    """An MQTT 5 client whose packets, sent from other threads, go out only on the connection
    they were decided for. Reconnects belong to our ConnectionActor (backoff on the injected
    clock), not to paho."""

    def __init__(self, client_id: str, monotonic: Callable[[], float], manual_ack: bool) -> None:
        super().__init__(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=MQTTProtocolVersion.MQTTv5,
            reconnect_on_failure=False,
            manual_ack=manual_ack,
        )
        self._monotonic = monotonic
        self._epoch_lock = threading.Lock()
        self.epoch = 0
        # Called when the owning actor stops, before the network thread is joined.
        self.on_stopping: Callable[[], None] = lambda: None

    def reconnect(self) -> MQTTErrorCode:
        # A new epoch before paho drops its queued packets: a packet raced in after this point is
        # refused by `_on_epoch`, one queued before it is dropped with the old socket's queue.
        with self._epoch_lock:
            self.epoch += 1
        return super().reconnect()

    def _on_epoch(self, epoch: int, what: str, send: Callable[[], object]) -> bool:
        with self._epoch_lock:
            if epoch != self.epoch or not self.is_connected():
                log.debug("dropped %s of epoch %d (now %d)", what, epoch, self.epoch)
                return False
            send()
            return True


class LedgerClient(EpochClient, AckSender):
    """MQTT 5 client whose inbound QoS 1/2 handshakes are driven by the ledger."""

    def __init__(
        self,
        client_id: str,
        on_publish_received: Callable[[InboundPublish], None],
        on_pubrel_received: Callable[[InboundPubrel], None],
        monotonic: Callable[[], float],
    ) -> None:
        super().__init__(client_id, monotonic, manual_ack=True)
        self._on_publish_received = on_publish_received
        self._on_pubrel_received = on_pubrel_received

    def send_ack(self, epoch: int, kind: AckKind, packet_id: int) -> bool:
        return self.send_acks(epoch, ((kind, packet_id),))

    def send_acks(self, epoch: int, acks: Sequence[tuple[AckKind, int]]) -> bool:
        # All of them as one queued write: paho's per-packet path costs a dict, a lock and a
        # wake-up of the network thread each, and a group commit releases up to 200 acks.
        wire = b"".join(
            _ACK_HEADER[kind] + packet_id.to_bytes(2, "big") for kind, packet_id in acks
        )
        return self._on_epoch(
            epoch, f"{len(acks)} ack(s)", lambda: self._packet_queue(PUBACK, wire, 0, 0)
        )

    # The two overrides below run on paho's network thread. They only translate: no ack leaves here.

    def _handle_publish(self) -> MQTTErrorCode:
        packet = decode_publish(self._in_packet["command"], self._in_packet["packet"])
        try:
            topic = packet.topic.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            topic, valid = packet.topic.decode("utf-8", errors="replace"), False
        self._on_publish_received(
            InboundPublish(
                epoch=self.epoch,
                packet_id=packet.packet_id,
                qos=packet.qos,
                dup=packet.dup,
                retain=packet.retain,
                topic=topic,
                topic_valid_utf8=valid,
                payload=packet.payload,
                expiry_interval=packet.expiry_interval,
                received_monotonic=self._monotonic(),
            )
        )
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _handle_pubrel(self) -> MQTTErrorCode:
        # A PUBREL has the same shape as the acks: packet id, then an optional reason code.
        packet_id, _reason = decode_ack(self._in_packet["packet"])
        self._on_pubrel_received(InboundPubrel(epoch=self.epoch, packet_id=packet_id))
        return MQTTErrorCode.MQTT_ERR_SUCCESS
