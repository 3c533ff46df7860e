"""SIGKILL at every named crash point, at QoS 1 and QoS 2: nothing lost, nothing doubled."""

import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from actors import crashpoints
from actors.devtools.simulate import expected_read_ids, simulate
from persistence.compaction_request import write_compaction_request
from spark.report import compare, landed_ids_arrow, landed_ids_spark
from spark.tables import READER_EVENTS, READS, application_id, read_table_arrow
from tests.harness.checks import wait_until_landed
from tests.harness.daemon import gateway_env
from tests.harness.mqtt import publish_all

REPO = Path(__file__).resolve().parents[2]


def test_an_unknown_crash_point_is_refused_with_the_known_names():
    with pytest.raises(crashpoints.CrashPointError, match="after_spark_job_before_mark"):
        crashpoints.arm("after_lunch")


def test_a_crash_point_counts_its_hits_before_it_fires(monkeypatch):
    fired = []
    monkeypatch.setattr(crashpoints, "_die", fired.append)
    crashpoints.arm("mid_spark_job:3")
    try:
        crashpoints.crash_point("mid_spark_job")
        crashpoints.crash_point("after_spark_job_before_mark")
        crashpoints.crash_point("mid_spark_job")
        assert fired == []
        crashpoints.crash_point("mid_spark_job")
        assert fired == ["mid_spark_job"]
    finally:
        crashpoints.arm(None)


# The daemon writes batches with pyarrow and delta-rs by default ([spark] landing = "auto"); the
# points of a Spark job's write are reached with landing = "spark". Only the doomed daemon lands
# so: the survivor lands with delta-rs, and replays what the killed Spark job left (the two paths
# keep one contract, tests/spark/test_tables.py; here under a real kill) with one JVM less.
SPARK_JOBS = {"FXGATE__SPARK__LANDING": "spark"}
# Groups of at most 20 messages: 600 reads then make at least 30 commits however the broker paces
# its deliveries (mosquitto 2.0.11 sends past our Receive Maximum while it drains a queued
# session, and a group may take up to 200 by default: 600 reads could be 3 commits).
SMALL_GROUPS = {"FXGATE__LEDGER__GROUP_COMMIT_MAX_MESSAGES": "20"}
# Batches of one pack (at most 50 messages): 600 reads make a dozen batches and as many files.
SMALL_BATCHES = {"FXGATE__SPARK__BATCH_MAX_ROWS": "50"}
# Management events beside the reads: a batch then commits to two tables, `reads` and
# `reader_events`, one after the other.
MANAGEMENT = {**SMALL_BATCHES, "FXGATE__SOURCE__MANAGEMENT_TOPICS": '["zebra/fx/+/mgmt"]'}
# The maintenance points: no scheduled pass (it could come before the reads table has a file,
# and a point is reached once per table); a pass asked for by `fxgate compact`'s request once
# batch 3 is written, while the rest still land, over a reads table of two files or more (it is
# the first table a pass takes). The replaced files are vacuumed at once. Only the doomed daemon
# runs so: the survivor has the default schedule, and a reader of the table could lose a file
# it had listed to a vacuum of 0 hours.
MAINTAINED = {
    **SMALL_BATCHES,
    "FXGATE__COMPACTION__START_DELAY_SECONDS": "3600",
    "FXGATE__COMPACTION__VACUUM_RETENTION_HOURS": "0",
}
# A shared group of one (DESIGN §7.12): batches land by merges into the group's table, and
# each OPTIMIZE is claimed first. The survivor is in the group too.
GROUP = {**SMALL_BATCHES, "FXGATE__SOURCE__SHARED_SUBSCRIPTION_GROUP": "fxgate"}
GROUP_MAINTAINED = {**MAINTAINED, **GROUP}
CASES = [
    ("after_ledger_commit_before_ack", 1, "5", SMALL_GROUPS),
    ("after_ledger_commit_before_ack", 2, "5", SMALL_GROUPS),
    ("after_pubrec_before_pubrel", 2, "40", {}),
    ("after_batch_begin_before_job", 1, "1", {}),
    ("after_batch_begin_before_job", 2, "1", {}),
    ("landing_after_write_before_commit", 1, "1", {}),
    ("landing_after_write_before_commit", 2, "1", {}),
    # Reached between each two of a batch's four tables, empty or not: the 4th time is after
    # `reads` in the second batch (the first may hold the start's life-cycle events only).
    ("landing_between_tables", 1, "4", MANAGEMENT),
    ("after_spark_job_before_mark", 1, "1", {}),
    ("maintenance_inside_optimize", 1, "1", MAINTAINED),
    ("maintenance_after_optimize_before_vacuum", 1, "1", MAINTAINED),
    ("maintenance_inside_vacuum", 1, "1", MAINTAINED),
    ("group_before_merge", 1, "3", GROUP),
    ("maintenance_claimed_before_optimize", 1, "1", GROUP_MAINTAINED),
    # The QoS is the intake's: a Spark job's points are each run at one of them.
    ("mid_spark_job", 1, "1", SPARK_JOBS),
    ("after_spark_job_before_mark", 2, "1", SPARK_JOBS),
]


