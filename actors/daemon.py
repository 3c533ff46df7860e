"""`fxgate run`: one process, the supervisor's actors, and a clean exit on SIGTERM/SIGINT.

On a stop signal the source disconnects first (keeping its broker session), then the open pack is
sealed, pending packs are written as a last batch, and the ledger is closed: exit status 0.

If an actor dies, every actor is stopped and started again: the ledger's recovery replays what was
in flight, so nothing is lost by restarting the whole set rather than patching one actor back into
the others' references. At most `max_restarts` restarts within `restart_window_seconds` (on the
injected clock); one more crash in that window and the daemon exits 1, saying which actor died.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections import deque
from pathlib import Path

from actors.clock import Clock, RealClock
from actors.config import Config
from actors.supervisor import ActorCrashed, Supervisor

log = logging.getLogger(__name__)

STATUS_FILE = "status.json"
STATUS_INTERVAL = 1.0


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # py4j is chatty at INFO; our own lines say what an operator needs.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def status_path(config: Config) -> Path:
    return config.gateway.data_path / STATUS_FILE


class RestartBudget:
    """At most `limit` restarts in any `window` seconds."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._times: deque[float] = deque()

    def allow(self, now: float) -> bool:
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()
        if len(self._times) >= self.limit:
            return False
        self._times.append(now)
        return True


class Gateway:
    """The supervisor's actors, watched until `stop` is set; restarts them within the budget."""

    def __init__(self, config: Config, clock: Clock, **supervisor_options) -> None:
        self.config = config
        self.clock = clock
        self._options = supervisor_options
        self.stop = threading.Event()
        self._wake = threading.Event()
        self.supervisor: Supervisor | None = None
        self.restarts = 0
        self.started = threading.Condition()
        self.generation = 0

    def request_stop(self) -> None:
        self.stop.set()
        self._wake.set()

    def _start_supervisor(self) -> None:
        supervisor = Supervisor(self.config, self.clock, **self._options)
        supervisor.start()
        with self.started:
            self.supervisor = supervisor
            self.generation += 1
            self.started.notify_all()

    def wait_started(self, generation: int, timeout: float) -> Supervisor | None:
        """Block until the `generation`-th actor set has started (1 = the first start)."""
        with self.started:
            self.started.wait_for(lambda: self.generation >= generation, timeout)
            return self.supervisor if self.generation >= generation else None

    def run(self) -> int:
        cfg = self.config.gateway
        budget = RestartBudget(cfg.max_restarts, cfg.restart_window_seconds)
        cfg.data_path.mkdir(parents=True, exist_ok=True)
        code = 0
        try:
            self._start_supervisor()
            while not self.stop.is_set():
                try:
                    self.supervisor.check_alive()
                except ActorCrashed as error:
                    if not budget.allow(self.clock.monotonic()):
                        log.error(
                            "%s: %d restart(s) within %.0f s already; giving up",
                            error,
                            cfg.max_restarts,
                            cfg.restart_window_seconds,
                        )
                        code = 1
                        break
                    self.restarts += 1
                    log.error("%s: restarting all actors (restart %d)", error, self.restarts)
                    self.supervisor.stop()
                    self._start_supervisor()
                    continue
                self.supervisor.write_status(status_path(self.config))
                # Wake on the next tick, or at once on a stop request.
                self.clock.call_later(STATUS_INTERVAL, self._wake.set)
                self._wake.wait()
                self._wake.clear()
        except Exception:
            log.exception("fxgate failed")
            code = 1
        finally:
            if self.supervisor is not None:
                self.supervisor.stop()
                try:
                    self.supervisor.write_status(status_path(self.config))
                except OSError:
                    pass
        return code


def run(config: Config, clock: Clock | None = None) -> int:
    """Run until SIGTERM/SIGINT (call from the main thread). Returns the exit status."""
    clock = clock or RealClock()
    gateway = Gateway(config, clock)
    previous = {}

    def on_signal(signum: int, _frame) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        gateway.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, on_signal)
    try:
        code = gateway.run()
    finally:
        if isinstance(clock, RealClock):
            clock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("fxgate stopped (exit %d)", code)
    return code
