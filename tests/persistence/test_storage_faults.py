"""Storage faults: a full or read-only disk under the ledgers, and corrupt files at start.

The injected faults come from the storage layer itself (tests/harness/faulty_sqlite.py): every
SQLite connection the ledger opens fails its writes and commits with SQLite's own messages while
a test says so. Time is the simulated clock's: retries fire only when the test advances it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import subprocess
import threading
import urllib.error
import urllib.request

import pykka
import pytest
import sqlalchemy

from actors import ledger as ledger_actor
from actors.backoff import Backoff
from actors.clock import SimulatedClock
from actors.config.routes import Route
from actors.devtools.broker_process import free_port
from actors.devtools.simulate import expected_read_ids, simulate
from actors.ledger import InboundLedger, InlineIntake, LedgerRecord
from actors.lifecycle import LifecycleActor
from actors.messages import (
    Inbound,
    InboundBurst,
    Pack,
    PackSealed,
    SessionConnected,
    SessionStarted,
    StoreLocal,
)
from actors.mqtt.client import AckKind, InboundPubrel
from actors.mqtt.intake import IntakeGate
from actors.mqtt.upstream import AckType, OutboundAck
from actors.outbound import OutboundLedger
from persistence.database import connect_sqlite, open_engine
from persistence.keys import message_key
from persistence.storage_faults import (
    CorruptDatabase,
    StorageUnavailable,
    check_database,
    corrupt_leftovers,
    describe,
    is_storage_fault,
)
from spark.report import compare, landed_ids_arrow
from tests.actors.test_ledger import Acks, listen, publish
from tests.harness import faulty_sqlite
from tests.harness.checks import wait_until, wait_until_landed
from tests.harness.daemon import gateway_env
from tests.harness.faulty_sqlite import DISK_FULL, READ_ONLY
from tests.harness.inbox import Inbox

TOPIC = "zebra/fx/fx9600-01/reads"


@pytest.fixture
def faults(monkeypatch):
    yield faulty_sqlite.install(monkeypatch)
    faulty_sqlite.FAULTS.set(None)


# -- helpers --------------------------------------------------------------------------------


def stored(db_path):
    with sqlite3.connect(db_path) as conn:
        return conn.execute("SELECT message_key, packet_id FROM inbound ORDER BY seq").fetchall()


def no_jitter():
    return Backoff(1.0, 8.0, 0.0)


@pytest.fixture
def clock():
    return SimulatedClock()


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def start_ledger(db_path, clock):
    started = []

    def start(**options):
        options.setdefault("group_commit_max_delay", 0.0)
        options.setdefault("storage_backoff", no_jitter())
        ref = InboundLedger.start(db_path, clock, **options)
        started.append(ref)
        stats(ref)  # on_start is over: the file is open before a test fills the disk
        return ref

    yield start
    for ref in started:
        if ref.is_alive():
            ref.stop()


def stats(ledger):
    return ledger.proxy().stats().get(timeout=10)


def wait_failing(ledger, failures=1):
    assert wait_until(lambda: stats(ledger)["storage_failures"] >= failures, timeout=10)


def retry(clock, ledger, seconds, settle=stats):
    """Let the backoff's timer fire, then wait until the actor has worked off its mailbox."""
    assert clock.wait_for_timers(1)
    clock.advance(seconds)
    settle(ledger)


# -- the inbound ledger on a full disk ------------------------------------------------------


