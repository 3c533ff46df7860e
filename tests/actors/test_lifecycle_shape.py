"""Each life-cycle event has the shape of Azure Event Grid's MQTT client events (issue 14).

The field lists are Event Grid's: the page "Azure Event Grid Namespace as an Event Grid source"
(learn.microsoft.com, event-schema-event-grid-namespace: the sample events) and the SDK's
`EventGridMqttClient*EventData` types, whose common base `EventGridMqttClientEventData` gives every
type `namespaceName`, `clientAuthenticationName` and `clientName`. The samples of the session
events leave `clientName` out, so for them it is allowed, not required; ours always carries it (the
`events` table's `client_id` column and the ledger topic come from it).

The events checked are real ones: a ConnectionActor's connect and our own disconnect against a
real mosquitto, and the created / deleted events of a configuration that adds and drops a client.
"""

from __future__ import annotations

import re
import threading
import uuid

import pytest

from actors.clock import SimulatedClock
from actors.config.schema import ConfigError, load_config
from actors.connection import ConnectionActor
from actors.lifecycle import (
    CLIENT_CREATED_OR_UPDATED,
    CLIENT_DELETED,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
    LifecycleActor,
    client_info,
)
from actors.lifecycle_order import last_states
from actors.messages import ClientsConfigured
from tests.actors.test_connection import InstantLedger, settings

NAMESPACE = "plant-7"
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")

# CloudEvents 1.0 context attributes of every Event Grid event, and the optional one we add.
ENVELOPE_REQUIRED = {
    "specversion": str,
    "id": str,
    "source": str,
    "type": str,
    "subject": str,
    "time": str,
    "data": dict,
}
ENVELOPE_OPTIONAL = {"datacontenttype": str}

_CLIENT = {"namespaceName": str, "clientAuthenticationName": str}
_SESSION = {**_CLIENT, "clientSessionName": str, "sequenceNumber": int}
# type -> (required data keys with their types, allowed optional keys with theirs)
DATA_FIELDS: dict[str, tuple[dict[str, type], dict[str, type]]] = {
    SESSION_CONNECTED: (_SESSION, {"clientName": str}),
    SESSION_DISCONNECTED: ({**_SESSION, "disconnectionReason": str}, {"clientName": str}),
    CLIENT_CREATED_OR_UPDATED: (
        {
            **_CLIENT,
            "clientName": str,
            "createdOn": str,
            "updatedOn": str,
            "state": str,
            "attributes": dict,
        },
        {},
    ),
    CLIENT_DELETED: ({**_CLIENT, "clientName": str}, {}),
}


def shape_problems(event: dict) -> list[str]:
    """Every way `event` differs from Event Grid's shape for its type (empty: it matches)."""
    problems = []

    def check(where: str, got: dict, required: dict, optional: dict) -> None:
        for key in required:
            if key not in got:
                problems.append(f"{where}{key} missing")
        for key, value in got.items():
            kind = required.get(key) or optional.get(key)
            if kind is None:
                problems.append(f"{where}{key} is not in Event Grid's field list")
            # bool is an int to Python, never to a JSON consumer.
            elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                problems.append(f"{where}{key} is {type(value).__name__}, not {kind.__name__}")

    check("", event, ENVELOPE_REQUIRED, ENVELOPE_OPTIONAL)
    if event.get("type") not in DATA_FIELDS:
        return [*problems, f"type {event.get('type')!r} is none of the four"]
    required, optional = DATA_FIELDS[event["type"]]
    data = event.get("data") or {}
    check("data.", data, required, optional)
    if problems:
        return problems
    if event["specversion"] != "1.0":
        problems.append("specversion is not 1.0")
    if str(uuid.UUID(event["id"])) != event["id"]:
        problems.append("id is not a UUID")
    for where, value in [("time", event["time"])] + [
        (f"data.{k}", data[k]) for k in ("createdOn", "updatedOn") if k in data
    ]:
        if not RFC3339_UTC.fullmatch(value):
            problems.append(f"{where} {value!r} is not an RFC 3339 UTC time")
    client = data.get("clientName") or data["clientAuthenticationName"]
    if event["type"] in (SESSION_CONNECTED, SESSION_DISCONNECTED):
        expected_subject = f"clients/{client}/sessions/{data['clientSessionName']}"
    else:
        expected_subject = f"clients/{client}"
        if event["type"] == CLIENT_CREATED_OR_UPDATED:
            if data["state"] not in ("Enabled", "Disabled"):
                problems.append(f"data.state {data['state']!r} is neither Enabled nor Disabled")
            if not all(isinstance(v, str) for v in data["attributes"].values()):
                problems.append("data.attributes maps to something other than strings")
    if event["subject"] != expected_subject:
        problems.append(f"subject {event['subject']!r}, expected {expected_subject!r}")
    return problems


