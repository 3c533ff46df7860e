"""Prometheus `/metrics` and `/healthz` over HTTP, read from the daemon's status snapshot.

The daemon already asks every actor for its status once a second (`Supervisor.status()`); the
endpoint serves the latest of those snapshots instead of asking the actors again, so a scrape
never waits on a busy actor and scraping often costs the data path nothing. The health rules
need what happened *between* snapshots (since when a connection is down, when a batch last
landed), so `StatusBoard` remembers that, timed on the daemon's injected clock.

The server runs on its own threads (`ThreadingHTTPServer`), with its own `CollectorRegistry` so
that nothing registered globally by a library ends up in our scrape.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from actors.clock import Clock
from spark.reader_health import is_silent, silent_for, summary

log = logging.getLogger(__name__)

CONNECTIONS = ("source", "upstream")


@dataclass(frozen=True)
class HealthThresholds:
    connection_down_seconds: float = 120.0
    status_stale_seconds: float = 30.0
    writer_stalled_seconds: float = 300.0
    # Failed Spark attempts in a row before /healthz says so: one failure is retried within a
    # second and is no news; three (about 1 + 2 + 4 s of backoff) are.
    spark_failures: int = 3
    # A reader heard from before and silent this long is flagged (0 = never); see _silent_readers.
    reader_silent_seconds: float = 300.0

    @classmethod
    def from_config(cls, gateway) -> HealthThresholds:
        return cls(
            gateway.health_connection_down_seconds,
            gateway.health_status_stale_seconds,
            gateway.health_writer_stalled_seconds,
            gateway.health_spark_failures,
            gateway.health_reader_silent_seconds,
        )


@dataclass(frozen=True)
class Health:
    healthy: bool
    reasons: tuple[str, ...]
    status_age_seconds: float | None
    connections_down_seconds: dict[str, float] = field(default_factory=dict)
    # Wrong outside the gateway (a silent reader): reported, but /healthz still answers 200.
    degraded: tuple[str, ...] = ()

    def as_json(self) -> dict:
        return {
            "status": "unhealthy" if not self.healthy else "degraded" if self.degraded else "ok",
            "reasons": list(self.reasons),
            "degraded": list(self.degraded),
            "status_age_seconds": self.status_age_seconds,
            "connections_down_seconds": self.connections_down_seconds,
        }


class StatusBoard:
    """The latest status snapshot, and since when each thing the health rules watch has been so.

    `publish` is called by the daemon's loop; `snapshot` and `health` by HTTP threads.
    """

    def __init__(self, clock: Clock, thresholds: HealthThresholds) -> None:
        self._clock = clock
        self.thresholds = thresholds
        self._lock = threading.Lock()
        self._snapshot: dict | None = None
        # Before the first snapshot the age counts from here, so a daemon that never manages to
        # report turns unhealthy instead of looking fine forever.
        self._fresh_at = clock.monotonic()
        self._down_since: dict[str, float] = {}
        self._batches_seen: int | None = None
        self._progress_at = self._fresh_at

    def publish(self, snapshot: dict) -> None:
        now = self._clock.monotonic()
        with self._lock:
            self._snapshot = snapshot
            # A snapshot in which an ask timed out holds only part of the answers: it shows the
            # daemon alive but does not prove the actors are.
            if not snapshot.get("stale"):
                self._fresh_at = now
            for name in CONNECTIONS:
                conn = snapshot.get(name)
                if conn is None:
                    if name not in _alive_actors(snapshot):
                        self._down_since.pop(name, None)  # not configured (or not started)
                    continue
                if conn.get("state") == "connected":
                    self._down_since.pop(name, None)
                else:
                    self._down_since.setdefault(name, now)
            batches = snapshot.get("batches_written")
            pending = (snapshot.get("ledger") or {}).get("pending", 0)
            if batches != self._batches_seen or not pending:
                self._batches_seen = batches
                self._progress_at = now

    def snapshot(self) -> dict | None:
        with self._lock:
            return self._snapshot

    def wall(self) -> float:
        """Wall-clock seconds on the injected clock: what reader ages are measured against."""
        return self._clock.wall()

    def health(self) -> Health:
        now = self._clock.monotonic()
        limits = self.thresholds
        with self._lock:
            snapshot = self._snapshot
            age = now - self._fresh_at
            down = {name: now - since for name, since in self._down_since.items()}
            stalled = now - self._progress_at
        reasons = []
        if age > limits.status_stale_seconds:
            what = "no status snapshot yet" if snapshot is None else "status snapshot"
            reasons.append(
                f"{what} for {age:.0f} s (limit {limits.status_stale_seconds:g} s): "
                "an actor is not answering"
            )
        for name, seconds in sorted(down.items()):
            if seconds > limits.connection_down_seconds:
                state = (snapshot or {}).get(name) or {}
                reasons.append(
                    f"{name} connection down for {seconds:.0f} s "
                    f"(limit {limits.connection_down_seconds:g} s, "
                    f"last reason: {state.get('last_reason') or '-'})"
                )
        for name, alive in sorted(((snapshot or {}).get("actors") or {}).items()):
            if not alive:
                reasons.append(f"actor {name} is not alive")
        reasons.extend(_storage_reasons(snapshot or {}, limits))
        reasons.extend(_connection_causes(snapshot or {}))
        # While a connection is down, rows waiting for it is expected, and that rule says so.
        if not down and stalled > limits.writer_stalled_seconds:
            pending = ((snapshot or {}).get("ledger") or {}).get("pending", 0)
            reasons.append(
                f"{pending} message(s) wait for the table and no batch landed for "
                f"{stalled:.0f} s (limit {limits.writer_stalled_seconds:g} s): writer stuck"
            )
        return Health(
            healthy=not reasons,
            reasons=tuple(reasons),
            status_age_seconds=None if snapshot is None else round(age, 3),
            connections_down_seconds={name: round(s, 3) for name, s in down.items()},
            degraded=tuple(_silent_readers(snapshot or {}, self._clock.wall(), limits)),
        )


def _storage_reasons(snapshot: dict, limits: HealthThresholds) -> list[str]:
    """A ledger that cannot write is unhealthy at once (it acknowledges nothing meanwhile);
    Spark after `spark_failures` failed attempts in a row."""
    reasons = []
    ledger = snapshot.get("ledger") or {}
    budget = ledger.get("budget") or {}
    if budget.get("paused"):
        reasons.append(
            f"source paused: the ledger is at its disk budget ({budget.get('describe')}); "
            "the broker's queue limits decide what is lost until the sinks catch up"
        )
    if ledger.get("storage_error"):
        reasons.append(
            f"inbound ledger cannot write for {ledger.get('storage_failing_seconds') or 0:.0f} s "
            f"({ledger['storage_error']}): acknowledgements held, "
            f"{ledger.get('storage_backlog', 0)} message(s) wait in memory"
        )
    outbound = snapshot.get("outbound") or {}
    if outbound.get("storage_error"):
        reasons.append(
            f"outbound ledger cannot write ({outbound['storage_error']}): forwarding stopped"
        )
    spark = snapshot.get("spark") or {}
    if spark.get("failures", 0) >= limits.spark_failures:
        retry = spark.get("next_retry_time")
        wall = snapshot.get("wall_time")
        due = (
            "" if retry is None or wall is None else f", next retry in {max(retry - wall, 0):.0f} s"
        )
        reasons.append(
            f"table writes failing: {spark['failures']} attempt(s) in a row "
            f"(limit {limits.spark_failures}), last error: {spark.get('last_error') or '-'}{due}"
        )
    return reasons


def _connection_causes(snapshot: dict) -> list[str]:
    """What makes a connection useless at once, whatever the down-time threshold: a subscription
    the broker refused (connected, yet nothing arrives on that filter), or a connection that
    ended with auto_reconnect = false (it will not come back by itself)."""
    reasons = []
    for name in CONNECTIONS:
        conn = snapshot.get(name) or {}
        for topic, why in sorted((conn.get("refused_subscriptions") or {}).items()):
            reasons.append(
                f"{name} subscription to {topic} refused by the broker ({why}): nothing arrives "
                "on it until a SUBACK grants it"
            )
        if conn.get("state") == "not_reconnecting":
            reasons.append(
                f"{name} connection ended and auto_reconnect = false: not reconnecting "
                f"(last reason: {conn.get('last_reason') or '-'})"
            )
    return reasons


def _subscriptions(snapshot: dict) -> Iterator[Metric]:
    refused = GaugeMetricFamily(
        "fxgate_subscriptions_refused",
        "Subscriptions whose last SUBACK refused them (nothing arrives on them).",
        labels=["connection"],
    )
    refusals = CounterMetricFamily(
        "fxgate_subscription_refusals",
        "Subscriptions refused in SUBACKs (reason code >= 0x80).",
        labels=["connection"],
    )
    for name in CONNECTIONS:
        conn = snapshot.get(name)
        if conn is None or "refused_subscriptions" not in conn:
            continue
        refused.add_metric([name], len(conn["refused_subscriptions"]))
        refusals.add_metric([name], conn.get("subscription_refusals", 0))
    yield from (refused, refusals)


def _silent_readers(snapshot: dict, now: float, limits: HealthThresholds) -> list[str]:
    """A reader heard from before and silent past the limit: degraded, not unhealthy. The
    gateway is fine, and restarting it (what a failing health check leads to) would not bring a
    reader back; an operator still wants to be told, here and in fxgate_reader_silent."""
    out = []
    for reader, state in sorted((snapshot.get("reader_health") or {}).items()):
        if is_silent(state, now, limits.reader_silent_seconds):
            out.append(
                f"reader {reader} silent for {silent_for(state, now):.0f} s "
                f"(limit {limits.reader_silent_seconds:g} s): no tag or management event"
            )
    return out


def _alive_actors(snapshot: dict) -> set[str]:
    return {name for name, alive in (snapshot.get("actors") or {}).items() if alive}


class StatusCollector:
    """Turns the board's latest snapshot into metric families at each scrape."""

    def __init__(self, board: StatusBoard) -> None:
        self._board = board

    def collect(self) -> Iterator[Metric]:
        health = self._board.health()
        yield _gauge("fxgate_healthy", "1 when /healthz answers 200, else 0.", health.healthy)
        if health.status_age_seconds is not None:
            yield _gauge(
                "fxgate_status_age_seconds",
                "Age of the status snapshot the other metrics come from.",
                health.status_age_seconds,
            )
        snapshot = self._board.snapshot()
        if snapshot is None:
            return
        yield from _connections(snapshot, health)
        yield from _subscriptions(snapshot)
        yield from _ledger(snapshot)
        yield from _forwarding(snapshot)
        yield from _landing(snapshot)
        yield from _readers(snapshot)
        yield from _reader_health(
            snapshot, self._board.wall(), self._board.thresholds.reader_silent_seconds
        )
        yield _counter(
            "fxgate_actor_restarts",
            "Restarts of the actor set after an actor crashed.",
            snapshot.get("restarts", 0),
        )


