"""A local mosquitto broker process with a deliberate configuration, for the demo and the tests.

mosquitto's defaults lose messages silently (DESIGN §4): past `max_queued_messages` (1000) it
drops QoS 1/2 messages for an offline client while the publisher sees success, and a session
survives a restart only if it was saved. So every broker we start says what it queues and when it
saves, listens on loopback only, and keeps its state in a directory of its own.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

READY_MARK = " running"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class ListenerTls:
    """TLS on the broker's listener: its certificate and key, and the CA its clients'
    certificates must chain to. `require_certificate` makes it mutual TLS: a client without a
    certificate signed by `cafile` is refused during the handshake."""

    cafile: Path
    certfile: Path
    keyfile: Path
    require_certificate: bool = False

    def lines(self) -> list[str]:
        return [
            f"cafile {self.cafile}",
            f"certfile {self.certfile}",
            f"keyfile {self.keyfile}",
            f"require_certificate {'true' if self.require_certificate else 'false'}",
        ]


def broker_config(
    port: int,
    data_dir: Path,
    *,
    host: str = "127.0.0.1",
    max_queued_messages: int = 1_000_000,
    max_inflight_messages: int = 1000,
    autosave_interval: int = 1,
    debug_log: bool = False,
    password_file: Path | None = None,
    tls: ListenerTls | None = None,
    extra: Iterable[str] = (),
) -> str:
    log_types = (
        ["all"]
        if debug_log
        else ["error", "warning", "notice", "information", "subscribe", "unsubscribe"]
    )
    lines = [
        f"listener {port} {host}",
        # Listener options belong right after their `listener` line.
        *(tls.lines() if tls is not None else []),
        *(
            ["allow_anonymous true"]
            if password_file is None
            else ["allow_anonymous false", f"password_file {password_file}"]
        ),
        # Never switch to the 'mosquitto' user: the data dir belongs to whoever started us.
        "user root",
        "persistence true",
        f"persistence_location {data_dir}/",
        "persistence_file mosquitto.db",
        # Save sessions and queues every second so a SIGKILLed broker loses at most that much,
        # and a graceful stop saves everything.
        f"autosave_interval {autosave_interval}",
        # The default of 1000 drops silently for offline clients; hold far more, on purpose.
        f"max_queued_messages {max_queued_messages}",
        "max_queued_bytes 0",
        # Let each client's Receive Maximum govern in-flight messages, not the broker default 20.
        f"max_inflight_messages {max_inflight_messages}",
        "set_tcp_nodelay true",
        "log_dest stdout",
        f"log_dest file {data_dir}/mosquitto.log",
        "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        *[f"log_type {t}" for t in log_types],
        *extra,
    ]
    return "\n".join(lines) + "\n"


class MosquittoProcess:
    """One mosquitto on loopback; `stop`/`kill`/`start` keep its port and persistence dir."""

    def __init__(self, data_dir: Path, port: int | None = None, **config_options) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.conf_path = self.data_dir / "mosquitto.conf"
        self.conf_path.write_text(broker_config(self.port, self.data_dir, **config_options))
        self.log_path = self.data_dir / "mosquitto.log"
        self._proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 15.0) -> None:
        if self.running:
            return
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        with self._cond:
            self._lines = []
        # mosquitto block-buffers stdout into a pipe; line-buffer it so readiness is seen at once.
        argv = [binary, "-c", str(self.conf_path)]
        if shutil.which("stdbuf"):
            argv = ["stdbuf", "-oL", *argv]
        self._proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(
            target=self._read_output, args=(self._proc,), name=f"mosquitto-{self.port}", daemon=True
        )
        self._reader.start()
        if not self.wait_for_output(READY_MARK, timeout):
            out = self.output()
            self.kill()
            raise RuntimeError(f"mosquitto on port {self.port} did not start:\n{out}")
        log.info("mosquitto started on %s:%d (pid %d)", self.host, self.port, self._proc.pid)

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful: SIGTERM makes mosquitto save sessions and queues before it exits."""
        self._end(signal.SIGTERM, timeout)

    def kill(self, timeout: float = 15.0) -> None:
        """SIGKILL: what was not autosaved is lost, as in a power cut of the broker box."""
        self._end(signal.SIGKILL, timeout)

    def restart(self, timeout: float = 15.0) -> None:
        self.stop(timeout)
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
        log.info("mosquitto on port %d ended by %s", self.port, sig.name)

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
