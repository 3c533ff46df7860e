"""The daemon's own compaction schedule, on the simulated clock: the writer compacts the closed
dates `start_delay_seconds` after its start and every `interval_seconds` after that, on its own
thread and session, and holds the tables' compaction lock while it runs."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from actors.app.status import compaction_line as status_line
from actors.clock import SimulatedClock
from actors.config.schema import load_config
from actors.supervisor import Supervisor
from spark.compaction import COMPACTED_BASE, batch_dirs, lock_holder
from spark.tables import READS
from tests.spark.compaction_data import land_day

pytestmark = [pytest.mark.broker, pytest.mark.spark]

DAYS = ["2026-11-20", "2026-11-21"]
TODAY = "2026-11-24"
NOW = datetime(2026, 11, 24, 10, 0, tzinfo=UTC).timestamp()


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
    config = load_config(
        None,
        environ={
            "FXGATE__SOURCE__PORT": str(mosquitto.port),
            "FXGATE__GATEWAY__DATA_DIR": str(data),
            "FXGATE__COMPACTION__START_DELAY_SECONDS": "60",
            "FXGATE__COMPACTION__INTERVAL_SECONDS": "600",
        },
        hostname="gw-test",
    )
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
