"""Whose QoS 2 state a graceful broker restart loses, seen on the wire (issue 34, item 4).

Every connection goes through a recording FaultProxy (tests/harness/proxy.py), which keeps each
MQTT packet both ways: type, packet id, DUP, reason code and the `fxgate-key` user property. A
QoS 2 exchange (MQTT 5 §4.3.3) is followed per session (client id, packet id) across
connections; after a reconnect with a session present both sides re-send, with the original
packet ids, what is unacknowledged: a PUBLISH not yet PUBRECed, a PUBREL not yet PUBCOMPed
[MQTT-4.4.0-1]. Measured with each broker as the harness starts it:

- HiveMQ CE 2025.5 loses its *inbound* state: the packet ids of the QoS 2 PUBLISHes it received
  from a client and was not yet sent PUBREL for. It keeps them on the heap only
  (IncomingMessageFlowInMemoryLocalPersistence; PublishFlowHandler answers a PUBLISH whose id it
  finds there with PUBREC and delivers nothing, else it delivers), while the message itself sits
  in the subscribers' persistent queues. fxgate PUBLISHes that reached HiveMQ during its stop,
  and that it queued for the cloud subscriber without answering PUBREC, are re-sent after the
  restart with DUP and the same packet id, as they must be [MQTT-4.4.0-1]; HiveMQ takes each for
  a new message and queues it again, against [MQTT-4.3.3-10]. The subscriber gets it twice, in
  two exchanges, both after the restart. A reconnect without a restart keeps the ids.
- Mochi MQTT 2.7.9 loses its *outbound* state towards the subscriber. On PUBREC it replaces the
  in-flight PUBLISH with a PUBREL in memory only (server.go processPubrec: Inflight.Set, no
  storage hook), so its store still holds the PUBLISH; after the restart it re-sends that
  PUBLISH, DUP and same packet id, for an exchange the subscriber had PUBRECed and been sent
  PUBREL for, against [MQTT-4.3.3-5]. A subscriber that has completed its side (paho delivers at
  PUBREL) takes it for a new message [MQTT-4.3.3-12]. Its inbound state survives (stored before
  the PUBREC leaves): a DUP re-send is answered PUBREC 0x91 "Packet Identifier in use", after
  the successful PUBREC it re-sends from the session itself.
- mosquitto 2.0.11 keeps both sides.

fxgate re-sends as it must: a PUBLISH only while no PUBREC had reached it, with DUP and the same
id; after a PUBREC, the PUBREL. Until this was found it dropped the stored PUBREC Mochi sends at
once after its CONNACK (it reached the outbound ledger before the new session did, and looked
like another connection's), took the PUBREC 0x91 that answers its DUP re-send for a refusal, and
RETRY_ALL published the read again under a new packet id: a duplicate at the subscriber (one
read in one run). Early acks are now kept for their connection and a refusing PUBREC for a
released packet is ignored (actors/outbound.py); the gateway test below requires no re-publish.

Two losses seen on the way, each a broker's: HiveMQ at its shipped queue of 1,000 drops the
newest reads queued for the subscriber and still completes the publisher's exchange (so the
queue here is longer); Mochi never delivers QoS 2 reads it takes while the subscriber's session
is between a CONNECT and its CONNACK (taken over by its reconnect), PUBCOMP all the same.

The first test plays the exchanges by hand, one message per side, so that the finding does not
hang on timing. The second drives them with the gateway, as tests/brokers/test_core_guarantees.py
does (scenario 1, RESTART_QOS2), and checks the shape of whatever duplicates the restarts made.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from actors.devtools.broker_kinds import shipped
from actors.mqtt.upstream import IDEMPOTENCY_PROPERTY
from tests.actors.test_several_gateways import Publishing
from tests.harness.daemon import gateway_env
from tests.harness.fake_broker import (
    CONNECT,
    PINGREQ,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SESSION_EXPIRY_INTERVAL,
    SUBSCRIBE,
    USER_PROPERTY,
    ack_packet,
    encode_packet,
    encode_properties,
    encode_text,
)
from tests.harness.mqtt import Collector
from tests.harness.proxy import DOWN, UP, FaultProxy, MqttPacket

pytestmark = [pytest.mark.broker, pytest.mark.slow]

TIMEOUT = 20.0
# How long a delivery that should not come is waited for.
QUIET = 1.5
QOS2_PACKETS = ("PUBLISH", "PUBREC", "PUBREL", "PUBCOMP")


# -- exchanges on the wire ----------------------------------------------------------------------


@dataclass
class Exchange:
    """One QoS 2 exchange of one session, as the proxy saw it, across that session's
    connections. `sender` is the direction its PUBLISH went: UP from a client, DOWN from the
    broker."""

    client_id: str
    sender: str
    packet_id: int
    key: str | None
    packets: list[MqttPacket] = field(default_factory=list)

    def _acks(self, kind: str) -> list[MqttPacket]:
        return [p for p in self.packets if p.kind == kind and p.direction != self.sender]

    @property
    def publishes(self) -> list[MqttPacket]:
        return [p for p in self.packets if p.kind == "PUBLISH"]

    @property
    def started(self) -> float:
        return self.packets[0].at

    @property
    def _refusals(self) -> bool:
        return any(p.reason_code >= 0x80 for p in self._acks("PUBREC"))

    @property
    def _acceptances(self) -> bool:
        return any(p.reason_code < 0x80 for p in self._acks("PUBREC") + self._acks("PUBCOMP"))

    @property
    def refused(self) -> bool:
        """The receiver answered with a PUBREC >= 0x80 and nothing else: it did not take it."""
        return self._refusals and not self._acceptances

    @property
    def contradicted(self) -> bool:
        """A PUBREC >= 0x80 besides a successful PUBREC or PUBCOMP. Mochi answers a DUP
        re-send of an id it holds with PUBREC 0x91 "Packet Identifier in use", after the
        successful PUBREC it re-sends from the session at the reconnect; then PUBCOMP 0x00."""
        return self._refusals and self._acceptances

    @property
    def republished_after_pubrec(self) -> bool:
        """The sender sent the PUBLISH again on a later connection than one a successful PUBREC
        had reached it over: against [MQTT-4.3.3-5], after a PUBREC the exchange goes on with
        PUBREL. (On the connection itself a late PUBREC may cross a re-send that is right.)"""
        recs = [p.connection for p in self._acks("PUBREC") if p.reason_code < 0x80]
        return bool(recs) and any(p.connection > min(recs) for p in self.publishes)

    @property
    def resent_with_dup(self) -> list[MqttPacket]:
        return [p for p in self.publishes[1:] if p.dup]


def client_ids(packets: list[MqttPacket]) -> dict[int, str]:
    return {p.connection: p.client_id for p in packets if p.kind == "CONNECT"}


def exchanges(packets: list[MqttPacket]) -> list[Exchange]:
    """Every QoS 2 exchange in the record. A PUBLISH without DUP starts one; a PUBLISH with DUP
    goes on with the session's last exchange under that packet id if it carried the same
    message (whatever state it had reached: re-sending it after PUBREC is the sender's fault,
    see `republished_after_pubrec`), else starts one; acks and PUBREL join the last exchange."""
    owners = client_ids(packets)
    last: dict[tuple[str, str, int], Exchange] = {}
    found: list[Exchange] = []
    for packet in packets:
        if packet.kind not in QOS2_PACKETS or (packet.kind == "PUBLISH" and packet.qos != 2):
            continue
        client_id = owners[packet.connection]
        if packet.kind in ("PUBLISH", "PUBREL"):
            sender = packet.direction
        else:
            sender = DOWN if packet.direction == UP else UP
        slot = (client_id, sender, packet.packet_id)
        exchange = last.get(slot)
        if packet.kind == "PUBLISH":
            key = packet.user_property(IDEMPOTENCY_PROPERTY)
            if exchange is None or not packet.dup or exchange.key != key:
                exchange = Exchange(client_id, sender, packet.packet_id, key)
                last[slot] = exchange
                found.append(exchange)
        elif exchange is None:
            continue  # an ack for an exchange that began before the record
        exchange.packets.append(packet)
    return found


def delivered(packets: list[MqttPacket], client_id: str, key: str) -> list[Exchange]:
    """The broker's exchanges carrying `key` to `client_id`."""
    return [
        e
        for e in exchanges(packets)
        if e.client_id == client_id and e.sender == DOWN and e.key == key
    ]


