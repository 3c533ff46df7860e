"""Consumer-side helpers for life-cycle events: each client's last state, and a disconnect debounce.

Event Grid (and fxgate, which copies it) guarantees neither order nor uniqueness of life-cycle
events: they may arrive late, out of order, or twice. Event Grid's "Order connection status events"
rule restores the last state from `sequenceNumber` alone:

- the number grows with every connection of a client, and a disconnect carries the number of the
  connect it ends — so with equal numbers the disconnect is the later event;
- a connect replaces the state only if its number is greater than the stored one, a disconnect
  if its number is greater or equal.

`LastStateTracker` applies that rule. Created-or-updated and deleted events carry no sequence
number (Event Grid coalesces them into the final state), so they are ordered by their CloudEvents
`time`. `DisconnectDebouncer` follows Event Grid's advice for flapping clients: act on a disconnect
only if the client is still offline a while later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from actors.clock import Clock, TimerHandle

log = logging.getLogger(__name__)

SESSION_CONNECTED = "MQTTClientSessionConnected"
SESSION_DISCONNECTED = "MQTTClientSessionDisconnected"
CLIENT_CREATED_OR_UPDATED = "MQTTClientCreatedOrUpdated"
CLIENT_DELETED = "MQTTClientDeleted"
FXGATE_TYPE_PREFIX = "fxgate."
EVENT_GRID_TYPE_PREFIX = "Microsoft.EventGrid."
_KNOWN_KINDS = frozenset(
    (SESSION_CONNECTED, SESSION_DISCONNECTED, CLIENT_CREATED_OR_UPDATED, CLIENT_DELETED)
)

# A resource event without `time` sorts before every timed one: it cannot be shown to be newer.
_NO_TIME = datetime.min.replace(tzinfo=UTC)


class Status(StrEnum):
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    DELETED = "deleted"
    CREATED = "created"  # created or updated, but no session event seen yet


@dataclass(frozen=True)
class ClientState:
    """What the newest events say about one client."""

    client: str
    status: Status
    session: str | None = None
    sequence_number: int | None = None
    disconnection_reason: str | None = None


@dataclass(frozen=True)
class _SessionEvent:
    # Event Grid's rule is the first two fields; time and id only make duplicates that differ
    # (a broken producer) resolve the same way whatever order they arrive in.
    key: tuple[int, int, datetime, str]
    time: datetime
    connected: bool
    session: str | None
    sequence_number: int
    reason: str | None


@dataclass(frozen=True)
class _ResourceEvent:
    # On equal times a delete wins: reporting a removed client as present is the worse mistake.
    key: tuple[datetime, int, str]
    time: datetime
    deleted: bool


def _parse_time(value: Any) -> datetime:
    if value is None:
        return _NO_TIME
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _client_of(event: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    # The subject names the client (`clients/<client>[/sessions/<session>]`); the
    # authentication name may be shared by several (one gateway's source and upstream can log
    # in as the same user), so it is only the fallback.
    parts = str(event.get("subject", "")).split("/")
    if len(parts) >= 2 and parts[0] == "clients" and parts[1]:
        return parts[1]
    name = data.get("clientAuthenticationName")
    if name:
        return str(name)
    raise ValueError(f"life-cycle event {event.get('id')!r} names no client")


class LastStateTracker:
    """Each client's last state from life-cycle events fed in any order, duplicates included.

    `type_prefix` selects the producer: "fxgate." for ours, "Microsoft.EventGrid." for Event
    Grid's. Events of other types are ignored, as CloudEvents consumers should."""

    def __init__(self, *, type_prefix: str = FXGATE_TYPE_PREFIX) -> None:
        self._prefix = type_prefix
        self._sessions: dict[str, _SessionEvent] = {}
        self._resources: dict[str, _ResourceEvent] = {}

    def apply(self, event: Mapping[str, Any]) -> ClientState | None:
        """Take one event; return the client's new state if the event changed it, else None."""
        kind = str(event.get("type", ""))
        if not kind.startswith(self._prefix):
            return None
        kind = kind[len(self._prefix) :]
        if kind not in _KNOWN_KINDS:
            log.debug("ignoring life-cycle event of unknown type %s", event.get("type"))
            return None
        data = event.get("data") or {}
        client = _client_of(event, data)
        time = _parse_time(event.get("time"))
        event_id = str(event.get("id", ""))
        before = self.state(client)
        if kind in (SESSION_CONNECTED, SESSION_DISCONNECTED):
            connected = kind == SESSION_CONNECTED
            number = int(data["sequenceNumber"])  # Event Grid once sent it as a string
            candidate = _SessionEvent(
                key=(number, 0 if connected else 1, time, event_id),
                time=time,
                connected=connected,
                session=data.get("clientSessionName"),
                sequence_number=number,
                reason=None if connected else data.get("disconnectionReason"),
            )
            stored = self._sessions.get(client)
            if stored is None or candidate.key > stored.key:
                self._sessions[client] = candidate
        else:
            deleted = kind == CLIENT_DELETED
            resource = _ResourceEvent(
                key=(time, int(deleted), event_id), time=time, deleted=deleted
            )
            stored_resource = self._resources.get(client)
            if stored_resource is None or resource.key > stored_resource.key:
                self._resources[client] = resource
        after = self.state(client)
        return after if after != before else None

    def state(self, client: str) -> ClientState | None:
        """The client's last state, or None if no event about it has been seen."""
        session = self._sessions.get(client)
        resource = self._resources.get(client)
        # A delete at or after the newest session event ends the client: a removed client cannot
        # connect again unless it is created again, which a newer created event shows.
        if (
            resource is not None
            and resource.deleted
            and (session is None or resource.time >= session.time)
        ):
            return ClientState(client, Status.DELETED)
        if session is None:
            return None if resource is None else ClientState(client, Status.CREATED)
        return ClientState(
            client,
            Status.CONNECTED if session.connected else Status.DISCONNECTED,
            session.session,
            session.sequence_number,
            session.reason,
        )

    def states(self) -> dict[str, ClientState]:
        clients = sorted(self._sessions.keys() | self._resources.keys())
        return {c: s for c in clients if (s := self.state(c)) is not None}