def _gauge(name: str, doc: str, value: float | bool) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    # Counters restart from 0 when the actor set restarts; Prometheus' rate() treats a drop as
    # a reset, which is what it is.
    return CounterMetricFamily(name, doc, value=float(value))


def _connections(snapshot: dict, health: Health) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "fxgate_connection_up", "1 while the broker connection is up.", labels=["connection"]
    )
    down = GaugeMetricFamily(
        "fxgate_connection_down_seconds",
        "How long the connection has been down (0 while up).",
        labels=["connection"],
    )
    connects = CounterMetricFamily(
        "fxgate_connection_connects", "Successful CONNACKs.", labels=["connection"]
    )
    reconnects = CounterMetricFamily(
        "fxgate_connection_reconnects", "Connects after the first one.", labels=["connection"]
    )
    disconnects = CounterMetricFamily(
        "fxgate_connection_disconnects", "Connections lost or closed.", labels=["connection"]
    )
    for name in CONNECTIONS:
        conn = snapshot.get(name)
        if conn is None:
            continue
        up.add_metric([name], 1.0 if conn.get("state") == "connected" else 0.0)
        down.add_metric([name], health.connections_down_seconds.get(name, 0.0))
        connects.add_metric([name], conn.get("connects", 0))
        reconnects.add_metric([name], max(conn.get("connects", 0) - 1, 0))
        disconnects.add_metric([name], conn.get("disconnects", 0))
    yield from (up, down, connects, reconnects, disconnects)
    yield from _lifecycle(snapshot)


