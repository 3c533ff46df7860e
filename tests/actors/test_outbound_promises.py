"""The forward leg keeps the promises of its design records (issue 14), on the wire.

Each case is shown twice where it is about the wire: against the outbound ledger's own decisions
(a scripted client records what it is asked to send), and through the real upstream client and
connection actor to the scripted fake broker, which records every PUBLISH as it arrived: its QoS,
DUP flag, packet id and Message Expiry Interval. mosquitto cannot refuse a PUBLISH with a reason
code, nor show what a client sent with DUP on QoS 0 (it disconnects it), so the fake does.
"""

import pytest

from actors.app.dead_letters import load_dead_letters
from actors.buffer import RESTART_DROPPED, TierTwoBuffer
from actors.clock import RealClock, SimulatedClock
from actors.config.routes import Route
from actors.config.schema import load_config
from actors.connection import ConnectionActor
from actors.devtools.simulate import simulate
from actors.forward_leg import upstream_client_factory
from actors.ledger import LedgerRecord
from actors.messages import Demand, Forwarded, Pack, PackSealed, SessionStarted
from actors.mqtt.upstream import AckType, OutboundAck
from actors.outbound import OutboundLedger
from actors.supervisor import Supervisor
from persistence.outbound_store import OutboundStore
from spark.tables import READS, read_table
from tests.actors.test_connection import settings
from tests.actors.test_outbound import (
    FakeLedger,
    ScriptedClient,
    forwarding_environ,
    records_of,
)
from tests.harness.checks import wait_until
from tests.harness.fake_broker import FakeBroker
from tests.harness.inbox import Inbox
from tests.harness.mqtt import Collector

READER_1 = "zebra/fx/r1/reads"
READER_2 = "zebra/fx/r2/reads"


def record(seq, topic=READER_1, expires_at=None, qos=1):
    return LedgerRecord(seq, f"k{seq}", topic, b"x" * 20, qos, 0.0, 0, None, expires_at)


class Recorder(ScriptedClient):
    """The upstream client as the outbound ledger sees it: records every send with its QoS,
    acks nothing unless told to."""

    def send_publish(self, epoch, message):
        with self.cond:
            self.sent.append(
                (
                    "PUBLISH",
                    message.message_key,
                    message.packet_id,
                    message.qos,
                    message.dup,
                    message.expiry_interval,
                )
            )
            self.cond.notify_all()
        return True

    def published_keys(self):
        return [s[1] for s in self.sent if s[0] == "PUBLISH"]


@pytest.fixture
def forwarder(tmp_path):
    """An outbound ledger on `outbound.sqlite` with a recording client, on a simulated clock."""
    started = []

    def start(qos=1, clock=None, receive_maximum=65535, connected=True, **options):
        clock = clock or SimulatedClock()
        client = Recorder()
        ledger = Inbox()
        options.setdefault("processing_timeout", 20.0)
        ref = OutboundLedger.start(
            tmp_path / "outbound.sqlite",
            clock,
            ledger,
            (Route(0, "zebra/fx/+/reads", qos=qos),),
            "env",
            **options,
        )
        started.append(ref)
        ref.proxy().set_client(client).get(timeout=5)
        if connected:
            ref.tell(SessionStarted(1, True, receive_maximum))
        return ref, client, clock, ledger

    yield start
    for ref in started:
        if ref.is_alive():
            ref.stop()


def reports(ledger):
    return [m for m in ledger.messages if isinstance(m, Forwarded)]


# -- QoS 0: sent once, never in flight, never DUP -----------------------------------------------


def test_a_qos0_message_is_never_in_flight_and_not_sent_again_after_a_reconnect(forwarder):
    """Today's fault: QoS 0 was tracked in flight until paho wrote it, and re-sent with DUP."""
    ref, client, _, ledger = forwarder(qos=0)
    ref.tell(PackSealed(Pack(1, tuple(record(s) for s in range(1, 4)))))
    (report,) = ledger.wait_for(1)
    assert report.done == (1, 2, 3) and report.dead == ()
    assert [(kind, qos, dup, pid) for kind, _, pid, qos, dup, _ in client.sent] == [
        ("PUBLISH", 0, False, 0)
    ] * 3
    assert ref.proxy().status().get(timeout=5)["in_flight"] == 0
    ref.tell(SessionStarted(2, True, 65535))
    ref.proxy().status().get(timeout=5)  # the reconnect has been handled
    assert len(client.sent) == 3


