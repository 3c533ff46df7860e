"""What every benchmark round needs: a fresh broker, a queued session, the two contestants.

A round is always set up the same way for the baseline and for fxgate, so that the only thing
that differs is who drains the queue:

1. a fresh mosquitto (`actors.devtools.mosquitto.MosquittoProcess`, the project's deliberate config:
   1M queued messages per client, autosave every second) in a directory of its own;
2. a persistent session for the drainer's client id, subscribed to the readers' topic filter at
   the round's QoS, then disconnected (the broker now queues for it);
3. N messages published by the project's FX9600 simulator
   (`actors.devtools.simulate.simulate`, paho, window 20 per reader, rate 0 = flat out) and
   acknowledged by the broker;
4. the drainer connects and is timed from the first PUBLISH it decodes to its N-th final ack.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from actors.devtools.broker_kinds import DEFAULT_BROKER, make_broker
from actors.devtools.broker_process import BrokerProcess
from actors.devtools.simulate import simulate

log = logging.getLogger(__name__)

# Ports a fresh broker tries before its start fails (fresh_broker).
PORT_TRIES = 3

REPO = Path(__file__).resolve().parent.parent
READERS_TOPIC = "zebra/fx/+/reads"
PUBLISHING_READERS = 4
ENVIRONMENT_ID = "bench"
INSTANCE_ID = "bench"
FXGATE_CLIENT_ID = f"fxgate-{ENVIRONMENT_ID}-{INSTANCE_ID}"
BARE_CLIENT_ID = "bench-bare-paho"


class BenchError(RuntimeError):
    pass


class RunFailed(BenchError):
    """An fxgate run that did not finish; `result` is the worker's answer, `log_tail` its log."""

    def __init__(self, result: dict, log_tail: str) -> None:
        super().__init__(f"fxgate run failed: {result.get('error')}\nworker log tail:\n{log_tail}")
        self.result = result
        self.log_tail = log_tail


class LoadMeter:
    """CPU the rest of the machine used while a sample ran: busy cores system-wide minus this
    bench's own process tree (itself, its live children such as the gateway worker and its JVM,
    and the children it has reaped: brokers, bare subscribers). Other work on a shared machine
    then shows next to the number it may have disturbed."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float]:
        system = psutil.cpu_times()
        busy = system.user + system.nice + system.system + system.irq + system.softirq
        busy += getattr(system, "steal", 0.0)
        me = psutil.Process()
        tree = 0.0
        for process in (me, *me.children(recursive=True)):
            try:
                times = process.cpu_times()
                tree += times.user + times.system
                if process is not me:  # what it reaped (a gateway worker's parse workers)
                    tree += times.children_user + times.children_system
            except psutil.NoSuchProcess:
                continue
        reaped = os.times()
        tree += reaped.children_user + reaped.children_system
        return time.monotonic(), busy, tree

    def stop(self) -> dict:
        at, busy, tree = self._read()
        wall = max(at - self._start[0], 1e-9)
        busy_cores = (busy - self._start[1]) / wall
        ours = (tree - self._start[2]) / wall
        return {
            "wall_seconds": round(wall, 2),
            "machine_busy_cores": round(busy_cores, 2),
            "bench_cores": round(ours, 2),
            "other_cores": round(max(0.0, busy_cores - ours), 2),
        }


def wait_for_quiet(max_other_cores: float, timeout: float, window: float = 1.0) -> dict:
    """Wait until the rest of the machine uses under `max_other_cores` for one `window`, at
    most `timeout` seconds; say how long it took and what the load was. On a shared machine a
    sample taken while someone else's test suite runs measures the test suite."""
    began = time.monotonic()
    pause = threading.Event()
    while True:
        meter = LoadMeter()
        pause.wait(window)
        other = meter.stop()["other_cores"]
        waited = time.monotonic() - began
        if other < max_other_cores or waited >= timeout:
            return {
                "quiet": other < max_other_cores,
                "waited_seconds": round(waited, 1),
                "other_cores_before": other,
            }


