"""SparkWriterActor: lands sealed packs in the Delta tables; the only owner of the tables' writer,
and of the SparkSession when there is one.

Appends are coalesced into batches of up to `batch_max_rows` messages or `batch_max_seconds` of
waiting (a commit costs a few milliseconds and a Spark job about 0.1 s, DESIGN §4). Each batch is
exactly once through the tables' own log (spark/tables.py, DESIGN §7.7):
1. its id and packs are recorded in the ledger (`begin_batch`) before anything is written,
2. each table gets one Delta commit carrying (this gateway's application id, batch id); a table
   whose log has that version already skips it. With a local master and the tables on this disk
   (the defaults) delta-rs commits files pyarrow wrote, in this process and with no JVM
   (spark.tables.ArrowTableWriter); otherwise a Spark job through delta-spark (TableWriter),
3. only then the ledger marks it committed and drops the payloads (`commit_batch`).
A crash before 1 re-packs the rows; between 1 and 3 the recovery replays the same batch, and the
tables that have it skip it. Batches are written one after the other, in id order (a failed one
is retried before any later one), so batch N+1 commits to no table before N is in every table.

A batch is parsed in this thread, just before its write (spark.prepare): the tag data payloads
in C++ by pyarrow's JSON reader with the GIL released (spark.zebra_arrow), so the intake's
threads keep running meanwhile, in the daemon's one interpreter.

The writer is one of the ledger's two sinks (DESIGN §7.1) and takes what the ledger feeds it on
credit: at most `backlog_high` messages (and `backlog_high_bytes` of payload) handed over and not
yet written; it grants credit again once no more than `backlog_low` wait. A slow or failing
writer leaves the rest waiting in the ledger, on disk: memory stays bounded, and the source is
never paused for it (only the ledger's disk budget does that).

A failed write is retried, same id and rows, after a backoff on the clock, for as long as it
takes: its rows are durable in the ledger and must not be dropped because a table is unwell. A
job still running `processing_timeout` after it started is cancelled and retried the same way.
While a batch waits for its retry, new packs wait behind it, which keeps batches in order.

A member of a shared group (`group`) lands into the group's tables, which every member of the
environment writes (DESIGN §7.12): each table's rows insert-if-absent, in one commit
that still carries this member's (application id, batch id) (spark.tables.GroupTableWriter).
It holds no lock, and maintains the tables on its schedule as every member does, each OPTIMIZE
claimed first so that two members' never both commit (spark/maintenance.py).

Maintenance (spark/maintenance.py: OPTIMIZE, VACUUM, checkpoints and log clean-up) runs here too,
between writes on this thread: `start_delay` after the start and every `interval` after that, and
whenever `fxgate compact` leaves a request (the supervisor tells `CompactNow`). With the default
landing it needs no JVM either. The writer holds the tables directory's writer lock
(spark/writer_lock.py) from its start to its stop, so that no `fxgate compact` runs beside it;
readers take no lock. Tables of the layout before Delta are converted in place at start, before
the first write (spark/convert.py).

A ledger that cannot write (StorageUnavailable: disk full) is waited out the same way: a batch it
could not begin goes back in front of the pending packs, and one whose commit it could not record
is written again at the retry (every table skips it: its log has the version) and committed.
Each failure is a log line and a `WriterHealth` reported to the listener (status, /healthz); the
first success after failures is one line more.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pykka

from actors.backoff import Backoff
from actors.clock import Clock, TimerHandle
from actors.crashpoints import MAINTENANCE_CRASH_DELAY, crash_point, crash_soon
from actors.listener import WriterListener
from actors.messages import (
    BatchWritten,
    CompactionReport,
    Grant,
    PackSealed,
    ReplayBatch,
    WriterHealth,
)
from actors.tell import tell_unless_dead
from persistence.compaction_request import done, pending_compaction_requests
from persistence.keys import READ_KEYS
from persistence.records import TABLE, ReaderCount
from persistence.storage_faults import StorageUnavailable
from spark.batching import BatchCollector
from spark.location import delta_location, local_path, object_store
from spark.prepare import BuildOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from spark.prepare import PreparedBatch
    from spark.tables import TableWriter
    from spark.writer_lock import WriterLock

# pyarrow, pyspark and the modules built on them (spark.schema, spark.tables) are imported in the
# writer's own thread, in on_start: importing them takes about a second, and the ledger and the
# source connection need not wait for it (after a restart, ingest resumes first).

log = logging.getLogger(__name__)

# How long an ask of the ledger may take before the attempt counts as failed and is retried (the
# ledger answers within milliseconds unless it is stuck; a batch is never lost by a retry).
LEDGER_ASK_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class _Deadline:
    generation: int


@dataclass(frozen=True, slots=True)
class _Retry:
    pass


@dataclass(frozen=True, slots=True)
class _Compact:
    """The compaction schedule's tick."""


