"""BatchCollector: when packs waiting for Spark make a batch; pure, no clock, no threads.

A Spark job costs about 0.1 s however small it is (DESIGN §4), so the writer coalesces packs into
batches of up to `max_rows` messages or `max_bytes` of payload (an FX9600 batched message holds
50-100 reads: counting messages alone made batches of millions of rows), and flushes a smaller
one when its oldest pack has waited the batch window (the writer times that on its clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PackLike(Protocol):
    @property
    def records(self) -> Sequence: ...


class BatchCollector:
    def __init__(self, max_rows: int, max_bytes: int) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.packs: list = []
        self.messages = 0
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self.packs)

    def add(self, pack: PackLike) -> bool:
        """Take one pack; True when the batch is full and should be written now."""
        self.packs.append(pack)
        self.messages += len(pack.records)
        self.bytes += sum(len(r.payload) for r in pack.records)
        return self.messages >= self.max_rows or self.bytes >= self.max_bytes

    def take(self) -> list:
        """Every pack waiting, oldest first; the collector is empty after."""
        packs, self.packs = self.packs, []
        self.messages = self.bytes = 0
        return packs

    def put_back(self, packs: Sequence[PackLike]) -> None:
        """Packs that could not be written go back in front, in their order."""
        self.packs = [*packs, *self.packs]
        self.messages += sum(len(p.records) for p in packs)
        self.bytes += sum(len(r.payload) for p in packs for r in p.records)