def test_a_full_disk_at_commit_acks_nothing_until_space_returns_then_acks_every_message_once(
    faults, start_ledger, db_path, clock, caplog
):
    caplog.set_level(logging.INFO, logger="actors.ledger")
    caplog.set_level(logging.INFO, logger="actors.storage_retry")
    ledger = start_ledger()
    listener = listen(ledger)
    acks = Acks()
    faults.set(DISK_FULL)
    for pid in (1, 2, 3):
        ledger.tell(Inbound(publish(pid, b"read-%d" % pid), acks))
    wait_failing(ledger)
    status = stats(ledger)
    assert status["storage_error"] == DISK_FULL
    assert status["storage_backlog"] == 3
    assert acks.acks == []
    assert stored(db_path) == []

    retry(clock, ledger, 1.0)  # still full: a second failure, still no ack
    assert stats(ledger)["storage_failures"] >= 2
    assert acks.acks == [] and stored(db_path) == []
    assert ledger.is_alive()

    faults.set(None)
    retry(clock, ledger, 8.0)
    assert acks.wait_for(3) == [(AckKind.PUBACK, 1), (AckKind.PUBACK, 2), (AckKind.PUBACK, 3)]
    assert [key for key, _ in stored(db_path)] == [
        message_key(TOPIC, b"read-%d" % pid) for pid in (1, 2, 3)
    ]
    assert [r.payload for r in listener.records] == [b"read-1", b"read-2", b"read-3"]
    status = stats(ledger)
    assert status["storage_error"] is None
    assert status["storage_backlog"] == 0
    assert status["accepted"] == 3  # the rolled-back attempts are not counted
    failing = [r for r in caplog.records if "cannot write" in r.getMessage()]
    recovered = [r for r in caplog.records if "writes again" in r.getMessage()]
    assert [r.levelname for r in failing] == ["ERROR"]  # one line however many retries
    assert [r.levelname for r in recovered] == ["INFO"]


def test_messages_that_arrive_while_the_disk_is_full_wait_behind_the_failed_group_in_order(
    faults, start_ledger, db_path, clock
):
    ledger = start_ledger()
    acks = Acks()
    faults.set(DISK_FULL)
    ledger.tell(Inbound(publish(1, b"first"), acks))
    wait_failing(ledger)
    for pid in (2, 3, 4):
        ledger.tell(Inbound(publish(pid, b"later-%d" % pid), acks))
    assert wait_until(lambda: stats(ledger)["storage_backlog"] == 4)
    assert acks.acks == []
    faults.set(None)
    retry(clock, ledger, 1.0)
    assert [pid for _, pid in acks.wait_for(4)] == [1, 2, 3, 4]
    assert [key for key, _ in stored(db_path)] == [
        message_key(TOPIC, p) for p in (b"first", b"later-2", b"later-3", b"later-4")
    ]


def test_a_qos2_message_gets_no_pubrec_until_its_row_and_packet_id_are_committed(
    faults, start_ledger, db_path, clock
):
    ledger = start_ledger()
    acks = Acks()
    faults.set(READ_ONLY)
    ledger.tell(Inbound(publish(42, b"q2", qos=2), acks))
    wait_failing(ledger)
    assert stats(ledger)["awaiting_pubrel"] == 0  # the rolled-back exchange is forgotten
    assert acks.acks == []
    faults.set(None)
    retry(clock, ledger, 1.0)
    assert acks.wait_for(1) == [(AckKind.PUBREC, 42)]
    assert stored(db_path) == [(message_key(TOPIC, b"q2"), 42)]


def awaiting_pubrel_then_full(faults, start_ledger):
    """A ledger with QoS 2 message 7 stored and PUBREC'd, then a full disk."""
    ledger = start_ledger()
    acks = Acks()
    ledger.tell(Inbound(publish(7, b"q2", qos=2), acks))
    assert acks.wait_for(1) == [(AckKind.PUBREC, 7)]
    faults.set(DISK_FULL)
    return ledger, acks


def test_a_pubrel_while_the_disk_is_full_is_answered_and_its_release_recorded_once_it_has_room(
    faults, start_ledger, db_path, clock
):
    ledger, acks = awaiting_pubrel_then_full(faults, start_ledger)
    ledger.tell(Inbound(InboundPubrel(epoch=1, packet_id=7), acks))
    # The message was committed before its PUBREC: its PUBCOMP waits for no write.
    assert acks.wait_for(2)[1] == (AckKind.PUBCOMP, 7)
    assert clock.wait_for_timers(1)
    clock.advance(ledger_actor.RELEASE_DELAY)  # the release's own commit meets the full disk
    wait_failing(ledger)
    assert stored(db_path) == [(message_key(TOPIC, b"q2"), 7)]
    assert stats(ledger)["awaiting_pubrel"] == 0
    faults.set(None)
    for _ in range(10):  # the backoff's retry, then the release's own timer again
        if stored(db_path) == [(message_key(TOPIC, b"q2"), None)]:
            break
        retry(clock, ledger, 1.0)
    assert stored(db_path) == [(message_key(TOPIC, b"q2"), None)]
    assert acks.acks == [(AckKind.PUBREC, 7), (AckKind.PUBCOMP, 7)]