# -- the exchanges by hand ------------------------------------------------------------------------


class ProbeClient:
    """One MQTT 5 session by hand, through the recording proxy. It reads nothing: the record
    says what the broker sent it. So an ack written to it was never *received*, as for a client
    whose link died first, and it may re-send its PUBLISH after a reconnect."""

    def __init__(self, proxy: FaultProxy, client_id: str) -> None:
        self.proxy = proxy
        since = time.monotonic()
        self.sock = socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT)
        body = encode_text("MQTT") + bytes([5, 0]) + (60).to_bytes(2, "big")  # clean start 0
        properties = encode_properties([(SESSION_EXPIRY_INTERVAL, 3600)])
        self.sock.sendall(encode_packet(CONNECT, 0, body + properties + encode_text(client_id)))
        connect = self._wait(
            lambda p: p.kind == "CONNECT" and p.client_id == client_id and p.at >= since
        )
        self.connection = connect.connection
        self.connack = self.expect("CONNACK")

    def _wait(self, predicate, timeout: float = TIMEOUT) -> MqttPacket:
        found = self.proxy.wait_for_packet(predicate, timeout)
        assert found is not None, "\n".join(str(p) for p in self.proxy.packets[-30:])
        return found

    def expect(
        self,
        kind: str,
        packet_id: int | None = None,
        key: str | None = None,
        after: float = 0.0,
        timeout: float = TIMEOUT,
    ) -> MqttPacket | None:
        """The first packet of `kind` the broker sent this connection (after `after`), waiting
        for it; with a timeout of QUIET, None if none came."""

        def wanted(p: MqttPacket) -> bool:
            return (
                p.connection == self.connection
                and p.direction == DOWN
                and p.kind == kind
                and p.at > after
                and (packet_id is None or p.packet_id == packet_id)
                and (key is None or p.user_property(IDEMPOTENCY_PROPERTY) == key)
            )

        if timeout <= QUIET:
            return self.proxy.wait_for_packet(wanted, timeout)
        return self._wait(wanted, timeout)

    def subscribe(self, topic_filter: str) -> None:
        body = (1).to_bytes(2, "big") + encode_properties([]) + encode_text(topic_filter)
        self.sock.sendall(encode_packet(SUBSCRIBE, 0b0010, body + bytes([2])))
        self.expect("SUBACK", 1)

    def publish(self, packet_id: int, key: str, dup: bool = False) -> float:
        properties = encode_properties([(USER_PROPERTY, (IDEMPOTENCY_PROPERTY, key))])
        # A topic per message: HiveMQ holds a QoS 1/2 message while one on its topic is in
        # flight to the subscriber (OrderedTopicService).
        body = encode_text(f"probe/{key}") + packet_id.to_bytes(2, "big") + properties + b"x"
        sent = time.monotonic()
        self.sock.sendall(encode_packet(PUBLISH, 2 << 1 | (0x08 if dup else 0), body))
        return sent

    def ack(self, kind: int, packet_id: int) -> None:
        self.sock.sendall(ack_packet(kind, packet_id, 0))

    def complete(self, packet_id: int, after: float = 0.0) -> None:
        """The subscriber's side of an exchange the broker began: PUBREC, then PUBCOMP."""
        self.ack(PUBREC, packet_id)
        self.expect("PUBREL", packet_id, after=after)
        self.ack(PUBCOMP, packet_id)

    def settle(self) -> None:
        """A PINGREQ answered: the broker has handled everything sent before it."""
        since = time.monotonic()
        self.sock.sendall(bytes([PINGREQ << 4, 0]))
        self.expect("PINGRESP", after=since)

    def close(self) -> None:
        self.sock.close()


