"""The paho client subclasses: what they set on the sockets they open, and how the source's
reads its socket in bursts."""

import select
import socket

import pytest
from paho.mqtt.enums import MQTTErrorCode

from actors.mqtt.client import (
    BURST_PACKETS,
    HAND_OVER_BYTES,
    HAND_OVER_PACKETS,
    READ_CHUNK,
    LedgerClient,
)
from actors.mqtt.upstream import AckType, UpstreamClient
from actors.mqtt.wire import encode_publish


@pytest.fixture
def listener():
    """A TCP listener on loopback that accepts and says nothing (no CONNACK needed here)."""
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def _source(client_id):
    return LedgerClient(client_id, lambda packets, over: None, lambda: 0.0)


def _upstream(client_id):
    return UpstreamClient(client_id, lambda acks: None, lambda: 0.0)


@pytest.mark.parametrize(
    ("make", "no_delay"), [(_source, False), (_upstream, True)], ids=["source", "upstream"]
)
def test_the_upstream_socket_sends_small_packets_at_once(listener, make, no_delay):
    """Nagle off upstream: the next PUBLISH of the window must not wait for the TCP ack of the
    previous small write. On at the source, where acks going out in groups coalesce."""
    client = make("fxgate-test")
    try:
        client.connect("127.0.0.1", listener.getsockname()[1])
        sock = client.socket()
        assert sock is not None
        assert bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)) is no_delay
    finally:
        client.disconnect()
        sock = client.socket()
        if sock is not None:
            sock.close()


# -- reading in bursts ----------------------------------------------------------------------

CONNACK = b"\x20\x03\x00\x00\x00"  # MQTT 5: no session present, success, no properties
TOPIC = b"zebra/fx/r1/reads"


def publish_bytes(n: int, size: int = 150) -> bytes:
    return encode_publish(n % 65535 + 1, TOPIC, b"%06d" % n + b"x" * (size - 6), 1, False)


class Source:
    """A LedgerClient connected to a loopback server socket the test writes to, driven as paho's
    loop drives it: select on its socket, then loop_read."""

    def __init__(self, listener, kind=LedgerClient):
        self.listener = listener
        self.hand_overs: list[list] = []
        # The source's hand-overs say whether the read burst is over (the upstream's do not).
        self.over: list[bool] = []
        if kind is LedgerClient:
            self.client = kind("fxgate-test", self._packets, lambda: 0.0)
        else:
            self.client = kind("fxgate-test", self.hand_overs.append, lambda: 0.0)
        self.server = self.connect()

    def _packets(self, packets: list, over: bool) -> None:
        if packets:
            self.hand_overs.append(packets)
        self.over.append(over)

    def connect(self, again=False):
        port = self.listener.getsockname()[1]
        if again:
            self.client.reconnect()
        else:
            self.client.connect("127.0.0.1", port)
        server, _ = self.listener.accept()
        server.settimeout(10)
        return server

    def payloads(self) -> list:
        """What was handed over: each PUBLISH's first 6 payload bytes, or each ack."""
        return [getattr(p, "payload", b"")[:6] or p for batch in self.hand_overs for p in batch]

    def read_until(self, count: int, timeout: float = 10.0) -> list[int]:
        """Loop until `count` packets were handed over; every select must find data while
        some are missing (a byte left in the buffer with an idle socket would stall here).
        Returns how many packets each loop_read call handed over."""
        per_call = []
        while (before := len(self.payloads())) < count:
            readable, _, _ = select.select([self.client.socket()], [], [], timeout)
            assert readable, f"stalled with {before} of {count} handed over"
            assert self.client.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
            per_call.append(len(self.payloads()) - before)
        return per_call

    def close(self):
        self.server.close()
        sock = self.client.socket()
        if sock is not None:
            sock.close()


@pytest.fixture
def source(listener):
    source = Source(listener)
    yield source
    source.close()


