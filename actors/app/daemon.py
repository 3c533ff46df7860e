"""`fxgate run`: one process, the supervisor's actors, and a clean exit on SIGTERM/SIGINT.

On a stop signal the source disconnects first (keeping its broker session), then the open pack is
sealed, pending packs are written as a last batch, and the ledger is closed: exit status 0.

If an actor dies, every actor is stopped and started again: the ledger's recovery replays what was
in flight, so nothing is lost by restarting the whole set rather than patching one actor back into
the others' references. At most `max_restarts` restarts within `restart_window_seconds` (on the
injected clock); one more crash in that window and the daemon exits 1, saying which actor died.

The stop is bounded: past `stop_timeout_seconds` the daemon logs which actors still run and every
thread's stack, then exits 3 at once. SIGUSR1 logs every thread's stack and changes nothing else.
Every second the status snapshot goes to `status.json` and, when `metrics_port` is set, to the
`/metrics` and `/healthz` endpoint (actors/app/metrics.py).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pykka

from actors.app.metrics import HealthThresholds, MetricsServer, StatusBoard
from actors.clock import Clock, RealClock, TimerHandle
from actors.config.schema import Config
from actors.supervisor import ActorCrashed, Supervisor
from persistence.database import SchemaTooNew, check_versions
from persistence.permissions import private_directory
from persistence.storage_faults import corrupt_files
from spark.location import delta_location, is_local_master, local_path

log = logging.getLogger(__name__)

STATUS_FILE = "status.json"
STATUS_INTERVAL = 1.0
# Distinct from 1 (crash budget spent) so that an operator reading `systemctl status` can tell
# a hung stop from a crash loop.
EXIT_STOP_TIMEOUT = 3
# A database file was found corrupt and moved aside (persistence.storage_faults): no restart can
# help until the operator salvages or removes it, so a service manager must not retry.
EXIT_CORRUPT_DATABASE = 4
# A database file was written by a newer fxgate (DESIGN §7.11): refused and left as it is, like
# a bad configuration (exit 2), which a service manager must not retry either.
EXIT_SCHEMA_TOO_NEW = 2
# This configuration lands through Spark (a cluster master, `landing = "spark"`) and Spark is not
# installed (pyspark, delta-spark, a Java runtime, Delta Lake's jars: `make spark`): an install
# problem that no restart mends.
EXIT_NOT_INSTALLED = 2
# The tables directory holds another shared group's tables, or a group's while this gateway is
# alone (spark.tables.check_group): a configuration problem, which no restart mends.
EXIT_TABLES_OF_ANOTHER_GROUP = 2


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # py4j is chatty at INFO; our own lines say what an operator needs.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def status_path(config: Config) -> Path:
    return config.gateway.data_path / STATUS_FILE


def write_status_file(path: Path, snapshot: dict) -> None:
    """Replace `status.json` atomically: `fxgate status` may read it at any moment."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(snapshot, indent=2, sort_keys=True))
    os.replace(tmp, path)


def dump_stacks(reason: str) -> None:
    """Log every thread's stack at WARNING, one record per thread, named as pykka names actor
    threads (`InboundLedger-3`), so a stuck actor shows where it waits."""
    frames = sys._current_frames()
    threads = threading.enumerate()
    log.warning("stack dump (%s): %d thread(s)", reason, len(threads))
    for thread in threads:
        frame = frames.get(thread.ident)
        if frame is None:
            continue
        stack = "".join(traceback.format_stack(frame)).rstrip()
        log.warning(
            "stack of thread %s (ident %s%s):\n%s",
            thread.name,
            thread.ident,
            ", daemon" if thread.daemon else "",
            stack,
        )


def running_actors() -> list[str]:
    """The actor threads still alive. Read from pykka's registry rather than the supervisor,
    because the supervisor forgets an actor as soon as it asks it to stop — and the one that
    does not stop is the one worth naming."""
    return sorted(
        f"{ref.actor_class.__name__}" for ref in pykka.ActorRegistry.get_all() if ref.is_alive()
    )


