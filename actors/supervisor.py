"""Supervisor: starts the actors in dependency order, watches them, stops them in reverse.

Order: ledger (owns the database) -> lifecycle -> Spark writer -> pack actor -> (forwarding:
outbound, tier-2 buffer, upstream connection) -> source connection. The ledger feeds the two
sinks on their own: the pack actor and the writer (the table), and the buffer and the outbound
ledger (the upstream); neither waits for the other (DESIGN §7.1). The source comes last so that
nothing is acknowledged before the whole path can take it, and it goes first on the way down so
that nothing new arrives while packs and batches are flushed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pykka

from actors.clock import Clock
from actors.config.routes import Route, RouteCache, lifecycle_filter, lifecycle_route
from actors.config.schema import Config
from actors.connection import ConnectionActor, ConnectionSettings, ledger_client_factory
from actors.forward_leg import start_forward_leg
from actors.forward_process import ForwardProcess
from actors.ledger import InboundLedger, InlineIntake
from actors.lifecycle import LifecycleActor, client_info
from actors.lifecycle_sink import LedgerEventSink, SourceEventSink
from actors.listener import WriterListener
from actors.messages import (
    BatchWritten,
    ClientsConfigured,
    CompactionReport,
    ReplayBatch,
    TakeReplays,
    WriterHealth,
)
from actors.mqtt.intake import IntakeGate
from actors.pack import PackActor
from actors.tell import stop_actor
from actors.writer import CompactionSchedule, CompactNow, GroupLanding, SparkWriterActor
from persistence.compaction_request import pending_compaction_requests
from persistence.disk_budget import DiskBudget
from persistence.permissions import private_directory
from persistence.records import ReaderCount
from persistence.replay import pending_requests

log = logging.getLogger(__name__)

STOP_TIMEOUT = 120.0
ASK_TIMEOUT = 30.0


class ActorCrashed(RuntimeError):
    pass


def _connection_settings(
    name: str, broker, client_id: str, receive_maximum: int, environ=None, **extra
) -> ConnectionSettings:
    """ConnectionSettings from a [source] or [upstream] section (their keys are the same)."""
    return ConnectionSettings(
        name=name,
        host=broker.host,
        port=broker.port,
        client_id=client_id,
        username=broker.username,
        password=broker.password(os.environ if environ is None else environ),
        clean_start=broker.clean_session,
        session_expiry_seconds=broker.session_expiry_interval_seconds,
        keepalive_seconds=broker.keepalive_seconds,
        receive_maximum=receive_maximum,
        auto_reconnect=broker.auto_reconnect,
        reconnect_min_delay=broker.reconnect_min_delay_seconds,
        reconnect_max_delay=broker.reconnect_max_delay_seconds,
        reconnect_jitter=broker.reconnect_jitter,
        password_file=broker.file_path("password_file"),
        tls=broker.tls,
        tls_ca_file=broker.file_path("tls_ca_file"),
        tls_cert_file=broker.file_path("tls_cert_file"),
        tls_key_file=broker.file_path("tls_key_file"),
        tls_insecure=broker.tls_insecure,
        **extra,
    )


def source_settings(config: Config, environ=None) -> ConnectionSettings:
    return _connection_settings(
        "source",
        config.source,
        config.identity.client_id,
        # Unset: one pack in flight from the broker while the ledger commits it.
        config.source.receive_maximum or config.packs.max_messages,
        environ,
        subscriptions=config.identity.subscriptions,
        qos=config.source.qos,
    )


def upstream_settings(config: Config, environ=None) -> ConnectionSettings:
    return _connection_settings(
        "upstream",
        config.upstream,
        config.identity.upstream_client_id,
        config.upstream.window,
        environ,
        subscriptions=(),
    )


def _forwards(routes: RouteCache) -> Callable[[str], bool]:
    """Whether a route wants the topic (the ledger marks such messages owed upstream)."""
    return lambda topic: routes(topic) is not None


def spark_session_factory(config: Config):
    from spark.session import build_session

    def make():
        return build_session(
            config.spark.master,
            config.gateway.data_path / "spark",
            driver_memory=config.spark.driver_memory,
            class_data_archive=config.spark.class_data_archive,
            # Hadoop's umask: the table files it writes on a local file system are 0600 and
            # their directories 0700, like the ledger (a setting of the file's wins).
            conf={"spark.hadoop.fs.permissions.umask-mode": "077", **config.spark.conf},
        )

    return make


class Supervisor(WriterListener):
    def __init__(
        self,
        config: Config,
        clock: Clock,
        *,
        session_factory=None,
        session_closer=None,
        writer_options: dict | None = None,
    ):
        self.config = config
        self.clock = clock
        # Extra keyword arguments of the SparkWriterActor (tests inject a failing table writer).
        self._writer_options = writer_options or {}
        self._session_factory = session_factory or spark_session_factory(config)
        if session_closer is None and session_factory is None:
            from spark.session import stop_session

            session_closer = stop_session
        self._session_closer = session_closer
        self._actors: list[tuple[str, pykka.ActorRef]] = []
        self._status_proxies: dict[str, tuple[pykka.ActorRef, pykka.ActorProxy]] = {}
        self.intake: IntakeGate | None = None
        self._batch_lock = threading.Lock()
        self.last_batch: BatchWritten | None = None
        self.batches_written = 0
        self.rows_written = 0
        self.dead_letters_written = 0
        self.dead_letters_by_reason: dict[str, int] = {}  # "sink/reason" -> rows landed
        self.events_written = 0
        # In a shared group's tables: rows of this member's batches that another member had
        # landed first, and merges that lost a commit race and were merged again.
        self.already_landed = 0
        self.merges_retried = 0
        self._landed = threading.Condition(self._batch_lock)
        self._health: WriterHealth | None = None  # the writer's latest, from its thread
        self._compaction: CompactionReport | None = None  # likewise, once compaction is on
        # Each reader's event-number counters (this gateway's intake), as of the last batch.
        self.readers: dict[str, ReaderCount] = {}
        # Each reader's health state (spark.reader_health), as of the last batch.
        self.reader_health: dict[str, dict] = {}
        self.reader_events_written = 0

    # -- start / stop -----------------------------------------------------------------------

    def start(self) -> None:
        cfg = self.config
        for line in cfg.summary_lines():
            log.info("%s", line)
        for warning in cfg.warnings():
            log.warning("%s", warning)
        self.intake = IntakeGate(
            cfg.ledger.intake_max_messages, cfg.ledger.intake_max_bytes, self.clock.monotonic
        )
        self.inline = InlineIntake()
        routes = self.upstream_routes()
        try:
            ledger = self._start(
                "ledger",
                InboundLedger,
                cfg.gateway.data_path / "ledger.sqlite",
                self.clock,
                durability=cfg.gateway.durability,
                group_commit_max_messages=cfg.ledger.group_commit_max_messages,
                group_commit_max_delay=cfg.ledger.group_commit_max_delay_seconds,
                # A landed key is kept as long as the broker may still redeliver its message.
                retention_seconds=cfg.source.session_expiry_interval_seconds + 600.0,
                intake=self.intake,
                inline=self.inline,
                forward_topic=None
                if not cfg.forwarding
                else _forwards(RouteCache(routes, cfg.identity.environment_id)),
                budget=DiskBudget(cfg.ledger.max_bytes, cfg.ledger.min_free_bytes),
            )
            # Right after the ledger, which stores its events (so none is emitted before they
            # can be stored), and before the connections, so it stops after them and records
            # their final disconnects: stored in the ledger, landed or forwarded on the next
            # start if the packs have stopped by then.
            sinks: list = [
                LedgerEventSink(ledger, cfg.lifecycle.topic, cfg.identity.environment_id)
            ]
            # With an upstream, events leave through the outbound ledger (an implicit route);
            # without one, they are published on the source broker.
            publisher = None
            if not cfg.forwarding:
                publisher = SourceEventSink(cfg.lifecycle.topic, cfg.identity.environment_id)
                sinks.append(publisher)
            lifecycle = self._start(
                "lifecycle",
                LifecycleActor,
                cfg.gateway.data_path / "lifecycle.sqlite",
                self.clock,
                sinks,
                f"fxgate/{cfg.identity.environment_id}/{cfg.identity.client_id}",
                durability=cfg.gateway.durability,
                namespace=cfg.lifecycle_namespace,
            )
            clients = [source_settings(cfg)]
            if cfg.forwarding:
                clients.append(upstream_settings(cfg))
            lifecycle.tell(ClientsConfigured(tuple(client_info(s) for s in clients)))
            recovery = ledger.proxy().recovery().get(timeout=ASK_TIMEOUT)
            with self._batch_lock:
                self.readers = dict(recovery.readers)
                self.reader_health = {r: dict(s) for r, s in recovery.reader_health.items()}
            tables = cfg.spark.tables_path(cfg.gateway.data_path)
            if isinstance(tables, Path):  # a local directory; a URI's storage is the cluster's
                private_directory(tables)
            writer = self._start(
                "spark-writer",
                SparkWriterActor,
                ledger.proxy(),
                self.clock,
                cfg.spark.tables_path(cfg.gateway.data_path),
                self._session_factory,
                self._session_closer,
                batch_max_rows=cfg.spark.batch_max_rows,
                batch_max_seconds=cfg.spark.batch_max_seconds,
                batch_max_bytes=cfg.spark.batch_max_bytes,
                processing_timeout=cfg.packs.processing_timeout_seconds,
                listener=self,
                idempotency_key=cfg.ledger.idempotency_key,
                backlog_high=cfg.spark.backlog_high_messages,
                backlog_low=cfg.spark.backlog_low_messages,
                backlog_high_bytes=cfg.spark.backlog_high_bytes,
                events_filter=lifecycle_filter(cfg.lifecycle.topic, cfg.identity.environment_id),
                max_payload_bytes=cfg.spark.max_payload_bytes,
                max_reads_per_message=cfg.spark.max_reads_per_message,
                readers=dict(recovery.readers),
                management_topics=cfg.source.management_topics,
                reader_health=dict(recovery.reader_health),
                compaction=CompactionSchedule(
                    enabled=cfg.compaction.enabled,
                    start_delay=cfg.compaction.start_delay_seconds,
                    interval=cfg.compaction.interval_seconds,
                    target_file_bytes=cfg.compaction.target_file_mb * 1024 * 1024,
                    open_file_bytes=cfg.compaction.open_file_mb * 1024 * 1024,
                    vacuum_retention_hours=cfg.compaction.vacuum_retention_hours,
                    data_dir=cfg.gateway.data_path,
                ),
                table_properties=cfg.compaction.table_properties(),
                land_with_arrow=cfg.spark.lands_with_arrow,
                group=None
                if cfg.group_tables is None
                else GroupLanding(cfg.group_tables, cfg.identity.client_id),
                **self._writer_options,
            )
            pack = self._start(
                "packs",
                PackActor,
                writer,
                self.clock,
                max_messages=cfg.packs.max_messages,
                linger_seconds=cfg.packs.linger_seconds,
                next_pack_id=recovery.next_pack_id,
            )
            # The open batches go first, then the ledger hands on its loose rows (recovery).
            for batch_id, records in recovery.open_batches:
                writer.tell(ReplayBatch(batch_id, records))
            ledger.proxy().set_listener(pack).get(timeout=ASK_TIMEOUT)
            if cfg.forwarding:
                self._start_forwarding(ledger, routes)
            source = self._start(
                "source",
                ConnectionActor,
                source_settings(cfg),
                self.clock,
                ledger,
                client_factory=ledger_client_factory(ledger, self.intake, self.inline.take),
                lifecycle=lifecycle,
            )
            if publisher is not None:
                publisher.bind(source)
        except Exception:
            self.stop()
            raise
        log.info("fxgate started: %s", ", ".join(name for name, _ in self._actors))

    def upstream_routes(self) -> tuple[Route, ...]:
        """What goes upstream: the life-cycle events on their own topic, then the file's
        routes; nothing when forwarding is off."""
        cfg = self.config
        if not cfg.forwarding:
            return ()
        return (lifecycle_route(cfg.lifecycle.topic, cfg.identity.environment_id), *cfg.routes)

    def _start_forwarding(self, ledger: pykka.ActorRef, routes: tuple[Route, ...]) -> None:
        cfg = self.config
        live_from_seq = ledger.proxy().stored_before_start().get(timeout=ASK_TIMEOUT) + 1
        lifecycle = self.ref("lifecycle")
        if cfg.upstream.process == "own":
            forward = ForwardProcess(
                {
                    "config": cfg,
                    "settings": upstream_settings(cfg),
                    "routes": routes,
                    "live_from_seq": live_from_seq,
                    "ask_timeout": ASK_TIMEOUT,
                    "stop_timeout": STOP_TIMEOUT,
                },
                ledger,
                lifecycle,
            )
            self._actors.append(("forward", forward))
            buffer = forward.buffer
        else:
            buffer = start_forward_leg(
                self._start,
                cfg,
                self.clock,
                upstream_settings(cfg),
                routes,
                ledger=ledger,
                lifecycle=lifecycle,
                live_from_seq=live_from_seq,
                ask_timeout=ASK_TIMEOUT,
            )
        ledger.proxy().set_forwarder(buffer).get(timeout=ASK_TIMEOUT)

    def _start(self, name: str, actor_class, *args, **kwargs) -> pykka.ActorRef:
        ref = actor_class.start(*args, **kwargs)
        self._actors.append((name, ref))
        log.info("started %s", name)
        return ref

    def stop(self) -> None:
        """Stop in reverse order; each actor finishes what is in its mailbox first."""
        while self._actors:
            name, ref = self._actors.pop()
            if name == "source":
                self._flush_acks()
            stop_actor(name, ref, STOP_TIMEOUT)
            if name == "source":
                self._settle_lifecycle()

    def _settle_lifecycle(self) -> None:
        """The source's last event (our DISCONNECT) into the ledger while the packs still run,
        so it lands in this run's last batch. The upstream's last event comes after the packs
        stopped: it is stored, and lands at the next start."""
        lifecycle, ledger = self.ref("lifecycle"), self.ref("ledger")
        try:
            if lifecycle is not None and lifecycle.is_alive():
                lifecycle.proxy().status().get(timeout=ASK_TIMEOUT)  # its mailbox is worked off
            if ledger is not None and ledger.is_alive():
                # The event is committed, and every row the table's feed owes is handed to the
                # packs (within the writer's credit) before they stop: a graceful stop lands
                # what the ledger holds, not only what happened to be handed on already.
                ledger.proxy().settle().get(timeout=ASK_TIMEOUT)
        except (pykka.ActorDeadError, pykka.Timeout):
            log.warning("the last life-cycle event may land only at the next start")

    def _flush_acks(self) -> None:
        """Commit and ack what the ledger holds before the source disconnects, so the broker
        does not redeliver it on the next start (harmless, but wasted work)."""
        ledger = self.ref("ledger")
        if ledger is not None and ledger.is_alive():
            try:
                ledger.proxy().stats().get(timeout=ASK_TIMEOUT)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass

    # -- watching ---------------------------------------------------------------------------

    def ref(self, name: str) -> pykka.ActorRef | None:
        return dict(self._actors).get(name)

    def check_alive(self) -> None:
        for name, ref in self._actors:
            if not ref.is_alive():
                raise ActorCrashed(f"actor {name} died; see the traceback above")

    def writer_health(self, health: WriterHealth) -> None:
        # Pushed by the writer rather than asked: a Spark job can hold its thread for seconds.
        with self._batch_lock:
            self._health = health

    def compaction(self, report: CompactionReport) -> None:
        with self._batch_lock:
            self._compaction = report

    def batch_written(self, batch: BatchWritten) -> None:
        with self._landed:
            self.last_batch = batch
            self.batches_written += 1
            self.rows_written += batch.rows
            self.dead_letters_written += batch.dead_letters
            for sink, reason, count in batch.dead_letter_reasons:
                key = f"{sink}/{reason}"
                self.dead_letters_by_reason[key] = self.dead_letters_by_reason.get(key, 0) + count
            self.events_written += batch.events
            self.already_landed += batch.already_landed
            self.merges_retried += batch.merges_retried
            self.readers.update((r.reader_id, r) for r in batch.readers)
            self.reader_health.update(batch.reader_health)
            self.reader_events_written += batch.reader_events
            self._landed.notify_all()

    def wait_for_landed(
        self, rows: int, dead_letters: int = 0, timeout: float = 60.0, events: int = 0
    ) -> bool:
        """Block until at least this many rows, dead letters and events are in the tables."""
        with self._landed:
            return self._landed.wait_for(
                lambda: (
                    self.rows_written >= rows
                    and self.dead_letters_written >= dead_letters
                    and self.events_written >= events
                ),
                timeout,
            )

    def _status_proxy(self, name: str, ref: pykka.ActorRef) -> pykka.ActorProxy:
        """The proxy `status` asks `name` through, made once per actor: making one introspects
        the whole actor, 4-5 ms of the interpreter lock per snapshot for the six of them (py-spy,
        forwarding while draining), once a second."""
        made = self._status_proxies.get(name)
        if made is None or made[0] is not ref:
            made = self._status_proxies[name] = (ref, ref.proxy())
        return made[1]

    def status(self) -> dict:
        """A snapshot for `fxgate status`; never blocks for long on a busy actor."""
        out: dict = {"actors": {name: ref.is_alive() for name, ref in self._actors}}
        asks = {
            "source": lambda proxy: asdict(proxy.state().get(timeout=5)),
            "upstream": lambda proxy: asdict(proxy.state().get(timeout=5)),
            "ledger": lambda proxy: proxy.stats().get(timeout=5),
            "outbound": lambda proxy: proxy.status().get(timeout=5),
            "buffer": lambda proxy: proxy.status().get(timeout=5),
            "lifecycle": lambda proxy: proxy.status().get(timeout=5),
        }
        try:
            for name, ask in asks.items():
                ref = self.ref(name)
                if ref is not None and ref.is_alive():
                    out[name] = ask(self._status_proxy(name, ref))
        except (pykka.Timeout, pykka.ActorDeadError):
            out["stale"] = True
        forward = self.ref("forward")
        if forward is not None:
            # The leg's actors as the child reports them when asked (actors.forward_process).
            out.update(forward.status())
        if self.intake is not None:
            out["intake"] = asdict(self.intake.stats())
        with self._batch_lock:
            out["batches_written"] = self.batches_written
            out["readers"] = {
                reader_id: {
                    "received": c.received,
                    "missing": c.missing,
                    "resets": c.resets,
                    "without_event_num": c.without_event_num,
                    "last_event_num": c.last_event_num,
                }
                for reader_id, c in sorted(self.readers.items())
            }
            out["reader_health"] = {
                reader_id: dict(state) for reader_id, state in sorted(self.reader_health.items())
            }
            out["reader_events_written"] = self.reader_events_written
            if self.config.group_tables is not None:
                out["group"] = {
                    "tables": self.config.group_tables,
                    "member": self.config.identity.client_id,
                    "rows_landed": self.rows_written - self.already_landed,
                    "already_landed": self.already_landed,
                    "merges_retried": self.merges_retried,
                }
            last = asdict(self.last_batch) if self.last_batch else None
            if last is not None:
                last.pop("reader_health", None)  # the whole of it is above
            out["last_batch"] = last
            if self._health is not None:
                out["spark"] = asdict(self._health)
            if self._compaction is not None:
                out["compaction"] = asdict(self._compaction)
        out["wall_time"] = self.clock.wall()
        out["pid"] = os.getpid()
        return out

    def take_requests(self) -> None:
        """Called by the daemon each second: hand the ledger the replay requests that
        `fxgate dead-letters replay` left in the data directory (the command never touches the
        ledger itself: it has one owner), and the writer those of `fxgate compact`."""
        ledger = self.ref("ledger")
        data_dir = self.config.gateway.data_path
        if ledger is not None and pending_requests(data_dir):
            ledger.tell(TakeReplays(data_dir))
        # `fxgate compact` while the daemon runs: the writer compacts (it owns the session).
        writer = self.ref("spark-writer")
        if writer is not None and pending_compaction_requests(data_dir):
            writer.tell(CompactNow())
