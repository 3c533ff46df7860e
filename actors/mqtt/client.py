"""The paho-mqtt client, made to leave every inbound acknowledgement to the ledger.

paho 2.2 sends PUBREC the moment a QoS 2 PUBLISH arrives and keeps the message only in memory until
PUBREL; `manual_ack` defers PUBACK/PUBCOMP but never PUBREC (DESIGN §4). A crash in between loses
the message. So this subclass takes over inbound PUBLISH and PUBREL: it turns each packet into an
immutable message for the ledger and sends nothing. The ledger sends PUBACK / PUBREC / PUBCOMP
through `send_ack` only after the row is committed.

Acknowledgements are tagged with the connection epoch they belong to. After a reconnect the broker
may give the same packet id to a different message (always, when the session was lost), so an ack
decided for the previous connection must never go out on the new one.

Both clients (this one and actors.mqtt.upstream's) read the socket in bursts. paho reads one
packet per `loop_read`, with a `recv` for its first byte, one per byte of its length and one for
the rest, and goes back to `select` between packets. Here one `recv` of up to `READ_CHUNK` bytes
serves many packets, and `loop_read` goes on while there are packets: until the socket has
nothing more, or the burst has `BURST_PACKETS` packets or `BURST_BYTES` bytes, after which it
reads no more from the socket but ends with what the buffer still holds (nothing may wait in the
buffer while `select` waits on the socket), and the network thread goes round its loop (acks
out, keep-alive). The source hands the packets to the ledger `HAND_OVER_PACKETS` at a time and
at the end of each burst (`on_packets`): one actor message per hand-over, not per PUBLISH. With
both, the ingest benchmark's network thread went from 25.5 to 9.8 ms of CPU per 1,000 messages.
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

# One recv call asks for this much (a plain socket hands over what it has; TLS one record).
READ_CHUNK = 65536
# A burst of `loop_read` reads no more from the socket past these (module docstring).
BURST_PACKETS = 200
BURST_BYTES = 1 << 20
# The source hands over what it has read at least this often (the intake gate is asked at each),
# and at once after a payload that brings what it holds to HAND_OVER_BYTES.
HAND_OVER_PACKETS = 100
HAND_OVER_BYTES = 256 * 1024


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

    # The connection's bursts told to the ledger (counted by the network thread) and taken out
    # of its mailbox (by the ledger): a burst is stored inline only when the two are equal, so
    # that none overtakes an earlier one (actors.ledger.InlineIntake). One writer each.
    bursts_told = 0
    bursts_taken = 0

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

    def __init__(
        self,
        client_id: str,
        monotonic: Callable[[], float],
        manual_ack: bool,
        on_arrived: Callable[[list], None],
    ) -> None:
        """`on_arrived` gets what the network thread translated (`_arrive`), in order, a list
        at each hand-over (module docstring)."""
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
        # What the last recv read and has not been handed to paho yet, and from which socket
        # (a new connection's socket never gets the old one's bytes). Network thread only.
        self._buffer = b""
        self._buffer_at = 0
        self._buffer_sock: object = None
        self._burst_bytes = 0
        self._refill = True
        # Translated since the last hand-over, and their payloads' bytes. Network thread only.
        self._on_arrived = on_arrived
        self._arrived: list = []
        self._arrived_bytes = 0
        self._handed_in_burst = False  # handed over, and the burst not said to be over yet

    def reconnect(self) -> MQTTErrorCode:
        # A new epoch before paho drops its queued packets: a packet raced in after this point is
        # refused by `_on_epoch`, one queued before it is dropped with the old socket's queue.
        with self._epoch_lock:
            self.epoch += 1
        return super().reconnect()

    # -- reading in bursts (network thread; module docstring) ----------------------------------

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        packets = 0
        self._burst_bytes = 0
        rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        drained = False
        try:
            while True:
                if self._sock is None:
                    rc = MQTTErrorCode.MQTT_ERR_NO_CONN
                    break
                self._refill = packets < BURST_PACKETS and self._burst_bytes < BURST_BYTES
                result = self._packet_read()
                if result == MQTTErrorCode.MQTT_ERR_AGAIN:
                    # The buffer is empty: the rest of the socket waits for select. When the
                    # socket had nothing more either, the burst is over.
                    drained = self._refill
                    break
                if result > 0:
                    rc = self._loop_rc_handle(result)
                    break
                packets += 1
                if packets % HAND_OVER_PACKETS == 0:
                    self._hand_over()
        finally:
            self._refill = True
            self._hand_over(over=drained)
        return rc

    def _sock_recv(self, bufsize: int) -> bytes:
        """Up to `bufsize` bytes, out of the buffer; one recv of READ_CHUNK when it is empty
        (BlockingIOError when the burst is full: paho then waits for select)."""
        buffer, at = self._buffer, self._buffer_at
        if at >= len(buffer) or self._buffer_sock is not self._sock:
            if not self._refill:
                raise BlockingIOError
            buffer = super()._sock_recv(max(bufsize, READ_CHUNK))
            self._buffer_sock = self._sock
            at = 0
        end = at + bufsize
        self._buffer, self._buffer_at = buffer, end
        data = buffer[at:end]
        self._burst_bytes += len(data)
        return data

    def _arrive(self, item: object, size: int = 0) -> None:
        """One packet translated (`size`: its payload's bytes), to be handed over."""
        self._arrived.append(item)
        if size:
            self._arrived_bytes += size
            if self._arrived_bytes >= HAND_OVER_BYTES:
                self._hand_over()

    def _hand_over(self, over: bool = False) -> None:
        """Hand over what arrived: at the end of a burst, every HAND_OVER_PACKETS within it,
        and at once past HAND_OVER_BYTES. `over`: the socket has nothing more for now, so
        nothing more arrives until the broker sends again; a burst whose packets all went in
        earlier hand-overs still says so, with an empty one."""
        if self._arrived or (over and self._handed_in_burst):
            arrived, self._arrived = self._arrived, []
            self._arrived_bytes = 0
            self._handed_in_burst = not over
            self._deliver(arrived, over)

    def _deliver(self, arrived: list, over: bool) -> None:
        if arrived:
            self._on_arrived(arrived)

    # -- packets from other threads ---------------------------------------------------------

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
        on_packets: Callable[[list[InboundPublish | InboundPubrel], bool], None],
        monotonic: Callable[[], float],
    ) -> None:
        """`on_packets` gets the PUBLISHes and PUBRELs read, in the order they came, a list at
        each hand-over (module docstring), and whether the read burst is over: then the broker
        sends nothing more until it has sent again, and perhaps not before we acknowledge (its
        window is full), so the ledger commits what it holds at once."""
        super().__init__(client_id, monotonic, manual_ack=True, on_arrived=lambda _: None)
        self._on_packets = on_packets

    def _deliver(self, arrived: list, over: bool) -> None:
        self._on_packets(arrived, over)
        if self._out_packet:
            # Acks the ledger queued on this thread (it stored the burst inline: actors.ledger,
            # InlineIntake) leave now, not after another turn of paho's loop; at a window of 1
            # the broker sends nothing before them. This is the thread paho writes from; a
            # failed write puts the packet back for the loop, which then reports the error.
            self._packet_write()

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

    # The overrides below run on paho's network thread. They only translate: no ack leaves here.

    def _handle_publish(self) -> MQTTErrorCode:
        packet = decode_publish(self._in_packet["command"], self._in_packet["packet"])
        try:
            topic = packet.topic.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            topic, valid = packet.topic.decode("utf-8", errors="replace"), False
        self._arrive(
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
            ),
            len(packet.payload),
        )
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _handle_pubrel(self) -> MQTTErrorCode:
        # A PUBREL has the same shape as the acks: packet id, then an optional reason code.
        packet_id, _reason = decode_ack(self._in_packet["packet"])
        self._arrive(InboundPubrel(epoch=self.epoch, packet_id=packet_id))
        return MQTTErrorCode.MQTT_ERR_SUCCESS
