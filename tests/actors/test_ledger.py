import logging
import sqlite3
import threading

import pykka
import pytest

from actors import ledger as ledger_actor
from actors.clock import SimulatedClock
from actors.ledger import InboundLedger
from actors.messages import (
    Committed,
    Forwarded,
    ForwardRecorded,
    Grant,
    Inbound,
    InboundBurst,
    SessionStarted,
)
from actors.mqtt.client import AckKind, AckSender, InboundPublish, InboundPubrel
from actors.mqtt.intake import IntakeGate
from persistence import ledger_store
from persistence.keys import message_key
from persistence.records import TABLE, UPSTREAM
from tests.harness.checks import wait_until

TOPIC = "zebra/fx/fx9600-01/reads"


def publish(packet_id, payload, qos=1, dup=False, epoch=1, topic=TOPIC):
    return InboundPublish(
        epoch=epoch,
        packet_id=packet_id,
        qos=qos,
        dup=dup,
        retain=False,
        topic=topic,
        topic_valid_utf8=True,
        payload=payload,
        expiry_interval=None,
        received_monotonic=0.0,
    )


class Acks(AckSender):
    """Records every ack, (kind, packet id), in the order sent."""

    def __init__(self):
        self.acks = []
        self.cond = threading.Condition()

    def send_ack(self, epoch, kind, packet_id):
        with self.cond:
            self.acks.append((kind, packet_id))
            self.cond.notify_all()
        return True

    def wait_for(self, count, timeout=10):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.acks) >= count, timeout), self.acks
            return list(self.acks)


class RecordingAcks(Acks):
    """Records every ack and, at the moment it is sent, what another connection sees in the DB."""

    def __init__(self, db_path):
        super().__init__()
        self.db_path = db_path
        self.visible_at_ack = []

    def send_ack(self, epoch, kind, packet_id):
        with sqlite3.connect(self.db_path) as other:
            rows = other.execute("SELECT message_key, packet_id FROM inbound").fetchall()
        # One hold of the (reentrant) lock: a waiter that sees the ack sees what was visible too.
        with self.cond:
            self.visible_at_ack.append(dict(rows))
            return super().send_ack(epoch, kind, packet_id)


class Listener:
    """A sink's feed target: records every Committed it is told."""

    def __init__(self):
        self.records = []
        self.told = []
        self.cond = threading.Condition()

    def tell(self, message):
        with self.cond:
            self.told.append(message)
            if isinstance(message, Committed):
                self.records.extend(message.records)
            self.cond.notify_all()

    def wait_for(self, count, timeout=5):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.records) >= count, timeout), self.records
            return list(self.records)


def listen(ledger, sink=TABLE, credit=10_000):
    """A listener wired to `sink`'s feed, with `credit` messages (and bytes enough)."""
    listener = Listener()
    wire = ledger.proxy().set_listener if sink == TABLE else ledger.proxy().set_forwarder
    wire(listener).get(timeout=5)
    if credit:
        ledger.tell(Grant(sink, credit, 10**9))
    return listener


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def start_ledger(db_path):
    started = []

    def start(clock=None, **options):
        options.setdefault("group_commit_max_delay", 0.0)
        ref = InboundLedger.start(db_path, clock or SimulatedClock(), **options)
        started.append(ref)
        return ref

    yield start
    for ref in started:
        if ref.is_alive():
            ref.stop()


def rows(db_path):
    with sqlite3.connect(db_path) as conn:
        return conn.execute(
            "SELECT message_key, packet_id, payload FROM inbound "
            "LEFT JOIN payloads USING (seq) ORDER BY seq"
        ).fetchall()


def test_qos1_puback_leaves_only_after_the_row_is_committed(start_ledger, db_path):
    ledger = start_ledger()
    acks = RecordingAcks(db_path)
    for pid in (1, 2, 3):
        ledger.tell(Inbound(publish(pid, f'{{"n": {pid}}}'.encode()), acks))
    assert acks.wait_for(3) == [(AckKind.PUBACK, 1), (AckKind.PUBACK, 2), (AckKind.PUBACK, 3)]
    for pid, visible in zip((1, 2, 3), acks.visible_at_ack, strict=True):
        assert message_key(TOPIC, f'{{"n": {pid}}}'.encode()) in visible


