"""A batch of ledger records made ready to write: its tables, its readers' event-number counters
and their health (`prepare_batch`), all pure work on the records, done in the writer's thread.

The tag data payloads are parsed in C++ with the GIL released (spark.zebra_arrow), which left
no reason for the child processes that once parsed beside the daemon: one interpreter did the
same batches with half the CPU a read (issue 36; `footprint` benchmark).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from persistence.records import LedgerRecord, ReaderCount

if TYPE_CHECKING:
    import pyarrow as pa

    from spark.schema import BatchTables


@dataclass(frozen=True)
class BuildOptions:
    """`build_batch`'s keyword arguments other than the records, the batch and the known
    readers: fixed for a writer's life. `idempotency_key` names the read key
    (persistence.keys.READ_KEYS) so that the child looks the function up itself."""

    idempotency_key: str = "payload_hash"
    events_filter: str | None = None
    max_payload_bytes: int = 1024 * 1024
    max_reads: int = 10_000
    management_filters: tuple[str, ...] = ()

    def build(
        self,
        records: Sequence[LedgerRecord],
        batch_id: int,
        known_readers: Collection[str],
    ) -> BatchTables:
        from persistence.keys import READ_KEYS
        from spark.schema import build_batch

        return build_batch(
            records,
            batch_id,
            read_key=READ_KEYS[self.idempotency_key],
            events_filter=self.events_filter,
            max_payload_bytes=self.max_payload_bytes,
            max_reads=self.max_reads,
            management_filters=self.management_filters,
            known_readers=known_readers,
        )


@dataclass(frozen=True)
class PreparedBatch:
    """A batch ready to write: its tables (`observations` emptied: they are in `health`), the
    readers' event-number counters after its reads (None when not asked for) and the health
    of the readers it observed (spark.reader_health.observe_all)."""

    tables: BatchTables
    readers: dict[str, ReaderCount] | None
    health: dict[str, dict]


def prepare_batch(
    records: Sequence[LedgerRecord],
    batch_id: int,
    options: BuildOptions,
    readers: Mapping[str, ReaderCount] | None,
    reader_health: Mapping[str, Mapping[str, object]],
) -> PreparedBatch:
    """Build the batch's tables (known readers: those of `reader_health`); count its reads on
    `readers` (the counters committed with the last batch), unless that is None; observe its
    messages on `reader_health`. Neither mapping is changed."""
    from spark.reader_health import observe_all

    tables = options.build(records, batch_id, reader_health.keys())
    health = observe_all(reader_health, list(tables.observations))
    counted = (
        None if readers is None else count_readers(readers, tables.reads, tables.reader_events)
    )
    return PreparedBatch(replace(tables, observations=()), counted, health)


def count_readers(
    known: Mapping[str, ReaderCount], reads: pa.Table, reader_events: pa.Table
) -> dict[str, ReaderCount]:
    """The counters of the readers in `reads` after its events, in arrival order (the
    table's row order is the ledger's seq order, then each message's order), with the
    numbered management events of `reader_events` in their places: DESIGN §7.9 takes one
    counter for both kinds, so a heartbeat's number is no gap in the tag events'. Starts from
    `known` (reader -> its counters), which is not changed."""
    from spark.gaps import ReaderCounter

    counters: dict[str, ReaderCounter] = {}
    events = [
        (seq, 0, reader_id, event_num)
        for seq, reader_id, event_num in zip(
            reader_events.column("seq").to_pylist(),
            reader_events.column("reader_id").to_pylist(),
            reader_events.column("event_num").to_pylist(),
            strict=True,
        )
        if event_num is not None
    ]
    if events:
        tags = [
            (seq, 1 + index, reader_id, event_num)
            for index, (seq, reader_id, event_num) in enumerate(
                zip(
                    reads.column("seq").to_pylist(),
                    reads.column("reader_id").to_pylist(),
                    reads.column("event_num").to_pylist(),
                    strict=True,
                )
            )
        ]
        merged = sorted(tags + events, key=lambda row: (row[0], row[1]))
        reader_ids = [row[2] for row in merged]
        event_nums = [row[3] for row in merged]
    else:  # the common case: no management event, the reads as they are
        reader_ids = reads.column("reader_id").to_pylist()
        event_nums = reads.column("event_num").to_pylist()
    for reader_id, event_num in zip(reader_ids, event_nums, strict=True):
        counter = counters.get(reader_id)
        if counter is None:
            before = known.get(reader_id)
            counter = counters[reader_id] = (
                ReaderCounter()
                if before is None
                else ReaderCounter(
                    before.received,
                    before.without_event_num,
                    before.missing,
                    before.resets,
                    before.last_event_num,
                )
            )
        counter.observe(event_num)
    return {
        reader_id: ReaderCount(
            reader_id,
            c.last_event_num,
            c.received,
            c.missing,
            c.resets,
            c.without_event_num,
        )
        for reader_id, c in counters.items()
    }
