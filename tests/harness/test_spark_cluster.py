"""The cluster fixture's promise: stopping it ends the master, the worker and every executor the
worker launched for an application that is still running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.harness.checks import wait_until
from tests.harness.spark_cluster import SparkCluster

REPO = Path(__file__).resolve().parents[2]

# A driver that keeps its application (and so its executor) alive until its stdin closes.
DRIVER = """
import sys
from pathlib import Path

from spark.session import build_session, stop_session

session = build_session(sys.argv[1], Path(sys.argv[2]), conf={"spark.executor.memory": "512m"})
print("driver ready", flush=True)
sys.stdin.read()
stop_session(session)
"""


def executors(cluster: SparkCluster) -> list[int]:
    return [
        pid
        for pid in cluster.worker.remember_tree()
        if "CoarseGrainedExecutorBackend" in " ".join(_cmdline(pid))
    ]


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return []


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_stopping_the_cluster_ends_its_jvms_and_the_executor_of_a_running_application(tmp_path):
    cluster = SparkCluster(tmp_path / "cluster")
    driver = None
    try:
        cluster.start()
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, cluster.url, str(tmp_path / "driver")],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "driver ready"
        cluster.master.wait_for(r"Launching executor app-[\w-]+/0 on worker", 60)
        assert wait_until(lambda: executors(cluster), timeout=60), cluster.worker.output()
        launched = executors(cluster)
    finally:
        cluster.stop()
        if driver is not None:
            # Its Spark JVM too, by PID: it would only exit once it noticed its parent gone.
            try:
                jvms = psutil.Process(driver.pid).children(recursive=True)
            except psutil.Error:  # already ended (a zombie has no children to ask about)
                jvms = []
            driver.kill()
            driver.wait(30)
            for jvm in jvms:
                try:
                    jvm.kill()
                    jvm.wait(30)
                except psutil.NoSuchProcess:
                    pass

    assert cluster.master.proc.poll() is not None
    assert cluster.worker.proc.poll() is not None
    assert [pid for pid in launched if psutil.pid_exists(pid) and _cmdline(pid)] == []
