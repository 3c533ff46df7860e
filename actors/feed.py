"""Feed: one sink's cursor over the ledger and the credit the sink has given it; pure logic.

The ledger is one durable log read by two sinks, the table and the upstream, each at its own pace
(DESIGN §7.1). A sink says how much it can take and the ledger hands it committed records in seq
order up to that; what does not fit waits in the ledger, on disk, and is read back in order once
the sink allows more: a slow or absent sink costs disk, never memory, and never holds up the
source or the other sink.

Credit is a window, as in TCP: a grant names *limits*, the total number of records and of payload
bytes the sink will have been handed since the feed began, not an amount to add. A sink computes
them from what it has received (received + room), so a grant and the records already on their
way can cross without either side's count drifting: an additive grant once let the byte credit
run out while message credit stayed out, and tier 2 and the ledger each waited for the other
(seen in the memory benchmark: tier 2 stuck at 591 messages for a 600 s outage).

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
        # Handed on since the feed began, and the limits the sink granted.
        self.handed = 0
        self.handed_bytes = 0
        self.limit = 0
        self.limit_bytes = 0
        # The first seq not handed on, while the feed is behind; None while it is caught up.
        self.next_seq: int | None = None

    @property
    def caught_up(self) -> bool:
        return self.next_seq is None

    @property
    def has_credit(self) -> bool:
        return self.handed < self.limit and self.handed_bytes < self.limit_bytes

    @property
    def messages(self) -> int:
        """How many more records the sink would take now."""
        return max(self.limit - self.handed, 0)

    def grant(self, limit: int, limit_bytes: int) -> None:
        """The sink takes up to `limit` records and `limit_bytes` payload bytes in all; a limit
        never goes back (an older grant that arrives late changes nothing)."""
        self.limit = max(self.limit, limit)
        self.limit_bytes = max(self.limit_bytes, limit_bytes)

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
        # byte limit, so that a payload larger than a sink's whole byte budget still passes.
        count = 0
        for record in records:
            if not self.has_credit:
                break
            self.handed += 1
            self.handed_bytes += record.size
            count += 1
        return list(records[:count])
