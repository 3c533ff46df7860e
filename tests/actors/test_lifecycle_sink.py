"""Life-cycle events as ledger messages: topic, payload and the implicit forwarding route."""

import json
import sqlite3

import pykka
import pytest

from actors.clock import SimulatedClock
from actors.config.routes import (
    DEFAULT_LIFECYCLE_TOPIC,
    check_lifecycle_topic,
    lifecycle_filter,
    lifecycle_route,
    render_target,
    route_for,
)
from actors.ledger import InboundLedger
from actors.lifecycle_sink import LedgerEventSink, SourceEventSink, event_message
from actors.messages import Publish
from spark.topics import topic_matches

EVENT = {
    "specversion": "1.0",
    "id": "5b0e6a53-0000-4000-8000-000000000001",
    "type": "fxgate.MQTTClientSessionConnected",
    "source": "fxgate/prod/fxgate-prod-gw-01",
    "subject": "clients/fxgate-prod-gw-01/sessions/fxgate-prod-gw-01",
    "time": "2026-11-22T10:00:00.000001Z",
    "datacontenttype": "application/json",
    "data": {
        "clientName": "fxgate-prod-gw-01",
        "clientAuthenticationName": "fxgate",
        "clientSessionName": "fxgate-prod-gw-01",
        "sequenceNumber": 7,
    },
}


def test_an_event_becomes_a_qos1_message_on_its_clients_topic_with_sorted_json():
    message = event_message(EVENT, DEFAULT_LIFECYCLE_TOPIC, "prod")
    assert message.topic == "fxgate/prod/fxgate-prod-gw-01/lifecycle"
    assert message.qos == 1
    assert json.loads(message.payload) == EVENT
    keys = list(json.loads(message.payload))
    assert keys == sorted(keys)


def test_the_same_event_always_gives_the_same_bytes_so_the_ledger_stores_it_once():
    shuffled = dict(reversed(list(EVENT.items())))
    assert event_message(EVENT, DEFAULT_LIFECYCLE_TOPIC, "e") == event_message(
        shuffled, DEFAULT_LIFECYCLE_TOPIC, "e"
    )


def test_the_sink_returns_only_once_the_ledger_has_committed_the_event(tmp_path):
    ledger = InboundLedger.start(tmp_path / "ledger.sqlite", SimulatedClock())
    try:
        sink = LedgerEventSink(ledger, "site/{environment}/events/{client}", "dev")
        sink.tell(EVENT)
        # Another connection sees the row at once: it was committed before tell returned.
        with sqlite3.connect(tmp_path / "ledger.sqlite") as conn:
            stored = conn.execute(
                "SELECT topic, payload, qos FROM inbound JOIN payloads USING (seq)"
            ).fetchall()
        assert stored == [
            (
                "site/dev/events/fxgate-prod-gw-01",
                event_message(EVENT, sink._template, "dev").payload,
                1,
            )
        ]
    finally:
        ledger.stop()


def test_the_sink_raises_when_the_ledger_is_gone_so_the_event_stays_owed(tmp_path):
    ledger = InboundLedger.start(tmp_path / "ledger.sqlite", SimulatedClock())
    ledger.stop()
    with pytest.raises(pykka.ActorDeadError):
        LedgerEventSink(ledger, DEFAULT_LIFECYCLE_TOPIC, "dev").tell(EVENT)


def test_the_lifecycle_filter_matches_every_client_of_this_environment_only():
    pattern = lifecycle_filter(DEFAULT_LIFECYCLE_TOPIC, "prod")
    assert pattern == "fxgate/prod/+/lifecycle"
    assert topic_matches(pattern, "fxgate/prod/fxgate-upstream-prod-gw-01/lifecycle")
    assert not topic_matches(pattern, "fxgate/dev/x/lifecycle")
    assert not topic_matches(pattern, "zebra/fx/fx9600-01/reads")


def test_the_implicit_route_forwards_events_on_their_own_topic_ahead_of_a_catch_all():
    route = lifecycle_route(DEFAULT_LIFECYCLE_TOPIC, "prod")
    catch_all = type(route)(0, "#", "elsewhere/{topic}", 0, True)
    topic = "fxgate/prod/c1/lifecycle"
    chosen = route_for((route, catch_all), topic)
    assert chosen is route
    assert (chosen.effective_qos, render_target(chosen, topic, "prod")) == (1, topic)


@pytest.mark.parametrize(
    "template",
    ["", "fxgate/{client}x/lifecycle", "fxgate/{reader}/{client}", "a/+/{client}", "$x/{client}"],
)
def test_a_lifecycle_topic_that_cannot_name_every_client_is_refused(template):
    with pytest.raises(ValueError):
        check_lifecycle_topic(template)


def test_a_bad_lifecycle_topic_in_the_config_is_reported_with_its_key():
    from actors.config.schema import ConfigError, load_config

    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={"FXGATE__LIFECYCLE__TOPIC": "x/{client}y"}, hostname="gw")
    assert any("lifecycle.topic" in e for e in caught.value.errors)


class Connection(pykka.ThreadingActor):
    def __init__(self):
        super().__init__()
        self.published = []

    def on_receive(self, message):
        self.published.append(message)

    def seen(self):
        return list(self.published)


def test_the_source_sink_keeps_events_until_bound_then_publishes_them_in_order():
    sink = SourceEventSink(DEFAULT_LIFECYCLE_TOPIC, "dev")
    later = {**EVENT, "id": "second"}
    sink.tell(EVENT)  # before the source connection exists
    connection = Connection.start()
    try:
        sink.bind(connection)
        sink.tell(later)
        published = connection.proxy().seen().get(timeout=10)
    finally:
        connection.stop()
    assert [json.loads(p.payload)["id"] for p in published] == [EVENT["id"], "second"]
    assert {(p.topic, p.qos) for p in published} == {("fxgate/dev/fxgate-prod-gw-01/lifecycle", 1)}
    assert all(isinstance(p, Publish) for p in published)


def test_the_source_sink_raises_once_its_connection_stopped_so_the_event_stays_owed():
    sink = SourceEventSink(DEFAULT_LIFECYCLE_TOPIC, "dev")
    connection = Connection.start()
    sink.bind(connection)
    connection.stop()
    with pytest.raises(pykka.ActorDeadError):
        sink.tell(EVENT)
