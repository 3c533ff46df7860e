"""FakeBroker against real paho 2.2 MQTTv5 clients, plus a raw socket where paho cannot be timed.

Every wait is on a Condition (the fake's, or the one the paho callbacks record under). Where a test
shows that something did *not* happen, it waits for a later packet on the same connection instead:
TCP and both ends keep order, so what was not before it will not come.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.harness.fake_broker import (
    CONNACK,
    CONNECT,
    PINGREQ,
    PINGRESP,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    FakeBroker,
    Reader,
    Received,
    ack_packet,
    encode_packet,
    encode_properties,
    encode_text,
    encode_varint,
    split_packet,
    topic_matches,
)

TIMEOUT = 10.0


class RecordingClient:
    """A paho MQTTv5 client whose callbacks only record (name, args) under a Condition."""

    CALLBACKS = ("on_connect", "on_disconnect", "on_publish", "on_subscribe", "on_message")

    def __init__(self, client_id: str) -> None:
        self.paho = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id, protocol=MQTTProtocolVersion.MQTTv5
        )
        self.cond = threading.Condition()
        self.events: list[tuple[str, tuple]] = []
        for name in self.CALLBACKS:
            setattr(self.paho, name, self._recorder(name))
        self.paho.on_log = self._recorder("on_log")

    def _recorder(self, name: str) -> Callable[..., None]:
        def record(_client: mqtt.Client, _userdata: object, *args: object) -> None:
            with self.cond:
                self.events.append((name, args))
                self.cond.notify_all()

        return record

    def calls(self, name: str) -> list[tuple]:
        with self.cond:
            return [args for event, args in self.events if event == name]

    def wait(self, name: str, count: int = 1) -> list[tuple]:
        """The first `count` calls of callback `name`, once there are that many."""
        with self.cond:
            arrived = self.cond.wait_for(lambda: len(self.calls(name)) >= count, TIMEOUT)
        assert arrived, f"{name} called {len(self.calls(name))} times, expected {count}"
        return self.calls(name)[:count]

    def subscribe(self, topic_filter: str, qos: int) -> None:
        before = len(self.calls("on_subscribe"))
        self.paho.subscribe(topic_filter, qos)
        self.wait("on_subscribe", before + 1)


class RawClient:
    """MQTT 5 by hand, for packet orders paho does not let a test choose."""

    def __init__(self, port: int, client_id: str) -> None:
        self.client_id = client_id
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.buffer = bytearray()
        body = encode_text("MQTT") + bytes([5, 0]) + (60).to_bytes(2, "big")  # clean_start 0
        self.send(encode_packet(CONNECT, 0, body + encode_properties([]) + encode_text(client_id)))
        packet_type, _flags, self.connack = self.next_packet()
        assert packet_type == CONNACK

    def send(self, packet: bytes) -> None:
        self.sock.sendall(packet)

    def publish_qos2(self, packet_id: int) -> None:
        body = encode_text("t") + packet_id.to_bytes(2, "big") + encode_properties([]) + b"x"
        self.send(encode_packet(PUBLISH, 2 << 1, body))

    def next_packet(self) -> tuple[int, int, bytes]:
        while (packet := split_packet(self.buffer)) is None:
            data = self.sock.recv(65536)
            assert data, "the fake broker closed the connection"
            self.buffer += data
        return packet

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        yield fake


@pytest.fixture
def connect(broker: FakeBroker) -> Iterator[Callable[..., RecordingClient]]:
    """Connect a RecordingClient (clean_start=False, DESIGN §4) and wait for its CONNACK."""
    made: list[RecordingClient] = []

    def make(client_id: str = "fake-broker-test", keepalive: int = 60) -> RecordingClient:
        client = RecordingClient(client_id)
        made.append(client)
        client.paho.connect(broker.host, broker.port, keepalive=keepalive, clean_start=False)
        client.paho.loop_start()
        client.wait("on_connect")
        return client

    yield make
    for client in made:
        client.paho.disconnect()
        client.paho.loop_stop()


# ---- codec and matching --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size"),
    [(0, 1), (127, 1), (128, 2), (16_383, 2), (16_384, 3), (2_097_151, 3), (2_097_152, 4),
     (268_435_455, 4)],
)  # fmt: skip
def test_variable_byte_integers_use_the_spec_sizes_and_decode_back(value: int, size: int) -> None:
    encoded = encode_varint(value)
    assert len(encoded) == size  # §1.5.5 table
    assert Reader(encoded).varint() == value


def test_split_packet_waits_for_a_whole_packet_and_takes_only_it() -> None:
    packet = encode_packet(PUBLISH, 0, encode_text("a/b") + encode_properties([]) + b"p" * 200)
    buffer = bytearray(packet[:3])
    assert split_packet(buffer) is None
    buffer += packet[3:] + b"\xc0"
    assert split_packet(buffer) == (PUBLISH, 0, packet[3:])
    assert buffer == bytearray(b"\xc0")


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matches"),
    [
        ("readers/+/reads", "readers/fx1/reads", True),
        ("readers/+/reads", "readers/fx1/events", False),
        ("readers/#", "readers", True),
        ("readers/#", "readers/fx1/reads", True),
        ("readers/+", "readers/fx1/reads", False),
        ("$share/g-dev/readers/+/reads", "readers/fx1/reads", True),
        ("#", "$SYS/uptime", False),
    ],
)
def test_topic_filters_match_as_the_spec_says(topic_filter: str, topic: str, matches: bool) -> None:
    assert topic_matches(topic_filter, topic) is matches


# ---- connecting -----------------------------------------------------------------------------


def test_paho_client_connects_subscribes_and_gets_pingresp(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    client = connect("pinger", keepalive=1)

    (flags, reason, _properties) = client.wait("on_connect")[0]
    assert reason == 0 and not flags.session_present
    assert broker.connects == [("pinger", False)]
    client.subscribe("readers/+/reads", 2)
    assert client.calls("on_subscribe")[0][1] == [2]  # granted QoS
    assert broker.subscribes == [("pinger", "readers/+/reads", 2)]
    # With keep-alive 1 s paho sends PINGREQ after a second of silence.
    with client.cond:
        answered = client.cond.wait_for(
            lambda: any("Received PINGRESP" in args[1] for args in client.calls("on_log")),
            TIMEOUT,
        )
    assert answered


def test_session_present_and_receive_maximum_reach_on_connect(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    broker.session_present = True
    broker.receive_maximum = 5

    (flags, reason, properties) = connect().wait("on_connect")[0]

    assert reason == 0
    assert flags.session_present
    assert properties.ReceiveMaximum == 5


def test_connack_carries_no_receive_maximum_unless_scripted(
    connect: Callable[..., RecordingClient],
) -> None:
    (_flags, _reason, properties) = connect().wait("on_connect")[0]
    assert not hasattr(properties, "ReceiveMaximum")


def test_empty_client_id_gets_an_assigned_one(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    (_flags, _reason, properties) = connect("").wait("on_connect")[0]

    assert broker.connects == [(properties.AssignedClientIdentifier, False)]


@pytest.mark.parametrize("refusal", [0x86, 0x87])
def test_refusing_connack_fails_pahos_connect(
    broker: FakeBroker, connect: Callable[..., RecordingClient], refusal: int
) -> None:
    broker.connack_reason = refusal

    (_flags, reason, _properties) = connect("refused").wait("on_connect")[0]

    assert reason == refusal and reason.is_failure
    assert broker.wait_for(lambda b: not b.clients, TIMEOUT)


def test_refusing_connack_is_followed_by_the_server_closing(broker: FakeBroker) -> None:
    broker.connack_reason = 0x87
    raw = RawClient(broker.port, "raw")
    try:
        assert raw.connack == b"\x00\x87\x00"  # no session present, Not authorized, no properties
        assert raw.sock.recv(1) == b""  # §3.2.2.2: the server closes, the client need not
    finally:
        raw.close()


# ---- publishes from the client --------------------------------------------------------------


def test_qos1_publish_is_acked_and_recorded_with_its_properties(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    client = connect("publisher")
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = [("reader", "fx9600-1"), ("seq", "7")]
    properties.MessageExpiryInterval = 30

    mid = client.paho.publish("readers/fx1/reads", b'{"epc":"3034"}', 1, properties=properties).mid

    assert client.wait("on_publish")[0][:2] == (mid, 0)
    assert broker.received == [
        Received(
            client_id="publisher",
            packet_id=mid,
            qos=1,
            dup=False,
            topic="readers/fx1/reads",
            payload=b'{"epc":"3034"}',
            user_properties=(("reader", "fx9600-1"), ("seq", "7")),
            message_expiry=30,
        )
    ]


def test_qos2_publish_completes_pubrec_pubrel_pubcomp(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    client = connect("publisher")

    mid = client.paho.publish("readers/fx1/reads", b"tag", 2).mid

    (published_mid, reason, _properties) = client.wait("on_publish")[0]
    assert (published_mid, reason) == (mid, 0)
    assert [(r.packet_id, r.qos, r.payload) for r in broker.received] == [(mid, 2, b"tag")]
    assert broker.pubrels == [("publisher", mid)]


def test_reply_codes_are_used_in_order_then_success_again(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    client = connect("publisher")
    broker.reply_publish([0x97, 0x80])

    mids = [client.paho.publish("t", b"%d" % n, 1).mid for n in range(3)]

    reasons = {mid: reason.value for mid, reason, _p in client.wait("on_publish", 3)}
    assert [reasons[mid] for mid in mids] == [0x97, 0x80, 0x00]


@pytest.mark.parametrize(
    ("pubcomp_reason", "reported"),
    [(0x92, "Packet identifier not found"), (0x00, "Success")],
    ids=["spec-pubcomp-0x92", "mosquitto-style-pubcomp-0x00"],
)
def test_paho_ignores_a_pubrec_of_0x97_and_reports_the_pubcomp_instead(
    broker: FakeBroker,
    connect: Callable[..., RecordingClient],
    pubcomp_reason: int,
    reported: str,
) -> None:
    """Observed with paho-mqtt 2.2.0 (the fact DESIGN §4 cites).

    Given PUBREC 0x97 (Quota exceeded), paho:
    - still sends PUBREL for that packet id, although §4.3.3 ends the flow at a PUBREC >= 0x80;
    - does not call on_publish at the PUBREC, and never shows 0x97 to the application;
    - calls on_publish once, at the PUBCOMP, with the PUBCOMP's reason code. A broker that has
      discarded the refused message answers that stray PUBREL with 0x92 Packet Identifier not found
      (a failure, but not the real one); one that answers 0x00, as mosquitto does for an unknown id,
      makes the refused message look delivered.
    So the forwarder must see the PUBREC reason code itself; on_publish cannot tell it.
    """
    broker.pubcomp_unknown_reason = pubcomp_reason
    client = connect("publisher")
    broker.reply_publish([0x97])

    mid = client.paho.publish("readers/fx1/reads", b"tag", 2).mid

    (published_mid, reason, _properties) = client.wait("on_publish")[0]
    assert published_mid == mid
    assert broker.pubrels == [("publisher", mid)]  # paho sent PUBREL after the refusing PUBREC
    assert reason.value == pubcomp_reason and str(reason) == reported
    assert reason.value != 0x97


def test_a_puback_reason_code_reaches_on_publish(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    """Contrast with PUBREC: paho 2.2 passes a QoS 1 PUBACK's reason code to on_publish."""
    client = connect("publisher")
    broker.reply_publish([0x97])

    client.paho.publish("readers/fx1/reads", b"tag", 1)

    (_mid, reason, _properties) = client.wait("on_publish")[0]
    assert reason == 0x97 and reason.is_failure