def killed_batch(data: Path) -> tuple[str, int, set[str]]:
    """The ledger's gateway id, the oldest batch it began and has not committed (the next may
    be begun already, in the parse worker) and the last topic level of that batch's messages."""
    with sqlite3.connect(data / "ledger.sqlite") as conn:
        (gateway,) = conn.execute("SELECT value FROM identity WHERE name = 'gateway_id'").fetchone()
        (batch,) = conn.execute(
            "SELECT min(batch_id) FROM batches WHERE state = 'writing'"
        ).fetchone()
        topics = conn.execute("SELECT DISTINCT topic FROM inbound WHERE batch_id = ?", (batch,))
        kinds = {topic.rsplit("/", 1)[-1] for (topic,) in topics}
    return gateway, batch, kinds


def batch_in(tables: Path, name: str, app_id: str) -> int:
    """The last batch of `app_id` that table `name` has (0: none, or no table)."""
    path = tables / name
    if not (path / "_delta_log").is_dir():
        return 0
    return DeltaTable(str(path)).transaction_version(app_id) or 0


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.parametrize(
    ("point", "qos", "hit", "extra"),
    CASES,
    ids=[f"{p}-qos{q}{'-spark' if extra is SPARK_JOBS else ''}" for p, q, _, extra in CASES],
)
def test_a_kill_at_a_named_crash_point_loses_and_doubles_nothing(
    point, qos, hit, extra, mosquitto, daemon_factory, spark_session, tmp_path
):
    data = tmp_path / "data"
    tables = data / "tables"
    maintained = extra is MAINTAINED or extra is GROUP_MAINTAINED
    survivor_extra = (
        GROUP if extra is GROUP_MAINTAINED else {} if maintained or extra is SPARK_JOBS else extra
    )
    env = {**gateway_env(mosquitto, data), **survivor_extra}
    doomed = daemon_factory({**env, **extra, "FXGATE_CRASH_AT": f"{point}:{hit}"})
    doomed.wait_for_log(r"source: subscribed", timeout=60)
    management = {"gpi_every": 10} if extra is MANAGEMENT else {}
    # The maintenance cases publish in two parts, the pass asked for in between.
    first = 100 if maintained else 300
    published = simulate(
        mosquitto.host, mosquitto.port, readers=2, rate=0, count=first, qos=qos, **management
    )
    assert published.failed == 0
    records = list(published.published)
    if maintained:
        doomed.wait_for_log(r"batch 3 written", timeout=120)
        write_compaction_request(data)
        rest = simulate(mosquitto.host, mosquitto.port, 2, 0, count=200, qos=qos, seed=1)
        assert rest.failed == 0
        records += rest.published
    expected = expected_read_ids(records)

    try:
        status = doomed.proc.wait(180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the daemon did not reach {point} {hit} time(s):\n{doomed.output()}")
    assert status == -9, doomed.output()
    assert doomed.count_logs(f"crash point {point} reached") == 1
    assert doomed.alive_spawned() == []
    # What the kill left is a Delta snapshot: a half-written batch or a half-done pass shows
    # no row twice and none that was not published.
    ids, _ = landed_ids_arrow(tables)
    assert not compare(expected, ids).duplicates and not compare(expected, ids).unexpected
    if point == "landing_between_tables":
        # A batch of reads and management events is in `reads`, not in `reader_events`, and
        # the ledger has it open.
        gateway, batch, kinds = killed_batch(data)
        assert {"reads", "mgmt"} <= kinds, (batch, kinds)
        app_id = application_id(gateway)
        assert batch_in(tables, READS, app_id) == batch
        assert batch_in(tables, READER_EVENTS, app_id) < batch
    if point == "maintenance_claimed_before_optimize":
        # The claim is committed; no OPTIMIZE followed it.
        history = DeltaTable(str(tables / READS)).history()
        operations = [commit["operation"] for commit in history]
        assert "SET TBLPROPERTIES" in operations and "OPTIMIZE" not in operations
    if point in ("maintenance_after_optimize_before_vacuum", "maintenance_inside_vacuum"):
        # The pass died on the reads table after compacting its files.
        history = DeltaTable(str(tables / READS)).history()
        assert "OPTIMIZE" in [commit["operation"] for commit in history]

    survivor = daemon_factory(env)
    wait_until_landed(survivor, data, len(expected))
    assert survivor.terminate() == 0

    ids, readers = landed_ids_arrow(tables)
    assert compare(expected, ids).exact, compare(expected, ids).lines()
    ids, readers = landed_ids_spark(spark_session, tables)
    result = compare(expected, ids, readers)
    assert result.exact, result.lines()
    assert result.per_reader == {"fx9600-01": 300, "fx9600-02": 300}
    if extra is MANAGEMENT:
        # Each management event once too: the replay skipped the table that had its batch.
        events = read_table_arrow(tables, READER_EVENTS).column("message_key").to_pylist()
        assert Counter(events) == Counter(r.message_key for r in published.management)


class LineWatcher:
    """Collects a subprocess's output lines; wait() blocks on a condition until one matches."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc):
        for line in proc.stdout:
            with self.cond:
                self.lines.append(line.strip())
                self.cond.notify_all()

    def wait(self, text: str, timeout: float = 30.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: text in self.lines, timeout)


def bare_paho(broker, out: Path, *flags: str) -> tuple[subprocess.Popen, LineWatcher]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.harness.bare_paho",
            broker.host,
            str(broker.port),
            str(out),
            *flags,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    watcher = LineWatcher(proc)
    assert watcher.wait("subscribed"), "bare paho subscriber did not subscribe"
    return proc, watcher


@pytest.mark.broker
def test_a_bare_paho_subscriber_killed_between_pubrec_and_pubrel_loses_the_message(
    mosquitto, tmp_path
):
    """The gap fxgate closes (its side: test_a_kill_at_a_named_crash_point..[pubrec-qos2])."""
    out = tmp_path / "delivered.txt"
    doomed, _ = bare_paho(mosquitto, out, "--die-at-pubrel")
    try:
        publish_all(mosquitto.host, mosquitto.port, [("contrast/r1", b"the-read")], qos=2)
        assert doomed.wait(30) == -9
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(30)

    again, watcher = bare_paho(mosquitto, out)
    try:
        # On reconnect the broker re-sends PUBREL for the-read; paho no longer knows the id,
        # answers PUBCOMP and delivers nothing. A marker published now shows the stream moved on.
        publish_all(mosquitto.host, mosquitto.port, [("contrast/r1", b"marker")], qos=2)
        assert watcher.wait("delivered marker")
    finally:
        again.kill()
        again.wait(30)
    assert out.read_bytes().split() == [b"marker"]
