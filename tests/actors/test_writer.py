"""SparkWriterActor on the simulated clock, with a real ledger and a scripted table writer."""

import dataclasses
import json
import sqlite3
import threading

import pytest

from actors.backoff import Backoff
from actors.clock import SimulatedClock
from actors.ledger import InboundLedger
from actors.messages import Grant, Inbound, Pack, PackSealed
from actors.mqtt.client import AckSender, InboundPublish
from actors.writer import SparkWriterActor
from persistence.records import TABLE, ReaderCount
from tests.harness.checks import wait_until

PAYLOAD = (
    b'{"data": {"idHex": "e2801160600002054cc2096f", "eventNum": %d}, '
    b'"timestamp": "2026-11-21T10:00:00.000+0000"}'
)


class NoAcks(AckSender):
    def send_ack(self, epoch, kind, packet_id):
        return True


class ScriptedTables:
    """Stands in for spark.tables.TableWriter: fails, blocks or succeeds as told."""

    def __init__(self, script):
        self.script = list(script)  # "fail" | "block" | "ok", one per write
        self.calls = []
        self.cancelled = threading.Event()
        self.cond = threading.Condition()

    def __call__(self, _session, _tables_dir, **_options):
        return self

    def cancel(self):
        self.cancelled.set()

    def write_batch(self, batch_id, tables):
        step = self.script.pop(0) if self.script else "ok"
        with self.cond:
            self.calls.append((batch_id, tables["reads"].num_rows, step))
            self.cond.notify_all()
        if step == "fail":
            raise RuntimeError("Py4JJavaError: disk on fire")
        if step == "block":
            assert self.cancelled.wait(30), "never cancelled"
            raise RuntimeError("Job cancelled")
        return {name: table.num_rows for name, table in tables.items()}

    def wait_calls(self, count, timeout=10):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= count, timeout), self.calls
            return list(self.calls)


@pytest.fixture
def clock():
    return SimulatedClock()


@pytest.fixture
def ledger(tmp_path, clock):
    ref = InboundLedger.start(tmp_path / "ledger.sqlite", clock, group_commit_max_delay=0.0)
    yield ref
    if ref.is_alive():
        ref.stop()


def stored_pack(ledger, count, topic="zebra/fx/r1/reads", event_nums=None):
    """Store `count` messages in the ledger (eventNum 0, 1, ... or `event_nums`) and return them
    as one sealed pack."""
    numbers = list(range(count)) if event_nums is None else list(event_nums)
    count = len(numbers)

    class Collect:
        def __init__(self):
            self.records = []
            self.done = threading.Event()

        def tell(self, message):
            self.records.extend(message.records)
            if len(self.records) >= count:
                self.done.set()

    collect = Collect()
    ledger.proxy().set_listener(collect).get(timeout=5)
    ledger.tell(Grant(TABLE, count, 10**9))
    for n, number in enumerate(numbers):
        payload = PAYLOAD % number + b" " * n  # the same eventNum twice is two messages
        publish = InboundPublish(1, n + 1, 1, False, False, topic, True, payload, None, 0.0)
        ledger.tell(Inbound(publish, NoAcks()))
    assert collect.done.wait(5)
    return Pack(1, tuple(dataclasses.replace(r, pack_id=1) for r in collect.records))


def batch_states(tmp_path):
    with sqlite3.connect(tmp_path / "ledger.sqlite") as conn:
        return conn.execute("SELECT batch_id, state FROM batches ORDER BY batch_id").fetchall()


def start_writer(ledger, clock, tables, retry_backoff=None, **options):
    return SparkWriterActor.start(
        ledger.proxy(),
        clock,
        "unused",
        object,
        None,
        table_writer=tables,
        batch_max_seconds=1.0,
        processing_timeout=20.0,
        retry_backoff=retry_backoff or Backoff(1.0, 60.0, 0.25),
        **options,
    )