def test_a_qos0_message_an_older_version_left_in_flight_is_not_sent_again_after_a_restart(
    forwarder, tmp_path
):
    store = OutboundStore(tmp_path / "outbound.sqlite", "process")
    store.in_flight([(1, 7, 1)])  # what a version that tracked QoS 0 left behind at a kill
    store.commit()
    store.close()
    ref, client, _, ledger = forwarder(qos=0)
    ref.tell(PackSealed(Pack(1, (record(1), record(2)))))
    (report,) = ledger.wait_for(1)
    assert report.done == (1, 2)
    assert client.published_keys() == ["k2"]  # k1 went out before the restart: at most once


# -- Message expiry: the remaining interval on every send, never an expired re-send -------------


def test_a_resend_after_a_reconnect_carries_the_remaining_expiry_interval(forwarder):
    ref, client, clock, _ = forwarder(processing_timeout=600.0)
    ref.tell(PackSealed(Pack(1, (record(1, expires_at=clock.wall() + 60),))))
    (first,) = client.wait_sent(1)
    assert first[4:] == (False, 60)
    clock.advance(25.0)
    ref.tell(SessionStarted(2, True, 65535))
    (resent,) = client.wait_sent(2)[1:]
    assert resent[1:] == ("k1", first[2], 1, True, 35)


def test_a_resend_after_a_restart_carries_the_remaining_expiry_interval(forwarder):
    clock = SimulatedClock()
    expires_at = clock.wall() + 60
    ref, client, _, _ = forwarder(clock=clock)
    ref.tell(PackSealed(Pack(1, (record(1, expires_at=expires_at),))))
    client.wait_sent(1)
    ref.stop()
    later = SimulatedClock()
    later.advance(10.0)
    again, client, _, _ = forwarder(clock=later)
    again.tell(PackSealed(Pack(1, (record(1, expires_at=expires_at),))))
    (resent,) = client.wait_sent(1)
    assert resent[1:] == ("k1", resent[2], 1, True, 50)


@pytest.mark.parametrize("qos", [1, 2])
def test_a_message_that_expired_in_flight_is_dead_lettered_not_sent_again(forwarder, qos):
    ref, client, clock, ledger = forwarder(qos=qos, processing_timeout=600.0)
    ref.tell(PackSealed(Pack(1, (record(1, expires_at=clock.wall() + 30), record(2)))))
    sent = client.wait_sent(2)
    clock.advance(40.0)
    ref.tell(SessionStarted(2, True, 65535))
    resent = client.wait_sent(3)[2:]
    assert [(s[1], s[4]) for s in resent] == [("k2", True)]  # k1 expired while in flight
    packet_id = sent[1][2]
    if qos == 1:
        ref.tell(OutboundAck(2, packet_id, AckType.PUBACK, 0, "Success"))
    else:
        ref.tell(OutboundAck(2, packet_id, AckType.PUBREC, 0, "Success"))
        assert client.wait_sent(4)[3] == ("PUBREL", packet_id)
        ref.tell(OutboundAck(2, packet_id, AckType.PUBCOMP, 0, "Success"))
    (report,) = ledger.wait_for(1)
    assert report.dead == ((1, "expired"),) and report.done == (2,)
    assert client.published_keys() == ["k1", "k2", "k2"]


def test_a_refusing_pubrec_for_a_released_packet_is_no_refusal_and_nothing_is_published_again(
    forwarder,
):
    """Measured with Mochi 2.7.9 after a reconnect: its stored PUBREC 0x00 for the id, then, for
    fxgate's DUP re-send of the same PUBLISH, PUBREC 0x91 (packet identifier in use), then
    PUBCOMP. The exchange completes once; the 0x91 is no refusal to retry under a new id."""
    ref, client, clock, ledger = forwarder(qos=2, processing_timeout=20.0)
    ref.tell(PackSealed(Pack(1, (record(1),))))
    (first,) = client.wait_sent(1)
    packet_id = first[2]
    ref.tell(SessionStarted(2, True, 65535))
    client.wait_sent(2)  # the DUP re-send after the reconnect
    ref.tell(OutboundAck(2, packet_id, AckType.PUBREC, 0, "Success"))
    assert client.wait_sent(3)[2] == ("PUBREL", packet_id)
    ref.tell(OutboundAck(2, packet_id, AckType.PUBREC, 0x91, "Packet identifier in use"))
    ref.tell(OutboundAck(2, packet_id, AckType.PUBCOMP, 0, "Success"))
    (report,) = ledger.wait_for(1)
    assert report.done == (1,) and report.dead == ()
    clock.advance(40.0)  # past the pack's retry: nothing is published again
    ref.proxy().status().get(timeout=5)
    assert client.published_keys() == ["k1", "k1"]
    assert [s[4] for s in client.sent if s[0] == "PUBLISH"] == [False, True]


