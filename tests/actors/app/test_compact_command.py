"""`fxgate compact` as its own process, over Delta tables: with the daemon stopped it runs one
maintenance pass (OPTIMIZE, VACUUM, checkpoint) and every reader still sees each row once; a
SIGKILL inside its pass changes nothing a reader sees and the next pass finishes; while the
daemon runs it hands the daemon a request; a second one while the first holds the tables is
refused, and so is a tables directory still in the layout before Delta."""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from actors.app.cli import main
from spark.maintenance import utc_date
from spark.report import landed_ids_arrow
from spark.tables import READS, ArrowTableWriter, application_id, read_table, read_table_arrow
from spark.writer_lock import WriterLock, lock_holder
from tests.harness.checks import wait_until_landed
from tests.harness.daemon import CLI_MODULE, DaemonProcess, gateway_env
from tests.harness.delta_readers import duckdb_connection

# Batches landed before the test's daemon or command runs: a ledger of its own.
EARLIER = application_id("earlier-ledger")
DAY = 86400.0


def days() -> tuple[str, str, str]:
    """Two closed dates and today's (still open), by the wall clock the command reads."""
    now = time.time()
    return utc_date(now - 3 * DAY), utc_date(now - 2 * DAY), utc_date(now)


def land(tables: Path, dates, batches: int, rows: int) -> Counter:
    """`batches` Delta commits of `rows` reads per date each, as the daemon's writer lands
    them (one file per date per batch); the message ids landed, each once."""
    writer = ArrowTableWriter(None, tables, EARLIER)
    landed: Counter = Counter()
    for batch in range(1, batches + 1):
        ids = [f"b{batch}-{date}-{i}" for date in dates for i in range(rows)]
        table = pa.table(
            {
                "message_id": ids,
                "reader_id": ["fx9600-01"] * len(ids),
                "date": [date for date in dates for _ in range(rows)],
            }
        )
        writer.write_batch(batch, {READS: table})
        landed.update(ids)
    return landed


def every_reader(spark_session, tables: Path) -> dict[str, Counter]:
    """The reads' ids as each Delta reader sees them: delta-spark, delta-rs and DuckDB."""
    spark = read_table(spark_session, tables, READS).select("message_id").collect()
    rust = read_table_arrow(tables, READS).column("message_id").to_pylist()
    duck = (
        duckdb_connection()
        .execute(f"SELECT message_id FROM delta_scan('{tables / READS}')")
        .fetchall()
    )
    return {
        "spark": Counter(r[0] for r in spark),
        "delta-rs": Counter(rust),
        "duckdb": Counter(r[0] for r in duck),
    }


def live_files(tables: Path) -> Counter:
    """Files the table's current snapshot lists, per date."""
    return Counter(Path(uri).parent.name for uri in DeltaTable(tables / READS).file_uris())


def files_on_disk(tables: Path) -> int:
    return len(list((tables / READS).glob("date=*/*.parquet")))


class CompactProcess(DaemonProcess):
    """`fxgate compact` watched like the daemon, and reaped the same way."""

    def __init__(self, workdir: Path, env, *args: str) -> None:
        super().__init__(workdir, env)
        self.args = args

    def start(self) -> None:
        self._launch(
            [sys.executable, "-m", CLI_MODULE, "compact", *self.args], self.env, self.workdir
        )


@pytest.fixture
def commands(tmp_path):
    started: list[CompactProcess] = []

    def run(env, *args: str) -> CompactProcess:
        command = CompactProcess(tmp_path, env, *args)
        started.append(command)
        command.start()
        return command

    yield run
    for command in started:
        command.reap()


def compact_in_process(data: Path, **environ: str):
    env = {"FXGATE__GATEWAY__DATA_DIR": str(data), **environ}
    return CliRunner().invoke(main, ["compact"], env=env)


@pytest.mark.spark
def test_with_the_daemon_stopped_compact_runs_a_pass_and_every_reader_sees_each_row_once(
    commands, spark_session, tmp_path
):
    data = tmp_path / "data"
    tables = data / "tables"
    dates = days()
    expected = land(tables, dates, batches=20, rows=3)
    assert live_files(tables) == {f"date={d}": 20 for d in dates}

    command = commands({"FXGATE__GATEWAY__DATA_DIR": str(data)})
    assert command.proc.wait(120) == 0, command.output()
    # The closed dates and the open one, each folded into one file; nothing vacuumed within
    # the 24 h retention, so a reader that opened the table before the pass finds its files.
    assert re.search(
        r"maintenance pass: reads: 60 file\(s\) into 3, 0 vacuumed, version \d+", command.output()
    ), command.output()
    assert live_files(tables) == {f"date={d}": 1 for d in dates}
    assert files_on_disk(tables) == 63
    # OPTIMIZE keeps the transaction identifiers: a replay of batch 20 would still be skipped.
    assert DeltaTable(tables / READS).transaction_version(EARLIER) == 20
    assert lock_holder(tables) is None
    found = every_reader(spark_session, tables)
    assert found == {"spark": expected, "delta-rs": expected, "duckdb": expected}


