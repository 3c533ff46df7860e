"""SIGKILL at every named crash point, at QoS 1 and QoS 2: nothing lost, nothing doubled."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from actors import crashpoints
from actors.devtools.simulate import expected_read_ids, simulate
from spark.report import compare, landed_ids_arrow, landed_ids_spark
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


# The daemon writes batches with pyarrow by default ([spark] landing = "auto"); the points of a
# Spark job's write are reached with landing = "spark".
SPARK_JOBS = {"FXGATE__SPARK__LANDING": "spark"}
# Groups of at most 20 messages: 600 reads then make at least 30 commits however the broker paces
# its deliveries (mosquitto 2.0.11 sends past our Receive Maximum while it drains a queued
# session, and a group may take up to 200 by default: 600 reads could be 3 commits).
SMALL_GROUPS = {"FXGATE__LEDGER__GROUP_COMMIT_MAX_MESSAGES": "20"}
CASES = [
    ("after_ledger_commit_before_ack", 1, "5", SMALL_GROUPS),
    ("after_ledger_commit_before_ack", 2, "5", SMALL_GROUPS),
    ("after_pubrec_before_pubrel", 2, "40", {}),
    ("after_batch_begin_before_job", 1, "1", {}),
    ("after_batch_begin_before_job", 2, "1", {}),
    ("landing_after_write_before_swap", 1, "1", {}),
    ("landing_after_write_before_swap", 2, "1", {}),
    ("after_spark_job_before_mark", 1, "1", {}),
    ("mid_spark_job", 1, "1", SPARK_JOBS),
    ("mid_spark_job", 2, "1", SPARK_JOBS),
    ("after_spark_job_before_mark", 2, "1", SPARK_JOBS),
]


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
    env = {**gateway_env(mosquitto, data), **extra}
    doomed = daemon_factory({**env, "FXGATE_CRASH_AT": f"{point}:{hit}"})
    doomed.wait_for_log(r"source: subscribed", timeout=60)
    published = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=300, qos=qos)
    assert published.failed == 0
    expected = expected_read_ids(published.published)

    try:
        status = doomed.proc.wait(180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the daemon did not reach {point} {hit} time(s):\n{doomed.output()}")
    assert status == -9, doomed.output()
    assert doomed.count_logs(f"crash point {point} reached") == 1
    assert doomed.alive_spawned() == []

    survivor = daemon_factory(env)
    wait_until_landed(survivor, data, len(expected))
    assert survivor.terminate() == 0

    ids, readers = landed_ids_arrow(data / "tables")
    assert compare(expected, ids).exact, compare(expected, ids).lines()
    ids, readers = landed_ids_spark(spark_session, data / "tables")
    result = compare(expected, ids, readers)
    assert result.exact, result.lines()
    assert result.per_reader == {"fx9600-01": 300, "fx9600-02": 300}


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
