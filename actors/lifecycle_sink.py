"""Where life-cycle events go: the inbound ledger always, the source broker without an upstream.

LedgerEventSink: life-cycle events become messages in the inbound ledger.

Stored there, an event travels the data path a read travels: packed, forwarded upstream on its
own topic when forwarding is on (an implicit route, actors.config.routes.lifecycle_route), and
landed in the `events` table by the Spark writer. So it gets the same exactly-once guarantees
without a second publisher or a second writer: the ledger's idempotency key (topic + payload, and
the payload holds the event's unique `id`) keeps a repeated hand-over from storing it twice.

SourceEventSink: without an upstream there is no durable way out, so each event is published on
the source connection (QoS 1) for subscribers on the source broker. paho keeps it in memory until
the broker's PUBACK, through reconnects but not through a crash; the `events` table is the
durable record either way.
"""

from __future__ import annotations

import json
import logging
import threading

import pykka

from actors.config.routes import lifecycle_topic
from actors.messages import Publish, StoreLocal

log = logging.getLogger(__name__)

# At-least-once upstream is enough: consumers de-duplicate on the CloudEvents `id`.
EVENT_QOS = 1


def event_message(event: dict, template: str, environment_id: str) -> StoreLocal:
    """The ledger message for one event: its topic rendered for the event's client, its JSON
    with sorted keys (the same event always gives the same bytes, hence the same key)."""
    client_id = event["data"]["clientName"]
    payload = json.dumps(event, sort_keys=True, separators=(",", ":")).encode()
    return StoreLocal(lifecycle_topic(template, environment_id, client_id), payload, EVENT_QOS)


# How long the LifecycleActor waits for the ledger's commit before keeping the event for later.
STORE_TIMEOUT = 30.0


class LedgerEventSink:
    """A LifecycleActor sink that stores each event in the InboundLedger and returns once the
    ledger has committed it (so the LifecycleActor may drop it from its outbox)."""

    name = "ledger"

    def __init__(
        self,
        ledger: pykka.ActorRef,
        template: str,
        environment_id: str,
        timeout: float = STORE_TIMEOUT,
    ) -> None:
        self._ledger = ledger
        self._template = template
        self._environment_id = environment_id
        self._timeout = timeout

    def tell(self, event: dict) -> None:
        # ActorDeadError and Timeout go up: the LifecycleActor keeps the event in its outbox.
        # The ledger never asks the LifecycleActor anything, so this wait cannot deadlock.
        self._ledger.ask(
            event_message(event, self._template, self._environment_id), timeout=self._timeout
        )

    def __repr__(self) -> str:
        return f"LedgerEventSink({self._template!r})"


class SourceEventSink:
    """A LifecycleActor sink that publishes each event on the source connection.

    The LifecycleActor starts before the connection it publishes on, so events told before
    `bind` (the first start's created-or-updated ones, those owed from the last run) wait here.
    """

    name = "mqtt"

    def __init__(self, template: str, environment_id: str) -> None:
        self._template = template
        self._environment_id = environment_id
        self._lock = threading.Lock()
        self._connection: pykka.ActorRef | None = None
        self._waiting: list[Publish] = []

    def bind(self, connection: pykka.ActorRef) -> None:
        with self._lock:
            self._connection = connection
            waiting, self._waiting = self._waiting, []
        for message in waiting:
            self._tell(connection, message)

    def tell(self, event: dict) -> None:
        stored = event_message(event, self._template, self._environment_id)
        message = Publish(stored.topic, stored.payload, stored.qos)
        with self._lock:
            connection = self._connection
            if connection is None:
                self._waiting.append(message)
                return
        # ActorDeadError goes up (the connection has stopped): the LifecycleActor keeps the
        # event in its outbox and this sink publishes it after the next start.
        connection.tell(message)

    def _tell(self, connection: pykka.ActorRef, message: Publish) -> None:
        try:
            connection.tell(message)
        except pykka.ActorDeadError:
            log.warning(
                "source connection gone; life-cycle event on %s not published", message.topic
            )
