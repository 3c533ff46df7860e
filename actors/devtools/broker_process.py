"""A local MQTT broker as a child process, for the demo, the benchmarks and the tests.

Each broker kind (mosquitto, HiveMQ CE, Mochi MQTT) says how it is started and which line of its
output says it is ready; this class starts it on loopback, keeps its output, and ends it with
SIGTERM (a graceful stop: the broker saves its sessions) or SIGKILL (a power cut of the broker
box), always by its own PID. `stop`/`kill`/`start` keep the port and the data folder, so that a
restarted broker finds the sessions it saved.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def installed(*parts: str) -> Path:
    """Where `make` installs a broker's files: under the virtualenv, as the Delta jars."""
    return Path(sys.prefix, "share", "fxgate", *parts)


class BrokerProcess:
    """One broker on loopback. Subclasses name the broker (`kind`), the line that says it is
    ready (`ready_mark`) and its command line (`argv`), having written its configuration into
    `data_dir`."""

    kind = "broker"
    ready_mark = ""
    # Seconds a start may take before it is given up: a JVM broker needs more on a busy machine.
    start_timeout = 15.0

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def child_environment(self) -> dict[str, str] | None:
        """The broker's environment; None: this process's."""
        return None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float | None = None) -> None:
        if self.running:
            return
        timeout = self.start_timeout if timeout is None else timeout
        argv = self.argv()
        with self._cond:
            self._lines = []
        self._proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.child_environment(),
            text=True,
            errors="backslashreplace",
        )
        self._reader = threading.Thread(
            target=self._read_output,
            args=(self._proc,),
            name=f"{self.kind}-{self.port}",
            daemon=True,
        )
        self._reader.start()
        if not self.wait_for_output(self.ready_mark, timeout):
            out = self.output()
            self.kill()
            raise RuntimeError(f"{self.kind} on port {self.port} did not start:\n{out}")
        log.info("%s started on %s:%d (pid %d)", self.kind, self.host, self.port, self._proc.pid)

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful: SIGTERM makes the broker save its sessions and queues before it exits."""
        self._end(signal.SIGTERM, timeout)

    def kill(self, timeout: float = 15.0) -> None:
        """SIGKILL: what the broker had not saved is lost, as in a power cut of its box."""
        self._end(signal.SIGKILL, timeout)

    def restart(self, timeout: float | None = None) -> None:
        self.stop(self.start_timeout if timeout is None else timeout)
        self.start(timeout)

    def _end(self, sig: signal.Signals, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(timeout)
        self._proc = None
        log.info("%s on port %d ended by %s", self.kind, self.port, sig.name)

    def _read_output(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._cond:
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        proc.stdout.close()
        with self._cond:
            self._cond.notify_all()

    def wait_for_output(self, text: str, timeout: float, start: int = 0) -> bool:
        """Wait until a line containing `text` appears at or after line index `start`."""
        with self._cond:
            return self._cond.wait_for(
                lambda: any(text in line for line in self._lines[start:]) or not self.running,
                timeout,
            ) and any(text in line for line in self._lines[start:])

    def output(self) -> str:
        with self._cond:
            return "\n".join(self._lines)

    def line_count(self) -> int:
        with self._cond:
            return len(self._lines)