class Events:
    def __init__(self):
        self.items: list[dict] = []
        self.cond = threading.Condition()

    def tell(self, event):
        with self.cond:
            self.items.append(event)
            self.cond.notify_all()

    def wait_for(self, event_type, count=1, timeout=15.0) -> list[dict]:
        def found():
            return [e for e in self.items if e["type"] == event_type]

        with self.cond:
            assert self.cond.wait_for(lambda: len(found()) >= count, timeout), self.items
            return found()


@pytest.fixture
def actors():
    started = []
    yield started
    for ref in reversed(started):
        if ref.is_alive():
            ref.stop(timeout=10)


@pytest.mark.broker
def test_a_real_event_of_each_of_the_four_types_has_event_grids_shape(mosquitto, actors, tmp_path):
    clock = SimulatedClock()
    events = Events()
    lifecycle = LifecycleActor.start(
        tmp_path / "lifecycle.sqlite", clock, (events,), "fxgate/test", namespace=NAMESPACE
    )
    actors.append(lifecycle)
    source = settings(mosquitto, subscriptions=("zebra/fx/+/reads",), qos=1, username="reader")
    lifecycle.tell(ClientsConfigured((client_info(source),)))
    connection = ConnectionActor.start(source, clock, InstantLedger(), lifecycle=lifecycle)
    actors.append(connection)
    (connected,) = events.wait_for(SESSION_CONNECTED)
    connection.stop(timeout=10)  # our own DISCONNECT
    (disconnected,) = events.wait_for(SESSION_DISCONNECTED)
    lifecycle.tell(ClientsConfigured(()))  # the client is dropped from the configuration
    (created,) = events.wait_for(CLIENT_CREATED_OR_UPDATED)
    (deleted,) = events.wait_for(CLIENT_DELETED)

    for event in (connected, disconnected, created, deleted):
        assert shape_problems(event) == [], event
        assert event["data"]["namespaceName"] == NAMESPACE
        assert event["data"]["clientAuthenticationName"] == "reader"
    assert disconnected["data"]["disconnectionReason"] == "ClientInitiatedDisconnect"
    assert created["data"]["attributes"] == {
        "role": "source",
        "host": mosquitto.host,
        "port": str(mosquitto.port),
    }
    # The consumer side still reads them: the client ends deleted.
    (state,) = last_states(events.items).values()
    assert state.client == source.client_id and state.status == "deleted"


def test_the_field_check_finds_a_missing_namespace_an_unknown_key_and_a_wrong_type():
    event = {
        "specversion": "1.0",
        "id": str(uuid.uuid4()),
        "source": "fxgate/test",
        "type": SESSION_CONNECTED,
        "subject": "clients/c/sessions/c",
        "time": "2027-01-15T08:00:00.000000Z",
        "data": {
            "namespaceName": NAMESPACE,
            "clientName": "c",
            "clientAuthenticationName": "c",
            "clientSessionName": "c",
            "sequenceNumber": 1,
        },
    }
    assert shape_problems(event) == []
    del event["data"]["namespaceName"]
    event["data"]["sequenceNumber"] = "1"
    event["data"]["role"] = "source"
    assert shape_problems(event) == [
        "data.namespaceName missing",
        "data.sequenceNumber is str, not int",
        "data.role is not in Event Grid's field list",
    ]


def test_the_namespace_is_the_environment_id_unless_the_config_names_one(tmp_path):
    plain = load_config(None, environ={"MQTT_ENVIRONMENT_ID": "prod-eu"}, hostname="gw-01")
    assert plain.lifecycle.namespace is None
    assert plain.lifecycle_namespace == "prod-eu"
    path = tmp_path / "fxgate.toml"
    path.write_text('[lifecycle]\nnamespace = "plant-7"\n')
    named = load_config(path, environ={"MQTT_ENVIRONMENT_ID": "prod-eu"}, hostname="gw-01")
    assert named.lifecycle_namespace == "plant-7"


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "-lead", "x" * 129])
def test_a_bad_namespace_is_refused_at_start_naming_its_key(tmp_path, bad):
    path = tmp_path / "fxgate.toml"
    path.write_text(f'[lifecycle]\nnamespace = "{bad}"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={}, hostname="gw-01")
    assert any(e.startswith("lifecycle.namespace: ") for e in caught.value.errors), caught.value
