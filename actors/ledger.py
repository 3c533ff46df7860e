"""InboundLedger: the actor that owns the ledger database, every inbound acknowledgement, and the
two feeds that read the ledger out to its sinks.

A message is acknowledged to the broker only after its row is committed (DESIGN §2, §3.3):
QoS 1 PUBACK and QoS 2 PUBREC (paho would send it on arrival; see actors.mqtt.client). Acks wait
for a group commit that is shared by everything that arrived meanwhile, so durability costs one
fsync per group, not per message. A QoS 2 PUBCOMP waits for none: the message was committed
before its PUBREC, and the release is recorded with a later commit (`_on_pubrel`).

The ledger is the buffer (DESIGN §2, §7.1). Two sinks read it, each through its own feed
(actors.feed): the table (PackActor -> SparkWriterActor) and, with forwarding, the upstream
(TierTwoBuffer -> OutboundLedger). Each sink grants credit; committed rows go to it while its
credit lasts, and wait on disk otherwise, read back in seq order when it grants more. Neither a
slow Spark nor an upstream outage holds the source: it is acknowledged as soon as a message is
committed. Each sink records its progress in its own file first and then tells the ledger (the
writer's batch commit; the outbound ledger's `Forwarded`), and a payload is deleted once every
sink that owes it is done. Only the disk budget (persistence.disk_budget) pauses the source, by
holding the intake gate so that its socket is no longer read (DESIGN §7.4).

Duplicates are recognised by the message's idempotency key, which stays in the ledger for
`retention_seconds` after the row has landed: a QoS 1 redelivery (DUP=1) or a QoS 2 re-sent PUBLISH
of a stored message is acknowledged again without a second row.

Storage faults (disk full, read-only, I/O errors: persistence.storage_faults) never kill the
actor: a restart would meet the same full disk, and the restart budget would end the daemon. The
failed group is rolled back, its acks are never sent, and its inputs go back, in order, to the
front of an in-memory backlog; what arrives meanwhile joins the backlog without being stored or
acknowledged. The backlog is bounded without a limit of its own: with no acks the broker stops at
our Receive Maximum (tests/actors/test_mosquitto_facts.py), and packets waiting in the
backlog count against the intake gate (actors.mqtt.intake), so past its limits paho's network thread
waits. QoS 0 arriving while storage fails is dropped and counted (DESIGN §3.4: only QoS 0 may be
dropped). The connection is kept: a reconnect would only make the broker resend what we hold.
The backlog is retried on a backoff on the injected clock; when a group commits again its acks
go out and the rest follows, oldest first. Asks that write (a Spark batch's begin and commit, a
life-cycle event) meanwhile raise StorageUnavailable; their callers retry. A stop while storage
fails leaves the backlog unacknowledged: the broker redelivers it after the next start.

At a small window a hand-over costs more than the work: the broker sends the next message only
after our ack, so each read waited for two thread switches, the network thread's tell waking the
ledger and the ledger's ack waking the network thread (bench ingest-windows: 0.26-0.35 of the bare
subscriber at a window of 1). So a burst that ends with the socket empty and finds the ledger idle
is stored, committed and acknowledged on paho's network thread itself, through `InlineIntake`:
the deliberate exception STYLE §2 allows. It is the same code under the same lock: every message
the actor handles holds the ledger's lock, and the network thread takes it only if it is free
(never waiting on a busy ledger: it hands over then, and group commits go on as before) and only
if no earlier burst of its connection still waits in the mailbox (the order of a connection's
packets is the order they are stored in). A commit on the network thread must stay short, so the
ledger's connection never checkpoints the WAL; persistence.wal_checkpoint does, on a connection
and thread of its own.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pykka

from actors.backoff import Backoff
from actors.clock import Clock, TimerHandle
from actors.crashpoints import crash_point
from actors.feed import Feed
from actors.messages import (
    Committed,
    Forwarded,
    ForwardRecorded,
    Grant,
    Inbound,
    InboundBurst,
    Recovery,
    SessionEnded,
    SessionStarted,
    StoreLocal,
    TakeReplays,
)
from actors.mqtt.client import AckKind, AckSender, InboundPublish, InboundPubrel
from actors.mqtt.intake import IntakeGate, packet_size
from actors.storage_retry import StorageRetry
from actors.tell import tell_unless_dead
from persistence import database as db
from persistence.disk_budget import DiskBudget
from persistence.keys import message_key as default_message_key
from persistence.ledger_store import PACK_COUNTER, LedgerStore
from persistence.records import TABLE, UPSTREAM, DiskUsage, LedgerRecord, ReaderCount
from persistence.replay import pending_requests, read_request, replay_key
from persistence.storage_faults import StorageUnavailable, cannot_open, describe, is_storage_fault
from persistence.wal_checkpoint import WalCheckpointer
from spark.zebra import INVALID_TOPIC

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Flush:
    pass


@dataclass(frozen=True, slots=True)
class _ReadBack:
    """Read the next chunk a sink owes back from the database."""

    sink: str


@dataclass(frozen=True, slots=True)
class _CheckBudget:
    """While the source is paused for the disk budget: look again."""


@dataclass(frozen=True, slots=True)
class _RetryStorage:
    """The backoff after a storage fault is over: try the backlog again."""


@dataclass(frozen=True, slots=True)
class _WriteReleases:
    """QoS 2 exchanges ended RELEASE_DELAY ago and no commit has recorded them yet: one now."""


@dataclass(frozen=True, slots=True)
class _Drain:
    """Go on storing the backlog (a chunk per message, so asks and stats get their turn)."""


class _StorageFailed(Exception):
    """Unwinds one message's handling after `_fail` dealt with a storage fault."""


# A QoS 2 exchange that is over (PUBREL answered) is recorded with the next commit that stores
# something anyway, or by a commit of its own at most this many seconds later (_on_pubrel).
RELEASE_DELAY = 1.0

