"""The daemon's own compaction schedule, on the simulated clock: the writer compacts the closed
dates `start_delay_seconds` after its start and every `interval_seconds` after that, on its own
thread and session, and holds the tables' compaction lock while it runs."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import pytest

from actors.app.status import compaction_line as status_line
from actors.clock import SimulatedClock
from actors.config.schema import load_config
from actors.devtools.simulate import simulate
from actors.supervisor import Supervisor
from spark.compaction import COMPACTED_BASE, batch_dirs, lock_holder
from spark.tables import READS
from tests.spark.compaction_data import land_day

pytestmark = [pytest.mark.broker, pytest.mark.spark]

DAYS = ["2026-11-20", "2026-11-21"]
TODAY = "2026-11-24"
NOW = datetime(2026, 11, 24, 10, 0, tzinfo=UTC).timestamp()


def scheduled_config(mosquitto, data, **extra):
    """A pass 60 s after the start and every 600 s after that."""
    return load_config(
        None,
        environ={
            "FXGATE__SOURCE__PORT": str(mosquitto.port),
            "FXGATE__GATEWAY__DATA_DIR": str(data),
            "FXGATE__COMPACTION__START_DELAY_SECONDS": "60",
            "FXGATE__COMPACTION__INTERVAL_SECONDS": "600",
            **extra,
        },
        hostname="gw-test",
    )


def compaction_line(supervisor) -> str:
    """The compaction line of `fxgate status` for the supervisor's status now."""
    return status_line(supervisor.status()["compaction"], supervisor.clock.wall())


def test_the_writer_compacts_the_closed_dates_on_its_schedule_and_leaves_today_open(
    mosquitto, spark_session, tmp_path, caplog
):
    data = tmp_path / "data"
    reads = data / "tables" / READS
    land_day(reads, DAYS, batches=10, rows=3)
    land_day(reads, [TODAY], batches=3, rows=3, first=11)
    config = scheduled_config(mosquitto, data)
    clock = SimulatedClock(start_wall=NOW)
    supervisor = Supervisor(config, clock, session_factory=lambda: spark_session)
    caplog.set_level(logging.INFO, logger="actors.writer")
    supervisor.start()
    try:
        writer = supervisor.ref("spark-writer").proxy()
        writer.health().get(timeout=120)  # its on_start is done: the session and the lock
        assert lock_holder(data / "tables")["role"] == "daemon"

        report = supervisor.status()["compaction"]
        assert report["last_outcome"] is None and report["next_pass_time"] == NOW + 60
        assert "compaction: no pass yet; next pass in 60 s" in compaction_line(supervisor)

        clock.advance(59)
        writer.health().get(timeout=60)
        assert sorted(batch_dirs(reads / f"date={DAYS[0]}")) == [1, 2, 3, 4, 5]

        clock.advance(1)
        writer.health().get(timeout=180)  # the tick's pass ran before this answer
        for day in DAYS:
            assert sorted(batch_dirs(reads / f"date={day}")) == [COMPACTED_BASE + 1]
        assert sorted(batch_dirs(reads / f"date={TODAY}")) == [11, 12, 13]
        (line,) = [r.getMessage() for r in caplog.records if "compaction pass" in r.getMessage()]
        assert f"compaction pass (scheduled, dates before {TODAY}): 2 date(s) compacted" in line
        assert "10 partition(s) (10 file(s)) -> 2 file(s), 30 rows" in line
        # Status and /metrics say what the pass did and when the next one comes.
        report = supervisor.status()["compaction"]
        assert (report["passes"], report["dates_compacted"], report["failed_passes"]) == (1, 2, 0)
        assert report["last_outcome"] == "compacted" and report["last_reason"] == "scheduled"
        assert report["last_time"] == NOW + 60 and report["next_pass_time"] == NOW + 660
        assert report["last_summary"] in line and report["dates_left_open"] == 0
        text = compaction_line(supervisor)
        assert text.startswith("compaction: 1 pass(es), 2 date(s) compacted, 0 failed; last 0 s ")
        assert text.endswith("; next pass in 600 s")

        # A late batch in a compacted date: the next tick takes it in too.
        land_day(reads, DAYS[:1], batches=1, rows=3, first=20)
        clock.advance(599)
        writer.health().get(timeout=60)
        assert sorted(batch_dirs(reads / f"date={DAYS[0]}")) == [20, COMPACTED_BASE + 1]
        clock.advance(1)
        writer.health().get(timeout=180)
        assert sorted(batch_dirs(reads / f"date={DAYS[0]}")) == [COMPACTED_BASE + 2]
    finally:
        supervisor.stop()
    assert lock_holder(data / "tables") is None


def test_with_pyarrow_landing_a_spark_session_runs_only_through_a_pass_that_rewrites_a_date(
    mosquitto, spark_session, tmp_path
):
    data = tmp_path / "data"
    reads = data / "tables" / READS
    land_day(reads, DAYS, batches=4, rows=3)
    config = scheduled_config(mosquitto, data, FXGATE__SPARK__BATCH_MAX_SECONDS="0.5")
    clock = SimulatedClock(start_wall=NOW)
    started: list[float] = []
    stopped: list[object] = []

    def session_factory():
        started.append(clock.wall())
        return spark_session

    supervisor = Supervisor(
        config, clock, session_factory=session_factory, session_closer=stopped.append
    )
    supervisor.start()
    try:
        writer = supervisor.ref("spark-writer").proxy()
        writer.health().get(timeout=120)
        assert mosquitto.wait_for_output("zebra/fx/+/reads", 15)
        # Reads land with no session at all.
        result = simulate(mosquitto.host, mosquitto.port, readers=1, rate=0, count=20, qos=1)
        assert result.failed == 0
        assert drive_until_landed(supervisor, clock, 20)
        assert started == [] and stopped == []

        clock.advance(60)  # the first pass: two dates to rewrite
        writer.health().get(timeout=180)
        for day in DAYS:
            assert sorted(batch_dirs(reads / f"date={day}")) == [COMPACTED_BASE + 1]
        first = supervisor.status()["compaction"]["last_time"]
        assert started == [first] and stopped == [spark_session]  # started, then stopped

        clock.advance(600)  # the next pass: nothing to rewrite, so no session
        writer.health().get(timeout=60)
        assert supervisor.status()["compaction"]["passes"] == 2
        assert started == [first] and stopped == [spark_session]
    finally:
        supervisor.stop()
    assert len(stopped) == 1  # nothing more to stop at the end


def drive_until_landed(supervisor, clock, count: int, timeout: float = 60.0) -> bool:
    """Landing waits on the batch timer of the simulated clock: fire it until `count` landed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if supervisor.wait_for_landed(count, timeout=0.5):
            return True
        clock.advance(0.5)
    return False
