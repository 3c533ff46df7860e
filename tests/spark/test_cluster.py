"""The gateway writing its tables through a standalone Spark cluster (a master and one worker on
loopback, tests/harness/spark_cluster.py) to a `file://` URI: reads land, the worker's executor
runs the tasks, and SIGKILLs of the daemon lose and double nothing."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from actors.devtools.simulate import expected_read_ids
from spark.location import is_local_master
from spark.report import compare, landed_ids_arrow, landed_ids_spark
from spark.session import master_on_loopback
from tests.harness.checks import wait_until_landed
from tests.harness.daemon import gateway_env
from tests.harness.publisher import SoakPublisher

SEED = int(os.environ.get("FXGATE_CLUSTER_SEED", str(random.SystemRandom().randrange(1 << 30))))
FAULTS = min(int(os.environ.get("FXGATE_CLUSTER_FAULTS", "1")), 3)
SESSION_STARTED = r"Spark session started: master spark://\S+, application (app-[\w-]+), "


def test_only_local_masters_run_the_executors_in_the_driver():
    assert is_local_master("local") and is_local_master("local[2]") and is_local_master("local[*]")
    assert not is_local_master("spark://127.0.0.1:7077")
    assert not is_local_master("localhost")


def test_a_master_on_loopback_is_told_from_a_remote_one():
    assert master_on_loopback("spark://127.0.0.1:7077")
    assert master_on_loopback("spark://localhost:7077,[::1]:7078")
    assert not master_on_loopback("spark://127.0.0.1:7077,spark-a.example:7077")
    assert not master_on_loopback("spark://10.0.0.5:7077")
    assert not master_on_loopback("local[2]")


def cluster_env(broker, cluster, data: Path, tables: Path) -> dict[str, str]:
    return {
        **gateway_env(broker, data),
        "FXGATE__SPARK__MASTER": cluster.url,
        "FXGATE__SPARK__TABLES_DIR": f"file://{tables}",
        # The worker offers 1 GiB; a smaller executor keeps the shared machine's memory free.
        "FXGATE__SPARK__CONF__spark.executor.memory": "512m",
        # These tests are about landing through a cluster. A maintenance pass through
        # delta-spark (OPTIMIZE and VACUUM of four tables) took minutes on this 2-core machine
        # under load, and a stop waits for the pass it is in: two runs here ended with the stop
        # timeout (exit 3). Maintenance through Spark is tested in test_compact_command.py.
        "FXGATE__COMPACTION__START_DELAY_SECONDS": "3600",
    }


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_daemon_on_a_standalone_master_lands_through_its_worker_and_sigkills_lose_no_read(
    mosquitto, spark_cluster, daemon_factory, spark_session, tmp_path
):
    """Reads land through the cluster (the worker's executor runs the tasks, the tables at the
    `file://` URI), and SIGKILLs of the daemon while it writes there lose and double none."""
    rng = random.Random(SEED)
    # Kills at exact moments of the Spark leg -- while the job's tasks run on the worker, and
    # after the job before the ledger knows -- and at a random moment: `make soak` all three in
    # random order, `make test` one of them (each daemon start here is a JVM registering with
    # the cluster, 30-50 s under load).
    faults = rng.sample(["mid_spark_job", "after_spark_job_before_mark", "sigkill"], FAULTS)
    print(f"cluster kill seed {SEED} (FXGATE_CLUSTER_SEED replays it): {', '.join(faults)}")
    data, tables = tmp_path / "data", tmp_path / "lake" / "tables"
    uri = f"file://{tables}"
    env = cluster_env(mosquitto, spark_cluster, data, tables)
    publisher = SoakPublisher(mosquitto.host, mosquitto.port, readers=2, qos=1, rate=100, seed=3)
    publishing = False
    apps: list[str] = []
    moments: list[str] = []  # each killed daemon's last log line, for the report
    daemons = []
    try:
        daemon = None
        for fault in [*faults, None]:
            armed = {} if fault in (None, "sigkill") else {"FXGATE_CRASH_AT": f"{fault}:2"}
            previous, daemon = daemon, daemon_factory({**env, **armed})
            daemons.append(daemon)
            apps.append(daemon.wait_for_log(SESSION_STARTED, timeout=180).group(1))
            if previous is not None and previous.count_logs(r"crash point \w+ reached"):
                # The batch the crash point interrupted is written again, same id and rows.
                daemon.wait_for_log(r"replaying batch \d+", timeout=180)
            if not publishing:
                daemon.wait_for_log(r"source: subscribed", timeout=180)
                publisher.start()
                publishing = True
            if fault == "sigkill":
                # Once batches go through the cluster, after a random amount of publishing.
                daemon.wait_for_log(r"batch \d+ written", timeout=180)
                assert publisher.wait_for_acks(len(publisher.acked) + rng.randrange(1, 400), 120)
                moments.append(daemon.output().splitlines()[-1])
                daemon.kill()
            elif fault is not None:
                assert daemon.proc.wait(240) == -9, daemon.output()
                assert daemon.count_logs(f"crash point {fault} reached") == 1
                moments.append(daemon.output().splitlines()[-1])
        publishing = False
        publisher.stop()
        expected = expected_read_ids(publisher.acked)
        assert not publisher.refused
        wait_until_landed(daemon, data, len(expected), timeout=300, tables=uri)
        assert daemon.terminate() == 0
    finally:
        if publishing:
            publisher.stop()

    print("killed after:\n  " + "\n  ".join(moments))
    # Batches begun by a killed daemon and written again, same id, by the next one.
    replays = sum(daemon.count_logs(r"replaying batch \d+") for daemon in daemons)
    # Every daemon's writes went through the worker's executors: in local mode there is no
    # such application at the master and no executor log under the worker's directory.
    names = {app["id"]: app["name"] for app in spark_cluster.applications()}
    assert [names.get(app) for app in apps] == ["fxgate"] * (len(faults) + 1)
    assert [spark_cluster.tasks_run(app) >= 1 for app in apps] == [True] * (len(faults) + 1)
    assert not (data / "tables").exists()  # the URI was used, not the default location
    ids, _ = landed_ids_arrow(uri)
    plain = compare(expected, ids)
    ids, readers = landed_ids_spark(spark_session, uri)
    through_spark = compare(expected, ids, readers)
    print(
        f"{len(faults)} SIGKILLs, {replays} batch(es) replayed, {len(expected)} reads published "
        f"and acknowledged, {through_spark.landed} landed, {len(through_spark.missing)} "
        f"missing, {len(through_spark.duplicates)} duplicates"
    )
    assert plain.exact, plain.lines()
    assert through_spark.exact, through_spark.lines()
    assert set(through_spark.per_reader) == {"fx9600-01", "fx9600-02"}
