"""The tables are Delta Lake tables: exactly-once batch appends through the table's own log.

Every table (`reads`, `events`, `dead_letters`, `reader_events`) is a Delta table at
``{tables_dir}/{table}``, partitioned by receive `date` only, where `tables_dir` is a local path,
an object store delta-rs reaches (Azure, S3), or any Hadoop URI the cluster reaches
(spark/location.py). Each row keeps its landing batch in the ordinary column `batch_id` (and its
pack in `pack_id`).

Exactly once (DESIGN §7.7): each append carries a Delta transaction identifier, (application id,
version) with the application id stable for one gateway's ledger and the version the ledger's
batch id. Before a table is written, its last version for the application id is read from the
log; a batch at or below it is already in and is skipped. Batches commit in increasing order and
batch N+1 commits to no table before batch N is in every table it touches (the writer actor
keeps that order), so "last version >= N" means "N is in". A batch that spans four tables is
four commits; a crash between two of them is healed when the ledger replays the batch: the
tables that have it skip it, the others take it. Readers see snapshots of the log: they never
see half a commit, a file of a failed write, nor a compaction twice (spark/maintenance.py).

Two writers keep one contract (`write_batch`), with the same application ids, so a batch landed
by one is skipped by the other:
- `ArrowTableWriter` (the default landing, no JVM): pyarrow writes each date's rows as one
  Parquet file into the table directory, synced, and delta-rs commits the files with the
  transaction identifier (`DeltaTable.create_write_transaction`). The crash point between the
  two (`LANDED_NOT_COMMITTED`) leaves files that no snapshot lists; VACUUM removes them. On an
  object store each file is put whole in one request (obstore: the same Rust object_store, and
  the same environment variables, as delta-rs), and delta-rs commits by a conditional create of
  the next log entry (Azure's; S3's when configured for it: docs, object-store tables).
- `TableWriter` (`landing = "spark"`: a cluster, HDFS, s3a): a Spark job through delta-spark
  with `txnAppId` / `txnVersion`, which does the same skip inside its commit.

A shared group's tables (DESIGN §7.12): the members of one environment's shared subscription
land into one table per name. A broker may hand a read to a second member while the first has it
journaled (HiveMQ CE at a member's disconnect, EMQX at its session's expiry; MQTT 5 §4.8.2 allows
it), so both members land it; the table is the idempotent receiver. `GroupTableWriter` lands
each table's rows insert-if-absent on the row's identity (`IDENTITY`), in one commit that
still carries the member's own (application id, batch id) and also the group's transaction
identifier. Delta's conflict check orders the members: a commit decided on a snapshot that
another member's commit has since changed fails (`CommitFailedError`) and is made again from
the new snapshot, which then skips the rows the other member landed. A blind append would never
conflict, so a group member never appends without the group's identifier.

What every Delta reader can read (delta-rs, delta-spark, DuckDB's delta extension): timestamps
as UTC microseconds (Delta `timestamp`, never `timestamp_ntz`), every column nullable (NOT NULL
columns written by delta-rs made delta-spark refuse a table: DESIGN §7), reader version 1 and
writer version 2, no deletion vectors and no column mapping. Schema changes are additive: a
batch that brings a new column adds it to the table (nullable) before its append, so older rows
read it as null.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import time
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark.location import (
    STORE_VARIABLES,
    Location,
    delta_location,
    local_path,
    object_store,
    spark_uri,
)

logger = logging.getLogger(__name__)

READS = "reads"
DEAD_LETTERS = "dead_letters"
EVENTS = "events"
READER_EVENTS = "reader_events"
TABLES = (READS, EVENTS, DEAD_LETTERS, READER_EVENTS)

DATE = "date"
BATCH_ID = "batch_id"
PARTITION_COLUMNS = (DATE,)
# The table property that says a table's `date` is the receive date in every row (DESIGN §7.7).
# fxgate set `date` of `reads` and `events` from the event's own timestamp before; a table
# without the property has those rows redated once (`redate_by_receipt`) before any append.
DATE_OF = "fxgate.date"
RECEIVE_DATE = "received_time"
# The UTC day of received_time, in delta-rs's SQL (DataFusion) and in Spark's (whose session runs
# in UTC: spark/session.py).
_RECEIVE_DAY = "cast(cast(received_time as date) as varchar)"
_RECEIVE_DAY_SPARK = "date_format(received_time, 'yyyy-MM-dd')"
# The tables whose `date` an earlier fxgate took from the event's time (the others always had
# the receive date, and are only marked).
_EVENT_DATED = (READS, EVENTS)
# Timestamps as every Delta reader takes them: Delta `timestamp` is UTC microseconds.
UTC_MICROS = pa.timestamp("us", tz="UTC")
# Crash points (the actors arm them by name): a table's files written and synced, not yet
# committed (ArrowTableWriter); one table of a batch committed, the next not yet (both writers).
LANDED_NOT_COMMITTED = "landing_after_write_before_commit"
BETWEEN_TABLES = "landing_between_tables"
# A group member has read a table's snapshot and found which of its rows are absent, and has not
# committed them (GroupTableWriter): a test commits another member's batch here to make the two
# race, and a kill here loses nothing.
BEFORE_MERGE = "group_before_merge"

# A shared group's tables (DESIGN §7.12). The table property naming the group whose table it is
# (`{group}-{environment}`, the share name of `$share/{group}-{environment}/...`): a member of
# another group, or a gateway alone, is refused at start (`check_group`).
GROUP_OF = "fxgate.group"
# The table property a member sets right before each OPTIMIZE, as a claim. delta-rs 1.6.6
# commits an OPTIMIZE over files a concurrent OPTIMIZE already replaced (measured: two compactions
# from one snapshot both committed, and every row of those files was there twice), but it fails
# any commit whose window holds a metadata change. An OPTIMIZE that reads the snapshot of its own
# claim therefore commits only if no other member claimed after it: of two that overlap, the
# one that read first meets the other's claim and fails (spark/maintenance.py).
MAINTAINED_BY = "fxgate.maintenance"
# The column a group member adds to every row it lands: which member it was (its client id),
# so that `batch_id`, each member's own, is read with it, and a member's share is a count.
LANDED_BY = "landed_by"
# The columns that name one row of each table: a group member lands a row only when no row with
# the same values is there. A read's `message_id` comes from its message's key (topic and
# payload: the same whichever member received it); a message's dead letter is one per sink and
# reason; a life-cycle event's id is its own.
IDENTITY: dict[str, tuple[str, ...]] = {
    READS: ("message_id",),
    EVENTS: ("id",),
    DEAD_LETTERS: ("message_key", "sink", "reason"),
    READER_EVENTS: ("message_key",),
}
# A column every member sees the same for one row (the reader's or the event's own clock, never
# the receive time: a read handed to a second member is received later, perhaps on the next day,
# in another `date` partition). A member reads only the files whose statistics overlap the
# batch's range of it, so a landing's cost follows the batch, not the table's age; every file
# fxgate writes has those statistics (`_write_files`).
PRUNED_BY: dict[str, str] = {READS: "event_time", READER_EVENTS: "event_time", EVENTS: "time"}
# What two members' commits into a table must both carry a transaction identifier of, to be
# ordered (GroupTableWriter): one row's conflict key. Two rows of one identity are one read, with
# one reader and one event time, so they always have one key; two batches of different readers
# or seconds have different keys and commit side by side. Each key is hashed into one of
# CONFLICT_SLOTS identifiers, so a commit carries at most that many, and the table's snapshot
# never holds more: a batch of one second of four readers carries 4 to 8, and two such batches
# of other readers share one by chance a few times in a hundred. A table without keys here has
# one identifier for the whole group. Members that key differently would not be ordered at all:
# the table carries the scheme (CONFLICTS), and a member of another scheme is refused at start
# (`check_group`).
CONFLICT_KEYS: dict[str, tuple[str, str]] = {READS: ("reader_id", "event_time")}
CONFLICT_SLOTS = 1024
CONFLICT_SCHEME = f"reads: reader_id, event_time second; {CONFLICT_SLOTS} slots"
CONFLICTS = "fxgate.group.conflicts"
# How delta-rs says that a data file of the snapshot it read is not there any more.
_MISSING_FILE = re.compile(r"not found|No such file", re.IGNORECASE)
# Landings of one table in a row that another member's commit may make fail before the batch
# fails (the writer actor then retries it after its backoff, as any failed write).
MERGE_ATTEMPTS = 8

# Table properties of every table fxgate creates (spark/maintenance.py keeps them up to date).
# Reader 1 / writer 2 is what every Delta reader reads; fxgate asks for no table feature.
_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_DATE_VALUE = r"^\d{4}-\d{2}-\d{2}$"


def table_path(tables_dir: Location, name: str) -> str:
    """Location of table `name`; `tables_dir` may be a local path or any Hadoop URI."""
    if not _TABLE_NAME.match(name):
        raise ValueError(f"invalid table name {name!r}")
    return f"{str(tables_dir).rstrip('/')}/{name}"


class TablesNotReadable(ValueError):
    """The tables are on a file system only Spark reaches (`hdfs://`, `s3a://`...): the
    readers that start no JVM (status, dead-letters list) cannot read them."""


def application_id(gateway_id: str) -> str:
    """The Delta application id of one gateway's ledger (its random id, made with the ledger):
    two gateways writing one table never share it, and a new ledger (whose batch ids start at 1
    again) never has its batches skipped for an old ledger's."""
    if not gateway_id or not re.fullmatch(r"[A-Za-z0-9_.:-]+", gateway_id):
        raise ValueError(f"invalid gateway id {gateway_id!r}")
    return f"fxgate-ledger-{gateway_id}"