def test_a_hand_over_of_packets_is_stored_and_acked_as_if_each_came_alone(start_ledger, db_path):
    clock = SimulatedClock()
    intake = IntakeGate(1000, 1_000_000, clock.monotonic)
    ledger = start_ledger(clock, intake=intake)
    acks = RecordingAcks(db_path)
    packets = (
        publish(1, b"one"),
        publish(2, b"two", qos=2),
        publish(1, b"one", dup=True),  # a redelivery inside the same hand-over
        InboundPubrel(epoch=1, packet_id=2),
        publish(0, b"zero", qos=0),
    )
    intake.admit(sum(len(getattr(p, "payload", b"")) for p in packets), len(packets))
    ledger.tell(InboundBurst(packets, acks))
    assert acks.wait_for(4) == [
        (AckKind.PUBACK, 1),
        (AckKind.PUBREC, 2),
        (AckKind.PUBACK, 1),
        (AckKind.PUBCOMP, 2),
    ]
    assert [(key, pid) for key, pid, _ in rows(db_path)] == [
        (message_key(TOPIC, b"one"), None),
        (message_key(TOPIC, b"two"), None),
        (message_key(TOPIC, b"zero"), None),
    ]
    counts = ledger.proxy().stats().get(timeout=5)
    assert (counts["accepted"], counts["duplicates"]) == (3, 1)
    assert intake.stats().waiting_messages == 0 and intake.stats().waiting_bytes == 0


def test_qos2_pubrec_leaves_only_after_the_row_and_its_packet_id_are_committed(
    start_ledger, db_path
):
    ledger = start_ledger()
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(42, b"read", qos=2), acks))
    assert acks.wait_for(1) == [(AckKind.PUBREC, 42)]
    assert acks.visible_at_ack[0] == {message_key(TOPIC, b"read"): 42}


def test_qos2_pubcomp_waits_for_no_commit_and_the_release_is_recorded_a_delay_later(
    start_ledger, db_path
):
    clock = SimulatedClock()
    ledger = start_ledger(clock)
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(42, b"read", qos=2), acks))
    acks.wait_for(1)
    commits = ledger.proxy().stats().get(timeout=5)["commits"]
    ledger.tell(Inbound(InboundPubrel(epoch=1, packet_id=42), acks))
    assert acks.wait_for(2)[1] == (AckKind.PUBCOMP, 42)
    # Answered before anything was committed: the row still carries the id.
    assert acks.visible_at_ack[1] == {message_key(TOPIC, b"read"): 42}
    stats = ledger.proxy().stats().get(timeout=5)
    assert (stats["commits"], stats["awaiting_pubrel"], stats["releases_unrecorded"]) == (
        commits,
        0,
        1,
    )
    assert clock.wait_for_timers(1)
    clock.advance(ledger_actor.RELEASE_DELAY)
    assert wait_until(lambda: [r[1] for r in rows(db_path)] == [None])
    assert ledger.proxy().stats().get(timeout=5)["releases_unrecorded"] == 0


def test_a_release_is_recorded_by_the_next_commit_that_stores_a_message(start_ledger, db_path):
    clock = SimulatedClock()
    ledger = start_ledger(clock)
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(42, b"read", qos=2), acks))
    ledger.tell(Inbound(InboundPubrel(epoch=1, packet_id=42), acks))
    ledger.tell(Inbound(publish(43, b"next", qos=2), acks))
    assert acks.wait_for(3) == [
        (AckKind.PUBREC, 42),
        (AckKind.PUBCOMP, 42),
        (AckKind.PUBREC, 43),
    ]
    # The clock never moved: the PUBREC's commit took the release with it.
    assert acks.visible_at_ack[2] == {
        message_key(TOPIC, b"read"): None,
        message_key(TOPIC, b"next"): 43,
    }


def test_a_release_a_crash_lost_leaves_the_id_that_a_new_message_then_takes(start_ledger, db_path):
    """The broker finished the exchange (it had our PUBCOMP) but the release was never
    recorded: the restarted ledger still thinks the id awaits a PUBREL. The broker's next
    message under that id is another message, stored as one, not taken for a re-send."""
    first = start_ledger()
    acks = RecordingAcks(db_path)
    first.tell(Inbound(publish(5, b"old", qos=2), acks))
    acks.wait_for(1)
    first.stop()  # as a kill after the PUBCOMP would leave it: the id still on the row

    second = start_ledger()
    assert second.proxy().stats().get(timeout=5)["awaiting_pubrel"] == 1
    second.tell(Inbound(publish(5, b"new", qos=2, epoch=2), acks))
    assert acks.wait_for(2)[1] == (AckKind.PUBREC, 5)
    assert [r[:2] for r in rows(db_path)] == [
        (message_key(TOPIC, b"old"), None),
        (message_key(TOPIC, b"new"), 5),
    ]
    stats = second.proxy().stats().get(timeout=5)
    assert (stats["accepted"], stats["duplicates"], stats["awaiting_pubrel"]) == (1, 0, 1)