def test_a_failed_spark_write_is_retried_on_the_backoff_and_lands_once(ledger, clock, tmp_path):
    tables = ScriptedTables(["fail", "fail", "ok"])
    writer = start_writer(ledger, clock, tables)
    try:
        writer.tell(PackSealed(stored_pack(ledger, 5)))
        assert clock.wait_for_timers(1)
        clock.advance(1.0)  # the batch deadline
        tables.wait_calls(1)
        for attempt, (low, high) in enumerate([(0.75, 1.25), (1.5, 2.5)]):
            # The failed write is handled (its watchdog cancelled) once the mailbox answers.
            assert writer.proxy().failures.get(timeout=5) == attempt + 1
            assert clock.pending() == 1
            assert low - 1e-6 <= clock.next_due_in() <= high + 1e-6, attempt
            assert batch_states(tmp_path) == [(1, "writing")]
            clock.advance(clock.next_due_in())
            tables.wait_calls(attempt + 2)
        writer.proxy().failures.get(timeout=5)
        assert [(b, rows) for b, rows, _ in tables.calls] == [(1, 5)] * 3
        assert batch_states(tmp_path) == [(1, "committed")]
        assert ledger.proxy().stats().get(timeout=5)["pending"] == 0
    finally:
        writer.stop()


def test_a_spark_job_stuck_past_the_processing_timeout_is_cancelled_and_retried(
    ledger, clock, tmp_path
):
    tables = ScriptedTables(["block", "ok"])
    writer = start_writer(ledger, clock, tables)
    try:
        writer.tell(PackSealed(stored_pack(ledger, 3)))
        assert clock.wait_for_timers(1)
        clock.advance(1.0)
        tables.wait_calls(1)
        assert clock.wait_for_timers(1)  # the watchdog
        clock.advance(19.9)
        assert not tables.cancelled.is_set()
        clock.advance(0.1)
        assert tables.cancelled.is_set()
        assert clock.wait_for_timers(1)  # the retry
        clock.advance(clock.next_due_in())
        assert [step for _, _, step in tables.wait_calls(2)] == ["block", "ok"]
        writer.proxy().failures.get(timeout=5)
        assert batch_states(tmp_path) == [(1, "committed")]
    finally:
        writer.stop()


def test_new_packs_wait_behind_a_failed_batch_and_follow_it_in_order(ledger, clock, tmp_path):
    tables = ScriptedTables(["fail", "ok", "ok"])
    writer = start_writer(ledger, clock, tables, retry_backoff=Backoff(5.0, 60.0, 0.0))
    try:
        pack = stored_pack(ledger, 4)
        first = Pack(1, pack.records[:2])
        second = Pack(2, pack.records[2:])
        writer.tell(PackSealed(first))
        assert clock.wait_for_timers(1)
        clock.advance(1.0)
        tables.wait_calls(1)
        writer.tell(PackSealed(second))
        assert clock.wait_for_timers(2)  # the retry and the second deadline
        clock.advance(1.0)  # the deadline passes while batch 1 still waits: nothing new starts
        writer.proxy().failures.get(timeout=5)
        assert len(tables.calls) == 1
        clock.advance(5.0)
        calls = tables.wait_calls(3)
        assert [(b, rows) for b, rows, _ in calls] == [(1, 2), (1, 2), (2, 2)]
        writer.proxy().failures.get(timeout=5)
        assert batch_states(tmp_path) == [(1, "committed"), (2, "committed")]
    finally:
        writer.stop()


def test_the_writer_takes_only_its_credit_and_a_failing_spark_leaves_the_rest_in_the_ledger(
    ledger, clock, tmp_path
):
    """The ledger is the buffer: the writer's window is `backlog_high` beyond what it wrote;
    while a batch fails it opens no further, the rest waits in the ledger (not in memory), and
    the source is acknowledged all the same."""
    tables = ScriptedTables(["fail", "ok"])
    writer = start_writer(
        ledger,
        clock,
        tables,
        retry_backoff=Backoff(5.0, 60.0, 0.0),
        backlog_high=4,
        backlog_low=1,
        backlog_high_bytes=10**6,
    )

    def table_feed():
        return ledger.proxy().stats().get(timeout=5)["feeds"]["table"]

    try:
        assert wait_until(lambda: table_feed()["limit"] == 4)
        pack = stored_pack(ledger, 3)
        writer.tell(PackSealed(pack))
        assert clock.wait_for_timers(1)
        clock.advance(1.0)  # the batch fails and waits 5 s for its retry
        tables.wait_calls(1)
        writer.proxy().failures.get(timeout=5)
        assert table_feed()["limit"] == 4  # nothing more was granted
        stats = ledger.proxy().stats().get(timeout=5)
        assert stats["paused_by"] == [] and stats["accepted"] == 3
        clock.advance(5.0)  # the retry lands it: the window opens past what is written
        tables.wait_calls(2)
        assert wait_until(lambda: table_feed()["limit"] == 3 + 4)
    finally:
        writer.stop()


