"""InboundLedger: the actor that owns the ledger database and every inbound acknowledgement.

A message is acknowledged to the broker only after its row is committed (DESIGN §2, §3.3):
QoS 1 PUBACK, QoS 2 PUBREC (paho would send it on arrival; see actors.mqtt_client) and the QoS 2
PUBCOMP after the release is recorded. Acks wait for a group commit that is shared by everything
that arrived meanwhile, so durability costs one fsync per group, not per message.

Duplicates are recognised by the message's idempotency key, which stays in the ledger for
`retention_seconds` after the row has landed: a QoS 1 redelivery (DUP=1) or a QoS 2 re-sent PUBLISH
of a stored message is acknowledged again without a second row.

Storage faults (disk full, read-only, I/O errors: persistence.storage_faults) never kill the
actor: a restart would meet the same full disk, and the restart budget would end the daemon. The
failed group is rolled back, its acks are never sent, and its packets go back, in order, to the
front of an in-memory backlog; what arrives meanwhile joins the backlog without being stored or
acknowledged. The backlog is bounded without a limit of its own: with no acks the broker stops at
our Receive Maximum (tests/actors/test_mosquitto_facts.py), and packets waiting in the
backlog count against the intake gate (actors.intake), so past its limits paho's network thread
waits. QoS 0 arriving while storage fails is dropped and counted (DESIGN §3.4: only QoS 0 may be
dropped). The connection is kept: a reconnect would only make the broker resend what we hold.
The backlog is retried on a backoff on the injected clock; when a group commits again its acks
go out and the rest follows, oldest first. Asks that write (a Spark batch's begin and commit, a
life-cycle event) meanwhile raise StorageUnavailable; their callers retry. A stop while storage
fails leaves the backlog unacknowledged: the broker redelivers it after the next start.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pykka
from sqlalchemy import Connection, func, select

from actors.backoff import Backoff
from actors.clock import Clock, TimerHandle
from actors.connection import Inbound, SessionEnded, SessionStarted
from actors.crashpoints import crash_point
from actors.intake import IntakeGate, packet_size
from actors.mqtt_client import AckKind, AckSender, InboundPublish, InboundPubrel
from persistence import database as db
from persistence.keys import message_key as default_message_key
from persistence.replay import pending_requests, read_request, replay_key
from persistence.storage_faults import StorageUnavailable, cannot_open, describe, is_storage_fault
from spark.zebra import INVALID_TOPIC

log = logging.getLogger(__name__)

PACK_COUNTER = "pack_id"


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """A committed inbound message, as it travels to packs and the Spark writer."""

    seq: int
    message_key: str
    topic: str
    payload: bytes
    qos: int
    received_time: float
    pack_id: int | None = None
    dead_reason: str | None = None
    expires_at: float | None = None

    def in_pack(self, pack_id: int) -> LedgerRecord:
        # Spelled out: dataclasses.replace cost several times more, once per message (py-spy).
        return LedgerRecord(
            self.seq,
            self.message_key,
            self.topic,
            self.payload,
            self.qos,
            self.received_time,
            pack_id,
            self.dead_reason,
            self.expires_at,
        )


@dataclass(frozen=True, slots=True)
class Committed:
    """Told to the listener after each group commit: new rows, in arrival order."""

    records: tuple[LedgerRecord, ...]


@dataclass(frozen=True)
class Recovery:
    """What a previous run left unfinished: batches begun but not committed (replay them as they
    were), and the number of committed rows not yet in a batch (the ledger hands them to its
    listener again, from the database, a chunk at a time)."""

    open_batches: tuple[tuple[int, tuple[LedgerRecord, ...]], ...]
    loose: int
    next_pack_id: int


@dataclass(frozen=True, slots=True)
class _Flush:
    pass


@dataclass(frozen=True, slots=True)
class _ReleaseHeld:
    pass


@dataclass(frozen=True, slots=True)
class _RetryStorage:
    """The backoff after a storage fault is over: try the backlog again."""


@dataclass(frozen=True, slots=True)
class _Drain:
    """Go on storing the backlog (a chunk per message, so asks and stats get their turn)."""


class _StorageFailed(Exception):
    """Unwinds one message's handling after `_fail` dealt with a storage fault."""


# Backlogged packets stored per turn while draining after a storage fault.
DRAIN_CHUNK = 2000