def is_delta_table(path: Location) -> bool:
    """Whether a Delta log exists at `path` (on this disk or an object store; on Spark's file
    systems, Spark checks)."""
    local = local_path(path)
    if local is not None:
        return (local / "_delta_log").is_dir()
    if object_store(path) is None:
        return False
    from deltalake import DeltaTable

    return DeltaTable.is_deltatable(str(path))


def table_properties(
    checkpoint_interval: int = 10,
    log_retention_hours: float = 1.0,
    deleted_file_retention_hours: float = 1.0,
) -> dict[str, str]:
    """Delta table properties fxgate sets on its tables (spark/maintenance.py says why each).

    `delta.checkpointInterval`: a checkpoint every that many commits, so opening the table reads
    one Parquet checkpoint and at most that many JSON commits, however old the table is.
    `delta.logRetentionDuration`: commits older than this go at a checkpoint (delta-rs and
    delta-spark both clean up then), so a table committing every second keeps a bounded log.
    `delta.deletedFileRetentionDuration`: what VACUUM keeps of the files a compaction replaced,
    for readers that opened an older snapshot (any engine's VACUUM honours it).
    """
    return {
        "delta.checkpointInterval": str(int(checkpoint_interval)),
        "delta.logRetentionDuration": f"interval {_whole_seconds(log_retention_hours)} seconds",
        "delta.deletedFileRetentionDuration": (
            f"interval {_whole_seconds(deleted_file_retention_hours)} seconds"
        ),
        "delta.enableExpiredLogCleanup": "true",
    }


def _whole_seconds(hours: float) -> int:
    return max(0, round(hours * 3600))


def delta_schema(table: pa.Table | pa.Schema) -> pa.Schema:
    """The schema fxgate writes for `table`: every column nullable, timestamps UTC micros,
    plain strings and binaries (what every Delta reader reads)."""
    schema = table if isinstance(table, pa.Schema) else table.schema
    fields = []
    for field in schema:
        kind = field.type
        if pa.types.is_timestamp(kind):
            kind = UTC_MICROS
        elif pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
            kind = pa.string()
        elif pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
            kind = pa.binary()
        elif pa.types.is_dictionary(kind):
            kind = kind.value_type
        fields.append(pa.field(field.name, kind, nullable=True))
    return pa.schema(fields)


def as_written(table: pa.Table) -> pa.Table:
    """`table` cast to `delta_schema` (a tz-naive timestamp is taken as UTC, as Spark takes it;
    a nanosecond one loses its last digits, as Spark's microseconds lose them)."""
    schema = delta_schema(table)
    if schema == table.schema:
        return table
    columns = []
    for column, field in zip(table.columns, schema, strict=True):
        if pa.types.is_timestamp(column.type) and column.type.tz is None:
            column = pc.assume_timezone(column, "UTC")
        columns.append(column.cast(field.type, safe=False))
    return pa.Table.from_arrays(columns, schema=schema)