# Backlogged packets stored per turn while draining after a storage fault.
DRAIN_CHUNK = 2000

# Rows read back for a sink per turn of the actor: each chunk is a message of its own, so packets
# from the source, the other sink's chunks and asks take turns with a long backlog (drain while
# live, DESIGN §7.6), and a chunk is small enough in memory whatever the backlog.
READ_BACK_CHUNK = 1000

# The disk budget is looked at after the commits that stored this share of it since the last
# look, and every BUDGET_RECHECK_SECONDS while the source is paused (free space can come back from
# elsewhere). Looking takes three PRAGMAs and a statvfs, about as long as a commit: after every
# commit it took a quarter of each message's time at a window of 1 (bench ingest-windows). So the
# source overshoots the budget by this share at most, and the free-space floor by as much.
BUDGET_CHECK_SHARE = 0.01
BUDGET_RECHECK_SECONDS = 1.0
BUDGET_HOLD = "disk budget"


@dataclass
class _Group:
    """Work done in the open transaction whose effects wait for its commit."""

    acks: list[tuple[AckSender, int, AckKind, int]] = field(default_factory=list)
    records: list[LedgerRecord] = field(default_factory=list)
    # Told once the transaction is committed (the outbound ledger's ForwardRecorded).
    replies: list[tuple[pykka.ActorRef, object]] = field(default_factory=list)
    # The inputs applied in it, and the in-memory state from before the first of them: a
    # storage fault rolls the transaction back, restores this state and puts the inputs back in
    # the backlog, so a retry applies them again from scratch.
    inputs: list[object] = field(default_factory=list)
    pubrel_before: dict[int, tuple[int, str]] | None = None
    counts_before: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.acks)


# A burst of more packets than this is handed over even when the ledger is idle: the network
# thread goes on reading while the ledger commits (a large window keeps both busy).
INLINE_MAX_PACKETS = 16

# The WAL is checkpointed (on its own thread) after this many commits since the last one: at a
# window of 1 a commit adds 3-4 pages, and SQLite's own automatic checkpoint comes at 1,000.
CHECKPOINT_COMMITS = 256


class _Crashed:
    """An error the network thread met while storing a burst inline: the actor raises it, so it
    fails as if it had met the error itself (pykka's failure rule, STYLE §5)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class InlineIntake:
    """The source connection's way into an idle ledger without a hand-over (module docstring).

    Made by the supervisor and given to both the ledger and the source's client factory; it is
    open while the ledger runs."""

    def __init__(self) -> None:
        self._ledger: InboundLedger | None = None
        self.refused_busy = 0  # bursts handed over because the ledger was busy (a counter)

    def take(self, packets: Sequence, acks: AckSender) -> bool:
        """Store, commit and acknowledge `packets` on the calling thread; False when the ledger
        is closed, busy or behind with this connection's bursts: hand them over then."""
        ledger = self._ledger
        return ledger is not None and ledger._take_inline(packets, acks)

    def _open(self, ledger: InboundLedger | None) -> None:
        self._ledger = ledger


def _send_acks(acks: Sequence[tuple[AckSender, int, AckKind, int]]) -> None:
    """Send in order, one call per connection and epoch."""
    by_connection: dict[tuple[int, int], tuple[AckSender, int, list[tuple[AckKind, int]]]] = {}
    for sender, epoch, kind, packet_id in acks:
        entry = by_connection.setdefault((id(sender), epoch), (sender, epoch, []))
        entry[2].append((kind, packet_id))
    for sender, epoch, items in by_connection.values():
        sender.send_acks(epoch, items)


def _owed_to(sink: str, records: Sequence[LedgerRecord]) -> list[LedgerRecord]:
    if sink == TABLE:
        return [r for r in records if r.to_table]
    return [r for r in records if r.to_upstream]


