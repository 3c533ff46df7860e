"""The forward leg: tier-2 buffer, outbound ledger and upstream connection, started as one.

The supervisor starts it in the daemon's process (`[upstream] process = "shared"`), or the child
of actors.forward_process does (`"own"`); either way the same three actors are started here, in
the same order, and talk to the inbound ledger and the life-cycle actor by `tell` alone.
"""

from __future__ import annotations

from collections.abc import Callable

import pykka

from actors.buffer import TierTwoBuffer
from actors.clock import Clock
from actors.config.routes import Route
from actors.config.schema import Config
from actors.connection import ConnectionActor, ConnectionSettings
from actors.messages import OutboundAcks
from actors.mqtt.relay import ConnectionRelay
from actors.mqtt.upstream import UpstreamClient
from actors.outbound import OutboundLedger

# Starts an actor under a name and returns its ref (the supervisor's `_start`, or the child's).
Start = Callable[..., pykka.ActorRef]


def upstream_client_factory(outbound: pykka.ActorRef):
    """The upstream client reports every ack to the outbound ledger, which sends through a
    relay to the connection's actor (one thread writes to the client: actors.mqtt.relay)."""

    def make(client_id: str, monotonic, owner: pykka.ActorRef):
        client = UpstreamClient(
            client_id, lambda acks: outbound.tell(OutboundAcks(tuple(acks))), monotonic
        )
        outbound.proxy().set_client(ConnectionRelay(owner))
        return client

    return make


def start_forward_leg(
    start: Start,
    config: Config,
    clock: Clock,
    settings: ConnectionSettings,
    routes: tuple[Route, ...],
    *,
    ledger: pykka.ActorRef,
    lifecycle: pykka.ActorRef | None,
    live_from_seq: int,
    ask_timeout: float,
) -> pykka.ActorRef:
    """Start outbound ledger, tier-2 buffer and upstream connection; the buffer's ref, which
    the inbound ledger's upstream feed is then pointed at (`set_forwarder`)."""
    outbound = start(
        "outbound",
        OutboundLedger,
        config.gateway.data_path / "outbound.sqlite",
        clock,
        ledger,
        routes,
        config.identity.environment_id,
        durability=config.gateway.durability,
        window=config.upstream.window,
        processing_timeout=config.packs.processing_timeout_seconds,
        ack_strategy=config.packs.ack_strategy,
        retries=config.packs.retries,
    )
    buffer = start(
        "buffer",
        TierTwoBuffer,
        outbound,
        ledger,
        routes,
        max_messages=config.buffer.max_messages,
        max_bytes=config.buffer.max_bytes,
        low_watermark=config.buffer.low_watermark,
        overflow=config.buffer.overflow,
        persist_qos0=config.buffer.persist_qos0,
        pack_size=config.packs.max_messages,
        clock=clock,
        live_from_seq=live_from_seq,
    )
    outbound.proxy().set_buffer(buffer).get(timeout=ask_timeout)
    start(
        "upstream",
        ConnectionActor,
        settings,
        clock,
        outbound,
        client_factory=upstream_client_factory(outbound),
        lifecycle=lifecycle,
    )
    return buffer
