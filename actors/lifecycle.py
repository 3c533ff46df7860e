"""LifecycleActor: life-cycle events for every broker connection, as Event Grid publishes them.

For each configured connection (source, upstream) it emits CloudEvents 1.0 JSON events with Event
Grid's MQTT client life-cycle schema under our own `fxgate.` type prefix (DESIGN §1):
`MQTTClientCreatedOrUpdated` / `MQTTClientDeleted` when the configuration adds, changes or drops a
client, and `MQTTClientSessionConnected` / `MQTTClientSessionDisconnected` for its sessions.

`sequenceNumber` is Event Grid's ordering key: consumers keep, per client, the event with the
highest number. It goes up by one at each connect and a disconnect carries the number of the
connect it ends, so the number lives in this actor's own SQLite file and is committed *before*
the event leaves: after a crash the next connect can only get a higher number, never reuse one a
consumer already saw.

The event itself is committed with its number, in an outbox table of the same file: one row per
sink, deleted when that sink has taken the event. A kill between the two commits (ours, then the
ledger's) therefore cannot lose it: the next start hands each sink what it still owes. Only a kill
in the instant between the ledger's commit and our delete hands the ledger an event twice, and its
idempotency key (the event's bytes, with their unique `id`) drops the repeat as long as it keeps
the key (the source's session expiry + 10 min after the event landed).

Sinks are anything with `tell(event: dict)` and optionally a stable `name` (the ledger, the MQTT
publisher, tests); `tell` returning means the sink has the event (the ledger's returns once the
event is committed), raising ActorDeadError or Timeout means it does not.
The actor does not know the MQTT reason codes: the caller maps them to Event Grid's reason names.

The shape of each type's `data` is Event Grid's ("Azure Event Grid Namespace as an Event Grid
source" and the SDK's `EventGridMqttClient*EventData` types): every event names its namespace
(`namespaceName`, the gateway's environment id unless `[lifecycle] namespace` sets it) and the
client's authentication name; session events add the session name and sequence number (and the
disconnect its reason); created-or-updated adds createdOn, updatedOn, state and string-valued
attributes. `clientName`, which the SDK's common base type carries for every type, names the
client in every event (the `events` table's `client_id` column and the ledger topic come from
it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pykka

from actors.clock import Clock
from actors.crashpoints import crash_point
from actors.lifecycle_reasons import LocalCause, disconnection_reason
from actors.messages import ClientInfo, ClientsConfigured, SessionConnected, SessionDisconnected
from persistence.database import SYNCHRONOUS
from persistence.lifecycle_store import ClientRow, LifecycleStore
from persistence.storage_faults import StorageUnavailable, describe, is_storage_fault

if TYPE_CHECKING:  # actors.connection tells this module's messages: no import cycle at run time
    from actors.connection import ConnectionSettings

log = logging.getLogger(__name__)

TYPE_PREFIX = "fxgate."
SESSION_CONNECTED = TYPE_PREFIX + "MQTTClientSessionConnected"
SESSION_DISCONNECTED = TYPE_PREFIX + "MQTTClientSessionDisconnected"
CLIENT_CREATED_OR_UPDATED = TYPE_PREFIX + "MQTTClientCreatedOrUpdated"
CLIENT_DELETED = TYPE_PREFIX + "MQTTClientDeleted"

# What an event's namespaceName is when the caller names none (the daemon always names one).
DEFAULT_NAMESPACE = "fxgate"

# How many emitted events `events()` keeps for `fxgate status`; the durable record is the sinks'.
RECENT_EVENTS = 256


class EventSink(Protocol):
    def tell(self, message: dict) -> object: ...


def client_info(settings: ConnectionSettings) -> ClientInfo:
    """The `ClientInfo` of a connection; the fingerprint covers every setting but the password.

    The password stays out because a hash of a short secret can be brute-forced from the events;
    a password change alone therefore does not count as a client update.
    """
    described = {
        f.name: getattr(settings, f.name) for f in fields(settings) if f.name != "password"
    }
    canonical = json.dumps(described, sort_keys=True, default=list)
    return ClientInfo(
        name=settings.name,
        client_id=settings.client_id,
        authentication_name=settings.username or settings.client_id,
        host=settings.host,
        port=settings.port,
        fingerprint=hashlib.sha256(canonical.encode()).hexdigest()[:16],
    )


def rfc3339(wall: float) -> str:
    """UTC with microseconds and a 'Z', the form Event Grid's `time` uses."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Client:
    info: ClientInfo
    created_on: float
    updated_on: float
    sequence_number: int = 0
    state: str = "configured"
    session_name: str | None = None
    last_reason: str | None = None
    last_event_time: float | None = None