def _prepared(table: pa.Table, batch_id: int) -> pa.Table:
    """A batch's table checked (a 'YYYY-MM-DD' `date` on every row) and given its `batch_id`."""
    names = table.schema.names
    if DATE not in names:
        raise ValueError(f"table has no {DATE!r} column (columns: {names})")
    date = table.column(DATE)
    if not (pa.types.is_string(date.type) or pa.types.is_large_string(date.type)):
        raise ValueError(f"column {DATE!r} must be a 'YYYY-MM-DD' string, not {date.type}")
    if table.num_rows and (
        date.null_count or not pc.all(pc.match_substring_regex(date, _DATE_VALUE)).as_py()
    ):
        raise ValueError(f"column {DATE!r} holds a null or a value not shaped 'YYYY-MM-DD'")
    if BATCH_ID not in names:
        table = table.append_column(
            pa.field(BATCH_ID, pa.int64()),
            pa.repeat(pa.scalar(batch_id, pa.int64()), table.num_rows),
        )
    else:
        ids = table.column(BATCH_ID).cast(pa.int64())
        if table.num_rows and (ids.null_count or not pc.all(pc.equal(ids, batch_id)).as_py()):
            raise ValueError(f"column {BATCH_ID!r} holds values other than {batch_id}")
        table = table.set_column(names.index(BATCH_ID), BATCH_ID, ids)
    return as_written(table)


def _check_batch_id(batch_id: int) -> None:
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 1:
        raise ValueError(f"batch_id must be a positive int, got {batch_id!r}")


def _write_tables(
    tables_dir: str,
    batch_id: int,
    tables: Mapping[str, pa.Table],
    append: Callable[[str, str, pa.Table], bool],
    checkpoint: Callable[[str], None],
) -> dict[str, int]:
    """Both writers' `write_batch`: validate every table first, then `append(name, path,
    table)` each table that has rows, one after the other; the rows per table (what the batch
    holds, whether this call appended them or an earlier attempt did)."""
    _check_batch_id(batch_id)
    prepared = {
        name: (table_path(tables_dir, name), _prepared(table, batch_id))
        for name, table in tables.items()
    }
    started = time.perf_counter()
    written: dict[str, int] = {}
    skipped: list[str] = []
    committed = False  # a table before this one took the batch
    for name, (path, table) in prepared.items():
        written[name] = table.num_rows
        if not table.num_rows:
            continue
        if committed:
            checkpoint(BETWEEN_TABLES)
        if append(name, path, table):
            committed = True
        else:
            skipped.append(name)
    logger.info(
        "Batch %s written in %.2f s: %s%s",
        batch_id,
        time.perf_counter() - started,
        ", ".join(f"{name}={rows}" for name, rows in written.items()),
        f" ({', '.join(skipped)} had it already)" if skipped else "",
    )
    return written


class ArrowTableWriter:
    """Appends batches with pyarrow and delta-rs, in this process, with no JVM.

    For each table of a batch: read the table's last version for this gateway's application id
    (skip the table if the batch is in already), add any new column to the table's schema, write
    one Parquet file per date into ``date=D/`` (synced, under a fresh name no snapshot lists),
    then commit them in one Delta commit carrying (application id, batch id). delta-rs commits
    by an atomic create-if-absent of the next log entry, so a kill leaves either the commit or
    only unlisted files.
    """

    def __init__(
        self,
        session: object,
        tables_dir: Location,
        app_id: str,
        checkpoint: Callable[[str], None] = lambda name: None,
        properties: Mapping[str, str] | None = None,
        *,
        log_cleanup: bool = True,
    ) -> None:
        root = delta_location(tables_dir)
        if root is None:
            raise TablesNotReadable(
                f"{tables_dir} is neither on this machine's disk nor on an object store "
                "delta-rs reaches: batches go through Spark there"
            )
        self._tables_dir = root
        self._app_id = app_id
        # Called at LANDED_NOT_COMMITTED (the actors arm their crash point of that name there).
        self._checkpoint = checkpoint
        self._properties = dict(table_properties() if properties is None else properties)
        # Whether each commit also deletes the log entries past the log's retention (delta-rs's
        # default, which lists the whole log again after every commit: 16 of the 34 ms of an
        # append after a day of commits, measured); False where a maintenance pass does it.
        self._log_cleanup = log_cleanup
        # Open tables, updated incrementally (opening one reads its log from the checkpoint on).
        self._open: dict[str, object] = {}

    @property
    def app_id(self) -> str:
        return self._app_id

    def cancel(self) -> None:
        """Nothing runs that another thread could cancel: a local write ends or raises."""

    def close(self) -> None:
        """Let go of the open tables now, not at interpreter exit: delta-rs and Arrow thread
        pools torn down in the wrong order at exit aborted the process ("terminate called
        without an active exception"), 1 run in 10 here, after writes and a maintenance pass."""
        self._open.clear()
        gc.collect()

    def write_batch(self, batch_id: int, tables: Mapping[str, pa.Table]) -> dict[str, int]:
        """Append every table of batch `batch_id` that does not have it yet; see the module."""
        return _write_tables(self._tables_dir, batch_id, tables, self._append, self._checkpoint)

    def last_version(self, name: str) -> int | None:
        """The last batch id of this gateway's application id in table `name` (None: none)."""
        table = self._table(table_path(self._tables_dir, name), None)
        return None if table is None else table.transaction_version(self._app_id)

    def _table(self, path: str, schema: pa.Schema | None):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        table = self._open.get(path)
        if table is not None:
            table.update_incremental()
            return table
        try:
            table = DeltaTable(path)
        except TableNotFoundError:
            if schema is None:
                return None
            table = self._create(path, schema)
        self._open[path] = table
        return table

    def _create(self, path: str, schema: pa.Schema):
        from deltalake import DeltaTable
        from deltalake.exceptions import CommitFailedError

        try:
            table = DeltaTable.create(
                path,
                schema=schema,
                partition_by=list(PARTITION_COLUMNS),
                mode="ignore",  # another writer made it first: append to theirs
                configuration={**self._properties, **self._created_with(), DATE_OF: RECEIVE_DATE},
                raise_if_key_not_exists=False,  # DATE_OF is ours, not one Delta defines
            )
        except CommitFailedError:
            # Another member's first commit won the race for version 0: theirs is the table.
            logger.info("Delta table %s: made by another writer at the same moment", path)
            return DeltaTable(path)
        logger.info("Delta table created: %s", path)
        return table

    def _created_with(self) -> dict[str, str]:
        """Table properties of ours that a table this writer creates carries from its start."""
        return {}

    def _append(self, name: str, path: str, table: pa.Table) -> bool:

        delta = self._table(path, table.schema)
        done = delta.transaction_version(self._app_id)
        batch_id = int(table.column(BATCH_ID)[0].as_py())
        if done is not None and done >= batch_id:
            return False
        table = _as_table_types(delta, table)
        add_new_columns(delta, table.schema)
        adds = _write_files(path, table, _stats_of(name))
        self._checkpoint(LANDED_NOT_COMMITTED)
        commit_files(delta, adds, self._app_id, batch_id, log_cleanup=self._log_cleanup)
        return True


