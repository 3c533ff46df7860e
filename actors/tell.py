"""Telling an actor that may be gone: the one place that decides what that means.

An actor tells itself (a timer firing on the clock thread) or a neighbour (a sink, the listener)
while the actor set may be stopping. A message to a stopped actor is not an error then: what it
carried is either durable (the ledger hands committed rows on again at the next start) or moot
(a timer of an actor that has stopped). So the tell reports whether it was delivered, and the
caller decides whether to say so. Stopping one is said here too, the same way everywhere.
"""

from __future__ import annotations

import logging

import pykka

log = logging.getLogger(__name__)


def tell_unless_dead(ref: pykka.ActorRef, message: object) -> bool:
    """Tell `message` to `ref`; False (and nothing raised) when the actor has stopped."""
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        return False
    return True


def stop_actor(name: str, ref, timeout: float) -> None:
    """Stop `ref` (it works off its mailbox first) and log how that went, under `name`. `ref`
    is a pykka.ActorRef or what stands for one (actors.forward_process.ForwardProcess)."""
    try:
        stopped = ref.stop(block=True, timeout=timeout)
    except pykka.Timeout:
        log.error("%s did not stop within %.0f s", name, timeout)
        return
    log.info("stopped %s%s", name, "" if stopped else " (it had already died)")