@dataclass(frozen=True, slots=True)
class CompactNow:
    """`fxgate compact` left a request in the data directory: run a pass, then delete it."""


@dataclass(frozen=True, slots=True)
class CompactionSchedule:
    """The [compaction] settings the writer acts on (actors/config/schema.py says each)."""

    enabled: bool = True
    start_delay: float = 60.0
    interval: float = 300.0
    target_file_bytes: int = 128 * 1024 * 1024
    open_file_bytes: int = 16 * 1024 * 1024
    vacuum_retention_hours: int = 1
    data_dir: Path | None = None  # where `fxgate compact` leaves its requests


@dataclass(frozen=True, slots=True)
class GroupLanding:
    """This gateway is a member of a shared group, whose tables it lands into with its peers."""

    name: str  # `{group}-{environment}`: the share name, and the tables' `fxgate.group`
    member: str  # this member's client id: its rows' `landed_by`, its maintenance claims


class SparkWriterActor(pykka.ThreadingActor):
    def __init__(
        self,
        ledger,  # proxy of actors.ledger.InboundLedger
        clock: Clock,
        tables_dir: Path | str,
        session_factory: Callable[[], object],
        session_closer: Callable[[object], None] | None = None,
        *,
        batch_max_rows: int = 20_000,
        batch_max_seconds: float = 1.0,
        batch_max_bytes: int = 8 * 1024 * 1024,
        processing_timeout: float = 20.0,
        listener: WriterListener | None = None,
        idempotency_key: str = "payload_hash",
        table_writer: Callable[..., TableWriter] | None = None,
        retry_backoff: Backoff | None = None,
        backlog_high: int = 100_000,
        backlog_low: int = 50_000,
        backlog_high_bytes: int = 64 * 1024 * 1024,
        events_filter: str | None = None,
        max_payload_bytes: int = 1024 * 1024,
        max_reads_per_message: int = 10_000,
        readers: dict[str, ReaderCount] | None = None,
        management_topics: tuple[str, ...] = (),
        reader_health: dict[str, dict] | None = None,
        compaction: CompactionSchedule | None = None,
        land_with_arrow: bool = True,
        app_id: str | None = None,
        table_properties: dict[str, str] | None = None,
        group: GroupLanding | None = None,
    ) -> None:
        super().__init__()
        self._group = group
        # Unless `table_writer` is given: True writes batches with pyarrow
        # (spark.tables.ArrowTableWriter) when the tables are on this disk, else (and False)
        # through Spark jobs (spark.tables.TableWriter).
        self._land_with_arrow = land_with_arrow
        # True once on_start chose pyarrow: no Spark session at all.
        self._session_per_pass = False
        # The Delta application id of this gateway's batches (None: asked of the ledger, which
        # keeps the gateway id it is made from), and the properties of the tables it creates.
        self._app_id = app_id
        self._table_properties = table_properties
        # None: no lock and no compaction (a writer in a test of its own).
        self._compaction = compaction
        self._writer_lock: WriterLock | None = None
        self._compaction_timer: TimerHandle | None = None
        self._local_tables: Path | None = None
        # Where delta-rs reaches the tables (this disk or an object store); None: only Spark.
        self._delta_tables: str | None = None
        # Each reader's health (spark.reader_health), kept like the counters below: a batch
        # observes on copies, committed with the batch. Seeded from the ledger at start.
        self._reader_health: dict[str, dict] = dict(reader_health or {})
        # Each reader's event-number counters as committed with the last batch (spark.gaps): a
        # batch counts its reads on a copy, committed with the batch, so a replay never counts
        # twice. Seeded from the ledger at start (the recovery).
        self._readers: dict[str, ReaderCount] = dict(readers or {})
        self._ledger = ledger
        self._clock = clock
        self._tables_dir = tables_dir
        self._session_factory = session_factory
        self._session_closer = session_closer
        self._batch_max_seconds = batch_max_seconds
        self._pending = BatchCollector(batch_max_rows, batch_max_bytes)
        self._processing_timeout = processing_timeout
        self._listener = listener or WriterListener()
        self._compaction_report = CompactionReport()
        if idempotency_key not in READ_KEYS:
            raise ValueError(f"unknown idempotency_key {idempotency_key!r}")
        # Payload-hash ids are unique per stored message already; field ids need claims.
        self._claim_reads = idempotency_key != "payload_hash"
        self._table_writer = table_writer
        self._retry_backoff = retry_backoff or Backoff(1.0, 60.0, 0.25)
        self._backlog_high = backlog_high
        self._backlog_low = backlog_low
        self._backlog_high_bytes = backlog_high_bytes
        # The ledger's window (actors.feed): what it fed us and we wrote, and the limits granted.
        self._written = 0
        self._written_bytes = 0
        self._limit = 0
        self._limit_bytes = 0
        # How every batch is parsed (spark.schema.build_batch): records on topics matching
        # `events_filter` are life-cycle events (`events`); those on `management_topics`,
        # management events (the rest: by their shape); bigger payloads, or more events in one,
        # are dead-lettered (spark.zebra limits).
        self._build_options = BuildOptions(
            idempotency_key=idempotency_key,
            events_filter=events_filter,
            max_payload_bytes=max_payload_bytes,
            max_reads=max_reads_per_message,
            management_filters=tuple(management_topics),
        )
        self._deadline_timer: TimerHandle | None = None
        self._generation = 0
        self._failed: ReplayBatch | None = None  # waiting for its retry (`_retry_timer`)
        self._session = None
        self._tables: TableWriter | None = None
        self.last_batch: BatchWritten | None = None
        self.failures = 0
        self._health = WriterHealth()
        # While a retry is due, nothing else is written: batches stay in order. Set whenever
        # `_failed` is, and also for a batch the ledger could not begin (no `_failed` then).
        self._retry_timer: TimerHandle | None = None
        self._replays: deque[ReplayBatch] = deque()

    # -- life cycle -------------------------------------------------------------------------

    def on_start(self) -> None:
        # First, before even importing pyspark (a second or more): the ledger feeds the packs
        # while the Spark session starts, they wait here within the credit, and a stop that
        # comes meanwhile still lands them (the supervisor settles the ledger first).
        self._give_credit()
        from spark.tables import (
            ArrowTableWriter,
            GroupTableWriter,
            TableWriter,
            application_id,
            redate_by_receipt,
            spark_redate_by_receipt,
        )

        local_tables = self._local_tables = local_path(self._tables_dir)
        delta_tables = self._delta_tables = delta_location(self._tables_dir)
        if self._app_id is None:
            self._app_id = application_id(self._ledger.gateway_id().get(timeout=LEDGER_ASK_TIMEOUT))
        group = self._group
        if group is not None and (delta_tables is None or not self._land_with_arrow):
            # The configuration refuses this (actors/config/schema.py); a writer built by hand
            # must not fall back to appends, which would not conflict with the other members.
            raise ValueError(
                "a shared group's tables land through delta-rs, on this disk or an object store"
            )
        if self._table_writer is None:
            arrow = self._land_with_arrow and delta_tables is not None
            self._session_per_pass = arrow
            # The expired log entries go at this writer's maintenance passes when it runs them;
            # else at each commit, delta-rs's way (a listing of the whole log per commit).
            log_cleanup = not (
                delta_tables is not None
                and self._compaction is not None
                and self._compaction.enabled
            )
            if group is not None:
                self._table_writer = functools.partial(
                    GroupTableWriter,
                    checkpoint=crash_point,
                    group=group.name,
                    member=group.member,
                    log_cleanup=log_cleanup,
                )
            elif arrow:
                self._table_writer = functools.partial(
                    ArrowTableWriter, checkpoint=crash_point, log_cleanup=log_cleanup
                )
            else:
                self._table_writer = functools.partial(TableWriter, checkpoint=crash_point)
            log.info(
                "batches are committed %s",
                f"by delta-rs, insert-if-absent into group {group.name}'s tables, as member "
                f"{group.member}"
                if group is not None
                else "by delta-rs in this process"
                if arrow
                else "by Spark jobs (delta-spark)",
            )
        if local_tables is not None and self._compaction is not None:
            if group is None:
                self._take_writer_lock(local_tables)
            self._convert_legacy_tables(local_tables)
            self._redate_tables(functools.partial(redate_by_receipt, local_tables))
        elif delta_tables is not None and self._compaction is not None:
            log.info(
                "tables on %s (%s): no writer lock there; each maintenance pass claims a table "
                "before its OPTIMIZE, and Delta's conflict checks order it with other writers",
                object_store(delta_tables),
                delta_tables,
            )
        if self._session_per_pass:
            self._tables = self._new_table_writer(None)
            log.info(
                "spark writer ready: Delta tables in %s, application id %s (no Spark session)",
                self._tables_dir,
                self._app_id,
            )
        else:
            self._session = self._session_factory()
            if delta_tables is None:
                self._redate_tables(
                    functools.partial(spark_redate_by_receipt, self._session, self._tables_dir)
                )
            self._tables = self._new_table_writer(self._session)
            log.info(
                "spark writer ready: Delta tables in %s, application id %s",
                self._tables_dir,
                self._app_id,
            )
        if self._maintains and self._compaction.enabled:
            self._schedule_compaction(self._compaction.start_delay)

    @property
    def _maintains(self) -> bool:
        """Whether this writer maintains the tables: on this disk under the writer lock, or, in
        a shared group or on an object store, beside the other writers with no lock (claims
        instead)."""
        return self._delta_tables is not None and self._compaction is not None

    def _new_table_writer(self, session) -> TableWriter:
        return self._table_writer(
            session, self._tables_dir, app_id=self._app_id, properties=self._table_properties
        )

    def _convert_legacy_tables(self, tables: Path) -> None:
        """Tables of the layout before Delta become Delta tables in place, before any write;
        the batches the ledger began and did not commit are left to its replay."""
        from actors.app.progress import ProgressReporter
        from spark.convert import convert_tables, legacy_tables

        if not legacy_tables(tables):
            return  # the usual start: nothing of the previous layout (directory listings only)
        open_batches = self._ledger.open_batches().get(timeout=LEDGER_ASK_TIMEOUT)
        # A large conversion takes minutes before the first write: its progress goes to the log,
        # a line every 30 s.
        progress = ProgressReporter.to_log(log, clock=self._clock.monotonic)
        with progress.start("converting the previous layout", unit="partitions", counts=("rows",)):
            result = convert_tables(
                tables,
                open_batches,
                checkpoint=crash_point,
                properties=self._table_properties,
                progress=progress,
            )
        if result.done:
            log.info("tables converted to Delta: %s", result.summary())

    def _redate_tables(self, redate: Callable[[], object]) -> None:
        """Tables an earlier fxgate partitioned by the reader's day move to the receive date,
        once (spark.tables.redate_by_receipt), before any write. Not fatal: what lands from now
        on has the receive date either way, and the next start tries again."""
        try:
            redate()  # logs each table it moves and marks
        except Exception as error:
            log.warning(
                "could not move the rows of an earlier fxgate to their receive date (%s: %s); "
                "they keep the reader's day until a start that can",
                type(error).__name__,
                error,
            )

    def _take_writer_lock(self, tables: Path) -> None:
        from spark.writer_lock import WriterBusy, WriterLock

        lock = WriterLock(tables, "daemon")
        try:
            self._writer_lock = lock.acquire()
        except WriterBusy as busy:
            log.warning("%s: waiting for it to finish before writing", busy)
            self._writer_lock = lock.acquire(wait=True)

    def on_stop(self) -> None:
        if self._failed is None:
            self._flush()
        if self._failed is not None:
            log.warning(
                "stopping with batch %d unwritten; the next start replays it",
                self._failed.batch_id,
            )
        self._close_session()
        self._release_writer_lock()

    def on_failure(self, exception_type, exception_value, traceback) -> None:
        self._close_session()
        self._release_writer_lock()

    def _release_writer_lock(self) -> None:
        if self._compaction_timer is not None:
            self._compaction_timer.cancel()
            self._compaction_timer = None
        if self._writer_lock is not None:
            self._writer_lock.release()
            self._writer_lock = None

    def _close_session(self) -> None:
        if self._tables is not None and hasattr(self._tables, "close"):
            self._tables.close()
        if self._session is not None and self._session_closer is not None:
            self._session_closer(self._session)
        self._session = None

    # -- messages ---------------------------------------------------------------------------

    def on_receive(self, message: object) -> None:
        if isinstance(message, PackSealed):
            if self._pending.add(message.pack):
                self._flush()
            elif self._deadline_timer is None:
                self._generation += 1
                generation = self._generation
                self._deadline_timer = self._clock.call_later(
                    self._batch_max_seconds,
                    lambda: tell_unless_dead(self.actor_ref, _Deadline(generation)),
                )
        elif isinstance(message, _Deadline):
            if message.generation == self._generation:
                self._deadline_timer = None
                self._flush()
        elif isinstance(message, ReplayBatch):
            if self._retry_timer is not None:
                self._replays.append(message)  # after the one that waits, in order
                return
            self._replay(message)
        elif isinstance(message, _Retry):
            self._retry_timer = None
            failed, self._failed = self._failed, None
            if failed is not None:
                log.info("retrying batch %d (attempt %d)", failed.batch_id, self.failures + 1)
                self._ensure_session()
                self._write(failed)
            while self._replays and self._retry_timer is None:
                self._replay(self._replays.popleft())
            if self._retry_timer is None:
                self._flush()
        elif isinstance(message, _Compact):
            self._compaction_timer = None
            self.compact("scheduled")
            self._schedule_compaction(self._compaction.interval)
        elif isinstance(message, CompactNow):
            data_dir = None if self._compaction is None else self._compaction.data_dir
            requests = [] if data_dir is None else pending_compaction_requests(data_dir)
            if requests and self.compact("requested by fxgate compact"):
                done(requests)
                log.info("compaction request(s) done: %s", ", ".join(p.name for p in requests))
        else:
            log.warning("spark writer ignored %r", message)

    # -- compaction -------------------------------------------------------------------------

    def _schedule_compaction(self, delay: float) -> None:
        if self._compaction_timer is not None:
            self._compaction_timer.cancel()
        self._compaction_timer = self._clock.call_later(
            delay, lambda: tell_unless_dead(self.actor_ref, _Compact())
        )
        self._report_compaction(next_pass_time=self._clock.wall() + delay)

    def _report_compaction(self, **changes) -> None:
        self._compaction_report = replace(self._compaction_report, **changes)
        self._listener.compaction(self._compaction_report)

    def _pass_put_off(self, reason: str, why: str) -> None:
        self._report_compaction(
            last_outcome="skipped",
            last_reason=reason,
            last_time=self._clock.wall(),
            last_seconds=None,
            last_summary=why,
        )

    def compact(self, reason: str = "asked"):
        """One maintenance pass (spark/maintenance.py); its result, or None when it could not
        run now."""
        if not self._maintains and self._session is None:
            log.warning(
                "maintenance pass (%s) skipped: the tables are not ours to maintain", reason
            )
            return None
        if self._retry_timer is not None or self._failed is not None or self._replays:
            log.info("maintenance pass (%s) deferred: a batch waits to be written first", reason)
            self._pass_put_off(reason, "a batch waits to be written first")
            return None
        report = self._compaction_report
        started = self._clock.wall()
        try:
            result = self._maintainer().run(started)
        except Exception as error:  # delta-rs, Spark or the file system: the tables stay whole
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            log.error("maintenance pass (%s) failed: %s; the next pass tries again", reason, first)
            self._report_compaction(
                failed_passes=report.failed_passes + 1,
                last_outcome="failed",
                last_reason=reason,
                last_time=started,
                last_seconds=None,
                last_summary=first,
            )
            return None
        log.info("maintenance pass (%s): %s", reason, result.summary())
        self._report_compaction(
            passes=report.passes + 1,
            files_compacted=report.files_compacted + result.files_compacted,
            files_vacuumed=report.files_vacuumed + result.files_vacuumed,
            optimizes_lost=report.optimizes_lost + result.optimizes_lost,
            last_outcome="compacted",
            last_reason=reason,
            last_time=started,
            last_seconds=round(result.seconds, 3),
            last_summary=result.summary(),
        )
        return result

    def _maintainer(self):
        from spark.maintenance import DeltaMaintainer, SparkMaintainer

        schedule = self._compaction or CompactionSchedule()
        # Tables delta-rs reaches are maintained by delta-rs whichever path lands them: a pass of
        # delta-spark's took minutes here under load, and held the writer and its stop that long.
        if self._delta_tables is not None:
            # With no writer lock (a group, an object store), each OPTIMIZE is claimed first.
            if self._group is not None:
                claim = self._group.member
            elif self._local_tables is None:
                claim = self._app_id
            else:
                claim = None
            return DeltaMaintainer(
                self._delta_tables,
                target_file_bytes=schedule.target_file_bytes,
                open_file_bytes=schedule.open_file_bytes,
                vacuum_retention_hours=schedule.vacuum_retention_hours,
                checkpoint=crash_point,
                soon=functools.partial(crash_soon, delay=MAINTENANCE_CRASH_DELAY),
                properties=self._table_properties,
                claim=claim,
            )
        return SparkMaintainer(
            self._session,
            self._tables_dir,
            vacuum_retention_hours=schedule.vacuum_retention_hours,
        )

    def _replay(self, batch: ReplayBatch) -> None:
        if self._retry_timer is not None:
            self._replays.append(batch)
            return
        log.info("replaying batch %d (%d messages)", batch.batch_id, len(batch.records))
        self._write(batch)

    def _give_credit(self) -> None:
        """Open the ledger's window (actors.feed) to `backlog_high` messages and
        `backlog_high_bytes` beyond what is written, once no more than `backlog_low` of either
        (bytes in proportion) is still open: a grant per batch or so, not per pack."""
        low_bytes = self._backlog_high_bytes * self._backlog_low // max(self._backlog_high, 1)
        if (
            self._limit - self._written > self._backlog_low
            and self._limit_bytes - self._written_bytes > low_bytes
        ):
            return
        self._limit = self._written + self._backlog_high
        self._limit_bytes = self._written_bytes + self._backlog_high_bytes
        self._ledger.actor_ref.tell(Grant(TABLE, self._limit, self._limit_bytes))

    def _flush(self) -> None:
        """Begin and write batches of what waits, each within the batch limits, one after the
        other, until a failed one waits for its retry."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._generation += 1
        while self._pending and self._retry_timer is None:
            packs = self._pending.take()
            records = tuple(r for p in packs for r in p.records)
            try:
                batch_id = self._ledger.begin_batch([(p.pack_id, p.seqs) for p in packs]).get(
                    timeout=LEDGER_ASK_TIMEOUT
                )
            except (StorageUnavailable, pykka.Timeout) as error:
                # Nothing was recorded (or, after a timeout, perhaps an empty batch that a
                # later begin empties: its rows move to the next one): the packs go back in
                # front.
                self._pending.put_back(packs)
                self._schedule_retry(None, error, len(records))
                return
            crash_point("after_batch_begin_before_job")
            self._write(ReplayBatch(batch_id, records, credited=True))

    # -- one batch --------------------------------------------------------------------------

    def _write(self, batch: ReplayBatch) -> None:
        """Prepare (parse) a batch and land it."""
        started = self._clock.monotonic()
        self._land(batch, self._prepare(batch.records, batch.batch_id), started)

    def _land(self, batch: ReplayBatch, prepared: PreparedBatch, started: float) -> None:
        """Write a prepared batch to Spark and commit it in the ledger; on a failure the batch
        waits for its retry (`_failed`), and the batches after it wait behind it."""
        from spark.prepare import count_readers
        from spark.schema import dead_letter_reasons
        from spark.tables import DEAD_LETTERS, EVENTS, READER_EVENTS, READS

        assert self._tables is not None
        batch_id, records = batch.batch_id, batch.records
        tables = prepared.tables
        try:
            reads = self._owned_reads(batch_id, tables.reads) if self._claim_reads else tables.reads
        except (StorageUnavailable, pykka.Timeout) as error:
            self._schedule_retry(batch, error)
            return
        to_write = {
            READS: reads,
            DEAD_LETTERS: tables.dead_letters,
            EVENTS: tables.events,
            READER_EVENTS: tables.reader_events,
        }
        holds = {name: table.num_rows for name, table in to_write.items()}
        watchdog = self._clock.call_later(
            self._processing_timeout, lambda: self._cancel_stuck(batch_id)
        )
        mid_job = crash_soon("mid_spark_job")
        try:
            # The ledger counts what the batch holds, committed now or by an earlier attempt.
            written = {**self._tables.write_batch(batch_id, to_write), **holds}
        except Exception as error:  # Spark and py4j raise many kinds; every one is retried
            self._schedule_retry(batch, error)
            return
        finally:
            watchdog.cancel()
            if mid_job is not None:
                mid_job.cancel()
        merges_retried, already_landed = (
            (0, 0) if self._group is None else self._tables.take_merge_counts()
        )
        crash_point("after_spark_job_before_mark")
        rows, dead = written.get(READS, 0), written.get(DEAD_LETTERS, 0)
        events = written.get(EVENTS, 0)
        readers = prepared.readers
        if readers is None:  # counted here, on the reads this batch owns after its claims
            readers = count_readers(self._readers, reads, tables.reader_events)
        health = prepared.health
        try:
            self._ledger.commit_batch(batch_id, rows, dead, readers, health).get(
                timeout=LEDGER_ASK_TIMEOUT
            )
        except (StorageUnavailable, pykka.Timeout) as error:
            # The batch is in the tables but not recorded: the retry finds it there, skips
            # every table, and records it.
            self._schedule_retry(batch, error)
            return
        if batch.credited:
            self._written += len(records)
            self._written_bytes += sum(len(r.payload) for r in records)
            self._give_credit()
        if self.failures:
            log.info(
                "tables written again: batch %d written after %d failed attempt(s) over %.0f s",
                batch_id,
                self.failures,
                self._clock.wall() - (self._health.failing_since or self._clock.wall()),
            )
            self.failures = 0
            self._report(
                WriterHealth(
                    total_failures=self._health.total_failures,
                    last_error=self._health.last_error,
                    last_failure_time=self._health.last_failure_time,
                )
            )
        self._readers.update(readers)
        self._reader_health.update(health)
        self._retry_backoff.reset()
        result = BatchWritten(
            batch_id,
            len(records),
            rows,
            dead,
            self._clock.monotonic() - started,
            events,
            tuple(readers.values()),
            written.get(READER_EVENTS, 0),
            health,
            tuple(
                (sink, reason, count)
                for (sink, reason), count in dead_letter_reasons(tables.dead_letters).items()
            ),
            already_landed,
            merges_retried,
        )
        self.last_batch = result
        log.info(
            "batch %d written: %d messages -> %d rows, %d dead letters in %.2f s",
            batch_id,
            result.messages,
            rows,
            dead,
            result.seconds,
        )
        self._listener.batch_written(result)

    def _prepare(self, records: Sequence, batch_id: int) -> PreparedBatch:
        """The batch's tables and reader accounting (spark.prepare.prepare_batch), made in this
        thread: the tag data parse runs in C++ with the GIL free for the intake."""
        from spark.prepare import prepare_batch

        # With claims (field ids), the reads are counted after them, in _land.
        readers = None if self._claim_reads else self._readers
        return prepare_batch(records, batch_id, self._build_options, readers, self._reader_health)

    def _ensure_session(self) -> None:
        """A JVM that died (out of memory exits it) is started again before a retry."""
        if self._session_per_pass:
            return  # pyarrow writes the batches: no session to start again
        try:
            self._session.sparkContext._jsc.sc().isStopped()
            return
        except Exception as error:  # py4j raises several kinds when the gateway is gone
            log.error("Spark session lost (%s): starting a new one", type(error).__name__)
        self._close_session()
        self._session = self._session_factory()
        self._tables = self._new_table_writer(self._session)

    def _cancel_stuck(self, batch_id: int) -> None:
        """Clock thread: the job outlived the processing timeout."""
        log.error(
            "batch %d not written within %.0f s: cancelling its Spark job (a pyarrow write "
            "cannot be cancelled: it ends or fails by itself)",
            batch_id,
            self._processing_timeout,
        )
        if self._tables is not None:
            self._tables.cancel()

    def _schedule_retry(
        self, batch: ReplayBatch | None, error: Exception, messages: int | None = None
    ) -> None:
        """One failed attempt: `batch` (None: a batch the ledger could not begin) waits for a
        retry after the next backoff delay; nothing behind it is written meanwhile."""
        self.failures += 1
        self._failed = batch
        delay = self._retry_backoff.next_delay()
        what = str(error).splitlines()[0] if str(error) else type(error).__name__
        log.error(
            "%s (attempt %d): %s; retrying in %.1f s (its %d messages stay in the ledger)",
            "a batch could not begin"
            if batch is None
            else f"batch {batch.batch_id}: table write failed",
            self.failures,
            what,
            delay,
            len(batch.records) if batch is not None else messages or 0,
        )
        self._retry_timer = self._clock.call_later(
            delay, lambda: tell_unless_dead(self.actor_ref, _Retry())
        )
        now = self._clock.wall()
        self._report(
            WriterHealth(
                failures=self.failures,
                total_failures=self._health.total_failures + 1,
                last_error=f"{type(error).__name__}: {what}",
                last_failure_time=now,
                failing_since=self._health.failing_since or now,
                next_retry_time=now + delay,
                waiting_batch=None if batch is None else batch.batch_id,
            )
        )

    def _report(self, health: WriterHealth) -> None:
        self._health = health
        self._listener.writer_health(health)

    def health(self) -> WriterHealth:
        return self._health

    def _owned_reads(self, batch_id: int, reads: pa.Table) -> pa.Table:
        """Keep the reads whose id this batch owns, each once (first occurrence)."""
        import pyarrow as pa

        ids = reads.column("message_id").to_pylist()
        owned = self._ledger.claim_reads(batch_id, ids).get(timeout=LEDGER_ASK_TIMEOUT)
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
