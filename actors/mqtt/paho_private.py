"""Every private member of paho-mqtt 2.2's `Client` that fxgate relies on, in one place.

paho sends PUBREC the moment a QoS 2 PUBLISH arrives and judges no PUBACK/PUBREC reason code
(DESIGN §4), so fxgate's clients (actors.mqtt.client, actors.mqtt.upstream) take over the handling
of those packets and queue the packets they encode themselves. That means overriding and calling
members paho does not promise to keep. They are listed here, with what fxgate expects of each,
and `missing` says which a given paho no longer has; tests/actors/mqtt/test_paho_private.py fails,
naming the member, when the installed paho changes under us (paho-mqtt is pinned in setup.cfg).
"""

from __future__ import annotations

import inspect

import paho.mqtt.client as paho

# name -> the parameters (after self) fxgate calls or overrides it with.
METHODS: dict[str, tuple[str, ...]] = {
    # Overridden: an inbound PUBLISH / PUBREL is translated and handed to the ledger, unacked.
    "_handle_publish": (),
    "_handle_pubrel": (),
    # Overridden (upstream): PUBACK / PUBCOMP and PUBREC, judged by their reason codes.
    "_handle_pubackcomp": ("cmd",),
    "_handle_pubrec": (),
    # Called: queue a packet fxgate encoded (acks, PUBLISHes, PUBRELs) for the network thread.
    "_packet_queue": ("command", "packet", "mid", "qos"),
    # Called: one PUBLISH under a packet id fxgate chose (a re-send keeps its id, DESIGN §3.2).
    "_send_publish": ("mid", "topic", "payload", "qos", "retain", "dup", "info", "properties"),
    # Reading in bursts (actors.mqtt.client): `_sock_recv` overridden to serve paho from a
    # buffer (and called for the socket's recv), `loop_read` overridden to call these two.
    "_sock_recv": ("bufsize",),
    "_packet_read": (),
    "_loop_rc_handle": ("rc",),
    # Called on the network thread: write what is queued now (acks of an inline commit).
    "_packet_write": (),
}
# Attributes read: the packet being handled, as a dict with these keys.
IN_PACKET = "_in_packet"
IN_PACKET_KEYS = ("command", "packet")
# Attribute read: the connection's socket (None while there is none), replaced at each connect.
SOCK = "_sock"
# Attribute read: the queue of packets to write (a deque; empty when nothing waits).
OUT_PACKET = "_out_packet"


def missing(client_class: type = paho.Client) -> list[str]:
    """What of the above `client_class` lacks or has in another shape, one line each."""
    problems = []
    for name, params in METHODS.items():
        member = getattr(client_class, name, None)
        if member is None or not callable(member):
            problems.append(f"paho Client.{name} is gone")
            continue
        have = [p for p in inspect.signature(member).parameters if p != "self"]
        if tuple(have[: len(params)]) != params:
            problems.append(f"paho Client.{name} takes ({', '.join(have)}), not {params}")
    try:
        client = client_class(paho.CallbackAPIVersion.VERSION2)
    except Exception as error:  # a paho that cannot even be built like this has changed
        return [*problems, f"paho Client cannot be made as fxgate makes it: {error}"]
    if not hasattr(client, SOCK):
        problems.append(f"paho Client has no attribute {SOCK}")
    if not hasattr(getattr(client, OUT_PACKET, None), "__len__"):
        problems.append(f"paho Client.{OUT_PACKET} is not a queue")
    packet = getattr(client, IN_PACKET, None)
    if not isinstance(packet, dict):
        problems.append(f"paho Client.{IN_PACKET} is not a dict")
    else:
        problems.extend(
            f"paho Client.{IN_PACKET} has no key {key!r}"
            for key in IN_PACKET_KEYS
            if key not in packet
        )
    return problems
