"""The pipe between the daemon and its forward process (actors.forward_process.Link), in one
process: two links over two OS pipes, each delivering to its side's actors by name. The child
itself is exercised against real brokers in tests/actors/test_outbound.py (`process` "own")."""

import os
import pickle

import pykka
import pytest

from actors.forward_process import Link, RemoteRef
from actors.messages import Committed, Forwarded, ForwardRecorded, Grant
from actors.tell import tell_unless_dead
from persistence.records import UPSTREAM, LedgerRecord
from tests.harness.inbox import Inbox


class Recorder(pykka.ThreadingActor):
    """A real actor (its ref must cross the pipe by name) that hands what it is told on."""

    def __init__(self, inbox: Inbox) -> None:
        super().__init__()
        self.inbox = inbox

    def on_receive(self, message: object) -> None:
        self.inbox.tell(message)


@pytest.fixture
def links():
    """(daemon side, child side, their inboxes): the daemon hosts "ledger", the child "buffer"
    and "outbound", as in the gateway."""
    to_child_r, to_child_w = os.pipe()
    to_daemon_r, to_daemon_w = os.pipe()
    inboxes = {name: Inbox() for name in ("ledger", "buffer", "outbound")}
    refs = {name: Recorder.start(inbox) for name, inbox in inboxes.items()}
    daemon = Link(
        os.fdopen(to_daemon_r, "rb"), os.fdopen(to_child_w, "wb"), {"ledger": refs["ledger"]}
    )
    child = Link(
        os.fdopen(to_child_r, "rb"),
        os.fdopen(to_daemon_w, "wb"),
        {"buffer": refs["buffer"], "outbound": refs["outbound"]},
    )
    daemon.start()
    child.start()
    yield daemon, child, inboxes, refs
    for ref in refs.values():
        ref.stop()
    # The write ends first: each reader then sees the end of its pipe and stops reading (a
    # reader blocked in a read holds its stream, which could not be closed under it).
    for link in (daemon, child):
        try:
            link._out.close()
        except OSError:
            pass
    for link in (daemon, child):
        link._reader.join(10)
        link._in.close()


def records(count: int) -> tuple[LedgerRecord, ...]:
    return tuple(
        LedgerRecord(
            seq,
            f"key-{seq}",
            f"zebra/fx/fx9600-0{seq % 3}/reads",
            b'{"n": %d}' % seq,
            seq % 3,
            1_800_000_000.0 + seq,
            None,
            None if seq % 5 else "invalid_topic",
            None if seq % 2 else 1_800_000_100.0,
            None,
            bool(seq % 4),
            True,
        )
        for seq in range(1, count + 1)
    )


def test_committed_rows_cross_as_equal_records(links):
    daemon, _child, inboxes, _refs = links
    sent = records(250)
    RemoteRef("buffer", daemon).tell(Committed(sent))
    (arrived,) = inboxes["buffer"].wait_for(1)
    assert isinstance(arrived, Committed)
    assert arrived.records == sent


def test_a_ref_in_a_message_crosses_by_name_and_a_reply_reaches_the_actor(links):
    _daemon, child, inboxes, refs = links
    # The outbound ledger reports to the daemon's ledger, naming itself for the reply.
    RemoteRef("ledger", child).tell(Forwarded((1, 2), ((3, "expired"),), refs["outbound"]))
    RemoteRef("ledger", child).tell(Grant(UPSTREAM, 10, 4096))
    report, grant = inboxes["ledger"].wait_for(2)
    assert (report.done, report.dead) == ((1, 2), ((3, "expired"),))
    assert isinstance(report.reply_to, RemoteRef) and report.reply_to.name == "outbound"
    assert grant == Grant(UPSTREAM, 10, 4096)
    # The daemon's ledger answers through the ref it was given: the child's actor gets it.
    report.reply_to.tell(ForwardRecorded((1, 2, 3)))
    assert inboxes["outbound"].wait_for(1) == [ForwardRecorded((1, 2, 3))]


def test_an_actor_the_other_side_cannot_address_does_not_cross(links):
    daemon, _child, _inboxes, _refs = links
    stranger = Recorder.start(Inbox())
    try:
        with pytest.raises(pickle.PicklingError):
            RemoteRef("outbound", daemon).tell(Forwarded((), (), stranger))
    finally:
        stranger.stop()


def test_when_the_other_side_is_gone_a_tell_fails_as_to_a_dead_actor(links):
    daemon, child, _inboxes, _refs = links
    child._out.close()  # the child's end toward the daemon: as if it exited
    assert daemon.ready.wait(10)  # set when the link closes too
    assert daemon.open is False
    assert RemoteRef("buffer", daemon).is_alive() is False
    with pytest.raises(pykka.ActorDeadError):
        RemoteRef("buffer", daemon).tell(Committed(records(1)))
    assert tell_unless_dead(RemoteRef("buffer", daemon), Committed(records(1))) is False