def test_a_window_spent_in_bytes_is_opened_again_even_with_messages_left():
    """An additive credit once stalled both sides: the bytes ran out while message credit was
    still out. The window's limits move on with what was written, whichever ran out."""
    from actors.feed import Feed
    from persistence.records import LedgerRecord

    feed = Feed(TABLE)
    feed.grant(100, 250)
    records = [LedgerRecord(n, f"k{n}", "t", b"x" * 100, 1, 0.0) for n in range(1, 6)]
    handed = feed.offer(records)
    assert [r.seq for r in handed] == [1, 2, 3]  # the third overshoots the bytes: then stop
    assert not feed.has_credit and feed.messages == 97
    feed.grant(3 + 100, 300 + 250)  # the sink: written 3 (300 bytes) + its high marks
    assert feed.has_credit
    feed.grant(50, 50)  # a late, smaller grant changes nothing
    assert (feed.limit, feed.limit_bytes) == (103, 550)


def test_a_batch_is_also_bounded_by_payload_bytes(ledger, clock, tmp_path):
    tables = ScriptedTables([])
    writer = start_writer(ledger, clock, tables, batch_max_bytes=2048)
    try:
        pack = stored_pack(ledger, 40)  # ~100 bytes each: 4 KB in all
        writer.tell(PackSealed(Pack(1, pack.records[:10])))
        writer.proxy().failures.get(timeout=5)
        assert tables.calls == []  # 1 KB waits for the deadline
        writer.tell(PackSealed(Pack(2, pack.records[10:])))
        (call,) = tables.wait_calls(1)  # past 2 KB: written without waiting
        assert call[1] == 40
    finally:
        writer.stop()


def test_a_spark_session_that_died_is_started_again_before_the_retry(ledger, clock, tmp_path):
    class DeadSession:
        @property
        def sparkContext(self):  # what py4j does once the JVM is gone
            raise ConnectionRefusedError("gateway gone")

    sessions = []

    def factory():
        sessions.append(DeadSession() if not sessions else object())
        return sessions[-1]

    tables = ScriptedTables(["fail", "ok"])
    writer = SparkWriterActor.start(
        ledger.proxy(),
        clock,
        "unused",
        factory,
        None,
        table_writer=tables,
        batch_max_seconds=1.0,
        retry_backoff=Backoff(1.0, 60.0, 0.0),
    )
    try:
        writer.tell(PackSealed(stored_pack(ledger, 2)))
        assert clock.wait_for_timers(1)
        clock.advance(1.0)
        tables.wait_calls(1)
        writer.proxy().failures.get(timeout=5)
        clock.advance(1.0)
        tables.wait_calls(2)
        writer.proxy().failures.get(timeout=5)
        assert len(sessions) == 2
        assert batch_states(tmp_path) == [(1, "committed")]
    finally:
        writer.stop()


def test_each_batch_commits_its_readers_event_counters_and_a_restart_counts_on_from_them(
    tmp_path, clock
):
    path = tmp_path / "ledger.sqlite"
    ledger = InboundLedger.start(path, clock, group_commit_max_delay=0.0)
    tables = ScriptedTables(["fail"])  # the first attempt fails: its counts must not stick
    writer = start_writer(ledger, clock, tables, retry_backoff=Backoff(1.0, 1.0, 0.0))
    try:
        pack = stored_pack(ledger, 0, event_nums=[1, 2, 5, 6, 2])  # 3, 4 lost; then a reboot
        writer.tell(PackSealed(pack))
        assert clock.wait_for_timers(1)
        clock.advance(1.0)
        tables.wait_calls(1)
        writer.proxy().failures.get(timeout=5)
        clock.advance(1.0)  # the retry lands it
        tables.wait_calls(2)
        assert wait_until(lambda: ledger.proxy().stats().get(timeout=5)["pending"] == 0)
        batch = writer.proxy().last_batch.get(timeout=5)
        (counts,) = batch.readers
        assert counts == ReaderCount("r1", 2, 5, 2, 1, 0)
    finally:
        writer.stop()
        ledger.stop()
    again = InboundLedger.start(path, clock, group_commit_max_delay=0.0)
    try:
        readers = again.proxy().recovery().get(timeout=5).readers
        assert readers == {"r1": ReaderCount("r1", 2, 5, 2, 1, 0)}
    finally:
        again.stop()


