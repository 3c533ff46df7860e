import threading

import pytest

from actors.clock import SimulatedClock
from actors.connection import ConnectionActor, ledger_client_factory
from actors.ledger import InboundLedger, InlineIntake
from actors.mqtt.client import HAND_OVER_PACKETS, InboundPublish, InboundPubrel
from actors.mqtt.intake import IntakeGate, packet_size
from tests.actors.test_connection import settings
from tests.harness.checks import wait_until
from tests.harness.mqtt import publish_all

TOPIC = "zebra/fx/fx9600-01/reads"


def admit_in_thread(gate: IntakeGate, size: int) -> threading.Thread:
    thread = threading.Thread(target=gate.admit, args=(size,), daemon=True)
    thread.start()
    return thread


def test_admits_up_to_the_message_limit_without_waiting():
    gate = IntakeGate(4, 10_000, SimulatedClock().monotonic)
    for _ in range(4):
        gate.admit(10)
    stats = gate.stats()
    assert (stats.waiting_messages, stats.waiting_bytes, stats.holds) == (4, 40, 0)


def test_past_the_message_limit_admit_waits_until_the_ledger_is_down_to_half():
    gate = IntakeGate(4, 10_000, SimulatedClock().monotonic)
    for _ in range(4):
        gate.admit(10)
    waiter = admit_in_thread(gate, 10)
    assert wait_until(lambda: gate.stats().holds == 1, 5)
    gate.taken(10)  # 3 waiting: above the low mark of 2, still held
    assert waiter.is_alive()
    gate.taken(10)  # 2 waiting: released
    waiter.join(5)
    assert not waiter.is_alive()
    assert gate.stats().waiting_messages == 3


def test_past_the_byte_limit_admit_waits_too():
    gate = IntakeGate(1000, 100, SimulatedClock().monotonic)
    gate.admit(60)
    gate.admit(60)
    waiter = admit_in_thread(gate, 1)
    assert wait_until(lambda: gate.stats().holds == 1, 5)
    gate.taken(60)  # 60 bytes: above the low mark of 50
    assert waiter.is_alive()
    gate.taken(60)
    waiter.join(5)
    assert not waiter.is_alive()
    assert (gate.stats().waiting_bytes, gate.stats().peak_bytes) == (1, 120)


def test_one_payload_larger_than_the_byte_limit_still_gets_in_alone():
    gate = IntakeGate(1000, 100, SimulatedClock().monotonic)
    gate.admit(5000)  # nothing waiting: must not stall the source for good
    assert gate.stats().waiting_bytes == 5000


def test_close_releases_a_waiting_network_thread_for_good():
    gate = IntakeGate(2, 1000, SimulatedClock().monotonic)
    gate.admit(1)
    gate.admit(1)
    waiter = admit_in_thread(gate, 1)
    assert wait_until(lambda: gate.stats().holds == 1, 5)
    gate.close()
    waiter.join(5)
    assert not waiter.is_alive()
    gate.admit(1)  # closed: never waits again
    assert gate.stats().holds == 1


def test_interrupt_releases_the_current_waiter_and_the_gate_holds_again_after():
    gate = IntakeGate(2, 1000, SimulatedClock().monotonic)
    gate.admit(1)
    gate.admit(1)
    waiter = admit_in_thread(gate, 1)
    assert wait_until(lambda: gate.stats().holds == 1, 5)
    gate.interrupt()  # its connection is stopping
    waiter.join(5)
    assert not waiter.is_alive()
    second = admit_in_thread(gate, 1)  # the next connection's thread is gated as before
    assert wait_until(lambda: gate.stats().holds == 2, 5)
    gate.taken(1)
    gate.taken(1)
    second.join(5)
    assert not second.is_alive()


def test_the_time_held_is_measured_on_the_injected_clock():
    clock = SimulatedClock()
    gate = IntakeGate(2, 1000, clock.monotonic)
    gate.admit(1)
    gate.admit(1)
    waiter = admit_in_thread(gate, 1)
    assert wait_until(lambda: gate.stats().holds == 1, 5)
    clock.advance(2.5)
    gate.taken(1)
    waiter.join(5)
    assert gate.stats().held_seconds == pytest.approx(2.5)


def test_limits_below_two_are_refused():
    with pytest.raises(ValueError, match="at least 2"):
        IntakeGate(1, 1000, SimulatedClock().monotonic)


