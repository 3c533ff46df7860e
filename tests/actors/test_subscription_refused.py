"""A connection that cannot do its job shows it: a refused subscription, and auto_reconnect = false.

A refused subscription is shown with the scripted fake broker, because mosquitto 2.0.11 never
refuses one: measured here with an `acl_file` that gives the client no read access to a filter,
its SUBACK to an MQTT 5 client said "Granted QoS 1" and then nothing published on the filter was
delivered. That silent case is exactly why a refusal must be loud when a broker does send one
(EMQX and Event Grid answer 0x87 Not authorized).
"""

from __future__ import annotations

import logging
from dataclasses import asdict

import pytest
from prometheus_client import CollectorRegistry

from actors.app.metrics import HealthThresholds, StatusBoard, build_registry
from actors.app.status import format_status
from actors.clock import SimulatedClock
from actors.connection import RESUBSCRIBE_MIN_DELAY, ConnectionActor
from tests.actors.test_connection import InstantLedger, drive_until, settings
from tests.harness.checks import wait_until
from tests.harness.fake_broker import FakeBroker

pytestmark = pytest.mark.broker

TOPIC = "zebra/fx/+/reads"
OTHER = "zebra/fx/+/events"
NOT_AUTHORIZED = 0x87


@pytest.fixture
def actors():
    started = []
    yield started
    for ref in reversed(started):
        if ref.is_alive():
            ref.stop(timeout=10)


@pytest.fixture
def fake():
    with FakeBroker() as broker:
        yield broker


@pytest.fixture
def start_refused(fake, actors):
    """Start a source connection to the fake broker, which refuses TOPIC: (clock, ledger, a
    function giving the connection's state)."""

    def start(subscriptions=(TOPIC, OTHER), **overrides):
        fake.refuse_subscriptions[TOPIC] = NOT_AUTHORIZED
        clock = SimulatedClock()
        ledger = InstantLedger()
        connection = ConnectionActor.start(
            settings(fake, subscriptions=subscriptions, qos=1, **overrides), clock, ledger
        )
        actors.append(connection)
        proxy = connection.proxy()
        return clock, ledger, lambda: proxy.state().get(timeout=10)

    return start


def board_with(clock: SimulatedClock, state) -> StatusBoard:
    """A StatusBoard that has seen one snapshot holding this source state, as the daemon's."""
    board = StatusBoard(clock, HealthThresholds())
    board.publish({"actors": {"source": True}, "source": asdict(state)})
    return board


def sample(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, {"connection": "source"})


def test_a_refused_subscription_is_loud_and_unhealthy_until_a_later_suback_grants_it(
    fake, start_refused, caplog
):
    clock, ledger, state = start_refused()

    with caplog.at_level(logging.INFO, logger="actors.connection"):
        assert wait_until(lambda: state().refused_subscriptions, timeout=15)
    refused = state()
    assert refused.state == "connected"  # the connection itself looks fine ...
    assert refused.refused_subscriptions == {TOPIC: "Not authorized (0x87)"}  # ... this does not
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == "actors.connection"
    ]
    assert errors == [
        f"source: the broker refused the subscription to {TOPIC}: Not authorized (0x87); nothing "
        "arrives on it until a later SUBACK grants it (check the broker's ACL for "
        "fxgate-test-gw1)"
    ]

    board = board_with(clock, refused)
    health = board.health()
    assert not health.healthy
    assert health.reasons == (
        f"source subscription to {TOPIC} refused by the broker (Not authorized (0x87)): "
        "nothing arrives on it until a SUBACK grants it",
    )
    registry = build_registry(board)
    assert sample(registry, "fxgate_subscriptions_refused") == 1
    assert sample(registry, "fxgate_subscription_refusals_total") == 1
    text = format_status(
        {
            "now": clock.wall(),
            "data_dir": "/var/lib/fxgate",
            "daemon": {"running": True, "pid": 1, "source": asdict(refused)},
            "ledger": {},
            "tables": {"reads": 0, "dead_letters": 0},
        }
    )
    assert (
        f"REFUSED:    the source broker refused the subscription to {TOPIC} (Not authorized "
        "(0x87)): nothing arrives on it until a SUBACK grants it (check the broker's ACL)" in text
    )

    # The broker's ACL is fixed; the next connection's SUBACK grants the filter.
    fake.refuse_subscriptions.clear()
    fake.drop_clients()
    assert drive_until(clock, lambda: len(ledger.sessions) >= 2, ledger.cond)
    assert wait_until(lambda: not state().refused_subscriptions, timeout=15)
    granted = state()
    assert granted.subscription_refusals == 1
    board = board_with(clock, granted)
    assert board.health().healthy, board.health().reasons
    registry = build_registry(board)
    assert sample(registry, "fxgate_subscriptions_refused") == 0
    assert sample(registry, "fxgate_subscription_refusals_total") == 1
    # And reads on it arrive now.
    fake.publish_to_clients("zebra/fx/fx9600-01/reads", b'{"n":1}', qos=1)
    assert ledger.wait_payloads(1) == [b'{"n":1}']