@dataclass(frozen=True, slots=True)
class TakeReplays:
    """Replay requests wait in this data directory (persistence.replay)."""

    data_dir: Path


@dataclass(frozen=True, slots=True)
class StoreLocal:
    """A message made by the gateway itself (a life-cycle event): stored like an inbound one,
    so it is packed, forwarded and landed exactly-once like reads, with no broker to ack."""

    topic: str
    payload: bytes
    qos: int = 1


# Held rows go back to the listener this many at a time, each chunk a message of its own, so a
# Pause that arrives meanwhile stops the release between two chunks.
RELEASE_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Pause:
    """Backpressure: stop acknowledging the source (its Receive Maximum then stops the flow)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Resume:
    reason: str


@dataclass
class _Group:
    """Work done in the open transaction whose effects wait for its commit."""

    acks: list[tuple[AckSender, int, AckKind, int]] = field(default_factory=list)
    records: list[LedgerRecord] = field(default_factory=list)
    # The packets (and session starts) applied in it, and the in-memory state from before the
    # first of them: a storage fault rolls the transaction back, restores this state and puts
    # the inputs back in the backlog, so a retry applies them again from scratch.
    inputs: list[object] = field(default_factory=list)
    pubrel_before: dict[int, tuple[int, str]] | None = None
    counts_before: dict[str, int] | None = None
    last_seq_before: int = 0

    def __len__(self) -> int:
        return len(self.acks)


def seq_runs(seqs: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted, distinct seqs as inclusive (first, last) runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return runs


def _send_acks(acks: Sequence[tuple[AckSender, int, AckKind, int]]) -> None:
    """Send in order, one call per connection and epoch."""
    by_connection: dict[tuple[int, int], tuple[AckSender, int, list[tuple[AckKind, int]]]] = {}
    for sender, epoch, kind, packet_id in acks:
        entry = by_connection.setdefault((id(sender), epoch), (sender, epoch, []))
        entry[2].append((kind, packet_id))
    for sender, epoch, items in by_connection.values():
        sender.send_acks(epoch, items)


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
    ) -> None:
        super().__init__()
        self._path = Path(path)
        self._clock = clock
        self._durability = durability
        self._group_max = group_commit_max_messages
        self._group_delay = group_commit_max_delay
        self._retention = retention_seconds
        self._key = key
        self._intake = intake
        self._listener: pykka.ActorRef | None = None
        self._conn: Connection | None = None
        self._group = _Group()
        self._flush_timer: TimerHandle | None = None
        self._flush_pending = False
        # packet id -> (seq, key) of QoS 2 messages whose PUBREL has not come yet.
        self._awaiting_pubrel: dict[int, tuple[int, str]] = {}
        self.counts = {"accepted": 0, "duplicates": 0, "unknown_pubrel": 0, "commits": 0}
        self._pauses: set[str] = set()
        self._held_acks: list[tuple[AckSender, int, AckKind, int]] = []
        # While paused (and until the listener has caught up after a resume), committed rows are
        # not handed on but left in the database from this seq on: memory stays flat however long
        # the pause, and however many messages the broker sends past our Receive Maximum.
        self._held_from: int | None = None
        self._last_seq = 0
        # Storage faults (module docstring): what failed, since when, and what waits meanwhile
        # as (message, already counted as taken by the intake gate).
        self._failing: str | None = None
        self._failing_since: float | None = None
        self._backlog: deque[tuple[object, bool]] = deque()
        self._storage_backoff = storage_backoff or Backoff(0.5, 30.0, 0.25)
        self._storage_timer: TimerHandle | None = None
        self._storage_counts = {"storage_failures": 0, "storage_recoveries": 0, "dropped_qos0": 0}

    # -- life cycle -------------------------------------------------------------------------

    def on_start(self) -> None:
        try:
            self._engine = db.open_engine(self._path, self._durability)
            self._conn = self._engine.connect()
        except StorageUnavailable as error:
            log.error("inbound ledger: %s", error)
            raise
        except Exception as error:
            if not is_storage_fault(error):
                raise
            unavailable = cannot_open(self._path, error)
            log.error("inbound ledger: %s", unavailable)
            raise unavailable from error
        # Per-message statements go straight to sqlite3, inside the transaction SQLAlchemy
        # opened: SQLAlchemy's per-statement work cost more than the insert itself (py-spy, the
        # ingest benchmark).
        self._hot_cursor = self._conn.connection.driver_connection.cursor()
        rows = self._conn.execute(
            select(db.inbound.c.packet_id, db.inbound.c.seq, db.inbound.c.message_key).where(
                db.inbound.c.packet_id.isnot(None)
            )
        )
        self._awaiting_pubrel = {pid: (seq, key) for pid, seq, key in rows}
        self._conn.commit()
        log.info(
            "inbound ledger open at %s (durability %s, %d QoS 2 exchanges awaiting PUBREL)",
            self._path,
            self._durability,
            len(self._awaiting_pubrel),
        )

    def on_stop(self) -> None:
        if self._intake is not None:
            self._intake.close()
        if self._storage_timer is not None:
            self._storage_timer.cancel()
        try:
            if self._backlog:
                self._drain(final=True)
            self._commit()
        except _StorageFailed:
            pass
        if self._backlog:
            log.error(
                "inbound ledger stopping while it cannot write (%s): %d message(s) neither "
                "stored nor acknowledged; the broker redelivers them after the next start",
                self._failing,
                len(self._backlog),
            )
        if self._conn is not None:
            self._conn.close()
            self._engine.dispose()
        log.info("inbound ledger closed")

    def on_failure(self, exception_type, exception_value, traceback) -> None:
        if self._intake is not None:
            # Nothing will be taken any more: let the source's network thread go.
            self._intake.close()
        if self._conn is not None:
            self._conn.close()

    # -- wiring -----------------------------------------------------------------------------

    def set_listener(self, listener: pykka.ActorRef) -> None:
        """The actor told `Committed` after each group commit (the PackActor)."""
        self._listener = listener
        self._release_held()

    # -- the inbound protocol ---------------------------------------------------------------

    def on_receive(self, message: object) -> None:
        if isinstance(message, Inbound):
            if self._failing is not None or self._backlog:
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
        elif isinstance(message, SessionStarted):
            if self._failing is not None or self._backlog:
                # After the packets before it: it may forget their QoS 2 packet ids.
                self._backlog.append((message, True))
                return
            try:
                self._apply(message)
            except _StorageFailed:
                pass
        elif isinstance(message, _RetryStorage):
            self._storage_timer = None
            self._drain()
        elif isinstance(message, _Drain):
            self._drain()
        elif isinstance(message, SessionEnded):
            pass
        elif isinstance(message, Pause):
            if message.reason not in self._pauses:
                log.warning("source paused (%s): holding acknowledgements", message.reason)
            self._pauses.add(message.reason)
        elif isinstance(message, Resume):
            self._pauses.discard(message.reason)
            if not self._pauses:
                held, self._held_acks = self._held_acks, []
                log.info("source resumed (%s): releasing %d held acks", message.reason, len(held))
                _send_acks(held)
                self._release_held()
        elif isinstance(message, _ReleaseHeld):
            self._release_held()
        elif isinstance(message, TakeReplays):
            # While storage fails the request files stay; the daemon hands them again each second.
            if self._failing is None and not self._backlog:
                try:
                    self._take_replays(message.data_dir)
                except _StorageFailed:
                    pass
        elif isinstance(message, StoreLocal):
            self._store_local(message)
        else:
            log.warning("inbound ledger ignored %r", message)

    def _taken(self, message: Inbound) -> None:
        if self._intake is not None:
            self._intake.taken(packet_size(message.packet))

    def _apply(self, message: object) -> None:
        """Apply one packet (or session start) in the open transaction; a storage fault on the
        way raises _StorageFailed after `_fail` has put the group back in the backlog."""
        group = self._group
        if group.counts_before is None:
            group.pubrel_before = dict(self._awaiting_pubrel)
            group.counts_before = {
                k: self.counts[k] for k in ("accepted", "duplicates", "unknown_pubrel")
            }
            group.last_seq_before = self._last_seq
        group.inputs.append(message)
        # Spelled out rather than `with self._storage()`: this runs once per message, and a
        # try that raises nothing costs nothing, a context manager a generator each time.
        try:
            if isinstance(message, SessionStarted):
                self._on_session(message)
            elif isinstance(message.packet, InboundPublish):
                self._on_publish(message.packet, message.acks)
            else:
                self._on_pubrel(message.packet, message.acks)
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
        if group.counts_before is not None:
            self._awaiting_pubrel = group.pubrel_before or {}
            self.counts.update(group.counts_before)
            self._last_seq = group.last_seq_before
        self._backlog.extendleft((m, True) for m in reversed(group.inputs))
        self._storage_counts["storage_failures"] += 1
        what = describe(error)
        if self._failing is None:
            self._failing_since = self._clock.monotonic()
            log.error(
                "inbound ledger cannot write %s: %s; acknowledgements stop (the broker holds "
                "the rest back at our Receive Maximum), the source connection stays, %d "
                "message(s) wait in memory, retrying with backoff",
                self._path,
                what,
                len(self._backlog),
            )
        self._failing = what
        self._schedule_storage_retry()

    def _rollback(self) -> None:
        assert self._conn is not None
        try:
            self._conn.rollback()
        except Exception as error:  # a connection in an unknown state: start a fresh one
            log.warning("inbound ledger rollback failed (%s): reconnecting", describe(error))
            try:
                self._conn.invalidate()
            except Exception:
                pass
            self._conn = self._engine.connect()
            self._hot_cursor = self._conn.connection.driver_connection.cursor()

    def _schedule_storage_retry(self) -> None:
        if self._storage_timer is None:
            delay = self._storage_backoff.next_delay()
            self._storage_timer = self._clock.call_later(delay, lambda: self._tell(_RetryStorage()))

    def _tell(self, message: object) -> None:
        try:
            self.actor_ref.tell(message)
        except pykka.ActorDeadError:
            pass

    def _defer(self, message: Inbound) -> None:
        packet = message.packet
        if self._failing is not None and isinstance(packet, InboundPublish) and packet.qos == 0:
            # No broker keeps a QoS 0 message for us and none limits their flow: holding them
            # would be unbounded. DESIGN §3.4 lets QoS 0 go, counted.
            self._storage_counts["dropped_qos0"] += 1
            self._taken(message)
            return
        # Not yet "taken": the intake gate counts it as waiting, and so bounds the backlog.
        self._backlog.append((message, False))

    def _drain(self, final: bool = False) -> None:
        """Store the backlog in order, a chunk per turn; on success, leave the failing state."""
        if self._storage_timer is not None and not final:
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
                self._tell(_Drain())
                return
            if self._failing is not None and not final:
                self._probe()
                self._recovered()
        except _StorageFailed:
            pass

    def _probe(self) -> None:
        """A tiny write that proves the storage takes writes again (the backlog may have held
        nothing that writes: the fault can come from an ask)."""
        with self._storage():
            self._hot(
                "INSERT INTO counters (name, value) VALUES ('storage_probe', ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (int(self._clock.wall()),),
            )
        self._commit()

    def _recovered(self) -> None:
        assert self._failing_since is not None
        seconds = self._clock.monotonic() - self._failing_since
        log.info(
            "inbound ledger writes again after %.1f s (it failed with: %s); acknowledgements "
            "resume, %d QoS 0 message(s) dropped so far",
            seconds,
            self._failing,
            self._storage_counts["dropped_qos0"],
        )
        self._failing = None
        self._failing_since = None
        self._storage_counts["storage_recoveries"] += 1
        self._storage_backoff.reset()
        self._release_held()

    def _refuse_while_failing(self) -> None:
        if self._failing is not None:
            raise StorageUnavailable(f"inbound ledger cannot write: {self._failing}")

    @contextmanager
    def _asked_write(self) -> Iterator[None]:
        """For asks that write: a storage fault goes back to the asker as StorageUnavailable."""
        self._refuse_while_failing()
        try:
            with self._storage():
                yield
        except _StorageFailed as failed:
            raise StorageUnavailable(
                f"inbound ledger cannot write: {self._failing}"
            ) from failed.__cause__

    def _on_publish(self, publish: InboundPublish, acks: AckSender) -> None:
        key = self._key(publish.topic, publish.payload)
        seq = self._insert(publish, key)
        if seq is None:
            self.counts["duplicates"] += 1
            log.debug("duplicate %s (packet %d, dup=%s)", key, publish.packet_id, publish.dup)
        if publish.qos == 2:
            if seq is None:
                seq = self._seq_of(key)
            previous = self._awaiting_pubrel.get(publish.packet_id)
            if previous is not None and previous[1] != key:
                # The broker reused the id for another message: the old exchange is over.
                self._set_packet_id(previous[0], None)
            self._set_packet_id(seq, publish.packet_id)
            self._awaiting_pubrel[publish.packet_id] = (seq, key)
            self._defer_ack(acks, publish.epoch, AckKind.PUBREC, publish.packet_id)
        elif publish.qos == 1:
            self._defer_ack(acks, publish.epoch, AckKind.PUBACK, publish.packet_id)
        else:
            self._schedule_flush()

    def _on_pubrel(self, pubrel: InboundPubrel, acks: AckSender) -> None:
        known = self._awaiting_pubrel.pop(pubrel.packet_id, None)
        if known is None:
            # Not ours: acknowledging lets the broker finish an exchange we have no record of
            # (it cannot be a message we lost: PUBREC left only after a commit).
            self.counts["unknown_pubrel"] += 1
            log.warning("PUBREL for packet id %d that the ledger never stored", pubrel.packet_id)
        else:
            crash_point("after_pubrec_before_pubrel")
            self._set_packet_id(known[0], None)
        self._defer_ack(acks, pubrel.epoch, AckKind.PUBCOMP, pubrel.packet_id)

    def _on_session(self, message: SessionStarted) -> None:
        if not message.session_present and self._awaiting_pubrel:
            log.warning(
                "broker session was not present: forgetting %d QoS 2 packet ids awaiting PUBREL "
                "(their messages are stored)",
                len(self._awaiting_pubrel),
            )
            for seq, _key in self._awaiting_pubrel.values():
                self._set_packet_id(seq, None)
            self._awaiting_pubrel.clear()
            self._commit()

    # -- the open transaction ---------------------------------------------------------------

    def _insert(self, publish: InboundPublish, key: str) -> int | None:
        assert self._conn is not None
        received = self._clock.wall()
        expires = None if publish.expiry_interval is None else received + publish.expiry_interval
        # A topic that was not UTF-8 (MQTT 5 §1.5.4 forbids it, a broker should refuse it) is
        # stored as decoded, with U+FFFD where its bytes were bad, and marked: it is acked like
        # any other and lands as an `invalid_topic` dead letter, never as reads or upstream.
        dead = None if publish.topic_valid_utf8 else INVALID_TOPIC
        cursor = self._hot(
            "INSERT INTO inbound (message_key, topic, payload, qos, received_time, expires_at, "
            "dead_reason) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (message_key) DO NOTHING",
            (key, publish.topic, publish.payload, publish.qos, received, expires, dead),
        )
        if cursor.rowcount == 0:
            return None
        seq = cursor.lastrowid
        self._last_seq = seq
        self._group.records.append(
            LedgerRecord(
                seq, key, publish.topic, publish.payload, publish.qos, received, None, dead, expires
            )
        )
        self.counts["accepted"] += 1
        return seq

    def _hot(self, sql: str, params: tuple) -> sqlite3.Cursor:
        """A per-message statement, straight on sqlite3 inside SQLAlchemy's transaction."""
        assert self._conn is not None
        if not self._conn.in_transaction():
            # So that SQLAlchemy's commit() commits what the raw cursor wrote.
            self._conn.begin()
        cursor = self._hot_cursor
        cursor.execute(sql, params)
        return cursor

    def _take_replays(self, data_dir: Path) -> None:
        """Each request's messages as new rows under replay keys, committed before the request
        file goes: taking a file twice (a crash in between) stores nothing twice."""
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
                    if self._insert(publish, replay_key(m.message_key, request)) is not None:
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

    def _seq_of(self, key: str) -> int:
        (seq,) = self._hot("SELECT seq FROM inbound WHERE message_key = ?", (key,)).fetchone()
        return seq

    def _set_packet_id(self, seq: int, packet_id: int | None) -> None:
        self._hot("UPDATE inbound SET packet_id = ? WHERE seq = ?", (packet_id, seq))

    def _defer_ack(self, acks: AckSender, epoch: int, kind: AckKind, packet_id: int) -> None:
        self._group.acks.append((acks, epoch, kind, packet_id))
        if len(self._group) >= self._group_max:
            self._commit()
        else:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_pending:
            return
        self._flush_pending = True
        if self._group_delay <= 0:
            # Queued behind every packet already in the mailbox: the group is whatever arrived.
            self.actor_ref.tell(_Flush())
        else:
            self._flush_timer = self._clock.call_later(
                self._group_delay, lambda: self._tell(_Flush())
            )

    def _commit(self) -> None:
        """Commit the open transaction, then release what waited for it: acks, then records.
        A storage fault raises _StorageFailed, the group back in the backlog (`_fail`)."""
        assert self._conn is not None
        with self._storage():
            self._conn.commit()
        group, self._group = self._group, _Group()
        if not group.acks and not group.records:
            return
        self.counts["commits"] += 1
        if group.acks:
            crash_point("after_ledger_commit_before_ack")
        if self._pauses:
            # Committed, so safe; unacknowledged, so the broker sends no more than its window.
            self._held_acks.extend(group.acks)
        else:
            _send_acks(group.acks)
        if group.records:
            if self._held_from is None and not self._pauses and self._listener is not None:
                self._hand_on(tuple(group.records))
            elif self._held_from is None:
                self._held_from = group.records[0].seq
                log.info("holding committed rows from seq %d in the ledger", self._held_from)

    def _hand_on(self, records: tuple[LedgerRecord, ...]) -> None:
        assert self._listener is not None
        try:
            self._listener.tell(Committed(records))
        except pykka.ActorDeadError:
            # Shutting down: the rows are committed and the next start packs them.
            log.info("%d committed message(s) left for the next start", len(records))

    def _release_held(self) -> None:
        """Hand held rows on, oldest first, one chunk per message while nothing pauses us."""
        if self._held_from is None or self._pauses or self._listener is None:
            return
        if self._failing is not None or self._backlog:
            return  # `_recovered` comes back here
        # Rows of the open transaction are visible to this connection: commit them first, so
        # that a row is read back here or handed on by _commit, never both.
        try:
            self._commit()
        except _StorageFailed:
            return
        c = db.inbound.c
        records = self._records(
            (c.seq >= self._held_from) & c.batch_id.is_(None) & c.landed_time.is_(None),
            limit=RELEASE_CHUNK,
        )
        if records:
            self._hand_on(records)
        if len(records) < RELEASE_CHUNK:
            log.info("held rows handed on up to seq %d", self._last_seq)
            self._held_from = None
        else:
            self._held_from = records[-1].seq + 1
            self.actor_ref.tell(_ReleaseHeld())

    # -- batches (asked by the Spark writer) ------------------------------------------------

    def recovery(self) -> Recovery:
        assert self._conn is not None
        self._commit()
        open_batches = []
        for (batch_id,) in self._conn.execute(
            select(db.batches.c.batch_id)
            .where(db.batches.c.state == "writing")
            .order_by(db.batches.c.batch_id)
        ):
            open_batches.append((batch_id, self._records(db.inbound.c.batch_id == batch_id)))
        c = db.inbound.c
        loose_where = c.batch_id.is_(None) & c.landed_time.is_(None)
        first_loose, loose = self._conn.execute(
            select(func.min(c.seq), func.count()).where(loose_where)
        ).one()
        self._held_from = first_loose
        self._last_seq = self._conn.execute(select(func.max(c.seq))).scalar() or 0
        next_pack_id = self._counter(PACK_COUNTER) + 1
        self._conn.commit()
        if open_batches or loose:
            log.info(
                "recovery: %d unfinished batch(es) to replay, %d stored message(s) to pack",
                len(open_batches),
                loose,
            )
        return Recovery(tuple(open_batches), loose, next_pack_id)

    def _records(self, where, limit: int | None = None) -> tuple[LedgerRecord, ...]:
        assert self._conn is not None
        c = db.inbound.c
        rows = self._conn.execute(
            select(
                c.seq,
                c.message_key,
                c.topic,
                c.payload,
                c.qos,
                c.received_time,
                c.pack_id,
                c.dead_reason,
                c.expires_at,
            )
            .where(where)
            .order_by(c.seq)
            .limit(limit)
        )
        return tuple(LedgerRecord(*row) for row in rows)

    def records(self, seqs: Sequence[int]) -> tuple[LedgerRecord, ...]:
        """Stored rows by seq, in seq order: how tier 1 is read back by the forwarder."""
        return self._records(db.inbound.c.seq.in_(list(seqs)))

    def _counter(self, name: str) -> int:
        assert self._conn is not None
        value = self._conn.exec_driver_sql(
            "SELECT value FROM counters WHERE name = ?", (name,)
        ).scalar()
        return int(value or 0)

    def begin_batch(
        self,
        packs: Sequence[tuple[int, Sequence[int]]],
        dead: Sequence[tuple[int, str]] = (),
    ) -> int:
        """Record a batch and the packs (pack id, row seqs) it holds, before its Spark job, with
        the (seq, reason) of messages forwarding gave up on, so a replay rebuilds the same
        dead letters."""
        with self._asked_write():
            return self._begin_batch(packs, dead)

    def _begin_batch(
        self,
        packs: Sequence[tuple[int, Sequence[int]]],
        dead: Sequence[tuple[int, str]],
    ) -> int:
        assert self._conn is not None
        seqs = sum(len(s) for _, s in packs)
        result = self._conn.execute(
            db.batches.insert().values(
                state="writing", started_time=self._clock.wall(), messages=seqs
            )
        )
        batch_id = result.inserted_primary_key[0]
        # A pack's seqs are nearly always one run (arrival order): one statement per run, not
        # per row, keeps the ledger thread (and so ingest) from stalling on a 20,000-row batch.
        self._conn.exec_driver_sql(
            "UPDATE inbound SET pack_id = ?, batch_id = ? WHERE seq BETWEEN ? AND ?",
            [
                (pack_id, batch_id, first, last)
                for pack_id, pack_seqs in packs
                for first, last in seq_runs(pack_seqs)
            ],
        )
        if dead:
            self._conn.exec_driver_sql(
                "UPDATE inbound SET dead_reason = ? WHERE seq = ?",
                [(reason, seq) for seq, reason in dead],
            )
        self._conn.exec_driver_sql(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)",
            (PACK_COUNTER, max(pack_id for pack_id, _ in packs)),
        )
        self._commit()
        return batch_id

    def claim_reads(self, batch_id: int, read_ids: Sequence[str]) -> set[str]:
        """Claim read ids for a batch; returns those the batch owns (new, or claimed by an
        earlier attempt of the same batch). Used with payload-field keys only."""
        with self._asked_write():
            return self._claim_reads(batch_id, read_ids)

    def _claim_reads(self, batch_id: int, read_ids: Sequence[str]) -> set[str]:
        assert self._conn is not None
        now = self._clock.wall()
        self._conn.exec_driver_sql(
            "INSERT INTO read_claims (message_id, batch_id, claimed_time) VALUES (?, ?, ?) "
            "ON CONFLICT (message_id) DO NOTHING",
            [(read_id, batch_id, now) for read_id in read_ids],
        )
        owned = {
            row[0]
            for row in self._conn.exec_driver_sql(
                "SELECT message_id FROM read_claims WHERE batch_id = ?", (batch_id,)
            )
        }
        self._commit()
        return owned

    def commit_batch(self, batch_id: int, rows: int, dead_letters: int) -> None:
        """The batch is in the tables: mark it, drop its payloads, prune old landed keys."""
        with self._asked_write():
            self._commit_batch(batch_id, rows, dead_letters)

    def _commit_batch(self, batch_id: int, rows: int, dead_letters: int) -> None:
        assert self._conn is not None
        now = self._clock.wall()
        self._conn.exec_driver_sql(
            "UPDATE batches SET state = 'committed', committed_time = ?, rows = ?, "
            "dead_letters = ? WHERE batch_id = ?",
            (now, rows, dead_letters, batch_id),
        )
        self._conn.exec_driver_sql(
            "UPDATE inbound SET payload = NULL, landed_time = ? WHERE batch_id = ?",
            (now, batch_id),
        )
        self._conn.exec_driver_sql(
            "DELETE FROM inbound WHERE landed_time < ? AND packet_id IS NULL",
            (now - self._retention,),
        )
        self._conn.exec_driver_sql(
            "DELETE FROM read_claims WHERE claimed_time < ?", (now - self._retention,)
        )
        self._commit()

    # -- status -----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        assert self._conn is not None
        try:
            pending = self._conn.exec_driver_sql(
                "SELECT count(*) FROM inbound WHERE landed_time IS NULL"
            ).scalar_one()
        except Exception as error:
            if not is_storage_fault(error):
                raise
            pending = None  # unreadable now; the storage fields below say why
        return {
            **self.counts,
            **self._storage_counts,
            "pending": pending,
            "awaiting_pubrel": len(self._awaiting_pubrel),
            "held_acks": len(self._held_acks),
            "held_rows": 0 if self._held_from is None else self._last_seq - self._held_from + 1,
            "paused_by": sorted(self._pauses),
            # Set while writes fail: the error, for how long, and what waits in memory.
            "storage_error": self._failing,
            "storage_failing_seconds": None
            if self._failing_since is None
            else round(self._clock.monotonic() - self._failing_since, 3),
            "storage_backlog": len(self._backlog),
        }
