"""SparkWriterActor when writing fails: Spark jobs that fail, and a ledger that cannot write.

Each failure is retried on the backoff of the simulated clock with the backlog kept; status gets
the failures, the last error and the next retry, /healthz turns bad after a threshold, and after
recovery every row is in the table exactly once (read back with pyarrow from the real table).
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import pytest

from actors.app.metrics import HealthThresholds, StatusBoard
from actors.backoff import Backoff
from actors.clock import SimulatedClock
from actors.ledger import InboundLedger
from actors.listener import WriterListener
from actors.messages import PackSealed, WriterHealth
from actors.writer import SparkWriterActor
from spark.report import landed_ids_arrow
from tests.actors.test_writer import batch_states, stored_pack
from tests.harness import faulty_sqlite
from tests.harness.checks import wait_until
from tests.harness.faulty_sqlite import DISK_FULL
from tests.harness.inbox import Inbox

TOPIC = "zebra/fx/fx9600-01/reads"


class FailingTables:
    """The real TableWriter, failing its first `failures` writes as a sick cluster would;
    `during_write` runs inside each write (a disk that fills up mid-job)."""

    def __init__(self, failures: int, during_write=None):
        self.failures = failures
        self.during_write = during_write
        self.calls: list[tuple[int, int]] = []
        self.cond = threading.Condition()
        self.real = None

    def __call__(self, session, tables_dir, **options):
        from spark.tables import TableWriter

        self.real = TableWriter(session, tables_dir, **options)
        return self

    def cancel(self):
        self.real.cancel()

    def write_batch(self, batch_id, tables):
        with self.cond:
            self.calls.append((batch_id, tables["reads"].num_rows))
            self.cond.notify_all()
            failing = len(self.calls) <= self.failures
        if failing:
            raise RuntimeError("Py4JJavaError: Lost executor 0 on 127.0.0.1")
        written = self.real.write_batch(batch_id, tables)
        if self.during_write is not None:
            self.during_write()
        return written


@pytest.fixture
def clock():
    return SimulatedClock()


@pytest.fixture
def faults(monkeypatch):
    yield faulty_sqlite.install(monkeypatch)
    faulty_sqlite.FAULTS.set(None)


@pytest.fixture
def ledger(tmp_path, clock):
    ref = InboundLedger.start(
        tmp_path / "ledger.sqlite",
        clock,
        group_commit_max_delay=0.0,
        storage_backoff=Backoff(0.5, 0.5, 0.0),
    )
    ref.proxy().stats().get(timeout=10)
    yield ref
    if ref.is_alive():
        ref.stop()


class HealthTo(WriterListener):
    """A writer listener that tells every health report to an inbox."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def writer_health(self, health) -> None:
        self.inbox.tell(health)


@pytest.fixture
def start_writer(spark_session, clock, tmp_path):
    started = []

    def start(ledger, tables, health: Inbox, backoff=None):
        """`health` is told every WriterHealth the writer reports, in order."""
        ref = SparkWriterActor.start(
            ledger.proxy(),
            clock,
            tmp_path / "tables",
            lambda: spark_session,
            None,
            table_writer=tables,
            batch_max_seconds=1.0,
            retry_backoff=backoff or Backoff(1.0, 60.0, 0.0),
            listener=HealthTo(health),
        )
        started.append(ref)
        return ref

    yield start
    for ref in started:
        if ref.is_alive():
            ref.stop()


def landed(tmp_path) -> list[str]:
    ids, _readers = landed_ids_arrow(tmp_path / "tables")
    return sorted(ids)


def expected_ids(pack) -> list[str]:
    # payload_hash keys: <message key>:<index of the read in the message>
    return sorted(f"{r.message_key}:0" for r in pack.records)


def due(clock, writer):
    """Fire the next timer once the writer has scheduled it, then let the writer work."""
    assert clock.wait_for_timers(1)
    clock.advance(clock.next_due_in())
    writer.proxy().failures.get(timeout=60)