def test_an_ack_that_comes_before_its_connections_session_started_is_kept_for_it(forwarder):
    """Acks come straight from the network thread, the new session through the connection
    actor: Mochi's stored PUBREC, sent at once after its CONNACK, reached the ledger first, was
    dropped as another connection's, and its 0x91 for the DUP re-send then looked like a
    refusal (the read went out again under a new id). Kept, the PUBREC completes the exchange."""
    ref, client, clock, ledger = forwarder(qos=2, processing_timeout=20.0)
    ref.tell(PackSealed(Pack(1, (record(1),))))
    (first,) = client.wait_sent(1)
    packet_id = first[2]
    ref.tell(OutboundAck(2, packet_id, AckType.PUBREC, 0, "Success"))  # before its session
    ref.tell(SessionStarted(2, True, 65535))
    ref.tell(OutboundAck(2, packet_id, AckType.PUBREC, 0x91, "Packet identifier in use"))
    sent = client.wait_sent(2)
    assert sent[1][:2] == ("PUBREL", packet_id)  # no PUBLISH again: the broker has it
    ref.tell(OutboundAck(2, packet_id, AckType.PUBCOMP, 0, "Success"))
    (report,) = ledger.wait_for(1)
    assert report.done == (1,) and report.dead == ()
    clock.advance(40.0)
    ref.proxy().status().get(timeout=5)
    assert client.published_keys() == ["k1"]


# -- Order per reader after a refusal -----------------------------------------------------------


def test_after_a_refusal_a_readers_later_messages_wait_behind_its_retry(forwarder):
    pack = (record(1), record(2), record(3, READER_2), record(4), record(5))
    ref, client, clock, ledger = forwarder(receive_maximum=2)
    ref.tell(PackSealed(Pack(1, pack)))
    sent = client.wait_sent(2)
    ref.tell(OutboundAck(1, sent[0][2], AckType.PUBACK, 0, "Success"))
    ref.tell(OutboundAck(1, sent[1][2], AckType.PUBACK, 0x97, "Quota exceeded"))  # k2 refused
    # The window has room again: the other reader goes on, reader 1's k4 and k5 wait.
    (third,) = client.wait_sent(3)[2:]
    assert third[1] == "k3"
    ref.tell(OutboundAck(1, third[2], AckType.PUBACK, 0, "Success"))
    ref.proxy().status().get(timeout=5)
    assert client.published_keys() == ["k1", "k2", "k3"]
    clock.advance(20.0)  # the pack's retry: k2 first, then what waited behind it
    client.wait_sent(5)
    for packet_id in [s[2] for s in client.sent[3:5]]:
        ref.tell(OutboundAck(1, packet_id, AckType.PUBACK, 0, "Success"))
    client.wait_sent(6)
    ref.tell(OutboundAck(1, client.sent[5][2], AckType.PUBACK, 0, "Success"))
    (report,) = ledger.wait_for(1)
    assert sorted(report.done) == [1, 2, 3, 4, 5]
    reader_1 = [key for key in client.published_keys() if key != "k3"]
    assert reader_1 == ["k1", "k2", "k2", "k4", "k5"]


# -- Receive Maximum on re-sends ----------------------------------------------------------------


def test_a_retry_after_a_smaller_receive_maximum_sends_each_message_once_within_it(forwarder):
    ref, client, clock, _ = forwarder(receive_maximum=20)
    ref.tell(PackSealed(Pack(1, tuple(record(s) for s in range(1, 11)))))
    first = client.wait_sent(10)
    ref.tell(SessionStarted(2, session_present=True, receive_maximum=3))
    client.wait_sent(13)
    clock.advance(20.0)  # the pack times out with 3 on the wire and 7 held back by the window
    ref.proxy().status().get(timeout=5)
    # The three on the wire fill the broker's window: a copy of one would be a fourth PUBLISH
    # in flight there (HiveMQ CE counts each and disconnects with 0x93 past its maximum).
    assert len(client.sent) == 13
    # Each ack lets exactly one more go, oldest first, and none goes twice.
    for n, packet_id in enumerate([s[2] for s in first]):
        ref.tell(OutboundAck(2, packet_id, AckType.PUBACK, 0, "Success"))
        if n + 3 < 10:
            assert client.wait_sent(14 + n)[-1][2] == first[n + 3][2]
    ref.proxy().status().get(timeout=5)
    assert [s[2] for s in client.sent[10:]] == [s[2] for s in first]