def test_a_pubrel_in_a_group_that_fails_is_answered_once_and_its_exchange_stays_over(
    faults, start_ledger, db_path, clock
):
    ledger, acks = awaiting_pubrel_then_full(faults, start_ledger)
    acks.bursts_told += 1
    # The PUBREL writes nothing; the next packet's write fails and rolls its group back.
    burst = (InboundPubrel(epoch=1, packet_id=7), publish(8, b"after"), publish(9, b"last"))
    ledger.tell(InboundBurst(burst, acks, over=True))
    wait_failing(ledger)
    assert acks.acks == [(AckKind.PUBREC, 7), (AckKind.PUBCOMP, 7)]
    status = stats(ledger)
    assert (status["storage_backlog"], status["awaiting_pubrel"]) == (2, 0)
    faults.set(None)
    retry(clock, ledger, 1.0)
    assert acks.wait_for(4) == [
        (AckKind.PUBREC, 7),
        (AckKind.PUBCOMP, 7),
        (AckKind.PUBACK, 8),
        (AckKind.PUBACK, 9),
    ]
    assert stored(db_path) == [
        (message_key(TOPIC, b"q2"), None),
        (message_key(TOPIC, b"after"), None),
        (message_key(TOPIC, b"last"), None),
    ]
    status = stats(ledger)
    assert (status["awaiting_pubrel"], status["unknown_pubrel"], status["accepted"]) == (0, 0, 3)


def test_the_backlog_counts_against_the_intake_gate_until_it_is_stored(faults, start_ledger, clock):
    intake = IntakeGate(1000, 1_000_000, clock.monotonic)
    ledger = start_ledger(intake=intake)
    acks = Acks()
    faults.set(DISK_FULL)
    for pid in range(1, 6):
        intake.admit(len(b"r%d" % pid))
        ledger.tell(Inbound(publish(pid, b"r%d" % pid), acks))
    assert wait_until(lambda: stats(ledger)["storage_backlog"] == 5)
    # The first packet failed in a group (taken); the four after it wait untaken.
    assert intake.stats().waiting_messages == 4
    faults.set(None)
    retry(clock, ledger, 1.0)
    acks.wait_for(5)
    assert intake.stats().waiting_messages == 0


def test_hand_overs_that_meet_a_full_disk_wait_in_order_and_count_against_the_gate(
    faults, start_ledger, db_path, clock
):
    """The source hands packets over many at a time: the first to fail is in the rolled-back
    group (taken), every packet behind it waits in the backlog (not taken), in order."""
    intake = IntakeGate(1000, 1_000_000, clock.monotonic)
    ledger = start_ledger(intake=intake)
    acks = Acks()
    faults.set(DISK_FULL)
    for first in (1, 6):
        packets = tuple(publish(pid, b"r%d" % pid) for pid in range(first, first + 5))
        intake.admit(sum(len(p.payload) for p in packets), len(packets))
        ledger.tell(InboundBurst(packets, acks))
    assert wait_until(lambda: stats(ledger)["storage_backlog"] == 10)
    assert intake.stats().waiting_messages == 9
    assert acks.acks == [] and stored(db_path) == []
    faults.set(None)
    retry(clock, ledger, 1.0)
    assert [pid for _, pid in acks.wait_for(10)] == list(range(1, 11))
    assert [key for key, _ in stored(db_path)] == [
        message_key(TOPIC, b"r%d" % pid) for pid in range(1, 11)
    ]
    assert intake.stats().waiting_messages == 0


def test_a_burst_stored_inline_that_meets_a_full_disk_waits_unacknowledged_and_in_order(
    faults, start_ledger, db_path, clock
):
    """On the network thread as in the actor: the failed packet and those behind it go to the
    backlog, no ack leaves, and the next bursts are handed over until the backlog is stored."""
    inline = InlineIntake()
    ledger = start_ledger(inline=inline)
    acks = Acks()
    faults.set(DISK_FULL)
    assert inline.take([publish(pid, b"r%d" % pid) for pid in (1, 2, 3)], acks)
    assert stats(ledger)["storage_backlog"] == 3 and acks.acks == []
    assert not inline.take([publish(4, b"r4")], acks)  # failing: the actor's to handle
    acks.bursts_told += 1
    ledger.tell(InboundBurst((publish(4, b"r4"),), acks, over=True))
    assert wait_until(lambda: stats(ledger)["storage_backlog"] == 4)
    faults.set(None)
    retry(clock, ledger, 1.0)
    assert [pid for _, pid in acks.wait_for(4)] == [1, 2, 3, 4]
    assert [key for key, _ in stored(db_path)] == [
        message_key(TOPIC, b"r%d" % pid) for pid in (1, 2, 3, 4)
    ]
    assert inline.take([publish(5, b"r5")], acks)  # recovered: inline again
    assert acks.acks[-1] == (AckKind.PUBACK, 5)