def test_a_redelivered_qos1_message_is_acked_again_without_a_second_row(start_ledger, db_path):
    ledger = start_ledger()
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(7, b"same"), acks))
    ledger.tell(Inbound(publish(7, b"same", dup=True), acks))
    assert acks.wait_for(2) == [(AckKind.PUBACK, 7), (AckKind.PUBACK, 7)]
    assert len(rows(db_path)) == 1
    assert ledger.proxy().stats().get(timeout=5)["duplicates"] == 1


def test_a_resent_qos2_publish_gets_pubrec_again_and_one_row(start_ledger, db_path):
    ledger = start_ledger()
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(9, b"q2", qos=2), acks))
    ledger.tell(Inbound(publish(9, b"q2", qos=2, dup=True), acks))
    ledger.tell(Inbound(InboundPubrel(1, 9), acks))
    assert acks.wait_for(3) == [(AckKind.PUBREC, 9), (AckKind.PUBREC, 9), (AckKind.PUBCOMP, 9)]
    assert rows(db_path) == [(message_key(TOPIC, b"q2"), None, b"q2")]


def test_a_restarted_ledger_still_knows_the_qos2_exchanges_awaiting_pubrel(start_ledger, db_path):
    first = start_ledger()
    acks = RecordingAcks(db_path)
    first.tell(Inbound(publish(11, b"in flight", qos=2), acks))
    acks.wait_for(1)
    first.stop()

    second = start_ledger()
    assert second.proxy().stats().get(timeout=5)["awaiting_pubrel"] == 1
    second.tell(Inbound(InboundPubrel(2, 11), acks))
    assert acks.wait_for(2)[1] == (AckKind.PUBCOMP, 11)
    stats = second.proxy().stats().get(timeout=5)
    assert stats["unknown_pubrel"] == 0
    assert stats["awaiting_pubrel"] == 0


def test_a_pubrel_for_an_unknown_packet_id_is_counted_and_still_completed(start_ledger, db_path):
    ledger = start_ledger()
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(InboundPubrel(1, 99), acks))
    assert acks.wait_for(1) == [(AckKind.PUBCOMP, 99)]
    assert ledger.proxy().stats().get(timeout=5)["unknown_pubrel"] == 1


def test_a_lost_broker_session_clears_the_packet_ids_so_a_reused_id_is_a_new_message(
    start_ledger, db_path
):
    ledger = start_ledger()
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(5, b"old", qos=2), acks))
    acks.wait_for(1)
    ledger.tell(SessionStarted(epoch=2, session_present=False))
    ledger.tell(Inbound(publish(5, b"new", qos=2, epoch=2), acks))
    acks.wait_for(2)
    assert [r[:2] for r in rows(db_path)] == [
        (message_key(TOPIC, b"old"), None),
        (message_key(TOPIC, b"new"), 5),
    ]


def test_acks_wait_for_the_group_commit_timer_on_the_clock(start_ledger, db_path):
    clock = SimulatedClock()
    ledger = start_ledger(clock, group_commit_max_delay=0.005, group_commit_max_messages=100)
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(1, b"a"), acks))
    ledger.tell(Inbound(publish(2, b"b"), acks))
    assert clock.wait_for_timers(1)
    ledger.proxy().counts.get(timeout=5)  # both publishes handled
    assert acks.acks == []
    assert rows(db_path) == []  # nothing committed yet
    clock.advance(0.005)
    assert acks.wait_for(2) == [(AckKind.PUBACK, 1), (AckKind.PUBACK, 2)]
    assert ledger.proxy().counts.get(timeout=5)["commits"] == 1


def test_a_burst_that_is_over_commits_at_once_without_waiting_for_the_timer(start_ledger, db_path):
    """A broker with a window of 1 sends nothing more until we ack: waiting out the group timer
    made every message wait the whole delay (5,000 reads took 29.7 s, issue 25)."""
    clock = SimulatedClock()
    started = clock.monotonic()
    ledger = start_ledger(clock, group_commit_max_delay=10.0, group_commit_max_messages=100)
    acks = RecordingAcks(db_path)
    ledger.tell(InboundBurst((publish(1, b"a"),), acks, over=False))
    assert clock.wait_for_timers(1)  # mid-burst: the group waits for the rest
    assert acks.acks == []
    ledger.tell(InboundBurst((publish(2, b"b", qos=2),), acks, over=True))
    assert acks.wait_for(2) == [(AckKind.PUBACK, 1), (AckKind.PUBREC, 2)]
    ledger.tell(InboundBurst((InboundPubrel(epoch=1, packet_id=2),), acks, over=True))
    assert acks.wait_for(3)[-1] == (AckKind.PUBCOMP, 2)
    # An empty burst end (its packets came in earlier hand-overs) commits what they left.
    ledger.tell(InboundBurst((publish(3, b"c"),), acks, over=False))
    ledger.tell(InboundBurst((), acks, over=True))
    assert acks.wait_for(4)[-1] == (AckKind.PUBACK, 3)
    # Two: the PUBREL's burst was answered without one (its release went with the third).
    assert ledger.proxy().counts.get(timeout=5)["commits"] == 2
    assert clock.monotonic() == started  # the clock never moved: no timer was waited for


