import json
import sqlite3
import threading
import uuid

import pykka
import pytest

from actors.clock import SimulatedClock
from actors.connection import ConnectionSettings
from actors.lifecycle import (
    CLIENT_CREATED_OR_UPDATED,
    CLIENT_DELETED,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
    LifecycleActor,
    client_info,
    rfc3339,
)
from actors.messages import ClientInfo, ClientsConfigured, SessionConnected, SessionDisconnected

SOURCE = "fxgate/test-env/gw-01"
NAMESPACE = "test-env"
READER = ClientInfo("source", "fxgate-test-env-gw-01", "reader-user", "127.0.0.1", 1883, "f1")
UPSTREAM = ClientInfo("upstream", "up-test-env-gw-01", "up-test-env-gw-01", "cloud", 8883, "u1")


class Inbox:
    """A sink that records every event it is told."""

    def __init__(self):
        self.received: list[dict] = []
        self.cond = threading.Condition()

    def tell(self, event):
        with self.cond:
            self.received.append(event)
            self.cond.notify_all()

    def of_type(self, event_type):
        return [e for e in self.received if e["type"] == event_type]


class Lifecycle:
    """Starts LifecycleActors on one file, as the daemon would across restarts."""

    def __init__(self, path):
        self.path = path
        self.clock = SimulatedClock()
        self.refs: list[pykka.ActorRef] = []

    def start(self, *sinks, clients=(READER,)):
        ref = LifecycleActor.start(self.path, self.clock, sinks, SOURCE, namespace=NAMESPACE)
        self.refs.append(ref)
        proxy = ref.proxy()
        if clients is not None:
            ref.tell(ClientsConfigured(tuple(clients)))
        settle(proxy)  # configured before the test moves the clock on
        return ref, proxy

    def restart(self, ref, *sinks, clients=(READER,)):
        ref.stop(timeout=10)
        return self.start(*sinks, clients=clients)

    def stop_all(self):
        for ref in self.refs:
            if ref.is_alive():
                ref.stop(timeout=10)


@pytest.fixture
def lifecycle(tmp_path):
    lc = Lifecycle(tmp_path / "lifecycle.sqlite")
    yield lc
    lc.stop_all()


def settle(proxy):
    """Every message told before this ask has been handled once it returns (one mailbox)."""
    return proxy.status().get(timeout=10)


def connect(ref, epoch, client=READER):
    ref.tell(SessionConnected(client.client_id, client.client_id, epoch))


def disconnect(ref, epoch, reason="ConnectionLost", client=READER):
    ref.tell(SessionDisconnected(client.client_id, client.client_id, epoch, reason))


def session_numbers(inbox):
    return [
        (e["type"].removeprefix("fxgate.MQTTClientSession"), e["data"]["sequenceNumber"])
        for e in inbox.received
        if e["type"] in (SESSION_CONNECTED, SESSION_DISCONNECTED)
    ]


def test_each_reconnect_gets_a_higher_number_and_a_disconnect_carries_its_connects(lifecycle):
    inbox = Inbox()
    ref, proxy = lifecycle.start(inbox)
    connect(ref, 1)
    disconnect(ref, 1, "SessionTakenOver")
    connect(ref, 2)
    disconnect(ref, 2, "ClientInitiatedDisconnect")
    connect(ref, 3)
    settle(proxy)
    assert session_numbers(inbox) == [
        ("Connected", 1),
        ("Disconnected", 1),
        ("Connected", 2),
        ("Disconnected", 2),
        ("Connected", 3),
    ]
    reasons = [e["data"]["disconnectionReason"] for e in inbox.of_type(SESSION_DISCONNECTED)]
    assert reasons == ["SessionTakenOver", "ClientInitiatedDisconnect"]
    assert all("disconnectionReason" not in e["data"] for e in inbox.of_type(SESSION_CONNECTED))


def test_a_repeated_connect_of_the_same_epoch_is_not_counted_twice(lifecycle):
    inbox = Inbox()
    ref, proxy = lifecycle.start(inbox)
    connect(ref, 1)
    connect(ref, 1)
    disconnect(ref, 1)
    settle(proxy)
    assert session_numbers(inbox) == [("Connected", 1), ("Disconnected", 1)]


