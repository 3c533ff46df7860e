"""LedgerEventSink: life-cycle events become messages in the inbound ledger.

Stored there, an event travels the data path a read travels: packed, forwarded upstream on its
own topic when forwarding is on (an implicit route, actors.routes.lifecycle_route), and landed
in the `events` table by the Spark writer. So it gets the same exactly-once guarantees without
a second publisher or a second writer: the ledger's idempotency key (topic + payload, and the
payload holds the event's unique `id`) keeps a repeated hand-over from storing it twice.
"""

from __future__ import annotations

import json
import logging

import pykka

from actors.routes import lifecycle_topic
from persistence.inbound_ledger import StoreLocal

log = logging.getLogger(__name__)

# At-least-once upstream is enough: consumers de-duplicate on the CloudEvents `id`.
EVENT_QOS = 1


def event_message(event: dict, template: str, environment_id: str) -> StoreLocal:
    """The ledger message for one event: its topic rendered for the event's client, its JSON
    with sorted keys (the same event always gives the same bytes, hence the same key)."""
    client_id = event["data"]["clientName"]
    payload = json.dumps(event, sort_keys=True, separators=(",", ":")).encode()
    return StoreLocal(lifecycle_topic(template, environment_id, client_id), payload, EVENT_QOS)


class LedgerEventSink:
    """A LifecycleActor sink (`tell(event)`) that tells the InboundLedger each event."""

    def __init__(self, ledger: pykka.ActorRef, template: str, environment_id: str) -> None:
        self._ledger = ledger
        self._template = template
        self._environment_id = environment_id

    def tell(self, event: dict) -> None:
        # ActorDeadError goes up: the LifecycleActor logs it and carries on with other sinks.
        self._ledger.tell(event_message(event, self._template, self._environment_id))

    def __repr__(self) -> str:
        return f"LedgerEventSink({self._template!r})"