class StopDeadline:
    """Bounds the orderly stop on the injected clock: when `timeout` passes before `disarm`,
    log what still runs and every stack, then end the process with EXIT_STOP_TIMEOUT. Ending it
    at once (os._exit) is the point: a thread that hangs would also hang a normal exit."""

    def __init__(
        self,
        clock: Clock,
        timeout: float,
        still_running: Callable[[], list[str]] = running_actors,
        exit: Callable[[int], None] = os._exit,  # a test passes a recorder
    ) -> None:
        self._clock = clock
        self.timeout = timeout
        self._still_running = still_running
        self._exit = exit
        self._handle: TimerHandle | None = None

    def arm(self) -> None:
        if self._handle is None:
            self._handle = self._clock.call_later(self.timeout, self._expire)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def _expire(self) -> None:
        log.error(
            "the orderly stop did not finish within %.0f s; still running: %s; "
            "exiting %d without waiting for them",
            self.timeout,
            ", ".join(self._still_running()) or "no actor (the stop itself is stuck)",
            EXIT_STOP_TIMEOUT,
        )
        dump_stacks("stop timeout")
        for handler in logging.getLogger().handlers:
            handler.flush()
        self._exit(EXIT_STOP_TIMEOUT)


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
        cfg = config.gateway
        self.board = StatusBoard(clock, HealthThresholds.from_config(cfg))
        self.stop_deadline = StopDeadline(clock, cfg.stop_timeout_seconds)
        self.metrics: MetricsServer | None = None
        self._status_write_failed = False
        if cfg.metrics_port:
            self.metrics = MetricsServer(cfg.metrics_host, cfg.metrics_port, self.board)

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

    def _publish_status(self) -> None:
        supervisor = self.supervisor
        snapshot = supervisor.status()
        # Totals the supervisor counts but does not put in its snapshot; /metrics needs them.
        snapshot.setdefault("rows_written", supervisor.rows_written)
        snapshot.setdefault("dead_letters_written", supervisor.dead_letters_written)
        snapshot.setdefault("dead_letters_by_reason", dict(supervisor.dead_letters_by_reason))
        snapshot.setdefault("restarts", self.restarts)
        self.board.publish(snapshot)
        try:
            write_status_file(status_path(self.config), snapshot)
        except OSError as error:
            # A full or read-only data dir must not end the daemon: the ledger waits it out,
            # and /healthz (already published above) says why. One line per episode.
            if not self._status_write_failed:
                log.error("status file not written (%s); /healthz still answers", error)
            self._status_write_failed = True
        else:
            self._status_write_failed = False

    def _start_metrics(self) -> None:
        try:
            self.metrics.start()
        except OSError as error:
            # Reads matter more than their metrics: keep ingesting, say so loudly.
            log.error(
                "metrics endpoint %s:%d not started (%s); running without it",
                self.metrics.host,
                self.metrics.port,
                error,
            )
            self.metrics = None

    def _corrupt_database(self) -> bool:
        """Whether a failed start or a crash comes from a database file moved aside as corrupt;
        says so in one line (the ERROR before it has the file and what to do)."""
        moved = corrupt_files(self.config.gateway.data_path)
        if moved:
            log.critical(
                "not restarting: %s found corrupt and moved aside (%s); salvage or remove it, "
                "then start again (docs: operating/faults)",
                "database file" if len(moved) == 1 else "database files",
                ", ".join(p.name for p in moved),
            )
        return bool(moved)

    def _check_group(self) -> str | None:
        """Why the tables on this disk or an object store are not this gateway's to land into
        (None: they are): its group's, or, alone, no group's (spark.tables.check_group; tables
        only Spark reaches are the cluster's). Tables that do not exist yet are the writer's to
        make, marked."""
        location = self.config.tables_path
        tables = delta_location(location)
        if tables is None:
            return None
        local = local_path(location)
        if local is not None and not any(local.glob("*/_delta_log")):
            return None  # without importing pyarrow and delta-rs: the writer does, in its thread
        from deltalake.exceptions import DeltaError

        from spark.tables import TablesOfAnotherGroup, check_group

        try:
            adopted = check_group(tables, self.config.group_tables)
        except TablesOfAnotherGroup as error:
            return str(error)
        except (OSError, DeltaError) as error:
            if local is not None:
                raise
            # The store is down or refuses (delta-rs says so with an OSError or, opening a
            # table whose log it has just listed, a DeltaError): the reads wait in the ledger
            # meanwhile, and a start must not wait for the store (the writer retries its
            # writes until it can).
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            log.warning(
                "could not check whose tables %s are (%s); starting without that check: the "
                "writer lands once the store answers",
                tables,
                first,
            )
            return None
        if adopted:
            log.info(
                "tables %s are group %s's from now on", ", ".join(adopted), self.config.group_tables
            )
        return None

    def _landing(self) -> str:
        """Why this configuration needs a Spark session, in its own keys."""
        spark = self.config.spark
        if spark.landing == "spark":
            return '[spark] landing = "spark"'
        if not is_local_master(spark.master):
            return f"[spark] master = {spark.master!r}"
        return f"[spark] tables_dir = {spark.tables_dir!r} (only Spark reaches it)"

    def run(self) -> int:
        cfg = self.config.gateway
        budget = RestartBudget(cfg.max_restarts, cfg.restart_window_seconds)
        # Owner-only from the first moment (docs/pages/operating/security.md).
        private_directory(cfg.data_path)
        try:
            check_versions(cfg.data_path)
        except SchemaTooNew as error:
            log.critical("not starting: %s", error)
            return EXIT_SCHEMA_TOO_NEW
        refused = self._check_group()
        if refused is not None:
            log.critical("not starting: %s", refused)
            return EXIT_TABLES_OF_ANOTHER_GROUP
        if not self.config.spark.lands_with_arrow:
            # The writer would start its Spark session in a restart loop; say it once, now,
            # with what to install (a light install has no Spark: setup.cfg's `spark` extra).
            from spark.session import SparkNotInstalled, check_spark

            try:
                check_spark()
            except SparkNotInstalled as error:
                log.critical("not starting: %s lands through Spark: %s", self._landing(), error)
                return EXIT_NOT_INSTALLED
        code = 0
        if self.metrics is not None:
            self._start_metrics()
        try:
            self._start_supervisor()
            while not self.stop.is_set():
                try:
                    self.supervisor.check_alive()
                except ActorCrashed as error:
                    if self._corrupt_database():
                        code = EXIT_CORRUPT_DATABASE
                        break
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
                self.supervisor.take_requests()
                self._publish_status()
                # Wake on the next tick, or at once on a stop request.
                self.clock.call_later(STATUS_INTERVAL, self._wake.set)
                self._wake.wait()
                self._wake.clear()
        except Exception:
            if self._corrupt_database():
                code = EXIT_CORRUPT_DATABASE
            else:
                log.exception("fxgate failed")
                code = 1
        finally:
            # Armed here, not in the signal handler: the clock takes a lock that the interrupted
            # main thread may hold. Every way out of the loop passes here.
            self.stop_deadline.arm()
            if self.supervisor is not None:
                log.info("stopping (at most %.0f s)", cfg.stop_timeout_seconds)
                self.supervisor.stop()
                try:
                    self._publish_status()
                except OSError:
                    pass
            if self.metrics is not None:
                self.metrics.stop()
            self.stop_deadline.disarm()
        return code


def run(config: Config, clock: Clock | None = None) -> int:
    """Run until SIGTERM/SIGINT (call from the main thread). Returns the exit status."""
    clock = clock or RealClock()
    gateway = Gateway(config, clock)
    previous = {}

    def on_signal(signum: int, _frame) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        gateway.request_stop()

    def on_dump(_signum: int, _frame) -> None:
        # Logging from inside a signal handler can deadlock on a handler lock the interrupted
        # thread holds; a short-lived thread logs instead, and works during a stuck stop too.
        threading.Thread(
            target=dump_stacks, args=("SIGUSR1",), name="fxgate-stack-dump", daemon=True
        ).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, on_signal)
    previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, on_dump)
    try:
        code = gateway.run()
    finally:
        if isinstance(clock, RealClock):
            clock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("fxgate stopped (exit %d)", code)
    return code