def commit_files(
    delta,
    adds: list,
    app_id: str,
    version: int,
    metadata: Mapping[str, str] | None = None,
    also: Sequence[tuple[str, int]] = (),
    log_cleanup: bool = True,
) -> None:
    """Commit the written files `adds` as one append carrying the transaction (app_id,
    version), and the transactions `also`: the one place a Delta commit of ours is made with
    delta-rs. `log_cleanup` False: the commit leaves the expired log entries to the next
    maintenance pass (spark.maintenance), instead of the table's `enableExpiredLogCleanup`."""
    from deltalake import CommitProperties, PostCommitHookProperties, Transaction

    delta.create_write_transaction(
        adds,
        mode="append",
        schema=delta.schema(),
        partition_by=list(PARTITION_COLUMNS),
        commit_properties=CommitProperties(
            custom_metadata=dict(metadata) if metadata else None,
            app_transactions=[Transaction(app_id, version)]
            + [Transaction(other, number) for other, number in also],
        ),
        post_commithook_properties=PostCommitHookProperties(
            cleanup_expired_logs=None if log_cleanup else False
        ),
    )


def _as_table_types(delta, table: pa.Table) -> pa.Table:
    """`table` with each column the Delta table has already cast to the table's type (an int32
    batch column into a long one); a column that does not cast safely is refused before any file
    is written, since files of another type would make the table unreadable to every reader."""
    have = {field.name: field.type for field in pa.schema(delta.schema())}
    for index, field in enumerate(table.schema):
        kind = have.get(field.name)
        if kind is None or kind == field.type:
            continue
        try:
            column = table.column(index).cast(kind, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise ValueError(
                f"column {field.name!r} is {kind} in the table, and this batch's {field.type} "
                f"does not convert: {error}"
            ) from None
        table = table.set_column(index, pa.field(field.name, kind, nullable=True), column)
    return table


def add_new_columns(delta, schema: pa.Schema) -> None:
    """Schema evolution: the columns of `schema` the table lacks are added to it, nullable."""
    from deltalake import Schema as DeltaSchema

    have = set(pa.schema(delta.schema()).names)
    new = [field for field in schema if field.name not in have]
    if not new:
        return
    fields = DeltaSchema.from_arrow(pa.schema(new)).fields
    delta.alter.add_columns(list(fields))
    delta.update_incremental()
    logger.info(
        "Delta table %s: column(s) %s added", delta.table_uri, ", ".join(f.name for f in new)
    )


def _write_files(table_dir: Location, table: pa.Table, stats: Sequence[str] = ()) -> list:
    """One Parquet file per date of `table` under ``date=D/`` of the table at `table_dir`
    (this disk's, synced; or an object store's, put whole); their Delta add actions, each with
    its row count and the min and max of the timestamp columns `stats` (what lets a reader, and
    a group member looking for a read, skip the file)."""
    from deltalake.transaction import AddAction

    token = uuid.uuid4().hex
    dates = table.column(DATE)
    data = table.drop_columns(list(PARTITION_COLUMNS))
    local = local_path(table_dir)
    adds = []
    for date in sorted(pc.unique(dates).to_pylist()):
        rows = data.filter(pc.equal(dates, date))
        relative = f"{DATE}={date}/part-00000-{token}.c000.snappy.parquet"
        if local is None:
            size, millis = _put_file(str(table_dir), relative, rows)
        else:
            size, millis = _write_local_file(local / relative, rows)
        adds.append(
            AddAction(
                relative, size, {DATE: date}, millis, True, json.dumps(_statistics(rows, stats))
            )
        )
    return adds


def _write_local_file(full: Path, rows: pa.Table) -> tuple[int, int]:
    """`rows` as a Parquet file at `full`, synced; (size, modification time in ms)."""
    full.parent.mkdir(parents=True, exist_ok=True)
    with open(full, "wb") as file:
        pq.write_table(rows, file, compression="snappy")
        file.flush()
        os.fsync(file.fileno())
    stat = full.stat()
    return stat.st_size, int(stat.st_mtime * 1000)


def _put_file(table_uri: str, relative: str, rows: pa.Table) -> tuple[int, int]:
    """`rows` as a Parquet blob at `relative` in the table at `table_uri` on an object store,
    put in one request: a blob is there whole or not at all; (size, now in ms)."""
    import obstore

    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink, compression="snappy")
    data = sink.getvalue().to_pybytes()
    obstore.put(_object_store_client(table_uri), relative, data)
    return len(data), int(time.time() * 1000)


