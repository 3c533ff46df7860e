"""The paho client subclasses: what they set on the sockets they open."""

import socket

import pytest

from actors.mqtt.client import LedgerClient
from actors.mqtt.upstream import UpstreamClient


@pytest.fixture
def listener():
    """A TCP listener on loopback that accepts and says nothing (no CONNACK needed here)."""
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def _source(client_id):
    return LedgerClient(client_id, lambda publish: None, lambda pubrel: None, lambda: 0.0)


def _upstream(client_id):
    return UpstreamClient(client_id, lambda ack: None, lambda: 0.0)


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
