"""A standalone Spark cluster on loopback for tests: one master and one worker (1 core), started
from the installed pyspark's `bin/spark-class`, each JVM watched through its log lines.

Both JVMs and every executor the worker launched are ended by PID when the test ends, pass or
fail: the worker's process tree is recorded before the worker is stopped, because executors
left behind by a killed worker are re-parented and would outlive the test.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
import pyspark
import pytest

from actors.devtools.broker_process import free_port
from tests.harness.watched_process import WatchedProcess

PYSPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = PYSPARK_HOME / "bin" / "spark-class"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
HOST = "127.0.0.1"

# Measured here: the master is ALIVE about 2 s after launch, the worker registered about 3 s
# later; a loaded 2-core machine can take several times that.
START_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0


class JvmProcess(WatchedProcess):
    """One `spark-class` JVM; its stdout and stderr lines are kept and also written to `log`."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        super().__init__(log)
        self.name = name
        self.argv = argv
        self.env = dict(env)
        self._tree: set[int] = set()

    def start(self) -> None:
        self._launch(self.argv, self.env, reader_name=f"{self.name}-log")

    def output(self, last: int | None = 80) -> str:
        return super().output(last)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        """The first line matching `pattern`, waiting up to `timeout`; fails at once when the
        JVM has exited."""
        found = self._first_match(pattern, timeout)
        if found is None:
            raise AssertionError(
                f"spark {self.name}: no line matching {pattern!r} within {timeout} s "
                f"(exit status {self.exit_status()}); output:\n{self.output()}"
            )
        return found

    def remember_tree(self) -> set[int]:
        """Record the PIDs of this JVM's descendants (a worker's executors)."""
        if self.proc is not None:
            try:
                kids = psutil.Process(self.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                kids = []
            self._tree |= {kid.pid for kid in kids}
        return set(self._tree)

    def alive_descendants(self) -> list[int]:
        self.remember_tree()
        return [pid for pid in self._tree if _alive(pid)]

    def stop(self) -> None:
        """SIGTERM (a worker then ends its executors), SIGKILL after STOP_TIMEOUT; then every
        recorded descendant still alive is killed by PID."""
        if self.proc is None:
            return
        self.remember_tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        for pid in sorted(self._tree):
            _kill(pid)
        if self._reader is not None:
            self._reader.join(STOP_TIMEOUT)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(pid: int) -> None:
    try:
        process = psutil.Process(pid)
        process.kill()
        process.wait(STOP_TIMEOUT)
    except psutil.NoSuchProcess:
        pass


class SparkCluster:
    """A standalone master and one worker, everything under `root`."""

    def __init__(self, root: Path, cores: int = 1, memory: str = "1g") -> None:
        self.root = Path(root)
        self.cores = cores
        self.memory = memory
        self.port = free_port(HOST)
        self.web_port = free_port(HOST)
        self.worker_web_port = free_port(HOST)
        self.url = f"spark://{HOST}:{self.port}"
        self.work_dir = self.root / "work"  # the worker's: one directory per application
        self.start_seconds: float | None = None
        dirs = {name: self.root / name for name in ("conf", "logs", "local", "work")}
        for directory in dirs.values():
            directory.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "SPARK_HOME": str(PYSPARK_HOME),
            # An empty conf dir: nothing from the machine's Spark configuration leaks in.
            "SPARK_CONF_DIR": str(dirs["conf"]),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_LOG_DIR": str(dirs["logs"]),
            "SPARK_WORKER_DIR": str(dirs["work"]),
            "SPARK_LOCAL_DIRS": str(dirs["local"]),
            "SPARK_DAEMON_MEMORY": "256m",
            # The master's REST submission server listens on the fixed port 6066 by default:
            # two clusters (or a real one on this machine) would collide on it.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }
        self.master = JvmProcess(
            "master",
            [
                str(SPARK_CLASS),
                MASTER_CLASS,
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.web_port),
            ],
            self.env,
            dirs["logs"] / "master.out",
        )
        self.worker = JvmProcess(
            "worker",
            [
                str(SPARK_CLASS),
                WORKER_CLASS,
                self.url,
                "--host",
                HOST,
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(self.worker_web_port),
            ],
            self.env,
            dirs["logs"] / "worker.out",
        )

    def start(self) -> None:
        started = time.perf_counter()
        self.master.start()
        self.master.wait_for(r"I have been elected leader! New state: ALIVE", START_TIMEOUT)
        self.worker.start()
        self.worker.wait_for(r"Successfully registered with master", START_TIMEOUT)
        self.master.wait_for(r"Registering worker 127\.0\.0\.1:\d+", START_TIMEOUT)
        self.start_seconds = time.perf_counter() - started

    def stop(self) -> None:
        # The worker first, so that its executors end with it (and any left are killed by PID).
        try:
            self.worker.stop()
        finally:
            self.master.stop()

    def applications(self) -> list[dict]:
        """Every application the master knows, running or finished (its JSON status page)."""
        url = f"http://{HOST}:{self.web_port}/json/"
        with urllib.request.urlopen(url, timeout=10) as answer:
            state = json.load(answer)
        return [*state.get("activeapps", []), *state.get("completedapps", [])]

    def executor_logs(self, app_id: str) -> list[Path]:
        return sorted((self.work_dir / app_id).glob("*/stderr"))

    def tasks_run(self, app_id: str) -> int:
        """How many tasks the worker's executors of `app_id` ran, from their own logs."""
        return sum(
            path.read_text(errors="replace").count("Executor: Running task ")
            for path in self.executor_logs(app_id)
        )


@pytest.fixture
def spark_cluster(tmp_path_factory) -> Iterator[SparkCluster]:
    """A running standalone master + worker (1 core, 1 GiB) on loopback; stopped, executors
    and all, when the test ends."""
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