def test_a_full_group_commits_without_waiting_for_the_timer(start_ledger, db_path):
    clock = SimulatedClock()
    ledger = start_ledger(clock, group_commit_max_delay=10.0, group_commit_max_messages=3)
    acks = RecordingAcks(db_path)
    for pid in (1, 2, 3):
        ledger.tell(Inbound(publish(pid, bytes([pid])), acks))
    assert len(acks.wait_for(3)) == 3


def test_the_listener_gets_new_rows_in_arrival_order_and_no_duplicates(start_ledger, db_path):
    ledger = start_ledger()
    listener = listen(ledger)
    acks = RecordingAcks(db_path)
    for pid, payload in [(1, b"x"), (2, b"y"), (3, b"x"), (4, b"z")]:
        ledger.tell(Inbound(publish(pid, payload), acks))
    acks.wait_for(4)
    with listener.cond:
        assert listener.cond.wait_for(lambda: len(listener.records) >= 3, 5)
    assert [r.payload for r in listener.records] == [b"x", b"y", b"z"]
    assert [r.seq for r in listener.records] == sorted(r.seq for r in listener.records)


def test_recovery_replays_open_batches_and_repacks_loose_rows(start_ledger, db_path):
    ledger = start_ledger()
    acks = RecordingAcks(db_path)
    for pid in range(1, 6):
        ledger.tell(Inbound(publish(pid, bytes([pid])), acks))
    acks.wait_for(5)
    proxy = ledger.proxy()
    landed = proxy.begin_batch([(1, [1, 2])]).get(timeout=5)
    proxy.commit_batch(landed, 2, 0).get(timeout=5)
    open_batch = proxy.begin_batch([(2, [3]), (3, [4])]).get(timeout=5)
    ledger.stop()

    restarted = start_ledger()
    recovery = restarted.proxy().recovery().get(timeout=5)
    assert [(b, [r.seq for r in recs]) for b, recs in recovery.open_batches] == [
        (open_batch, [3, 4])
    ]
    assert [r.pack_id for r in recovery.open_batches[0][1]] == [2, 3]
    assert recovery.loose == 1
    assert recovery.next_pack_id == 4
    # The loose row goes to the listener once there is one, read back from the database.
    listener = listen(restarted)
    with listener.cond:
        assert listener.cond.wait_for(lambda: listener.records, 5)
    assert [r.seq for r in listener.records] == [5]


def test_a_landed_batch_drops_its_payloads_but_keeps_keys_to_refuse_redeliveries(
    start_ledger, db_path
):
    ledger = start_ledger()
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(1, b"landed"), acks))
    acks.wait_for(1)
    proxy = ledger.proxy()
    proxy.commit_batch(proxy.begin_batch([(1, [1])]).get(timeout=5), 1, 0).get(timeout=5)
    assert rows(db_path) == [(message_key(TOPIC, b"landed"), None, None)]
    ledger.tell(Inbound(publish(1, b"landed", dup=True), acks))
    acks.wait_for(2)
    assert len(rows(db_path)) == 1


def test_landed_keys_are_pruned_after_the_retention_on_the_clock(start_ledger, db_path):
    clock = SimulatedClock()
    ledger = start_ledger(clock, retention_seconds=100.0)
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(1, b"old"), acks))
    acks.wait_for(1)
    proxy = ledger.proxy()
    proxy.commit_batch(proxy.begin_batch([(1, [1])]).get(timeout=5), 1, 0).get(timeout=5)
    clock.advance(101)
    ledger.tell(Inbound(publish(2, b"new"), acks))
    acks.wait_for(2)
    proxy.commit_batch(proxy.begin_batch([(2, [2])]).get(timeout=5), 1, 0).get(timeout=5)
    assert [r[0] for r in rows(db_path)] == [message_key(TOPIC, b"new")]


