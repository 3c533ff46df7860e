"""The fxgate side of a benchmark: the daemon's own `Gateway`, run in a process of its own.

    python -m bench.gateway_worker WORKDIR SPARK_ENV_JSON

The process is what `fxgate run` is — `actors.app.daemon.Gateway` with its `Supervisor`, its actors,
its status file every second and its Spark writer — with two differences, both for measuring:

1. Where the settings land batches through Spark (`landing = "spark"`, a cluster), one
   SparkSession for the life of the worker, started and warmed up before anything is timed; each
   measured run starts a fresh Gateway (fresh actors, fresh ledger and tables in a data dir of
   its own) that reuses it. A daemon in service runs with a warm JVM; starting Spark (5-8 s) and
   its first job (3-5 s of JIT, DESIGN §4) in every sample would measure the JVM, not the
   gateway. With the default landing (delta-rs) the daemon has no JVM, and neither has the
   worker.
2. A probe on `LedgerClient`: the monotonic time when the first PUBLISH is decoded on paho's
   network thread, and when the ledger hands paho the N-th final ack (PUBACK at QoS 1, PUBCOMP at
   QoS 2; each leaves only after the row, or the release, is committed). The baseline subscriber
   measures between the same two points. The probe adds a counter increment per ack. And on
   `Supervisor.batch_written`: when each Spark batch committed, with its rows.

Commands arrive as JSON lines on stdin; each answer is one stdout line starting with `RESULT `
(the JVM shares stdout, so anything else there is ignored by the bench). Logs go to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path

import psutil

from actors.app.daemon import Gateway, configure_logging
from actors.clock import RealClock
from actors.config.schema import load_config
from actors.mqtt.client import AckKind, LedgerClient
from actors.supervisor import Supervisor

log = logging.getLogger("bench.gateway_worker")

RESULT_PREFIX = "RESULT "


# -- CPU snapshots --------------------------------------------------------------------------

_THREAD_SUFFIX = re.compile(r"( \(urn:uuid:[0-9a-f-]+\)|-\d+|-[0-9a-f]{8,})$")


def _thread_role(name: str) -> str:
    """'InboundLedger (urn:uuid:...)' -> 'InboundLedger'; paho's 'paho-mqtt-client-<id>' kept."""
    if name.startswith("paho-mqtt-client-"):
        return "paho-network"
    return _THREAD_SUFFIX.sub("", name)


class CpuSnapshot:
    """CPU seconds so far: this process per thread role, the JVM (our children), the broker."""

    def __init__(self, broker_pid: int | None) -> None:
        self.at = time.monotonic()
        me = psutil.Process()
        times = me.cpu_times()
        self.process = times.user + times.system
        names = {t.native_id: _thread_role(t.name) for t in threading.enumerate()}
        self.threads: dict[str, float] = {}
        for t in me.threads():
            role = names.get(t.id, "other (py4j/sqlite/native)")
            self.threads[role] = self.threads.get(role, 0.0) + t.user_time + t.system_time
        # The children: the Spark JVM, and the Python ones (the forward process with
        # `[upstream] process = "own"`; reaped at a run's end, its time then moves into this
        # process's children_*).
        self.jvm = 0.0
        self.python_children = times.children_user + times.children_system
        for child in me.children(recursive=True):
            try:
                ct = child.cpu_times()
                if child.name().startswith("java"):
                    self.jvm += ct.user + ct.system
                else:
                    self.python_children += ct.user + ct.system
            except psutil.NoSuchProcess:
                pass
        self.broker = None
        if broker_pid:
            try:
                bt = psutil.Process(broker_pid).cpu_times()
                self.broker = bt.user + bt.system
            except psutil.NoSuchProcess:
                pass

    def since(self, earlier: CpuSnapshot) -> dict:
        seconds = max(self.at - earlier.at, 1e-9)
        threads = {
            role: round(value - earlier.threads.get(role, 0.0), 3)
            for role, value in sorted(self.threads.items())
            if value - earlier.threads.get(role, 0.0) > 0.005
        }
        out = {
            "wall_seconds": round(seconds, 4),
            "python_cpu_seconds": round(self.process - earlier.process, 3),
            "python_cores": round((self.process - earlier.process) / seconds, 3),
            "python_threads_cpu_seconds": threads,
            "jvm_cpu_seconds": round(self.jvm - earlier.jvm, 3),
            "jvm_cores": round((self.jvm - earlier.jvm) / seconds, 3),
            "python_children_cpu_seconds": round(self.python_children - earlier.python_children, 3),
        }
        if self.broker is not None and earlier.broker is not None:
            out["broker_cpu_seconds"] = round(self.broker - earlier.broker, 3)
            out["broker_cores"] = round((self.broker - earlier.broker) / seconds, 3)
        return out


