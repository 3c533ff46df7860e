"""Life-cycle events produced by real causes against a real mosquitto (issue 6)."""

import subprocess
import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from actors.clock import SimulatedClock
from actors.connection import ConnectionActor
from actors.lifecycle import SESSION_CONNECTED, SESSION_DISCONNECTED, LifecycleActor, client_info
from actors.messages import ClientsConfigured
from tests.actors.test_connection import InstantLedger, settings
from tests.harness.fake_broker import FakeBroker

pytestmark = pytest.mark.broker

CLIENT_ID = "fxgate-test-gw1"


class Events:
    def __init__(self):
        self.items: list[dict] = []
        self.cond = threading.Condition()

    def tell(self, event):
        with self.cond:
            self.items.append(event)
            self.cond.notify_all()

    def sessions(self):
        kinds = (SESSION_CONNECTED, SESSION_DISCONNECTED)
        return [e for e in self.items if e["type"] in kinds]

    def wait_sessions(self, count, timeout=15):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.sessions()) >= count, timeout), self.items
            return self.sessions()


def summary(events):
    return [
        (
            e["type"].rsplit(".", 1)[1],
            e["data"]["sequenceNumber"],
            e["data"].get("disconnectionReason"),
        )
        for e in events
    ]


@pytest.fixture
def wired(tmp_path):
    started = []

    def start(broker, clock=None, **overrides):
        clock = clock or SimulatedClock()
        events = Events()
        lifecycle = LifecycleActor.start(tmp_path / "lifecycle.sqlite", clock, (events,), "test")
        s = settings(broker, subscriptions=("zebra/fx/+/reads",), qos=1, **overrides)
        lifecycle.tell(ClientsConfigured((client_info(s),)))
        connection = ConnectionActor.start(s, clock, InstantLedger(), lifecycle=lifecycle)
        started.extend([connection, lifecycle])
        return connection, lifecycle, events, clock

    yield start
    for ref in started:
        if ref.is_alive():
            ref.stop()


def test_connect_loss_reconnect_and_our_disconnect_carry_increasing_numbers_across_restarts(
    mosquitto, wired
):
    connection, lifecycle, events, clock = wired(mosquitto)
    events.wait_sessions(1)
    mosquitto.kill()  # the socket dies: no DISCONNECT from the broker
    events.wait_sessions(2)
    mosquitto.start()
    assert clock.wait_for_timers(1)
    clock.advance(clock.next_due_in())
    events.wait_sessions(3)
    connection.stop()  # our own DISCONNECT, session kept
    assert summary(events.wait_sessions(4)) == [
        ("MQTTClientSessionConnected", 1, None),
        ("MQTTClientSessionDisconnected", 1, "ConnectionLost"),
        ("MQTTClientSessionConnected", 2, None),
        ("MQTTClientSessionDisconnected", 2, "ClientInitiatedDisconnect"),
    ]
    lifecycle.stop()

    # The daemon again, on the same file: the numbers go on.
    _, _, again, _ = wired(mosquitto)
    assert summary(again.wait_sessions(1)) == [("MQTTClientSessionConnected", 3, None)]


def test_mosquitto_closes_a_taken_over_session_without_a_reason_so_it_reads_as_lost(
    mosquitto, wired
):
    _, _, events, _ = wired(mosquitto)
    events.wait_sessions(1)
    intruder = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=CLIENT_ID, protocol=MQTTProtocolVersion.MQTTv5
    )
    intruder.connect(mosquitto.host, mosquitto.port)
    intruder.loop_start()
    try:
        disconnect = events.wait_sessions(2)[1]
    finally:
        intruder.loop_stop()
        intruder.disconnect()
    # mosquitto 2.0.11 logs "already connected, closing old connection" and sends no DISCONNECT
    # 0x8E: the takeover reaches us as a lost socket (the fake broker below sends the 0x8E).
    assert mosquitto.wait_for_output(f"Client {CLIENT_ID} already connected", 5)
    assert disconnect["data"]["disconnectionReason"] == "ConnectionLost"
    assert disconnect["data"]["sequenceNumber"] == 1


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (0x8E, "SessionTakenOver"),
        (0x97, "QuotaExceeded"),
        (0x8B, "ServerInitiatedDisconnect"),
        (0x87, "ClientAuthorizationError"),
        (0x89, "ServerInitiatedDisconnect"),
        (0x80, "ServerError"),
    ],
)
def test_a_broker_disconnect_reason_becomes_its_event_grid_reason(wired, code, reason):
    with FakeBroker() as broker:
        _, _, events, _ = wired(broker)
        events.wait_sessions(1)
        broker.disconnect_clients(code)
        disconnect = events.wait_sessions(2)[1]
    assert (disconnect["data"]["disconnectionReason"], disconnect["data"]["sequenceNumber"]) == (
        reason,
        1,
    )


def test_a_graceful_broker_shutdown_is_reported(mosquitto, wired):
    _, _, events, _ = wired(mosquitto)
    events.wait_sessions(1)
    mosquitto.stop()
    disconnect = events.wait_sessions(2)[1]
    # mosquitto 2.0.11 closes its clients' sockets at SIGTERM without a DISCONNECT packet.
    assert disconnect["data"]["disconnectionReason"] == "ConnectionLost"


def test_a_wrong_password_is_an_authentication_error_then_a_backoff_not_a_crash_loop(
    mosquitto_factory, tmp_path, wired
):
    passwords = tmp_path / "passwords"
    subprocess.run(
        ["mosquitto_passwd", "-c", "-b", str(passwords), "gateway", "right"],
        check=True,
        capture_output=True,
    )
    broker = mosquitto_factory(password_file=passwords)
    connection, _, events, clock = wired(broker, username="gateway", password="wrong")
    refused = events.wait_sessions(1)[0]
    assert refused["type"] == SESSION_DISCONNECTED
    assert refused["data"]["disconnectionReason"] == "ClientAuthenticationError"
    # Waiting for its next attempt on the backoff schedule, with the refusal as the reason.
    assert clock.wait_for_timers(1)
    state = connection.proxy().state().get(timeout=5)
    assert state.state == "waiting"
    # mosquitto 2.0.11 refuses a wrong password with 0x87 Not authorized (not 0x86).
    assert state.last_reason == "Not authorized"
