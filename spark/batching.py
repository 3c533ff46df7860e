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
        """One batch of the packs waiting, oldest first: every one, or, when more than a batch
        waits (the writer had no room for a batch a while: actors/writer.py, PIPELINE_DEPTH),
        the oldest up to the first that makes the batch full. The rest stays."""
        taken, messages, size = 0, 0, 0
        for pack in self.packs:
            taken += 1
            messages += len(pack.records)
            size += sum(len(r.payload) for r in pack.records)
            if messages >= self.max_rows or size >= self.max_bytes:
                break
        packs, self.packs = self.packs[:taken], self.packs[taken:]
        self.messages -= messages
        self.bytes -= size
        return packs

    def put_back(self, packs: Sequence[PackLike]) -> None:
        """Packs that could not be written go back in front, in their order."""
        self.packs = [*packs, *self.packs]
        self.messages += sum(len(p.records) for p in packs)
        self.bytes += sum(len(r.payload) for p in packs for r in p.records)