class LifecycleActor(pykka.ThreadingActor):
    def __init__(
        self,
        path: Path,
        clock: Clock,
        sinks: Sequence[EventSink],
        source: str,
        *,
        durability: str = "process",
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        super().__init__()
        if durability not in SYNCHRONOUS:
            raise ValueError(f"durability must be one of {sorted(SYNCHRONOUS)}")
        if not namespace:
            raise ValueError("a life-cycle namespace must not be empty")
        self._namespace = namespace
        self._path = Path(path)
        self._clock = clock
        # By name: the outbox remembers, per sink, what it has not taken yet.
        self._sinks: dict[str, EventSink] = {
            getattr(sink, "name", None) or f"sink{index}": sink for index, sink in enumerate(sinks)
        }
        if len(self._sinks) != len(sinks):
            raise ValueError("life-cycle sinks need distinct names")
        self._next_position = 1
        self._source = source
        self._durability = durability
        self._store: LifecycleStore | None = None
        self._clients: dict[str, _Client] = {}
        # The epoch of the connect each client's current session began with. Epochs restart at 1
        # in every process, so this is memory only: a persisted epoch could match a new process's
        # first connect and swallow it as a duplicate.
        self._open: dict[str, int] = {}
        self._recent: deque[dict] = deque(maxlen=RECENT_EVENTS)

    # -- life ---------------------------------------------------------------------------------

    def on_start(self) -> None:
        # Opened here, not in __init__: sqlite3 connections refuse threads other than their own.
        self._store = LifecycleStore(self._path, self._durability)
        for row in self._store.clients():
            info = ClientInfo(
                row.name,
                row.client_id,
                row.authentication_name,
                row.host,
                row.port,
                row.fingerprint,
            )
            self._clients[info.client_id] = _Client(
                info,
                row.created_on,
                row.updated_on,
                row.sequence_number,
                row.state,
                row.session_name,
                row.last_reason,
                row.last_event_time,
            )
        log.info("lifecycle store open at %s: %d client(s) known", self._path, len(self._clients))
        self._hand_on_outbox()
        self._end_sessions_left_open()

    def _end_sessions_left_open(self) -> None:
        """A client still `connected` in the file lost its session when the process ended
        without a DISCONNECT (a kill, a power cut): say so now, so a consumer's last state for
        it is not 'connected' until the next connect."""
        for client in list(self._clients.values()):
            if client.state == "connected" and client.session_name is not None:
                log.warning(
                    "lifecycle: %s was connected when the gateway last ended; session %d lost",
                    client.info.client_id,
                    client.sequence_number,
                )
                client.state = "disconnected"
                client.last_reason = disconnection_reason(None, local=LocalCause.PROCESS_ENDED)
                self._emit_session(
                    client, SESSION_DISCONNECTED, client.session_name, client.last_reason
                )

    def on_stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        log.info("lifecycle store closed")

    def on_receive(self, message: object) -> None:
        if isinstance(message, SessionConnected):
            self._on_connected(message)
        elif isinstance(message, SessionDisconnected):
            self._on_disconnected(message)
        elif isinstance(message, ClientsConfigured):
            self._on_configured(message.clients)
        else:
            log.warning("lifecycle actor ignored %r", message)

    # -- asks ---------------------------------------------------------------------------------

    def status(self) -> list[dict]:
        """Each client's last known state, for `fxgate status` (survives restarts)."""
        return [
            {
                "name": c.info.name,
                "client_id": c.info.client_id,
                "authentication_name": c.info.authentication_name,
                "host": c.info.host,
                "port": c.info.port,
                "state": c.state,
                "session_name": c.session_name,
                "last_reason": c.last_reason,
                "sequence_number": c.sequence_number,
                "last_event_time": None
                if c.last_event_time is None
                else rfc3339(c.last_event_time),
            }
            for c in sorted(self._clients.values(), key=lambda c: (c.info.name, c.info.client_id))
        ]

    def events(self) -> list[dict]:
        """The events emitted since this actor started, oldest first (at most RECENT_EVENTS)."""
        return list(self._recent)

    # -- configuration ------------------------------------------------------------------------

    def _on_configured(self, configured: tuple[ClientInfo, ...]) -> None:
        now = self._clock.wall()
        wanted = {info.client_id: info for info in configured}
        for client_id in [c for c in self._clients if c not in wanted]:
            client = self._clients.pop(client_id)
            self._open.pop(client_id, None)
            self._emit(
                CLIENT_DELETED,
                f"clients/{client_id}",
                {
                    "namespaceName": self._namespace,
                    "clientName": client_id,
                    "clientAuthenticationName": client.info.authentication_name,
                },
                client.info,
                change=client_id,
            )
        for info in configured:
            client = self._clients.get(info.client_id)
            if client is not None and client.info == info:
                continue  # unchanged since the last start: Event Grid emits nothing either
            if client is None:
                client = _Client(info, created_on=now, updated_on=now)
                self._clients[info.client_id] = client
            else:
                client.info = info
                client.updated_on = now
            self._emit(
                CLIENT_CREATED_OR_UPDATED,
                f"clients/{info.client_id}",
                {
                    "createdOn": rfc3339(client.created_on),
                    "updatedOn": rfc3339(client.updated_on),
                    "namespaceName": self._namespace,
                    "clientName": info.client_id,
                    "clientAuthenticationName": info.authentication_name,
                    "state": "Enabled",
                    # Event Grid's attributes map strings to strings: the port goes as text.
                    "attributes": {"role": info.name, "host": info.host, "port": str(info.port)},
                },
                info,
                change=self._row(client),
            )

    # -- sessions -----------------------------------------------------------------------------

    def _on_connected(self, message: SessionConnected) -> None:
        client = self._client(message.client_id)
        open_epoch = self._open.get(message.client_id)
        if open_epoch == message.epoch:
            # Only an exact repeat is a duplicate: a restarted ConnectionActor counts epochs
            # from 1 again, so a lower epoch can be a new session.
            log.debug("duplicate connect of %s epoch %d", message.client_id, message.epoch)
            return
        self._open[message.client_id] = message.epoch
        client.sequence_number += 1
        client.state = "connected"
        client.session_name = message.session_name
        client.last_reason = None
        self._emit_session(client, SESSION_CONNECTED, message.session_name, reason=None)

    def _on_disconnected(self, message: SessionDisconnected) -> None:
        client = self._client(message.client_id)
        # No epoch check: one ConnectionActor tells its SessionStarted/SessionEnded in order and
        # drops reports about replaced connections itself, so a disconnect ends what is open.
        self._open.pop(message.client_id, None)
        # The number of the connect this ends; with none open (a failed attempt, or a session
        # from before a restart) the last one given, so the disconnect still orders after it.
        client.state = "disconnected"
        client.session_name = message.session_name
        client.last_reason = message.reason
        self._emit_session(client, SESSION_DISCONNECTED, message.session_name, message.reason)

    def _emit_session(
        self, client: _Client, event_type: str, session_name: str, reason: str | None
    ) -> None:
        now = self._clock.wall()
        client.last_event_time = now
        data: dict = {
            "namespaceName": self._namespace,
            "clientName": client.info.client_id,
            "clientAuthenticationName": client.info.authentication_name,
            "clientSessionName": session_name,
            "sequenceNumber": client.sequence_number,
        }
        if reason is not None:
            data["disconnectionReason"] = reason
        subject = f"clients/{client.info.client_id}/sessions/{session_name}"
        # Committed with the event, before any sink sees the number (module docstring).
        self._emit(event_type, subject, data, client.info, now, change=self._row(client))

    def _client(self, client_id: str) -> _Client:
        client = self._clients.get(client_id)
        if client is None:
            # A session of a client the configuration never announced: track it anyway (numbers
            # must still rise); an empty fingerprint makes a later ClientsConfigured announce it.
            log.warning("lifecycle: session of unconfigured client %s", client_id)
            now = self._clock.wall()
            info = ClientInfo(client_id, client_id, client_id, "", 0, "")
            client = _Client(info, created_on=now, updated_on=now)
            self._clients[client_id] = client
        return client

    # -- storage and sinks --------------------------------------------------------------------

    @staticmethod
    def _row(client: _Client) -> ClientRow:
        """`client` as it is now, as the store keeps it."""
        i = client.info
        return ClientRow(
            i.client_id,
            i.name,
            i.authentication_name,
            i.host,
            i.port,
            i.fingerprint,
            client.created_on,
            client.updated_on,
            client.sequence_number,
            client.state,
            client.session_name,
            client.last_reason,
            client.last_event_time,
        )

    def _emit(
        self,
        event_type: str,
        subject: str,
        data: dict,
        info: ClientInfo,
        now: float | None = None,
        *,
        change: ClientRow | str,
    ) -> None:
        event = {
            "specversion": "1.0",
            "id": str(uuid.uuid4()),
            "type": event_type,
            "source": self._source,
            "subject": subject,
            "time": rfc3339(self._clock.wall() if now is None else now),
            "datacontenttype": "application/json",
            "data": data,
        }
        assert self._store is not None
        position = self._next_position
        self._next_position += 1
        try:
            # The client's new state and its event: one transaction.
            self._store.record(change, position, self._sinks, json.dumps(event))
        except sqlite3.Error as error:
            if not is_storage_fault(error):
                raise
            # Dying here would restart every actor into the same full disk. The event is lost
            # (no sink saw it); the number stays raised in memory, so the next stored event
            # still orders after it and no consumer ever sees a number twice.
            log.error(
                "lifecycle event %s of %s not recorded, so not sent: %s cannot write (%s)",
                event_type.removeprefix(TYPE_PREFIX),
                info.client_id,
                self._path,
                describe(error),
            )
            return
        self._recent.append(event)
        log.info(
            "lifecycle %s: %s (%s) seq=%s reason=%s",
            event_type.removeprefix(TYPE_PREFIX),
            info.client_id,
            info.name,
            data.get("sequenceNumber", "-"),
            data.get("disconnectionReason", "-"),
        )
        crash_point("after_lifecycle_commit_before_hand_on")
        self._hand_on(position, event)

    def _hand_on(self, position: int, event: dict, names: Iterable[str] | None = None) -> None:
        """Each sink (of `names`, default all) gets the event; a sink that took it is done."""
        for name in self._sinks if names is None else names:
            try:
                self._sinks[name].tell(event)
            except (pykka.ActorDeadError, pykka.Timeout, StorageUnavailable) as error:
                # One stopped sink (say, the publisher during shutdown, or the ledger on a full
                # disk) must not silence the others or kill this actor; the outbox keeps the
                # event for the next start.
                # INFO, not WARNING: nothing is lost, and a graceful stop does this every time
                # (the source's last event cannot go out on the connection that just closed).
                log.info(
                    "lifecycle sink %s did not take event %s (%s); kept for the next start",
                    name,
                    event["id"],
                    type(error).__name__,
                )
                continue
            assert self._store is not None
            try:
                self._store.taken(position, name)
            except sqlite3.Error as error:
                if not is_storage_fault(error):
                    raise
                # The sink has it; the next start hands it again and the ledger's key drops it.
                log.warning(
                    "lifecycle event %s stays in the outbox (%s)", event["id"], describe(error)
                )

    def _hand_on_outbox(self) -> None:
        """At start: what a crash (or a sink that was gone) left in the outbox, in order."""
        assert self._store is not None
        owed: dict[int, tuple[dict, list[str]]] = {}
        for position, name, text in self._store.outbox():
            self._next_position = max(self._next_position, position + 1)
            owed.setdefault(position, (json.loads(text), []))[1].append(name)
        gone = {n for _, names in owed.values() for n in names} - set(self._sinks)
        if gone:
            # A sink of an earlier configuration (say, the MQTT publisher, now that events go
            # upstream): the events table holds them through the ledger's sink either way.
            log.warning("lifecycle: events owed to sinks no longer configured dropped: %s", gone)
            self._store.drop_sinks(gone)
        if owed:
            log.warning("lifecycle: handing on %d event(s) stored before the last stop", len(owed))
        for position, (event, names) in owed.items():
            self._hand_on(position, event, [n for n in names if n in self._sinks])
