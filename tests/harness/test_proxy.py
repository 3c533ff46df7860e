"""FaultProxy against a recording echo server (bytes, and MQTT packets for the proxy's own
recording) and against mosquitto with paho (flap, a recorded QoS 2 exchange).

Absence of bytes is checked with a bounded wait (a receive timeout); everything else waits on the
event it expects.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable, Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from actors.mqtt.wire import encode_publish
from tests.harness.fake_broker import (
    CONNECT,
    DISCONNECT,
    PUBREC,
    PUBREL,
    SESSION_EXPIRY_INTERVAL,
    SUBACK,
    ack_packet,
    encode_packet,
    encode_properties,
    encode_text,
)
from tests.harness.mqtt import Collector, publish_all
from tests.harness.proxy import DOWN, UP, FaultProxy

TIMEOUT = 10.0
# How long "nothing arrives" is watched for.
QUIET = 0.3


class EchoServer(socketserver.ThreadingTCPServer):
    """Echoes every byte back and records what it heard, its sockets, and how each one ended."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), EchoHandler)
        self.cond = threading.Condition()
        self.heard = bytearray()
        self.sockets: list[socket.socket] = []
        self.endings: list[str] = []  # "eof" or "reset", one per connection that ended

    @property
    def port(self) -> int:
        return self.server_address[1]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)


class EchoHandler(socketserver.BaseRequestHandler):
    server: EchoServer

    def handle(self) -> None:
        server = self.server
        with server.cond:
            server.sockets.append(self.request)
            server.cond.notify_all()
        ending = "eof"
        echoing = True
        while True:
            try:
                data = self.request.recv(65536)
            except ConnectionResetError:
                ending = "reset"
                break
            if not data:
                break
            with server.cond:
                server.heard += data
                server.cond.notify_all()
            if echoing:
                try:
                    self.request.sendall(data)
                except OSError:
                    # Keep reading: what arrived before the reset still counts as heard.
                    echoing = False
                    ending = "reset"
        with server.cond:
            server.endings.append(ending)
            server.cond.notify_all()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(TIMEOUT)


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port) as started:
        yield started


@pytest.fixture
def connect(proxy: FaultProxy) -> Iterator[Callable[[], socket.socket]]:
    """Open client sockets to the proxy; all are closed after the test."""
    opened: list[socket.socket] = []

    def make() -> socket.socket:
        sock = socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT)
        opened.append(sock)
        return sock

    yield make
    for sock in opened:
        sock.close()


def receive_exactly(sock: socket.socket, size: int, timeout: float = TIMEOUT) -> bytes:
    sock.settimeout(timeout)
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {bytes(data)!r}")
        data += chunk
    return bytes(data)


def round_trip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    return receive_exactly(sock, len(payload))


def nothing_arrives(sock: socket.socket) -> bool:
    """True when the socket stays open and silent for QUIET seconds."""
    sock.settimeout(QUIET)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    return False


def is_closed(sock: socket.socket) -> bool:
    """True when the peer closed (EOF) or reset the connection within TIMEOUT."""
    sock.settimeout(TIMEOUT)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def is_dropped_on_connect(proxy: FaultProxy) -> bool:
    """True when a new connection is closed or reset by the proxy straight away."""
    try:
        # The reset can beat connect()'s own check of the handshake.
        sock = socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT)
    except ConnectionResetError:
        return True
    with sock:
        return is_closed(sock)


def proxy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fault-proxy-")]


def test_bytes_pass_both_ways_and_are_counted(proxy, connect, echo):
    assert not proxy.wait_for_connections(1, 0.05)
    client = connect()

    assert round_trip(client, b"hello") == b"hello"
    assert round_trip(client, b"world!") == b"world!"

    assert proxy.wait_for_connections(1, TIMEOUT)
    assert echo.heard == b"helloworld!"
    assert (proxy.bytes_up, proxy.bytes_down) == (11, 11)
    assert (proxy.accepted, proxy.active) == (1, 1)


def test_a_side_that_closes_closes_the_other_side(proxy, connect, echo):
    first = connect()
    assert round_trip(first, b"a") == b"a"
    second = connect()
    assert round_trip(second, b"b") == b"b"

    first.close()
    assert echo.wait_for(lambda: echo.endings == ["eof"])

    echo.sockets[1].shutdown(socket.SHUT_RDWR)
    assert second.recv(1) == b""
    assert proxy.active == 0