def test_failed_attempts_carry_the_last_number_given(lifecycle):
    inbox = Inbox()
    ref, proxy = lifecycle.start(inbox)
    connect(ref, 1)
    disconnect(ref, 1, "ConnectionLost")
    disconnect(ref, 2, "ClientAuthenticationError")  # the next attempt never got a CONNACK
    connect(ref, 3)
    settle(proxy)
    assert session_numbers(inbox) == [
        ("Connected", 1),
        ("Disconnected", 1),
        ("Disconnected", 1),
        ("Connected", 2),
    ]


def test_sequence_numbers_keep_increasing_across_a_restart_on_the_same_file(lifecycle):
    first = Inbox()
    ref, _ = lifecycle.start(first)
    connect(ref, 1)
    disconnect(ref, 1)
    connect(ref, 2)  # still open when the daemon goes down

    second = Inbox()
    ref, proxy = lifecycle.restart(ref, second)
    # The session left open ends at the start, as lost; the new process counts epochs from 1
    # again: its first connect is new, not a duplicate.
    connect(ref, 1)
    disconnect(ref, 1)
    connect(ref, 2)
    settle(proxy)
    assert session_numbers(first) == [("Connected", 1), ("Disconnected", 1), ("Connected", 2)]
    assert session_numbers(second) == [
        ("Disconnected", 2),
        ("Connected", 3),
        ("Disconnected", 3),
        ("Connected", 4),
    ]
    assert second.received[0]["data"]["disconnectionReason"] == "ConnectionLost"


def test_the_number_is_committed_before_a_sink_sees_the_event(lifecycle):
    seen_in_file = []

    class ReadsTheFile:
        def tell(self, event):
            if event["type"] == SESSION_CONNECTED:
                # Another connection, as a crash-restarted daemon would open the file.
                with sqlite3.connect(lifecycle.path) as db:
                    (number,) = db.execute(
                        "SELECT sequence_number FROM clients WHERE client_id = ?",
                        (READER.client_id,),
                    ).fetchone()
                db.close()
                seen_in_file.append((event["data"]["sequenceNumber"], number))

    ref, proxy = lifecycle.start(ReadsTheFile())
    connect(ref, 1)
    disconnect(ref, 1)
    connect(ref, 2)
    settle(proxy)
    assert seen_in_file == [(1, 1), (2, 2)]


def test_first_start_announces_every_configured_client(lifecycle):
    inbox = Inbox()
    _, proxy = lifecycle.start(inbox, clients=(READER, UPSTREAM))
    settle(proxy)
    created = inbox.of_type(CLIENT_CREATED_OR_UPDATED)
    assert [e["subject"] for e in created] == [
        f"clients/{READER.client_id}",
        f"clients/{UPSTREAM.client_id}",
    ]
    data = created[0]["data"]
    assert data["clientName"] == READER.client_id
    assert data["clientAuthenticationName"] == "reader-user"
    assert data["state"] == "Enabled"
    assert data["createdOn"] == data["updatedOn"] == rfc3339(lifecycle.clock.wall())
    assert data["namespaceName"] == NAMESPACE
    assert data["attributes"] == {"role": "source", "host": "127.0.0.1", "port": "1883"}


def test_an_unchanged_restart_announces_nothing(lifecycle):
    ref, _ = lifecycle.start(Inbox(), clients=(READER, UPSTREAM))
    inbox = Inbox()
    _, proxy = lifecycle.restart(ref, inbox, clients=(READER, UPSTREAM))
    settle(proxy)
    assert inbox.received == []


def test_a_changed_fingerprint_is_announced_as_an_update_keeping_the_creation_time(lifecycle):
    ref, _ = lifecycle.start(Inbox())
    created_at = rfc3339(lifecycle.clock.wall())
    lifecycle.clock.advance(60)
    inbox = Inbox()
    changed = ClientInfo(READER.name, READER.client_id, "reader-user", "10.0.0.7", 1883, "f2")
    _, proxy = lifecycle.restart(ref, inbox, clients=(changed,))
    settle(proxy)
    (update,) = inbox.received
    assert update["type"] == CLIENT_CREATED_OR_UPDATED
    assert update["data"]["createdOn"] == created_at
    assert update["data"]["updatedOn"] == rfc3339(lifecycle.clock.wall()) != created_at
    assert update["data"]["attributes"]["host"] == "10.0.0.7"