@dataclass(frozen=True)
class Kept:
    """What a broker does after its graceful restart with each side of a QoS 2 exchange."""

    # Inbound: copies the subscriber got of a message whose publisher re-sent it (DUP, same id)
    # after the restart, the broker having PUBRECed it before: 1 if the broker kept the id.
    copies_after_a_dup: int
    # Outbound: what the broker re-sends for an exchange its subscriber had PUBRECed and been
    # sent PUBREL for, PUBCOMP still owed: PUBREL if it kept the state.
    resent_to_the_subscriber: str


KEPT = Kept(copies_after_a_dup=1, resent_to_the_subscriber="PUBREL")
# After a graceful restart; after the clients' reconnects alone every broker keeps both sides.
MEASURED = {
    "mosquitto": KEPT,
    "hivemq": Kept(copies_after_a_dup=2, resent_to_the_subscriber="PUBREL"),
    "mochi": Kept(copies_after_a_dup=1, resent_to_the_subscriber="PUBLISH"),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("restart", [True, False], ids=["restart", "reconnect"])
@pytest.mark.parametrize("kind", sorted(MEASURED))
def test_each_side_of_a_qos2_exchange_survives_a_reconnect_and_a_graceful_restart_as_measured(
    kind, restart, broker_factory
):
    broker = broker_factory(kind)
    with FaultProxy(broker.host, broker.port, record=True) as proxy:
        subscriber = ProbeClient(proxy, "probe-sub")
        subscriber.subscribe("probe/#")
        publisher = ProbeClient(proxy, "probe-pub")

        # Inbound: "in" is PUBRECed to a publisher that never reads it, so never sends PUBREL.
        # HiveMQ and Mochi deliver at PUBLISH (the subscriber completes that exchange);
        # mosquitto at PUBREL, so after the restart.
        publisher.publish(2, "in")
        publisher.expect("PUBREC", 2)
        first = subscriber.expect("PUBLISH", key="in", timeout=QUIET)
        assert (first is not None) == (kind != "mosquitto")
        if first is not None:
            subscriber.complete(first.packet_id)

        # Outbound: "out" reaches the subscriber, which PUBRECs it and holds its PUBCOMP.
        # (Not before "in": HiveMQ sends a subscriber nothing more while an exchange is open.)
        publisher.publish(1, "out")
        publisher.expect("PUBREC", 1)
        publisher.ack(PUBREL, 1)
        publisher.expect("PUBCOMP", 1)
        out = subscriber.expect("PUBLISH", key="out")
        subscriber.ack(PUBREC, out.packet_id)
        subscriber.expect("PUBREL", out.packet_id)
        subscriber.settle()

        if restart:
            broker.stop()
        # Unread acks in their buffers: the broker sees both connections reset, as by a crash.
        subscriber.close()
        publisher.close()
        if restart:
            broker.start()

        subscriber = ProbeClient(proxy, "probe-sub")
        assert subscriber.connack.session_present
        resent = proxy.wait_for_packet(
            lambda p: (
                p.connection == subscriber.connection
                and p.direction == DOWN
                and p.packet_id == out.packet_id
                and p.kind in ("PUBREL", "PUBLISH")
            ),
            TIMEOUT,
        )
        assert resent is not None, "the broker re-sent nothing of the exchange cut"
        # Completed, so that nothing holds what comes next.
        if resent.kind == "PUBLISH":
            subscriber.complete(out.packet_id, after=resent.at)
        else:
            subscriber.ack(PUBCOMP, out.packet_id)
        publisher = ProbeClient(proxy, "probe-pub")
        assert publisher.connack.session_present
        # It never received the PUBREC: the PUBLISH again, DUP, same id [MQTT-4.4.0-1].
        again = publisher.publish(2, "in", dup=True)
        publisher.expect("PUBREC", 2, after=again)
        publisher.ack(PUBREL, 2)
        publisher.expect("PUBCOMP", 2)
        # A copy made of the DUP is on its way by now (HiveMQ, Mochi: at PUBLISH; mosquitto at
        # PUBREL); one more QUIET for it.
        subscriber.expect("PUBLISH", key="in", after=again, timeout=QUIET)
        subscriber.close()
        publisher.close()
        packets = proxy.packets

    copies = delivered(packets, "probe-sub", "in")
    out_exchanges = delivered(packets, "probe-sub", "out")
    print(kind, *(str(p) for p in packets), sep="\n  ")
    found = Kept(len(copies), resent.kind)
    if resent.kind == "PUBLISH":
        # The same message again, DUP and the same id, although the subscriber had PUBRECed it.
        assert resent.dup and resent.user_property(IDEMPOTENCY_PROPERTY) == "out"
        assert [e.republished_after_pubrec for e in out_exchanges] == [True]
    if len(copies) > 1:
        # Two exchanges, each a new message (no DUP), the second after the publisher's DUP.
        assert all(not e.publishes[0].dup for e in copies)
        assert copies[-1].started > again
    assert found == (MEASURED[kind] if restart else KEPT)


# -- the gateway through graceful restarts ------------------------------------------------------

# Why a read went upstream twice or reached the cloud subscriber twice.
FXGATE_RETRY_AFTER_0X91 = "fxgate: a new packet id after PUBREC 0x91 on a completed exchange"
FXGATE_OTHER = "fxgate: two packet ids, or a PUBLISH again after a PUBREC"
# What explains a read twice at the cloud subscriber, per broker: the state it loses (the test
# above). fxgate's answer to Mochi's PUBREC 0x91 (FXGATE_RETRY_AFTER_0X91) was one until it
# ignored a refusing PUBREC for a released packet.
KNOWN = {
    "hivemq": {"broker inbound"},
    "mochi": {"broker outbound"},
}
# Restarts per run: HiveMQ takes about 10 s for one, Mochi a fraction of a second. Measured: of
# five runs HiveMQ made duplicates in three (3, 9, 17 reads), Mochi in every one (11 to 31).
ROUNDS = {"hivemq": 2, "mochi": 3}
# Measured with Mochi 2.7.9: QoS 2 reads it PUBRECed and PUBCOMPed while the cloud subscriber
# reconnected (CONNECT sent, CONNACK not yet) never reached it, nor its next connections (7 to
# 19 in four of five runs); HiveMQ, its queue long enough, lost none.
LOSES_DURING_TAKEOVER = {"hivemq": False, "mochi": True}
# The readers publish all at once: the gateway's backlog keeps its window upstream full at each
# restart (at a steady 600 msg/s, one run of two HiveMQ restarts cut no exchange).
PER_READER = 1500
CLOUD = "cloud"


def forwarding_through(proxy: FaultProxy, source, data: Path) -> dict[str, str]:
    return {
        **gateway_env(source, data),
        "FXGATE__SOURCE__INSTANCE_ID": "gw",
        "FXGATE__UPSTREAM__HOST": proxy.host,
        "FXGATE__UPSTREAM__PORT": str(proxy.port),
        "FXGATE__UPSTREAM__RECONNECT_MIN_DELAY_SECONDS": "0.2",
        "FXGATE__UPSTREAM__RECONNECT_MAX_DELAY_SECONDS": "1.0",
        # A pack's retry after 3 s instead of 20: were fxgate to take Mochi's PUBREC 0x91 for a
        # refusal again, its re-publish would come within the run.
        "FXGATE__PACKS__PROCESSING_TIMEOUT_SECONDS": "3",
        "FXGATE__ROUTES__0__SOURCE": "zebra/fx/+/reads",
        "FXGATE__ROUTES__0__TARGET": "cloud/{environment}/{reader}",
        "FXGATE__ROUTES__0__QOS": "2",
    }


def fxgate_fault(up: list[Exchange]) -> str | None:
    """What fxgate did wrong with one read's upstream exchanges, if anything. RETRY_ALL sends a
    refused read anew under a new packet id (the broker did not take it); any other read must
    go up in one exchange, its PUBLISH re-sent only while no PUBREC had reached fxgate."""
    if any(e.republished_after_pubrec for e in up):
        return FXGATE_OTHER
    earlier = [e for e in up[:-1] if not e.refused]
    if not earlier:
        return None
    if all(e.contradicted for e in earlier):
        return FXGATE_RETRY_AFTER_0X91
    return FXGATE_OTHER


def whose(found: list[Exchange], upstream_id: str) -> str:
    """Which side's lost state (or fault) explains a read the cloud subscriber got twice, from
    the exchanges that carried it."""
    up = [e for e in found if e.client_id == upstream_id and e.sender == UP]
    cloud = [e for e in found if e.client_id == CLOUD and e.sender == DOWN]
    fault = fxgate_fault(up)
    if fault is not None:
        return fault
    if any(e.republished_after_pubrec for e in cloud):
        return "broker outbound"
    sent = [e for e in up if not e.refused]
    if (
        len(sent) == 1
        and sent[0].resent_with_dup
        and len(cloud) >= 2
        and all(not e.publishes[0].dup for e in cloud)
        and cloud[-1].started > sent[0].resent_with_dup[0].at
    ):
        return "broker inbound"
    return "unexplained"


def fxgate_faults(by_key: dict[str, list[Exchange]], upstream_id: str) -> dict[str, str]:
    """fxgate_fault of every read that went upstream, where there is one."""
    faults = {
        key: fxgate_fault([e for e in found if e.client_id == upstream_id and e.sender == UP])
        for key, found in by_key.items()
    }
    return {key: fault for key, fault in faults.items() if fault is not None}


def by_key(packets: list[MqttPacket]) -> dict[str, list[Exchange]]:
    """The exchanges that carried each `fxgate-key`, on every connection."""
    found: dict[str, list[Exchange]] = {}
    for exchange in exchanges(packets):
        if exchange.key is not None:
            found.setdefault(exchange.key, []).append(exchange)
    return found


def story(found: list[Exchange], owners: dict[int, str]) -> str:
    lines = [f"{p.at:.3f} {owners[p.connection]:<8.8} {p}" for e in found for p in e.packets]
    return "\n".join(sorted(lines))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(KNOWN))