@pytest.mark.spark
def test_a_kill_between_optimize_and_vacuum_changes_no_reader_view_and_the_next_pass_finishes(
    commands, spark_session, tmp_path
):
    point = "maintenance_after_optimize_before_vacuum"
    data = tmp_path / "data"
    tables = data / "tables"
    expected = land(tables, days()[:2], batches=10, rows=3)
    env = {
        "FXGATE__GATEWAY__DATA_DIR": str(data),
        "FXGATE__COMPACTION__VACUUM_RETENTION_HOURS": "0",
    }

    doomed = commands({**env, "FXGATE_CRASH_AT": point})
    assert doomed.proc.wait(120) == -9, doomed.output()
    assert doomed.count_logs(f"crash point {point} reached") == 1
    # OPTIMIZE committed, VACUUM never ran: the replaced files are on disk, no snapshot lists
    # them, and the kernel let the writer lock go with the process.
    assert live_files(tables) == {f"date={d}": 1 for d in days()[:2]}
    assert files_on_disk(tables) == 22
    assert lock_holder(tables) is None
    found = every_reader(spark_session, tables)
    assert found == {"spark": expected, "delta-rs": expected, "duckdb": expected}

    survivor = commands(env)
    assert survivor.proc.wait(120) == 0, survivor.output()
    assert "reads: 0 file(s) into 0, 20 vacuumed" in survivor.output()
    assert files_on_disk(tables) == 2
    found = every_reader(spark_session, tables)
    assert found == {"spark": expected, "delta-rs": expected, "duckdb": expected}


def test_a_second_compact_while_another_holds_the_tables_is_refused_and_changes_nothing(
    tmp_path,
):
    data = tmp_path / "data"
    tables = data / "tables"
    land(tables, days()[:1], batches=3, rows=2)
    version = DeltaTable(tables / READS).version()

    with WriterLock(tables, "fxgate compact"):
        result = compact_in_process(data)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"fxgate compact: the tables are being written by fxgate compact (pid {os.getpid()}); "
        "try again when it has finished\n"
    )
    assert not (data / "compact").exists()  # no request: only the daemon takes requests
    assert DeltaTable(tables / READS).version() == version
    assert files_on_disk(tables) == 3


def test_compact_refuses_tables_of_the_layout_before_delta_and_names_the_daemon_start(tmp_path):
    data = tmp_path / "data"
    tables = data / "tables"
    old = tables / READS / "date=2026-11-20" / "batch_id=7"
    old.mkdir(parents=True)
    pq.write_table(pa.table({"message_id": ["m1", "m2"]}), old / "part-00000.parquet")

    result = compact_in_process(data)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"fxgate compact: reads in {tables} still in the layout before Delta: start the daemon "
        "once, it converts them in place before its first write\n"
    )
    assert sorted(p.name for p in (tables / READS).iterdir()) == ["date=2026-11-20"]
    assert [p.name for p in old.iterdir()] == ["part-00000.parquet"]
    assert lock_holder(tables) is None


@pytest.mark.spark
@pytest.mark.broker
def test_while_the_daemon_runs_compact_leaves_a_request_that_the_daemon_runs(
    mosquitto, daemon_factory, commands, spark_session, tmp_path
):
    data = tmp_path / "data"
    tables = data / "tables"
    dates = days()[:2]
    expected = land(tables, dates, batches=10, rows=3)
    # No scheduled pass within the test: the one that runs is the one asked for.
    env = {**gateway_env(mosquitto, data), "FXGATE__COMPACTION__START_DELAY_SECONDS": "3600"}
    daemon = daemon_factory(env)
    daemon.wait_for_log(r"spark writer ready", timeout=120)
    assert lock_holder(tables)["role"] == "daemon"

    mark = daemon.mark()
    handed = commands(env)
    assert handed.proc.wait(60) == 0, handed.output()
    assert f"the daemon (pid {daemon.pid}) maintains the tables" in handed.output()
    assert "maintenance requested" in handed.output()
    daemon.wait_for_log(r"compaction request\(s\) done", timeout=120, after=mark)
    assert daemon.count_logs(r"maintenance pass \(requested by fxgate compact\): reads: 20 file")
    assert list((data / "compact").glob("*.request")) == []
    assert live_files(tables) == {f"date={d}": 1 for d in dates}
    assert daemon.terminate() == 0
    assert lock_holder(tables) is None
    found = every_reader(spark_session, tables)
    assert found == {"spark": expected, "delta-rs": expected, "duckdb": expected}