def _lifecycle(snapshot: dict) -> Iterator[Metric]:
    """The life-cycle sequence number of each client: it rises by one per connect, persisted, so
    its rate is the reconnect rate across restarts too."""
    clients = snapshot.get("lifecycle") or []
    if not clients:
        return
    sequence = GaugeMetricFamily(
        "fxgate_lifecycle_sequence_number",
        "The client's last life-cycle sequence number (one per connect, kept across restarts).",
        labels=["connection", "client_id"],
    )
    for client in clients:
        sequence.add_metric(
            [client["name"], client["client_id"]], client.get("sequence_number") or 0
        )
    yield sequence


def _ledger(snapshot: dict) -> Iterator[Metric]:
    ledger = snapshot.get("ledger")
    if ledger is not None:
        accepted = ledger.get("accepted", 0)
        duplicates = ledger.get("duplicates", 0)
        yield _counter(
            "fxgate_messages_received",
            "Messages taken from the source broker, duplicates included.",
            accepted + duplicates,
        )
        yield _counter(
            "fxgate_messages_accepted", "New messages stored in the inbound ledger.", accepted
        )
        yield _counter(
            "fxgate_messages_duplicates",
            "Redelivered messages the ledger already held (dropped, acked again).",
            duplicates,
        )
        yield _gauge(
            "fxgate_ledger_pending_messages",
            "Messages in the inbound ledger not yet landed in the table.",
            ledger.get("pending") or 0,  # None while the ledger cannot be read
        )
        yield from _sinks(ledger)
        yield from _budget(ledger)
        yield _gauge(
            "fxgate_ledger_awaiting_pubrel",
            "Inbound QoS 2 messages stored and waiting for PUBREL.",
            ledger.get("awaiting_pubrel", 0),
        )
        yield _gauge(
            "fxgate_ledger_storage_failing",
            "1 while the inbound ledger cannot write (disk full, read-only, I/O error).",
            bool(ledger.get("storage_error")),
        )
        yield _gauge(
            "fxgate_ledger_storage_backlog",
            "Messages neither stored nor acknowledged, waiting in memory for the ledger's disk.",
            ledger.get("storage_backlog", 0),
        )
        yield _counter(
            "fxgate_ledger_storage_failures",
            "Ledger writes that failed for a storage fault (each retry counts).",
            ledger.get("storage_failures", 0),
        )
    intake = snapshot.get("intake")
    if intake is not None:
        yield _gauge(
            "fxgate_intake_waiting_messages",
            "Messages handed over by the source connection, not yet taken by the ledger.",
            intake.get("waiting_messages", 0),
        )
        yield _gauge(
            "fxgate_intake_waiting_bytes",
            "Payload bytes of those messages.",
            intake.get("waiting_bytes", 0),
        )


