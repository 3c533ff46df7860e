"""A fault-injection TCP proxy on loopback: tests put it between the daemon and a broker to cut,
refuse, stall and half-open connections for real, at the socket level.

One acceptor thread, and one pump thread per connection pair. Each pump is the only owner of its
two sockets: it alone reads, writes and closes them. Everything else (`cut`, `stall`, `close`, ...)
changes shared state under one Condition and waits on it; pumps notice within one poll interval.
"""

from __future__ import annotations

import enum
import itertools
import logging
import select
import socket
import struct
import threading
import time
from types import TracebackType

log = logging.getLogger(__name__)

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


class _Pair:
    """One client connection and the upstream connection made for it.

    `doomed` and `closing` are shared, under the proxy's Condition; everything else belongs to the
    pair's pump thread alone.
    """

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.doomed = False  # set by cut()/close(): the pump resets both sides and ends
        self.closing = False  # a side closed and the close was passed on; no longer active
        self.closing_since = 0.0
        self.outbox = {client: bytearray(), upstream: bytearray()}  # bytes to write to that side
        self.ended: set[socket.socket] = set()  # sides that sent EOF or failed
        self.thread: threading.Thread | None = None

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client


class FaultProxy:
    """Forwards TCP between clients and one target, with faults switched on and off by tests.

    Faults apply to every live pair and to pairs accepted while the fault is on.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int | None = None,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
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
        self._live: set[_Pair] = set()
        self._pumps: list[threading.Thread] = []
        self._accepted = 0
        self._bytes_up = 0
        self._bytes_down = 0

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

    def resume(self) -> None:
        """End stall() or half_open(): held bytes go out first, in the order they arrived."""
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

    # -- threads ------------------------------------------------------------------------------

    def _set_mode(self, mode: _Mode) -> None:
        with self._cond:
            self._mode = mode
            self._cond.notify_all()
        log.info("fault proxy on port %d: %s", self.port, mode.value)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        for number in itertools.count(1):
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
            self._admit(client, number)

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
                pair = _Pair(client, upstream)
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
            if self._mode is not _Mode.HALF_OPEN:
                pair.outbox[pair.peer(sock)] += data

    def _deliver(self, pair: _Pair) -> bool:
        """Write what is waiting, if forwarding; False when the pair is finished."""
        # Non-blocking sends under the lock: once stall() returns nothing more goes out, and a
        # reader that has the bytes sees them counted.
        with self._cond:
            if pair.doomed:
                return False
            if self._mode is not _Mode.FORWARD:
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
                del pending[:sent]
                if sock is pair.upstream:
                    self._bytes_up += sent
                else:
                    self._bytes_down += sent
            if not pair.closing and any(not pair.outbox[pair.peer(s)] for s in pair.ended):
                self._pass_close_on(pair)
        if not pair.closing:
            return True
        finished = len(pair.ended) == 2 and not any(pair.outbox.values())
        return not finished and time.monotonic() - pair.closing_since < _CLOSE_GRACE

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