@contextlib.contextmanager
def fresh_broker(directory: Path, kind: str = DEFAULT_BROKER, **options) -> Iterator[BrokerProcess]:
    """A broker of `kind` (mosquitto: the project's deliberate config unless `options` say
    otherwise) on a port found free just before. Another process can take that port in between
    (a bench run once lost a sample to "Address already in use"): then it tries again on another
    port, up to PORT_TRIES times in all."""
    for attempt in range(1, PORT_TRIES + 1):
        broker = make_broker(kind, directory, **options)
        try:
            broker.start()
            break
        except RuntimeError as error:
            if "in use" not in str(error) or attempt == PORT_TRIES:
                raise
            log.warning(
                "%s could not bind port %d (taken meanwhile): another port", kind, broker.port
            )
    try:
        yield broker
    finally:
        broker.stop()


def create_session(host: str, port: int, client_id: str, topic: str, qos: int) -> None:
    """Make the broker keep a persistent session, subscribed to `topic`, for `client_id`."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id, protocol=MQTTProtocolVersion.MQTTv5
    )
    subscribed = threading.Event()
    client.on_subscribe = lambda *_args: subscribed.set()
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    client.connect(host, port, keepalive=60, clean_start=True, properties=properties)
    client.loop_start()
    try:
        client.subscribe(topic, qos=qos)
        if not subscribed.wait(10):
            raise BenchError(f"no SUBACK for {client_id} on {host}:{port}")
    finally:
        client.disconnect()
        client.loop_stop()


def prequeue(
    broker: BrokerProcess, client_id: str, messages: int, qos: int, batch: int, seed: int
) -> dict:
    """Steps 2 and 3 of a round; returns what was queued (every message acknowledged)."""
    if messages % PUBLISHING_READERS:
        raise ValueError(f"messages must be a multiple of {PUBLISHING_READERS}")
    create_session(broker.host, broker.port, client_id, READERS_TOPIC, qos)
    result = simulate(
        broker.host,
        broker.port,
        readers=PUBLISHING_READERS,
        rate=0,
        count=messages // PUBLISHING_READERS,
        qos=qos,
        batch=batch,
        seed=seed,
        client_id_prefix=f"bench-pub-{seed}",
        ack_timeout=60.0,
    )
    if result.failed or len(result.published) != messages:
        raise BenchError(
            f"pre-queue: {len(result.published)} of {messages} acknowledged, {result.failed} failed"
        )
    return {"published": len(result.published), "publish_seconds": round(result.seconds, 3)}


def run_bare_subscriber(
    broker: BrokerProcess,
    qos: int,
    messages: int,
    parse: bool,
    timeout: float = 300.0,
    receive_maximum: int | None = None,
) -> dict:
    argv = [
        sys.executable,
        "-m",
        "bench.bare_subscriber",
        broker.host,
        str(broker.port),
        BARE_CLIENT_ID,
        "--qos",
        str(qos),
        "--messages",
        str(messages),
        "--timeout",
        str(timeout),
    ]
    if parse:
        argv.append("--parse")
    if broker.pid:
        argv += ["--broker-pid", str(broker.pid)]
    if receive_maximum is not None:
        argv += ["--receive-maximum", str(receive_maximum)]
    return run_json_command(argv, "bare subscriber", timeout + 60)


def run_json_command(argv: list[str], what: str, timeout: float) -> dict:
    """Run a bench helper process; its answer is the last JSON line it prints, with "ok"."""
    done = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"{what} said nothing (exit {done.returncode}):\n{done.stderr}")
    result = json.loads(lines[-1])
    if not result.get("ok"):
        raise BenchError(f"{what} failed: {result}\n{done.stderr[-2000:]}")
    return result


def fxgate_env(broker: BrokerProcess, data_dir: Path, qos: int, **overrides: str) -> dict:
    """The daemon's configuration for one round, as `FXGATE__` overrides of the defaults."""
    env = {
        "FXGATE__GATEWAY__DATA_DIR": str(data_dir),
        "FXGATE__SOURCE__HOST": broker.host,
        "FXGATE__SOURCE__PORT": str(broker.port),
        "FXGATE__SOURCE__QOS": str(qos),
        "FXGATE__SOURCE__ENVIRONMENT_ID": ENVIRONMENT_ID,
        "FXGATE__SOURCE__INSTANCE_ID": INSTANCE_ID,
    }
    env.update(overrides)
    return env