def _sinks(ledger: dict) -> Iterator[Metric]:
    """Each sink's own lag (DESIGN §7.1): what it still owes, and how old the oldest is."""
    lags = ledger.get("lag") or {}
    if not lags:
        return
    messages = GaugeMetricFamily(
        "fxgate_sink_lag_messages",
        "Messages stored in the ledger that this sink (table, upstream) has not finished.",
        labels=["sink"],
    )
    seconds = GaugeMetricFamily(
        "fxgate_sink_lag_seconds",
        "Age of the oldest message this sink has not finished (0 when none).",
        labels=["sink"],
    )
    for sink, lag in sorted(lags.items()):
        messages.add_metric([sink], lag.get("messages") or 0)
        seconds.add_metric([sink], lag.get("oldest_age_seconds") or 0.0)
    yield from (messages, seconds)


def _budget(ledger: dict) -> Iterator[Metric]:
    budget = ledger.get("budget")
    if not budget:
        return
    yield _gauge(
        "fxgate_source_paused",
        "1 while the ledger is at its disk budget and the source's socket is not read.",
        bool(budget.get("paused")),
    )
    yield _counter(
        "fxgate_source_pauses",
        "Times the ledger reached its disk budget and paused the source.",
        budget.get("pauses", 0),
    )
    yield _gauge(
        "fxgate_ledger_budget_bytes",
        "The ledger's disk budget ([ledger] max_bytes).",
        budget["max_bytes"],
    )
    if budget.get("used_bytes") is not None:
        yield _gauge(
            "fxgate_ledger_used_bytes",
            "Bytes the ledger's file uses (used SQLite pages and the write-ahead log).",
            budget["used_bytes"],
        )
        yield _gauge(
            "fxgate_ledger_free_bytes",
            "Free bytes on the ledger's file system ([ledger] min_free_bytes must stay free).",
            budget["free_bytes"],
        )