@pytest.mark.spark
def test_failed_spark_writes_are_reported_then_land_every_row_once_after_recovery(
    ledger, start_writer, clock, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="actors.writer")
    tables = FailingTables(failures=3)
    health = Inbox()
    writer = start_writer(ledger, tables, health)
    pack = stored_pack(ledger, 20, TOPIC)
    writer.tell(PackSealed(pack))
    due(clock, writer)  # the batch deadline: attempt 1 fails
    for attempt in (1, 2, 3):
        report = health.wait_for(attempt)[-1]
        assert report.failures == attempt
        assert report.total_failures == attempt
        assert report.waiting_batch == 1
        assert report.last_error == "RuntimeError: Py4JJavaError: Lost executor 0 on 127.0.0.1"
        assert report.next_retry_time == pytest.approx(clock.wall() + 2 ** (attempt - 1))
        assert batch_states(tmp_path) == [(1, "writing")]  # the backlog is kept
        assert landed(tmp_path) == []
        due(clock, writer)
    recovered = health.wait_for(4)[-1]
    assert recovered.failures == 0 and recovered.total_failures == 3
    assert tables.calls == [(1, 20)] * 4  # the same batch, the same rows, each time
    assert batch_states(tmp_path) == [(1, "committed")]
    assert landed(tmp_path) == expected_ids(pack)
    failed_lines = [r for r in caplog.records if "table write failed" in r.getMessage()]
    assert [r.levelname for r in failed_lines] == ["ERROR"] * 3  # one line per failure
    assert sum("tables written again" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.spark
def test_a_batch_the_ledger_cannot_begin_waits_with_its_packs_and_lands_once_space_returns(
    faults, ledger, start_writer, clock, tmp_path
):
    tables = FailingTables(failures=0)
    health = Inbox()
    writer = start_writer(ledger, tables, health)
    pack = stored_pack(ledger, 10, TOPIC)
    faults.set(DISK_FULL)
    writer.tell(PackSealed(pack))
    due(clock, writer)  # the deadline: begin_batch is refused, the writer stays alive
    report = health.wait_for(1)[-1]
    assert report.failures == 1 and report.waiting_batch is None
    assert "StorageUnavailable" in report.last_error and DISK_FULL in report.last_error
    assert tables.calls == [] and batch_states(tmp_path) == []
    assert writer.is_alive() and ledger.is_alive()
    faults.set(None)
    clock.advance(1.0)  # the ledger's retry (0.5 s), then the writer's (1 s)
    writer.proxy().failures.get(timeout=60)
    assert wait_until(lambda: batch_states(tmp_path) == [(1, "committed")], timeout=60)
    assert tables.calls == [(1, 10)]
    assert landed(tmp_path) == expected_ids(pack)
    assert health.wait_for(2)[-1].failures == 0


@pytest.mark.spark
def test_a_batch_written_while_the_ledger_filled_up_is_written_again_and_committed_once(
    faults, ledger, start_writer, clock, tmp_path
):
    # The disk fills during the first job: its files are in the table, but the ledger cannot
    # record the commit. The retry overwrites the same partitions and commits.
    tables = FailingTables(failures=0, during_write=lambda: faults.set(DISK_FULL))
    health = Inbox()
    writer = start_writer(ledger, tables, health)
    pack = stored_pack(ledger, 15, TOPIC)
    writer.tell(PackSealed(pack))
    due(clock, writer)
    assert health.wait_for(1)[-1].waiting_batch == 1
    assert batch_states(tmp_path) == [(1, "writing")]
    tables.during_write = None
    faults.set(None)
    clock.advance(1.0)
    writer.proxy().failures.get(timeout=60)
    assert wait_until(lambda: batch_states(tmp_path) == [(1, "committed")], timeout=60)
    assert tables.calls == [(1, 15), (1, 15)]
    assert landed(tmp_path) == expected_ids(pack)  # twice written, once in the table


def test_healthz_turns_bad_after_the_spark_failure_threshold_and_good_after_recovery():
    clock = SimulatedClock()
    board = StatusBoard(clock, HealthThresholds(spark_failures=3))

    def publish(failures):
        spark = dataclasses.asdict(
            WriterHealth(
                failures=failures,
                total_failures=failures or 3,
                last_error="RuntimeError: Lost executor",
                next_retry_time=clock.wall() + 4.0,
            )
        )
        board.publish({"actors": {"spark-writer": True}, "spark": spark, "wall_time": clock.wall()})

    publish(2)
    assert board.health().healthy
    publish(3)
    health = board.health()
    assert not health.healthy
    (reason,) = health.reasons
    assert "table writes failing: 3 attempt(s) in a row" in reason
    assert "Lost executor" in reason and "next retry in 4 s" in reason
    publish(0)
    assert board.health().healthy