def _store_key(table_uri: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A client for `table_uri` is reused while the store's variables stay as they are (they
    say which account, endpoint and credentials it uses; a test points them elsewhere)."""
    variables = tuple(
        sorted(
            (name, value) for name, value in os.environ.items() if name.startswith(STORE_VARIABLES)
        )
    )
    return table_uri, variables


_CLIENTS: dict[tuple, object] = {}


def _object_store_client(table_uri: str):
    """An obstore client of the table at `table_uri` (configured from the environment, as
    delta-rs configures its own), kept for the next file."""
    key = _store_key(table_uri)
    client = _CLIENTS.get(key)
    if client is None:
        from obstore.store import from_url

        client = _CLIENTS[key] = from_url(table_uri)
    return client


def _object_store_files(table_uri: str):
    """A pyarrow file system over the table at `table_uri` on an object store (delta-rs's,
    configured as its tables are), kept for the next read."""
    key = ("files", *_store_key(table_uri))
    files = _CLIENTS.get(key)
    if files is None:
        from deltalake.fs import DeltaStorageHandler
        from pyarrow.fs import PyFileSystem

        files = _CLIENTS[key] = PyFileSystem(DeltaStorageHandler(table_uri))
    return files


def read_columns(table_dir: Location, files: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """Columns `columns` of the data files `files` (relative paths) of the table at
    `table_dir`, on this disk or an object store."""
    local = local_path(table_dir)
    if local is not None:
        return pq.read_table([str(local / file) for file in files], columns=list(columns))
    return pq.read_table(
        list(files), columns=list(columns), filesystem=_object_store_files(str(table_dir))
    )


def _statistics(rows: pa.Table, columns: Sequence[str]) -> dict:
    """Delta file statistics: the row count, and for each timestamp column of `columns` that
    has values its null count, min and max. Delta keeps timestamp statistics to the
    millisecond: the min is rounded down and the max up, so the range holds every value."""
    found: dict = {"numRecords": rows.num_rows}
    for name in columns:
        if name not in rows.schema.names or not pa.types.is_timestamp(rows.schema.field(name).type):
            continue
        column = rows.column(name)
        low, high = pc.min_max(column).values()
        if not low.is_valid:
            continue
        micros_low = low.cast(UTC_MICROS).value
        micros_high = high.cast(UTC_MICROS).value
        found.setdefault("minValues", {})[name] = _millis_text(micros_low // 1000)
        found.setdefault("maxValues", {})[name] = _millis_text(-(-micros_high // 1000))
        found.setdefault("nullCount", {})[name] = column.null_count
    return found


def _millis_text(millis: int) -> str:
    seconds, fraction = divmod(millis, 1000)
    when = datetime.fromtimestamp(seconds, UTC)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{fraction:03d}Z"


def _stats_of(name: str) -> tuple[str, ...]:
    column = PRUNED_BY.get(name)
    return () if column is None else (column,)


class GroupTableWriter(ArrowTableWriter):
    """A shared group member's landing: each table's rows insert-if-absent (see the module),
    with no lock between the members; the same exactly-once contract and application ids as
    `ArrowTableWriter` for the member's own batches.

    For each table of a batch: read the table's snapshot (skip the table if this member's
    application id has the batch already) and add any new column; read the identities
    (`IDENTITY`) of the rows in the files that can hold one of the batch's rows (their
    statistics of `PRUNED_BY` overlap the batch's range, or they have none); write the batch's
    rows whose identity is not among them, and commit them in one append carrying the member's
    (application id, batch id) and the group's transaction identifiers of those rows' conflict
    keys (`conflict_ids`). Delta fails a commit when a concurrent commit carries a transaction
    of the same application id, so two commits of the group's that could hold one read were
    decided one after the other, the later on a snapshot holding the earlier: what another
    member landed meanwhile makes the commit fail, and it is made again from the new snapshot,
    up to `MERGE_ATTEMPTS` times. Commits of other readers or other seconds do not wait for each
    other. A batch whose rows are all there commits nothing.

    Why not delta-rs's MERGE (`when_not_matched_insert_all`), which inserts the same rows and
    fails on a concurrent commit over the files it read: measured here, 400 reads into a table
    of 100 files took a MERGE 15-20 ms (30 ms with its planning) against 10 ms for an append,
    and reading the candidate files' identities 3-4 ms; a group's landing is to keep half a
    gateway alone's rows/s (`make bench`, group-landing).
    """

    def __init__(
        self,
        session: object,
        tables_dir: Location,
        app_id: str,
        checkpoint: Callable[[str], None] = lambda name: None,
        properties: Mapping[str, str] | None = None,
        *,
        group: str,
        member: str,
        log_cleanup: bool = True,
    ) -> None:
        super().__init__(
            session, tables_dir, app_id, checkpoint, properties, log_cleanup=log_cleanup
        )
        self._group = group
        self._group_app = group_application_id(group)
        self._member = member
        self._retries = 0
        self._already = 0
        # Per landing of a table: how many data files its identities were read from.
        self._files_read: list[int] = []

    def _created_with(self) -> dict[str, str]:
        return {GROUP_OF: self._group, CONFLICTS: CONFLICT_SCHEME}

    def take_merge_counts(self) -> tuple[int, int]:
        """(landings retried, reads another member had landed) since the last call."""
        counts = self._retries, self._already
        self._retries = self._already = 0
        return counts

    def take_files_read(self) -> list[int]:
        """For each landing of a table since the last call, the data files read (the candidates
        `absent_rows` read the identities of): what keeps a landing's cost that of its batch."""
        found, self._files_read = self._files_read, []
        return found

    def _append(self, name: str, path: str, table: pa.Table) -> bool:
        from deltalake.exceptions import CommitFailedError, DeltaError

        batch_id = int(table.column(BATCH_ID)[0].as_py())
        if LANDED_BY not in table.schema.names:
            table = table.append_column(
                pa.field(LANDED_BY, pa.string()), pa.repeat(pa.scalar(self._member), table.num_rows)
            )
        landing: _Landing | None = None
        for attempt in range(1, MERGE_ATTEMPTS + 1):
            try:
                if landing is None:
                    landing = self._decide(name, path, table, batch_id)
                    if landing is None:
                        return False  # this member's batch is in already
                else:
                    # Lost a race: only the files committed since the snapshot can hold one of
                    # the rows written (decided against that snapshot); those rows are written
                    # again only when another member landed some of them meanwhile.
                    self._redecide(landing, name, path)
                if landing.fresh.num_rows:
                    if landing.adds is None:
                        landing.adds = _write_files(path, landing.fresh, _stats_of(name))
                        self._checkpoint(LANDED_NOT_COMMITTED)
                    turn = landing.delta.version() + 1
                    commit_files(
                        landing.delta,
                        landing.adds,
                        self._app_id,
                        batch_id,
                        also=[(app, turn) for app in landing.conflicts],
                        log_cleanup=self._log_cleanup,
                    )
            except (CommitFailedError, DeltaError, FileNotFoundError) as error:
                # A commit race; or a file of the snapshot read gone, replaced by another
                # member's OPTIMIZE and deleted by a VACUUM whose retention that snapshot outlived
                # (then the whole landing is decided again).
                raced = isinstance(error, CommitFailedError)
                if not raced and not _MISSING_FILE.search(str(error)):
                    raise
                if not raced:
                    landing = None
                self._retries += 1
                if attempt == MERGE_ATTEMPTS:
                    raise
                logger.info(
                    "batch %d, table %s: another commit came first (%s); landing again "
                    "(attempt %d)",
                    batch_id,
                    name,
                    (str(error).splitlines() or ["a concurrent commit"])[0],
                    attempt + 1,
                )
                continue
            already = landing.rows - landing.fresh.num_rows
            if name == READS:
                self._already += already
            if already:
                logger.info(
                    "batch %d, table %s: %d of %d row(s) already landed by another member",
                    batch_id,
                    name,
                    already,
                    landing.rows,
                )
            return True
        raise AssertionError("unreachable")

    def _decide(self, name: str, path: str, table: pa.Table, batch_id: int) -> _Landing | None:
        """The rows of the batch that the table's current snapshot lacks (None: the member's
        application id has the batch in already)."""
        delta = self._table(path, table.schema)
        done = delta.transaction_version(self._app_id)
        if done is not None and done >= batch_id:
            return None
        typed = _as_table_types(delta, table)
        add_new_columns(delta, typed.schema)
        actions = _add_actions(delta)
        candidates = candidate_files(delta, name, typed, actions)
        self._files_read.append(len(candidates))
        fresh = absent_rows(delta, path, name, typed, candidates)
        self._checkpoint(BEFORE_MERGE)
        conflicts = conflict_ids(self._group_app, name, fresh) if fresh.num_rows else []
        return _Landing(
            delta,
            typed.num_rows,
            fresh,
            set(actions.column("path").to_pylist()),
            conflicts,
            {app: delta.transaction_version(app) for app in conflicts},
        )

    def _redecide(self, landing: _Landing, name: str, path: str) -> None:
        delta = landing.delta
        delta.update_incremental()
        add_new_columns(delta, landing.fresh.schema)
        actions = _add_actions(delta)
        live = set(actions.column("path").to_pylist())
        new = live - landing.seen
        landing.seen = live
        turns = {app: delta.transaction_version(app) for app in landing.conflicts}
        landed, landing.turns = turns != landing.turns, turns
        if not new or not landing.fresh.num_rows or not landed:
            # No landing of the group's that could hold one of these rows came since the last
            # look (a maintenance claim failed the commit, say): the files that came are
            # another reader's or second, or an OPTIMIZE's, whose rows were there before.
            return
        candidates = [f for f in candidate_files(delta, name, landing.fresh, actions) if f in new]
        self._files_read.append(len(candidates))
        still = absent_rows(delta, path, name, landing.fresh, candidates)
        if still.num_rows < landing.fresh.num_rows:
            landing.fresh, landing.adds = still, None  # the files written go at a VACUUM
            landing.conflicts = conflict_ids(self._group_app, name, still)
            landing.turns = {app: turns[app] for app in landing.conflicts if app in turns}


