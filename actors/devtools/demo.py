"""`make demo`: a local broker, two simulated FX9600 readers and the gateway on its defaults.

Phase 1 publishes at QoS 1, the broker is restarted (its saved session keeps what the gateway had
not taken yet), phase 2 publishes at QoS 2; then the gateway is stopped with SIGTERM and the reads
table is read back through Spark and compared with what the readers got acknowledged.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from actors.app.status import collect_status
from actors.config.schema import load_config
from actors.devtools.mosquitto import MosquittoProcess
from actors.devtools.simulate import expected_read_ids, simulate
from spark.report import compare, landed_ids_spark
from spark.session import build_session, stop_session


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        pause.wait(interval)


def run_demo(workdir: Path, count: int = 1500, rate: float = 300.0) -> int:
    workdir = workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    broker = MosquittoProcess(workdir / "broker")
    daemon: subprocess.Popen | None = None
    env = {
        **os.environ,
        "FXGATE__SOURCE__PORT": str(broker.port),
        "FXGATE__GATEWAY__DATA_DIR": str(workdir / "data"),
    }
    config = load_config(None, environ=env)
    try:
        broker.start()
        say(f"mosquitto on 127.0.0.1:{broker.port} (config {broker.conf_path})")
        log_file = open(workdir / "gateway.log", "w")  # noqa: SIM115 - lives as long as the daemon
        daemon = subprocess.Popen(
            [sys.executable, "-m", "actors.app.cli", "run"],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        say(f"gateway started (pid {daemon.pid}, log {workdir / 'gateway.log'})")
        wait_until(
            lambda: (
                (collect_status(config)["daemon"].get("source") or {}).get("state") == "connected"
            ),
            90,
            "the gateway to connect",
        )
        say(f"gateway connected as {config.identity.client_id}")

        published = []
        say(f"phase 1: 2 readers x {count} tag events at QoS 1, {rate:.0f} msg/s")
        published += simulate(broker.host, broker.port, 2, rate, count, qos=1, seed=1).published
        say("restarting the broker (graceful: it saves the gateway's session)")
        broker.restart()
        say(f"phase 2: 2 readers x {count} tag events at QoS 2, {rate:.0f} msg/s")
        published += simulate(broker.host, broker.port, 2, rate, count, qos=2, seed=2).published
        expected = expected_read_ids(published)

        def caught_up() -> bool:
            status = collect_status(config)
            return status["tables"]["reads"] >= len(expected) and not status["ledger"].get(
                "pending_messages"
            )

        wait_until(caught_up, 180, "the reads table to catch up")
        say("table caught up; stopping the gateway with SIGTERM")
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(120)
        say(f"gateway exited with status {code}")

        session = build_session(config.spark.master, workdir / "spark-report")
        try:
            ids, readers = landed_ids_spark(
                session, config.spark.tables_path(config.gateway.data_path)
            )
        finally:
            stop_session(session)
        result = compare(expected, ids, readers)
        say("reads table, read back through Spark — rows per reader:")
        for line in result.lines():
            print(line, flush=True)
        verdict = "EXACT: every published read landed once" if result.exact else "MISMATCH"
        say(
            f"published vs landed: {result.published} / {result.landed}; "
            f"missing {len(result.missing)}, duplicates {len(result.duplicates)} -> {verdict}"
        )
        return 0 if result.exact and code == 0 else 1
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
        broker.stop()
