"""`fxgate compact` as its own process: a pass and exit 0, a SIGKILL at each named crash point
inside the pass and every row still once for every reader, the refusal of --include-open while a
daemon runs, and a request handed to that daemon instead."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pytest

from spark.compaction import COMPACTED_BASE, lock_holder
from spark.report import landed_ids_arrow
from spark.tables import READS, read_table
from tests.harness.checks import wait_until_landed
from tests.harness.daemon import CLI_MODULE, DaemonProcess, gateway_env
from tests.spark.compaction_data import land_day

pytestmark = pytest.mark.spark

DAYS = ["2026-11-20", "2026-11-21"]


class CompactProcess(DaemonProcess):
    """`fxgate compact` watched like the daemon, so its JVM is reaped the same way."""

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


def every_reader(spark_session, tables: Path) -> dict[str, Counter]:
    arrow = ds.dataset(tables / READS, partitioning="hive").to_table(columns=["message_id"])
    glob = f"{tables / READS}/date=*/batch_id=*/*.parquet"
    duck = duckdb.sql(
        f"SELECT message_id FROM read_parquet('{glob}', hive_partitioning=true, union_by_name=true)"
    ).fetchall()
    spark = read_table(spark_session, tables, READS).select("message_id").collect()
    return {
        "spark": Counter(r[0] for r in spark),
        "pyarrow": Counter(arrow.column(0).to_pylist()),
        "duckdb": Counter(r[0] for r in duck),
    }


def assert_killed_mid_pass(doomed, point: str, spark_session, tables: Path, expected) -> None:
    """Killed at `point`, one step of the pass left half done, and every reader still sees
    each row once."""
    assert doomed.proc.wait(180) == -9, doomed.output()
    assert doomed.count_logs(f"crash point {point} reached") == 1
    leftovers = [p.name for p in (tables / READS).iterdir() if p.name.startswith(".compacting-")]
    assert len(leftovers) == 1
    assert all(ids == expected for ids in every_reader(spark_session, tables).values())


def assert_pass_finished(spark_session, tables: Path, expected) -> None:
    """After the next pass: each row once for every reader, each date one compacted
    directory, nothing half done, and the replaced dates waiting out their grace period."""
    assert all(ids == expected for ids in every_reader(spark_session, tables).values())
    names = sorted(p.name for p in (tables / READS).iterdir())
    assert not [n for n in names if n.startswith(".compacting-")]
    assert [n for n in names if n.startswith("date=")] == [f"date={d}" for d in DAYS]
    for day in DAYS:
        (directory,) = (tables / READS / f"date={day}").iterdir()
        assert directory.name.startswith("batch_id=1000000000000")
    assert len([n for n in names if n.startswith(".replaced-")]) == 2


def test_compact_runs_one_pass_over_the_closed_dates_and_exits_0(commands, spark_session, tmp_path):
    data = tmp_path / "data"
    rows = land_day(data / "tables" / READS, DAYS, batches=40, rows=5)
    command = commands({"FXGATE__GATEWAY__DATA_DIR": str(data)})

    assert command.proc.wait(180) == 0, command.output()
    assert "compaction pass: 2 date(s) compacted: 40 partition(s)" in command.output()
    assert (
        sorted(p.name for p in (data / "tables" / READS).glob("date=*/batch_id=*"))
        == [f"batch_id={COMPACTED_BASE + 1}"] * 2
    )
    expected = Counter(f"m{s}" for s in range(1, rows + 1))
    assert all(ids == expected for ids in every_reader(spark_session, data / "tables").values())


def test_a_kill_at_a_compaction_crash_point_leaves_every_row_once_and_the_next_pass_finishes(
    commands, spark_session, tmp_path
):
    """The command killed before its swap (the daemon's scheduled pass is killed after its swap,
    below: the two points, each in one of the two processes that compact)."""
    point = "compaction_after_write_before_swap"
    data = tmp_path / "data"
    tables = data / "tables"
    rows = land_day(tables / READS, DAYS, batches=30, rows=5)
    expected = Counter(f"m{s}" for s in range(1, rows + 1))
    env = {"FXGATE__GATEWAY__DATA_DIR": str(data)}

    doomed = commands({**env, "FXGATE_CRASH_AT": point}, "--include-open")
    doomed.wait_for_log(r"compacting ", timeout=120)
    doomed.remember_children()
    assert_killed_mid_pass(doomed, point, spark_session, tables, expected)

    survivor = commands(env)
    assert survivor.proc.wait(180) == 0, survivor.output()
    assert "1 interrupted step(s) finished" in survivor.output()
    assert_pass_finished(spark_session, tables, expected)
    assert doomed.alive_spawned() == []


@pytest.mark.broker
def test_a_kill_inside_the_daemons_scheduled_pass_leaves_every_row_once_and_its_restart_finishes(
    mosquitto, daemon_factory, spark_session, tmp_path
):
    point = "compaction_after_swap_before_retire"
    data = tmp_path / "data"
    tables = data / "tables"
    rows = land_day(tables / READS, DAYS, batches=20, rows=5)
    expected = Counter(f"m{s}" for s in range(1, rows + 1))
    env = {**gateway_env(mosquitto, data), "FXGATE__COMPACTION__START_DELAY_SECONDS": "0"}

    doomed = daemon_factory({**env, "FXGATE_CRASH_AT": point})
    # Swapped, not yet retired: the old date waits under the hidden staging name.
    assert_killed_mid_pass(doomed, point, spark_session, tables, expected)

    survivor = daemon_factory(env)
    survivor.wait_for_log(r"compaction pass \(.*1 interrupted step\(s\) finished", timeout=180)
    assert survivor.terminate() == 0
    assert_pass_finished(spark_session, tables, expected)


@pytest.mark.broker
def test_while_the_daemon_runs_compact_hands_it_a_request_and_include_open_is_refused(
    mosquitto, daemon_factory, commands, spark_session, tmp_path
):
    data = tmp_path / "data"
    rows = land_day(data / "tables" / READS, DAYS, batches=20, rows=5)
    env = gateway_env(mosquitto, data)
    daemon = daemon_factory(env)
    daemon.wait_for_log(r"spark writer ready", timeout=120)
    assert lock_holder(data / "tables")["role"] == "daemon"

    refused = commands(env, "--include-open")
    assert refused.proc.wait(60) == 2
    assert "the daemon is running" in refused.output()
    assert "stop it first" in refused.output()

    mark = daemon.mark()
    handed = commands(env)
    assert handed.proc.wait(60) == 0, handed.output()
    assert "compaction requested" in handed.output()
    daemon.wait_for_log(r"compaction request\(s\) done", timeout=120, after=mark)
    assert "2 date(s) compacted: 20 partition(s)" in daemon.output(), daemon.output()
    assert list((data / "compact").glob("*.request")) == []
    assert daemon.terminate() == 0
    assert lock_holder(data / "tables") is None
    expected = Counter(f"m{s}" for s in range(1, rows + 1))
    assert all(ids == expected for ids in every_reader(spark_session, data / "tables").values())


@pytest.mark.broker
def test_a_batch_replayed_after_its_date_was_compacted_lands_once(
    mosquitto, daemon_factory, spark_session, tmp_path
):
    """The daemon dies between the Spark job and the ledger's mark; a compaction that did not
    ask the ledger takes the batch in; the restart replays it and writes none of it twice."""
    from actors.devtools.simulate import expected_read_ids, simulate
    from spark.compaction import Compactor

    data = tmp_path / "data"
    env = gateway_env(mosquitto, data)
    doomed = daemon_factory({**env, "FXGATE_CRASH_AT": "after_spark_job_before_mark:1"})
    doomed.wait_for_log(r"source: subscribed", timeout=120)
    published = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=100, qos=1)
    expected = expected_read_ids(published.published)
    assert doomed.proc.wait(180) == -9, doomed.output()

    tables = data / "tables"
    compacted = Compactor(spark_session, tables).run(closed_before=None)
    assert compacted.compacted  # the batch the ledger still holds open is in compacted files

    survivor = daemon_factory(env)
    wait_until_landed(survivor, data, len(expected))
    survivor.wait_for_log(r"compacted with it already", timeout=60)
    assert survivor.terminate() == 0
    ids, _ = landed_ids_arrow(tables)
    assert Counter(ids) == Counter(expected)
    found = every_reader(spark_session, tables)
    assert found["spark"] == found["pyarrow"] == found["duckdb"] == Counter(expected)


def test_compact_refuses_tables_that_are_not_on_this_machines_disk(tmp_path):
    from click.testing import CliRunner

    from actors.app.cli import main

    env = {
        "FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data"),
        "FXGATE__SPARK__TABLES_DIR": "hdfs://namenode:8020/fxgate/tables",
    }
    result = CliRunner().invoke(main, ["compact"], env=env)
    assert result.exit_code == 2
    assert "not on this machine's disk" in result.stderr
    assert not (tmp_path / "data" / "compact").exists()
