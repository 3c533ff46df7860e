"""SparkWriterActor: the only owner of the SparkSession; lands sealed packs in the tables.

A Spark job costs about 0.1 s however small it is (DESIGN §4), so packs are coalesced into batches
of up to `batch_max_rows` messages or `batch_max_seconds` of waiting. Each batch is exactly-once:
1. its id and packs are recorded in the ledger (`begin_batch`) before the job,
2. the job overwrites exactly the batch's partitions (dynamic mode), so a replay never appends,
3. only then the ledger marks it committed and drops the payloads (`commit_batch`).
A crash before 1 re-packs the rows; between 1 and 3 the recovery replays the same batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pykka

from actors.clock import Clock, TimerHandle
from actors.crashpoints import crash_point, crash_soon
from actors.pack import Pack, PackSealed
from persistence.inbound_ledger import LedgerRecord
from persistence.keys import READ_KEYS
from spark.schema import build_batch
from spark.tables import DEAD_LETTERS, READS, TableWriter, clean_staging

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplayBatch:
    """A batch begun by an earlier run and not committed: write it again, same id, same rows."""

    batch_id: int
    records: tuple[LedgerRecord, ...]


@dataclass(frozen=True, slots=True)
class _Deadline:
    generation: int


@dataclass(frozen=True)
class BatchWritten:
    batch_id: int
    messages: int
    rows: int
    dead_letters: int
    seconds: float


class SparkWriterActor(pykka.ThreadingActor):
    def __init__(
        self,
        ledger,  # proxy of persistence.inbound_ledger.InboundLedger
        clock: Clock,
        tables_dir: Path | str,
        session_factory: Callable[[], object],
        session_closer: Callable[[object], None] | None = None,
        *,
        batch_max_rows: int = 20_000,
        batch_max_seconds: float = 2.0,
        on_batch: Callable[[BatchWritten], None] | None = None,
        idempotency_key: str = "payload_hash",
    ) -> None:
        super().__init__()
        self._ledger = ledger
        self._clock = clock
        self._tables_dir = tables_dir
        self._session_factory = session_factory
        self._session_closer = session_closer
        self._batch_max_rows = batch_max_rows
        self._batch_max_seconds = batch_max_seconds
        self._on_batch = on_batch
        self._read_key = READ_KEYS[idempotency_key]
        # Payload-hash ids are unique per stored message already; field ids need claims.
        self._claim_reads = idempotency_key != "payload_hash"
        self._pending: list[Pack] = []
        self._pending_messages = 0
        self._timer: TimerHandle | None = None
        self._generation = 0
        self._session = None
        self._tables: TableWriter | None = None
        self.last_batch: BatchWritten | None = None

    def on_start(self) -> None:
        if isinstance(self._tables_dir, Path):
            removed = clean_staging(self._tables_dir)
            if removed:
                log.info("removed %d leftover(s) of interrupted Spark jobs", len(removed))
        self._session = self._session_factory()
        self._tables = TableWriter(self._session, self._tables_dir)
        log.info("spark writer ready: tables in %s", self._tables_dir)

    def on_stop(self) -> None:
        self._flush()
        self._close_session()

    def on_failure(self, exception_type, exception_value, traceback) -> None:
        self._close_session()

    def _close_session(self) -> None:
        if self._session is not None and self._session_closer is not None:
            self._session_closer(self._session)
        self._session = None

    def on_receive(self, message: object) -> None:
        if isinstance(message, PackSealed):
            self._pending.append(message.pack)
            self._pending_messages += len(message.pack.records)
            if self._pending_messages >= self._batch_max_rows:
                self._flush()
            elif self._timer is None:
                self._generation += 1
                generation = self._generation
                self._timer = self._clock.call_later(
                    self._batch_max_seconds, lambda: self._deadline(generation)
                )
        elif isinstance(message, _Deadline):
            if message.generation == self._generation:
                self._timer = None
                self._flush()
        elif isinstance(message, ReplayBatch):
            log.info("replaying batch %d (%d messages)", message.batch_id, len(message.records))
            self._write(message.batch_id, message.records)
        else:
            log.warning("spark writer ignored %r", message)

    def _deadline(self, generation: int) -> None:
        try:
            self.actor_ref.tell(_Deadline(generation))
        except pykka.ActorDeadError:
            pass

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._generation += 1
        if not self._pending:
            return
        packs, self._pending, self._pending_messages = self._pending, [], 0
        batch_id = self._ledger.begin_batch([(p.pack_id, p.seqs) for p in packs]).get()
        crash_point("after_batch_begin_before_job")
        self._write(batch_id, tuple(r for p in packs for r in p.records))

    def _owned_reads(self, batch_id: int, reads: pa.Table) -> pa.Table:
        """Keep the reads whose id this batch owns, each once (first occurrence)."""
        ids = reads.column("message_id").to_pylist()
        owned = self._ledger.claim_reads(batch_id, ids).get()
        seen: set[str] = set()
        keep = []
        for read_id in ids:
            keep.append(read_id in owned and read_id not in seen)
            seen.add(read_id)
        dropped = len(ids) - sum(keep)
        if dropped:
            log.info(
                "batch %d: %d read(s) already in the table, not written again", batch_id, dropped
            )
            return reads.filter(pa.array(keep))
        return reads

    def _write(self, batch_id: int, records: Sequence[LedgerRecord]) -> None:
        assert self._tables is not None
        started = self._clock.monotonic()
        tables = build_batch(records, batch_id, read_key=self._read_key)
        reads = self._owned_reads(batch_id, tables.reads) if self._claim_reads else tables.reads
        mid_job = crash_soon("mid_spark_job")
        written = self._tables.write_batch(
            batch_id, {READS: reads, DEAD_LETTERS: tables.dead_letters}
        )
        if mid_job is not None:
            mid_job.cancel()
        crash_point("after_spark_job_before_mark")
        rows, dead = written.get(READS, 0), written.get(DEAD_LETTERS, 0)
        self._ledger.commit_batch(batch_id, rows, dead).get()
        result = BatchWritten(batch_id, len(records), rows, dead, self._clock.monotonic() - started)
        self.last_batch = result
        log.info(
            "batch %d written: %d messages -> %d rows, %d dead letters in %.2f s",
            batch_id,
            result.messages,
            rows,
            dead,
            result.seconds,
        )
        if self._on_batch is not None:
            self._on_batch(result)