def test_cut_resets_both_sides_of_every_pair_and_counts_them(proxy, connect, echo):
    clients = [connect(), connect()]
    for client in clients:
        assert round_trip(client, b"x") == b"x"

    assert proxy.cut() == 2

    for client in clients:
        with pytest.raises(ConnectionResetError):
            client.recv(1)
    assert echo.wait_for(lambda: echo.endings == ["reset", "reset"])
    assert proxy.active == 0
    assert proxy.cut() == 0


def test_cut_still_accepts_new_connections(proxy, connect):
    assert round_trip(connect(), b"before") == b"before"
    assert proxy.cut() == 1

    assert round_trip(connect(), b"after") == b"after"
    assert (proxy.accepted, proxy.active) == (2, 1)


def test_refuse_closes_new_connections_at_once_until_accept_restores(proxy, connect, echo):
    forwarded = connect()
    assert round_trip(forwarded, b"up") == b"up"

    proxy.refuse()

    assert is_dropped_on_connect(proxy)
    assert proxy.wait_for_connections(2, TIMEOUT)
    assert len(echo.sockets) == 1, "a refused connection must never reach the target"
    assert round_trip(forwarded, b"still") == b"still", "refuse() leaves live pairs alone"

    proxy.accept()
    assert round_trip(connect(), b"back") == b"back"
    assert len(echo.sockets) == 2


def test_stall_holds_bytes_both_ways_and_resume_delivers_them_in_order(proxy, connect, echo):
    client = connect()
    assert round_trip(client, b"hi") == b"hi"
    server_side = echo.sockets[0]

    proxy.stall()
    client.sendall(b"one")
    server_side.sendall(b"push")
    client.sendall(b"two")

    assert nothing_arrives(client)
    assert echo.heard == b"hi"
    assert (proxy.bytes_up, proxy.bytes_down) == (2, 2)

    proxy.resume()
    assert receive_exactly(client, 10) == b"pushonetwo"
    assert echo.heard == b"hionetwo"
    assert proxy.active == 1


def test_the_reply_to_the_chosen_request_is_lost_after_the_target_got_it(proxy, connect, echo):
    other = connect()
    client = connect()
    assert round_trip(client, b"GET /a HTTP/1.1\r\n\r\n") == b"GET /a HTTP/1.1\r\n\r\n"
    proxy.lose_reply_to(b"PUT ", b"/log/")
    assert round_trip(other, b"PUT /data HTTP/1.1\r\n\r\n") == b"PUT /data HTTP/1.1\r\n\r\n"
    client.sendall(b"PUT /log/1 HTTP/1.1\r\n\r\n")
    assert echo.wait_for(lambda: echo.heard.endswith(b"PUT /log/1 HTTP/1.1\r\n\r\n"))
    assert proxy.wait_for_lost_reply(TIMEOUT)
    assert nothing_arrives(client)  # the echo, the target's reply, never comes back
    # Once: a later request with the same words, on another connection, gets its reply.
    assert round_trip(other, b"PUT /log/2 HTTP/1.1\r\n\r\n") == b"PUT /log/2 HTTP/1.1\r\n\r\n"


def test_reply_instead_answers_each_connection_once_and_closes_it_until_resume(
    proxy, connect, echo
):
    busy = b"HTTP/1.1 503 Server Busy\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    before = connect()
    assert round_trip(before, b"GET /a HTTP/1.1\r\n\r\n") == b"GET /a HTTP/1.1\r\n\r\n"
    proxy.reply_instead(busy)
    for client in (before, connect()):
        client.sendall(b"PUT /b HTTP/1.1\r\n\r\n")
        assert receive_exactly(client, len(busy)) == busy
        assert client.recv(1) == b""  # closed after the reply
    assert proxy.wait_for_replies_instead(2, TIMEOUT)
    assert echo.heard == b"GET /a HTTP/1.1\r\n\r\n"  # the target heard neither
    proxy.resume()
    after = connect()
    assert round_trip(after, b"PUT /c HTTP/1.1\r\n\r\n") == b"PUT /c HTTP/1.1\r\n\r\n"


def test_a_close_is_passed_on_only_after_the_bytes_sent_before_it(proxy, connect, echo):
    client = connect()
    assert round_trip(client, b"hi") == b"hi"
    # More than loopback takes in one send, so the proxy must keep writing after it saw the EOF.
    payload = bytes(range(256)) * 2048

    proxy.stall()
    client.sendall(payload)
    client.shutdown(socket.SHUT_WR)  # half-close: the echo can still come back
    proxy.resume()

    assert receive_exactly(client, len(payload)) == payload
    assert client.recv(1) == b"", "the server closed after echoing; the client must see that"
    assert echo.heard == b"hi" + payload
    assert echo.endings == ["eof"]
    assert (proxy.bytes_up, proxy.bytes_down) == (2 + len(payload), 2 + len(payload))