@pytest.mark.spark
@pytest.mark.broker
def test_a_batch_compacted_before_the_ledger_marked_it_is_skipped_by_its_replay(
    mosquitto, daemon_factory, commands, spark_session, tmp_path
):
    """The daemon dies between batch 3's commits and the ledger's mark; `fxgate compact` folds
    batch 3's file in with the others; the restart replays batch 3, and the table's log (whose
    transaction identifiers OPTIMIZE kept) says it is in: nothing lands twice."""
    from actors.devtools.simulate import expected_read_ids, simulate

    data = tmp_path / "data"
    tables = data / "tables"
    env = gateway_env(mosquitto, data)
    doomed = daemon_factory({**env, "FXGATE_CRASH_AT": "after_spark_job_before_mark:3"})
    doomed.wait_for_log(r"source: subscribed", timeout=120)
    expected: set[str] = set()
    for round_ in range(3):
        mark = doomed.mark()
        published = simulate(
            mosquitto.host, mosquitto.port, readers=2, rate=0, count=20, qos=1, seed=round_
        )
        assert published.failed == 0
        expected |= expected_read_ids(published.published)
        if round_ < 2:  # a batch (or the kill) before the next round: three batches at least
            doomed.wait_for_log(r"batch \d+ written|crash point", timeout=60, after=mark)
    assert doomed.proc.wait(120) == -9, doomed.output()
    assert live_files(tables).total() == 3  # batches 1 to 3, one file each

    command = commands({"FXGATE__GATEWAY__DATA_DIR": str(data)})
    assert command.proc.wait(120) == 0, command.output()
    assert "reads: 3 file(s) into 1" in command.output()

    survivor = daemon_factory(env)
    wait_until_landed(survivor, data, len(expected))
    assert survivor.count_logs(r"Batch 3 written in .*\(reads.* had it already\)") == 1
    assert survivor.terminate() == 0
    ids, _ = landed_ids_arrow(tables)
    assert Counter(ids) == Counter(dict.fromkeys(expected, 1))
    found = every_reader(spark_session, tables)
    assert found["spark"] == found["delta-rs"] == found["duckdb"] == Counter(ids)


@pytest.mark.spark
@pytest.mark.timeout(600)  # OPTIMIZE and VACUUM as Spark jobs: minutes on a loaded 2-core machine
def test_tables_only_spark_reaches_are_maintained_through_delta_spark(
    spark_session, tmp_path, monkeypatch
):
    """A tables URI this machine's disk does not hold (HDFS, S3) is maintained by a pass
    through delta-spark; here a local directory stands in for it, the command's session is the
    suite's."""
    import actors.app.compact
    import spark.session

    data = tmp_path / "data"
    tables = data / "tables"
    dates = days()[:2]
    expected = land(tables, dates, batches=5, rows=2)
    monkeypatch.setattr(actors.app.compact, "local_path", lambda location: None)
    monkeypatch.setattr(spark.session, "build_session", lambda *_a, **_k: spark_session)
    monkeypatch.setattr(spark.session, "stop_session", lambda _session: None)

    result = compact_in_process(data)
    assert result.exit_code == 0, result.output
    assert "maintenance pass: reads: 10 file(s) into 2" in result.output
    assert live_files(tables) == {f"date={d}": 1 for d in dates}
    assert DeltaTable(tables / READS).transaction_version(EARLIER) == 5
    found = every_reader(spark_session, tables)
    assert found == {"spark": expected, "delta-rs": expected, "duckdb": expected}


def test_beside_a_shared_groups_members_compact_claims_each_optimize_as_they_do(tmp_path):
    """A group's members hold no writer lock (DESIGN §7.12): the command runs its pass itself,
    and an unclaimed OPTIMIZE could commit over one a member is making (delta-rs commits both:
    tests/spark/test_group_tables.py). Its claims are in the table's log."""
    from spark.tables import GROUP_OF, MAINTAINED_BY, GroupTableWriter

    data = tmp_path / "data"
    tables = data / "tables"
    member = GroupTableWriter(None, tables, EARLIER, group="fxgate-env-a", member="fxgate-env-a-a1")
    for batch in range(1, 4):
        ids = [f"b{batch}-{i}" for i in range(5)]
        table = pa.table(
            {
                "message_id": ids,
                "reader_id": ["fx9600-01"] * 5,
                "date": [days()[0]] * 5,
            }
        )
        member.write_batch(batch, {READS: table})
    result = compact_in_process(
        data,
        FXGATE__SOURCE__SHARED_SUBSCRIPTION_GROUP="fxgate",
        FXGATE__SOURCE__ENVIRONMENT_ID="env-a",
        FXGATE__SOURCE__INSTANCE_ID="ops",
    )
    assert result.exit_code == 0, result.output
    table = DeltaTable(tables / READS)
    configuration = table.metadata().configuration
    assert configuration[GROUP_OF] == "fxgate-env-a"
    assert configuration[MAINTAINED_BY] == "fxgate-env-a-ops (fxgate compact)"
    claims = [e for e in table.history() if e["operation"] == "SET TBLPROPERTIES"]
    assert len(claims) >= 2  # one before each OPTIMIZE (the closed dates, the open date)
    ids = table.to_pyarrow_table().column("message_id").to_pylist()
    assert len(ids) == len(set(ids)) == 15