def test_qos0_messages_arriving_while_storage_fails_are_dropped_and_counted(
    faults, start_ledger, db_path, clock
):
    ledger = start_ledger()
    acks = Acks()
    faults.set(DISK_FULL)
    ledger.tell(Inbound(publish(1, b"kept", qos=1), acks))
    wait_failing(ledger)
    ledger.tell(Inbound(publish(0, b"gone", qos=0), acks))
    assert wait_until(lambda: stats(ledger)["dropped_qos0"] == 1)
    faults.set(None)
    retry(clock, ledger, 1.0)
    acks.wait_for(1)
    assert [key for key, _ in stored(db_path)] == [message_key(TOPIC, b"kept")]


def test_a_session_start_while_failing_is_applied_after_the_packets_before_it(
    faults, start_ledger, db_path, clock
):
    ledger = start_ledger()
    acks = Acks()
    faults.set(DISK_FULL)
    ledger.tell(Inbound(publish(5, b"q2", qos=2), acks))
    wait_failing(ledger)
    # A reconnect without a session: the broker forgot packet id 5 (after our PUBREC would have
    # been the message's exchange); the row stays, the id goes.
    ledger.tell(SessionStarted(epoch=2, session_present=False))
    faults.set(None)
    retry(clock, ledger, 1.0)
    acks.wait_for(1)
    assert stored(db_path) == [(message_key(TOPIC, b"q2"), None)]
    assert stats(ledger)["awaiting_pubrel"] == 0


def test_writes_asked_while_storage_fails_are_refused_and_the_ledger_stays_alive(
    faults, start_ledger, db_path, clock
):
    ledger = start_ledger()
    acks = Acks()
    ledger.tell(Inbound(publish(1, b"landed-later"), acks))
    acks.wait_for(1)
    faults.set(DISK_FULL)
    proxy = ledger.proxy()
    with pytest.raises(StorageUnavailable, match="disk is full"):
        proxy.begin_batch([(1, [1])]).get(timeout=10)
    with pytest.raises(StorageUnavailable):
        ledger.ask(StoreLocal("fxgate/env/gw/lifecycle", b'{"id": "e1"}'), timeout=10)
    with pytest.raises(StorageUnavailable):
        proxy.commit_batch(1, 1, 0).get(timeout=10)
    assert ledger.is_alive()
    faults.set(None)
    retry(clock, ledger, 1.0)
    assert stats(ledger)["storage_error"] is None
    batch_id = proxy.begin_batch([(1, [1])]).get(timeout=10)
    proxy.commit_batch(batch_id, 1, 0).get(timeout=10)
    assert stats(ledger)["pending"] == 0


def test_a_stop_while_storage_fails_acks_nothing_and_a_restart_finds_nothing_stored(
    faults, start_ledger, db_path, clock, caplog
):
    ledger = start_ledger()
    acks = Acks()
    faults.set(DISK_FULL)
    ledger.tell(Inbound(publish(1, b"never-acked"), acks))
    wait_failing(ledger)
    ledger.stop()
    assert acks.acks == []
    assert any("neither stored nor acknowledged" in r.getMessage() for r in caplog.records)
    faults.set(None)
    again = start_ledger()
    # Unacknowledged, so the broker redelivers it after the reconnect: stored then, once.
    again.tell(Inbound(publish(1, b"never-acked"), acks))
    assert acks.wait_for(1) == [(AckKind.PUBACK, 1)]
    assert len(stored(db_path)) == 1


def test_the_retry_delay_doubles_on_the_clock_while_the_disk_stays_full(
    faults, start_ledger, clock
):
    ledger = start_ledger()
    faults.set(DISK_FULL)
    ledger.tell(Inbound(publish(1, b"x"), Acks()))
    wait_failing(ledger)
    delays = []
    for attempt in range(2, 6):
        assert clock.wait_for_timers(1)
        delays.append(clock.next_due_in())
        clock.advance(delays[-1])
        wait_failing(ledger, attempt)
    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert clock.next_due_in() == 8.0  # capped