def test_half_open_keeps_the_client_open_while_nothing_comes_back(proxy, connect, echo):
    client = connect()
    assert round_trip(client, b"hi") == b"hi"
    server_side = echo.sockets[0]

    proxy.half_open()
    client.sendall(b"lost")
    server_side.sendall(b"gone")
    assert nothing_arrives(client)

    # The broker gives up on the silent client; a dead NAT never tells the client.
    server_side.shutdown(socket.SHUT_RDWR)
    assert echo.wait_for(lambda: echo.endings == ["eof"])
    assert nothing_arrives(client)
    assert echo.heard == b"hi"
    assert proxy.active == 1

    proxy.resume()
    assert client.recv(4) == b"", "resume() passes the close on and not the dropped bytes"
    assert proxy.active == 0


def test_resume_after_half_open_forwards_new_bytes_but_not_the_dropped_ones(proxy, connect, echo):
    client = connect()
    assert round_trip(client, b"hi") == b"hi"

    proxy.half_open()
    client.sendall(b"lost")
    assert nothing_arrives(client)

    proxy.resume()
    assert round_trip(client, b"kept") == b"kept"
    assert echo.heard == b"hikept"


def test_cut_ends_half_open_with_a_reset(proxy, connect):
    client = connect()
    assert round_trip(client, b"hi") == b"hi"
    proxy.half_open()

    assert proxy.cut() == 1
    with pytest.raises(ConnectionResetError):
        client.recv(1)


def test_close_leaves_no_fault_proxy_thread_and_stops_listening(echo):
    proxy = FaultProxy("127.0.0.1", echo.port)
    proxy.start()
    clients = [socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT)]
    clients.append(socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT))
    try:
        for client in clients:
            assert round_trip(client, b"x") == b"x"
        proxy.stall()
        assert len(proxy_threads()) == 3

        proxy.close()

        assert proxy_threads() == []
        assert all(is_closed(client) for client in clients)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT).close()
        proxy.close()
    finally:
        for client in clients:
            client.close()


@pytest.mark.broker
def test_flap_three_times_sees_a_self_reconnecting_paho_client_connect_four_times(mosquitto):
    with FaultProxy(mosquitto.host, mosquitto.port) as proxy:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="flapper", protocol=MQTTProtocolVersion.MQTTv5
        )
        client.reconnect_delay_set(0.05, 0.2)
        cond = threading.Condition()
        connected_on: list[int] = []  # proxy connection number each CONNACK arrived over

        def on_connect(*_args) -> None:
            with cond:
                connected_on.append(proxy.accepted)
                cond.notify_all()

        client.on_connect = on_connect
        client.connect(proxy.host, proxy.port)
        client.loop_start()
        try:
            with cond:
                assert cond.wait_for(lambda: connected_on == [1], TIMEOUT)

            proxy.flap(3, timeout=TIMEOUT)

            assert proxy.accepted == 4
            with cond:
                assert cond.wait_for(lambda: connected_on[-1] == 4, TIMEOUT), connected_on
            assert proxy.active == 1
        finally:
            client.disconnect()
            client.loop_stop()


# -- recording ----------------------------------------------------------------------------------


def mqtt_connect(client_id: str, clean_start: bool = False) -> bytes:
    flags = 0x02 if clean_start else 0
    body = encode_text("MQTT") + bytes([5, flags]) + (60).to_bytes(2, "big")
    properties = encode_properties([(SESSION_EXPIRY_INTERVAL, 3600)])
    return encode_packet(CONNECT, 0, body + properties + encode_text(client_id))


