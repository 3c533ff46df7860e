import pytest

from actors.clock import SimulatedClock
from actors.ledger import LedgerRecord
from actors.messages import Committed, PackSealed
from actors.pack import PackActor, PackAssembler
from tests.harness.inbox import Inbox


def records(start: int, n: int) -> tuple[LedgerRecord, ...]:
    return tuple(
        LedgerRecord(seq, f"k{seq}", "zebra/fx/r1/reads", b"{}", 1, 0.0)
        for seq in range(start, start + n)
    )


def test_assembler_seals_full_packs_and_keeps_the_rest_open_in_order():
    assembler = PackAssembler(max_messages=200, next_pack_id=7)
    sealed = assembler.add(records(1, 450))
    assert [p.pack_id for p in sealed] == [7, 8]
    assert [len(p.records) for p in sealed] == [200, 200]
    assert sealed[1].seqs == tuple(range(201, 401))
    assert all(r.pack_id == 8 for r in sealed[1].records)
    assert len(assembler) == 50
    rest = assembler.seal()
    assert rest.pack_id == 9
    assert rest.seqs == tuple(range(401, 451))
    assert assembler.seal() is None


def test_assembler_refuses_packs_of_nothing():
    with pytest.raises(ValueError, match="at least 1"):
        PackAssembler(0)


@pytest.fixture
def clock():
    return SimulatedClock()


def test_a_partial_pack_is_sealed_when_its_linger_expires_on_the_clock(clock):
    writer = Inbox()
    actor = PackActor.start(writer, clock, max_messages=200, linger_seconds=1.0)
    try:
        actor.tell(Committed(records(1, 3)))
        assert clock.wait_for_timers(1)
        clock.advance(0.999)
        actor.proxy().sealed.get(timeout=5)  # the mailbox is drained
        assert writer.messages == []
        clock.advance(0.001)
        (sealed,) = writer.wait_for(1)
        assert isinstance(sealed, PackSealed)
        assert sealed.pack.seqs == (1, 2, 3)
    finally:
        actor.stop()


def test_a_full_pack_goes_at_once_and_the_leftover_lingers_from_its_own_start(clock):
    writer = Inbox()
    actor = PackActor.start(writer, clock, max_messages=2, linger_seconds=5.0)
    try:
        actor.tell(Committed(records(1, 1)))
        assert clock.wait_for_timers(1)
        clock.advance(4.0)
        actor.tell(Committed(records(2, 2)))  # fills pack 1, opens pack 2 with seq 3
        (first,) = writer.wait_for(1)
        assert first.pack.seqs == (1, 2)
        assert clock.wait_for_timers(1)
        clock.advance(4.0)  # 4 s after seq 3 arrived: not yet
        actor.proxy().sealed.get(timeout=5)
        assert len(writer.messages) == 1
        clock.advance(1.0)
        _, second = writer.wait_for(2)
        assert second.pack.seqs == (3,)
    finally:
        actor.stop()


def test_stopping_seals_the_open_pack_so_nothing_is_left_behind(clock):
    writer = Inbox()
    actor = PackActor.start(writer, clock, max_messages=200, linger_seconds=60.0)
    actor.tell(Committed(records(1, 5)))
    actor.stop()
    (sealed,) = writer.wait_for(1)
    assert sealed.pack.seqs == (1, 2, 3, 4, 5)