# -- the probe ------------------------------------------------------------------------------


class Probe:
    """What one run measured; `arm` before each run (no gateway may be running then)."""

    def __init__(self) -> None:
        self._reset(AckKind.PUBACK, 0, None)

    def arm(self, final: AckKind, target: int, broker_pid: int | None) -> None:
        self._reset(final, target, broker_pid)
        LedgerClient._handle_publish = _timed_handle_publish

    def _reset(self, final: AckKind, target: int, broker_pid: int | None) -> None:
        self.final = final
        self.target = target
        self.broker_pid = broker_pid
        self.count = 0
        self.first: float | None = None
        self.first_cpu: CpuSnapshot | None = None
        self.done_at: float | None = None
        self.done_cpu: CpuSnapshot | None = None
        self.done = threading.Event()
        self.batches: list[tuple[float, int]] = []


_HANDLE_PUBLISH = LedgerClient._handle_publish


def _timed_handle_publish(self):
    # Only the first PUBLISH is timed; the class gets paho's path back at once, so the other
    # messages pay nothing for the probe.
    LedgerClient._handle_publish = _HANDLE_PUBLISH
    PROBE.first = time.monotonic()
    PROBE.first_cpu = CpuSnapshot(PROBE.broker_pid)
    return _HANDLE_PUBLISH(self)


PROBE = Probe()


def install_probe() -> None:
    send_acks = LedgerClient.send_acks
    on_batch = Supervisor.batch_written

    def timed_on_batch(self, batch):
        # The writer's thread, once per committed batch: when its rows became visible.
        PROBE.batches.append((time.monotonic(), batch.rows))
        return on_batch(self, batch)

    Supervisor.batch_written = timed_on_batch

    def counted_send_acks(self, epoch, acks):
        sent = send_acks(self, epoch, acks)
        # Only the ledger's thread sends acks: the counter needs no lock.
        if sent and not PROBE.done.is_set():
            PROBE.count += sum(1 for kind, _ in acks if kind is PROBE.final)
            if PROBE.count >= PROBE.target:
                PROBE.done_at = time.monotonic()
                PROBE.done_cpu = CpuSnapshot(PROBE.broker_pid)
                PROBE.done.set()
        return sent

    LedgerClient.send_acks = counted_send_acks


def jvm_alive(session) -> bool:
    if session is None:
        return True  # no JVM to lose: the default landing
    gateway = getattr(session.sparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    return proc is None or proc.poll() is None


class Sampler:
    """Every 100 ms until stopped: the deepest the ledger's mailbox got (in actor messages, and
    in PUBLISHes handed over and not yet taken: the source hands them over up to 100 per
    message) and the largest RSS.

    mosquitto 2.0.11 overshoots our Receive Maximum when it drains a queued session, so the
    mailbox can hold far more than 200 PUBLISHes; this shows how far, in every sample."""

    def __init__(self, supervisor) -> None:
        self._supervisor = supervisor
        self._stop = threading.Event()
        self.inbox_max = 0
        self.waiting_max = 0
        self.rss_max = 0
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.1):
            ledger = self._supervisor.ref("ledger")
            if ledger is not None:
                self.inbox_max = max(self.inbox_max, ledger.actor_inbox.qsize())
            gate = getattr(self._supervisor, "intake", None)
            if gate is not None:
                self.waiting_max = max(self.waiting_max, gate.stats().waiting_messages)
            self.rss_max = max(self.rss_max, me.memory_info().rss)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(5)
        return {
            "ledger_inbox_max": self.inbox_max,
            "ledger_waiting_publishes_max": self.waiting_max,
            "python_rss_max_bytes": self.rss_max,
        }


# -- one measured run -----------------------------------------------------------------------


