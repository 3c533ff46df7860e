"""A scripted fake MQTT 5 broker on loopback, for the answers a real mosquitto never gives.

mosquitto never refuses a PUBLISH with a reason code, yet paho 2.2 ignores a PUBREC >= 0x80
(DESIGN §4), so the forwarder's failure handling needs a broker that refuses on demand. Tests script
the answers (PUBACK/PUBREC and SUBACK reason codes, CONNACK reason and properties, server
DISCONNECT reasons, held acks) and read back what the broker got (`received`, `pubrels`, ...).

Enough of MQTT 5 for a paho 2.2 client: CONNECT, PUBLISH at QoS 0/1/2 both ways, SUBSCRIBE,
UNSUBSCRIBE, PINGREQ, DISCONNECT. Not a broker: no retained messages, no wills, no keep-alive
enforcement, no topic aliases, no AUTH, no load balancing of shared groups (`$share/g/f` matches
like `f`, and every member gets a copy; `publish_to_clients(..., client_id=...)` plays the
dispatch by sending to one member only), and nothing queued for offline clients unless a test
queues it (`queue_for_session`). A session is kept per client id across its connections, and
discarded by a CONNECT with clean start or whose CONNACK says no session is present, or by
`expire_session`. It holds the QoS 2 packet ids awaiting PUBREL (§4.3.3), so that a PUBREL re-sent
after a reconnect to a session the CONNACK said is present completes normally; the client's
subscriptions; the PUBLISHes sent to it and not acknowledged (in flight); and what a test queued
for it. Delivery still follows each connection's own SUBSCRIBEs, and a session the CONNACK says
is present gets none of its in-flight or queued messages re-sent on its own: a test scripts that
with `packet_id` and `dup`.

It can play EMQX 5 ending the session of a shared group's member (DESIGN §4, "Shared
subscriptions when a member dies"): EMQX keeps a disconnected member's share queued for its
session, and when that session *expires* (emqx_session_mem:terminate ->
redispatch_shared_messages) gives its QoS 1 in-flight messages, oldest first, then its queued
ones to the other members of the share (emqx_shared_sub:redispatch; never a QoS 2 message in
flight, MQTT-4.8.2-5: it was maybe delivered, and only that client may complete it; never QoS 0;
never what came through a plain filter). `expire_session` does that, round robin over the other
members (EMQX 5's default `mqtt.shared_subscription_strategy`, per its documentation).

Towards clients it can also play a broker that re-sends on a *live* connection, as EMQX does every
`retry_interval` (DESIGN §4, other brokers): `publish_to_clients` takes a chosen packet id and DUP
flag (the same id again, DUP set, is EMQX's re-send of an unacknowledged PUBLISH), `auto_pubrel =
False` leaves a client's PUBREC unanswered until the test sends `pubrel_to_clients` (as often as
it likes: a PUBREL again for an id already released), `one_write` sends what is scripted inside
it in one write per client (so that a re-send reaches the client together with the original,
before it could answer), and `client_acks` reads back every PUBACK/PUBREC/PUBCOMP the clients
sent, in order.

One acceptor thread and one reader thread per connection. The reader alone closes its socket;
everything else (sends, `drop_clients`, `close`) runs under one Condition, and a reader notices a
closed broker within one poll interval.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import select
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType

log = logging.getLogger(__name__)

# How long the acceptor and each reader block before they look at the shared state again.
_POLL_SECONDS = 0.1
# A send that cannot complete in this time means the peer stopped reading: the connection drops.
_SEND_TIMEOUT = 5.0
# After our DISCONNECT or refusing CONNACK, polls to wait for the client to close before we do.
_CLOSE_GRACE_POLLS = 10
_JOIN_TIMEOUT = 5.0

# Packet types (MQTT 5 §2.1.2).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14
_ACK_NAMES = {PUBACK: "PUBACK", PUBREC: "PUBREC", PUBCOMP: "PUBCOMP"}

# Property identifiers used here (MQTT 5 §2.2.2.2).
MESSAGE_EXPIRY_INTERVAL = 0x02
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
USER_PROPERTY = 0x26

# Every property's wire type, so that unknown-to-us properties a client sends are skipped exactly.
_BYTE, _U16, _U32, _VARINT, _TEXT, _BINARY, _PAIR = range(7)
_PROPERTY_TYPES = {
    0x01: _BYTE,  # Payload Format Indicator
    0x02: _U32,  # Message Expiry Interval
    0x03: _TEXT,  # Content Type
    0x08: _TEXT,  # Response Topic
    0x09: _BINARY,  # Correlation Data
    0x0B: _VARINT,  # Subscription Identifier
    0x11: _U32,  # Session Expiry Interval
    0x12: _TEXT,  # Assigned Client Identifier
    0x13: _U16,  # Server Keep Alive
    0x15: _TEXT,  # Authentication Method
    0x16: _BINARY,  # Authentication Data
    0x17: _BYTE,  # Request Problem Information
    0x18: _U32,  # Will Delay Interval
    0x19: _BYTE,  # Request Response Information
    0x1A: _TEXT,  # Response Information
    0x1C: _TEXT,  # Server Reference
    0x1F: _TEXT,  # Reason String
    0x21: _U16,  # Receive Maximum
    0x22: _U16,  # Topic Alias Maximum
    0x23: _U16,  # Topic Alias
    0x24: _BYTE,  # Maximum QoS
    0x25: _BYTE,  # Retain Available
    0x26: _PAIR,  # User Property
    0x27: _U32,  # Maximum Packet Size
    0x28: _BYTE,  # Wildcard Subscription Available
    0x29: _BYTE,  # Subscription Identifier Available
    0x2A: _BYTE,  # Shared Subscription Available
}

Properties = list[tuple[int, object]]


class MalformedPacket(Exception):
    """The bytes are not an MQTT 5 packet this fake understands; the connection is closed."""


# ---- codec ------------------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Variable Byte Integer (§1.5.5): 7 bits a byte, low bits first, high bit = more follows."""
    if not 0 <= value <= 268_435_455:
        raise ValueError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_text(text: str) -> bytes:
    return encode_binary(text.encode())


