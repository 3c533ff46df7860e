"""Telling an actor that may be gone: the one place that decides what that means.

An actor tells itself (a timer firing on the clock thread) or a neighbour (a sink, the listener)
while the actor set may be stopping. A message to a stopped actor is not an error then: what it
carried is either durable (the ledger hands committed rows on again at the next start) or moot
(a timer of an actor that has stopped). So the tell reports whether it was delivered, and the
caller decides whether to say so.
"""

from __future__ import annotations

import pykka


def tell_unless_dead(ref: pykka.ActorRef, message: object) -> bool:
    """Tell `message` to `ref`; False (and nothing raised) when the actor has stopped."""
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        return False
    return True