def publishes(client):
    """(packet id, DUP) of each PUBLISH sent, in order (PUBRELs left out)."""
    return [(s[2], s[4]) for s in client.sent if s[0] == "PUBLISH"]


@pytest.mark.parametrize("qos", [1, 2])
def test_a_live_retry_never_sends_a_publish_or_a_pubrel_twice_on_one_connection(forwarder, qos):
    """HiveMQ CE counts a DUP of an id still in flight as one more PUBLISH in flight until the
    connection ends (it answers the id once), and disconnects with 0x93 past its Receive
    Maximum (measured: tests/brokers/test_hivemq_flow_control.py); MQTT 5 §4.4 allows a re-send
    of a PUBLISH or a PUBREL only after a reconnect [MQTT-4.4.0-1]."""
    ref, client, clock, _ = forwarder(qos=qos, receive_maximum=4)
    ref.tell(PackSealed(Pack(1, (record(1), record(2)))))
    first = [s[2] for s in client.wait_sent(2)]
    if qos == 2:
        ref.tell(OutboundAck(1, first[1], AckType.PUBREC, 0, "Success"))
        assert client.wait_sent(3)[2] == ("PUBREL", first[1])
    for _ in range(3):  # the window has room, yet no copy goes
        assert clock.wait_for_timers(1)
        clock.advance(20.0)
        ref.proxy().status().get(timeout=5)
    assert publishes(client) == [(first[0], False), (first[1], False)]
    live = len(client.sent)
    assert live == (3 if qos == 2 else 2)  # the PUBREL went once
    assert ref.proxy().status().get(timeout=5)["retries"] == 3
    # After a reconnect what is in flight goes again: the same ids, DUP on a PUBLISH (§4.4).
    ref.tell(SessionStarted(2, session_present=True, receive_maximum=4))
    ref.proxy().status().get(timeout=5)
    expected = [(first[0], True)] if qos == 2 else [(first[0], True), (first[1], True)]
    assert publishes(client)[2:] == expected
    if qos == 2:
        assert ("PUBREL", first[1]) in client.sent[live:]


# -- persist = false and QoS 0 routes are live only ---------------------------------------------


@pytest.mark.parametrize(
    ("route", "persist_qos0", "forwarded"),
    [
        (Route(0, "zebra/fx/+/reads", qos=1, persist=False), True, False),
        (Route(0, "zebra/fx/+/reads", qos=0), False, False),
        (Route(0, "zebra/fx/+/reads", qos=0), True, True),
        (Route(0, "zebra/fx/+/reads", qos=1), False, True),
    ],
)
def test_a_live_only_route_forwards_nothing_stored_before_the_start(route, persist_qos0, forwarded):
    outbound = Inbox()
    # Seqs 1-5 were stored by the run before; 6-8 by this one.
    ledger = FakeLedger(records_of(8))
    buffer = TierTwoBuffer.start(
        outbound, ledger, (route,), persist_qos0=persist_qos0, live_from_seq=6
    )
    try:
        ledger.connect(buffer)
        held = 8 if forwarded else 3
        assert wait_until(lambda: buffer.proxy().status().get(timeout=5)["tier2_messages"] == held)
        buffer.tell(Demand())
        (handed,) = outbound.wait_for(1)
        dead = [entry for r in reports(ledger) for entry in r.dead]
        status = buffer.proxy().status().get(timeout=5)
    finally:
        buffer.stop()
    if forwarded:
        assert [r.seq for r in handed.pack.records] == list(range(1, 9)) and dead == []
    else:
        assert [r.seq for r in handed.pack.records] == [6, 7, 8]
        assert dead == [(seq, RESTART_DROPPED) for seq in range(1, 6)]
        assert status["dropped_at_restart"] == 5


# -- on the wire: the real upstream client against the scripted fake broker ---------------------