def test_many_packets_read_at_once_come_in_order_in_hand_overs_and_nothing_stalls(source):
    count = 1000
    source.server.sendall(CONNACK + b"".join(publish_bytes(n) for n in range(count)))
    per_call = source.read_until(count)
    assert source.payloads() == [b"%06d" % n for n in range(count)]
    assert max(len(batch) for batch in source.hand_overs) <= HAND_OVER_PACKETS
    # A burst reads no more than BURST_PACKETS from the socket, then ends with what its buffer
    # holds (at most READ_CHUNK bytes): the network thread gets round its loop meanwhile.
    assert max(per_call) <= BURST_PACKETS + READ_CHUNK // 150 + 1


def test_a_burst_that_empties_the_socket_says_so_even_when_earlier_hand_overs_took_all(source):
    """At a small window the broker sends nothing more until we acknowledge: the ledger must
    know when a burst is over to commit at once (it used to wait out its group timer)."""
    source.server.sendall(CONNACK + b"".join(publish_bytes(n) for n in range(HAND_OVER_PACKETS)))
    source.read_until(HAND_OVER_PACKETS)
    readable, _, _ = select.select([source.client.socket()], [], [], 0)
    if readable:  # the rest of the bytes came after the first read: one more burst
        assert source.client.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert [len(batch) for batch in source.hand_overs][-1] <= HAND_OVER_PACKETS
    assert source.over[-1] is True
    assert source.over.count(True) == 1 + bool(readable)


def test_a_burst_cut_at_its_packet_limit_is_not_said_to_be_over(source):
    """A burst that stopped reading the socket at BURST_PACKETS does not know the socket is
    empty: it must not say so (the ledger's group timer commits then, as at a large window)."""
    count = 1000
    source.server.sendall(CONNACK + b"".join(publish_bytes(n) for n in range(count)))
    ends = []
    while sum(handed for handed, _ in ends) < count:
        readable, _, _ = select.select([source.client.socket()], [], [], 10)
        assert readable
        before, said = len(source.payloads()), len(source.over)
        assert source.client.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
        ends.append((len(source.payloads()) - before, source.over[said:][-1:] == [True]))
    assert any(handed > BURST_PACKETS for handed, _ in ends), "no burst was cut: send more"
    assert all(not over for handed, over in ends if handed > BURST_PACKETS)


def test_a_packet_split_across_reads_is_handed_over_once_it_is_whole(source):
    whole = publish_bytes(1)
    source.server.sendall(CONNACK + publish_bytes(0) + whole[:40])
    source.read_until(1)
    assert source.payloads() == [b"000000"]
    source.server.sendall(whole[40:] + publish_bytes(2))
    source.read_until(3)
    assert source.payloads() == [b"000000", b"000001", b"000002"]


def test_a_large_payload_is_handed_over_at_once(source):
    source.server.sendall(CONNACK + publish_bytes(0, size=HAND_OVER_BYTES) + publish_bytes(1))
    source.read_until(2)
    assert [len(batch) for batch in source.hand_overs] == [1, 1]


def test_bytes_read_on_a_lost_connection_never_reach_the_next_one(source):
    """A packet paho refuses ends the connection with bytes still in the buffer after it; they
    belonged to that connection and must not be read as the start of the next one."""
    bad_length = b"\x30\xff\xff\xff\xff\x01"  # a remaining length longer than 4 bytes
    source.server.sendall(CONNACK + bad_length + publish_bytes(1))
    readable, _, _ = select.select([source.client.socket()], [], [], 10)
    assert readable
    assert source.client.loop_read() != MQTTErrorCode.MQTT_ERR_SUCCESS
    assert source.payloads() == []
    source.server.close()
    source.server = source.connect(again=True)
    source.server.sendall(CONNACK + publish_bytes(2))
    source.read_until(1)
    assert source.payloads() == [b"000002"]


def test_the_upstream_client_hands_its_acks_over_in_order_and_in_hand_overs(listener):
    upstream = Source(listener, UpstreamClient)
    try:
        count = 450
        acks = b"".join(b"\x40\x02" + (n + 1).to_bytes(2, "big") for n in range(count))
        upstream.server.sendall(CONNACK + acks)
        upstream.read_until(count)
        assert [(a.kind, a.packet_id, a.failed) for a in upstream.payloads()] == [
            (AckType.PUBACK, n + 1, False) for n in range(count)
        ]
        assert max(len(batch) for batch in upstream.hand_overs) <= HAND_OVER_PACKETS
    finally:
        upstream.close()
