"""TierTwoBuffer: the bounded in-memory queue between the ledger and the upstream connection.

Tier 1 is the inbound ledger: every message is durable there before it is acknowledged, and the
upstream's feed reads it in seq order (actors.ledger). Tier 2 takes from that feed
only what fits under its caps (message count and payload bytes): it grants the ledger credit for
the room it has, and grants again as packs leave. While the upstream is away tier 2 fills, the
feed stops, and the rest waits in tier 1 on disk — in order, however long the outage, without
pausing the source (HiveMQ Edge's tier 2 is unbounded; ours is not, DESIGN §3.4, §7.1).

The OutboundLedger forwards one pack at a time and keeps the next at hand: each `Demand` it tells
is one pack, and tier 2 hands it what it holds, up to `pack_size` messages, oldest first (at once,
or with the next records to come). So the packs are full while a backlog drains and a trickle
goes out at once. A pack handed over no longer counts against the caps: at most two packs more
than the caps are in memory.

QoS 0 upstream (a QoS 0 route or `persist = false`) is at most once and live only (DESIGN
§7.3): at a full cap tier 2 keeps taking such messages and `overflow` decides which go
(`drop_oldest` | `drop_new`); and what a run of the gateway did not forward before it ended is not
forwarded by the next (`restart_dropped`: held in memory, it would have been lost with it). Each
drop is counted and reported to the ledger as an upstream dead letter; the read is in the table
all the same. `persist_qos0` makes a QoS 0 route's messages wait in tier 1 like the rest, across
an outage or a restart; a `persist = false` route stays live only.
"""

from __future__ import annotations

import logging
from collections import deque

import pykka

from actors.clock import Clock
from actors.config.routes import Route, route_for
from actors.messages import Committed, Demand, Forwarded, Grant, Pack, PackSealed
from persistence.records import UPSTREAM, LedgerRecord

log = logging.getLogger(__name__)

OVERFLOW_DROPPED = "overflow_dropped"
RESTART_DROPPED = "restart_dropped"
# Tier 2 filling up is said once, then at most once per this many seconds (on the clock).
FULL_LOG_SECONDS = 60.0