def _forwarding(snapshot: dict) -> Iterator[Metric]:
    buffer = snapshot.get("buffer")
    if buffer is not None:
        yield _gauge(
            "fxgate_tier2_messages", "Messages in the tier-2 buffer.", buffer["tier2_messages"]
        )
        yield _gauge("fxgate_tier2_bytes", "Bytes in the tier-2 buffer.", buffer["tier2_bytes"])
        yield _counter(
            "fxgate_dropped_qos0",
            "QoS 0 messages dropped at a full tier-2 buffer.",
            buffer["dropped_qos0"],
        )
        yield _counter(
            "fxgate_dropped_at_restart",
            "Messages of live-only routes (QoS 0 or persist = false) stored before this start "
            "and not forwarded (upstream dead letters 'restart_dropped').",
            buffer.get("dropped_at_restart", 0),
        )
    outbound = snapshot.get("outbound")
    if outbound is not None:
        yield _gauge(
            "fxgate_upstream_in_flight",
            "Messages handed to the upstream connection and not yet acknowledged.",
            outbound["in_flight"],
        )
        yield _counter(
            "fxgate_messages_forwarded",
            "Messages acknowledged by the upstream broker.",
            outbound.get("forwarded", 0),
        )
        yield _counter(
            "fxgate_forward_dead_letters",
            "Messages dead-lettered after the pack's retries were exhausted.",
            outbound.get("dead", 0),
        )
        yield _counter(
            "fxgate_forward_retries", "Pack retries towards upstream.", outbound.get("retries", 0)
        )