@pytest.mark.parametrize(("durability", "level"), [("process", 1), ("power", 2)])
def test_durability_setting_chooses_the_sqlite_synchronous_level(db_path, durability, level):
    from persistence.database import open_engine

    engine = open_engine(db_path, durability)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == level
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()


def test_received_time_is_the_injected_clocks_wall_time(start_ledger, db_path):
    # Not time.time(): freezegun cannot freeze it on an actor thread, where pykka (on its
    # ignore list, DESIGN §6) is always within the frames freezegun inspects.
    clock = SimulatedClock(start_monotonic=0.0, start_wall=1_795_248_000.0)
    ledger = start_ledger(clock)
    listener = listen(ledger)
    clock.advance(2.5)
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(1, b"t"), acks))
    acks.wait_for(1)
    with listener.cond:
        assert listener.cond.wait_for(lambda: listener.records, 5)
    assert listener.records[0].received_time == 1_795_248_002.5


def test_asking_a_stopped_ledger_fails_loudly(start_ledger):
    ledger = start_ledger()
    proxy = ledger.proxy()
    ledger.stop()
    with pytest.raises(pykka.ActorDeadError):
        proxy.stats().get(timeout=5)


def test_read_claims_give_each_read_id_to_one_batch_and_the_same_answer_on_replay(start_ledger):
    proxy = start_ledger().proxy()
    assert proxy.claim_reads(1, ["a", "b"]).get(timeout=5) == {"a", "b"}
    assert proxy.claim_reads(2, ["b", "c"]).get(timeout=5) == {"c"}
    # A replay of batch 1 after a crash owns exactly what it owned the first time.
    assert proxy.claim_reads(1, ["a", "b"]).get(timeout=5) == {"a", "b"}


def test_a_dup0_publish_reusing_a_qos1_packet_id_is_a_new_message(start_ledger, db_path):
    ledger = start_ledger()
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(3, b"first"), acks))
    ledger.tell(Inbound(publish(3, b"second", dup=False), acks))
    assert acks.wait_for(2) == [(AckKind.PUBACK, 3), (AckKind.PUBACK, 3)]
    assert [r[2] for r in rows(db_path)] == [b"first", b"second"]


def test_rows_wait_in_the_ledger_without_credit_and_come_back_in_order_with_it(
    start_ledger, db_path, monkeypatch
):
    """A sink that grants nothing (Spark failing, the upstream away) holds up neither the source
    nor the other sink: every message is acknowledged once stored, and what the sink cannot
    take waits on disk, read back in seq order, a chunk per turn, once it grants credit."""
    monkeypatch.setattr(ledger_actor, "READ_BACK_CHUNK", 3)
    ledger = start_ledger()
    listener = listen(ledger, credit=1)
    acks = RecordingAcks(db_path)
    for pid in range(1, 12):
        ledger.tell(Inbound(publish(pid, b"m%d" % pid), acks))
    assert len(acks.wait_for(11)) == 11  # the source is acknowledged all the same
    assert [r.payload for r in listener.wait_for(1)] == [b"m1"]
    stats = ledger.proxy().stats().get(timeout=5)
    assert stats["feeds"]["table"]["behind_from"] == 2
    assert stats["lag"]["table"]["messages"] == 11
    assert [r.payload for r in listener.records] == [b"m1"]

    ledger.tell(Grant(TABLE, 100, 10**9))
    ledger.tell(Inbound(publish(12, b"after"), acks))
    got = listener.wait_for(12)
    assert [r.payload for r in got] == [b"m%d" % pid for pid in range(1, 12)] + [b"after"]
    # Read back in chunks of three (the last one may hold the newest too), then caught up.
    sizes = [len(m.records) for m in listener.told if isinstance(m, Committed)]
    assert sizes[1:4] == [3, 3, 3] and all(size <= 3 for size in sizes[4:])
    assert ledger.proxy().stats().get(timeout=5)["feeds"]["table"]["behind_from"] is None


def test_a_byte_credit_stops_the_feed_after_the_record_that_spends_it(start_ledger, db_path):
    ledger = start_ledger()
    listener = Listener()
    ledger.proxy().set_listener(listener).get(timeout=5)
    ledger.tell(Grant(TABLE, 100, 5))
    acks = RecordingAcks(db_path)
    for pid in range(1, 5):
        ledger.tell(Inbound(publish(pid, b"abc%d" % pid), acks))
    acks.wait_for(4)
    # 4 bytes each: the second spends the last byte (one payload may overshoot), the rest wait.
    assert [r.payload for r in listener.wait_for(2)] == [b"abc1", b"abc2"]
    ledger.proxy().stats().get(timeout=5)
    assert len(listener.records) == 2