class TierTwoBuffer(pykka.ThreadingActor):
    def __init__(
        self,
        outbound: pykka.ActorRef,
        ledger: pykka.ActorRef,
        routes: tuple[Route, ...],
        *,
        max_messages: int = 10_000,
        max_bytes: int = 16 * 1024 * 1024,
        low_watermark: float = 0.5,
        overflow: str = "drop_oldest",
        persist_qos0: bool = False,
        pack_size: int = 200,
        clock: Clock | None = None,
        live_from_seq: int = 0,
    ) -> None:
        super().__init__()
        self._outbound = outbound
        self._ledger = ledger
        self._routes = routes
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._low = low_watermark
        self._overflow = overflow
        self._persist_qos0 = persist_qos0
        self._may_drop = any(
            r.effective_qos == 0 and (not r.persist or not persist_qos0) for r in routes
        )
        self._pack_size = pack_size
        # Ledger seqs below this were stored by an earlier run of the gateway.
        self._live_from_seq = live_from_seq
        self._queue: deque[LedgerRecord] = deque()
        self._messages = 0
        self._bytes = 0
        # The credit window (actors.feed): what the ledger has handed us since we started, and
        # the limits we last granted.
        self._received = 0
        self._received_bytes = 0
        self._limit = 0
        self._limit_bytes = 0
        self._demand = 0
        self._next_pack_id = 1
        self._clock = clock
        self._full_logged_at: float | None = None
        self._fills = 0
        self.dropped_qos0 = 0
        self.dropped_at_restart = 0
        self.peak_messages = 0

    def on_start(self) -> None:
        self._grant()

    def on_receive(self, message: object) -> None:
        if isinstance(message, Committed):
            self._take(message.records)
        elif isinstance(message, Demand):
            self._demand += 1
        else:
            log.warning("tier-2 buffer ignored %r", message)
            return
        self._deliver()
        self._grant()

    # -- in and out -------------------------------------------------------------------------

    def _take(self, records: tuple[LedgerRecord, ...]) -> None:
        dropped: list[LedgerRecord] = []
        stale: list[LedgerRecord] = []
        for record in records:
            self._received += 1
            self._received_bytes += record.size
            if record.seq < self._live_from_seq and self._droppable(record):
                stale.append(record)
                continue
            if not self._room_for(record):
                if self._droppable(record) and self._overflow == "drop_new":
                    dropped.append(record)
                    continue
                oldest = next((r for r in self._queue if self._droppable(r)), None)
                if oldest is not None:
                    self._queue.remove(oldest)
                    self._account(oldest, -1)
                    dropped.append(oldest)
            self._queue.append(record)
            self._account(record, +1)
        self.peak_messages = max(self.peak_messages, self._messages)
        if dropped:
            self._drop(dropped)
        if stale:
            self._drop_stale(stale)

    def _deliver(self) -> None:
        while self._demand and self._queue:
            records = []
            while self._queue and len(records) < self._pack_size:
                record = self._queue.popleft()
                self._account(record, -1)
                records.append(record)
            pack_id, self._next_pack_id = self._next_pack_id, self._next_pack_id + 1
            self._demand -= 1
            self._outbound.tell(PackSealed(Pack(pack_id, tuple(records))))

    def _account(self, record: LedgerRecord, sign: int) -> None:
        self._messages += sign
        self._bytes += sign * record.size

    # -- credit -----------------------------------------------------------------------------

    def _grant(self) -> None:
        """Open the ledger's window to what fits under the caps beside what is held: limits of
        records and bytes received so far plus the room left. Records on their way count as
        received once they come; the limits only grow, a pack handed out opens them by its
        size. At a full cap, QoS 0 that may be dropped is still taken (see module)."""
        room = max(self._max_messages - self._messages, 0)
        room_bytes = max(self._max_bytes - self._bytes, 0)
        overflow = False
        if not room or not room_bytes:
            self._note_full()
            if self._may_drop:
                droppable = [r for r in self._queue if self._droppable(r)]
                room += len(droppable)
                room_bytes += sum(r.size for r in droppable)
                overflow = bool(droppable)
        closed = self._limit <= self._received or self._limit_bytes <= self._received_bytes
        if closed and not overflow and self._fill() > self._low:
            return  # once full, take again from the low watermark: fewer, larger reads
        limit, limit_bytes = self._received + room, self._received_bytes + room_bytes
        if limit > self._limit or limit_bytes > self._limit_bytes:
            self._limit = max(self._limit, limit)
            self._limit_bytes = max(self._limit_bytes, limit_bytes)
            self._ledger.tell(Grant(UPSTREAM, self._limit, self._limit_bytes))

    def _note_full(self) -> None:
        """A line when tier 2 fills, then at most one a minute: while a backlog drains it fills
        again at every pack, which is how it should work, not news."""
        self._fills += 1
        now = None if self._clock is None else self._clock.monotonic()
        if self._full_logged_at is not None and (
            now is None or now - self._full_logged_at < FULL_LOG_SECONDS
        ):
            return
        self._full_logged_at = now if now is not None else 0.0
        log.warning(
            "tier-2 buffer full (%d messages, %d bytes; %d time(s) so far): the upstream's "
            "backlog waits in tier 1 (the ledger)",
            self._messages,
            self._bytes,
            self._fills,
        )

    def _fill(self) -> float:
        return max(self._messages / self._max_messages, self._bytes / self._max_bytes)

    def _room_for(self, record: LedgerRecord) -> bool:
        # A payload larger than the byte cap still passes, alone: it would block the feed.
        return self._messages + 1 <= self._max_messages and (
            self._bytes + record.size <= self._max_bytes or not self._queue
        )

    # -- QoS 0 overflow ---------------------------------------------------------------------

    def _droppable(self, record: LedgerRecord) -> bool:
        """Forwarded at QoS 0 and live only: at most once, may be dropped."""
        route = route_for(self._routes, record.topic)
        if route is None or route.effective_qos != 0:
            return False
        return not route.persist or not self._persist_qos0

    def _drop(self, records: list[LedgerRecord]) -> None:
        self.dropped_qos0 += len(records)
        log.warning(
            "tier-2 buffer full: dropped %d QoS 0 message(s) (%s)", len(records), self._overflow
        )
        self._ledger.tell(Forwarded((), tuple((r.seq, OVERFLOW_DROPPED) for r in records)))

    def _drop_stale(self, records: list[LedgerRecord]) -> None:
        self.dropped_at_restart += len(records)
        log.warning(
            "not forwarding %d QoS 0 message(s) stored before this start: their route is live "
            "only (persist = false, or QoS 0 without [buffer] persist_qos0); they are in the "
            "table and recorded as upstream dead letters (%s)",
            len(records),
            RESTART_DROPPED,
        )
        self._ledger.tell(Forwarded((), tuple((r.seq, RESTART_DROPPED) for r in records)))

    # -- status -----------------------------------------------------------------------------

    def status(self) -> dict:
        return {
            "tier2_messages": self._messages,
            "tier2_bytes": self._bytes,
            "tier2_peak_messages": self.peak_messages,
            "credit_out": max(self._limit - self._received, 0),
            "dropped_qos0": self.dropped_qos0,
            "dropped_at_restart": self.dropped_at_restart,
            "fills": self._fills,
        }