def encode_binary(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def encode_properties(properties: Properties) -> bytes:
    body = bytearray()
    for identifier, value in properties:
        body += encode_varint(identifier)
        kind = _PROPERTY_TYPES[identifier]
        if kind == _BYTE:
            body += bytes([value])
        elif kind in (_U16, _U32):
            body += value.to_bytes(2 if kind == _U16 else 4, "big")
        elif kind == _VARINT:
            body += encode_varint(value)
        elif kind == _TEXT:
            body += encode_text(value)
        elif kind == _BINARY:
            body += encode_binary(value)
        else:
            body += encode_text(value[0]) + encode_text(value[1])
    return encode_varint(len(body)) + bytes(body)


def encode_packet(packet_type: int, flags: int, body: bytes) -> bytes:
    """Fixed header (§2.1.1) + body."""
    return bytes([packet_type << 4 | flags]) + encode_varint(len(body)) + body


def split_packet(buffer: bytearray) -> tuple[int, int, bytes] | None:
    """Take one whole packet (type, flags, body) off the front of `buffer`; None if incomplete."""
    length = 0
    for index in range(4):
        if 1 + index >= len(buffer):
            return None
        digit = buffer[1 + index]
        length |= (digit & 0x7F) << (7 * index)
        if not digit & 0x80:
            start = 2 + index
            break
    else:
        raise MalformedPacket("remaining length longer than 4 bytes")
    if len(buffer) < start + length:
        return None
    first, body = buffer[0], bytes(buffer[start : start + length])
    del buffer[: start + length]
    return first >> 4, first & 0x0F, body


class Reader:
    """Reads the fields of one packet body in order; running past the end is a MalformedPacket."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, count: int) -> bytes:
        if self.pos + count > len(self.data):
            raise MalformedPacket(f"needs {count} bytes at {self.pos} of {len(self.data)}")
        chunk = self.data[self.pos : self.pos + count]
        self.pos += count
        return chunk

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def rest(self) -> bytes:
        return self.take(self.remaining())

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def varint(self) -> int:
        value = 0
        for index in range(4):
            digit = self.u8()
            value |= (digit & 0x7F) << (7 * index)
            if not digit & 0x80:
                return value
        raise MalformedPacket("variable byte integer longer than 4 bytes")

    def binary(self) -> bytes:
        return self.take(self.u16())

    def text(self) -> str:
        try:
            return self.binary().decode()
        except UnicodeDecodeError as exc:
            raise MalformedPacket("invalid UTF-8 string") from exc

    def properties(self) -> Properties:
        readers = {
            _BYTE: self.u8,
            _U16: self.u16,
            _U32: self.u32,
            _VARINT: self.varint,
            _TEXT: self.text,
            _BINARY: self.binary,
            _PAIR: lambda: (self.text(), self.text()),
        }
        end = self.varint() + self.pos
        items: Properties = []
        while self.pos < end:
            identifier = self.varint()
            kind = _PROPERTY_TYPES.get(identifier)
            if kind is None:
                raise MalformedPacket(f"unknown property 0x{identifier:02X}")
            items.append((identifier, readers[kind]()))
        if self.pos != end:
            raise MalformedPacket("property length does not match its properties")
        return items


def first_property(properties: Properties, identifier: int) -> object | None:
    return next((value for key, value in properties if key == identifier), None)


def ack_packet(packet_type: int, packet_id: int, reason_code: int) -> bytes:
    """PUBACK/PUBREC/PUBREL/PUBCOMP; a success code is left out (§3.4.2.1: length 2 means 0x00)."""
    flags = 0b0010 if packet_type == PUBREL else 0
    body = packet_id.to_bytes(2, "big")
    if reason_code:
        body += bytes([reason_code]) + encode_properties([])
    return encode_packet(packet_type, flags, body)


def topic_matches(topic_filter: str, topic: str) -> bool:
    """'+' matches one level, a trailing '#' the rest (§4.7); `$share/{group}/` is stripped."""
    if topic_filter.startswith("$share/"):
        topic_filter = topic_filter.split("/", 2)[2]
    filter_levels, topic_levels = topic_filter.split("/"), topic.split("/")
    # §4.7.2: wildcards at the first level do not match topics starting with '$'.
    if topic.startswith("$") and filter_levels[0] in ("+", "#"):
        return False
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(topic_levels) or level not in ("+", topic_levels[index]):
            return False
    return len(filter_levels) == len(topic_levels)


# ---- the broker -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """One PUBLISH the fake got from a client (QoS 0 has packet id 0)."""

    client_id: str
    packet_id: int
    qos: int
    dup: bool
    topic: str
    payload: bytes
    user_properties: tuple[tuple[str, str], ...]
    message_expiry: int | None


@dataclass(frozen=True)
class _Message:
    """A PUBLISH given to a client's session: what a re-dispatch sends again."""

    topic: bytes  # as it went on the wire
    payload: bytes
    qos: int  # the QoS it was sent (or would have been sent) with
    share: str | None  # the `$share/{group}/{filter}` it came through; None: a plain filter


class _Session:
    """What the fake keeps for one client id across its connections (module docstring)."""

    def __init__(self) -> None:
        self.subscriptions: dict[str, int] = {}  # filter -> granted QoS, as last subscribed
        # Sent to the client and not acknowledged yet (a PUBACK, a PUBCOMP or a PUBREC >= 0x80
        # ends a flow, §4.3), by packet id, in the order they were sent.
        self.inflight: dict[int, _Message] = {}
        self.queued: list[_Message] = []  # given to it while it was away, never sent


class _Connection:
    """One client socket. The reader thread alone closes `sock`; all else is under the Condition."""

    def __init__(self, sock: socket.socket, number: int) -> None:
        self.sock = sock
        self.number = number
        self.client_id: str | None = None  # set by an accepted CONNECT
        self.ending = False  # we sent DISCONNECT or a refusing CONNACK: answer nothing more
        self.closed = False
        self.session: _Session | None = None  # set by an accepted CONNECT
        self.subscriptions: dict[str, int] = {}  # filter -> granted QoS
        # (PUBLISH or PUBREL, qos, packet id, topic) from the client, to answer in order.
        self.pending: deque[tuple[int, int, int, str]] = deque()
        self.outbound: dict[int, int] = {}  # our PUBLISH to the client not yet completed: id -> QoS
        self.packet_ids = itertools.cycle(range(1, 65536))
        self.thread: threading.Thread | None = None

    def new_packet_id(self) -> int:
        """An id no flow of this connection, nor of its session, still uses (§2.2.1)."""
        taken = self.session.inflight if self.session is not None else {}
        while (packet_id := next(self.packet_ids)) in self.outbound or packet_id in taken:
            pass
        return packet_id


class FakeBroker:
    """A scripted MQTT 5 server on loopback; see the module docstring for what it does and not."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or 0  # replaced by the bound port in start()
        # Scripting, read when the next CONNECT arrives.
        self.connack_reason = 0
        self.session_present = False
        self.receive_maximum: int | None = None
        # What a PUBREL for a packet id not awaiting PUBREL gets: 0x92 Packet Identifier not found
        # (§3.7.2.1), e.g. after a PUBREC >= 0x80 ended the flow. mosquitto answers 0x00.
        self.pubcomp_unknown_reason = 0x92
        # filter -> the SUBACK reason code >= 0x80 that refuses it (e.g. 0x87 Not authorized);
        # mosquitto 2.0.11 grants a filter its ACL denies and then delivers nothing on it.
        self.refuse_subscriptions: dict[str, int] = {}
        # What the fake got, in arrival order.
        self.received: list[Received] = []
        self.pubrels: list[tuple[str, int]] = []  # (client id, packet id)
        self.connects: list[tuple[str, bool]] = []  # (client id, clean_start)
        self.subscribes: list[tuple[str, str, int]] = []  # (client id, filter, granted QoS)
        # Clients' answers to our PUBLISH/PUBREL:
        # (client id, "PUBACK" / "PUBREC" / "PUBCOMP", packet id, reason code).
        self.client_acks: list[tuple[str, str, int, int]] = []
        # Answer a client's PUBREC (< 0x80) with PUBREL at once; False: only pubrel_to_clients.
        self.auto_pubrel = True

        self._cond = threading.Condition()
        self._reply_codes: deque[int] = deque()
        self._reply_filter: str | None = None
        self._held = False
        self._awaiting_pubrel: dict[str, set[int]] = {}  # session state: client id -> packet ids
        self._sessions: dict[str, _Session] = {}  # client id -> the rest of its session state
        self._turns: dict[str, int] = {}  # share filter -> re-dispatches so far (round robin)
        self._connections: list[_Connection] = []
        self._numbers = itertools.count(1)
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._closed = False
        # Inside one_write(): what each connection is sent, written at its end.
        self._corked: dict[_Connection, bytearray] | None = None

    # -- life cycle --

    def start(self) -> FakeBroker:
        if self._listener is not None or self._closed:
            raise RuntimeError("a FakeBroker starts once")
        self._listener = socket.create_server((self.host, self.port))
        self._listener.settimeout(_POLL_SECONDS)
        self.port = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(
            target=self._accept, name=f"fake-broker-accept-{self.port}", daemon=True
        )
        self._acceptor.start()
        log.debug("fake broker listening on %s:%s", self.host, self.port)
        return self

    def close(self) -> None:
        """Stop accepting, close every connection without DISCONNECT, and join all threads."""
        with self._cond:
            self._closed = True
            threads = [c.thread for c in self._connections if c.thread is not None]
            for conn in self._connections:
                _shutdown(conn.sock, socket.SHUT_RDWR)
        for thread in [self._acceptor, *threads]:
            if thread is not None and thread is not threading.current_thread():
                thread.join(_JOIN_TIMEOUT)

    def __enter__(self) -> FakeBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- scripting --

    def reply_publish(self, reason_codes: Iterable[int], topic_filter: str | None = None) -> None:
        """The next PUBACK/PUBREC replies (to PUBLISHes matching `topic_filter`, if given) carry
        these codes in order, then 0x00 again."""
        with self._cond:
            self._reply_codes.extend(reason_codes)
            self._reply_filter = topic_filter

    def hold_acks(self) -> None:
        """Answer no client PUBLISH or PUBREL until release_acks()."""
        with self._cond:
            self._held = True

    def release_acks(self) -> None:
        """Send every held answer, in arrival order per connection, and answer again from now on."""
        with self._cond:
            self._held = False
            for conn in list(self._connections):
                self._flush(conn)

    def disconnect_clients(self, reason_code: int = 0x8B) -> None:
        """Send DISCONNECT with `reason_code` to every connected client, then close its socket."""
        with self._cond:
            targets = [c for c in self._connections if not c.ending]
            for conn in targets:
                if conn.client_id is not None:
                    body = bytes([reason_code]) + encode_properties([])
                    self._send(conn, encode_packet(DISCONNECT, 0, body))
                self._end(conn)
            self._cond.wait_for(lambda: all(c.closed for c in targets), _JOIN_TIMEOUT)

    def drop_clients(self) -> None:
        """Close every client socket without DISCONNECT (a lost connection); return when closed."""
        with self._cond:
            targets = list(self._connections)
            for conn in targets:
                conn.ending = True
                _shutdown(conn.sock, socket.SHUT_RDWR)
            self._cond.wait_for(lambda: all(c.closed for c in targets), _JOIN_TIMEOUT)

    def publish_to_clients(
        self,
        topic: str | bytes,
        payload: bytes,
        qos: int,
        *,
        packet_id: int | None = None,
        dup: bool = False,
        client_id: str | None = None,
    ) -> list[tuple[str, int]]:
        """PUBLISH to each client with a matching subscription (or only to `client_id`, as a
        broker's dispatch gives a shared group's message to one member), at min(qos, granted
        QoS); the (client id, packet id) of each one sent. A `bytes` topic goes on the wire as it
        is (e.g. not UTF-8, which a real broker refuses). `packet_id` and `dup` are put on the
        wire as given (QoS 1/2 only, §3.3.1.1): the same id with `dup=True` is a re-send of a
        PUBLISH the client has not (or not yet visibly) acknowledged. A QoS 1/2 PUBLISH is in
        flight in the client's session until the client acknowledges it."""
        raw = topic if isinstance(topic, bytes) else topic.encode()
        topic = raw.decode(errors="replace")
        sent: list[tuple[str, int]] = []
        with self._cond:
            for conn in self._connections:
                if conn.ending or (client_id is not None and conn.client_id != client_id):
                    continue
                matching = {f: g for f, g in conn.subscriptions.items() if topic_matches(f, topic)}
                if not matching:
                    continue
                share = next((f for f in matching if f.startswith("$share/")), None)
                message = _Message(raw, payload, min(qos, max(matching.values())), share)
                chosen = self._publish(conn, message, packet_id, dup)
                sent.append((conn.client_id, chosen))
        return sent

    def queue_for_session(self, client_id: str, topic: str, payload: bytes, qos: int) -> None:
        """Give a message to the session of `client_id` while it is disconnected, as EMQX 5
        queues a shared group's message for the member its dispatch chose (module docstring):
        it is sent to nobody now; `expire_session` re-dispatches it. ValueError when the client
        is connected (a broker would send it), has no session, or has no subscription that
        matches (nothing would have given it the message)."""
        with self._cond:
            session = self._offline_session(client_id)
            matching = {f: g for f, g in session.subscriptions.items() if topic_matches(f, topic)}
            if not matching:
                raise ValueError(f"the session of {client_id!r} has no filter matching {topic!r}")
            share = next((f for f in matching if f.startswith("$share/")), None)
            session.queued.append(
                _Message(topic.encode(), payload, min(qos, max(matching.values())), share)
            )

    def in_flight(self, client_id: str) -> list[tuple[int, int, bytes]]:
        """(packet id, QoS, payload) of each PUBLISH sent to the session of `client_id` and not
        acknowledged yet, in the order sent ([] without a session)."""
        with self._cond:
            session = self._sessions.get(client_id)
            if session is None:
                return []
            return [(pid, m.qos, m.payload) for pid, m in session.inflight.items()]

    def expire_session(self, client_id: str) -> list[tuple[str, int, bytes]]:
        """End the session of the disconnected `client_id` as its Session Expiry Interval would,
        the way EMQX 5 does (module docstring): its QoS 1 messages in flight, in the order they
        were sent, then its queued messages (QoS 1 and 2), each to another connected member of
        the share it came through (a client subscribed to the same `$share/...` filter), round
        robin per share, at min(its QoS, the member's granted QoS), not DUP (it is new to that
        member). QoS 2 in flight, QoS 0, what came through a plain filter and what finds no
        other member are dropped with the session. The (client id, packet id, payload) of each
        PUBLISH sent, in order. ValueError while the client is connected or without a
        session."""
        with self._cond:
            session = self._offline_session(client_id)
            del self._sessions[client_id]
            self._awaiting_pubrel.pop(client_id, None)
            # MQTT-4.8.2-5: a QoS 2 message in flight may have been delivered; only its client
            # may complete it, so it never goes to another member.
            given = [m for m in session.inflight.values() if m.qos == 1] + session.queued
            sent: list[tuple[str, int, bytes]] = []
            for message in given:
                if message.share is None or message.qos == 0:
                    continue
                members = [
                    conn
                    for conn in self._connections
                    if not conn.ending
                    and conn.client_id not in (None, client_id)
                    and message.share in conn.subscriptions
                ]
                if not members:
                    continue
                turn = self._turns.get(message.share, 0)
                self._turns[message.share] = turn + 1
                conn = members[turn % len(members)]
                granted = conn.subscriptions[message.share]
                redispatched = _Message(
                    message.topic, message.payload, min(message.qos, granted), message.share
                )
                sent.append((conn.client_id, self._publish(conn, redispatched), message.payload))
            log.debug("fake broker: session of %s expired, %d re-dispatched", client_id, len(sent))
            self._cond.notify_all()
            return sent

    def _offline_session(self, client_id: str) -> _Session:
        if any(c.client_id == client_id for c in self._connections):
            raise ValueError(f"{client_id!r} is connected: its session does not expire")
        session = self._sessions.get(client_id)
        if session is None:
            raise ValueError(f"{client_id!r} has no session")
        return session

    def _publish(
        self, conn: _Connection, message: _Message, packet_id: int | None = None, dup: bool = False
    ) -> int:
        """Send `message` at its QoS; at QoS 1/2 it is in flight in the connection and its
        session from now on. The packet id (0 at QoS 0)."""
        chosen = 0
        body = encode_binary(message.topic)
        if message.qos:
            chosen = packet_id if packet_id is not None else conn.new_packet_id()
            body += chosen.to_bytes(2, "big")
            conn.outbound[chosen] = message.qos
            if conn.session is not None:
                conn.session.inflight[chosen] = message
        flags = message.qos << 1 | (0x08 if dup and message.qos else 0)
        self._send(conn, encode_packet(PUBLISH, flags, body + b"\0" + message.payload))
        return chosen

    def pubrel_to_clients(self, packet_id: int, client_id: str | None = None) -> list[str]:
        """Send PUBREL `packet_id` to every connected client (or only `client_id`), whatever
        the exchange's state: with `auto_pubrel = False` the release of a QoS 2 PUBLISH, and sent
        again, a re-sent PUBREL (§4.3.3: the client answers PUBCOMP each time). The client ids
        it went to."""
        sent: list[str] = []
        with self._cond:
            for conn in self._connections:
                if conn.ending or conn.client_id is None:
                    continue
                if client_id is not None and conn.client_id != client_id:
                    continue
                self._send(conn, ack_packet(PUBREL, packet_id, 0x00))
                sent.append(conn.client_id)
        return sent

    @contextlib.contextmanager
    def one_write(self) -> Iterator[None]:
        """What is sent to clients inside this block goes to each in one write at its end (one
        segment on loopback): the client reads it in one go, e.g. a PUBLISH and its re-send
        before it could answer the first. Nothing the clients send is answered meanwhile."""
        with self._cond:
            self._corked = {}
            try:
                yield
            finally:
                corked, self._corked = self._corked, None
                for conn, data in corked.items():
                    self._send(conn, bytes(data))

    def wait_for(self, predicate: Callable[[FakeBroker], bool], timeout: float) -> bool:
        """Wait until predicate(self) holds (re-checked on every change the fake records)."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout)

    @property
    def clients(self) -> tuple[str, ...]:
        """Client ids of the connections the fake accepted and still holds open."""
        with self._cond:
            return tuple(
                c.client_id for c in self._connections if c.client_id is not None and not c.closed
            )

    # -- threads --

    def _accept(self) -> None:
        assert self._listener is not None
        with self._listener:
            while not self._closed:
                try:
                    sock, _address = self._listener.accept()
                except TimeoutError:
                    continue
                sock.settimeout(_SEND_TIMEOUT)
                with self._cond:
                    if self._closed:
                        sock.close()
                        break
                    conn = _Connection(sock, next(self._numbers))
                    conn.thread = threading.Thread(
                        target=self._serve,
                        args=(conn,),
                        name=f"fake-broker-conn-{self.port}-{conn.number}",
                        daemon=True,
                    )
                    self._connections.append(conn)
                conn.thread.start()

    def _serve(self, conn: _Connection) -> None:
        buffer = bytearray()
        grace = _CLOSE_GRACE_POLLS
        try:
            while not self._closed:
                readable, _, _ = select.select([conn.sock], [], [], _POLL_SECONDS)
                if conn.ending and not readable:
                    grace -= 1
                    if grace <= 0:
                        break
                if not readable:
                    continue
                data = conn.sock.recv(65536)
                if not data:
                    break
                buffer += data
                while (packet := split_packet(buffer)) is not None:
                    with self._cond:
                        if conn.ending:
                            continue  # after our DISCONNECT nothing is answered
                        if not self._handle(conn, *packet):
                            return
        except (OSError, MalformedPacket) as exc:
            log.debug("fake broker connection %s (%s) ends: %r", conn.number, conn.client_id, exc)
        finally:
            with self._cond:
                conn.closed = True
                conn.sock.close()
                self._connections.remove(conn)
                self._cond.notify_all()

    # -- packets (all under the Condition) --

    def _handle(self, conn: _Connection, packet_type: int, flags: int, body: bytes) -> bool:
        """Answer one packet; False when the client said DISCONNECT."""
        reader = Reader(body)
        if conn.client_id is None and packet_type != CONNECT:
            raise MalformedPacket(f"packet type {packet_type} before CONNECT")
        if packet_type == CONNECT:
            self._on_connect(conn, reader)
        elif packet_type == PUBLISH:
            self._on_publish(conn, flags, reader)
        elif packet_type == PUBREL:
            packet_id = reader.u16()
            self.pubrels.append((conn.client_id, packet_id))
            conn.pending.append((PUBREL, 2, packet_id, ""))
            self._flush(conn)
        elif packet_type in (PUBACK, PUBREC, PUBCOMP):
            self._on_client_ack(conn, packet_type, reader)
        elif packet_type == SUBSCRIBE:
            self._on_subscribe(conn, reader)
        elif packet_type == UNSUBSCRIBE:
            packet_id = reader.u16()
            reader.properties()
            codes = bytearray()
            while reader.remaining():
                topic_filter = reader.text()
                conn.session.subscriptions.pop(topic_filter, None)
                # 0x11: No subscription existed (§3.11.3); a QoS 0 one did.
                existed = conn.subscriptions.pop(topic_filter, None) is not None
                codes.append(0x00 if existed else 0x11)
            body = packet_id.to_bytes(2, "big") + encode_properties([]) + bytes(codes)
            self._send(conn, encode_packet(UNSUBACK, 0, body))
        elif packet_type == PINGREQ:
            self._send(conn, encode_packet(PINGRESP, 0, b""))
        elif packet_type == DISCONNECT:
            return False
        else:
            raise MalformedPacket(f"unsupported packet type {packet_type}")
        self._cond.notify_all()
        return True

    def _on_connect(self, conn: _Connection, reader: Reader) -> None:
        if conn.client_id is not None:
            raise MalformedPacket("second CONNECT")  # §3.1.0: a protocol error
        if reader.text() != "MQTT" or reader.u8() != 5:
            # 0x84 Unsupported Protocol Version.
            self._send(conn, encode_packet(CONNACK, 0, b"\0\x84" + encode_properties([])))
            self._end(conn)
            return
        connect_flags = reader.u8()
        reader.u16()  # keep alive: not enforced
        reader.properties()
        client_id = reader.text()
        clean_start = bool(connect_flags & 0x02)
        properties: Properties = []
        if not client_id:  # §3.1.3.1: the server assigns one and says which
            client_id = f"fake-broker-client-{conn.number}"
            properties.append((ASSIGNED_CLIENT_IDENTIFIER, client_id))
        self.connects.append((client_id, clean_start))
        reason = self.connack_reason
        session_present = self.session_present and reason == 0  # §3.2.2.1.1
        if self.receive_maximum is not None:
            properties.append((RECEIVE_MAXIMUM, self.receive_maximum))
        body = bytes([int(session_present), reason]) + encode_properties(properties)
        self._send(conn, encode_packet(CONNACK, 0, body))
        if reason >= 0x80:  # §3.2.2.2: the server closes after a refusing CONNACK
            self._end(conn)
            return
        conn.client_id = client_id
        if clean_start or not session_present:
            self._awaiting_pubrel.pop(client_id, None)
            self._sessions.pop(client_id, None)
        conn.session = self._sessions.setdefault(client_id, _Session())
        log.debug("fake broker: %s connected (clean_start=%s)", client_id, clean_start)

    def _on_publish(self, conn: _Connection, flags: int, reader: Reader) -> None:
        qos = (flags >> 1) & 0x03
        if qos == 3:
            raise MalformedPacket("PUBLISH with QoS 3")
        topic = reader.text()
        packet_id = reader.u16() if qos else 0
        properties = reader.properties()
        self.received.append(
            Received(
                client_id=conn.client_id,
                packet_id=packet_id,
                qos=qos,
                dup=bool(flags & 0x08),
                topic=topic,
                payload=reader.rest(),
                user_properties=tuple(v for k, v in properties if k == USER_PROPERTY),
                message_expiry=first_property(properties, MESSAGE_EXPIRY_INTERVAL),
            )
        )
        if qos:
            conn.pending.append((PUBLISH, qos, packet_id, topic))
            self._flush(conn)

    def _flush(self, conn: _Connection) -> None:
        """Answer the connection's waiting PUBLISH/PUBREL in order, unless acks are held."""
        while conn.pending and not self._held and not conn.ending:
            packet_type, qos, packet_id, topic = conn.pending.popleft()
            awaiting = self._awaiting_pubrel.setdefault(conn.client_id, set())
            if packet_type == PUBLISH:
                scripted = self._reply_filter is None or topic_matches(self._reply_filter, topic)
                reason = self._reply_codes.popleft() if self._reply_codes and scripted else 0x00
                if qos == 2 and reason < 0x80:
                    awaiting.add(packet_id)
                self._send(conn, ack_packet(PUBACK if qos == 1 else PUBREC, packet_id, reason))
            else:
                reason = 0x00 if packet_id in awaiting else self.pubcomp_unknown_reason
                awaiting.discard(packet_id)
                self._send(conn, ack_packet(PUBCOMP, packet_id, reason))

    def _on_client_ack(self, conn: _Connection, packet_type: int, reader: Reader) -> None:
        packet_id = reader.u16()
        reason = reader.u8() if reader.remaining() else 0x00
        self.client_acks.append((conn.client_id, _ACK_NAMES[packet_type], packet_id, reason))
        if packet_type == PUBREC and reason < 0x80 and packet_id in conn.outbound:
            if self.auto_pubrel:
                self._send(conn, ack_packet(PUBREL, packet_id, 0x00))
        else:  # PUBACK, PUBCOMP, or a PUBREC >= 0x80 (§4.3.3): the flow is over
            conn.outbound.pop(packet_id, None)
            if conn.session is not None:
                conn.session.inflight.pop(packet_id, None)

    def _on_subscribe(self, conn: _Connection, reader: Reader) -> None:
        packet_id = reader.u16()
        reader.properties()
        granted = bytearray()
        while reader.remaining():
            topic_filter, options = reader.text(), reader.u8()
            qos = options & 0x03
            refusal = self.refuse_subscriptions.get(topic_filter)
            if refusal is not None:
                conn.subscriptions.pop(topic_filter, None)
                conn.session.subscriptions.pop(topic_filter, None)
                granted.append(refusal)
                continue
            conn.subscriptions[topic_filter] = qos
            conn.session.subscriptions[topic_filter] = qos
            self.subscribes.append((conn.client_id, topic_filter, qos))
            granted.append(qos)
        if not granted:
            raise MalformedPacket("SUBSCRIBE without a topic filter")  # §3.8.3
        body = packet_id.to_bytes(2, "big") + encode_properties([]) + bytes(granted)
        self._send(conn, encode_packet(SUBACK, 0, body))

    def _send(self, conn: _Connection, packet: bytes) -> None:
        if conn.closed or conn.ending:
            return
        if self._corked is not None:
            self._corked.setdefault(conn, bytearray()).extend(packet)
            return
        try:
            conn.sock.sendall(packet)
        except OSError as exc:
            # A partial send would corrupt the stream: the connection is lost from here on.
            log.debug("fake broker send to %s failed: %r", conn.client_id, exc)
            conn.ending = True
            _shutdown(conn.sock, socket.SHUT_RDWR)

    def _end(self, conn: _Connection) -> None:
        """After our last packet: FIN, then the reader waits briefly for the client to close."""
        conn.ending = True
        _shutdown(conn.sock, socket.SHUT_WR)


def _shutdown(sock: socket.socket, how: int) -> None:
    # The socket may already be closed by its reader or reset by the peer.
    with contextlib.suppress(OSError):
        sock.shutdown(how)