def test_rows_no_sink_took_are_left_for_the_next_start_if_the_daemon_stops(start_ledger, db_path):
    ledger = start_ledger()
    listener = listen(ledger, credit=0)
    acks = RecordingAcks(db_path)
    for pid in range(1, 4):
        ledger.tell(Inbound(publish(pid, b"m%d" % pid), acks))
    acks.wait_for(3)
    ledger.stop()
    assert listener.records == []

    restarted = start_ledger()
    assert restarted.proxy().recovery().get(timeout=5).loose == 3
    again = listen(restarted)
    assert [r.payload for r in again.wait_for(3)] == [b"m1", b"m2", b"m3"]


def forwarding_ledger(start_ledger, **options):
    """A ledger that forwards every topic but `zebra/local/...`."""
    return start_ledger(forward_topic=lambda topic: not topic.startswith("zebra/local/"), **options)


def test_each_sink_gets_the_rows_it_owes_on_its_own_feed(start_ledger, db_path):
    ledger = forwarding_ledger(start_ledger)
    table, upstream = listen(ledger, TABLE), listen(ledger, UPSTREAM)
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(1, b"routed"), acks))
    ledger.tell(Inbound(publish(2, b"local", topic="zebra/local/x/reads"), acks))
    acks.wait_for(2)
    assert [r.payload for r in table.wait_for(2)] == [b"routed", b"local"]
    assert [r.payload for r in upstream.wait_for(1)] == [b"routed"]
    ledger.proxy().stats().get(timeout=5)
    assert len(upstream.records) == 1
    assert [(r.to_table, r.to_upstream) for r in table.records] == [(True, True), (True, False)]


def test_a_payload_goes_only_when_the_table_and_the_upstream_are_both_done(start_ledger, db_path):
    ledger = forwarding_ledger(start_ledger)
    listen(ledger, TABLE)
    acks = RecordingAcks(db_path)
    for pid in (1, 2):
        ledger.tell(Inbound(publish(pid, b"m%d" % pid), acks))
    acks.wait_for(2)
    proxy = ledger.proxy()
    proxy.commit_batch(proxy.begin_batch([(1, [1, 2])]).get(timeout=5), 2, 0).get(timeout=5)
    # Landed, but still owed upstream: the payloads stay.
    assert [r[2] for r in rows(db_path)] == [b"m1", b"m2"]
    outbound = Listener()
    ledger.tell(Forwarded((1,), (), outbound))
    assert wait_until(lambda: [r[2] for r in rows(db_path)] == [None, b"m2"], 5)
    with outbound.cond:
        assert outbound.cond.wait_for(lambda: outbound.told, 5)
    assert outbound.told == [ForwardRecorded((1,))]
    lag = proxy.stats().get(timeout=5)["lag"]
    assert (lag["table"]["messages"], lag["upstream"]["messages"]) == (0, 1)


def test_forwarded_first_and_landed_later_drops_the_payload_at_the_landing(start_ledger, db_path):
    ledger = forwarding_ledger(start_ledger)
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(1, b"m1"), acks))
    acks.wait_for(1)
    ledger.tell(Forwarded((1,)))
    proxy = ledger.proxy()
    proxy.stats().get(timeout=5)
    assert [r[2] for r in rows(db_path)] == [b"m1"]  # the table still owes it
    proxy.commit_batch(proxy.begin_batch([(1, [1])]).get(timeout=5), 1, 0).get(timeout=5)
    assert [r[2] for r in rows(db_path)] == [None]


def test_an_upstream_dead_letter_becomes_a_row_for_the_table_once_even_if_reported_twice(
    start_ledger, db_path
):
    ledger = forwarding_ledger(start_ledger)
    table = listen(ledger, TABLE)
    acks = RecordingAcks(db_path)
    ledger.tell(Inbound(publish(1, b"gave up"), acks))
    acks.wait_for(1)
    ledger.tell(Forwarded((), ((1, "forward_failed"),)))
    ledger.tell(Forwarded((), ((1, "forward_failed"),)))  # again, after a restart of the sender
    read, dead = table.wait_for(2)
    assert (read.dead_reason, read.to_table) == (None, True)
    assert (dead.dead_reason, dead.dead_sink, dead.payload) == (
        "forward_failed",
        "upstream",
        b"gave up",
    )
    assert (dead.to_table, dead.to_upstream) == (True, False)
    assert dead.message_key == message_key(TOPIC, b"gave up") + "/upstream"
    ledger.proxy().stats().get(timeout=5)
    assert len(rows(db_path)) == 2 and len(table.records) == 2


