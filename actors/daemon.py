"""`fxgate run`: one process, the supervisor's actors, and a clean exit on SIGTERM/SIGINT.

On a stop signal the source disconnects first (keeping its broker session), then the open pack is
sealed, pending packs are written as a last batch, and the ledger is closed: exit status 0. If an
actor dies the daemon stops the rest and exits 1, saying which one.
"""

from __future__ import annotations

import logging
import signal
import threading
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
    # paho and py4j are chatty at INFO/DEBUG; our own lines say what an operator needs.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def status_path(config: Config) -> Path:
    return config.gateway.data_path / STATUS_FILE


def run(config: Config, clock: Clock | None = None) -> int:
    """Run until SIGTERM/SIGINT (call from the main thread). Returns the exit status."""
    clock = clock or RealClock()
    stop = threading.Event()
    wake = threading.Event()
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, lambda signum, _frame: _request_stop(stop, wake, signum))
    config.gateway.data_path.mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor(config, clock)
    code = 0
    try:
        supervisor.start()
        while not stop.is_set():
            supervisor.check_alive()
            supervisor.write_status(status_path(config))
            # Wake on the next tick, or at once on a stop request.
            clock.call_later(STATUS_INTERVAL, wake.set)
            wake.wait()
            wake.clear()
    except ActorCrashed as error:
        log.error("%s: stopping the gateway", error)
        code = 1
    except Exception:
        log.exception("fxgate failed")
        code = 1
    finally:
        supervisor.stop()
        try:
            supervisor.write_status(status_path(config))
        except OSError:
            pass
        if isinstance(clock, RealClock):
            clock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("fxgate stopped (exit %d)", code)
    return code


def _request_stop(stop: threading.Event, wake: threading.Event, signum: int) -> None:
    log.info("received %s: stopping", signal.Signals(signum).name)
    stop.set()
    wake.set()