@pytest.fixture
def wire(tmp_path):
    """The outbound ledger and the upstream connection actor with its real paho client, on a
    simulated clock, connected to a fake broker."""
    started = []

    def start(broker, qos=1, **options):
        clock = SimulatedClock()
        ledger = Inbox()
        options.setdefault("processing_timeout", 600.0)
        outbound = OutboundLedger.start(
            tmp_path / "outbound.sqlite",
            clock,
            ledger,
            (Route(0, "zebra/fx/+/reads", qos=qos),),
            "env",
            **options,
        )
        connection = ConnectionActor.start(
            settings(broker, name="upstream", client_id="fxgate-upstream-t", subscriptions=()),
            clock,
            outbound,
            client_factory=upstream_client_factory(outbound),
        )
        started.extend([connection, outbound])
        assert broker.wait_for(lambda b: b.clients, 15)
        return outbound, connection, clock, ledger

    yield start
    for ref in started:
        if ref.is_alive():
            ref.stop()


def reconnect(broker, connection, clock, seconds):
    """Drop the connection, let `seconds` pass on the clock (the backoff's first delay is at
    most 1.25 s), and wait for the new connection."""
    connects = len(broker.connects)
    broker.drop_clients()
    assert wait_until(lambda: connection.proxy().state().get(timeout=5).state == "waiting")
    clock.advance(seconds)
    assert broker.wait_for(lambda b: len(b.connects) > connects and b.clients, 15)


def test_on_the_wire_qos0_carries_no_packet_id_and_no_dup_and_goes_once_through_a_reconnect(
    wire,
):
    with FakeBroker() as broker:
        outbound, connection, clock, ledger = wire(broker, qos=0)
        outbound.tell(PackSealed(Pack(1, tuple(record(s) for s in range(1, 6)))))
        ledger.wait_for(1)
        assert broker.wait_for(lambda b: len(b.received) == 5, 10), broker.received
        reconnect(broker, connection, clock, 2.0)
        outbound.tell(PackSealed(Pack(2, tuple(record(s) for s in range(6, 9)))))
        ledger.wait_for(2)
        assert broker.wait_for(lambda b: len(b.received) >= 8, 10)
        outbound.proxy().status().get(timeout=5)
    got = [(r.payload, r.qos, r.dup, r.packet_id) for r in broker.received]
    assert got == [(b"x" * 20, 0, False, 0)] * 8
    keys = [dict(r.user_properties)["fxgate-key"] for r in broker.received]
    assert keys == [f"k{s}" for s in range(1, 9)]


def test_on_the_wire_a_resend_after_a_reconnect_carries_dup_the_same_id_and_the_time_left(wire):
    with FakeBroker() as broker:
        broker.hold_acks()
        outbound, connection, clock, _ = wire(broker, qos=1)
        expires_at = clock.wall() + 60
        outbound.tell(PackSealed(Pack(1, (record(1, expires_at=expires_at), record(2)))))
        assert broker.wait_for(lambda b: len(b.received) == 2, 10)
        reconnect(broker, connection, clock, 25.0)
        assert broker.wait_for(lambda b: len(b.received) == 4, 10)
    first, second = broker.received[:2], broker.received[2:]
    assert [(r.dup, r.message_expiry) for r in first] == [(False, 60), (False, None)]
    assert [(r.dup, r.message_expiry) for r in second] == [(True, 35), (True, None)]
    assert [r.packet_id for r in second] == [r.packet_id for r in first]


def test_on_the_wire_a_refused_message_goes_again_before_its_readers_later_ones(wire):
    with FakeBroker() as broker:
        broker.receive_maximum = 2
        broker.reply_publish([0x00, 0x97])  # the second PUBLISH is refused: quota exceeded
        outbound, _, clock, ledger = wire(broker, qos=1, processing_timeout=20.0)
        pack = (record(1), record(2), record(3, READER_2), record(4), record(5))
        outbound.tell(PackSealed(Pack(1, pack)))
        assert broker.wait_for(lambda b: len(b.received) == 3, 10)  # k1, k2 (refused), k3
        assert wait_until(lambda: outbound.proxy().status().get(timeout=5)["in_flight"] == 0)
        assert len(broker.received) == 3  # k4 and k5 wait behind k2
        assert clock.wait_for_timers(1)
        clock.advance(20.0)
        (report,) = ledger.wait_for(1)
    assert sorted(report.done) == [1, 2, 3, 4, 5]
    keys = [dict(r.user_properties)["fxgate-key"] for r in broker.received]
    assert [k for k in keys if k != "k3"] == ["k1", "k2", "k2", "k4", "k5"]