def test_a_refused_subscription_is_asked_for_again_on_a_backoff_and_granted_without_a_reconnect(
    fake, start_refused, caplog
):
    clock, ledger, state = start_refused()

    def asked_for(topic):
        return [f for _, f, _ in fake.subscribes].count(topic)

    with caplog.at_level(logging.INFO, logger="actors.connection"):
        assert wait_until(lambda: state().refused_subscriptions, timeout=15)
        assert clock.wait_for_timers(1)
        first = clock.next_due_in()
        assert RESUBSCRIBE_MIN_DELAY * 0.75 <= first <= RESUBSCRIBE_MIN_DELAY * 1.25
        # Still refused at the first ask: the next one waits about twice as long.
        clock.advance(first)
        assert wait_until(lambda: state().subscription_refusals == 2, timeout=15)
        assert clock.wait_for_timers(1)
        second = clock.next_due_in()
        assert RESUBSCRIBE_MIN_DELAY * 1.5 <= second <= RESUBSCRIBE_MIN_DELAY * 2.5
        # The ACL is fixed: the next ask is granted on the same connection.
        fake.refuse_subscriptions.clear()
        clock.advance(second)
        assert wait_until(lambda: not state().refused_subscriptions, timeout=15)
    assert asked_for(TOPIC) == 1 and asked_for(OTHER) == 1  # only the refused one asked again
    assert len(ledger.sessions) == 1 and state().connects == 1  # no reconnect
    assert clock.pending() == 0  # nothing more to ask
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "actors.connection"]
    assert (
        logging.WARNING,
        f"source: the broker refused the subscription to {TOPIC} again: Not authorized (0x87)",
    ) in said
    assert (
        logging.WARNING,
        f"source: subscription to {TOPIC} granted (Granted QoS 1 (0x01)) after a refusal",
    ) in said
    assert [m for level, m in said if level == logging.ERROR] == [
        f"source: the broker refused the subscription to {TOPIC}: Not authorized (0x87); nothing "
        "arrives on it until a later SUBACK grants it (check the broker's ACL for "
        "fxgate-test-gw1)"
    ]
    fake.publish_to_clients("zebra/fx/fx9600-01/reads", b'{"n":1}', qos=1)
    assert ledger.wait_payloads(1) == [b'{"n":1}']


def test_a_dropped_connection_drops_the_pending_ask_and_its_successor_subscribes_to_all(
    fake, start_refused
):
    clock, ledger, state = start_refused(subscriptions=(TOPIC,), reconnect_min_delay=1.0)
    assert wait_until(lambda: state().refused_subscriptions, timeout=15)
    assert clock.wait_for_timers(1)
    fake.refuse_subscriptions.clear()
    fake.drop_clients()
    assert drive_until(clock, lambda: len(ledger.sessions) >= 2, ledger.cond)
    assert wait_until(lambda: not state().refused_subscriptions, 15)
    # The first connection's ask was cancelled with it: no timer is left to fire.
    assert clock.pending() == 0


def test_with_auto_reconnect_off_a_dropped_connection_stays_down_says_so_and_is_unhealthy_at_once(
    mosquitto, actors, caplog
):
    clock = SimulatedClock()
    ledger = InstantLedger()
    connection = ConnectionActor.start(
        settings(mosquitto, subscriptions=(TOPIC,), qos=1, auto_reconnect=False), clock, ledger
    )
    actors.append(connection)
    proxy = connection.proxy()
    ledger.wait_sessions(1)
    with caplog.at_level(logging.ERROR, logger="actors.connection"):
        mosquitto.kill()  # the socket dies
        with ledger.cond:
            assert ledger.cond.wait_for(lambda: ledger.ended, 15)
        assert wait_until(lambda: proxy.state().get(timeout=10).state == "not_reconnecting")
    mosquitto.start()
    # Nothing is scheduled: however far the clock moves, no attempt is made.
    assert clock.pending() == 0
    clock.advance(3600)
    down = proxy.state().get(timeout=10)
    assert (down.state, down.connects, down.next_attempt_in) == ("not_reconnecting", 1, None)
    assert [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == "actors.connection"
    ] == [
        f"source: connection to {mosquitto.host}:{mosquitto.port} ended ({down.last_reason}) and "
        "auto_reconnect = false: not reconnecting; restart fxgate once the broker is reachable"
    ]
    assert len(ledger.sessions) == 1

    # Unhealthy at once, not after health_connection_down_seconds: it will not come back.
    health = board_with(clock, down).health()
    assert not health.healthy
    assert health.reasons == (
        "source connection ended and auto_reconnect = false: not reconnecting "
        f"(last reason: {down.last_reason})",
    )


def test_with_auto_reconnect_off_a_broker_unreachable_at_start_is_not_retried(actors):
    clock = SimulatedClock()
    nowhere = FakeBroker().start()
    nowhere.close()  # its port is free again: nothing listens there
    connection = ConnectionActor.start(
        settings(nowhere, auto_reconnect=False), clock, InstantLedger()
    )
    actors.append(connection)
    state = connection.proxy().state().get(timeout=10)
    assert state.state == "not_reconnecting"
    assert "connect failed" in state.last_reason
    assert clock.pending() == 0
