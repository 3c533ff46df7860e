"""The records the ledger's store hands out: plain immutable values, no behaviour beyond copying.

A `LedgerRecord` is one stored inbound message as it travels to the two sinks of the ledger: the
table (packs, then Spark batches) and the upstream (tier 2, then the outbound ledger). Its flags
say which of the two owe it something; each sink sees only the records it owes.
"""

from __future__ import annotations

from dataclasses import dataclass

# The two sinks that consume the ledger (DESIGN §2, §7.1), by the names the `dead_letters`
# table's `sink` column and the operator views use.
TABLE = "table"
UPSTREAM = "upstream"
SINKS = (TABLE, UPSTREAM)


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """A committed inbound message.

    `dead_reason` marks a message that lands as a dead letter rather than as reads: a topic that
    was not UTF-8 (`dead_sink` None: the table's own), or the upstream dead letter the ledger
    stores when forwarding gave up on a message (`dead_sink` = `upstream`; the message itself
    is in `reads` all the same, DESIGN §7.2). `to_table` / `to_upstream` say which sinks still
    owe it (a replay of an upstream dead letter is owed upstream only).
    """

    seq: int
    message_key: str
    topic: str
    payload: bytes
    qos: int
    received_time: float
    pack_id: int | None = None
    dead_reason: str | None = None
    expires_at: float | None = None
    dead_sink: str | None = None
    to_table: bool = True
    to_upstream: bool = False

    def in_pack(self, pack_id: int) -> LedgerRecord:
        # Spelled out: dataclasses.replace cost several times more, once per message (py-spy).
        return LedgerRecord(
            self.seq,
            self.message_key,
            self.topic,
            self.payload,
            self.qos,
            self.received_time,
            pack_id,
            self.dead_reason,
            self.expires_at,
            self.dead_sink,
            self.to_table,
            self.to_upstream,
        )

    @property
    def size(self) -> int:
        """What the record weighs against a sink's byte credit: its payload."""
        return len(self.payload)


@dataclass(frozen=True, slots=True)
class SinkLag:
    """What one sink still owes: messages, and when the oldest of them arrived (wall seconds)."""

    sink: str
    messages: int
    oldest_received_time: float | None

    def age(self, now: float) -> float:
        return 0.0 if self.oldest_received_time is None else max(now - self.oldest_received_time, 0)


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """The ledger's file against its disk budget: bytes in use (SQLite's used pages), and what
    is free on its file system."""

    used_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True)
class ReaderCount:
    """One reader's event-number counters as the ledger keeps them (spark.gaps)."""

    reader_id: str
    last_event_num: int | None
    received: int
    missing: int
    resets: int
    without_event_num: int
