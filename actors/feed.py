"""Feed: one sink's cursor over the ledger and the credit the sink has given it; pure logic.

The ledger is one durable log read by two sinks, the table and the upstream, each at its own pace
(DESIGN §7.1). A sink says how much it can take — `grant(messages, bytes)` — and the ledger hands
it committed records in seq order until that credit is spent. What does not fit waits in the
ledger, on disk, and is read back in order once the sink grants more: a slow or absent sink costs
disk, never memory, and never holds up the source or the other sink.

A feed is *caught up* while every committed record it owes has been handed on; then new records
go straight from the commit to the sink (`offer`), without being read back. Otherwise `next_seq`
says where reading back resumes (`take` after each read).
"""

from __future__ import annotations

from collections.abc import Sequence

from persistence.records import LedgerRecord


class Feed:
    def __init__(self, sink: str) -> None:
        self.sink = sink
        self.messages = 0
        self.bytes = 0
        # The first seq not handed on, while the feed is behind; None while it is caught up.
        self.next_seq: int | None = None
        self.handed = 0

    @property
    def caught_up(self) -> bool:
        return self.next_seq is None

    @property
    def has_credit(self) -> bool:
        return self.messages > 0 and self.bytes > 0

    def grant(self, messages: int, size: int) -> None:
        self.messages += messages
        self.bytes += size

    def behind_from(self, seq: int | None) -> None:
        """Reading back starts at `seq` (None: nothing is owed, the feed is caught up)."""
        self.next_seq = seq

    def offer(self, records: Sequence[LedgerRecord]) -> list[LedgerRecord]:
        """Freshly committed records this sink owes: those it may have now. A feed that is
        behind takes none (they are read back after the older ones); one whose credit runs out
        falls behind from the first record it cannot take."""
        if not records or not self.caught_up:
            return []
        handed = self._spend(records)
        if len(handed) < len(records):
            self.next_seq = records[len(handed)].seq
        return handed

    def take(self, records: Sequence[LedgerRecord], limit: int) -> list[LedgerRecord]:
        """Records read back from `next_seq` (at most `limit` were asked for): those the credit
        covers. The feed is caught up when the read found fewer than asked and all fitted."""
        handed = self._spend(records)
        if len(handed) < len(records):
            self.next_seq = records[len(handed)].seq
        elif len(records) < limit:
            self.next_seq = None
        else:
            self.next_seq = records[-1].seq + 1
        return handed

    def _spend(self, records: Sequence[LedgerRecord]) -> list[LedgerRecord]:
        # A record is handed while any byte of credit is left: one payload may overshoot the
        # byte credit, so that a payload larger than a sink's whole byte budget still passes.
        count = 0
        for record in records:
            if self.messages <= 0 or self.bytes <= 0:
                break
            self.messages -= 1
            self.bytes -= record.size
            count += 1
        self.handed += count
        return list(records[:count])