def _landing(snapshot: dict) -> Iterator[Metric]:
    yield _counter(
        "fxgate_batches_written",
        "Spark batches committed to the tables.",
        snapshot.get("batches_written", 0),
    )
    if "rows_written" in snapshot:
        yield _counter(
            "fxgate_landed_rows", "Rows written to the reads table.", snapshot["rows_written"]
        )
    if "dead_letters_written" in snapshot:
        yield _counter(
            "fxgate_landed_dead_letters",
            "Rows written to the dead_letters table.",
            snapshot["dead_letters_written"],
        )
    by_reason = snapshot.get("dead_letters_by_reason")
    if by_reason is not None:
        family = CounterMetricFamily(
            "fxgate_dead_letters",
            "Rows written to the dead_letters table since the start, by the sink the message "
            "failed for (table | upstream) and the reason.",
            labels=["sink", "reason"],
        )
        for key, count in sorted(by_reason.items()):
            sink, _, reason = key.partition("/")
            family.add_metric([sink, reason], count)
        yield family
    group = snapshot.get("group")
    if group is not None:
        yield _counter(
            "fxgate_group_rows_already_landed",
            "Reads of this member's batches that another member of its shared group had landed "
            "in the group's table first (a broker gave them to both); the landing skipped them.",
            group.get("already_landed", 0),
        )
        yield _counter(
            "fxgate_group_merges_retried",
            "Merges into the group's table that lost a commit race to another member (or to a "
            "maintenance claim) and were merged again.",
            group.get("merges_retried", 0),
        )
    spark = snapshot.get("spark")
    if spark is not None:
        yield _gauge(
            "fxgate_spark_consecutive_failures",
            "Failed Spark batch attempts in a row (0 while batches land).",
            spark.get("failures", 0),
        )
        yield _counter(
            "fxgate_spark_failed_attempts",
            "Failed Spark batch attempts (each is retried).",
            spark.get("total_failures", 0),
        )
    compaction = snapshot.get("compaction")
    if compaction is not None:
        yield _counter(
            "fxgate_compaction_passes",
            "Table maintenance passes (OPTIMIZE, VACUUM) that ran, whatever they found to do.",
            compaction.get("passes", 0),
        )
        yield _counter(
            "fxgate_compaction_failed_passes",
            "Maintenance passes that failed (the tables stay whole; the next pass tries).",
            compaction.get("failed_passes", 0),
        )
        yield _counter(
            "fxgate_compaction_files_compacted",
            "Small data files OPTIMIZE replaced with larger ones.",
            compaction.get("files_compacted", 0),
        )
        yield _counter(
            "fxgate_compaction_optimizes_lost",
            "OPTIMIZEs skipped because another member of the shared group committed first.",
            compaction.get("optimizes_lost", 0),
        )
        yield _counter(
            "fxgate_compaction_files_vacuumed",
            "Data files VACUUM deleted (replaced ones past the retention, and unlisted ones).",
            compaction.get("files_vacuumed", 0),
        )
        if compaction.get("last_seconds") is not None:
            yield _gauge(
                "fxgate_compaction_last_pass_seconds",
                "How long the last maintenance pass took.",
                compaction["last_seconds"],
            )
    last = snapshot.get("last_batch")
    if last is not None:
        yield _gauge(
            "fxgate_last_batch_duration_seconds",
            "How long the last Spark batch took to write.",
            last.get("seconds", 0.0),
        )
        yield _gauge("fxgate_last_batch_rows", "Rows in the last Spark batch.", last.get("rows", 0))


def _readers(snapshot: dict) -> Iterator[Metric]:
    """Each reader's eventNum counters, from what reached this gateway's table (spark.gaps).
    Within a shared group each gateway sees only its share: `fxgate audit` over the union of
    the group's tables is the authority (docs/pages/operating/audit.md)."""
    readers = snapshot.get("readers") or {}
    if not readers:
        return
    families = {
        "missing": CounterMetricFamily(
            "fxgate_reader_missing_events",
            "eventNum values this gateway's intake skipped (lost before the gateway).",
            labels=["reader"],
        ),
        "received": CounterMetricFamily(
            "fxgate_reader_events",
            "Events with an eventNum (tag events, and management events numbered on the same "
            "counter) that reached this gateway's table.",
            labels=["reader"],
        ),
        "resets": CounterMetricFamily(
            "fxgate_reader_counter_resets",
            "Times the reader's eventNum started again (a reboot, not a gap).",
            labels=["reader"],
        ),
        "without_event_num": CounterMetricFamily(
            "fxgate_reader_events_without_event_num",
            "Tag events without an eventNum (counted, not audited).",
            labels=["reader"],
        ),
    }
    last = GaugeMetricFamily(
        "fxgate_reader_last_event_num", "The reader's highest eventNum so far.", labels=["reader"]
    )
    for reader_id, counts in sorted(readers.items()):
        for key, family in families.items():
            family.add_metric([reader_id], counts.get(key) or 0)
        if counts.get("last_event_num") is not None:
            last.add_metric([reader_id], counts["last_event_num"])
    yield from families.values()
    yield last