class InboundLedger(pykka.ThreadingActor):
    def __init__(
        self,
        path: Path,
        clock: Clock,
        *,
        durability: str = "process",
        group_commit_max_messages: int = 200,
        group_commit_max_delay: float = 0.005,
        retention_seconds: float = 3600.0 + 600.0,
        key: Callable[[str, bytes], str] = default_message_key,
        intake: IntakeGate | None = None,
        storage_backoff: Backoff | None = None,
        forward_topic: Callable[[str], bool] | None = None,
        budget: DiskBudget | None = None,
        inline: InlineIntake | None = None,
    ) -> None:
        super().__init__()
        self._path = Path(path)
        # Held for every message the actor handles, and by the source's network thread while it
        # stores a burst inline (module docstring). Reentrant: a stop runs inside a message.
        self._lock = threading.RLock()
        self._inline = inline
        self._inline_commits = 0
        self._checkpointer: WalCheckpointer | None = None
        self._clock = clock
        self._durability = durability
        self._group_max = group_commit_max_messages
        self._group_delay = group_commit_max_delay
        self._retention = retention_seconds
        self._key = key
        self._intake = intake
        # Which topics the upstream wants (a route matches): None while forwarding is off.
        self._forward_topic = forward_topic
        self._store: LedgerStore | None = None
        self._gateway_id = ""
        self._group = _Group()
        self._flush_timer: TimerHandle | None = None
        self._flush_pending = False
        self._burst_ending = False  # applying a burst that is over: it commits at its end
        # packet id -> (seq, key) of QoS 2 messages whose PUBREL has not come yet.
        self._awaiting_pubrel: dict[int, tuple[int, str]] = {}
        # QoS 2 packet ids released since the start and not given to a new message yet (a
        # PUBREL for one again is a re-send, not an exchange we have no record of).
        self._released: set[int] = set()
        # seq -> packet id of exchanges released and not recorded yet (_on_pubrel), and the
        # timer that records them if no other commit comes first.
        self._releases: dict[int, int] = {}
        self._release_timer: TimerHandle | None = None
        # PUBCOMPs for the input being handled: they wait for no commit (_on_pubrel).
        self._answers: list[tuple[AckSender, int, AckKind, int]] = []
        self.counts = {"accepted": 0, "duplicates": 0, "unknown_pubrel": 0, "commits": 0}
        self._feeds = {TABLE: Feed(TABLE), UPSTREAM: Feed(UPSTREAM)}
        self._targets: dict[str, pykka.ActorRef] = {}
        self._reading: set[str] = set()  # sinks with a _ReadBack in the mailbox
        # Storage faults (module docstring): the episode, and what waits meanwhile as (message,
        # already counted as taken by the intake gate).
        self._faults = StorageRetry(
            "inbound ledger",
            self._path,
            clock,
            lambda: tell_unless_dead(self.actor_ref, _RetryStorage()),
            storage_backoff,
        )
        self._backlog: deque[tuple[object, bool]] = deque()
        self._stored_before_start = 0
        self._dropped_qos0 = 0
        # The disk budget (None: unlimited) and where the ledger stands against it.
        self._budget = budget
        self._budget_paused = False
        self._budget_pauses = 0
        self._usage: DiskUsage | None = None
        self._unchecked_bytes = 0  # payload bytes committed since the budget was looked at
        self._budget_timer: TimerHandle | None = None

    # -- life cycle -------------------------------------------------------------------------

    def on_start(self) -> None:
        try:
            engine = db.open_engine(self._path, self._durability)
            self._store = LedgerStore(engine, self._path)
        except StorageUnavailable as error:
            log.error("inbound ledger: %s", error)
            raise
        except Exception as error:
            if not is_storage_fault(error):
                raise
            unavailable = cannot_open(self._path, error)
            log.error("inbound ledger: %s", unavailable)
            raise unavailable from error
        store = self._store
        self._gateway_id = store.gateway_id()
        self._awaiting_pubrel = store.awaiting_pubrel()
        # What this run stores comes after this seq (a live-only route forwards nothing older).
        self._stored_before_start = store.last_seq()
        if self._forward_topic is None:
            cleared = store.stop_forwarding()
            if cleared:
                # Owed work given up: a warning, never silent (the messages stay in the tables).
                log.warning(
                    "forwarding is off: %d stored message(s) no longer wait for the upstream "
                    "and will not be forwarded, even once forwarding is on again",
                    cleared,
                )
        else:
            store.purge_done()
        store.commit()
        log.info(
            "inbound ledger open at %s (gateway id %s, durability %s, %d QoS 2 exchanges "
            "awaiting PUBREL)",
            self._path,
            self._gateway_id,
            self._durability,
            len(self._awaiting_pubrel),
        )
        self._check_budget()
        store.leave_checkpoints()
        self._checkpointer = WalCheckpointer(store.engine, self._path)
        if self._inline is not None:
            self._inline._open(self)

    def _handle_receive(self, message: object) -> object:
        # pykka's one entry for tells, asks and proxy calls: each holds the ledger's lock, so the
        # network thread's inline bursts (InlineIntake) never meet the actor half way through.
        with self._lock:
            try:
                return super()._handle_receive(message)
            finally:
                self._send_answers()

    def on_stop(self) -> None:
        if self._inline is not None:
            self._inline._open(None)
        self._faults.cancel()
        if self._budget_timer is not None:
            self._budget_timer.cancel()
        if self._release_timer is not None:
            self._release_timer.cancel()
        if self._intake is not None:
            self._intake.close()
        try:
            if self._backlog:
                self._drain(final=True)
            self._commit(releases=True)
        except _StorageFailed:
            pass
        if self._backlog:
            log.error(
                "inbound ledger stopping while it cannot write (%s): %d message(s) neither "
                "stored nor acknowledged; the broker redelivers them after the next start",
                self._faults.error,
                len(self._backlog),
            )
        if self._checkpointer is not None:
            self._checkpointer.close()
        if self._store is not None:
            self._store.close()
        log.info("inbound ledger closed")

    def on_failure(self, exception_type, exception_value, traceback) -> None:
        with self._lock:
            if self._inline is not None:
                self._inline._open(None)
            if self._intake is not None:
                # Nothing will be taken any more: let the source's network thread go.
                self._intake.close()
            if self._checkpointer is not None:
                self._checkpointer.close()
            if self._store is not None:
                self._store.conn.close()

    # -- wiring -----------------------------------------------------------------------------

    def set_listener(self, listener: pykka.ActorRef) -> None:
        """Where the table's feed goes (the PackActor); credit comes from the Spark writer."""
        self._targets[TABLE] = listener
        self._schedule_read(TABLE)

    def gateway_id(self) -> str:
        """This ledger's random id (the tables' Delta application id is made from it)."""
        return self._gateway_id

    def open_batches(self) -> list[int]:
        """Batches begun and not committed, oldest first (the recovery replays them)."""
        assert self._store is not None
        return self._store.open_batches()

    def stored_before_start(self) -> int:
        """The last seq stored by an earlier run of the gateway (0: none)."""
        return self._stored_before_start

    def set_forwarder(self, forwarder: pykka.ActorRef) -> None:
        """Where the upstream's feed goes (the TierTwoBuffer, which grants its own credit)."""
        self._targets[UPSTREAM] = forwarder
        self._schedule_read(UPSTREAM)

    # -- messages ---------------------------------------------------------------------------

    def on_receive(self, message: object) -> None:
        if isinstance(message, InboundBurst):
            self._take_burst(message)
        elif isinstance(message, Inbound):
            if self._faults.failing or self._backlog:
                self._defer(message)
                return
            try:
                self._apply(message)
            except _StorageFailed:
                pass  # the packet is in the backlog now
            finally:
                self._taken(message)
        elif isinstance(message, _Flush):
            self._flush_pending = False
            try:
                self._commit()
            except _StorageFailed:
                pass
        elif isinstance(message, SessionStarted | Forwarded):
            if self._faults.failing or self._backlog:
                # After the inputs before it, in order.
                self._backlog.append((message, True))
                return
            try:
                self._apply(message)
                if isinstance(message, Forwarded):
                    self._commit()  # its reply waits for the commit; a sink is waiting on it
            except _StorageFailed:
                pass
        elif isinstance(message, Grant):
            self._feeds[message.sink].grant(message.limit, message.limit_bytes)
            self._schedule_read(message.sink)
        elif isinstance(message, _ReadBack):
            self._reading.discard(message.sink)
            self._read_back(message.sink)
        elif isinstance(message, _CheckBudget):
            self._budget_timer = None
            self._check_budget()
        elif isinstance(message, _RetryStorage):
            self._faults.retry_due()
            self._drain()
        elif isinstance(message, _Drain):
            self._drain()
        elif isinstance(message, _WriteReleases):
            self._release_timer = None
            self._write_releases()
        elif isinstance(message, SessionEnded):
            pass
        elif isinstance(message, TakeReplays):
            # While storage fails the request files stay; the daemon hands them again each second.
            if not self._faults.failing and not self._backlog:
                try:
                    self._take_replays(message.data_dir)
                except _StorageFailed:
                    pass
        elif isinstance(message, StoreLocal):
            self._store_local(message)
        elif isinstance(message, _Crashed):
            raise message.error
        else:
            log.warning("inbound ledger ignored %r", message)

    def _take_burst(self, burst: InboundBurst) -> None:
        """A hand-over of the source: each packet as if it came alone (an Inbound of its own,
        as the backlog and a rolled-back group keep them), and the intake gate told once."""
        applied = 0
        size = 0
        self._burst_ending = burst.over
        try:
            for message in burst:
                if self._faults.failing or self._backlog:
                    self._defer(message)  # counted when it is taken out of the backlog
                    continue
                applied += 1
                size += packet_size(message.packet)
                self._apply(message)
        except _StorageFailed:
            # That packet is in the backlog now; the rest of the burst goes behind it.
            for packet in burst.packets[applied:]:
                self._defer(Inbound(packet, burst.acks))
        finally:
            self._burst_ending = False
            burst.acks.bursts_taken += 1
            if self._intake is not None and applied:
                self._intake.taken(size, applied)
        if burst.over and not self._faults.failing and not self._backlog:
            self._burst_over()

    def _take_inline(self, packets: Sequence, acks: AckSender) -> bool:
        """On the source's network thread (InlineIntake.take): a burst applied and committed as
        `_take_burst` and `_burst_over` would, its acks queued on this thread's own client."""
        if len(packets) > INLINE_MAX_PACKETS:
            return False
        if not self._lock.acquire(blocking=False):
            if self._inline is not None:
                self._inline.refused_busy += 1
            return False
        try:
            if (
                self._store is None
                or self._faults.failing
                or self._backlog
                or acks.bursts_taken != acks.bursts_told
            ):
                return False
            self._burst_ending = True  # no group timer: the commit comes at the end
            try:
                for at, packet in enumerate(packets):
                    try:
                        self._apply(Inbound(packet, acks))
                    except _StorageFailed:
                        # That one is in the backlog now; the rest goes behind it. The intake
                        # gate never counted them, so they are "taken" already.
                        self._backlog.extend((Inbound(p, acks), True) for p in packets[at + 1 :])
                        return True
            finally:
                self._burst_ending = False
            if self._group.inputs:
                try:
                    self._commit()
                except _StorageFailed:
                    return True
                self._inline_commits += 1
            return True
        except BaseException as error:
            # Not a storage fault: the actor fails with it, as a tell would have made it; the
            # packets are not acknowledged, so the broker sends them again.
            log.debug("inline burst failed: %r", error)
            tell_unless_dead(self.actor_ref, _Crashed(error))
            return True
        finally:
            try:
                self._send_answers()
            finally:
                self._lock.release()

    def _burst_over(self) -> None:
        """The source read all the broker had sent: commit now, not when the group timer fires.
        The broker may have nothing more to send until these are acknowledged (its window is
        full: at a window of 1, every message waited out the whole delay), and waiting longer
        groups nothing that is not already here. Only while the mailbox is empty: behind other
        bursts the group goes on (a _Flush after them commits it), as at a large window."""
        if not self._group.acks and not self._group.records:
            return  # nothing waits for a commit
        if not self.actor_inbox.empty():
            self._flush_pending = True
            self.actor_ref.tell(_Flush())
            return
        try:
            self._commit()
        except _StorageFailed:
            pass

    def _taken(self, message: Inbound) -> None:
        if self._intake is not None:
            self._intake.taken(packet_size(message.packet))

    def _apply(self, message: object) -> None:
        """Apply one input in the open transaction; a storage fault on the way raises
        _StorageFailed after `_fail` has put the group back in the backlog. A PUBREL writes
        nothing there (_on_pubrel): a rollback has nothing of it to undo."""
        if isinstance(message, Inbound) and isinstance(message.packet, InboundPubrel):
            self._on_pubrel(message.packet, message.acks)
            return
        group = self._group
        if group.counts_before is None:
            group.pubrel_before = dict(self._awaiting_pubrel)
            group.counts_before = {k: self.counts[k] for k in ("accepted", "duplicates")}
        group.inputs.append(message)
        # Spelled out rather than `with self._storage()`: this runs once per message, and a
        # try that raises nothing costs nothing, a context manager a generator each time.
        try:
            if isinstance(message, SessionStarted):
                self._on_session(message)
            elif isinstance(message, Forwarded):
                self._on_forwarded(message)
            else:
                self._on_publish(message.packet, message.acks)
        except Exception as error:
            self._fail_on_storage_fault(error)
            raise

    # -- storage faults ---------------------------------------------------------------------

    @contextmanager
    def _storage(self) -> Iterator[None]:
        """Turn a storage fault raised inside into `_fail` + _StorageFailed; others go up."""
        try:
            yield
        except Exception as error:
            self._fail_on_storage_fault(error)
            raise

    def _fail_on_storage_fault(self, error: Exception) -> None:
        """For a storage fault: `_fail`, then raise _StorageFailed. Returns for anything else
        (a _StorageFailed from deeper down included), which the caller re-raises."""
        if not isinstance(error, _StorageFailed) and is_storage_fault(error):
            self._fail(error)
            raise _StorageFailed from error

    def _fail(self, error: BaseException) -> None:
        """Roll back the open group, put its inputs back in front of the backlog, and retry
        after the next backoff delay. Its acks were never sent: nothing unstored is acked."""
        self._rollback()
        group, self._group = self._group, _Group()
        # A PUBCOMP that waited behind the group's acks is no input to apply again: it leaves.
        self._answers.extend(a for a in group.acks if a[2] is AckKind.PUBCOMP)
        if group.counts_before is not None:
            self._awaiting_pubrel = group.pubrel_before or {}
            self.counts.update(group.counts_before)
        self._backlog.extendleft((m, True) for m in reversed(group.inputs))
        self._faults.failed(
            error,
            "acknowledgements stop (the broker holds the rest back at our Receive Maximum), the "
            f"source connection stays, {len(self._backlog)} message(s) wait in memory",
        )

    def _rollback(self) -> None:
        assert self._store is not None
        try:
            self._store.rollback()
        except Exception as error:  # the store replaced its connection with a fresh one
            log.warning("inbound ledger rollback failed (%s): reconnected", describe(error))

    def _defer(self, message: Inbound) -> None:
        packet = message.packet
        if self._faults.failing and isinstance(packet, InboundPublish) and packet.qos == 0:
            # No broker keeps a QoS 0 message for us and none limits their flow: holding them
            # would be unbounded. DESIGN §3.4 lets QoS 0 go, counted.
            self._dropped_qos0 += 1
            self._taken(message)
            return
        # Not yet "taken": the intake gate counts it as waiting, and so bounds the backlog.
        self._backlog.append((message, False))

    def _drain(self, final: bool = False) -> None:
        """Store the backlog in order, a chunk per turn; on success, leave the failing state."""
        if self._faults.waiting and not final:
            return  # a fault is waiting out its backoff
        try:
            done = 0
            while self._backlog and (final or done < DRAIN_CHUNK):
                message, counted = self._backlog.popleft()
                done += 1
                try:
                    self._apply(message)
                finally:
                    if not counted and isinstance(message, Inbound):
                        self._taken(message)
            self._commit()
            if self._backlog:
                tell_unless_dead(self.actor_ref, _Drain())
                return
            if self._faults.failing and not final:
                self._probe()
                self._recovered()
        except _StorageFailed:
            pass

    def _probe(self) -> None:
        """A tiny write that proves the storage takes writes again (the backlog may have held
        nothing that writes: the fault can come from an ask)."""
        assert self._store is not None
        with self._storage():
            self._store.probe(self._clock.wall())
        self._commit()

    def _recovered(self) -> None:
        self._faults.succeeded(
            f"; acknowledgements resume, {self._dropped_qos0} QoS 0 message(s) dropped so far"
        )
        for sink in self._feeds:
            self._schedule_read(sink)

    def _refuse_while_failing(self) -> None:
        if self._faults.failing:
            raise StorageUnavailable(f"inbound ledger cannot write: {self._faults.error}")

    @contextmanager
    def _asked_write(self) -> Iterator[None]:
        """For asks that write: a storage fault goes back to the asker as StorageUnavailable."""
        self._refuse_while_failing()
        try:
            with self._storage():
                yield
        except _StorageFailed as failed:
            raise StorageUnavailable(
                f"inbound ledger cannot write: {self._faults.error}"
            ) from failed.__cause__

    # -- the inbound protocol ---------------------------------------------------------------

    def _on_publish(self, publish: InboundPublish, acks: AckSender) -> None:
        key = self._key(publish.topic, publish.payload)
        seq = self._insert(publish, key)
        if seq is None:
            self.counts["duplicates"] += 1
            log.debug("duplicate %s (packet %d, dup=%s)", key, publish.packet_id, publish.dup)
        if publish.qos == 2:
            assert self._store is not None
            if seq is None:
                seq = self._store.seq_of(key)
            previous = self._awaiting_pubrel.get(publish.packet_id)
            if previous is not None and previous[1] != key:
                # The broker reused the id for another message: the old exchange is over.
                self._store.set_packet_id(previous[0], None)
            self._releases.pop(seq, None)  # a release not recorded yet must not undo this
            self._store.set_packet_id(seq, publish.packet_id)
            self._awaiting_pubrel[publish.packet_id] = (seq, key)
            self._released.discard(publish.packet_id)
            self._defer_ack(acks, publish.epoch, AckKind.PUBREC, publish.packet_id)
        elif publish.qos == 1:
            self._defer_ack(acks, publish.epoch, AckKind.PUBACK, publish.packet_id)
        else:
            self._schedule_flush()

    def _on_pubrel(self, pubrel: InboundPubrel, acks: AckSender) -> None:
        """The PUBCOMP waits for no commit of its own: the message was committed before its
        PUBREC left, and the release only takes the packet id off its row. It leaves with the
        input being handled, or behind acks of the open group, with their commit, so that acks
        keep the order their packets came in. The release is recorded by the next commit that
        stores something, or RELEASE_DELAY later. One a crash loses leaves the id on its row:
        the broker gives that id to a new message next, which `_on_publish` tells from the old
        one by its key (a same-key message is a duplicate anyway). A commit per PUBREL was
        most of the cost of QoS 2 where PUBRELs come one at a time (Mochi)."""
        known = self._awaiting_pubrel.pop(pubrel.packet_id, None)
        if self._group.pubrel_before is not None:
            # A rollback of the open group must not bring the exchange back.
            self._group.pubrel_before.pop(pubrel.packet_id, None)
        if known is None:
            # Not ours: acknowledging lets the broker finish an exchange we have no record of
            # (it cannot be a message we lost: PUBREC left only after a commit).
            self.counts["unknown_pubrel"] += 1
            if pubrel.packet_id in self._released:
                # EMQX re-sends an unanswered PUBREL on the live connection every
                # retry_interval: one that crossed our PUBCOMP is answered again, nothing more.
                log.debug("PUBREL again for packet id %d, released already", pubrel.packet_id)
            else:
                log.warning(
                    "PUBREL for packet id %d that the ledger never stored", pubrel.packet_id
                )
        else:
            crash_point("after_pubrec_before_pubrel")
            self._releases[known[0]] = pubrel.packet_id
            self._released.add(pubrel.packet_id)
            self._arm_release_timer()
        if self._group.acks:
            # Behind acks that wait for a commit coming anyway: acks leave in the order their
            # packets came.
            self._defer_ack(acks, pubrel.epoch, AckKind.PUBCOMP, pubrel.packet_id)
        else:
            self._answers.append((acks, pubrel.epoch, AckKind.PUBCOMP, pubrel.packet_id))

    def _send_answers(self) -> None:
        if self._answers:
            answers, self._answers = self._answers, []
            _send_acks(answers)

    def _arm_release_timer(self) -> None:
        if self._release_timer is None:
            self._release_timer = self._clock.call_later(
                RELEASE_DELAY, lambda: tell_unless_dead(self.actor_ref, _WriteReleases())
            )

    def _write_releases(self) -> None:
        """Record the releases no commit has taken with it (their timer fired); while storage
        fails, look again a RELEASE_DELAY later."""
        if not self._releases:
            return
        if not self._faults.failing and not self._backlog:
            try:
                self._commit(releases=True)
            except _StorageFailed:
                pass
        if self._releases:
            self._arm_release_timer()

    def _on_session(self, message: SessionStarted) -> None:
        if not message.session_present and self._awaiting_pubrel:
            assert self._store is not None
            log.warning(
                "broker session was not present: forgetting %d QoS 2 packet ids awaiting PUBREL "
                "(their messages are stored)",
                len(self._awaiting_pubrel),
            )
            for seq, _key in self._awaiting_pubrel.values():
                self._store.set_packet_id(seq, None)
            self._awaiting_pubrel.clear()
            self._commit()

    # -- the open transaction ---------------------------------------------------------------

    def _insert(
        self,
        publish: InboundPublish,
        key: str,
        *,
        to_table: bool = True,
        to_upstream: bool | None = None,
    ) -> int | None:
        """Store one message; its seq, or None for a key stored already. `to_upstream` None:
        owed upstream when forwarding is on and a route wants its topic."""
        assert self._store is not None
        received = self._clock.wall()
        expires = None if publish.expiry_interval is None else received + publish.expiry_interval
        # A topic that was not UTF-8 (MQTT 5 §1.5.4 forbids it, a broker should refuse it) is
        # stored as decoded, with U+FFFD where its bytes were bad, and marked: it is acked like
        # any other and lands as an `invalid_topic` dead letter, never as reads or upstream.
        dead = None if publish.topic_valid_utf8 else INVALID_TOPIC
        if to_upstream is None:
            to_upstream = self._forward_topic is not None and self._forward_topic(publish.topic)
        forward = to_upstream and dead is None and self._forward_topic is not None
        seq = self._store.insert(
            key,
            publish.topic,
            publish.payload,
            publish.qos,
            received,
            expires,
            dead,
            forward,
            None if to_table else received,
        )
        if seq is None:
            return None
        self._group.records.append(
            LedgerRecord(
                seq,
                key,
                publish.topic,
                publish.payload,
                publish.qos,
                received,
                None,
                dead,
                expires,
                None,
                to_table,
                forward,
            )
        )
        self.counts["accepted"] += 1
        return seq

    def _take_replays(self, data_dir: Path) -> None:
        """Each request's messages as new rows under replay keys, committed before the request
        file goes: taking a file twice (a crash in between) stores nothing twice. A table dead
        letter is owed to the table only, an upstream one to the upstream only (its reads are
        in the table already, DESIGN §7.2)."""
        for path in pending_requests(data_dir):
            try:
                request, messages = read_request(path)
            except (OSError, ValueError, KeyError) as error:
                bad = path.with_suffix(".invalid")
                log.error("replay request %s unreadable (%s): moved to %s", path, error, bad)
                path.replace(bad)
                continue
            taken = 0
            with self._storage():
                for m in messages:
                    publish = InboundPublish(
                        0, 0, m.qos, False, False, m.topic, True, m.payload, None, 0.0
                    )
                    upstream = m.sink == UPSTREAM
                    seq = self._insert(
                        publish,
                        replay_key(m.message_key, request),
                        to_table=not upstream,
                        to_upstream=upstream,
                    )
                    if seq is not None:
                        taken += 1
            self._commit()
            path.unlink()
            log.info(
                "replay %s: %d message(s) taken into the ledger, %d taken before",
                request,
                taken,
                len(messages) - taken,
            )

    def _store_local(self, message: StoreLocal) -> None:
        """Inserted as `_take_replays` does; committed at once, not with the next group: these
        are rare, and the sender (the LifecycleActor) has no ack to wait for."""
        publish = InboundPublish(
            0, 0, message.qos, False, False, message.topic, True, message.payload, None, 0.0
        )
        # Refused while storage fails: the LifecycleActor keeps the event in its outbox.
        with self._asked_write():
            if self._insert(publish, self._key(message.topic, message.payload)) is None:
                self.counts["duplicates"] += 1
            self._commit()

    def _on_forwarded(self, message: Forwarded) -> None:
        """The upstream finished these messages (its own file says so already). Upstream dead
        letters become rows of their own, owed to the table; the reply waits for the commit."""
        assert self._store is not None
        added = self._store.forwarded(message.done, message.dead, self._clock.wall())
        if added:
            self._group.records.extend(self._store.records(added))
            log.info(
                "%d message(s) forwarding gave up on: upstream dead letters for the table",
                len(added),
            )
        if message.reply_to is not None:
            seqs = message.done + tuple(seq for seq, _ in message.dead)
            self._group.replies.append((message.reply_to, ForwardRecorded(seqs)))

    def _defer_ack(self, acks: AckSender, epoch: int, kind: AckKind, packet_id: int) -> None:
        self._group.acks.append((acks, epoch, kind, packet_id))
        if len(self._group) >= self._group_max:
            self._commit()
        else:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_pending or self._burst_ending:
            return  # (a burst that is over commits when it has been applied: _burst_over)
        self._flush_pending = True
        if self._group_delay <= 0:
            # Queued behind every packet already in the mailbox: the group is whatever arrived.
            self.actor_ref.tell(_Flush())
        else:
            self._flush_timer = self._clock.call_later(
                self._group_delay, lambda: tell_unless_dead(self.actor_ref, _Flush())
            )

    def _commit(self, *, releases: bool = False) -> None:
        """Commit the open transaction, then release what waited for it: acks, replies, and
        records to the sinks that owe them. Released QoS 2 exchanges are recorded with it when
        it stores something anyway, or when `releases` asks. A storage fault raises
        _StorageFailed, the group back in the backlog (`_fail`), the releases kept."""
        assert self._store is not None
        open_group = self._group
        recorded: list[tuple[int, int]] = []
        if self._releases and (
            releases or open_group.acks or open_group.records or open_group.replies
        ):
            recorded = list(self._releases.items())
            with self._storage():
                self._store.clear_packet_ids(recorded)
        with self._storage():
            self._store.commit()
        for seq, packet_id in recorded:
            if self._releases.get(seq) == packet_id:
                del self._releases[seq]
        group, self._group = self._group, _Group()
        if not group.acks and not group.records and not group.replies:
            return
        self.counts["commits"] += 1
        if self.counts["commits"] % CHECKPOINT_COMMITS == 0 and self._checkpointer is not None:
            self._checkpointer.request()
        self._send_answers()  # (those of the input being handled came before the group's)
        if group.acks:
            crash_point("after_ledger_commit_before_ack")
            _send_acks(group.acks)
        for ref, reply in group.replies:
            tell_unless_dead(ref, reply)
        if group.records:
            for sink, feed in self._feeds.items():
                target = self._targets.get(sink)
                if target is None:
                    if feed.caught_up:
                        owed = _owed_to(sink, group.records)
                        if owed:
                            feed.behind_from(owed[0].seq)  # read back once wired
                    continue
                handed = feed.offer(_owed_to(sink, group.records))
                if handed:
                    self._hand_on(target, handed)
        if self._budget is not None:
            self._unchecked_bytes += sum(len(r.payload) for r in group.records)
            if self._unchecked_bytes >= self._budget.max_bytes * BUDGET_CHECK_SHARE:
                self._check_budget()

    def _hand_on(self, target: pykka.ActorRef, records: Sequence[LedgerRecord]) -> None:
        if not tell_unless_dead(target, Committed(tuple(records))):
            # Shutting down: the rows are committed and the next start hands them on.
            log.info("%d committed message(s) left for the next start", len(records))

    # -- the feeds --------------------------------------------------------------------------

    def _schedule_read(self, sink: str) -> None:
        feed = self._feeds[sink]
        if (
            sink in self._targets
            and not feed.caught_up
            and feed.has_credit
            and sink not in self._reading
        ):
            self._reading.add(sink)
            tell_unless_dead(self.actor_ref, _ReadBack(sink))

    def _read_back(self, sink: str) -> None:
        """Hand `sink` the next chunk it owes from the database, oldest first."""
        feed, target = self._feeds[sink], self._targets.get(sink)
        if target is None or feed.caught_up or not feed.has_credit:
            return
        if self._faults.failing or self._backlog:
            return  # `_recovered` comes back here
        # Rows of the open transaction are visible to this connection: commit them first, so
        # that a row is read back here or handed on by _commit, never both.
        try:
            self._commit()
        except _StorageFailed:
            return
        if feed.caught_up:
            return
        assert self._store is not None and feed.next_seq is not None
        limit = min(feed.messages, READ_BACK_CHUNK)
        try:
            records = self._store.owed(sink, feed.next_seq, limit)
        except Exception as error:
            if not is_storage_fault(error):
                raise
            log.warning("inbound ledger could not read back for the %s: %s", sink, describe(error))
            self._rollback()
            self._clock.call_later(1.0, lambda: tell_unless_dead(self.actor_ref, _ReadBack(sink)))
            self._reading.add(sink)
            return
        handed = feed.take(records, limit)
        if handed:
            self._hand_on(target, handed)
        if feed.caught_up:
            log.debug(
                "the %s's feed is caught up at seq %d", sink, records[-1].seq if records else 0
            )
        self._schedule_read(sink)

    def settle(self) -> dict[str, int | None]:
        """At a graceful stop, before the sinks stop: commit, and hand each sink all it owes
        now (within its credit) rather than a chunk per turn. Returns where each feed stands
        (None: caught up); what is left waits for the next start."""
        self._commit()
        for sink, feed in self._feeds.items():
            while sink in self._targets and not feed.caught_up and feed.has_credit:
                before = feed.next_seq
                self._read_back(sink)
                if feed.next_seq == before:
                    break  # nothing more could be handed on now
        return {sink: feed.next_seq for sink, feed in self._feeds.items()}

    # -- the disk budget --------------------------------------------------------------------

    def _check_budget(self) -> None:
        """Look at the ledger's disk use: pause the source at the budget, resume it once the
        sinks have made room."""
        if self._budget is None or self._store is None:
            return
        self._unchecked_bytes = 0
        try:
            usage = self._usage = self._store.usage()
        except Exception as error:
            if not is_storage_fault(error):
                raise
            return  # the storage fault path has its own say
        over = self._budget.over(usage, self._budget_paused)
        if over and not self._budget_paused:
            self._budget_paused = True
            self._budget_pauses += 1
            log.warning(
                "ledger at its disk budget (%s): source paused, its socket is no longer read; "
                "until the sinks catch up, the broker's queue limits decide what readers' "
                "messages are kept (docs: operating/disk-budget)",
                self._budget.describe(usage),
            )
            if self._intake is not None:
                self._intake.hold(BUDGET_HOLD)
        elif not over and self._budget_paused:
            self._budget_paused = False
            log.info(
                "ledger back within its disk budget (%s): source resumed",
                self._budget.describe(usage),
            )
            if self._intake is not None:
                self._intake.release(BUDGET_HOLD)
        if self._budget_paused and self._budget_timer is None:
            self._budget_timer = self._clock.call_later(
                BUDGET_RECHECK_SECONDS, lambda: tell_unless_dead(self.actor_ref, _CheckBudget())
            )

    # -- batches (asked by the Spark writer) ------------------------------------------------

    def recovery(self) -> Recovery:
        assert self._store is not None
        self._commit()
        store = self._store
        open_batches = tuple(
            (batch_id, store.batch_records(batch_id)) for batch_id in store.open_batches()
        )
        table, upstream = store.lag(TABLE), store.lag(UPSTREAM)
        loose = table.messages - sum(len(records) for _, records in open_batches)
        self._feeds[TABLE].behind_from(store.first_owed(TABLE))
        self._feeds[UPSTREAM].behind_from(store.first_owed(UPSTREAM))
        next_pack_id = store.counter(PACK_COUNTER) + 1
        readers = store.reader_counts()
        reader_health = store.reader_health()
        store.commit()
        if open_batches or loose or upstream.messages:
            log.info(
                "recovery: %d unfinished batch(es) to replay, %d stored message(s) to pack, "
                "%d owed upstream",
                len(open_batches),
                loose,
                upstream.messages,
            )
        return Recovery(open_batches, loose, next_pack_id, readers, reader_health)

    def begin_batch(self, packs: Sequence[tuple[int, Sequence[int]]]) -> int:
        """Record a batch and the packs (pack id, row seqs) it holds, before its Spark job."""
        assert self._store is not None
        with self._asked_write():
            batch_id = self._store.begin_batch(packs, self._clock.wall())
            self._commit()
            return batch_id

    def claim_reads(self, batch_id: int, read_ids: Sequence[str]) -> set[str]:
        """Claim read ids for a batch; returns those the batch owns (new, or claimed by an
        earlier attempt of the same batch). Used with payload-field keys only."""
        assert self._store is not None
        with self._asked_write():
            owned = self._store.claim_reads(batch_id, read_ids, self._clock.wall())
            self._commit()
            return owned

    def commit_batch(
        self,
        batch_id: int,
        rows: int,
        dead_letters: int,
        readers: Mapping[str, ReaderCount] | None = None,
        health: Mapping[str, Mapping[str, object]] | None = None,
    ) -> None:
        """The batch is in the tables: mark it, drop the payloads no sink owes any more,
        update the readers' counters and health states, prune old landed keys."""
        assert self._store is not None
        with self._asked_write():
            self._store.commit_batch(
                batch_id,
                rows,
                dead_letters,
                self._clock.wall(),
                self._retention,
                readers,
                health,
            )
            self._commit()

    # -- status -----------------------------------------------------------------------------

    def stats(self) -> dict:
        assert self._store is not None
        now = self._clock.wall()
        lags: dict[str, dict] = {}
        pending = None
        try:
            for sink in (TABLE, UPSTREAM) if self._forward_topic is not None else (TABLE,):
                lag = self._store.lag(sink)
                lags[sink] = {
                    "messages": lag.messages,
                    "oldest_age_seconds": round(lag.age(now), 3),
                    "oldest_received_time": lag.oldest_received_time,
                }
            pending = lags[TABLE]["messages"]
        except Exception as error:
            if not is_storage_fault(error):
                raise
            lags = {}  # unreadable now; the storage fields below say why
        usage = self._usage
        return {
            **self.counts,
            "inline_commits": self._inline_commits,
            "wal_checkpoints": 0 if self._checkpointer is None else self._checkpointer.checkpoints,
            "wal_restarts": 0 if self._checkpointer is None else self._checkpointer.restarts,
            "storage_failures": self._faults.failures,
            "storage_recoveries": self._faults.recoveries,
            "dropped_qos0": self._dropped_qos0,
            "pending": pending,
            "lag": lags,
            "awaiting_pubrel": len(self._awaiting_pubrel),
            "releases_unrecorded": len(self._releases),
            "paused_by": [BUDGET_HOLD] if self._budget_paused else [],
            "budget": None
            if self._budget is None
            else {
                "paused": self._budget_paused,
                "pauses": self._budget_pauses,
                "max_bytes": self._budget.max_bytes,
                "min_free_bytes": self._budget.min_free_bytes,
                "used_bytes": None if usage is None else usage.used_bytes,
                "free_bytes": None if usage is None else usage.free_bytes,
                "describe": None if usage is None else self._budget.describe(usage),
            },
            "feeds": {
                sink: {
                    "credit_messages": feed.messages,
                    "behind_from": feed.next_seq,
                    "handed": feed.handed,
                    "limit": feed.limit,
                }
                for sink, feed in self._feeds.items()
            },
            # Set while writes fail: the error, for how long, and what waits in memory.
            "storage_error": self._faults.error,
            "storage_failing_seconds": None
            if self._faults.seconds() is None
            else round(self._faults.seconds(), 3),
            "storage_backlog": len(self._backlog),
        }