def test_held_acks_go_out_in_order_when_released(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    client = connect("publisher")
    broker.hold_acks()

    mids = [client.paho.publish("t", b"%d" % n, qos).mid for n, qos in enumerate([1, 1, 2, 1])]
    assert broker.wait_for(lambda b: len(b.received) == 4, TIMEOUT)
    # SUBACK is not held and follows any ack the fake would have sent on this connection.
    client.subscribe("unrelated", 0)
    assert client.calls("on_publish") == []

    broker.release_acks()

    # The QoS 2 one completes last: its PUBREC is answered by a PUBREL, then PUBCOMP.
    assert [call[0] for call in client.wait("on_publish", 4)] == [*mids[:2], mids[3], mids[2]]
    assert broker.pubrels == [("publisher", mids[2])]


def test_held_acks_include_the_pubcomp_for_a_pubrel(broker: FakeBroker) -> None:
    raw = RawClient(broker.port, "raw")
    try:
        raw.publish_qos2(7)
        assert raw.next_packet() == (PUBREC, 0, (7).to_bytes(2, "big"))
        broker.hold_acks()
        raw.send(ack_packet(PUBREL, 7, 0))
        raw.send(encode_packet(PINGREQ, 0, b""))

        assert raw.next_packet()[0] == PINGRESP  # not the PUBCOMP: it is held
        assert broker.pubrels == [("raw", 7)]
        broker.release_acks()
        assert raw.next_packet() == (PUBCOMP, 0, (7).to_bytes(2, "big"))
    finally:
        raw.close()


@pytest.mark.parametrize(("session_present", "pubcomp"), [(True, b""), (False, b"\x92\x00")])
def test_pubrel_after_reconnect_completes_only_if_the_session_was_present(
    broker: FakeBroker, session_present: bool, pubcomp: bytes
) -> None:
    first = RawClient(broker.port, "raw")
    first.publish_qos2(7)
    assert first.next_packet()[0] == PUBREC
    first.close()
    assert broker.wait_for(lambda b: not b.clients, TIMEOUT)
    broker.session_present = session_present

    second = RawClient(broker.port, "raw")
    try:
        second.send(ack_packet(PUBREL, 7, 0))
        assert second.next_packet() == (PUBCOMP, 0, (7).to_bytes(2, "big") + pubcomp)
    finally:
        second.close()


# ---- the server side ------------------------------------------------------------------------


def test_disconnect_clients_reason_reaches_on_disconnect(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    client = connect("taken-over")

    broker.disconnect_clients(0x8E)

    (flags, reason, _properties) = client.wait("on_disconnect")[0]
    assert flags.is_disconnect_packet_from_server
    assert reason == 0x8E and str(reason) == "Session taken over"


def test_drop_clients_looks_like_a_lost_connection(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    client = connect("dropped")

    broker.drop_clients()

    assert broker.clients == ()
    (flags, reason, _properties) = client.wait("on_disconnect")[0]
    assert not flags.is_disconnect_packet_from_server
    assert reason.is_failure


@pytest.mark.parametrize("qos", [1, 2])
def test_publish_to_clients_reaches_a_subscribed_paho_client(
    broker: FakeBroker, connect: Callable[..., RecordingClient], qos: int
) -> None:
    client = connect("subscriber")
    client.subscribe("readers/+/reads", 2)

    broker.publish_to_clients("readers/fx1/reads", b"tag-1", qos)

    (message,) = client.wait("on_message")[0]
    assert (message.topic, message.payload, message.qos) == ("readers/fx1/reads", b"tag-1", qos)
    final = "PUBACK" if qos == 1 else "PUBCOMP"
    assert broker.wait_for(lambda b: any(a[1] == final for a in b.client_acks), TIMEOUT)
    expected = ["PUBACK"] if qos == 1 else ["PUBREC", "PUBCOMP"]
    assert [(a[0], a[1], a[3]) for a in broker.client_acks] == [
        ("subscriber", name, 0) for name in expected
    ]


def test_publish_to_clients_skips_clients_without_a_matching_filter_and_caps_qos(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    reads = connect("reads")
    reads.subscribe("readers/+/reads", 1)
    other = connect("other")
    other.subscribe("other/#", 2)

    broker.publish_to_clients("readers/fx1/reads", b"tag", 2)
    # Per connection order holds: had `other` been sent the first one, it would come first.
    broker.publish_to_clients("other/x", b"marker", 2)

    (message,) = reads.wait("on_message")[0]
    assert message.qos == 1  # min(publish QoS 2, granted QoS 1)
    (marker,) = other.wait("on_message")[0]
    assert marker.topic == "other/x"
    assert len(other.calls("on_message")) == 1


def test_close_ends_every_thread_and_is_idempotent(
    connect: Callable[..., RecordingClient], broker: FakeBroker
) -> None:
    client = connect("bystander")
    ours = f"fake-broker-accept-{broker.port}", f"fake-broker-conn-{broker.port}-"
    assert any(t.name.startswith(ours) for t in threading.enumerate())

    broker.close()
    broker.close()

    assert [t.name for t in threading.enumerate() if t.name.startswith(ours)] == []
    assert client.wait("on_disconnect")[0][1].is_failure
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((broker.host, broker.port), timeout=TIMEOUT).close()


def test_a_publish_can_be_resent_live_with_its_packet_id_and_dup_and_a_pubrel_again(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    """EMQX's live re-send (DESIGN §4, other brokers), scripted: the same id again with DUP set,
    and the PUBREL only when the test sends it, as often as it does."""
    client = connect("subscriber")
    client.subscribe("readers/+/reads", 2)
    broker.auto_pubrel = False

    assert broker.publish_to_clients("readers/fx1/reads", b"tag", 2, packet_id=321) == [
        ("subscriber", 321)
    ]
    assert broker.wait_for(lambda b: len(b.client_acks) == 1, TIMEOUT)
    broker.publish_to_clients("readers/fx1/reads", b"tag", 2, packet_id=321, dup=True)
    assert broker.wait_for(lambda b: len(b.client_acks) == 2, TIMEOUT)
    assert client.calls("on_message") == []  # paho delivers QoS 2 at PUBREL, none came yet
    assert broker.pubrel_to_clients(321) == ["subscriber"]
    assert broker.pubrel_to_clients(321, client_id="nobody") == []
    assert broker.pubrel_to_clients(321, client_id="subscriber") == ["subscriber"]

    assert broker.wait_for(lambda b: len(b.client_acks) == 4, TIMEOUT)
    assert [a[1:] for a in broker.client_acks] == [
        ("PUBREC", 321, 0),
        ("PUBREC", 321, 0),
        ("PUBCOMP", 321, 0),
        ("PUBCOMP", 321, 0),
    ]
    (message,) = client.wait("on_message")[0]
    assert message.payload == b"tag"
    assert message.dup  # paho keeps the re-sent PUBLISH: its DUP flag reached the wire


def test_a_qos1_publish_resent_live_carries_dup_and_its_chosen_packet_id(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    client = connect("subscriber")
    client.subscribe("readers/+/reads", 1)

    broker.publish_to_clients("readers/fx1/reads", b"tag", 1, packet_id=9)
    broker.publish_to_clients("readers/fx1/reads", b"tag", 1, packet_id=9, dup=True)

    first, second = (args[0] for args in client.wait("on_message", 2))
    assert [(m.mid, m.dup) for m in (first, second)] == [(9, False), (9, True)]
    assert broker.wait_for(lambda b: len(b.client_acks) == 2, TIMEOUT)
    assert [a[1:3] for a in broker.client_acks] == [("PUBACK", 9), ("PUBACK", 9)]


def test_one_write_sends_what_is_scripted_inside_it_to_a_client_at_once(broker: FakeBroker) -> None:
    raw = RawClient(broker.port, "raw")
    try:
        body = (1).to_bytes(2, "big") + encode_properties([]) + encode_text("t/#") + bytes([1])
        raw.send(encode_packet(SUBSCRIBE, 0b0010, body))
        assert raw.next_packet()[0] == SUBACK
        raw.sock.setblocking(False)
        with broker.one_write():
            broker.publish_to_clients("t/x", b"a", 1, packet_id=4)
            broker.publish_to_clients("t/x", b"a", 1, packet_id=4, dup=True)
            with pytest.raises(BlockingIOError):
                raw.sock.recv(65536)  # nothing yet
        raw.sock.setblocking(True)
        data = bytearray(raw.sock.recv(65536))
        first, second = split_packet(data), split_packet(data)
        assert not data
        assert [(p[0], p[1]) for p in (first, second)] == [(PUBLISH, 0b0010), (PUBLISH, 0b1010)]
    finally:
        raw.close()


# ---- a shared group's member whose session expires (EMQX 5) ---------------------------------

SHARE = "$share/g/readers/+/reads"


def raw_subscribe(raw: RawClient, topic_filter: str, qos: int, packet_id: int = 1) -> None:
    body = packet_id.to_bytes(2, "big") + encode_properties([]) + encode_text(topic_filter)
    raw.send(encode_packet(SUBSCRIBE, 0b0010, body + bytes([qos])))
    packet_type, _flags, suback = raw.next_packet()
    assert (packet_type, suback[:2], suback[-1]) == (SUBACK, packet_id.to_bytes(2, "big"), qos)


def leave(broker: FakeBroker, raw: RawClient) -> None:
    """Close the socket without DISCONNECT (a member killed), and wait until the fake saw it."""
    raw.close()
    assert broker.wait_for(lambda b: all(c != raw.client_id for c in b.clients), TIMEOUT)


def received(client: RecordingClient, count: int) -> list[tuple[str, bytes, int, bool]]:
    return [(m.topic, m.payload, m.qos, m.dup) for (m,) in client.wait("on_message", count)[:count]]


def test_publish_to_one_client_reaches_it_alone_as_a_shared_groups_dispatch_does(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    first = connect("member-1")
    first.subscribe(SHARE, 1)
    second = connect("member-2")
    second.subscribe(SHARE, 1)

    sent = broker.publish_to_clients("readers/fx1/reads", b"one", 1, client_id="member-2")
    assert sent == [("member-2", 1)]
    assert broker.publish_to_clients("readers/fx1/reads", b"x", 1, client_id="nobody") == []
    # To both: per connection order holds, so `first` would have got "one" before it.
    broker.publish_to_clients("readers/fx1/reads", b"marker", 1)

    assert [m[1] for m in received(first, 1)] == [b"marker"]
    assert [m[1] for m in received(second, 2)] == [b"one", b"marker"]
    assert len(first.calls("on_message")) == 1


def test_an_expired_members_qos1_in_flight_then_queued_messages_go_round_robin_to_the_others(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    """EMQX 5's re-dispatch at a session's expiry: QoS 1 in flight, oldest first, then the
    queue, each to another member of the share; not QoS 2 in flight (MQTT-4.8.2-5), not
    QoS 0, not what came through a plain filter."""
    dying = RawClient(broker.port, "member-dying")  # acknowledges nothing it is sent
    raw_subscribe(dying, SHARE, 2)
    raw_subscribe(dying, "plain/#", 1, packet_id=2)
    first = connect("member-1")
    first.subscribe(SHARE, 2)
    second = connect("member-2")
    second.subscribe(SHARE, 1)
    for payload, qos in ((b"in-flight-1", 1), (b"in-flight-qos2", 2), (b"in-flight-2", 1)):
        broker.publish_to_clients("readers/fx1/reads", payload, qos, client_id="member-dying")
    broker.publish_to_clients("plain/x", b"plain", 1, client_id="member-dying")
    assert [dying.next_packet()[0] for _ in range(4)] == [PUBLISH] * 4
    assert broker.in_flight("member-dying") == [
        (1, 1, b"in-flight-1"),
        (2, 2, b"in-flight-qos2"),
        (3, 1, b"in-flight-2"),
        (4, 1, b"plain"),
    ]
    leave(broker, dying)
    broker.queue_for_session("member-dying", "readers/fx2/reads", b"queued-1", 1)
    broker.queue_for_session("member-dying", "readers/fx2/reads", b"queued-qos2", 2)
    broker.queue_for_session("member-dying", "readers/fx2/reads", b"queued-qos0", 0)
    assert first.calls("on_message") == [] and second.calls("on_message") == []

    sent = broker.expire_session("member-dying")

    assert [(client, payload) for client, _, payload in sent] == [
        ("member-1", b"in-flight-1"),
        ("member-2", b"in-flight-2"),
        ("member-1", b"queued-1"),
        ("member-2", b"queued-qos2"),
    ]
    assert received(first, 2) == [
        ("readers/fx1/reads", b"in-flight-1", 1, False),
        ("readers/fx2/reads", b"queued-1", 1, False),
    ]
    # Queued at QoS 2, given to a member granted QoS 1: min of the two (§3.8.4).
    assert received(second, 2) == [
        ("readers/fx1/reads", b"in-flight-2", 1, False),
        ("readers/fx2/reads", b"queued-qos2", 1, False),
    ]
    assert broker.wait_for(lambda b: len(b.client_acks) == 4, TIMEOUT)
    assert sorted(a[:2] for a in broker.client_acks) == [
        ("member-1", "PUBACK"),
        ("member-1", "PUBACK"),
        ("member-2", "PUBACK"),
        ("member-2", "PUBACK"),
    ]
    # Acknowledged: nothing of it is in flight any more, in the members' sessions either.
    assert broker.in_flight("member-1") == [] and broker.in_flight("member-2") == []
    assert broker.in_flight("member-dying") == []
    with pytest.raises(ValueError, match="has no session"):
        broker.expire_session("member-dying")
    with pytest.raises(ValueError, match="has no session"):
        broker.queue_for_session("member-dying", "readers/fx1/reads", b"late", 1)


def test_an_acknowledged_message_is_not_redispatched_and_a_connected_clients_session_lives_on(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    leaving = connect("member-leaving")
    leaving.subscribe(SHARE, 1)
    staying = connect("member-staying")
    staying.subscribe(SHARE, 1)
    broker.publish_to_clients("readers/fx1/reads", b"acked", 1, client_id="member-leaving")
    assert broker.wait_for(lambda b: ("member-leaving", "PUBACK", 1, 0) in b.client_acks, TIMEOUT)
    assert broker.in_flight("member-leaving") == []
    with pytest.raises(ValueError, match="is connected"):
        broker.expire_session("member-leaving")
    with pytest.raises(ValueError, match="is connected"):
        broker.queue_for_session("member-leaving", "readers/fx1/reads", b"x", 1)

    leaving.paho.disconnect()  # keeps the session: clean_start was False
    assert broker.wait_for(lambda b: "member-leaving" not in b.clients, TIMEOUT)
    with pytest.raises(ValueError, match="no filter matching"):
        broker.queue_for_session("member-leaving", "other/topic", b"x", 1)

    assert broker.expire_session("member-leaving") == []
    # After the marker, anything re-dispatched to `staying` would have come before it.
    broker.publish_to_clients("readers/fx1/reads", b"marker", 1)
    assert [m[1] for m in received(staying, 1)] == [b"marker"]
    assert len(staying.calls("on_message")) == 1


def test_a_connect_without_a_present_session_discards_what_was_in_flight_and_queued(
    broker: FakeBroker, connect: Callable[..., RecordingClient]
) -> None:
    dying = RawClient(broker.port, "member-back")
    raw_subscribe(dying, SHARE, 1)
    broker.publish_to_clients("readers/fx1/reads", b"in-flight", 1, client_id="member-back")
    assert dying.next_packet()[0] == PUBLISH
    leave(broker, dying)
    broker.queue_for_session("member-back", "readers/fx1/reads", b"queued", 1)
    other = connect("member-other")
    other.subscribe(SHARE, 1)

    back = RawClient(broker.port, "member-back")  # the fake's CONNACK: session not present
    assert back.connack[0] == 0
    assert broker.in_flight("member-back") == []
    leave(broker, back)

    assert broker.expire_session("member-back") == []


def test_unsubscribing_a_qos0_subscription_is_a_success_and_a_second_time_no_subscription(
    broker: FakeBroker,
) -> None:
    raw = RawClient(broker.port, "unsubscriber")
    try:
        raw_subscribe(raw, "t/#", 0)
        for packet_id, reason in ((2, 0x00), (3, 0x11)):  # 0x11: No subscription existed
            body = packet_id.to_bytes(2, "big") + encode_properties([]) + encode_text("t/#")
            raw.send(encode_packet(UNSUBSCRIBE, 0b0010, body))
            packet_type, _flags, unsuback = raw.next_packet()
            assert (packet_type, unsuback[:2], unsuback[-1]) == (
                UNSUBACK,
                packet_id.to_bytes(2, "big"),
                reason,
            )
    finally:
        raw.close()