def test_storage_fault_classification_tells_a_full_disk_from_a_bad_statement():
    assert is_storage_fault(sqlite3.OperationalError(DISK_FULL))
    assert is_storage_fault(sqlite3.OperationalError(READ_ONLY))
    assert is_storage_fault(sqlite3.OperationalError("disk I/O error"))
    assert not is_storage_fault(sqlite3.OperationalError("no such table: inbound"))
    assert not is_storage_fault(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert not is_storage_fault(ValueError(DISK_FULL))
    wrapped = sqlalchemy.exc.OperationalError("COMMIT", {}, sqlite3.OperationalError(DISK_FULL))
    assert is_storage_fault(wrapped)
    assert describe(wrapped) == DISK_FULL


def test_a_real_sqlite_full_error_is_a_storage_fault(tmp_path):
    """SQLite's own SQLITE_FULL, from a page limit, carries its result code."""
    db = sqlite3.connect(tmp_path / "small.sqlite")
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.execute("PRAGMA max_page_count = 2")
    with pytest.raises(sqlite3.OperationalError) as raised:
        db.executemany("INSERT INTO t VALUES (?)", [(b"x" * 1000,)] * 50)
    db.close()
    assert raised.value.sqlite_errorname == "SQLITE_FULL"
    assert is_storage_fault(raised.value)
    assert "SQLITE_FULL" in describe(raised.value)


# -- corrupt files at start -----------------------------------------------------------------


def fill_ledger(db_path, clock, count=500):
    """A real ledger file with `count` stored messages, closed cleanly."""
    ref = InboundLedger.start(db_path, clock, group_commit_max_delay=0.0)
    acks = Acks()
    for pid in range(1, count + 1):
        ref.tell(Inbound(publish(pid % 65535 + 1, b"payload-%06d" % pid + b"x" * 200), acks))
    acks.wait_for(count, timeout=30)
    ref.stop()


def test_a_ledger_of_garbage_bytes_is_moved_aside_and_refused_with_what_to_do(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"\x00garbage, not SQLite\xff" * 500)
    (tmp_path / "ledger.sqlite-wal").write_bytes(b"wal bytes")
    with pytest.raises(CorruptDatabase) as raised:
        open_engine(path)
    message = str(raised.value)
    moved = corrupt_leftovers(path)
    assert len(moved) == 1 and moved[0].name.startswith("ledger.sqlite.corrupt-")
    assert str(path) in message and moved[0].name in message
    assert ".recover" in message  # what to do
    assert not path.exists()  # and nothing new and empty was made in its place
    assert moved[0].read_bytes().startswith(b"\x00garbage")
    assert moved[0].with_name(moved[0].name + "-wal").read_bytes() == b"wal bytes"


def test_a_corrupt_ledger_left_by_a_kill_goes_aside_with_its_wal_untouched(tmp_path):
    """The WAL may hold the newest committed rows: the check must not checkpoint it into the
    corrupt file nor delete it (a read-write check connection did both)."""
    live = sqlite3.connect(tmp_path / "live.sqlite")
    live.execute("PRAGMA journal_mode=WAL")
    live.execute("PRAGMA wal_autocheckpoint=0")
    live.execute("CREATE TABLE t (x)")
    live.executemany("INSERT INTO t VALUES (?)", [(b"x" * 500,)] * 200)
    live.commit()
    live.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    live.executemany("INSERT INTO t VALUES (?)", [(b"y" * 500,)] * 20)
    live.commit()
    # A copy while the connection is open is what a kill -9 leaves: main file + WAL + shm.
    path = tmp_path / "ledger.sqlite"
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"ledger.sqlite{suffix}").write_bytes(
            (tmp_path / f"live.sqlite{suffix}").read_bytes()
        )
    live.close()
    wal = (tmp_path / "ledger.sqlite-wal").read_bytes()
    assert len(wal) > 0
    with open(path, "r+b") as f:
        f.seek(3 * 4096)
        f.write(b"\xa5" * 4096)
    with pytest.raises(CorruptDatabase):
        check_database(path)
    (moved,) = corrupt_leftovers(path)
    assert moved.with_name(moved.name + "-wal").read_bytes() == wal