def test_a_client_dropped_from_the_configuration_is_deleted_and_forgotten(lifecycle):
    ref, _ = lifecycle.start(Inbox(), clients=(READER, UPSTREAM))
    connect(ref, 1, client=UPSTREAM)
    disconnect(ref, 1, client=UPSTREAM)
    inbox = Inbox()
    ref, proxy = lifecycle.restart(ref, inbox, clients=(READER,))
    status = settle(proxy)
    (deleted,) = inbox.received
    assert deleted["type"] == CLIENT_DELETED
    assert deleted["subject"] == f"clients/{UPSTREAM.client_id}"
    assert deleted["data"] == {
        "namespaceName": NAMESPACE,
        "clientName": UPSTREAM.client_id,
        "clientAuthenticationName": UPSTREAM.authentication_name,
    }
    assert [s["client_id"] for s in status] == [READER.client_id]

    # Forgotten for good: the next start neither deletes it again nor knows it.
    again = Inbox()
    _, proxy = lifecycle.restart(ref, again, clients=(READER,))
    settle(proxy)
    assert again.received == []


def test_events_are_valid_cloudevents_stamped_by_the_injected_clock(lifecycle):
    inbox = Inbox()
    ref, proxy = lifecycle.start(inbox)
    lifecycle.clock.advance(12.5)
    connect(ref, 1)
    settle(proxy)
    lifecycle.clock.advance(30)
    disconnect(ref, 1, "ServerInitiatedDisconnect")
    settle(proxy)

    created, connected, disconnected = inbox.received
    for event in inbox.received:
        assert event["specversion"] == "1.0"
        assert str(uuid.UUID(event["id"])) == event["id"]
        assert event["source"] == SOURCE
        assert event["datacontenttype"] == "application/json"
        assert json.loads(json.dumps(event)) == event
    assert len({e["id"] for e in inbox.received}) == 3
    start = 1_800_000_000.0  # SimulatedClock's default wall time
    assert created["time"] == "2027-01-15T08:00:00.000000Z" == rfc3339(start)
    assert connected["time"] == "2027-01-15T08:00:12.500000Z"
    assert disconnected["time"] == "2027-01-15T08:00:42.500000Z"
    session = f"clients/{READER.client_id}/sessions/{READER.client_id}"
    assert connected["subject"] == disconnected["subject"] == session
    assert disconnected["data"] == {
        "namespaceName": NAMESPACE,
        "clientName": READER.client_id,
        "clientAuthenticationName": "reader-user",
        "clientSessionName": READER.client_id,
        "sequenceNumber": 1,
        "disconnectionReason": "ServerInitiatedDisconnect",
    }
    assert proxy.events().get(timeout=10) == inbox.received


def test_status_reports_each_clients_last_state_and_survives_a_restart(lifecycle):
    ref, proxy = lifecycle.start(Inbox(), clients=(READER, UPSTREAM))
    connect(ref, 1)
    connect(ref, 1, client=UPSTREAM)
    lifecycle.clock.advance(5)
    disconnect(ref, 1, "QuotaExceeded", client=UPSTREAM)
    before = settle(proxy)
    by_name = {s["name"]: s for s in before}
    assert by_name["source"]["state"] == "connected"
    assert by_name["source"]["sequence_number"] == 1
    assert by_name["source"]["last_reason"] is None
    assert by_name["upstream"]["state"] == "disconnected"
    assert by_name["upstream"]["last_reason"] == "QuotaExceeded"
    assert by_name["upstream"]["last_event_time"] == rfc3339(lifecycle.clock.wall())

    _, proxy = lifecycle.restart(ref, Inbox(), clients=(READER, UPSTREAM))
    after = {s["name"]: s for s in settle(proxy)}
    assert after["upstream"] == by_name["upstream"]
    # The source's session was open when the actor stopped without its disconnect: lost.
    assert after["source"] == {
        **by_name["source"],
        "state": "disconnected",
        "last_reason": "ConnectionLost",
        "last_event_time": rfc3339(lifecycle.clock.wall()),
    }