@dataclass(slots=True)
class _Landing:
    """One table's landing of a batch by a group member, across its attempts."""

    delta: object  # the DeltaTable, brought up to date at each attempt
    rows: int  # the batch's rows for the table
    fresh: pa.Table  # those the table lacked at the last look
    seen: set[str]  # the data files of the snapshot the last look read
    conflicts: list[str]  # the group's transaction identifiers of `fresh` (`conflict_ids`)
    turns: dict[str, int | None]  # their versions at the last look
    adds: list | None = None  # the files written of `fresh`, not yet committed


def _add_actions(delta) -> pa.Table:
    """The snapshot's data files, one row each with its statistics (flattened)."""
    return pa.table(delta.get_add_actions(flatten=True))


def group_application_id(group: str) -> str:
    """The Delta application id of `group`'s commits into a table without conflict keys, and
    the stem of its conflict keys' identifiers (`conflict_ids`)."""
    return f"fxgate-group-{group}"


def conflict_ids(group_app: str, name: str, rows: pa.Table) -> list[str]:
    """The group's transaction identifiers a commit of `rows` into table `name` carries: one per
    conflict slot of the rows (`CONFLICT_KEYS`: reader and event-time second, hashed), or
    `group_app` alone for a table without keys. A row without an event time (or a batch without
    the column: every member's parse gives one read the same columns) has the key of its reader
    alone."""
    keys = CONFLICT_KEYS.get(name)
    if keys is None:
        return [group_app]
    reader, clock = (
        rows.column(column) if column in rows.schema.names else pa.nulls(rows.num_rows)
        for column in keys
    )
    micros = (
        pc.cast(clock, pa.int64())
        if pa.types.is_null(clock.type)
        else (pc.cast(clock, UTC_MICROS).cast(pa.int64()))
    )
    seconds = pc.divide(micros, 1_000_000)  # event times are after 1970: truncation floors
    pairs = pa.table({"r": reader, "s": seconds}).group_by(["r", "s"]).aggregate([])
    slots = {
        zlib.crc32(f"{r}\x1f{s}".encode()) % CONFLICT_SLOTS
        for r, s in zip(pairs.column("r").to_pylist(), pairs.column("s").to_pylist(), strict=True)
    }
    return [f"{group_app}/{slot}" for slot in sorted(slots)]


def absent_rows(
    delta, table_dir: Location, name: str, batch: pa.Table, files: Sequence[str] | None = None
) -> pa.Table:
    """The rows of `batch` whose identity (`IDENTITY[name]`) no row of the table's snapshot
    `delta` has, each once. Only the files that can hold one of them are read, and only their
    identity columns: where every row of the batch has the pruning column (`PRUNED_BY`), the
    files whose statistics of it overlap the batch's range, or that have none; else every
    file (`files`, when the caller has them already). A row equal on the identity is the same
    read, with the same pruning value, so the range never hides one."""
    columns = IDENTITY.get(name)
    if columns is None:
        raise ValueError(f"no identity known for table {name!r}")
    missing = [column for column in columns if column not in batch.schema.names]
    if missing:
        raise ValueError(f"table {name!r} lacks its identity column(s) {missing}")
    if files is None:
        files = candidate_files(delta, name, batch)
    if files:
        landed = read_columns(table_dir, files, columns)
        present = _identity(landed, columns)
    else:
        present = pa.array([], pa.string())
    keys = _identity(batch, columns)
    return batch.filter(pc.invert(pc.is_in(keys, value_set=present)))