def test_on_the_wire_a_retry_after_a_smaller_receive_maximum_stays_within_it(wire):
    with FakeBroker() as broker:
        broker.receive_maximum = 20
        broker.hold_acks()
        outbound, connection, clock, ledger = wire(broker, qos=1, processing_timeout=20.0)
        outbound.tell(PackSealed(Pack(1, tuple(record(s) for s in range(1, 11)))))
        assert broker.wait_for(lambda b: len(b.received) == 10, 10)
        broker.receive_maximum = 3  # the broker comes back with a smaller Receive Maximum
        reconnect(broker, connection, clock, 2.0)
        assert broker.wait_for(lambda b: len(b.received) == 13, 10)
        assert clock.wait_for_timers(1)
        clock.advance(20.0)  # the pack's retry: the three on the wire fill the window
        assert outbound.proxy().status().get(timeout=5)["in_flight"] == 10
        # A copy would be one PUBLISH too many in flight (HiveMQ CE: DISCONNECT 0x93): none
        # comes before the seven the acks let go (below).
        broker.release_acks()
        (report,) = ledger.wait_for(1)
    assert sorted(report.done) == list(range(1, 11))
    ids = [r.packet_id for r in broker.received]
    assert ids[10:13] == ids[:3]
    assert sorted(ids[13:]) == sorted(ids[3:10])  # the other seven once each, after the acks


# -- through the gateway: a live-only route across a restart ------------------------------------


@pytest.mark.broker
@pytest.mark.spark
def test_a_persist_false_route_lands_every_read_but_forwards_none_stored_before_a_restart(
    mosquitto_factory, spark_session, tmp_path
):
    source, upstream = mosquitto_factory(), mosquitto_factory()
    upstream.stop()  # the upstream is away: the reads wait in tier 2, in memory
    environ = forwarding_environ(
        source, upstream, tmp_path / "data", qos=1, FXGATE__ROUTES__0__PERSIST="false"
    )
    config = load_config(None, environ=environ, hostname="gw-test")

    def start():
        clock = RealClock()
        gateway = Supervisor(config, clock, session_factory=lambda: spark_session)
        gateway.start()
        assert source.wait_for_output("fxgate-local-gw-test-gw-test 2 zebra/fx/+/reads", 15)
        return gateway, clock

    gateway, clock = start()
    try:
        before = simulate(source.host, source.port, readers=1, rate=0, count=30, qos=1)
        assert gateway.wait_for_landed(30, timeout=60)
    finally:
        gateway.stop()
        clock.close()

    upstream.start()
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    gateway, clock = start()
    try:
        assert gateway.wait_for_landed(0, dead_letters=30, timeout=60)
        status = gateway.status()
        live = simulate(source.host, source.port, readers=1, rate=0, count=5, qos=1, seed=1)
        messages = cloud.wait_for(5)
        assert gateway.wait_for_landed(5, dead_letters=30, timeout=60)
    finally:
        gateway.stop()
        clock.close()
        cloud.close()
    keys = [dict(props)["fxgate-key"] for _, _, props in messages]
    assert keys == [r.message_key for r in live.published]
    assert cloud.qos_seen == {0}
    tables = config.spark.tables_path(config.gateway.data_path)
    dropped = load_dead_letters(tables, reason=RESTART_DROPPED)
    assert sorted(d.message_key.removesuffix("/upstream") for d in dropped) == sorted(
        r.message_key for r in before.published
    )
    assert {d.sink for d in dropped} == {"upstream"}
    assert status["buffer"]["dropped_at_restart"] == 30
    # Up at the route's QoS 0; in the table with the QoS each read arrived with (DESIGN §7.3).
    rows = read_table(spark_session, tables, READS).select("qos").distinct().collect()
    assert [row["qos"] for row in rows] == [1]


def test_on_the_wire_a_puback_with_a_reason_code_mqtt5_does_not_define_is_a_success(wire):
    """Mochi MQTT 2.7.9 answers every QoS 1 PUBLISH with PUBACK 0x01, a code MQTT 5 defines
    for no PUBACK: paho's ReasonCode raised for it on the network thread, which died, and
    nothing went upstream any more while the connection still looked up."""
    with FakeBroker() as broker:
        broker.reply_publish([0x01, 0x01])
        outbound, _, _, ledger = wire(broker, qos=1)
        outbound.tell(PackSealed(Pack(1, (record(1), record(2)))))
        (first,) = ledger.wait_for(1)
        outbound.tell(PackSealed(Pack(2, (record(3),))))
        second = ledger.wait_for(2)[1]
    assert sorted(first.done) == [1, 2] and first.dead == ()
    assert second.done == (3,)
    assert len(broker.received) == 3
