"""A fault-injection TCP proxy on loopback: tests put it between the daemon and a broker to cut,
refuse, stall and half-open connections for real, at the socket level.

One acceptor thread, and one pump thread per connection pair. Each pump is the only owner of its
two sockets: it alone reads, writes and closes them. Everything else (`cut`, `stall`, `close`, ...)
changes shared state under one Condition and waits on it; pumps notice within one poll interval.

With `record=True` the proxy also decodes the MQTT packets it passes on, both ways, and keeps one
`MqttPacket` for each (type, packet id, DUP, QoS, reason code, user properties, ...): what a test
needs to say which side of an exchange did what, without tcpdump. A packet is recorded when its
last byte has been written to the side it is for, so the record is what each side was given, in
that order; bytes dropped by `half_open()`, or held by `stall()` and then cut, are not in it.
A stream that is not MQTT (or is malformed) is recorded up to where it stops making sense.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from tests.harness.fake_broker import (
    CONNACK,
    CONNECT,
    DISCONNECT,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    USER_PROPERTY,
    MalformedPacket,
    Reader,
    split_packet,
)

log = logging.getLogger(__name__)

AUTH = 15  # the one packet type the fake broker does without

# How long a pump or the acceptor blocks before it looks at the shared state again.
_POLL_SECONDS = 0.05
_CHUNK = 65536
# Stop reading a side while this much is waiting for the other: the kernel buffers the rest, and a
# peer that never reads cannot make the proxy grow without bound.
_HIGH_WATER = 1 << 20
_STOP_TIMEOUT = 10.0
# After passing a close on, how long to wait for the other side to close too (socat's -t is 0.5 s).
_CLOSE_GRACE = 1.0
# SO_LINGER on with a zero timeout: close() sends RST and drops unsent data, as a dead link would.
_LINGER_RESET = struct.pack("ii", 1, 0)


class _Mode(enum.Enum):
    FORWARD = "forward"
    STALL = "stall"  # read and hold everything; deliver it on resume
    HALF_OPEN = "half-open"  # read and drop everything; never pass a close on


# Directions of a recorded packet: "up" towards the target (the broker), "down" towards the client
# (as bytes_up / bytes_down).
UP = "up"
DOWN = "down"

PACKET_TYPES = (
    None,
    "CONNECT",
    "CONNACK",
    "PUBLISH",
    "PUBACK",
    "PUBREC",
    "PUBREL",
    "PUBCOMP",
    "SUBSCRIBE",
    "SUBACK",
    "UNSUBSCRIBE",
    "UNSUBACK",
    "PINGREQ",
    "PINGRESP",
    "DISCONNECT",
    "AUTH",
)


@dataclass(frozen=True, slots=True)
class MqttPacket:
    """One MQTT packet the proxy passed on, as far as a protocol trace needs it."""

    at: float  # time.monotonic() when its last byte was written to the side it is for
    connection: int  # the pair's number: 1 for the first connection the proxy accepted
    direction: str  # UP (client → target) or DOWN (target → client)
    kind: str  # "PUBLISH", "PUBREC", ...
    packet_id: int | None = None
    dup: bool = False
    qos: int = 0
    retain: bool = False
    # Acks, PUBREL, CONNACK, DISCONNECT, AUTH: their reason code (0 when MQTT 5 leaves it out);
    # SUBACK / UNSUBACK: the first one.
    reason_code: int | None = None
    topic: str | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    client_id: str | None = None  # CONNECT
    clean_start: bool | None = None  # CONNECT
    session_present: bool | None = None  # CONNACK

    def user_property(self, name: str) -> str | None:
        """The first user property of that name, or None."""
        for key, value in self.user_properties:
            if key == name:
                return value
        return None

    def __str__(self) -> str:
        parts = [f"#{self.connection} {self.direction:<4} {self.kind}"]
        if self.packet_id is not None:
            parts.append(f"id={self.packet_id}")
        if self.kind == "PUBLISH":
            parts.append(f"qos={self.qos}")
            if self.dup:
                parts.append("DUP")
        if self.reason_code:
            parts.append(f"rc=0x{self.reason_code:02x}")
        if self.client_id is not None:
            parts.append(f"client={self.client_id} clean_start={int(bool(self.clean_start))}")
        if self.session_present is not None:
            parts.append(f"session_present={int(self.session_present)}")
        parts += [f"{key}={value}" for key, value in self.user_properties]
        return " ".join(parts)


class _MqttTap:
    """Decodes the two directions of one pair (the fake broker's codec), as MQTT 5 unless the
    pair's CONNECT announced an older level."""

    def __init__(self, connection: int) -> None:
        self.connection = connection
        self.version = 5
        self.buffers = {UP: bytearray(), DOWN: bytearray()}
        self.broken: set[str] = set()

    def decode(self, direction: str, data: bytes, at: float) -> list[MqttPacket]:
        if direction in self.broken:
            return []
        buffer = self.buffers[direction]
        buffer += data
        found = []
        try:
            while (packet := split_packet(buffer)) is not None:
                found.append(self._packet(direction, *packet, at))
        except MalformedPacket as error:
            self.broken.add(direction)
            log.info(
                "fault proxy: connection %d %s is not MQTT from here on (%s); not recorded",
                self.connection,
                direction,
                error,
            )
        return found

    def _packet(
        self, direction: str, packet_type: int, flags: int, body: bytes, at: float
    ) -> MqttPacket:
        if not 0 < packet_type < len(PACKET_TYPES):
            raise MalformedPacket(f"packet type {packet_type}")
        kind = PACKET_TYPES[packet_type]
        reader = Reader(body)
        v5 = self.version == 5
        fields: dict = {}
        if packet_type == CONNECT:
            reader.text()  # "MQTT"
            self.version = reader.u8()
            connect_flags = reader.u8()
            reader.u16()  # keep alive
            if self.version == 5:
                reader.properties()
            fields = {"client_id": reader.text(), "clean_start": bool(connect_flags & 0x02)}
        elif packet_type == CONNACK:
            fields = {"session_present": bool(reader.u8() & 0x01), "reason_code": reader.u8()}
        elif packet_type == PUBLISH:
            qos = (flags >> 1) & 0x03
            fields = {"dup": bool(flags & 0x08), "qos": qos, "retain": bool(flags & 0x01)}
            fields["topic"] = reader.text()
            if qos:
                fields["packet_id"] = reader.u16()
            if v5:
                fields["user_properties"] = tuple(
                    value for key, value in reader.properties() if key == USER_PROPERTY
                )
        elif packet_type in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            fields = {"packet_id": reader.u16()}
            # MQTT 5 leaves a success out (§3.4.2.1).
            fields["reason_code"] = reader.u8() if v5 and reader.remaining() else 0
        elif packet_type in (SUBSCRIBE, UNSUBSCRIBE):
            fields = {"packet_id": reader.u16()}
        elif packet_type in (SUBACK, UNSUBACK):
            fields = {"packet_id": reader.u16()}
            if v5:
                reader.properties()
            if reader.remaining():
                fields["reason_code"] = reader.u8()
        elif packet_type in (DISCONNECT, AUTH):
            fields = {"reason_code": reader.u8() if reader.remaining() else 0}
        return MqttPacket(at, self.connection, direction, kind, **fields)


class _Pair:
    """One client connection and the upstream connection made for it.

    `doomed` and `closing` are shared, under the proxy's Condition; everything else belongs to the
    pair's pump thread alone.
    """

    def __init__(
        self, client: socket.socket, upstream: socket.socket, tap: _MqttTap | None = None
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.tap = tap  # decodes what is delivered, when the proxy records
        self.doomed = False  # set by cut()/close(): the pump resets both sides and ends
        self.closing = False  # a side closed and the close was passed on; no longer active
        self.closing_since = 0.0
        self.losing = False  # lose_reply_to() chose this pair: what the target answers is dropped
        self.answered = False  # reply_instead() answered its client: nothing more passes
        self.outbox = {client: bytearray(), upstream: bytearray()}  # bytes to write to that side
        self.ended: set[socket.socket] = set()  # sides that sent EOF or failed
        self.thread: threading.Thread | None = None

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client


class FaultProxy:
    """Forwards TCP between clients and one target, with faults switched on and off by tests.

    Faults apply to every live pair and to pairs accepted while the fault is on. With `record`,
    every MQTT packet passed on is kept (`packets`, `wait_for_packet`).
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int | None = None,
        *,
        record: bool = False,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.record = record
        self.host = listen_host
        # Where clients connect; a port of 0 is replaced by the free port start() binds.
        self.port = listen_port or 0
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._cond = threading.Condition()
        # Everything below is guarded by self._cond.
        self._mode = _Mode.FORWARD
        self._refusing = False
        self._closed = False
        self._lose_reply_to: tuple[bytes, ...] | None = None
        self._replies_lost = 0
        self._reply_instead: bytes | None = None
        self._replied_instead = 0
        self._live: set[_Pair] = set()
        self._pumps: list[threading.Thread] = []
        self._accepted = 0
        self._bytes_up = 0
        self._bytes_down = 0
        self._packets: list[MqttPacket] = []

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._listener is not None or self._closed:
            raise RuntimeError("a FaultProxy starts once")
        listener = socket.create_server((self.host, self.port))
        # accept() wakes up this often to see whether close() was called.
        listener.settimeout(_POLL_SECONDS)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"fault-proxy-accept-{self.port}", daemon=True
        )
        self._acceptor.start()
        log.info(
            "fault proxy %s:%d -> %s:%d started",
            self.host,
            self.port,
            self.target_host,
            self.target_port,
        )

    def close(self) -> None:
        """Reset every pair, stop every thread and close the listener. Safe to call twice."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for pair in self._live:
                pair.doomed = True
            self._cond.notify_all()
        if self._acceptor is not None:
            self._acceptor.join(_STOP_TIMEOUT)
        # The acceptor has stopped, so no pump starts after this copy is taken.
        with self._cond:
            pumps = list(self._pumps)
        for pump in pumps:
            pump.join(_STOP_TIMEOUT)
        if self._listener is not None:
            self._listener.close()
            log.info("fault proxy on port %d closed", self.port)
        stuck = [t.name for t in [self._acceptor, *pumps] if t is not None and t.is_alive()]
        if stuck:
            raise RuntimeError(f"fault proxy threads did not stop: {stuck}")

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- faults -------------------------------------------------------------------------------

    def cut(self) -> int:
        """Reset both sides of every pair at once; returns how many of them were active.

        Returns only when all those sockets are closed. New connections are still accepted
        (unless refuse() is on).
        """
        with self._cond:
            doomed = list(self._live)
            for pair in doomed:
                pair.doomed = True
            self._cond.notify_all()
            if not self._cond.wait_for(
                lambda: not any(pair in self._live for pair in doomed), _STOP_TIMEOUT
            ):
                raise RuntimeError("fault proxy pumps did not close their sockets")
        count = sum(1 for pair in doomed if not pair.closing)
        log.info("fault proxy on port %d cut %d connection(s)", self.port, count)
        return count

    def refuse(self) -> None:
        """From now on, close each new connection as soon as it is accepted: the broker looks down.

        Pairs already live are left alone; cut() them too for a full outage.
        """
        with self._cond:
            self._refusing = True

    def accept(self) -> None:
        """Undo refuse(): new connections are forwarded again."""
        with self._cond:
            self._refusing = False

    def stall(self) -> None:
        """Keep every socket open but forward nothing either way; hold the bytes for resume()."""
        self._set_mode(_Mode.STALL)

    def half_open(self) -> None:
        """Forward nothing and close nothing, dropping what arrives: a dead NAT in the path.

        A side that closes meanwhile is not passed on until resume(); cut() resets both sides.
        """
        self._set_mode(_Mode.HALF_OPEN)

    def lose_reply_to(self, *words: bytes) -> None:
        """Lose the reply to the next request whose first line holds every one of `words`
        (e.g. b"PUT ", b"/_delta_log/"): it reaches the target, which does it, and nothing it
        answers on that connection reaches the client. Once; for HTTP/1.1, where a client sends
        a request only after the previous reply, so each request starts a read of its own."""
        with self._cond:
            self._lose_reply_to = words
            self._cond.notify_all()

    def wait_for_lost_reply(self, timeout: float) -> bool:
        """Wait until lose_reply_to() has lost a reply."""
        with self._cond:
            return self._cond.wait_for(lambda: self._replies_lost > 0, timeout)

    def reply_instead(self, reply: bytes) -> None:
        """Answer each connection's next request with `reply` and close it, forwarding nothing:
        an HTTP server that refuses every request (a `503 Server Busy` with `Connection:
        close`), until resume()."""
        with self._cond:
            self._reply_instead = reply
            self._cond.notify_all()

    def wait_for_replies_instead(self, count: int, timeout: float) -> bool:
        """Wait until reply_instead() has answered `count` requests."""
        with self._cond:
            return self._cond.wait_for(lambda: self._replied_instead >= count, timeout)

    def resume(self) -> None:
        """End stall(), half_open() or reply_instead(): held bytes go out first, in the order
        they arrived."""
        with self._cond:
            self._reply_instead = None
        self._set_mode(_Mode.FORWARD)

    def flap(self, times: int, timeout: float = 30.0) -> None:
        """cut() and wait for the client to connect again, `times` times over."""
        for round_ in range(1, times + 1):
            with self._cond:
                before = self._accepted
            self.cut()
            if not self.wait_for_connections(before + 1, timeout):
                raise TimeoutError(
                    f"no new connection within {timeout} s after cut {round_} of {times}"
                )

    # -- observation --------------------------------------------------------------------------

    def wait_for_connections(self, count: int, timeout: float) -> bool:
        """Wait until `count` connections in total have been accepted (refused ones included)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._accepted >= count, timeout)

    @property
    def active(self) -> int:
        """Pairs forwarding (or stalled) right now; a pair whose close was passed on is not one."""
        with self._cond:
            return sum(1 for pair in self._live if not pair.closing)

    @property
    def accepted(self) -> int:
        """Connections accepted since start(), including those refused or whose upstream failed.

        A forwarded connection is counted once its pair is live, so cut() right after
        wait_for_connections() always reaches it.
        """
        with self._cond:
            return self._accepted

    @property
    def bytes_up(self) -> int:
        """Bytes delivered to the target. Exact as soon as the target has read them."""
        with self._cond:
            return self._bytes_up

    @property
    def bytes_down(self) -> int:
        """Bytes delivered to clients. Exact as soon as a client has read them."""
        with self._cond:
            return self._bytes_down

    @property
    def packets(self) -> list[MqttPacket]:
        """Every MQTT packet passed on so far, all connections in the order they were written
        (record=True)."""
        with self._cond:
            return list(self._packets)

    def wait_for_packet(
        self, predicate: Callable[[MqttPacket], bool], timeout: float
    ) -> MqttPacket | None:
        """The first recorded packet that satisfies `predicate`, waiting up to `timeout` seconds
        for one; None if none came. (A predicate on `at` looks only at what came after a time.)"""
        found: list[MqttPacket] = []

        def seen() -> bool:
            found[:] = [p for p in self._packets if predicate(p)][:1]
            return bool(found)

        with self._cond:
            self._cond.wait_for(seen, timeout)
        return found[0] if found else None

    # -- threads ------------------------------------------------------------------------------

    def _set_mode(self, mode: _Mode) -> None:
        with self._cond:
            self._mode = mode
            self._cond.notify_all()
        log.info("fault proxy on port %d: %s", self.port, mode.value)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        accepted = itertools.count(1)
        while True:
            with self._cond:
                if self._closed:
                    return
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                log.exception("fault proxy on port %d stopped accepting", self.port)
                return
            self._admit(client, next(accepted))

    def _admit(self, client: socket.socket, number: int) -> None:
        with self._cond:
            refusing = self._refusing or self._closed
        upstream = None if refusing else self._connect_upstream()
        with self._cond:
            self._accepted += 1
            if upstream is None or self._closed:
                _close(client, reset=True)
                if upstream is not None:
                    _close(upstream, reset=True)
            else:
                pair = _Pair(client, upstream, _MqttTap(number) if self.record else None)
                pair.thread = threading.Thread(
                    target=self._pump,
                    args=(pair,),
                    name=f"fault-proxy-pump-{self.port}-{number}",
                    daemon=True,
                )
                self._live.add(pair)
                self._pumps = [t for t in self._pumps if t.is_alive()]
                self._pumps.append(pair.thread)
                pair.thread.start()
            self._cond.notify_all()

    def _connect_upstream(self) -> socket.socket | None:
        try:
            return socket.create_connection(
                (self.target_host, self.target_port), timeout=_STOP_TIMEOUT
            )
        except OSError as exc:
            log.info(
                "fault proxy could not reach %s:%d: %s", self.target_host, self.target_port, exc
            )
            return None

    def _pump(self, pair: _Pair) -> None:
        sockets = (pair.client, pair.upstream)
        by_fd = {sock.fileno(): sock for sock in sockets}
        poller = select.poll()
        try:
            for sock in sockets:
                sock.setblocking(False)
                # MQTT packets are small; Nagle on the proxy would add delays the real path lacks.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                with self._cond:
                    if pair.doomed:
                        return
                    forwarding = self._mode is _Mode.FORWARD
                reading = set()
                for sock in sockets:
                    mask = 0
                    if sock not in pair.ended and len(pair.outbox[pair.peer(sock)]) < _HIGH_WATER:
                        mask |= select.POLLIN
                        reading.add(sock)
                    if forwarding and pair.outbox[sock]:
                        mask |= select.POLLOUT
                    if mask:
                        poller.register(sock, mask)  # registering again replaces the mask
                    else:
                        try:
                            poller.unregister(sock)
                        except KeyError:
                            pass
                for fd, _ in poller.poll(_POLL_SECONDS * 1000):
                    if by_fd[fd] in reading:
                        self._receive(pair, by_fd[fd])
                if not self._deliver(pair):
                    return
        except OSError:
            log.exception("fault proxy pump failed")
        finally:
            with self._cond:
                _close(pair.client, reset=pair.doomed)
                _close(pair.upstream, reset=pair.doomed)
                self._live.discard(pair)
                self._cond.notify_all()

    def _receive(self, pair: _Pair, sock: socket.socket) -> None:
        try:
            data = sock.recv(_CHUNK)
        except BlockingIOError:
            return  # the poll woke us for writing only
        except OSError:
            data = b""  # a reset ends the side like an EOF does
        if not data:
            pair.ended.add(sock)
            return
        # The mode is read after the bytes arrived, so bytes sent after stall() or half_open()
        # returned always obey it.
        with self._cond:
            if pair.answered:
                return  # what the client sends after the reply it was given goes nowhere
            if self._reply_instead is not None and sock is pair.client:
                pair.outbox[pair.client] += self._reply_instead
                pair.answered = True
                pair.ended.add(pair.upstream)  # closes the client's side once it has the reply
                self._replied_instead += 1
                self._cond.notify_all()
                return
            words = self._lose_reply_to
            if words is not None and sock is pair.client:
                first_line = data.split(b"\r\n", 1)[0]
                if all(word in first_line for word in words):
                    pair.losing = True
                    self._lose_reply_to = None
                    log.info(
                        "fault proxy on port %d: losing the reply to %r", self.port, first_line
                    )
            lost = sock is pair.upstream and pair.losing
            if lost:
                self._replies_lost += 1
                self._cond.notify_all()
            if self._mode is not _Mode.HALF_OPEN and not lost:
                pair.outbox[pair.peer(sock)] += data

    def _deliver(self, pair: _Pair) -> bool:
        """Write what is waiting, if forwarding; False when the pair is finished."""
        delivered: list[tuple[str, bytes, float]] = []  # (direction, bytes, when): the record
        # Non-blocking sends under the lock: once stall() returns nothing more goes out, and a
        # reader that has the bytes sees them counted.
        with self._cond:
            if pair.doomed:
                return False
            if self._mode in (_Mode.STALL, _Mode.HALF_OPEN):
                return True
            for sock, pending in pair.outbox.items():
                if not pending:
                    continue
                try:
                    sent = sock.send(pending)
                except BlockingIOError:
                    continue
                except OSError:
                    # That side is gone; still deliver what it sent towards the other one.
                    pending.clear()
                    pair.ended.add(sock)
                    continue
                if pair.tap is not None:
                    # Timed here, under the lock every pair's sends take: the times order the
                    # packets of all connections as they were written.
                    direction = UP if sock is pair.upstream else DOWN
                    delivered.append((direction, bytes(pending[:sent]), time.monotonic()))
                del pending[:sent]
                if sock is pair.upstream:
                    self._bytes_up += sent
                else:
                    self._bytes_down += sent
            if not pair.closing and any(not pair.outbox[pair.peer(s)] for s in pair.ended):
                self._pass_close_on(pair)
        if delivered:
            self._record(pair, delivered)
        if not pair.closing:
            return True
        finished = len(pair.ended) == 2 and not any(pair.outbox.values())
        return not finished and time.monotonic() - pair.closing_since < _CLOSE_GRACE

    def _record(self, pair: _Pair, delivered: list[tuple[str, bytes, float]]) -> None:
        # Decoded outside the lock: the tap belongs to this pump alone.
        assert pair.tap is not None
        found = [p for d, data, at in delivered for p in pair.tap.decode(d, data, at)]
        if found:
            with self._cond:
                for packet in found:
                    # Two pumps may record out of the order their sends took.
                    bisect.insort(self._packets, packet, key=lambda p: p.at)
                self._cond.notify_all()

    def _pass_close_on(self, pair: _Pair) -> None:
        """A side closed and what it sent first is through: FIN the other side after its bytes.

        The sockets themselves close only once both sides have closed (or after _CLOSE_GRACE):
        closing a socket with unread input makes Linux send RST and drop its unsent output
        (RFC 2525 §2.17), which would lose the tail of a write to a slow reader.
        """
        pair.closing = True
        pair.closing_since = time.monotonic()
        for side in list(pair.ended):
            other = pair.peer(side)
            if other not in pair.ended:
                try:
                    other.shutdown(socket.SHUT_WR)
                except OSError:
                    pair.ended.add(other)
        self._cond.notify_all()


def _close(sock: socket.socket, *, reset: bool) -> None:
    if reset:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except OSError:
            pass  # already reset by the peer
    sock.close()