def last_states(
    events: Iterable[Mapping[str, Any]], *, type_prefix: str = FXGATE_TYPE_PREFIX
) -> dict[str, ClientState]:
    """Each client's last state from a batch of events in any order."""
    tracker = LastStateTracker(type_prefix=type_prefix)
    for event in events:
        tracker.apply(event)
    return tracker.states()


class DisconnectDebouncer:
    """Calls `on_offline(state)` for a client only if it is still disconnected `delay` seconds
    after the disconnect — Event Grid's advice for clients whose state flaps (its example: 30 s).

    Events go through a `LastStateTracker`, so a late, stale connect (lower sequence number)
    does not cancel the wait, and a duplicate disconnect does not start a second one. A newer
    disconnect restarts the wait: the client was back online in between. Timers run on the
    injected clock; `on_offline` runs on the clock's thread, outside this object's lock, and
    should only `tell` an actor."""

    def __init__(
        self,
        clock: Clock,
        delay: float,
        on_offline: Callable[[ClientState], None],
        *,
        type_prefix: str = FXGATE_TYPE_PREFIX,
    ) -> None:
        if delay < 0:
            raise ValueError(f"debounce delay must be >= 0 seconds, got {delay}")
        self._clock = clock
        self._delay = delay
        self._on_offline = on_offline
        self._tracker = LastStateTracker(type_prefix=type_prefix)
        self._lock = threading.Lock()
        # client -> (sequence number of the disconnect being waited on, its timer)
        self._waiting: dict[str, tuple[int | None, TimerHandle]] = {}

    def observe(self, event: Mapping[str, Any]) -> None:
        with self._lock:
            state = self._tracker.apply(event)
            if state is None:
                return
            waiting = self._waiting.get(state.client)
            if state.status is Status.DISCONNECTED:
                if waiting is not None and waiting[0] == state.sequence_number:
                    return  # the same disconnect, resolved differently: keep the running wait
                if waiting is not None:
                    waiting[1].cancel()
                token: list[TimerHandle] = []
                handle = self._clock.call_later(
                    self._delay, lambda: self._expire(state.client, token)
                )
                token.append(handle)
                self._waiting[state.client] = (state.sequence_number, handle)
            elif waiting is not None:
                waiting[1].cancel()
                del self._waiting[state.client]
                log.debug("%s is %s again within %.1f s", state.client, state.status, self._delay)

    def waiting(self) -> frozenset[str]:
        """Clients disconnected and not yet past the delay."""
        with self._lock:
            return frozenset(self._waiting)

    def state(self, client: str) -> ClientState | None:
        with self._lock:
            return self._tracker.state(client)

    def cancel_all(self) -> None:
        with self._lock:
            for _, handle in self._waiting.values():
                handle.cancel()
            self._waiting.clear()

    def _expire(self, client: str, token: list[TimerHandle]) -> None:
        with self._lock:
            waiting = self._waiting.get(client)
            # A real clock may fire a timer that was cancelled a moment ago on another thread:
            # only the timer still registered for this client counts.
            if waiting is None or not token or waiting[1] is not token[0]:
                return
            del self._waiting[client]
            state = self._tracker.state(client)
        if state is not None and state.status is Status.DISCONNECTED:
            log.info(
                "%s still offline after %.1f s (%s)",
                client,
                self._delay,
                state.disconnection_reason,
            )
            self._on_offline(state)