def test_a_packet_weighs_its_payload_and_a_pubrel_nothing():
    publish = InboundPublish(1, 7, 1, False, False, TOPIC, True, b"x" * 250, None, 0.0)
    assert packet_size(publish) == 250
    assert packet_size(InboundPubrel(1, 7)) == 0


class SlowKey:
    """The ledger's idempotency key function, stalled on the first message until released: the
    ledger stops taking from its mailbox while paho's thread keeps decoding."""

    def __init__(self):
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, topic, payload):
        self.calls += 1
        if self.calls == 1:
            assert self.release.wait(30)
        return f"{topic}:{payload.decode()}"


@pytest.mark.broker
def test_a_queued_backlog_reaches_the_ledger_no_faster_than_the_intake_limit(mosquitto, tmp_path):
    """mosquitto drains a queued session past our Receive Maximum; the gate, not the broker,
    bounds what waits in the ledger's mailbox, and every message is still stored once."""
    clock = SimulatedClock()
    gate = IntakeGate(50, 1_000_000, clock.monotonic)
    key = SlowKey()
    # A zero group-commit delay commits on a message, not a timer: the simulated clock stays put.
    ledger = InboundLedger.start(
        tmp_path / "ledger.sqlite", clock, group_commit_max_delay=0.0, key=key, intake=gate
    )
    source = settings(mosquitto, qos=1, subscriptions=("zebra/fx/+/reads",), receive_maximum=200)
    # A persistent session that is away while 2,000 messages queue for it.
    away = ConnectionActor.start(
        source, clock, ledger, client_factory=ledger_client_factory(ledger, gate)
    )
    assert mosquitto.wait_for_output("fxgate-test-gw1 1 zebra/fx/+/reads", 10)
    away.stop()
    publish_all(mosquitto.host, mosquitto.port, [(TOPIC, b"m%d" % i) for i in range(2000)])

    returned = ConnectionActor.start(
        source, clock, ledger, client_factory=ledger_client_factory(ledger, gate)
    )
    try:
        # The ledger is stuck on the first message: paho's thread fills the gate and waits.
        # It hands packets over up to HAND_OVER_PACKETS at a time: the gate is past its limit
        # by less than one hand-over.
        assert wait_until(lambda: gate.stats().holds >= 1, 15)
        assert 50 <= gate.stats().waiting_messages < 50 + HAND_OVER_PACKETS
        key.release.set()
        assert wait_until(lambda: ledger.proxy().stats().get(timeout=5)["accepted"] >= 2000, 60)
        stats = ledger.proxy().stats().get(timeout=5)
        assert (stats["accepted"], stats["duplicates"]) == (2000, 0)
        assert 50 <= gate.stats().peak_messages < 50 + HAND_OVER_PACKETS
    finally:
        returned.stop()
        ledger.stop()


@pytest.mark.broker
@pytest.mark.parametrize("qos", [1, 2])
def test_at_a_window_of_one_reads_are_stored_and_acked_on_the_network_thread(
    mosquitto, tmp_path, qos
):
    """Each PUBLISH comes alone (Receive Maximum 1) and finds the ledger idle: the network thread
    stores, commits and acknowledges it itself (actors.ledger.InlineIntake), and every message
    is stored once."""
    clock = SimulatedClock()
    gate = IntakeGate(50, 1_000_000, clock.monotonic)
    inline = InlineIntake()
    ledger = InboundLedger.start(
        tmp_path / "ledger.sqlite", clock, group_commit_max_delay=0.0, intake=gate, inline=inline
    )
    source = settings(mosquitto, qos=qos, subscriptions=("zebra/fx/+/reads",), receive_maximum=1)
    connection = ConnectionActor.start(
        source, clock, ledger, client_factory=ledger_client_factory(ledger, gate, inline.take)
    )
    try:
        assert mosquitto.wait_for_output(f"fxgate-test-gw1 {qos} zebra/fx/+/reads", 10)
        publish_all(mosquitto.host, mosquitto.port, [(TOPIC, b"m%d" % i) for i in range(200)], qos)

        def done():
            stats = ledger.proxy().stats().get(timeout=5)
            return stats["accepted"] >= 200 and stats["awaiting_pubrel"] == 0

        assert wait_until(done, 60)
        stats = ledger.proxy().stats().get(timeout=5)
        assert (stats["accepted"], stats["duplicates"]) == (200, 0)
        # Nearly all inline: a burst goes through the mailbox only when the ledger is busy
        # (with the session's start, say).
        assert stats["inline_commits"] > 100
        assert gate.stats().waiting_messages == 0
    finally:
        connection.stop()
        ledger.stop()