def test_without_forwarding_a_start_clears_what_an_earlier_run_owed_upstream(start_ledger, db_path):
    first = forwarding_ledger(start_ledger)
    acks = RecordingAcks(db_path)
    first.tell(Inbound(publish(1, b"m1"), acks))
    acks.wait_for(1)
    proxy = first.proxy()
    proxy.commit_batch(proxy.begin_batch([(1, [1])]).get(timeout=5), 1, 0).get(timeout=5)
    assert [r[2] for r in rows(db_path)] == [b"m1"]
    first.stop()

    second = start_ledger()  # forwarding off now
    lag = second.proxy().stats().get(timeout=5)["lag"]
    assert "upstream" not in lag
    assert [r[2] for r in rows(db_path)] == [None]


@pytest.mark.parametrize(
    ("seqs", "runs"),
    [
        ([], []),
        ([5], [(5, 5)]),
        ([3, 1, 2, 2], [(1, 3)]),
        ([1, 2, 4, 5, 9], [(1, 2), (4, 5), (9, 9)]),
    ],
)
def test_seqs_become_runs_of_consecutive_numbers(seqs, runs):
    assert ledger_store.seq_runs(seqs) == runs


def test_settle_hands_each_sink_all_it_owes_at_once_within_its_credit(
    start_ledger, db_path, monkeypatch
):
    """At a graceful stop the table's sink must get everything now, not a chunk per turn
    (the packs stop next)."""
    monkeypatch.setattr(ledger_actor, "READ_BACK_CHUNK", 2)
    ledger = start_ledger()
    listener = listen(ledger, credit=0)
    acks = RecordingAcks(db_path)
    for pid in range(1, 8):
        ledger.tell(Inbound(publish(pid, b"m%d" % pid), acks))
    acks.wait_for(7)
    ledger.tell(Grant(TABLE, 5, 10**9))
    assert ledger.proxy().settle().get(timeout=5) == {TABLE: 6, UPSTREAM: None}
    assert [r.payload for r in listener.records] == [b"m%d" % pid for pid in range(1, 6)]


def test_a_start_with_forwarding_off_warns_of_the_stored_messages_it_stops_owing_upstream(
    start_ledger, db_path, caplog
):
    ledger = forwarding_ledger(start_ledger)
    acks = RecordingAcks(db_path)
    for pid in (1, 2):
        ledger.tell(Inbound(publish(pid, b"m%d" % pid), acks))
    acks.wait_for(2)
    ledger.stop()
    with caplog.at_level(logging.WARNING, logger="actors.ledger"):
        restarted = start_ledger()  # no forward_topic: `[upstream] enabled = false`
        lag = restarted.proxy().stats().get(timeout=5)["lag"]
    assert lag["table"]["messages"] == 2  # still owed to the table
    with sqlite3.connect(db_path) as conn:
        owed = conn.execute("SELECT count(*) FROM inbound WHERE forward IS NOT NULL").fetchone()
    assert owed == (0,)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "forwarding is off: 2 stored message(s) no longer wait for the upstream and will not "
        "be forwarded, even once forwarding is on again"
    ]


# -- bursts stored on the network thread (InlineIntake) --------------------------------------


class ThreadAcks(Acks):
    """Records, with each ack, the thread that sent it."""

    def __init__(self, db_path=None):
        super().__init__()
        self.db_path = db_path
        self.threads = []
        self.visible_at_ack = []

    def send_ack(self, epoch, kind, packet_id):
        if self.db_path is not None:
            with sqlite3.connect(self.db_path) as other:
                keys = [key for (key,) in other.execute("SELECT message_key FROM inbound")]
            self.visible_at_ack.append(keys)
        self.threads.append(threading.current_thread())
        return super().send_ack(epoch, kind, packet_id)


def test_a_burst_offered_to_an_idle_ledger_is_committed_and_acked_on_the_offering_thread(
    start_ledger, db_path
):
    inline = ledger_actor.InlineIntake()
    ledger = start_ledger(inline=inline)
    listener = listen(ledger)
    acks = ThreadAcks(db_path)
    packets = [publish(1, b"one"), publish(2, b"two", qos=2), InboundPubrel(epoch=1, packet_id=2)]
    assert inline.take(packets, acks)
    # Returned with the acks sent, from this thread: no hand-over either way.
    assert acks.acks == [(AckKind.PUBACK, 1), (AckKind.PUBREC, 2), (AckKind.PUBCOMP, 2)]
    assert set(acks.threads) == {threading.current_thread()}
    assert acks.visible_at_ack[0] == [message_key(TOPIC, b"one"), message_key(TOPIC, b"two")]
    assert [r.payload for r in listener.wait_for(2)] == [b"one", b"two"]
    stats = ledger.proxy().stats().get(timeout=5)
    assert (stats["accepted"], stats["inline_commits"], stats["awaiting_pubrel"]) == (2, 1, 0)