def ingest(command: dict, session) -> dict:
    qos = int(command["qos"])
    messages = int(command["messages"])
    rows = int(command["rows"])
    timeout = float(command.get("timeout", 300.0))
    broker_pid = command.get("broker_pid")
    config = load_config(None, environ=command["env"], hostname="bench")
    PROBE.arm(AckKind.PUBCOMP if qos == 2 else AckKind.PUBACK, messages, broker_pid)

    clock = RealClock()
    gateway = Gateway(config, clock, session_factory=lambda: session)
    exit_code: list[int] = []
    runner = threading.Thread(
        target=lambda: exit_code.append(gateway.run()), name="bench-gateway", daemon=True
    )
    began = time.monotonic()
    runner.start()
    result: dict = {"ok": False, "messages": messages, "rows_expected": rows}
    try:
        supervisor = gateway.wait_started(1, timeout)
        if supervisor is None:
            result["error"] = "the gateway did not start"
            return result
        result["start_seconds"] = round(time.monotonic() - began, 3)
        sampler = Sampler(supervisor)
        acked = PROBE.done.wait(max(1.0, timeout - (time.monotonic() - began)))
        result["during_ingest"] = sampler.stop()
        if not acked:
            result["error"] = f"only {PROBE.count} of {messages} final acks within {timeout} s"
            return result
        deadline = time.monotonic() + timeout
        landed = False
        while not landed and time.monotonic() < deadline:
            landed = supervisor.wait_for_landed(rows, timeout=0.5)
            if not landed and not jvm_alive(session):
                # The writer would retry against a dead JVM for ever; the bench must not wait.
                result["error"] = (
                    f"the Spark JVM exited (see the worker log) with {supervisor.rows_written} "
                    f"of {rows} rows in the table; batches written {supervisor.batches_written}"
                )
                result["jvm_exited"] = True
                return result
        table_at = time.monotonic()
        table_cpu = CpuSnapshot(broker_pid)
        if not landed:
            result["error"] = (
                f"{supervisor.rows_written} of {rows} rows in the table within {timeout} s"
            )
            return result
        if command.get("wait_upstream"):
            # The table lands on its own (the ledger feeds both sinks): forwarding is done
            # when nothing is owed upstream any more.
            ledger_proxy = supervisor.ref("ledger").proxy()
            while time.monotonic() < deadline:
                lag = ledger_proxy.stats().get(timeout=30)["lag"].get("upstream") or {}
                if not lag.get("messages"):
                    break
                time.sleep(0.05)
            else:
                result["error"] = f"the upstream still lacked messages after {timeout} s"
                return result
        ledger = supervisor.ref("ledger").proxy().stats().get(timeout=30)
        assert PROBE.first is not None and PROBE.done_at is not None
        result.update(
            ok=True,
            ack_seconds=PROBE.done_at - PROBE.first,
            table_seconds=table_at - PROBE.first,
            acked=PROBE.count,
            rows_written=supervisor.rows_written,
            batches_written=supervisor.batches_written,
            dead_letters_written=supervisor.dead_letters_written,
            ledger={k: v for k, v in ledger.items() if k != "paused_by"},
            paused_by=ledger.get("paused_by"),
            # (seconds after the first PUBLISH, rows) of every Spark batch as it committed.
            batches=[[round(at - PROBE.first, 3), rows] for at, rows in PROBE.batches],
            cpu_ack_window=PROBE.done_cpu.since(PROBE.first_cpu),
            cpu_table_window=table_cpu.since(PROBE.first_cpu),
        )
        return result
    finally:
        gateway.request_stop()
        runner.join(180)
        clock.close()
        result["exit_code"] = exit_code[0] if exit_code else None


def main() -> int:
    workdir = Path(sys.argv[1])
    spark_env = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    workdir.mkdir(parents=True, exist_ok=True)
    configure_logging("INFO")
    install_probe()

    from spark.session import build_session, stop_session

    spark_config = load_config(None, environ=spark_env, hostname="bench").spark
    session = None
    if not spark_config.lands_with_arrow:
        session = build_session(
            spark_config.master,
            workdir / "spark",
            driver_memory=spark_config.driver_memory,
            conf=dict(spark_config.conf),
        )
    print(f"{RESULT_PREFIX}{json.dumps({'ready': True, 'pid': os.getpid()})}", flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            if command.get("op") == "quit":
                break
            try:
                answer = ingest(command, session)
            except Exception as error:  # report to the bench, which prints the log tail
                log.exception("ingest failed")
                answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
                answer["traceback"] = traceback.format_exc()
            print(f"{RESULT_PREFIX}{json.dumps(answer)}", flush=True)
    finally:
        if session is not None:
            stop_session(session)
    return 0


if __name__ == "__main__":
    sys.exit(main())