class GatewayWorker:
    """`bench.gateway_worker` as a subprocess: one warm Spark session, one Gateway per run."""

    def __init__(self, workdir: Path, spark_env: dict | None = None) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "worker.log"
        self.log_path.write_text("")
        # Append mode: the worker (stderr) and this process (the worker's stray stdout) share it.
        self._log = self.log_path.open("a", buffering=1)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.gateway_worker",
                str(workdir),
                json.dumps(spark_env or {}),
            ],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            # Its own process group: the bench can end the worker and its JVM together.
            start_new_session=True,
        )
        ready = self._answer(timeout=180)
        if not ready.get("ready"):
            raise BenchError(f"gateway worker did not start: {ready}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _answer(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise BenchError(f"gateway worker exited; log tail:\n{self.log_tail()}")
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
            # The JVM shares the worker's stdout (e.g. its OutOfMemoryError): keep it in the log.
            self._log.write(f"[worker stdout] {line}")
        raise BenchError(f"no answer from the gateway worker within {timeout} s")

    def ingest(
        self,
        env: dict,
        qos: int,
        messages: int,
        rows: int,
        broker_pid: int | None,
        timeout: float = 300.0,
        wait_upstream: bool = False,
    ) -> dict:
        """`wait_upstream`: answer only once the upstream has every message too (the table
        lands on its own, before the upstream has them)."""
        assert self.proc.stdin is not None
        command = {
            "op": "ingest",
            "env": env,
            "qos": qos,
            "messages": messages,
            "rows": rows,
            "broker_pid": broker_pid,
            "timeout": timeout,
            "wait_upstream": wait_upstream,
        }
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        result = self._answer(timeout * 2 + 240)
        if not result.get("ok"):
            raise RunFailed(result, self.log_tail())
        return result

    def log_tail(self, lines: int = 60) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_mark(self) -> int:
        """The number of lines in the worker log so far: `log_lines(since=...)` starts there."""
        self._log.flush()
        return len(self.log_path.read_text(errors="replace").splitlines())

    def log_lines(self, pattern: str, limit: int = 20, since: int = 0) -> list[str]:
        """Lines of the worker log that match `pattern` (a regex), at most `limit` of them."""
        self._log.flush()
        regex = re.compile(pattern)
        lines = self.log_path.read_text(errors="replace").splitlines()[since:]
        return [line for line in lines if regex.search(line)][:limit]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self._log.close()


@contextlib.contextmanager
def py_spy(
    pid: int, output: Path, fmt: str, extra: tuple[str, ...] = (), rate: int = 200
) -> Iterator[None]:
    """`py-spy record` of `pid` for the duration of the block (stopped with SIGINT)."""
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [
        binary,
        "record",
        "--pid",
        str(pid),
        "--output",
        str(output),
        "--format",
        fmt,
        "--rate",
        str(rate),
        "--threads",
        *extra,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    said: list[str] = []
    # py-spy says "Sampling process ..." once it is attached: only then may the run start.
    for line in proc.stdout:
        said.append(line)
        if "Sampling process" in line:
            break
    else:
        proc.wait(30)
        raise BenchError(f"py-spy did not attach ({proc.returncode}): {''.join(said)}")
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if not output.exists():
            raise BenchError(f"py-spy wrote nothing ({proc.returncode}): {''.join(said)}{out}")
