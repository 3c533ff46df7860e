"""Life-cycle events through the whole path: real mosquitto -> ledger -> Spark `events` table."""

import json

import pytest

from actors.clock import RealClock
from actors.config.routes import lifecycle_filter
from actors.lifecycle import CLIENT_CREATED_OR_UPDATED, SESSION_CONNECTED, SESSION_DISCONNECTED
from actors.supervisor import Supervisor
from spark.schema import EVENTS_SCHEMA
from spark.tables import EVENTS, read_table_arrow
from tests.actors.test_crashpoints import gateway_env
from tests.actors.test_supervisor import quick_config
from tests.harness.mqtt import Collector

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_the_source_connect_event_lands_in_the_events_table_exactly_once(
    mosquitto, spark_session, tmp_path
):
    config = quick_config(mosquitto, tmp_path / "data")
    clock = RealClock()
    supervisor = Supervisor(config, clock, session_factory=lambda: spark_session)
    supervisor.start()
    try:
        # created-or-updated (first start) and connected
        assert supervisor.wait_for_landed(0, events=2, timeout=60)
        supervisor.ref("ledger").proxy().stats().get(timeout=10)
    finally:
        supervisor.stop()
        clock.close()

    events = read_table_arrow(config.tables_path, EVENTS, EVENTS_SCHEMA).to_pylist()
    client = config.identity.client_id
    connected = [e for e in events if e["type"] == SESSION_CONNECTED]
    assert len(connected) == 1, events
    assert (connected[0]["client_id"], connected[0]["sequence_number"]) == (client, 1)
    assert connected[0]["subject"] == f"clients/{client}/sessions/{client}"
    # The daemon names the namespace: the environment id, as no [lifecycle] namespace is set.
    assert {json.loads(e["data"])["namespaceName"] for e in events} == {
        config.identity.environment_id
    }
    assert [e["type"] for e in events].count(CLIENT_CREATED_OR_UPDATED) == 1
    assert len({e["id"] for e in events}) == len(events)
    # Nothing of it went to the other tables.
    assert supervisor.rows_written == 0
    assert supervisor.dead_letters_written == 0


def test_a_restart_continues_the_sequence_and_the_table_holds_every_event_once(
    mosquitto, spark_session, tmp_path
):
    config = quick_config(mosquitto, tmp_path / "data")
    # No upstream: the events are published on the source broker too.
    subscriber = Collector(
        mosquitto.host, mosquitto.port, lifecycle_filter(config.lifecycle.topic, "+"), qos=1
    )
    try:
        for run in (1, 2):
            clock = RealClock()
            supervisor = Supervisor(config, clock, session_factory=lambda: spark_session)
            supervisor.start()
            try:
                # Run 1: created + connected. Run 2: connected (the stop's disconnect landed
                # in run 1's last batch).
                assert supervisor.wait_for_landed(0, events=2 if run == 1 else 1, timeout=60)
            finally:
                supervisor.stop()
                clock.close()
        # Run 1's disconnect could not go out on the connection it ends: run 2 publishes it.
        published = [json.loads(payload) for _, payload, _ in subscriber.wait_for(4)]
        topics = {topic for topic, _, _ in subscriber.messages}
    finally:
        subscriber.close()
    assert topics == {
        f"fxgate/{config.identity.environment_id}/{config.identity.client_id}/lifecycle"
    }
    assert [(e["type"], e["data"].get("sequenceNumber")) for e in published] == [
        (CLIENT_CREATED_OR_UPDATED, None),
        (SESSION_CONNECTED, 1),
        (SESSION_DISCONNECTED, 1),
        (SESSION_CONNECTED, 2),
    ]

    events = read_table_arrow(config.tables_path, EVENTS, EVENTS_SCHEMA).to_pylist()
    assert {e["id"] for e in published} <= {e["id"] for e in events}
    assert sessions(events) == [
        (1, False, None),
        (1, True, "ClientInitiatedDisconnect"),
        (2, False, None),
        (2, True, "ClientInitiatedDisconnect"),
    ]
    assert len({e["id"] for e in events}) == len(events)


def test_a_kill_between_the_numbers_commit_and_the_ledgers_loses_no_event(
    mosquitto, daemon_factory, tmp_path
):
    """SIGKILL right after the connect event (number 1) is committed in lifecycle.sqlite and
    before the ledger has it: the next start hands it on from the outbox, once."""
    data = tmp_path / "data"
    env = gateway_env(mosquitto, data)
    # The first hit is the created-or-updated event, the second the connect.
    doomed = daemon_factory({**env, "FXGATE_CRASH_AT": "after_lifecycle_commit_before_hand_on:2"})
    assert doomed.proc.wait(120) == -9, doomed.output()[-3000:]
    assert doomed.count_logs("crash point after_lifecycle_commit_before_hand_on reached") == 1

    survivor = daemon_factory(env)
    survivor.wait_for_log(r"handing on 1 event\(s\) stored before the last stop", timeout=60)
    survivor.wait_for_log(r"lifecycle MQTTClientSessionConnected: .* seq=2", timeout=60)
    assert survivor.terminate() == 0  # a graceful stop lands what the ledger holds

    events = read_table_arrow(data / "tables", EVENTS, EVENTS_SCHEMA).to_pylist()
    assert sessions(events) == [
        (1, False, None),
        # Announced at the restart: the kill ended session 1 without a word.
        (1, True, "ConnectionLost"),
        (2, False, None),
        (2, True, "ClientInitiatedDisconnect"),
    ], survivor.output()[-6000:]
    assert [e["type"] for e in events].count(CLIENT_CREATED_OR_UPDATED) == 1
    assert len({e["id"] for e in events}) == len(events)


def sessions(events):
    return sorted(
        (e["sequence_number"], e["type"] != SESSION_CONNECTED, e["disconnection_reason"])
        for e in events
        if e["type"] != CLIENT_CREATED_OR_UPDATED
    )