def test_the_next_start_refuses_too_until_the_operator_removes_the_moved_file(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(CorruptDatabase):
        open_engine(path)
    (moved,) = corrupt_leftovers(path)
    with pytest.raises(CorruptDatabase, match="found corrupt at an earlier start"):
        open_engine(path)
    assert not path.exists()
    moved.unlink()
    engine = open_engine(path)  # the operator's decision: a new, empty ledger
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM inbound").scalar() == 0
    finally:
        engine.dispose()


def test_a_real_ledger_with_an_overwritten_page_is_found_corrupt_at_start(tmp_path, clock):
    path = tmp_path / "ledger.sqlite"
    fill_ledger(path, clock)
    page_size = 4096
    assert path.stat().st_size > 8 * page_size
    with open(path, "r+b") as f:
        f.seek(5 * page_size)
        f.write(b"\xa5" * page_size)
    with pytest.raises(CorruptDatabase, match="is corrupt"):
        check_database(path)
    assert len(corrupt_leftovers(path)) == 1 and not path.exists()


def test_a_truncated_ledger_is_found_corrupt_at_start(tmp_path, clock):
    path = tmp_path / "ledger.sqlite"
    fill_ledger(path, clock)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CorruptDatabase):
        check_database(path)
    assert len(corrupt_leftovers(path)) == 1


def test_a_sound_ledger_passes_the_check_and_keeps_its_rows(tmp_path, clock):
    path = tmp_path / "ledger.sqlite"
    fill_ledger(path, clock, count=50)
    check_database(path)
    assert len(stored(path)) == 50
    assert corrupt_leftovers(path) == []


@pytest.mark.parametrize("name", ["outbound.sqlite", "lifecycle.sqlite"])
def test_the_actors_own_files_are_checked_the_same_way(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"SQLite format 2\x00" + b"\x17" * 4000)
    with pytest.raises(CorruptDatabase, match=name):
        connect_sqlite(path, "process", "CREATE TABLE IF NOT EXISTS t (x);")
    assert len(corrupt_leftovers(path)) == 1


def test_the_inbound_ledger_does_not_start_on_a_corrupt_file(tmp_path, clock, caplog):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"garbage" * 1000)
    ref = InboundLedger.start(path, clock)
    assert wait_until(lambda: not ref.is_alive(), timeout=10)  # on_start failed
    with pytest.raises(pykka.ActorDeadError):
        ref.proxy()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("is corrupt" in e and "moved aside" in e for e in errors), errors


# -- the outbound ledger and the life-cycle store on a full disk ------------------------------


class UpstreamClient:
    """Records what the outbound ledger sends and, at each send, what its file holds."""

    def __init__(self, db_path):
        self.db_path = db_path
        self.sent = []  # (kind, packet id, dup, state committed for the message at that moment)
        self.cond = threading.Condition()

    def _committed_state(self, key):
        seq = int(key.removeprefix("k"))
        with sqlite3.connect(self.db_path) as other:
            row = other.execute("SELECT state FROM outbound WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else row[0]

    def send_publishes(self, epoch, messages):
        for m in messages:
            self.send_publish(epoch, m)
        return True

    def send_publish(self, epoch, message):
        state = self._committed_state(message.message_key)
        with self.cond:
            self.sent.append(("PUBLISH", message.packet_id, message.dup, state))
            self.cond.notify_all()
        return True

    def send_pubrels(self, epoch, packet_ids):
        return True

    def send_pubrel(self, epoch, packet_id):
        return True

    def wait_sent(self, count, timeout=10):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.sent) >= count, timeout), self.sent
            return list(self.sent)


def outbound_status(ref):
    return ref.proxy().status().get(timeout=10)


def records(count):
    return tuple(
        LedgerRecord(seq, f"k{seq}", "zebra/fx/r1/reads", b"x" * 50, 1, 0.0, 1)
        for seq in range(1, count + 1)
    )