def candidate_files(
    delta, name: str, batch: pa.Table, actions: pa.Table | None = None
) -> list[str]:
    """The data files (relative paths) of the snapshot that can hold a row of `batch`: see
    `absent_rows`; `actions`, the snapshot's files when the caller has them already."""
    if actions is None:
        actions = _add_actions(delta)
    if not actions.num_rows:
        return []
    column = PRUNED_BY.get(name)
    low_name, high_name = f"min.{column}", f"max.{column}"
    if (
        column is None
        or column not in batch.schema.names
        or not batch.num_rows
        or batch.column(column).null_count
        or low_name not in actions.schema.names
        or high_name not in actions.schema.names
    ):
        return actions.column("path").to_pylist()
    low, high = pc.min_max(batch.column(column)).values()
    file_low = actions.column(low_name).cast(UTC_MICROS)
    file_high = actions.column(high_name).cast(UTC_MICROS)
    overlaps = pc.and_(
        pc.greater_equal(file_high, low.cast(UTC_MICROS)),
        pc.less_equal(file_low, high.cast(UTC_MICROS)),
    )
    unknown = pc.or_(pc.is_null(file_low), pc.is_null(file_high))
    keep = pc.fill_null(pc.or_(overlaps, unknown), True)
    return actions.filter(keep).column("path").to_pylist()


def _identity(table: pa.Table, columns: Sequence[str]) -> pa.Array:
    """One string per row naming its identity; a null part is a value of its own."""
    parts = [
        pc.fill_null(pc.cast(table.column(column), pa.string()), "\x00").combine_chunks()
        for column in columns
    ]
    return parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "\x1f")


class TablesOfAnotherGroup(ValueError):
    """A table at the tables directory belongs to another shared group, or to one while this
    gateway is alone (or alone while this gateway is in a group): the daemon does not start."""


def check_group(tables_dir: Location, group: str | None) -> list[str]:
    """Refuse tables that are not this gateway's to land in (`TablesOfAnotherGroup`, naming the
    table, its group and this gateway's), before anything is written: a member of `group`
    (`{group}-{environment}`, None for a gateway alone) lands only into tables of that group or
    into tables it makes; a gateway alone never into a group's, since its appends carry no
    group transaction identifier and would not conflict with the members' commits. A group
    member adopts the tables a gateway alone left there (a group scaling out from one gateway
    keeps its table); their names."""
    from deltalake import DeltaTable

    adopted = []
    for name in TABLES:
        path = table_path(delta_location(tables_dir) or tables_dir, name)
        if not is_delta_table(path):
            continue
        table = DeltaTable(path)
        configuration = table.metadata().configuration
        owner = configuration.get(GROUP_OF)
        if owner == group:
            scheme = configuration.get(CONFLICTS)
            if group is None:
                continue  # a gateway alone's own table
            if scheme is None:
                table.alter.set_table_properties(
                    {CONFLICTS: CONFLICT_SCHEME}, raise_if_not_exists=False
                )
            elif scheme != CONFLICT_SCHEME:
                raise TablesOfAnotherGroup(
                    f"{path}: group {group!r}'s members order their commits by conflict keys "
                    f"{scheme!r} there, and this fxgate by {CONFLICT_SCHEME!r}: two members "
                    "keying differently would land a read twice. Run one fxgate version in "
                    "every member of a group"
                )
            continue
        if owner is None:
            table.alter.set_table_properties(
                {GROUP_OF: group, CONFLICTS: CONFLICT_SCHEME}, raise_if_not_exists=False
            )
            adopted.append(name)
            logger.warning(
                "Delta table %s: landed by a gateway alone until now, from now on by the "
                "members of group %s (insert-if-absent); a gateway alone must not "
                "write it any more",
                path,
                group,
            )
            continue
        if group is None:
            raise TablesOfAnotherGroup(
                f"{path} is the table of shared group {owner!r}, whose members land each "
                "read once between them; this gateway has no [source] "
                "shared_subscription_group. Join the group (its shared_subscription_group and "
                "environment_id), or give this gateway a [spark] tables_dir of its own"
            )
        raise TablesOfAnotherGroup(
            f"{path} is the table of shared group {owner!r}, and this gateway is a member of "
            f"{group!r}: each environment's group lands into tables of its own. Check [source] "
            "environment_id and shared_subscription_group, or give this group a [spark] "
            "tables_dir of its own"
        )
    return adopted


class TableWriter:
    """Appends batches through Spark jobs with delta-spark (`landing = "spark"`: a cluster, or
    tables on HDFS/S3): the same contract and application ids as `ArrowTableWriter`.

    delta-spark records `txnAppId`/`txnVersion` in the commit and skips a write whose version
    is not above the one recorded; the writer also reads the version first (through
    `DeltaTable.forPath`), so a batch in already starts no job. Schema evolution is
    `mergeSchema` on the append; the table properties are set when a write creates the table.
    """

    def __init__(
        self,
        session,
        tables_dir: Location,
        app_id: str,
        properties: Mapping[str, str] | None = None,
        checkpoint: Callable[[str], None] = lambda name: None,
    ) -> None:
        self._session = session
        self._tables_dir = spark_uri(tables_dir)
        self._app_id = app_id
        self._checkpoint = checkpoint  # called at BETWEEN_TABLES
        self._properties = dict(table_properties() if properties is None else properties)

    @property
    def app_id(self) -> str:
        return self._app_id

    def cancel(self) -> None:
        """Cancel the running Spark job (from another thread): its write_batch raises."""
        self._session.sparkContext.cancelAllJobs()

    def close(self) -> None:
        """Nothing held: the session is the writer actor's to stop."""

    def write_batch(self, batch_id: int, tables: Mapping[str, pa.Table]) -> dict[str, int]:
        return _write_tables(self._tables_dir, batch_id, tables, self._append, self._checkpoint)

    def last_version(self, name: str) -> int | None:
        return spark_last_version(self._session, table_path(self._tables_dir, name), self._app_id)

    def _append(self, name: str, path: str, table: pa.Table) -> bool:
        batch_id = int(table.column(BATCH_ID)[0].as_py())
        done = spark_last_version(self._session, path, self._app_id)
        if done is not None and done >= batch_id:
            return False
        writer = (
            self._session.createDataFrame(table)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", self._app_id)
            .option("txnVersion", batch_id)
            .option("mergeSchema", "true")
            .partitionBy(*PARTITION_COLUMNS)
        )
        if done is None:
            for key, value in self._properties.items():
                writer = writer.option(key, value)
        writer.save(path)
        return True


