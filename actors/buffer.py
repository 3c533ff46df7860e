"""TierTwoBuffer: the bounded in-memory queue of packs waiting for the upstream connection.

Tier 1 is the inbound ledger: every message is durable there before it is acknowledged. Tier 2
holds packs in memory between tier 1 and the OutboundLedger, which takes one pack at a time (it
tells `Demand` when it can take the next). While upstream is down, tier 2 fills:

- it is capped by message count and bytes; a pack that does not fit keeps only its ids here and
  its rows wait in tier 1, to be read back in order when tier 2 has room (HiveMQ Edge's tier 2 is
  unbounded; ours is not, DESIGN §3.4);
- past the high watermark the source is paused (the inbound ledger holds its acks, so the source
  broker's Receive Maximum stops the flow) and it resumes at the low watermark;
- a pack forwarded at QoS 0 only, at a full cap, is dropped by the `overflow` policy (drop_oldest
  or drop_new) unless `persist_qos0`; every drop is counted and lands in dead_letters.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from dataclasses import dataclass

import pykka

from actors.pack import Pack, PackSealed
from actors.routes import Route, route_for
from persistence.inbound_ledger import Pause, Resume

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Demand:
    """From the OutboundLedger: it can take one more pack."""


class TierTwoBuffer(pykka.ThreadingActor):
    def __init__(
        self,
        outbound: pykka.ActorRef,
        writer: pykka.ActorRef,
        source: pykka.ActorRef,
        routes: tuple[Route, ...],
        *,
        max_messages: int = 10_000,
        max_bytes: int = 16 * 1024 * 1024,
        high_watermark: float = 0.8,
        low_watermark: float = 0.5,
        overflow: str = "drop_oldest",
        persist_qos0: bool = False,
    ) -> None:
        super().__init__()
        self._outbound = outbound
        self._writer = writer
        self._source = source  # the inbound ledger: Pause/Resume, and tier-1 reads
        self._routes = routes
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._high = high_watermark
        self._low = low_watermark
        self._overflow = overflow
        self._persist_qos0 = persist_qos0
        self._queue: deque[Pack] = deque()
        self._messages = 0
        self._bytes = 0
        # Packs that found tier 2 full: only (pack id, seqs) are kept here.
        self._spilled: deque[tuple[int, tuple[int, ...]]] = deque()
        self._demand = 0
        self._paused = False
        self.dropped_qos0 = 0
        self.pauses = 0

    def on_receive(self, message: object) -> None:
        if isinstance(message, PackSealed):
            self._enqueue(message.pack)
        elif isinstance(message, Demand):
            self._demand += 1
        else:
            log.warning("tier-2 buffer ignored %r", message)
            return
        self._deliver()

    # -- in and out -------------------------------------------------------------------------

    def _enqueue(self, pack: Pack) -> None:
        if not self._room_for(pack) and self._droppable(pack):
            if self._overflow == "drop_new":
                self._drop(pack)
                return
            while not self._room_for(pack):
                oldest = next((p for p in self._queue if self._droppable(p)), None)
                if oldest is None:
                    break
                self._queue.remove(oldest)
                self._account(oldest, -1)
                self._drop(oldest)
        if self._spilled or not self._room_for(pack):
            if not self._spilled:
                log.warning("tier-2 buffer full: further packs wait in tier 1 (the ledger)")
            self._spilled.append((pack.pack_id, pack.seqs))
        else:
            self._queue.append(pack)
            self._account(pack, +1)
        self._check_watermarks()

    def _deliver(self) -> None:
        while self._demand:
            self._refill()
            if not self._queue:
                return
            pack = self._queue.popleft()
            self._account(pack, -1)
            self._demand -= 1
            self._outbound.tell(PackSealed(pack))
        self._check_watermarks()

    def _refill(self) -> None:
        """Read spilled packs back from tier 1, in order, while tier 2 is at its low mark."""
        while self._spilled and self._fill() <= self._low:
            pack_id, seqs = self._spilled.popleft()
            records = self._source.proxy().records(seqs).get(timeout=30)
            pack = Pack(pack_id, tuple(r.in_pack(pack_id) for r in records))
            self._queue.append(pack)
            self._account(pack, +1)

    def _account(self, pack: Pack, sign: int) -> None:
        self._messages += sign * len(pack.records)
        self._bytes += sign * sum(len(r.payload) for r in pack.records)

    # -- caps -------------------------------------------------------------------------------

    def _room_for(self, pack: Pack) -> bool:
        return (
            self._messages + len(pack.records) <= self._max_messages
            and self._bytes + sum(len(r.payload) for r in pack.records) <= self._max_bytes
        )

    def _fill(self) -> float:
        return max(self._messages / self._max_messages, self._bytes / self._max_bytes)

    def _check_watermarks(self) -> None:
        fill = self._fill()
        if not self._paused and (fill >= self._high or self._spilled):
            self._paused = True
            self.pauses += 1
            log.warning(
                "tier-2 buffer %.0f%% full (%d messages, %d bytes): pausing the source",
                100 * fill,
                self._messages,
                self._bytes,
            )
            self._source.tell(Pause("tier2"))
        elif self._paused and fill <= self._low and not self._spilled:
            self._paused = False
            log.info("tier-2 buffer down to %.0f%%: resuming the source", 100 * fill)
            self._source.tell(Resume("tier2"))

    def _droppable(self, pack: Pack) -> bool:
        """Forwarded at QoS 0 only, and not to be persisted: at-most-once may be dropped."""
        if self._persist_qos0:
            return False
        routes = [route_for(self._routes, r.topic) for r in pack.records]
        return any(routes) and all(r is None or r.effective_qos == 0 for r in routes)

    def _drop(self, pack: Pack) -> None:
        records = tuple(
            r
            if route_for(self._routes, r.topic) is None
            else dataclasses.replace(r, dead_reason="overflow_dropped")
            for r in pack.records
        )
        dropped = sum(1 for r in records if r.dead_reason)
        self.dropped_qos0 += dropped
        log.warning("tier-2 buffer full: dropped %d QoS 0 message(s) (%s)", dropped, self._overflow)
        self._writer.tell(PackSealed(Pack(pack.pack_id, records)))

    # -- status -----------------------------------------------------------------------------

    def status(self) -> dict:
        return {
            "tier2_messages": self._messages,
            "tier2_bytes": self._bytes,
            "tier1_waiting_packs": len(self._spilled),
            "paused_source": self._paused,
            "dropped_qos0": self.dropped_qos0,
        }
