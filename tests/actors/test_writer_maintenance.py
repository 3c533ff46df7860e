"""The daemon's own table maintenance, on the simulated clock: the writer runs a Delta
maintenance pass (OPTIMIZE, VACUUM, checkpoint) `start_delay_seconds` after its start and every
`interval_seconds` after that, on its own thread between its writes, with no Spark session; it
holds the tables' writer lock while it runs, reports what each pass did, and puts a pass off
while a batch waits for its retry."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import spark.tables
from actors.app.status import compaction_line as status_line
from actors.backoff import Backoff
from actors.clock import SimulatedClock
from actors.config.schema import load_config
from actors.devtools.simulate import expected_read_ids, simulate
from actors.ledger import InboundLedger
from actors.listener import WriterListener
from actors.messages import PackSealed
from actors.supervisor import Supervisor
from actors.writer import CompactionSchedule, CompactNow, SparkWriterActor
from persistence.compaction_request import pending_compaction_requests, write_compaction_request
from spark.report import landed_ids_arrow
from spark.tables import READS, ArrowTableWriter, application_id, table_properties
from spark.writer_lock import lock_holder
from tests.actors.test_writer import stored_pack
from tests.harness.inbox import Inbox

DAYS = ["2026-11-20", "2026-11-21"]
TODAY = "2026-11-24"
NOW = datetime(2026, 11, 24, 10, 0, tzinfo=UTC).timestamp()
# Batches an earlier ledger landed in the same tables (its own application id).
EARLIER = application_id("earlier-ledger")


def land_earlier(tables: Path, dates, batches: int, rows: int, **properties) -> Counter:
    """`batches` commits of `rows` reads per date, one file per date each."""
    writer = ArrowTableWriter(None, tables, EARLIER, properties=table_properties(**properties))
    landed: Counter = Counter()
    for batch in range(1, batches + 1):
        ids = [f"early-{batch}-{date}-{i}" for date in dates for i in range(rows)]
        dates_column = [date for date in dates for _ in range(rows)]
        table = pa.table({"message_id": ids, "reader_id": ["fx9600-09"] * len(ids)})
        writer.write_batch(batch, {READS: table.append_column("date", pa.array(dates_column))})
        landed.update(ids)
    return landed


def live_files(tables: Path) -> Counter:
    """Files the reads table's current snapshot lists, per date."""
    return Counter(Path(uri).parent.name for uri in DeltaTable(tables / READS).file_uris())


def files_on_disk(tables: Path) -> int:
    return len(list((tables / READS).glob("date=*/*.parquet")))


def scheduled_config(mosquitto, data, **extra):
    """A pass 60 s after the start and every 600 s after that, replaced files vacuumed at once."""
    return load_config(
        None,
        environ={
            "FXGATE__SOURCE__PORT": str(mosquitto.port),
            "FXGATE__GATEWAY__DATA_DIR": str(data),
            "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
            "FXGATE__COMPACTION__START_DELAY_SECONDS": "60",
            "FXGATE__COMPACTION__INTERVAL_SECONDS": "600",
            "FXGATE__COMPACTION__VACUUM_RETENTION_HOURS": "0",
            **extra,
        },
        hostname="gw-test",
    )


def compaction_line(supervisor) -> str:
    """The compaction line of `fxgate status` for the supervisor's status now."""
    return status_line(supervisor.status()["compaction"], supervisor.clock.wall())


