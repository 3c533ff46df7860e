"""Each reader's health as this gateway sees it: heartbeats, the reader's own counters, and the
reconciliation of what the reader says it sent with what reached this gateway (DESIGN §7.9).

An FX9600's heartbeat carries its reader gateway's data-message counters (spark.zebra
`DataPathCounters`). Between two heartbeats the change of `sent` is what the reader published to
its data endpoint; the data messages this gateway received from the reader between the two (in
arrival order, the ledger seq) should match it. The difference is loss between the reader and
the gateway: a broker that dropped past its queue limit, a QoS 0 hop. Summed over the intervals
it telescopes, so a message that overtook a heartbeat (data and management travel on different
topics) counts +1 in one interval and -1 in the next, and the running total stays exact.

The rules, in one place:
- **interval**: two consecutive heartbeats whose `sent` counter is usable (present, one data
  path). A heartbeat without it changes nothing here: the data keep counting to the next one.
- **reset**: `sent` below the previous heartbeat's (the reader rebooted, its counters started
  again). The interval is not compared, so a reboot is never counted as loss; the new value is
  the next baseline.
- **unaccounted**: the sum over compared intervals of (change of `sent`) - (data messages
  received); it grows when messages are lost on the way, and it is this gateway's figure only:
  a member of a shared group receives only its share, so only the sum over the group's
  gateways (the union of their tables) is the reader's whole stream.
- **heard**: any message from the reader (data or management) is a sign of life; `is_silent`
  says when one that was heard from has been silent past a limit.

Pure: no Spark, no threads, no I/O. `state()` is a plain JSON-able dict and `from_state` takes it
back, so the daemon commits it with each batch (a replayed batch never counts twice) and goes on
after a restart. The figures are per message: how a reader with batching on counts a batched
message is not documented, and fxgate counts one per MQTT message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

DATA = "data"
MANAGEMENT = "management"


@dataclass(frozen=True, slots=True)
class ReaderObservation:
    """One message of one reader, in arrival order: a data message (tag events, or a bad
    payload on its data topic), or a management event with its type and, for a heartbeat
    whose counters could be read, the reader's `sent` counter and the others."""

    reader_id: str
    seq: int
    received_time: float  # wall seconds, the ledger's clock
    kind: str  # DATA | MANAGEMENT
    event_type: str | None = None
    heartbeat: bool = False
    counters: Mapping[str, int | None] | None = None  # received, sent, retained, dropped
    paths: int = 1


@dataclass
class ReaderHealth:
    last_heard_time: float | None = None
    last_heartbeat_time: float | None = None
    heartbeats: int = 0
    # Management events other than heartbeats, per type as the reader spelled it.
    events: dict[str, int] = field(default_factory=dict)
    data_messages: int = 0  # data messages this gateway received from the reader, in all
    # The reader's own counters from its last heartbeat that carried them.
    received: int | None = None
    sent: int | None = None
    retained: int | None = None
    dropped: int | None = None
    paths: int | None = None
    # The reconciliation.
    baseline_sent: int | None = None
    data_since_baseline: int = 0
    intervals: int = 0
    unaccounted: int = 0
    last_interval_sent: int | None = None
    last_interval_received: int | None = None
    counter_resets: int = 0

    def observe(self, observation: ReaderObservation) -> None:
        self.last_heard_time = _later(self.last_heard_time, observation.received_time)
        if observation.kind == DATA:
            self.data_messages += 1
            self.data_since_baseline += 1
            return
        if not observation.heartbeat:
            kind = observation.event_type or "?"
            self.events[kind] = self.events.get(kind, 0) + 1
            return
        self.heartbeats += 1
        self.last_heartbeat_time = _later(self.last_heartbeat_time, observation.received_time)
        counters = observation.counters
        if counters is None:
            return
        self.received = counters.get("received")
        self.sent = counters.get("sent")
        self.retained = counters.get("retained")
        self.dropped = counters.get("dropped")
        self.paths = observation.paths
        sent = self.sent
        if sent is None or observation.paths != 1:
            return  # no usable baseline: the data keep counting to the next heartbeat
        if self.baseline_sent is not None and sent >= self.baseline_sent:
            delta = sent - self.baseline_sent
            self.intervals += 1
            self.unaccounted += delta - self.data_since_baseline
            self.last_interval_sent = delta
            self.last_interval_received = self.data_since_baseline
        elif self.baseline_sent is not None:
            self.counter_resets += 1
        self.baseline_sent = sent
        self.data_since_baseline = 0

    def state(self) -> dict:
        return {f.name: _copy(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_state(cls, state: Mapping[str, object]) -> ReaderHealth:
        """A health from what `state()` gave. Missing keys take their defaults (an older
        fxgate's state) and keys it does not know are left out (a newer one's, after a
        downgrade): the state is a figure to show, and the writer must not stop over it."""
        known = {f.name for f in fields(cls)}
        return cls(**{name: _copy(value) for name, value in state.items() if name in known})


def observe_all(
    known: Mapping[str, Mapping[str, object]], observations: list[ReaderObservation]
) -> dict[str, dict]:
    """The states of the readers in `observations` after them, starting from `known` (reader
    -> state); readers not observed are left out. `known` is not changed."""
    healths: dict[str, ReaderHealth] = {}
    for observation in observations:
        health = healths.get(observation.reader_id)
        if health is None:
            before = known.get(observation.reader_id)
            health = healths[observation.reader_id] = (
                ReaderHealth() if before is None else ReaderHealth.from_state(before)
            )
        health.observe(observation)
    return {reader_id: health.state() for reader_id, health in healths.items()}


def heartbeat_age(state: Mapping[str, object], now: float) -> float | None:
    last = state.get("last_heartbeat_time")
    return None if last is None else max(now - float(last), 0.0)  # type: ignore[arg-type]


def silent_for(state: Mapping[str, object], now: float) -> float | None:
    last = state.get("last_heard_time")
    return None if last is None else max(now - float(last), 0.0)  # type: ignore[arg-type]


def is_silent(state: Mapping[str, object], now: float, limit: float) -> bool:
    """Heard from before, and nothing from it for longer than `limit` (0 = never flagged)."""
    silence = silent_for(state, now)
    return limit > 0 and silence is not None and silence > limit


def _later(before: float | None, moment: float) -> float:
    return moment if before is None else max(before, moment)


def _copy(value: object) -> object:
    return dict(value) if isinstance(value, dict) else value


def summary(state: Mapping[str, object], now: float, silent_limit: float) -> dict:
    """What status and /metrics show of one reader's state at `now` (wall seconds): ages, the
    reader's own counters from its last heartbeat, and the reconciliation, labelled as this
    gateway's figure."""
    return {
        "heartbeats": state.get("heartbeats", 0),
        "heartbeat_age_seconds": heartbeat_age(state, now),
        "silent_seconds": silent_for(state, now),
        "silent": is_silent(state, now, silent_limit),
        "events": dict(state.get("events") or {}),  # type: ignore[call-overload]
        "data_messages": state.get("data_messages", 0),
        "reported": {name: state.get(name) for name in ("received", "sent", "retained", "dropped")},
        "reconciliation": {
            # Only over the union of a shared group's gateways is it the reader's whole stream.
            "scope": "per-gateway",
            "intervals": state.get("intervals", 0),
            "unaccounted": state.get("unaccounted", 0),
            "last_interval_sent": state.get("last_interval_sent"),
            "last_interval_received": state.get("last_interval_received"),
            "counter_resets": state.get("counter_resets", 0),
            "data_paths": state.get("paths"),
        },
    }
