"""The gateway as a real subprocess (`fxgate run`), watched through its log lines.

Tests wait on log lines (a condition variable fed by a reader thread), never on sleeps. Every
process started here — the daemon and whatever it spawned (the Spark JVM) — is ended by PID when
the test ends, pass or fail.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
import pytest


class DaemonProcess:
    def __init__(self, workdir: Path, env: Mapping[str, str], config_path: Path | None = None):
        self.workdir = Path(workdir)
        self.env = {**os.environ, **env}
        self.config_path = config_path
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self.spawned: set[int] = set()

    def start(self) -> None:
        argv = [sys.executable, "-m", "actors.cli", "run"]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        self.proc = subprocess.Popen(
            argv,
            env=self.env,
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def mark(self) -> int:
        """An index into the log: wait_for_log(after=mark) sees only lines written since."""
        with self._cond:
            return len(self.lines)

    def wait_for_log(self, pattern: str, timeout: float = 60.0, after: int = 0) -> re.Match:
        regex = re.compile(pattern)
        found: list[re.Match] = []

        def seen() -> bool:
            for line in self.lines[after:]:
                match = regex.search(line)
                if match:
                    found.append(match)
                    return True
            return self.proc is not None and self.proc.poll() is not None

        with self._cond:
            self._cond.wait_for(seen, timeout)
        if not found:
            raise AssertionError(
                f"no log line matching {pattern!r} within {timeout} s "
                f"(exit status {self.proc.poll() if self.proc else None}); log:\n{self.output()}"
            )
        return found[0]

    def count_logs(self, pattern: str) -> int:
        regex = re.compile(pattern)
        with self._cond:
            return sum(1 for line in self.lines if regex.search(line))

    def remember_children(self) -> set[int]:
        """Record the PIDs the daemon spawned (the Spark JVM), so they can be checked and reaped."""
        try:
            kids = {p.pid for p in psutil.Process(self.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            kids = set()
        self.spawned |= kids
        return kids

    def terminate(self, timeout: float = 120.0) -> int:
        """SIGTERM and wait: the graceful stop path."""
        assert self.proc is not None
        self.remember_children()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(timeout)
        return code

    def kill(self) -> None:
        """SIGKILL the daemon (a crash); its JVM notices the closed pipe and exits on its own."""
        if self.proc is not None and self.proc.poll() is None:
            self.remember_children()
            self.proc.kill()
            self.proc.wait(30)

    def alive_spawned(self) -> list[int]:
        alive = []
        for pid in self.spawned:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def reap(self) -> None:
        self.kill()
        for pid in self.spawned:
            try:
                proc = psutil.Process(pid)
                proc.kill()
                proc.wait(30)
            except psutil.NoSuchProcess:
                pass


@pytest.fixture
def daemon_factory(tmp_path) -> Iterator:
    started: list[DaemonProcess] = []

    def make(env: Mapping[str, str], config_path: Path | None = None) -> DaemonProcess:
        daemon = DaemonProcess(tmp_path, env, config_path)
        started.append(daemon)
        daemon.start()
        return daemon

    yield make
    for daemon in started:
        daemon.reap()