def test_a_recording_proxy_decodes_each_packet_it_passes_on_both_ways_even_split_into_bytes(echo):
    publish = encode_publish(
        7, b"cloud/x", b"{}", qos=2, dup=True, user_property=(b"fxgate-key", b"k1")
    )
    suback = encode_packet(SUBACK, 0, (3).to_bytes(2, "big") + encode_properties([]) + b"\x02")
    stream = (
        mqtt_connect("gw")
        + publish
        + ack_packet(PUBREC, 7, 0x97)
        + ack_packet(PUBREL, 7, 0)
        + suback
        + encode_packet(DISCONNECT, 0, b"\x8b")
    )
    with FaultProxy("127.0.0.1", echo.port, record=True) as proxy:
        client = socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT)
        with client:
            for byte in stream:  # each its own write: the decoder must join them
                client.sendall(bytes([byte]))
            assert receive_exactly(client, len(stream)) == stream
            last = proxy.wait_for_packet(
                lambda p: p.kind == "DISCONNECT" and p.direction == DOWN, TIMEOUT
            )
        assert last is not None and last.reason_code == 0x8B
        packets = proxy.packets

    for direction in (UP, DOWN):
        seen = [p for p in packets if p.direction == direction]
        assert [p.kind for p in seen] == [
            "CONNECT",
            "PUBLISH",
            "PUBREC",
            "PUBREL",
            "SUBACK",
            "DISCONNECT",
        ]
        connect, pub, pubrec, pubrel, sub, _ = seen
        assert (connect.client_id, connect.clean_start, connect.connection) == ("gw", False, 1)
        assert (pub.packet_id, pub.qos, pub.dup, pub.topic) == (7, 2, True, "cloud/x")
        assert pub.user_property("fxgate-key") == "k1"
        assert pub.user_property("other") is None
        assert (pubrec.packet_id, pubrec.reason_code) == (7, 0x97)
        assert (pubrel.packet_id, pubrel.reason_code) == (7, 0)
        assert (sub.packet_id, sub.reason_code) == (3, 2)
    assert [p.at for p in packets] == sorted(p.at for p in packets)
    # Each packet came back after it went out.
    assert all(
        up.at <= down.at
        for up, down in zip(
            [p for p in packets if p.direction == UP],
            [p for p in packets if p.direction == DOWN],
            strict=True,
        )
    )


def test_a_recording_proxy_passes_bytes_that_are_not_mqtt_and_records_none_of_them(echo):
    with FaultProxy("127.0.0.1", echo.port, record=True) as proxy:
        client = socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT)
        with client:
            garbage = b"\x00\xff\xff\xff\xff\xff hello"
            assert round_trip(client, garbage) == garbage
            assert round_trip(client, mqtt_connect("late")) == mqtt_connect("late")
        assert proxy.packets == []
        assert proxy.wait_for_packet(lambda _p: True, QUIET) is None


def test_a_proxy_records_nothing_unless_asked(proxy, connect):
    client = connect()
    assert round_trip(client, mqtt_connect("gw")) == mqtt_connect("gw")
    assert proxy.packets == []


@pytest.mark.broker
def test_a_recording_proxy_shows_a_qos2_exchange_with_mosquitto_on_both_connections(mosquitto):
    with FaultProxy(mosquitto.host, mosquitto.port, record=True) as proxy:
        cloud = Collector(proxy.host, proxy.port, "probe/#", qos=2, client_id="probe-sub")
        try:
            publish_all(proxy.host, proxy.port, [("probe/a", b"1")], qos=2, client_id="probe-pub")
            cloud.wait_for(1, timeout=TIMEOUT)
            assert proxy.wait_for_packet(
                lambda p: p.kind == "PUBCOMP" and p.direction == UP, TIMEOUT
            )
        finally:
            cloud.close()
        packets = proxy.packets
    clients = {p.connection: p.client_id for p in packets if p.kind == "CONNECT"}
    assert sorted(clients.values()) == ["probe-pub", "probe-sub"]
    flow = [
        (clients[p.connection], p.direction, p.kind)
        for p in packets
        if p.kind in ("PUBLISH", "PUBREC", "PUBREL", "PUBCOMP")
    ]
    # mosquitto delivers a QoS 2 message at PUBREL (DESIGN §4): the subscriber's exchange starts
    # after the publisher's PUBREL.
    publisher = [(d, k) for c, d, k in flow if c == "probe-pub"]
    subscriber = [(d, k) for c, d, k in flow if c == "probe-sub"]
    assert publisher == [(UP, "PUBLISH"), (DOWN, "PUBREC"), (UP, "PUBREL"), (DOWN, "PUBCOMP")]
    assert subscriber == [(DOWN, "PUBLISH"), (UP, "PUBREC"), (DOWN, "PUBREL"), (UP, "PUBCOMP")]
    assert flow.index(("probe-pub", UP, "PUBREL")) < flow.index(("probe-sub", DOWN, "PUBLISH"))
    connack = next(p for p in packets if p.kind == "CONNACK")
    assert (connack.reason_code, connack.session_present) == (0, False)