def test_the_outbound_ledger_on_a_full_disk_sends_nothing_unrecorded_and_resumes_after_space(
    faults, tmp_path, clock, caplog
):
    caplog.set_level(logging.INFO, logger="actors.outbound")
    caplog.set_level(logging.INFO, logger="actors.storage_retry")
    path = tmp_path / "outbound.sqlite"
    writer = Inbox()
    ref = OutboundLedger.start(
        path,
        clock,
        writer,
        (Route(0, "zebra/fx/+/reads", qos=1),),
        "env",
        storage_backoff=no_jitter(),
    )
    try:
        client = UpstreamClient(path)
        ref.proxy().set_client(client).get(timeout=5)
        ref.tell(SessionStarted(1, True, 65535))
        faults.set(DISK_FULL)
        ref.tell(PackSealed(Pack(1, records(3))))
        assert wait_until(lambda: outbound_status(ref)["storage_error"])
        assert client.sent == []
        assert ref.is_alive()
        retry(clock, ref, 1.0, outbound_status)  # still full
        assert client.sent == [] and ref.is_alive()
        faults.set(None)
        retry(clock, ref, 2.0, outbound_status)
        sent = client.wait_sent(3)
        # Each PUBLISH left only after its 'publish' state was committed.
        assert [(kind, state) for kind, _, _, state in sent] == [("PUBLISH", "publish")] * 3
        assert outbound_status(ref)["storage_error"] is None
        for _, packet_id, _, _ in sent:
            ref.tell(OutboundAck(1, packet_id, AckType.PUBACK, 0, "Success"))
        (report,) = writer.wait_for(1)
        assert report.done == (1, 2, 3)
    finally:
        ref.stop()
    errors = [r for r in caplog.records if "outbound ledger cannot write" in r.getMessage()]
    assert [r.levelname for r in errors] == ["ERROR"]
    assert any("outbound ledger writes again" in r.getMessage() for r in caplog.records)


def test_the_lifecycle_store_on_a_full_disk_logs_and_stays_alive(faults, tmp_path, clock, caplog):
    sink = Inbox()
    ref = LifecycleActor.start(tmp_path / "lifecycle.sqlite", clock, [sink], "fxgate/test")
    try:
        ref.proxy().status().get(timeout=5)
        faults.set(DISK_FULL)
        ref.tell(SessionConnected("gw-source", "gw-source", 1))
        assert ref.proxy().status().get(timeout=5) is not None  # alive, answering
        assert sink.messages == []  # nothing leaves that was not recorded
        faults.set(None)
        ref.tell(SessionConnected("gw-source", "gw-source", 2))
        (event,) = sink.wait_for(1)
        # The lost event's number is not reused: the next one orders after it.
        assert event["data"]["sequenceNumber"] == 2
    finally:
        ref.stop()
    assert any(
        r.levelname == "ERROR" and "not recorded, so not sent" in r.getMessage()
        for r in caplog.records
    )


class RefusingLedger:
    """A ledger sink that cannot store (its disk is full)."""

    name = "ledger"

    def tell(self, event):
        raise StorageUnavailable("inbound ledger cannot write: database or disk is full")


def test_a_ledger_sink_that_cannot_store_leaves_the_event_in_the_outbox(tmp_path, clock):
    path = tmp_path / "lifecycle.sqlite"
    ref = LifecycleActor.start(path, clock, [RefusingLedger()], "fxgate/test")
    try:
        ref.tell(SessionConnected("gw-source", "gw-source", 1))
        ref.proxy().status().get(timeout=5)
        assert ref.is_alive()
    finally:
        ref.stop()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT sink FROM outbox").fetchall() == [("ledger",)]


# -- a real full disk: a small tmpfs as the data dir, a real broker, the daemon, Spark --------


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 MiB tmpfs mounted as the test's data dir; unmounted when the test ends (after the
    daemon is reaped: request it before daemon_factory). Skipped where mounting is refused."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(mount)],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        yield mount
    finally:
        unmounted = subprocess.run(["umount", str(mount)], check=False, capture_output=True)
        if unmounted.returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def fill_up(mount) -> int:
    """Write a filler file until the file system says ENOSPC; returns its size."""
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    written = 0
    try:
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    written += os.write(fd, block)
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written


def healthz(port) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def metric(port, name) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "_total "):
                return float(line.split()[-1])
    return None