def heartbeat_payload(sent: int) -> bytes:
    counters = {
        "numDataMessagesRxed": sent,
        "numDataMessagesTxed": sent,
        "numDataMessagesRetained": 0,
        "numDataMessagesDropped": 0,
    }
    return json.dumps(
        {
            "component": "RG",
            "data": {"reader_gateway": {"dataPathStatistics": [counters]}},
            "eventNum": sent,
            "timestamp": "2026-11-21T10:00:00.000+0000",
            "type": "heartbeat",
        }
    ).encode()


def stored_messages(ledger, messages) -> Pack:
    """Store (topic, payload) messages in the ledger, in order, and return them as one pack."""

    class Collect:
        def __init__(self):
            self.records = []
            self.done = threading.Event()

        def tell(self, message):
            self.records.extend(message.records)
            if len(self.records) >= len(messages):
                self.done.set()

    collect = Collect()
    ledger.proxy().set_listener(collect).get(timeout=5)
    ledger.tell(Grant(TABLE, len(messages), 10**9))
    for n, (topic, payload) in enumerate(messages):
        publish = InboundPublish(1, n + 1, 1, False, False, topic, True, payload, None, 0.0)
        ledger.tell(Inbound(publish, NoAcks()))
    assert collect.done.wait(5)
    return Pack(1, tuple(dataclasses.replace(r, pack_id=1) for r in collect.records))


def test_reader_health_is_committed_with_its_batch_and_a_failed_attempt_counts_nothing(
    tmp_path, clock
):
    path = tmp_path / "ledger.sqlite"
    ledger = InboundLedger.start(path, clock, group_commit_max_delay=0.0)
    tables = ScriptedTables(["fail"])
    writer = start_writer(
        ledger,
        clock,
        tables,
        retry_backoff=Backoff(1.0, 1.0, 0.0),
        management_topics=("zebra/fx/+/mgmt",),
    )
    try:
        data = [("zebra/fx/r1/reads", PAYLOAD % n + b" " * n) for n in range(1, 4)]
        pack = stored_messages(
            ledger,
            [
                ("zebra/fx/r1/mgmt", heartbeat_payload(10)),
                *data,
                ("zebra/fx/r1/mgmt", heartbeat_payload(15)),  # 5 sent, 3 arrived
            ],
        )
        writer.tell(PackSealed(pack))
        assert clock.wait_for_timers(1)
        clock.advance(1.0)
        tables.wait_calls(1)
        writer.proxy().failures.get(timeout=5)  # the retry is scheduled
        clock.advance(1.0)  # the retry lands it
        tables.wait_calls(2)
        assert wait_until(lambda: ledger.proxy().stats().get(timeout=5)["pending"] == 0)
        batch = writer.proxy().last_batch.get(timeout=5)
        assert batch.reader_events == 2
        state = batch.reader_health["r1"]
        assert (state["heartbeats"], state["intervals"], state["unaccounted"]) == (2, 1, 2)
        assert state["data_messages"] == 3 and state["sent"] == 15
    finally:
        writer.stop()
        ledger.stop()
    again = InboundLedger.start(path, clock, group_commit_max_delay=0.0)
    try:
        recovered = again.proxy().recovery().get(timeout=5).reader_health
        assert recovered == {"r1": state}
    finally:
        again.stop()


def test_a_heartbeats_event_number_in_the_readers_counter_is_no_gap_in_its_tag_events(
    ledger, clock
):
    """DESIGN §7.9: one counter for both kinds of event. Tag events 1, 2, 4 around heartbeat 3
    are complete; without the heartbeat's number, 3 would count as a lost read."""
    tables = ScriptedTables([])
    writer = start_writer(ledger, clock, tables)
    try:
        beat = json.loads(heartbeat_payload(2))
        beat["eventNum"] = 3
        pack = stored_messages(
            ledger,
            [
                ("zebra/fx/r1/reads", PAYLOAD % 1),
                ("zebra/fx/r1/reads", PAYLOAD % 2),
                ("zebra/fx/r1/mgmt", json.dumps(beat).encode()),  # recognised by its shape
                ("zebra/fx/r1/reads", PAYLOAD % 4),
            ],
        )
        writer.tell(PackSealed(pack))
        assert clock.wait_for_timers(1)
        clock.advance(1.0)
        tables.wait_calls(1)
        assert wait_until(lambda: writer.proxy().last_batch.get(timeout=5) is not None)
        (counts,) = writer.proxy().last_batch.get(timeout=5).readers
        assert counts == ReaderCount("r1", 4, 4, 0, 0, 0)
    finally:
        writer.stop()