def test_reads_a_gateway_forwards_through_graceful_restarts_come_twice_only_where_the_broker_lost_state(  # noqa: E501
    kind, broker_factory, daemon_factory, tmp_path
):
    source = broker_factory("mosquitto")  # the readers' side, undisturbed by the restarts
    # A queue that holds what is published during a restart: at HiveMQ's shipped 1,000 it
    # dropped the newest reads for the cloud subscriber (48 in one run), PUBCOMP all the same.
    upstream = broker_factory(kind, **shipped(kind, queue=4 * PER_READER))
    proxy = FaultProxy(upstream.host, upstream.port, record=True)
    proxy.start()
    cloud = Collector(proxy.host, proxy.port, "cloud/#", qos=2, client_id=CLOUD)
    cloud.client.reconnect_delay_set(0.2, 1.0)
    try:
        daemon = daemon_factory(forwarding_through(proxy, source, tmp_path / "data"))
        daemon.wait_for_log(r"source: subscribed to", timeout=120)
        publishing = Publishing()
        publishing.start(
            "live", host=source.host, port=source.port, readers=2, rate=0, count=PER_READER
        )
        restarts = 0
        for round_ in range(ROUNDS[kind]):
            cloud.wait_for(300 + 500 * round_, timeout=60)  # forwarding, window full
            upstream.stop()
            upstream.start()
            restarts += 1
        results = publishing.join(timeout=120)
        wanted = {record.message_key for result in results for record in result.published}
        wait_for_keys(cloud, wanted)  # or what never comes is looked at below
        assert daemon.terminate() == 0, daemon.output()[-4000:]
    finally:
        cloud.close()
        proxy.close()
        (tmp_path / f"{kind}.log").write_text(upstream.output())
    packets = proxy.packets
    owners = client_ids(packets)
    (tmp_path / "wire.txt").write_text(
        "\n".join(f"{p.at:.3f} {owners[p.connection]} {p}" for p in packets)
    )
    got = Counter(props[IDEMPOTENCY_PROPERTY] for _, _, props in cloud.messages)
    (upstream_id,) = {c for c in owners.values() if c != CLOUD}
    carried = by_key(packets)
    faults = fxgate_faults(carried, upstream_id)
    # fxgate's side of every exchange is as MQTT 5 §4.4 asks, whatever the broker lost.
    assert faults == {}, faults
    # A read that never came: fxgate's exchange for it must have ended in a successful PUBCOMP,
    # the broker's word that it took it.
    lost = sorted(wanted - set(got))
    assert all(completed_upstream(carried.get(key, []), upstream_id) for key in lost), lost
    if lost:
        # Measured with Mochi only: most were taken (PUBREC to fxgate) while the cloud
        # subscriber's session was between a CONNECT and its CONNACK, taken over by its
        # reconnect; one run lost one taken just before that CONNECT. The broker's word that it
        # took each (the PUBCOMP above) is what makes it the broker's loss; the windows are told.
        stories = "\n\n".join(story(carried[key], owners) for key in lost)
        assert LOSES_DURING_TAKEOVER[kind], stories
        windows = takeovers(packets, CLOUD)
        within = sum(
            any(start < taken(carried[key], upstream_id) < end for start, end in windows)
            for key in lost
        )
        print(f"{kind}: {within} of {len(lost)} lost read(s) taken during a takeover")
    twice = sorted(key for key, count in got.items() if count > 1)
    assert all(got[key] == 2 for key in twice), Counter(got.values())
    shapes = Counter(whose(carried[key], upstream_id) for key in twice)
    print(f"{kind}: {restarts} restarts, {len(got)} reads, twice: {dict(shapes)}, lost {lost}")
    for key in twice[:2] + lost[:2]:
        print(story(carried[key], owners), end="\n\n")
    assert set(shapes) <= KNOWN[kind], "\n\n".join(story(carried[k], owners) for k in twice)
    if not twice and not lost and not faults:
        pytest.skip(f"no QoS 2 exchange was cut by this run's {restarts} restart(s)")
    found = [f"{n} read(s) twice at the cloud subscriber: {shape}" for shape, n in shapes.items()]
    if lost:
        found.append(
            f"{len(lost)} read(s) never delivered although the broker completed fxgate's "
            "exchange with PUBCOMP, most taken while the subscriber's session was being taken over"
        )
    pytest.xfail(f"{kind} after {restarts} graceful restart(s): {'; '.join(found)}")


