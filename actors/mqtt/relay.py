"""ConnectionRelay: how the outbound ledger writes to a broker connection it does not own.

The ConnectionActor owns the connection (paho's own network thread does the socket I/O). The
outbound ledger (PUBLISHes and PUBRELs after each commit) holds this relay instead of the
client: each send is a message to the owner, in order, carrying the connection epoch it was
decided for, so the owner's client drops it if the connection was replaced meanwhile. A send
after the owner stopped goes nowhere, which is safe: what it published is recorded and is
re-sent after the next start. (The inbound ledger's acks go to the source's client directly:
actors.connection.ledger_client_factory says why.)
"""

from __future__ import annotations

from collections.abc import Sequence

import pykka

from actors.messages import SendPublishes, SendPubrels
from actors.mqtt.upstream import OutboundPublish
from actors.tell import tell_unless_dead


class ConnectionRelay:
    def __init__(self, owner: pykka.ActorRef) -> None:
        self._owner = owner

    def send_publish(self, epoch: int, message: OutboundPublish) -> bool:
        return self.send_publishes(epoch, (message,))

    def send_publishes(self, epoch: int, messages: Sequence[OutboundPublish]) -> bool:
        return tell_unless_dead(self._owner, SendPublishes(epoch, tuple(messages)))

    def send_pubrel(self, epoch: int, packet_id: int) -> bool:
        return self.send_pubrels(epoch, (packet_id,))

    def send_pubrels(self, epoch: int, packet_ids: Sequence[int]) -> bool:
        return tell_unless_dead(self._owner, SendPubrels(epoch, tuple(packet_ids)))