def test_a_burst_is_handed_over_while_an_earlier_burst_of_its_connection_waits(
    start_ledger, db_path
):
    """The order a connection's packets came in is the order they are stored in."""
    inline = ledger_actor.InlineIntake()
    ledger = start_ledger(inline=inline)
    ledger.proxy().stats().get(timeout=5)
    acks = Acks()
    acks.bursts_told += 1  # told, and not taken yet
    assert not inline.take([publish(2, b"second")], acks)
    acks.acks.clear()
    ledger.tell(InboundBurst((publish(1, b"first"),), acks, over=True))
    acks.wait_for(1)
    assert inline.take([publish(2, b"second")], acks)
    assert [key for key, _, _ in rows(db_path)] == [
        message_key(TOPIC, b"first"),
        message_key(TOPIC, b"second"),
    ]


class BlockingListener(Listener):
    """Holds the ledger inside its commit (where it tells its sinks) until released."""

    def __init__(self):
        super().__init__()
        self.inside = threading.Event()
        self.release = threading.Event()

    def tell(self, message):
        if isinstance(message, Committed) and not self.release.is_set():
            self.inside.set()
            assert self.release.wait(10)
        super().tell(message)


def test_a_busy_ledger_is_never_waited_for_on_the_network_thread(start_ledger, db_path):
    inline = ledger_actor.InlineIntake()
    ledger = start_ledger(inline=inline)
    listener = BlockingListener()
    ledger.proxy().set_listener(listener).get(timeout=5)
    ledger.tell(Grant(TABLE, 100, 10**9))
    other = Acks()
    ledger.tell(Inbound(publish(1, b"busy"), other))
    assert listener.inside.wait(10)
    acks = Acks()
    assert not inline.take([publish(7, b"later")], acks)  # returns at once: busy
    assert inline.refused_busy == 1 and acks.acks == []
    listener.release.set()
    listener.wait_for(1)
    # An ask's answer comes once the actor is out of the message, and of the lock.
    ledger.proxy().stats().get(timeout=5)
    assert inline.take([publish(7, b"later")], acks)
    assert acks.acks == [(AckKind.PUBACK, 7)]


def test_a_closed_ledger_or_a_large_burst_is_not_taken_inline(start_ledger):
    inline = ledger_actor.InlineIntake()
    acks = Acks()
    assert not inline.take([publish(1, b"before")], acks)  # not started yet
    ledger = start_ledger(inline=inline)
    ledger.proxy().stats().get(timeout=5)
    large = [publish(i, b"%d" % i) for i in range(1, ledger_actor.INLINE_MAX_PACKETS + 2)]
    assert not inline.take(large, acks)
    ledger.stop()
    assert not inline.take([publish(1, b"after")], acks)
    assert acks.acks == []


def test_an_error_storing_a_burst_inline_fails_the_ledger_as_a_tell_would(start_ledger):
    def broken_key(topic, payload):
        raise RuntimeError("a bug in the key")

    inline = ledger_actor.InlineIntake()
    ledger = start_ledger(inline=inline, key=broken_key)
    ledger.proxy().stats().get(timeout=5)  # started: the intake is open
    acks = Acks()
    assert inline.take([publish(1, b"x")], acks)
    assert wait_until(lambda: not ledger.is_alive(), 10)
    assert acks.acks == []


def test_the_ledger_leaves_wal_checkpoints_to_its_checkpointer(start_ledger, db_path):
    """Its own connection never checkpoints (a commit may run on the network thread); every
    CHECKPOINT_COMMITS commits the checkpointer copies the WAL into the file."""
    inline = ledger_actor.InlineIntake()
    ledger = start_ledger(inline=inline)
    ledger.proxy().stats().get(timeout=5)
    acks = Acks()
    for pid in range(1, ledger_actor.CHECKPOINT_COMMITS + 1):
        assert inline.take([publish(pid % 60000 + 1, b"r%d" % pid)], acks)
    assert wait_until(lambda: ledger.proxy().stats().get(timeout=5)["wal_checkpoints"] >= 1, 10)
    # The rows are in the database file itself now, not only in the WAL.
    with sqlite3.connect(f"file:{db_path}?immutable=1", uri=True) as main_file_only:
        (count,) = main_file_only.execute("SELECT count(*) FROM inbound").fetchone()
    assert count == ledger_actor.CHECKPOINT_COMMITS