class GatedTables(ScriptedTables):
    """Holds the first write until `release` is set, telling `holding` meanwhile."""

    def __init__(self, script=()):
        super().__init__(script)
        self.holding = threading.Event()
        self.release = threading.Event()

    def write_batch(self, batch_id, tables):
        if not self.holding.is_set():
            self.holding.set()
            assert self.release.wait(30), "never released"
        return super().write_batch(batch_id, tables)


def four_packs(ledger, count):
    """`count` stored messages of reader r1 (eventNum 0, 1, ...) as packs of four."""
    records = stored_pack(ledger, count).records
    return [Pack(n + 1, records[i : i + 4]) for n, i in enumerate(range(0, count, 4))]


def test_packs_that_pile_up_behind_a_held_write_come_out_a_batch_at_a_time_counted_on(
    ledger, clock, tmp_path
):
    tables = GatedTables()
    writer = start_writer(ledger, clock, tables, batch_max_rows=4)
    try:
        for pack in four_packs(ledger, 20):
            writer.tell(PackSealed(pack))
        assert tables.holding.wait(30)
        # The table write holds batch 1; the other full packs wait in the writer, not yet
        # batches (each is begun just before its write, once the one before it is written).
        assert batch_states(tmp_path) == [(1, "writing")]
        tables.release.set()
        calls = tables.wait_calls(5)
        # What piled up meanwhile comes out a batch at a time, never as one big batch.
        assert [(b, rows) for b, rows, _ in calls] == [(b, 4) for b in range(1, 6)]
        writer.proxy().failures.get(timeout=5)
        assert batch_states(tmp_path) == [(b, "committed") for b in range(1, 6)]
        # Each batch counted on from the one before it.
        counts = ledger.proxy().recovery().get(timeout=5).readers["r1"]
        assert (counts.received, counts.last_event_num, counts.missing) == (20, 19, 0)
    finally:
        tables.release.set()
        writer.stop()


def test_a_failed_batch_keeps_the_packs_behind_it_waiting_and_both_land_in_order(
    ledger, clock, tmp_path
):
    tables = ScriptedTables(["fail", "ok", "ok"])
    writer = start_writer(
        ledger, clock, tables, batch_max_rows=4, retry_backoff=Backoff(5.0, 60.0, 0.0)
    )
    try:
        first, second, _ = four_packs(ledger, 12)
        writer.tell(PackSealed(first))
        writer.tell(PackSealed(second))
        tables.wait_calls(1)
        assert writer.proxy().failures.get(timeout=5) == 1
        # Batch 2 is not begun while batch 1 waits for its retry.
        assert batch_states(tmp_path) == [(1, "writing")]
        assert len(tables.calls) == 1
        clock.advance(5.0)
        calls = tables.wait_calls(3)
        assert [(b, rows, step) for b, rows, step in calls] == [
            (1, 4, "fail"),
            (1, 4, "ok"),
            (2, 4, "ok"),
        ]
        writer.proxy().failures.get(timeout=5)
        assert batch_states(tmp_path) == [(1, "committed"), (2, "committed")]
        assert ledger.proxy().recovery().get(timeout=5).readers["r1"].received == 8
    finally:
        writer.stop()


def test_a_stop_lands_the_packs_waiting_for_their_batch_deadline(ledger, clock, tmp_path):
    tables = ScriptedTables([])
    writer = start_writer(ledger, clock, tables, batch_max_rows=100)
    for pack in four_packs(ledger, 8):
        writer.tell(PackSealed(pack))
    assert clock.wait_for_timers(1)  # the batch's deadline, never reached on this clock
    writer.stop()
    assert batch_states(tmp_path) == [(1, "committed")]
    assert [(b, rows) for b, rows, _ in tables.calls] == [(1, 8)]