@pytest.mark.broker
@pytest.mark.spark
def test_a_full_data_disk_stops_acks_keeps_the_connection_and_everything_lands_once_after(
    small_tmpfs, mosquitto_factory, daemon_factory
):
    broker = mosquitto_factory(debug_log=True)
    data = small_tmpfs / "data"
    port = free_port()
    daemon = daemon_factory(
        {
            **gateway_env(broker, data),
            "FXGATE__GATEWAY__METRICS_PORT": str(port),
            # A 64 MiB file system: the disk budget's default 1 GiB free would pause the source
            # at start. This test is about the storage failing, not about the budget.
            "FXGATE__LEDGER__MIN_FREE_BYTES": "0",
        }
    )
    daemon.wait_for_log(r"source: subscribed", timeout=90)
    before = simulate(broker.host, broker.port, readers=2, rate=0, count=150, qos=1, seed=1)
    assert before.failed == 0
    wait_until_landed(daemon, data, 300, timeout=120)

    filler = fill_up(small_tmpfs)
    assert filler > 0
    mark = daemon.mark()
    during = simulate(broker.host, broker.port, readers=2, rate=0, count=1000, qos=1, seed=2)
    assert during.failed == 0  # the broker took them; the gateway cannot store them
    daemon.wait_for_log(r"ERROR .*inbound ledger cannot write .*disk is full", 90, mark)

    def pubacks() -> int:
        return broker.output().count("Received PUBACK from fxgate")

    # Two retries later (0.5 s, then about 1 s), not one more PUBACK has left.
    assert wait_until(lambda: (metric(port, "fxgate_ledger_storage_failures") or 0) >= 2, 30)
    acked = pubacks()
    assert wait_until(lambda: (metric(port, "fxgate_ledger_storage_failures") or 0) >= 4, 30)
    assert pubacks() == acked
    status, body = healthz(port)
    assert status == 503
    assert any("inbound ledger cannot write" in reason for reason in body["reasons"]), body
    assert metric(port, "fxgate_ledger_storage_failing") == 1.0
    assert daemon.proc.poll() is None  # no crash, no restart loop

    (small_tmpfs / "filler").unlink()
    daemon.wait_for_log(r"INFO .*inbound ledger writes again", 90, mark)
    expected = expected_read_ids(before.published) | expected_read_ids(during.published)
    wait_until_landed(daemon, data, len(expected), timeout=180)
    ids, _readers = landed_ids_arrow(data / "tables")
    result = compare(expected, ids)
    assert result.exact, result.lines()
    assert len(ids) == len(expected) == 2300
    assert wait_until(lambda: healthz(port)[0] == 200, 60), healthz(port)
    # One connection the whole time: the source never let go of its session.
    assert daemon.count_logs(r"source: disconnected") == 0
    connects = [line for line in broker.output().splitlines() if "New client connected" in line]
    assert sum(" as fxgate-" in line for line in connects) == 1, connects
    assert daemon.count_logs(r"inbound ledger cannot write") == 1
    assert daemon.terminate() == 0


def remount(mount, mode):
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)


@pytest.mark.broker
@pytest.mark.spark
def test_a_read_only_data_dir_at_start_is_refused_clearly_and_nothing_is_lost_once_writable(
    small_tmpfs, mosquitto, daemon_factory
):
    """A running daemon keeps its files open for writing, so Linux refuses to remount their
    file system read-only (EBUSY, measured here); the read-only case an operator meets is a
    start on a data dir that is read-only."""
    data = small_tmpfs / "data"
    env = {
        "FXGATE__SOURCE__PORT": str(mosquitto.port),
        "FXGATE__GATEWAY__DATA_DIR": str(data),
        "FXGATE__PACKS__LINGER_SECONDS": "0.2",
        "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
        "FXGATE__LEDGER__MIN_FREE_BYTES": "0",  # a 64 MiB file system: see the test above
    }
    first = daemon_factory(env)
    first.wait_for_log(r"source: subscribed", timeout=90)
    before = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=100, qos=1, seed=3)
    wait_until_landed(first, data, 200, timeout=120)
    assert first.terminate() == 0

    remount(small_tmpfs, "ro")
    try:
        # Published while the gateway is down: its persistent session queues them.
        later = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=100, qos=1)
        refused = daemon_factory(env)
        assert refused.proc.wait(120) == 1
        refused.wait_for_log(r"ERROR .*inbound ledger: cannot open .*ledger\.sqlite: .*writable", 5)
    finally:
        remount(small_tmpfs, "rw")

    again = daemon_factory(env)
    expected = expected_read_ids(before.published) | expected_read_ids(later.published)
    wait_until_landed(again, data, len(expected), timeout=120)
    ids, _readers = landed_ids_arrow(data / "tables")
    result = compare(expected, ids)
    assert result.exact, result.lines()
    assert again.terminate() == 0
