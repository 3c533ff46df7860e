"""BatchCollector: pure, no Spark."""

from dataclasses import dataclass

from spark.batching import BatchCollector


@dataclass
class Record:
    payload: bytes


@dataclass
class Pack:
    records: tuple


def pack(count, size=10):
    return Pack(tuple(Record(b"x" * size) for _ in range(count)))


def test_a_batch_is_full_at_its_rows_or_its_bytes_whichever_first():
    by_rows = BatchCollector(max_rows=5, max_bytes=10**6)
    assert by_rows.add(pack(3)) is False
    assert by_rows.add(pack(2)) is True
    by_bytes = BatchCollector(max_rows=10**6, max_bytes=100)
    assert by_bytes.add(pack(5, size=10)) is False
    assert by_bytes.add(pack(5, size=10)) is True


def test_take_empties_it_and_put_back_restores_the_order_in_front():
    collector = BatchCollector(max_rows=100, max_bytes=10**6)
    first, second, third = pack(1), pack(2), pack(3)
    collector.add(first)
    collector.add(second)
    taken = collector.take()
    assert taken == [first, second] and not collector and collector.messages == 0
    collector.add(third)
    collector.put_back(taken)
    assert collector.packs == [first, second, third]
    assert (collector.messages, collector.bytes) == (6, 60)


def test_take_never_hands_over_more_than_one_batch_however_much_waited():
    """Packs that piled up while the writer had no room come out a batch at a time (a writer
    that took them all at once ran the Spark JVM out of memory in the batched benchmark)."""
    collector = BatchCollector(max_rows=5, max_bytes=45)
    packs = [pack(2), pack(2), pack(2), pack(1, size=40), pack(1)]
    for one in packs:
        collector.add(one)
    assert collector.take() == packs[:3]  # 6 rows: full at the third
    assert (collector.messages, collector.bytes) == (2, 50)
    assert collector.take() == packs[3:]  # 50 B: full at the pack that passed 45 B, as add() says
    assert not collector and (collector.messages, collector.bytes) == (0, 0)