def test_a_stopped_sink_does_not_keep_events_from_the_others(lifecycle):
    class Dead(pykka.ThreadingActor):
        pass

    dead = Dead.start()
    dead.stop(timeout=10)
    inbox = Inbox()
    ref, proxy = lifecycle.start(dead, inbox)
    connect(ref, 1)
    settle(proxy)
    assert ref.is_alive()
    assert [e["type"] for e in inbox.received] == [CLIENT_CREATED_OR_UPDATED, SESSION_CONNECTED]


class Refusing:
    """A sink that is gone (as the ledger is when it died): it takes nothing."""

    def __init__(self, name):
        self.name = name

    def tell(self, event):
        raise pykka.ActorDeadError(f"{self.name} is gone")


class Named(Inbox):
    def __init__(self, name):
        super().__init__()
        self.name = name


def outbox(path):
    with sqlite3.connect(path) as db:
        found = db.execute("SELECT sink, event FROM outbox ORDER BY position").fetchall()
    db.close()
    return [(sink, json.loads(text)["type"]) for sink, text in found]


def test_an_event_a_sink_did_not_take_is_handed_to_that_sink_alone_at_the_next_start(lifecycle):
    mqtt = Named("mqtt")
    ref, proxy = lifecycle.start(Refusing("ledger"), mqtt)
    connect(ref, 1)
    disconnect(ref, 1)
    settle(proxy)
    owed = [e["id"] for e in mqtt.received]
    assert outbox(lifecycle.path) == [
        ("ledger", CLIENT_CREATED_OR_UPDATED),
        ("ledger", SESSION_CONNECTED),
        ("ledger", SESSION_DISCONNECTED),
    ]

    ledger, mqtt_again = Named("ledger"), Named("mqtt")
    ref, proxy = lifecycle.restart(ref, ledger, mqtt_again)
    settle(proxy)
    # The same events (same ids, same order) to the ledger; the MQTT sink had them already.
    assert [e["id"] for e in ledger.received] == owed
    assert mqtt_again.received == []
    assert outbox(lifecycle.path) == []
    connect(ref, 1)
    settle(proxy)
    assert session_numbers(ledger) == [("Connected", 1), ("Disconnected", 1), ("Connected", 2)]


def test_owed_events_of_a_sink_no_longer_configured_are_dropped_not_kept_forever(lifecycle):
    ref, proxy = lifecycle.start(Named("ledger"), Refusing("mqtt"))
    connect(ref, 1)
    disconnect(ref, 1)
    settle(proxy)
    assert {sink for sink, _ in outbox(lifecycle.path)} == {"mqtt"}
    ledger = Named("ledger")
    lifecycle.restart(ref, ledger)
    assert outbox(lifecycle.path) == []
    assert ledger.received == []


def test_two_sinks_with_one_name_are_refused(tmp_path):
    with pytest.raises(ValueError, match="distinct names"):
        LifecycleActor(tmp_path / "l.sqlite", SimulatedClock(), (Named("x"), Named("x")), SOURCE)


def test_client_info_fingerprint_follows_the_configuration_but_not_the_password():
    base = ConnectionSettings("source", "localhost", 1883, "fx-env-gw", ("zebra/#",))
    info = client_info(base)
    assert info.authentication_name == "fx-env-gw"  # anonymous: the client id
    with_password = ConnectionSettings(
        "source", "localhost", 1883, "fx-env-gw", ("zebra/#",), password="s3cret"
    )
    assert client_info(with_password).fingerprint == info.fingerprint
    moved = ConnectionSettings("source", "broker-2", 1883, "fx-env-gw", ("zebra/#",))
    assert client_info(moved).fingerprint != info.fingerprint
    named = ConnectionSettings("source", "localhost", 1883, "fx-env-gw", ("zebra/#",), 2, "ops")
    assert client_info(named).authentication_name == "ops"
    assert "s3cret" not in repr(client_info(with_password))


def test_an_empty_namespace_is_refused(tmp_path):
    with pytest.raises(ValueError, match="namespace"):
        LifecycleActor(tmp_path / "l.sqlite", SimulatedClock(), (), SOURCE, namespace="")