def drive_until_landed(supervisor, clock, count: int, timeout: float = 60.0) -> bool:
    """Landing waits on the batch timer of the simulated clock: fire it until `count` landed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if supervisor.wait_for_landed(count, timeout=0.5):
            return True
        clock.advance(0.5)
    return False


def publish_and_land(mosquitto, supervisor, clock, total: int, seed: int) -> set[str]:
    """20 reads of two readers, stamped by the simulated clock (so they land in TODAY), landed
    (the running total is `total` rows)."""
    result = simulate(
        mosquitto.host, mosquitto.port, readers=2, rate=0, count=10, qos=1, seed=seed, clock=clock
    )
    assert result.failed == 0
    assert drive_until_landed(supervisor, clock, total)
    return expected_read_ids(result.published)


@pytest.mark.broker
def test_the_writer_maintains_the_tables_on_its_schedule_between_its_writes_with_no_spark(
    mosquitto, tmp_path
):
    data = tmp_path / "data"
    tables = data / "tables"
    config = scheduled_config(mosquitto, data)
    expected = land_earlier(
        tables, DAYS, batches=5, rows=3, deleted_file_retention_hours=0
    )  # as the daemon with this config creates its tables
    clock = SimulatedClock(start_wall=NOW)
    sessions: list[float] = []
    supervisor = Supervisor(
        config, clock, session_factory=lambda: sessions.append(clock.wall()) or object()
    )
    supervisor.start()
    try:
        writer = supervisor.ref("spark-writer").proxy()
        writer.health().get(timeout=120)  # its on_start is done: the writer lock is taken
        assert lock_holder(tables)["role"] == "daemon"
        report = supervisor.status()["compaction"]
        assert report["last_outcome"] is None and report["next_pass_time"] == NOW + 60
        assert "compaction: no pass yet; next pass in 60 s" in compaction_line(supervisor)

        assert mosquitto.wait_for_output("zebra/fx/+/reads", 15)
        # Two rounds of reads today: two batches at least, a file each.
        expected.update(dict.fromkeys(publish_and_land(mosquitto, supervisor, clock, 20, 1), 1))
        expected.update(dict.fromkeys(publish_and_land(mosquitto, supervisor, clock, 40, 2), 1))
        before = live_files(tables)
        today = before[f"date={TODAY}"]
        assert today >= 2
        assert before == {f"date={DAYS[0]}": 5, f"date={DAYS[1]}": 5, f"date={TODAY}": today}
        version = DeltaTable(tables / READS).version()

        assert clock.wall() < NOW + 59, "landing took the simulated clock past the first pass"
        clock.advance(NOW + 59 - clock.wall())
        writer.health().get(timeout=60)
        assert live_files(tables) == before
        assert DeltaTable(tables / READS).version() == version

        clock.advance(1)
        writer.health().get(timeout=180)  # the tick's pass ran before this answer
        # Every date, closed or open, folded into one file; the replaced files deleted (a
        # retention of 0 h); the transaction identifiers of both ledgers kept.
        assert live_files(tables) == {f"date={d}": 1 for d in [*DAYS, TODAY]}
        assert files_on_disk(tables) == 3
        mine = application_id(supervisor.ref("ledger").proxy().gateway_id().get(timeout=10))
        last_batch = supervisor.status()["last_batch"]["batch_id"]
        delta = DeltaTable(tables / READS)
        assert delta.transaction_version(mine) == last_batch
        assert delta.transaction_version(EARLIER) == 5
        # Status and /metrics say what the pass did and when the next one comes.
        compacted = 10 + today
        report = supervisor.status()["compaction"]
        assert (report["passes"], report["failed_passes"]) == (1, 0)
        assert (report["files_compacted"], report["files_vacuumed"]) == (compacted, compacted)
        assert report["last_outcome"] == "compacted" and report["last_reason"] == "scheduled"
        assert report["last_time"] == NOW + 60 and report["next_pass_time"] == NOW + 660
        assert report["last_summary"].startswith(f"reads: {compacted} file(s) into 3, ")
        text = compaction_line(supervisor)
        assert text.startswith(
            f"compaction: 1 pass(es), {compacted} file(s) compacted, {compacted} vacuumed, "
            "0 failed; last 0 s ago (scheduled): compacted: reads: "
        )
        assert text.endswith("; next pass in 600 s")

        # Writes go on after the pass; the next tick folds today's new file(s) in too.
        expected.update(dict.fromkeys(publish_and_land(mosquitto, supervisor, clock, 60, 3), 1))
        added = live_files(tables)[f"date={TODAY}"] - 1
        assert added >= 1
        clock.advance(NOW + 660 - clock.wall())
        writer.health().get(timeout=180)
        assert live_files(tables) == {f"date={d}": 1 for d in [*DAYS, TODAY]}
        report = supervisor.status()["compaction"]
        assert report["passes"] == 2
        assert report["files_compacted"] == compacted + added + 1
        assert report["files_vacuumed"] == compacted + added + 1
        ids, _ = landed_ids_arrow(tables)
        assert Counter(ids) == expected
        assert sessions == []  # writes and passes alike: no Spark session at all
    finally:
        supervisor.stop()
    assert lock_holder(tables) is None


class CompactionTo(WriterListener):
    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def compaction(self, report) -> None:
        self.inbox.tell(report)


def start_writer(tmp_path, tables, session_factory, start_delay: float, interval: float, **options):
    """A ledger and a writer on the simulated clock whose passes vacuum at once and report to
    the returned inbox."""
    clock = SimulatedClock(start_wall=NOW)
    ledger = InboundLedger.start(tmp_path / "ledger.sqlite", clock, group_commit_max_delay=0.0)
    reports = Inbox()
    writer = SparkWriterActor.start(
        ledger.proxy(),
        clock,
        tables,
        session_factory,
        None,
        listener=CompactionTo(reports),
        compaction=CompactionSchedule(
            start_delay=start_delay, interval=interval, vacuum_retention_hours=0, data_dir=tmp_path
        ),
        **options,
    )
    return clock, ledger, writer, reports


def test_a_pass_is_put_off_while_a_batch_waits_for_its_retry_and_runs_once_it_landed(
    tmp_path, monkeypatch
):
    """Batches stay in order and a pass runs between writes, never beside a batch that waits:
    the scheduled tick and a request of `fxgate compact` that come during the wait both wait."""
    failures = [OSError("No space left on device")]

    class FailsFirstWrite(ArrowTableWriter):
        def write_batch(self, batch_id, tables):
            if failures:
                raise failures.pop()
            return super().write_batch(batch_id, tables)

    monkeypatch.setattr(spark.tables, "ArrowTableWriter", FailsFirstWrite)
    tables = tmp_path / "tables"
    expected = land_earlier(tables, DAYS[:1], batches=4, rows=2, deleted_file_retention_hours=0)
    clock, ledger, writer, reports = start_writer(
        tmp_path,
        tables,
        object,
        60.0,
        600.0,
        batch_max_seconds=1.0,
        retry_backoff=Backoff(100.0, 100.0, 0.0),
    )
    try:
        proxy = writer.proxy()
        proxy.health().get(timeout=60)
        pack = stored_pack(ledger, 5)
        writer.tell(PackSealed(pack))
        proxy.health().get(timeout=60)  # the pack is in: its batch deadline is set
        clock.advance(1.0)  # the batch deadline: the write fails, the retry is due at 101 s
        assert proxy.health().get(timeout=60).waiting_batch == 1

        clock.advance(59.0)  # the scheduled tick
        request = write_compaction_request(tmp_path)
        writer.tell(CompactNow())  # and `fxgate compact`'s request, as the supervisor tells it
        proxy.health().get(timeout=60)
        skipped = reports.messages[-1]
        assert (skipped.passes, skipped.last_outcome) == (0, "skipped")
        assert skipped.last_summary == "a batch waits to be written first"
        assert skipped.last_reason == "requested by fxgate compact"
        assert pending_compaction_requests(tmp_path) == [request]  # kept for after the wait
        assert live_files(tables) == {f"date={DAYS[0]}": 4}

        clock.advance(41.0)  # the retry: batch 1 lands
        assert proxy.health().get(timeout=60).failures == 0
        # Its reads' date is the day the ledger received them: the clock's (NOW).
        assert live_files(tables) == {f"date={DAYS[0]}": 4, f"date={TODAY}": 1}

        writer.tell(CompactNow())  # the supervisor tells it again while the request waits
        proxy.health().get(timeout=60)
        ran = reports.messages[-1]
        assert (ran.passes, ran.last_outcome, ran.files_compacted) == (1, "compacted", 4)
        assert ran.last_reason == "requested by fxgate compact"
        assert pending_compaction_requests(tmp_path) == []
        assert live_files(tables) == {f"date={DAYS[0]}": 1, f"date={TODAY}": 1}
        ids, _ = landed_ids_arrow(tables)
        expected.update(f"{r.message_key}:0" for r in pack.records)
        assert Counter(ids) == expected
    finally:
        writer.stop()
        ledger.stop()
    assert lock_holder(tables) is None


def test_with_landing_through_spark_tables_on_this_disk_are_still_maintained_by_delta_rs(tmp_path):
    """`landing = "spark"` puts a session in the writer, but a pass over local tables never uses
    it: delta-spark's pass took minutes here under load, holding the writer and its stop. The
    session below has no Spark in it, so a pass that went through it would fail."""
    tables = tmp_path / "tables"
    expected = land_earlier(tables, DAYS, batches=3, rows=2, deleted_file_retention_hours=0)
    sessions = []

    def no_spark_session():
        sessions.append(object())
        return sessions[-1]

    _, ledger, writer, reports = start_writer(
        tmp_path,
        tables,
        no_spark_session,
        3600.0,
        3600.0,
        land_with_arrow=False,
        # A writer that takes the session and lands with delta-rs: this test is about the pass.
        table_writer=ArrowTableWriter,
    )
    try:
        proxy = writer.proxy()
        proxy.health().get(timeout=60)
        assert len(sessions) == 1  # the writer took a session, as landing = "spark" does
        write_compaction_request(tmp_path)
        writer.tell(CompactNow())  # `fxgate compact`'s request, as the supervisor tells it
        proxy.health().get(timeout=60)
        ran = reports.messages[-1]
        assert (ran.passes, ran.failed_passes, ran.last_outcome) == (1, 0, "compacted")
        assert ran.files_compacted == 6
        assert live_files(tables) == {f"date={DAYS[0]}": 1, f"date={DAYS[1]}": 1}
        ids, _ = landed_ids_arrow(tables)
        assert Counter(ids) == expected
    finally:
        writer.stop()
        ledger.stop()
