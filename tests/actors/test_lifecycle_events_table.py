"""Life-cycle events through the whole path: real mosquitto -> ledger -> Spark `events` table."""

import pytest

from actors.clock import RealClock
from actors.lifecycle import CLIENT_CREATED_OR_UPDATED, SESSION_CONNECTED
from actors.supervisor import Supervisor
from spark.schema import EVENTS_SCHEMA
from spark.tables import EVENTS, read_table_arrow
from tests.actors.test_supervisor import quick_config

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
    assert [e["type"] for e in events].count(CLIENT_CREATED_OR_UPDATED) == 1
    assert len({e["id"] for e in events}) == len(events)
    # Nothing of it went to the other tables.
    assert supervisor.rows_written == 0
    assert supervisor.dead_letters_written == 0


def test_a_restart_continues_the_sequence_and_the_table_holds_every_event_once(
    mosquitto, spark_session, tmp_path
):
    config = quick_config(mosquitto, tmp_path / "data")
    for run in (1, 2):
        clock = RealClock()
        supervisor = Supervisor(config, clock, session_factory=lambda: spark_session)
        supervisor.start()
        try:
            # Run 1: created + connected. Run 2: connected (the stop's disconnect landed in
            # run 1's last batch).
            assert supervisor.wait_for_landed(0, events=2 if run == 1 else 1, timeout=60)
        finally:
            supervisor.stop()
            clock.close()

    events = read_table_arrow(config.tables_path, EVENTS, EVENTS_SCHEMA).to_pylist()
    sessions = sorted(
        (e["sequence_number"], e["type"] != SESSION_CONNECTED, e["disconnection_reason"])
        for e in events
        if e["type"] != CLIENT_CREATED_OR_UPDATED
    )
    assert sessions == [
        (1, False, None),
        (1, True, "ClientInitiatedDisconnect"),
        (2, False, None),
        (2, True, "ClientInitiatedDisconnect"),
    ]
    assert len({e["id"] for e in events}) == len(events)
