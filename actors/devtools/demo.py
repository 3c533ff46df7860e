"""`make demo`: a local broker, two simulated FX9600 readers and the gateway on its defaults.

The broker is mosquitto unless `--broker` names another of actors.devtools.broker_kinds
(`make demo BROKER=hivemq`): mosquitto with the project's deliberate configuration, HiveMQ CE and
Mochi MQTT as shipped (their queues hold far more than a phase leaves waiting here).

Phase 1 publishes at QoS 1, the broker is restarted (its saved session keeps what the gateway had
not taken yet), phase 2 publishes at QoS 2; then the gateway is stopped with SIGTERM and the reads
table is read back with delta-rs (one snapshot of the Delta log, as any reader without a JVM) and
compared with what the readers got acknowledged. Nothing here needs Spark: the demo runs on the
light install (`make install`) with mosquitto, as a gateway would.

Each simulated reader also sends heartbeats (with its honest counters, carried over both phases)
and GPI changes on its management topic, which the gateway is configured to subscribe to; before
the stop, `fxgate status`'s reader lines are printed: every reader's heartbeats, its own counters,
and a reconciliation of 0 (nothing was lost between the readers and the gateway).
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

from actors.app.status import collect_status, format_status
from actors.config.schema import load_config
from actors.devtools.broker_kinds import DEFAULT_BROKER, make_broker
from actors.devtools.simulate import expected_read_ids, simulate
from spark.report import compare, landed_ids_arrow


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        pause.wait(interval)


MANAGEMENT_TOPICS = '["zebra/fx/+/mgmt"]'


def run_demo(
    workdir: Path,
    count: int = 1500,
    rate: float = 300.0,
    heartbeat_every: int = 500,
    gpi_every: int = 250,
    broker_kind: str = DEFAULT_BROKER,
) -> int:
    workdir = workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    broker = make_broker(broker_kind, workdir / "broker")
    daemon: subprocess.Popen | None = None
    env = {
        **os.environ,
        "FXGATE__SOURCE__PORT": str(broker.port),
        "FXGATE__GATEWAY__DATA_DIR": str(workdir / "data"),
        # The simulated readers' heartbeats and GPI changes (docs/pages/operating/reader-health.md).
        "FXGATE__SOURCE__MANAGEMENT_TOPICS": MANAGEMENT_TOPICS,
    }
    config = load_config(None, environ=env)
    try:
        broker.start()
        say(f"{broker_kind} on 127.0.0.1:{broker.port} (pid {broker.pid}, data {broker.data_dir})")
        if broker_kind == "mochi":
            say(
                "Mochi MQTT 2.7.9 drops what is published while a session's client reconnects "
                "(docs: operating/brokers): the broker restart below can cost reads, which the "
                "result then names"
            )
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
        counters: dict = {}  # each reader's own counters, carried over both phases
        management = {"heartbeat_every": heartbeat_every, "gpi_every": gpi_every}
        say(
            f"phase 1: 2 readers x {count} tag events at QoS 1, {rate:.0f} msg/s, a heartbeat "
            f"every {heartbeat_every} and a GPI change every {gpi_every}"
        )
        run = simulate(
            broker.host, broker.port, 2, rate, count, qos=1, seed=1, counters=counters, **management
        )
        published += run.published
        say("restarting the broker (graceful: it saves the gateway's session)")
        broker.restart()
        say(f"phase 2: 2 readers x {count} tag events at QoS 2, {rate:.0f} msg/s")
        run = simulate(
            broker.host, broker.port, 2, rate, count, qos=2, seed=2, counters=counters, **management
        )
        published += run.published
        expected = expected_read_ids(published)
        # Per reader and phase: one heartbeat at the start, one per heartbeat_every, one at the end.
        per_phase = 1 + (count - 1) // heartbeat_every + 1 if count else 2
        heartbeats = 2 * per_phase

        def caught_up() -> bool:
            status = collect_status(config)
            readers = status["readers"]
            return (
                status["tables"]["reads"] >= len(expected)
                and not status["ledger"].get("pending_messages")
                and len(readers) == 2
                and all(r["heartbeats"] >= heartbeats for r in readers.values())
            )

        wait_until(caught_up, 180, "the reads table and the readers' heartbeats to catch up")
        status = collect_status(config)
        say("fxgate status, the readers (heartbeats, their own counters, the reconciliation):")
        for line in format_status(status).splitlines():
            if line.startswith(("reader:", "SILENT:")):
                print(line, flush=True)
        balanced = all(
            r["heartbeats"] == heartbeats
            and r["reported"]["sent"] == counters[name].sent
            and r["reconciliation"]["unaccounted"] == 0
            for name, r in status["readers"].items()
        )
        say(
            "reconciliation: every data message the readers sent between their heartbeats "
            "reached the gateway (0 unaccounted)"
            if balanced
            else "reconciliation: MISMATCH (see the reader lines above)"
        )
        say("table caught up; stopping the gateway with SIGTERM")
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(120)
        say(f"gateway exited with status {code}")

        ids, readers = landed_ids_arrow(config.spark.tables_path(config.gateway.data_path))
        result = compare(expected, ids, readers)
        say("reads table, read back with delta-rs — rows per reader:")
        for line in result.lines():
            print(line, flush=True)
        verdict = "EXACT: every published read landed once" if result.exact else "MISMATCH"
        say(
            f"published vs landed: {result.published} / {result.landed}; "
            f"missing {len(result.missing)}, duplicates {len(result.duplicates)} -> {verdict}"
        )
        return 0 if result.exact and balanced and code == 0 else 1
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
        broker.stop()