def spark_last_version(session, path: str, app_id: str) -> int | None:
    """The last version of `app_id` in the Delta table at `path`, read through delta-spark's
    own snapshot (None: no table there yet, or no commit of that application)."""
    jvm = session.sparkContext._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(session._jsparkSession, path)
    snapshot = log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
    if snapshot.version() < 0:
        return None
    found = snapshot.transactions().get(app_id)
    return None if found.isEmpty() else int(found.get())


def redate_by_receipt(tables_dir: Path, tables=TABLES) -> dict[str, int]:
    """Bring every table on this disk to the receive date (DESIGN §7.7), once per table: rows
    whose `date` is not the UTC day of their `received_time` (a read landed by an fxgate that
    took the day from the reader's clock) move to it, in one Delta commit per table that
    rewrites only the files holding such rows; then the table is marked (`DATE_OF`) and never
    scanned for it again. Readers see the table before or after the commit, each row once;
    transaction identifiers are kept, so a batch landed before is still skipped. Killed in
    between, the next start does it again and finds what is left. Returns the rows moved per
    table it had to look at (an empty dict: every table was marked already)."""
    from deltalake import DeltaTable

    moved: dict[str, int] = {}
    for name in tables:
        path = table_path(str(tables_dir), name)
        if not is_delta_table(path):
            continue
        table = DeltaTable(path)
        if table.metadata().configuration.get(DATE_OF) == RECEIVE_DATE:
            continue
        rows = 0
        if name in _EVENT_DATED:
            metrics = table.update(
                updates={DATE: _RECEIVE_DAY}, predicate=f"{DATE} <> {_RECEIVE_DAY}"
            )
            rows = int(metrics.get("num_updated_rows", 0))
        table.alter.set_table_properties({DATE_OF: RECEIVE_DATE}, raise_if_not_exists=False)
        moved[name] = rows
        _log_redated(path, rows)
    return moved


def spark_redate_by_receipt(session, tables_dir: Location, tables=TABLES) -> dict[str, int]:
    """`redate_by_receipt` through delta-spark, for tables only Spark reaches. delta-spark takes
    only `delta.` properties from a write, so the tables it creates are marked here at the next
    start, after one scan that finds nothing to move."""
    base = spark_uri(tables_dir)
    jvm = session.sparkContext._jvm
    moved: dict[str, int] = {}
    for name in tables:
        path = table_path(base, name)
        if not jvm.io.delta.tables.DeltaTable.isDeltaTable(session._jsparkSession, path):
            continue
        detail = session.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
        if (detail["properties"] or {}).get(DATE_OF) == RECEIVE_DATE:
            continue
        rows = 0
        if name in _EVENT_DATED:
            result = session.sql(
                f"UPDATE delta.`{path}` SET {DATE} = {_RECEIVE_DAY_SPARK} "
                f"WHERE {DATE} <> {_RECEIVE_DAY_SPARK}"
            ).first()
            rows = int(result[0]) if result is not None else 0
        session.sql(
            f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{DATE_OF}' = '{RECEIVE_DATE}')"
        )
        moved[name] = rows
        _log_redated(path, rows)
    return moved


def _log_redated(path: str, rows: int) -> None:
    logger.info(
        "Delta table %s: partitioned by receive date; %d row(s) moved from the day the reader "
        "stamped to the day they were received",
        path,
        rows,
    )


def read_table(session, tables_dir: Location, name: str, schema: pa.Schema | None = None):
    """Table `name` through Spark (delta-spark), as one snapshot; `date` is a string.

    A table with no commit yet is an empty DataFrame with `schema` (Arrow) or, without it, just
    the `date` and `batch_id` columns. A table on an object store is read by delta-rs, handed
    to Spark (spark/delta_rs_source.py): fxgate's Spark has no connector for the store.
    """
    df = read_delta_frame(session, table_path(spark_uri(tables_dir), name))
    return session.createDataFrame(_empty_table(schema)) if df is None else df


def read_delta_frame(session, path: str):
    """The Delta table at `path` as a Spark DataFrame of one snapshot, or None when there is
    none (no log): delta-spark's reader, or delta-rs's on an object store."""
    if object_store(path) is not None:
        if not is_delta_table(path):
            return None
        from spark.delta_rs_source import FORMAT, register

        register(session)
        return session.read.format(FORMAT).load(path)
    jvm = session.sparkContext._jvm
    if not jvm.io.delta.tables.DeltaTable.isDeltaTable(session._jsparkSession, path):
        return None
    return session.read.format("delta").load(path)


def read_table_arrow(tables_dir: Location, name: str, schema: pa.Schema | None = None) -> pa.Table:
    """Table `name` read with delta-rs (one snapshot, no JVM), the way non-Spark readers do.

    A table with no commit yet is an empty table with `schema` or, without it, just the `date`
    and `batch_id` columns; with `schema`, a column added since reads as null. Tables only
    Spark reaches (`hdfs://`, `s3a://`) raise `TablesNotReadable`.
    """
    root = delta_location(tables_dir)
    if root is None:
        raise TablesNotReadable(
            f"table {name} at {table_path(tables_dir, name)} is on a file system only Spark "
            "reaches (`fxgate report`)"
        )
    path = table_path(root, name)
    if not is_delta_table(path):
        return _empty_table(schema)
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table()
    if schema is None:
        return table
    # Columns the caller knows and the table does not have yet read as null.
    for field in schema:
        if field.name not in table.schema.names:
            table = table.append_column(
                field.with_nullable(True), pa.nulls(table.num_rows, field.type)
            )
    return table


def count_rows(tables_dir: Location, name: str) -> int:
    """Rows in table `name` (0: no table yet), from the log's per-file statistics: no data file
    is opened. Tables only Spark reaches raise `TablesNotReadable`."""
    root = delta_location(tables_dir)
    if root is None:
        raise TablesNotReadable(
            f"table {name} at {table_path(tables_dir, name)} is on a file system only Spark reaches"
        )
    path = table_path(root, name)
    if not is_delta_table(path):
        return 0
    from deltalake import DeltaTable

    return DeltaTable(path).count()


_EMPTY_SCHEMA = pa.schema([(DATE, pa.string()), (BATCH_ID, pa.int64())])


def _empty_table(schema: pa.Schema | None) -> pa.Table:
    return delta_schema(schema if schema is not None else _EMPTY_SCHEMA).empty_table()
