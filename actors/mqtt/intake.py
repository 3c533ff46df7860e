"""IntakeGate: how much the source connection may hand the ledger before the ledger has taken it.

Receive Maximum is meant to bound what a broker sends before we acknowledge, and fxgate
acknowledges only after the ledger commits. But mosquitto 2.0.11 ignores the client's Receive
Maximum while it drains a queued session (measured by the benchmarks: a client advertising 20 had
up to 7,530 unacknowledged QoS 2 messages), so paho's network thread can decode PUBLISHes far
faster than the ledger commits them, and the ledger's mailbox held 33,394 messages (~175 MB) in
one run. DESIGN §3.4 wants memory bounded whatever the broker does, so the bound is ours: past
`max_messages` or `max_bytes` handed over and not yet taken, the network thread waits here, which
stops it reading the socket; TCP then pushes back on the broker, which keeps the rest queued. It
goes on once the ledger is down to half of both limits. The source hands packets over up to
100 at a time (actors.mqtt.client.HAND_OVER_PACKETS), so what waits can exceed the limits by one
hand-over.

While the network thread waits it sends nothing either (acks queue behind it, and PINGREQ), so
the limits are sized for waits of milliseconds: the ledger takes thousands of messages a second.

The same gate pauses the source for as long as the ledger is at its disk budget (`hold`): the
next packet waits, so the socket is no longer read and the broker's queue limits decide what
happens to what the readers send meanwhile (DESIGN §7.4). Such a hold can last longer than the
keep-alive: mosquitto then closes the connection (it heard no PINGREQ), keeps the session, and
the source reconnects when the gate opens again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# A held intake longer than this is worth a line at INFO: the ledger is not keeping up.
SLOW_RELEASE_SECONDS = 1.0


@dataclass(frozen=True)
class IntakeStats:
    waiting_messages: int
    waiting_bytes: int
    peak_messages: int
    peak_bytes: int
    holds: int
    held_seconds: float


def packet_size(packet: object) -> int:
    """What a handed-over packet weighs: its payload (a PUBREL has none)."""
    payload = getattr(packet, "payload", None)
    return len(payload) if payload is not None else 0


class IntakeGate:
    """A counter of handed-over messages and bytes with a high mark and a low mark.

    `admit` runs on paho's network thread, `taken` on the ledger's. `interrupt` lets the current
    waiter go (its connection is stopping; the next connection is gated again); `close` opens the
    gate for good (the ledger is gone and nothing will be taken)."""

    def __init__(
        self,
        max_messages: int,
        max_bytes: int,
        monotonic: Callable[[], float],
    ) -> None:
        if max_messages < 2 or max_bytes < 2:
            raise ValueError("intake limits must be at least 2 messages and 2 bytes")
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._low_messages = max_messages // 2
        self._low_bytes = max_bytes // 2
        self._monotonic = monotonic
        self._cond = threading.Condition()
        self._messages = 0
        self._bytes = 0
        self._closed = False
        self._held_by: set[str] = set()
        self._interrupts = 0
        self._waiting = False  # the network thread is in _hold
        self._peak_messages = 0
        self._peak_bytes = 0
        self._holds = 0
        self._held_seconds = 0.0

    def admit(self, size: int, count: int = 1) -> None:
        """Count `count` packets of `size` bytes in all handed over; first wait, if the ledger is
        too far behind."""
        with self._cond:
            if not self._closed and self._over():
                self._hold()
            self._messages += count
            self._bytes += size
            self._peak_messages = max(self._peak_messages, self._messages)
            self._peak_bytes = max(self._peak_bytes, self._bytes)

    def taken(self, size: int, count: int = 1) -> None:
        """The ledger has taken `count` packets (`size` bytes) out of its mailbox."""
        with self._cond:
            self._messages = max(0, self._messages - count)
            self._bytes = max(0, self._bytes - size)
            if self._waiting and self._below_low():
                self._cond.notify_all()

    def hold(self, reason: str) -> None:
        """Let nothing more in until `release(reason)` (and every other hold) is called."""
        with self._cond:
            self._held_by.add(reason)

    def release(self, reason: str) -> None:
        with self._cond:
            self._held_by.discard(reason)
            if self._waiting:
                self._cond.notify_all()

    @property
    def held_by(self) -> tuple[str, ...]:
        with self._cond:
            return tuple(sorted(self._held_by))

    def interrupt(self) -> None:
        with self._cond:
            self._interrupts += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stats(self) -> IntakeStats:
        with self._cond:
            return IntakeStats(
                self._messages,
                self._bytes,
                self._peak_messages,
                self._peak_bytes,
                self._holds,
                round(self._held_seconds, 3),
            )

    # -- under the lock ---------------------------------------------------------------------

    def _over(self) -> bool:
        # A single payload larger than max_bytes still gets in, alone: refusing it would stall
        # the source for good (the ledger dead-letters oversized payloads).
        return (
            bool(self._held_by)
            or self._messages >= self._max_messages
            or (self._bytes >= self._max_bytes and self._messages > 0)
        )

    def _below_low(self) -> bool:
        return (
            not self._held_by
            and self._messages <= self._low_messages
            and self._bytes <= self._low_bytes
        )

    def _hold(self) -> None:
        began = self._monotonic()
        self._holds += 1
        log.debug(
            "source intake held: %d messages (%d bytes) not yet taken by the ledger",
            self._messages,
            self._bytes,
        )
        interrupts = self._interrupts
        self._waiting = True
        try:
            while not self._closed and interrupts == self._interrupts and not self._below_low():
                self._cond.wait()
        finally:
            self._waiting = False
        held = self._monotonic() - began
        self._held_seconds += held
        if held >= SLOW_RELEASE_SECONDS:
            log.info(
                "source intake held %.1f s while the ledger caught up (%d holds so far)",
                held,
                self._holds,
            )