def wait_for_keys(cloud: Collector, wanted: set[str], quiet: float = 5.0) -> bool:
    """Until every key of `wanted` has reached `cloud` (True), or nothing more came for `quiet`
    seconds (False)."""
    seen: set[str] = set()
    done = 0
    with cloud.cond:
        while True:
            seen.update(props[IDEMPOTENCY_PROPERTY] for _, _, props in cloud.messages[done:])
            done = len(cloud.messages)
            if seen >= wanted:
                return True
            if not cloud.cond.wait_for(lambda done=done: len(cloud.messages) > done, quiet):
                return False


def takeovers(packets: list[MqttPacket], client_id: str) -> list[tuple[float, float]]:
    """(CONNECT, CONNACK) times of each of `client_id`'s connections after its first."""
    owners = client_ids(packets)
    starts = {p.connection: p.at for p in packets if p.kind == "CONNECT"}
    return sorted(
        (starts[p.connection], p.at)
        for p in packets
        if p.kind == "CONNACK" and owners[p.connection] == client_id and p.session_present
    )


def taken(found: list[Exchange], upstream_id: str) -> float:
    """When the broker's first successful PUBREC for the read reached fxgate (Mochi routes a
    QoS 2 message right after it writes the PUBREC)."""
    return min(
        p.at
        for e in found
        if e.client_id == upstream_id and e.sender == UP
        for p in e.packets
        if p.kind == "PUBREC" and p.reason_code < 0x80
    )


def completed_upstream(found: list[Exchange], upstream_id: str) -> bool:
    """The broker completed fxgate's exchange for the read: a PUBCOMP 0x00 reached it."""
    return any(
        e.client_id == upstream_id
        and e.sender == UP
        and any(p.kind == "PUBCOMP" and p.reason_code == 0 for p in e.packets)
        for e in found
    )
