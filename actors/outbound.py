"""OutboundLedger: forwards packs upstream with TBMQ-grade state that survives restarts.

Owns the outbound database (its own SQLite file) and every outbound PUBLISH/PUBREL:
- a packet id is allocated and (seq, packet id, state) committed *before* the PUBLISH leaves, and
  the PUBREC state before the PUBREL leaves, so after a crash the same ids are re-sent with DUP
  (a new id would make the upstream broker deliver twice, DESIGN §3.2);
- never more in flight than min(the broker's Receive Maximum, `window`), also right after a
  reconnect (paho alone would re-send everything at once, DESIGN §4); a PUBLISH is never sent
  twice on one connection (a pack's retry below), since HiveMQ CE counts such a copy in flight
  until the connection ends and disconnects with 0x93 past its Receive Maximum;
- a PUBACK or PUBREC with a reason code >= 0x80 is a failure, never a success;
- packs follow TBMQ: one pack at a time, acknowledged when every message in it is; after
  `processing_timeout` RETRY_ALL tries again what is unacknowledged up to `retries` times
  (0 = unlimited): a refused message anew, a PUBLISH or PUBREL still in flight only after the
  next reconnect (same id; DUP on a PUBLISH); SKIP_ALL gives up at once; what is given up on
  becomes an upstream dead letter (DESIGN §7.2: its reads are in the table whatever happens here);
- a finished pack is reported to the inbound ledger (`Forwarded`) once its states are committed
  here, and the rows of it are deleted here only when the ledger says it has recorded the report
  (`ForwardRecorded`): a kill in between reports them again at the next start, never forwards
  them again. The table is the other sink of the ledger and never waits for this one.

Packs waiting their turn stay in the tier-2 buffer (actors/buffer.py), which hands over one pack
each time this actor tells it `Demand`. One pack more than the one being forwarded is asked for
ahead (PACKS_AHEAD): the next one is here when the current one finishes, instead of a round trip
through the buffer later; it is not started before then (one pack at a time upstream).

Every write waits in an ordered list until the next commit. If the commit meets a storage fault
(disk full, read-only: persistence.storage_faults) the transaction is rolled back, the list kept,
and forwarding stops where it is instead of the actor dying (a restart would meet the same disk,
and the restart budget would end the daemon): nothing new is sent, no PUBREL leaves, no pack is
reported to the ledger, while acks are still taken into memory. The commit is retried on a
backoff on the clock; once it succeeds, what waited is sent, PUBLISHes whose 'publish' state was
just committed included (with DUP set: harmless for a first send).
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pykka

from actors.backoff import Backoff
from actors.clock import Clock, TimerHandle
from actors.config.routes import Route, RouteCache
from actors.crashpoints import crash_point
from actors.ledger import LedgerRecord
from actors.messages import (
    Demand,
    Forwarded,
    ForwardRecorded,
    OutboundAcks,
    Pack,
    PackSealed,
    SessionEnded,
    SessionStarted,
)
from actors.mqtt.upstream import AckType, OutboundAck, OutboundPublish
from actors.storage_retry import StorageRetry
from actors.tell import tell_unless_dead
from persistence.outbound_store import OutboundStore
from persistence.storage_faults import is_storage_fault
from spark.topics import topic_problem
from spark.zebra import INVALID_TOPIC

log = logging.getLogger(__name__)

MAX_PACKET_ID = 65535
# Packs asked of the tier-2 buffer beyond the one being forwarded; waiting here, not started.
PACKS_AHEAD = 1


@dataclass(frozen=True, slots=True)
class _PackTimeout:
    generation: int


@dataclass(frozen=True, slots=True)
class _Flush:
    """Queued behind the acks already in the mailbox: one commit for all of them."""


@dataclass(frozen=True, slots=True)
class _RetryStorage:
    """The backoff after a failed commit is over: commit again, then go on."""


@dataclass
class _Entry:
    record: LedgerRecord
    message: OutboundPublish | None  # None: not forwarded (no route)
    state: str = "queued"  # queued | publish | pubrel | acked | dead | failed
    attempts: int = 0
    reason: str | None = None


_FINISHED = frozenset(("acked", "dead"))


@dataclass
class _PackState:
    pack: Pack
    entries: list[_Entry]
    attempts: int = 0
    timer: TimerHandle | None = None
    generation: int = 0
    # Entries before this index are not "queued": _send_some need not look at them again.
    cursor: int = 0
    # Source topics (one per reader) with a refused message waiting for the pack's retry:
    # their later messages wait behind it, so each reader's order holds upstream.
    blocked: set[str] = dataclasses.field(default_factory=set)
    # Entries before this index are finished ("acked" or "dead", which no entry leaves):
    # `done` looks on from there, not at the whole pack after every ack.
    finished: int = 0

    @property
    def done(self) -> bool:
        entries, index = self.entries, self.finished
        while index < len(entries) and entries[index].state in _FINISHED:
            index += 1
        self.finished = index
        return index == len(entries)


@dataclass
class _Stats:
    forwarded: int = 0
    failed_acks: int = 0
    retries: int = 0
    dead: int = 0
    resent: int = 0
    possible_duplicates: int = 0


_EXPIRED = -1


def _remaining(record: LedgerRecord, now: float) -> int | None:
    """The Message Expiry Interval a PUBLISH of `record` carries if it leaves at `now` (MQTT 5
    §3.3.2.3.3: the time left, not the time first given), None when it has none, or _EXPIRED."""
    if record.expires_at is None:
        return None
    if record.expires_at <= now:
        return _EXPIRED
    return max(1, int(record.expires_at - now))


class OutboundLedger(pykka.ThreadingActor):
    def __init__(
        self,
        path: Path,
        clock: Clock,
        ledger: pykka.ActorRef,
        routes: tuple[Route, ...],
        environment_id: str,
        *,
        durability: str = "process",
        window: int = 20,
        processing_timeout: float = 20.0,
        ack_strategy: str = "RETRY_ALL",
        retries: int = 3,
        storage_backoff: Backoff | None = None,
    ) -> None:
        super().__init__()
        self._path = Path(path)
        self._clock = clock
        self._ledger = ledger  # the inbound ledger: told what is done upstream
        self._route_of = RouteCache(routes, environment_id)
        self._durability = durability
        self._window_setting = window
        self._timeout = processing_timeout
        self._strategy = ack_strategy
        self._retries = retries
        self._buffer: pykka.ActorRef | None = None
        self._client = None
        self._epoch = 0
        # Acks of a connection newer than `_epoch`, kept until its SessionStarted (_on_ack).
        self._early_acks: list[OutboundAck] = []
        self._connected = False
        self._window = window
        # Packs handed over while one is being forwarded: PACKS_AHEAD at most.
        self._waiting: deque[Pack] = deque()
        self._current: _PackState | None = None
        self._inflight: dict[int, _Entry] = {}
        self._next_id = 1
        self._known: dict[int, tuple[str, int | None, int]] = {}  # seq -> (state, id, attempts)
        # Ids in flight before a restart stay taken until their message is resumed: reusing one
        # for a new message would make the broker take it for a duplicate and drop it.
        self._reserved: set[int] = set()
        # In flight, but not yet sent again on the current connection (window was full).
        self._unsent: set[int] = set()
        # QoS 2 ids whose PUBLISH expired in flight: the broker may hold the id awaiting a
        # PUBREL, and would take a new message under it for a duplicate (§4.3.3). Not reused
        # until the broker says the session is gone.
        self._abandoned: set[int] = set()
        # QoS 0 PUBLISHes whose 'sent' state waits for a commit that met a storage fault.
        self._qos0_held: list[OutboundPublish] = []
        # Acks are recorded in the open transaction and acted on at the next _Flush: a PUBREL
        # waits there for the commit of its 'pubrel' state.
        self._flush_pending = False
        self._pubrels_due: list[int] = []
        # Writes wait in the store until the next commit; a storage fault keeps them for the
        # retry (persistence.outbound_store), and this episode says when to try again.
        self._store: OutboundStore | None = None
        self._faults = StorageRetry(
            "outbound ledger",
            self._path,
            clock,
            lambda: tell_unless_dead(self.actor_ref, _RetryStorage()),
            storage_backoff,
        )
        self.stats = _Stats()

    # -- life cycle -------------------------------------------------------------------------

    def on_start(self) -> None:
        self._store = OutboundStore(self._path, self._durability)
        self._known = self._store.known()
        self._reserved = {
            packet_id
            for state, packet_id, _ in self._known.values()
            if state in ("publish", "pubrel")
        }
        in_flight = len(self._reserved)
        log.info(
            "outbound ledger open at %s: %d message(s) in flight from before, window %d",
            self._path,
            in_flight,
            self._window_setting,
        )
        # Finished before a restart, perhaps not yet recorded by the inbound ledger: report them
        # (again); its answer lets these rows go.
        done = tuple(seq for seq, (state, _, _) in self._known.items() if state == "acked")
        dead = tuple(self._store.dead())
        if done or dead:
            log.info(
                "outbound ledger: reporting %d finished message(s) again", len(done) + len(dead)
            )
            self._ledger.tell(Forwarded(done, dead, self.actor_ref))

    def on_stop(self) -> None:
        self._faults.cancel()
        if self._store is None:
            return
        # The acks decided so far: fewer re-sends after the next start.
        if not self._commit():
            log.error(
                "outbound ledger stopping while it cannot write (%s): the last acks are not "
                "saved; their messages are sent again after the next start",
                self._faults.error,
            )
        self._store.close()
        log.info("outbound ledger closed")

    def set_client(self, client) -> None:
        """The upstream connection's client (an actors.mqtt.upstream.UpstreamClient)."""
        self._client = client

    def set_buffer(self, buffer: pykka.ActorRef) -> None:
        """The tier-2 buffer: asked for the pack to forward and PACKS_AHEAD more; for another
        each time one is finished."""
        self._buffer = buffer
        for _ in range(1 + PACKS_AHEAD):
            buffer.tell(Demand())

    # -- messages ---------------------------------------------------------------------------

    def on_receive(self, message: object) -> None:
        if isinstance(message, PackSealed):
            self._waiting.append(message.pack)
            self._pump()
        elif isinstance(message, OutboundAcks):
            for ack in message.acks:
                self._on_ack(ack)
        elif isinstance(message, OutboundAck):
            self._on_ack(message)
        elif isinstance(message, _Flush):
            self._flush()
        elif isinstance(message, _RetryStorage):
            self._faults.retry_due()
            self._flush()
        elif isinstance(message, SessionStarted):
            self._on_session(message)
        elif isinstance(message, SessionEnded):
            if message.epoch == self._epoch:
                self._connected = False
                # An outage is not a failed attempt: the pack's clock stops until a reconnect
                # (otherwise an outage past (retries + 1) x processing_timeout dead-letters
                # the pack in flight: 180 reads after 80 s, measured by the memory benchmark).
                self._stop_timeout()
        elif isinstance(message, _PackTimeout):
            self._on_timeout(message)
        elif isinstance(message, ForwardRecorded):
            self._forget(message.seqs)
        else:
            log.warning("outbound ledger ignored %r", message)

    # -- packs ------------------------------------------------------------------------------

    def _pump(self) -> None:
        if self._faults.failing:
            return  # a finished pack goes on only once its states are committed
        if self._current is None and self._waiting:
            self._start_pack(self._waiting.popleft())
        if self._current is None:
            return
        if self._current.done:
            self._finish_pack()
            if self._current is None:
                self._pump()
            return
        self._send_some()

    def _start_pack(self, pack: Pack) -> None:
        entries = []
        for record in pack.records:
            entry = _Entry(record, self._message_for(record))
            known = self._known.get(record.seq)
            if entry.message is None:
                entry.state = "acked"  # nothing to forward: it goes on to the table
            elif known is not None:
                state, packet_id, attempts = known
                entry.attempts = attempts
                if state in ("publish", "pubrel") and entry.message.qos == 0:
                    # Recorded in flight by a version that tracked QoS 0: it went out once,
                    # and QoS 0 is never sent again (MQTT 5 §4.3.1: at most once).
                    entry.state = "acked"
                    self._reserved.discard(packet_id)
                    self._store.set_state(record.seq, "acked")
                elif state in ("publish", "pubrel"):
                    # In flight when we stopped: the same packet id, re-sent with DUP.
                    entry.state = state
                    entry.message = dataclasses.replace(
                        entry.message, packet_id=packet_id, dup=True
                    )
                    self._reserved.discard(packet_id)
                    self._inflight[packet_id] = entry
                    entry.reason = "resend"
                else:
                    entry.state = state  # acked | dead | failed
            if entry.state == "queued" and entry.message is not None:
                # A route can render an upstream topic MQTT cannot carry (a 65,000-byte reader
                # level under `x/{topic}`): encoding it would raise in this actor at every
                # restart, so the message is given up on and lands as a dead letter.
                problem = topic_problem(entry.message.topic)
                if problem is not None:
                    log.warning("message %s: upstream %s", record.message_key, problem)
                    self._give_up(entry, INVALID_TOPIC)
            entries.append(entry)
        self._current = _PackState(pack, entries)
        self._current.blocked.update(e.record.topic for e in entries if e.state == "failed")
        if self._connected:
            self._arm_timeout()
        if any(e.reason == "resend" for e in entries) and self._connected:
            self._resend_inflight()

    def _message_for(self, record: LedgerRecord) -> OutboundPublish | None:
        if record.dead_reason is not None:
            return None  # a dead letter already (a topic that was not UTF-8): not forwarded
        found = self._route_of(record.topic)
        if found is None:
            return None
        route, target = found
        return OutboundPublish(
            packet_id=0,
            topic=target,
            payload=record.payload,
            qos=route.effective_qos,
            dup=False,
            message_key=record.message_key,
        )

    def _finish_pack(self) -> None:
        # An ack's state may still wait for its flush: the report goes out only once every
        # state of the pack is committed here, or a kill could leave an exchange in flight here
        # that the ledger no longer feeds (a QoS 2 PUBREL never sent, the message never out).
        if not self._commit():
            return  # storage fault: the pack stays current; the retry's flush finishes it
        current, self._current = self._current, None
        assert current is not None
        if current.timer is not None:
            current.timer.cancel()
        done = tuple(e.record.seq for e in current.entries if e.state == "acked")
        dead = tuple(
            (e.record.seq, e.reason or "forward_failed")
            for e in current.entries
            if e.state == "dead"
        )
        forwarded = sum(1 for e in current.entries if e.state == "acked" and e.message)
        self.stats.forwarded += forwarded
        log.info(
            "pack %d acknowledged upstream: %d forwarded, %d dead-lettered",
            current.pack.pack_id,
            forwarded,
            len(dead),
        )
        self._ledger.tell(Forwarded(done, dead, self.actor_ref))
        if self._buffer is not None:
            self._buffer.tell(Demand())

    # -- sending ----------------------------------------------------------------------------

    def _send_some(self) -> None:
        """Send queued entries of the current pack while the window has room."""
        if not self._connected or self._client is None or self._current is None:
            return
        if self._faults.failing:
            return
        batch: list[_Entry] = []
        now = self._clock.wall()
        current = self._current
        entries = current.entries
        index = current.cursor
        # The first entry left queued behind a refused one of its reader: the cursor stops
        # there, so the retry finds it.
        waiting_from: int | None = None
        while index < len(entries):
            if self._unsent or len(self._inflight) >= self._window:
                break  # re-sends go first; batch entries are counted in _inflight already
            entry = entries[index]
            if entry.state != "queued":
                index += 1
                continue  # a refused ("failed") message waits for the pack's retry
            record = entry.record
            if current.blocked and record.topic in current.blocked:
                if waiting_from is None:
                    waiting_from = index
                index += 1
                continue
            expiry = _remaining(record, now)
            if expiry == _EXPIRED:
                self._give_up(entry, "expired")
                index += 1
                continue
            if entry.message.qos == 0:
                # At most once: never in flight, never sent again, never DUP (MQTT 5
                # §3.3.1.1). Recorded as sent before it leaves, so no restart sends it again.
                entry.message = entry.message.sent_as(0, False, expiry)
                entry.state = "acked"
                entry.attempts += 1
                batch.append(entry)
                index += 1
                continue
            packet_id = self._allocate_id()
            if packet_id is None:
                break
            entry.message = entry.message.sent_as(packet_id, False, expiry)
            entry.state = "publish"
            entry.attempts += 1
            self._inflight[packet_id] = entry
            batch.append(entry)
            index += 1
        current.cursor = index if waiting_from is None else waiting_from
        if not batch:
            if self._current.done:
                self._pump()
            return
        # Persist before any of these PUBLISHes can reach the wire.
        tracked = [e for e in batch if e.message.qos]
        if tracked:
            self._store.in_flight((e.record.seq, e.message.packet_id, e.attempts) for e in tracked)
        if len(tracked) < len(batch):
            self._store.sent(e.record.seq for e in batch if not e.message.qos)
        if not self._commit():
            # In flight but not on the wire: sent (after their commit) once storage is back.
            self._unsent.update(entry.message.packet_id for entry in tracked)
            self._qos0_held.extend(e.message for e in batch if not e.message.qos)
            return
        # One write for the lot, in pack order.
        self._client.send_publishes(self._epoch, [entry.message for entry in batch])
        if len(tracked) < len(batch) and self._current.done:
            self._pump()

    def _resend_inflight(self) -> None:
        """After CONNACK: everything in flight must go again (same ids), oldest first, but no
        more at once than the window — the broker's Receive Maximum may be smaller now."""
        self._unsent = {packet_id for packet_id in self._inflight}
        self._flush_unsent()

    def _flush_unsent(self) -> None:
        """Send again what is in flight but not yet sent on this connection, oldest first, while
        the window has room. A PUBLISH goes with its remaining expiry interval; one that has
        expired meanwhile is not sent again (a PUBREL always is: the broker has the message)."""
        if self._faults.failing:
            return
        room = self._window - (len(self._inflight) - len(self._unsent))
        now = self._clock.wall()
        for packet_id in sorted(self._unsent, key=lambda pid: self._inflight[pid].record.seq):
            if room <= 0:
                break
            entry = self._inflight[packet_id]
            self._unsent.discard(packet_id)
            if entry.state == "pubrel":
                self._client.send_pubrel(self._epoch, packet_id)
            else:
                expiry = _remaining(entry.record, now)
                if expiry == _EXPIRED:
                    self._abandon(packet_id, entry)
                    continue
                entry.message = dataclasses.replace(entry.message, dup=True, expiry_interval=expiry)
                self._client.send_publish(self._epoch, entry.message)
            self.stats.resent += 1
            room -= 1

    def _give_up_expired_live(self) -> None:
        """A pack's retry on the live connection sends nothing that is on the wire again: no
        PUBLISH, no PUBREL. MQTT 5 §4.4 allows a re-send only after a reconnect [MQTT-4.4.0-1],
        and HiveMQ CE counts a DUP of an id still in flight as one more PUBLISH in flight until
        the connection ends, QoS 1 and 2 alike (it answers the id once), then disconnects with
        0x93 past its Receive Maximum (measured: tests/brokers/test_hivemq_flow_control.py). The
        broker has the original, or the connection is dead and the reconnect re-sends it. A
        PUBLISH that expired meanwhile is given up on (a PUBREL never is: the broker has the
        message)."""
        if self._faults.failing:
            return
        now = self._clock.wall()
        live = [pid for pid in self._inflight if pid not in self._unsent]
        for packet_id in sorted(live, key=lambda pid: self._inflight[pid].record.seq):
            entry = self._inflight[packet_id]
            if entry.state != "pubrel" and _remaining(entry.record, now) == _EXPIRED:
                self._abandon(packet_id, entry)

    def _abandon(self, packet_id: int, entry: _Entry) -> None:
        """An in-flight PUBLISH expired before it could go again: given up on, its id held."""
        del self._inflight[packet_id]
        if entry.message.qos == 2:
            self._abandoned.add(packet_id)
        self._give_up(entry, "expired")

    def _allocate_id(self) -> int | None:
        for _ in range(MAX_PACKET_ID):
            candidate = self._next_id
            self._next_id = self._next_id % MAX_PACKET_ID + 1
            if (
                candidate not in self._inflight
                and candidate not in self._reserved
                and candidate not in self._abandoned
            ):
                return candidate
        return None

    # -- acknowledgements -------------------------------------------------------------------

    def _on_session(self, message: SessionStarted) -> None:
        # Acks of the old connection are committed before anything is re-sent; PUBRELs still
        # due go out again below with everything in flight.
        self._commit()
        self._pubrels_due.clear()
        self._unsent.clear()
        self._epoch = message.epoch
        self._connected = True
        self._window = max(1, min(self._window_setting, message.receive_maximum))
        early, self._early_acks = self._early_acks, []
        if not message.session_present:
            self._abandoned.clear()  # the broker holds no exchange of ours any more
            pubrels = [e for e in self._inflight.values() if e.state == "pubrel"]
            if pubrels:
                # The broker forgot the exchanges: a PUBREL would vanish. Publish again instead;
                # the broker may already have delivered these once.
                log.warning(
                    "upstream session not present: re-publishing %d message(s) that were "
                    "awaiting PUBCOMP (possible duplicates downstream)",
                    len(pubrels),
                )
                self.stats.possible_duplicates += len(pubrels)
                for entry in pubrels:
                    entry.state = "publish"
                self._store.publish_again(e.record.seq for e in pubrels)
                self._commit()
        for ack in early:  # this connection's, in order; those of a later one wait again
            self._on_ack(ack)
        if early:
            # A PUBREL leaves only once its state is committed (below, with the re-sends).
            self._commit()
        if self._inflight:
            self._resend_inflight()
        if self._current is not None:
            self._arm_timeout()  # a whole processing_timeout on the new connection
        self._pump()

    def _on_ack(self, ack: OutboundAck) -> None:
        if ack.epoch > self._epoch:
            # An ack of a connection whose SessionStarted has not reached us yet: acks come
            # straight from the network thread, the session through the connection actor. A
            # broker may answer at once after its CONNACK (Mochi re-sends a stored PUBREC
            # first); dropped, the exchange looked unanswered and the read went out again.
            self._early_acks.append(ack)
            return
        entry = self._inflight.get(ack.packet_id)
        if entry is None or ack.epoch != self._epoch:
            log.debug("ignored %s for packet id %d", ack.kind.value, ack.packet_id)
            return
        if ack.kind is AckType.PUBREC and ack.failed and entry.state == "pubrel":
            # The broker acknowledged this PUBLISH already and we released it: a refusing
            # PUBREC now answers our DUP re-send of it (Mochi 2.7.9 after a reconnect: its stored
            # PUBREC 0x00 first, then 0x91 "packet identifier in use" for the DUP PUBLISH, then
            # PUBCOMP). The exchange goes on to its PUBCOMP; taking the 0x91 for a refusal
            # published the message again under a new id, and delivered it twice.
            log.debug("a refusing PUBREC for released packet %d ignored", ack.packet_id)
            return
        if ack.kind is AckType.PUBREC and not ack.failed:
            # The broker has the PUBLISH; dying here re-sends it (DUP, same id) after restart.
            crash_point("after_publish_before_pubrec")
            entry.state = "pubrel"
            self._store.set_state(entry.record.seq, "pubrel")
            # The PUBREL leaves only after this state is committed (at the flush): a restart
            # must re-send the PUBREL, never the PUBLISH the broker has already released.
            self._pubrels_due.append(ack.packet_id)
            self._schedule_flush()
            return
        if ack.kind is AckType.PUBCOMP:
            # Our PUBREL reached the broker; dying here re-sends the PUBREL after restart.
            crash_point("after_pubrec_before_pubcomp")
        del self._inflight[ack.packet_id]
        self._unsent.discard(ack.packet_id)
        if ack.failed and ack.kind is not AckType.PUBCOMP:
            # 0x97 quota exceeded and friends: the broker did not take the message.
            self.stats.failed_acks += 1
            entry.state = "failed"
            log.warning(
                "upstream refused packet %d (%s): will retry per %s",
                ack.packet_id,
                ack.reason,
                self._strategy,
            )
            self._store.set_state(entry.record.seq, "failed")
            if self._current is not None:
                # Its reader's later messages wait behind it (MQTT 5 §4.6: order per topic).
                self._current.blocked.add(entry.record.topic)
        else:
            # A PUBCOMP is the end of the exchange whatever its code: 0x92 "packet id not
            # found" means the broker completed it before (our PUBREL was a repeat).
            entry.state = "acked"
            self._store.set_state(entry.record.seq, "acked")
        self._schedule_flush()

    def _commit(self) -> bool:
        """Write what waits and commit. False after a storage fault: rolled back, the writes
        kept in the store for the retry that is now scheduled."""
        assert self._store is not None
        try:
            self._store.commit()
        except sqlite3.Error as error:
            if not is_storage_fault(error):
                raise
            self._faults.failed(error, "forwarding waits (nothing leaves that is not recorded)")
            return False
        self._faults.succeeded()
        return True

    def _schedule_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            tell_unless_dead(self.actor_ref, _Flush())

    def _flush(self) -> None:
        """After the acks that were waiting in the mailbox: commit, then act on them. An ack
        not yet committed when we die is harmless: its message is re-sent with its id (QoS 2:
        as PUBREL if 'pubrel' was committed, which the broker answers even for a finished
        exchange; QoS 1: a duplicate the `fxgate-key` property lets a consumer drop)."""
        self._flush_pending = False
        if self._faults.waiting:
            return
        if not self._faults.failing:
            # What the window has room for now goes first: `_send_some` commits the acks'
            # states with its own, one commit per round trip instead of two (under a busy
            # interpreter lock each commit is a wait for it too: forwarding while draining).
            self._pump()
        if not self._commit():
            return  # the PUBRELs wait for their committed state (a retry is scheduled)
        due, self._pubrels_due = self._pubrels_due, []
        if due and self._connected and self._client is not None:
            self._client.send_pubrels(self._epoch, due)
        if self._qos0_held:
            held, self._qos0_held = self._qos0_held, []
            if self._connected and self._client is not None:
                self._client.send_publishes(self._epoch, held)
            else:
                # Recorded as sent, never to be sent again: at most once is also at most zero.
                log.warning(
                    "%d QoS 0 message(s) not forwarded: the upstream went away "
                    "while the outbound ledger could not write",
                    len(held),
                )
        if self._unsent:
            self._flush_unsent()
        self._pump()

    # -- processing timeout -----------------------------------------------------------------

    def _arm_timeout(self) -> None:
        current = self._current
        assert current is not None
        if current.timer is not None:
            current.timer.cancel()
        current.generation += 1
        generation = current.generation
        current.timer = self._clock.call_later(
            self._timeout, lambda: tell_unless_dead(self.actor_ref, _PackTimeout(generation))
        )

    def _stop_timeout(self) -> None:
        current = self._current
        if current is not None and current.timer is not None:
            current.timer.cancel()
            current.timer = None
            current.generation += 1  # a timeout already in the mailbox is void

    def _on_timeout(self, message: _PackTimeout) -> None:
        current = self._current
        if current is None or message.generation != current.generation or current.done:
            return
        if not self._connected:
            return  # re-armed at the next SessionStarted
        if self._faults.failing:
            # Nothing could be re-sent and recorded meanwhile: a storage fault is no failed try.
            self._arm_timeout()
            return
        unacked = [e for e in current.entries if e.state not in ("acked", "dead")]
        current.attempts += 1
        exhausted = self._strategy == "SKIP_ALL" or (
            self._retries and current.attempts > self._retries
        )
        log.warning(
            "pack %d: %d message(s) unacknowledged after %.0f s (attempt %d, %s)",
            current.pack.pack_id,
            len(unacked),
            self._timeout,
            current.attempts,
            "giving up" if exhausted else "retrying",
        )
        if exhausted:
            for entry in unacked:
                if entry.message is not None and entry.message.packet_id in self._inflight:
                    del self._inflight[entry.message.packet_id]
                    self._unsent.discard(entry.message.packet_id)
                self._give_up(entry, "forward_failed")
            self._pump()
            return
        self.stats.retries += 1
        current.cursor = 0
        current.blocked.clear()
        for entry in unacked:
            if entry.state == "failed":
                entry.state = "queued"
        if self._client is not None:
            # RETRY_ALL: what waits for the window on this connection goes (DUP, same ids), what
            # is on the wire not (`_give_up_expired_live`); then what failed goes again anew,
            # each reader's refused message before its later ones.
            self._flush_unsent()
            self._give_up_expired_live()
        self._arm_timeout()
        self._send_some()

    def _give_up(self, entry: _Entry, reason: str) -> None:
        entry.state = "dead"
        entry.reason = reason
        self.stats.dead += 1
        self._store.give_up(entry.record.seq, entry.attempts, reason)
        self._commit()
        log.warning("message %s not forwarded: %s", entry.record.message_key, reason)

    def _forget(self, seqs: tuple[int, ...]) -> None:
        """The inbound ledger recorded these as done upstream: their rows here can go."""
        self._store.forget(seqs)
        self._commit()
        for seq in seqs:
            self._known.pop(seq, None)

    # -- status -----------------------------------------------------------------------------

    def status(self) -> dict:
        return {
            "connected": self._connected,
            "window": self._window,
            "in_flight": len(self._inflight),
            "storage_error": self._faults.error,
            **dataclasses.asdict(self.stats),
        }