def _reader_health(snapshot: dict, now: float, silent_limit: float) -> Iterator[Metric]:
    """Each reader's heartbeats, its own counters and the reconciliation (spark.reader_health),
    ages on the daemon's clock. The reconciliation is this gateway's figure: in a shared group
    each member receives a share, so only the sum over the members is the reader's stream."""
    states = snapshot.get("reader_health") or {}
    if not states:
        return
    age = GaugeMetricFamily(
        "fxgate_reader_heartbeat_age_seconds",
        "Seconds since the reader's last heartbeat reached this gateway's table.",
        labels=["reader"],
    )
    silence = GaugeMetricFamily(
        "fxgate_reader_silent_seconds",
        "Seconds since anything (tag or management event) from the reader reached the table.",
        labels=["reader"],
    )
    silent = GaugeMetricFamily(
        "fxgate_reader_silent",
        "1 when a reader heard from before is silent past health_reader_silent_seconds.",
        labels=["reader"],
    )
    heartbeats = CounterMetricFamily(
        "fxgate_reader_heartbeats", "Heartbeats landed from the reader.", labels=["reader"]
    )
    events = CounterMetricFamily(
        "fxgate_reader_management_events",
        "Management events other than heartbeats landed from the reader, per type.",
        labels=["reader", "type"],
    )
    reported = GaugeMetricFamily(
        "fxgate_reader_reported_data_messages",
        "The reader gateway's own data-message counters from its last heartbeat.",
        labels=["reader", "counter"],
    )
    unaccounted = GaugeMetricFamily(
        "fxgate_reader_unaccounted_data_messages_per_gateway",
        "Data messages the reader counted as sent between its heartbeats minus those this "
        "gateway received from it then (growing: loss between reader and gateway). Per "
        "gateway: a shared group's members each receive a share; sum over the group.",
        labels=["reader"],
    )
    resets = CounterMetricFamily(
        "fxgate_reader_heartbeat_counter_resets",
        "Times the reader's sent counter went back (a reboot): those intervals are not compared.",
        labels=["reader"],
    )
    for reader, state in sorted(states.items()):
        view = summary(state, now, silent_limit)
        if view["heartbeat_age_seconds"] is not None:
            age.add_metric([reader], view["heartbeat_age_seconds"])
        if view["silent_seconds"] is not None:
            silence.add_metric([reader], view["silent_seconds"])
        silent.add_metric([reader], float(view["silent"]))
        heartbeats.add_metric([reader], view["heartbeats"])
        for kind, count in sorted(view["events"].items()):
            events.add_metric([reader, kind], count)
        for counter, value in view["reported"].items():
            if value is not None:
                reported.add_metric([reader, counter], value)
        unaccounted.add_metric([reader], view["reconciliation"]["unaccounted"])
        resets.add_metric([reader], view["reconciliation"]["counter_resets"])
    yield from (age, silence, silent, heartbeats, events, reported, unaccounted, resets)


def build_registry(board: StatusBoard) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(board))
    return registry


class _Handler(BaseHTTPRequestHandler):
    server: _MetricsHTTPServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(self.server.registry))
        elif path == "/healthz":
            health = self.server.board.health()
            body = json.dumps(health.as_json(), sort_keys=True).encode()
            status = HTTPStatus.OK if health.healthy else HTTPStatus.SERVICE_UNAVAILABLE
            self._send(status, "application/json", body)
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain", b"try /metrics or /healthz\n")

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        # A scrape every few seconds would drown the lines an operator reads.
        log.debug("%s %s", self.address_string(), format % args)


class _MetricsHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, board: StatusBoard) -> None:
        self.board = board
        self.registry = build_registry(board)
        super().__init__(address, _Handler)


class MetricsServer:
    """The HTTP endpoint on its own thread: `start()` binds and serves, `stop()` closes."""

    def __init__(self, host: str, port: int, board: StatusBoard) -> None:
        self.host = host
        self.port = port
        self.board = board
        self._server: _MetricsHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server = _MetricsHTTPServer((self.host, self.port), self.board)
        self.port = self._server.server_address[1]  # the real one when 0 was asked
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fxgate-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics and /healthz", self.host, self.port)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._server = None
        log.info("metrics endpoint closed")
