"""The gateway as a real subprocess (`fxgate run`), watched through its log lines.

Tests wait on log lines (a condition variable fed by a reader thread), never on sleeps. Every
process started here — the daemon and whatever it spawned (the Spark JVM) — is ended by PID when
the test ends, pass or fail.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import psutil
import pytest

from tests.harness.watched_process import WatchedProcess

# The command-line module `fxgate` runs (setup.cfg's entry point).
CLI_MODULE = "actors.app.cli"


class DaemonProcess(WatchedProcess):
    def __init__(
        self,
        workdir: Path,
        env: Mapping[str, str],
        config_path: Path | None = None,
        cli_module: str = CLI_MODULE,
    ):
        """`cli_module`: another one for the code of an older commit (the bench runs one)."""
        super().__init__()
        self.workdir = Path(workdir)
        self.env = {**os.environ, **env}
        self.config_path = config_path
        self.cli_module = cli_module
        self.spawned: set[int] = set()

    def start(self) -> None:
        argv = [sys.executable, "-m", self.cli_module, "run"]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        self._launch(argv, self.env, cwd=self.workdir)

    def wait_for_log(self, pattern: str, timeout: float = 60.0, after: int = 0) -> re.Match:
        found = self._first_match(pattern, timeout, after)
        if found is None:
            raise AssertionError(
                f"no log line matching {pattern!r} within {timeout} s "
                f"(exit status {self.exit_status()}); log:\n{self.output()}"
            )
        return found

    def wait_for_batches(
        self, condition: Callable[[], bool], what: Callable[[], str], timeout: float = 120.0
    ) -> None:
        """Wait until `condition()` holds, checking it again at each 'batch N written' line (or
        every 5 s); past `timeout` fail with `what()`, said then, and the log's tail."""
        deadline = time.monotonic() + timeout
        while True:
            mark = self.mark()
            if condition():
                return
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{what()} after {timeout} s; log:\n{self.output()[-4000:]}"
            try:
                self.wait_for_log(r"batch \d+ written", timeout=min(remaining, 5.0), after=mark)
            except AssertionError:
                continue  # no batch meanwhile: the condition is checked again above

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


def gateway_env(broker, data: Path) -> dict[str, str]:
    """The environment of a daemon reading `broker` into `data`, its packs and batches short, so
    that reads land within a second or so; tests add their own keys to it."""
    return {
        "FXGATE__SOURCE__PORT": str(broker.port),
        "FXGATE__GATEWAY__DATA_DIR": str(data),
        "FXGATE__PACKS__LINGER_SECONDS": "0.2",
        "FXGATE__PACKS__MAX_MESSAGES": "50",
        "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
    }


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
