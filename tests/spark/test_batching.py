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
