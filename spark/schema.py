"""Arrow schemas of the `reads`, `dead_letters`, `events` and `reader_events` tables, and ledger
records → Arrow tables.

Schema changes are additive (DESIGN §7.7): a column is only ever added at the end of a schema,
never renamed, retyped or dropped, so partitions written before it read as null in it (Spark
`mergeSchema`, pyarrow with the schema given, DuckDB `union_by_name`).

The Spark writer hands `createDataFrame` a `pyarrow.Table` because that is the fast path (DESIGN §4:
~140k rows/s, tuples are 3x slower). `build_batch` is a pure function of its records and batch id:
a batch replayed after a crash must rebuild exactly the rows it wrote before, so that overwriting
its partition is a no-op for the rows and the table never holds a duplicate (DESIGN §3.1).

Nothing a publisher sends can make a batch fail to build (DESIGN §3.6): a bad topic or payload
becomes a `dead_letters` row, every text that reaches a string column is valid UTF-8, and a
dead letter's payload is kept to `max_payload_bytes`, so one huge message cannot exhaust the
Spark driver and stall every batch behind it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import operator
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from persistence.keys import ReadKey, payload_hash_read_id, read_fields_read_id
from spark.reader_health import DATA, MANAGEMENT, ReaderObservation
from spark.topics import reader_id_from_topic, safe_reader_id, topic_matches, topic_problem
from spark.zebra import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_READS,
    INVALID_MANAGEMENT_EVENT,
    INVALID_TOPIC,
    ManagementEvent,
    PayloadError,
    TagRead,
    management_event_in,
    parse_management_payload,
    parse_payload,
)
from spark.zebra_arrow import NativeReads, parse_columns

log = logging.getLogger(__name__)

UTC_MICROS = pa.timestamp("us", tz="UTC")

READS_SCHEMA = pa.schema(
    [
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("reader_id", pa.string()),
        pa.field("epc", pa.string()),
        pa.field("antenna", pa.int32()),
        pa.field("peak_rssi", pa.float64()),
        pa.field("channel", pa.float64()),
        pa.field("phase", pa.float64()),
        pa.field("event_num", pa.int64()),
        pa.field("event_time", UTC_MICROS),
        pa.field("received_time", UTC_MICROS),
        pa.field("qos", pa.int8()),
        pa.field("pack_id", pa.int64()),
        pa.field("batch_id", pa.int64()),
        # 'YYYY-MM-DD' of received_time in UTC: the partition column (DESIGN §7.7, the receive
        # date: a day is complete once the clock has passed it; event_time says when it was read).
        pa.field("date", pa.string()),
        # The inbound ledger's seq of the message: arrival order at this gateway (added with the
        # two-sink ledger; null in partitions written before it).
        pa.field("seq", pa.int64()),
        # Every other field of the tag data event (spark.zebra.TagRead; added with issue 15, null
        # in partitions written before it). Null when the event did not carry the field.
        pa.field("reader_mode", pa.string()),  # `type`: SIMPLE, INVENTORY, PORTAL, ...
        pa.field("format", pa.string()),  # data.format
        pa.field("read_count", pa.int64()),  # data.reads
        pa.field("tid", pa.string()),  # data.TID, hex as sent
        pa.field("user_memory", pa.string()),  # data.USER, hex as sent
        pa.field("epc_memory", pa.string()),  # data.EPC, hex as sent
        pa.field("pc", pa.string()),  # data.PC, hex as sent
        pa.field("xpc", pa.string()),  # data.XPC, hex as sent
        pa.field("crc", pa.string()),  # data.CRC, hex as sent
        pa.field("access_results", pa.list_(pa.string())),  # data.accessResults
        # The event's fields without a column (and values that did not fit theirs), as a JSON
        # object shaped like the event: {"data": {"userDefined": ...}, ...}.
        pa.field("extra_fields", pa.string()),
    ]
)

# The columns of `reads` filled from TagRead's lenient fields, in schema order, with their types.
_LENIENT_COLUMNS = (
    ("reader_mode", pa.string()),
    ("format", pa.string()),
    ("read_count", pa.int64()),
    ("tid", pa.string()),
    ("user_memory", pa.string()),
    ("epc_memory", pa.string()),
    ("pc", pa.string()),
    ("xpc", pa.string()),
    ("crc", pa.string()),
    ("access_results", pa.list_(pa.string())),
    ("extra_fields", pa.string()),
)

DEAD_LETTERS_SCHEMA = pa.schema(
    [
        pa.field("message_key", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("payload", pa.binary()),
        pa.field("reason", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("qos", pa.int8()),
        pa.field("received_time", UTC_MICROS),
        pa.field("pack_id", pa.int64()),
        pa.field("batch_id", pa.int64()),
        # 'YYYY-MM-DD' of received_time in UTC: a bad payload has no trustworthy event time.
        pa.field("date", pa.string()),
        # Which sink could not take the message: `table` (it is not reads: bad payload, bad
        # topic) or `upstream` (forwarding gave up; its reads are in `reads` all the same).
        # Null in partitions written before the two-sink ledger: read it as `table`.
        pa.field("sink", pa.string()),
        pa.field("seq", pa.int64()),
    ]
)

# The gateway's own life-cycle events (actors.lifecycle), one row per event.
EVENTS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("type", pa.string()),
        pa.field("source", pa.string()),
        pa.field("subject", pa.string()),
        pa.field("time", UTC_MICROS),
        pa.field("client_id", pa.string()),
        pa.field("session", pa.string()),
        pa.field("sequence_number", pa.int64()),
        pa.field("disconnection_reason", pa.string()),
        pa.field("data", pa.string()),  # the event's `data`, as JSON with sorted keys
        pa.field("received_time", UTC_MICROS),
        pa.field("pack_id", pa.int64()),
        pa.field("batch_id", pa.int64()),
        # 'YYYY-MM-DD' of received_time in UTC (the receive date, as in every table).
        pa.field("date", pa.string()),
    ]
)

# The readers' management events (spark.zebra: heartbeats, GPI, errors, ...), one row per event.
READER_EVENTS_SCHEMA = pa.schema(
    [
        # The ledger's idempotency key of the message (one event per message).
        pa.field("message_key", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("reader_id", pa.string()),
        # The envelope, typed: `type` as the reader spelled it (heartbeat, gpi, error, ...).
        pa.field("type", pa.string()),
        pa.field("event_time", UTC_MICROS),
        pa.field("component", pa.string()),
        pa.field("event_num", pa.int64()),
        pa.field("data", pa.string()),  # the event's `data`, as JSON with sorted keys
        pa.field("received_time", UTC_MICROS),
        pa.field("qos", pa.int8()),
        pa.field("pack_id", pa.int64()),
        pa.field("batch_id", pa.int64()),
        # 'YYYY-MM-DD' of received_time in UTC (DESIGN §7.7: the receive date; a reader's clock
        # is not trusted to place its events).
        pa.field("date", pa.string()),
        pa.field("seq", pa.int64()),
    ]
)

# The two sinks of the ledger, as the dead_letters `sink` column names them.
TABLE_SINK = "table"
UPSTREAM_SINK = "upstream"


def dead_letter_reasons(dead_letters: pa.Table) -> dict[tuple[str, str], int]:
    """How many rows of a `dead_letters` batch each (sink, reason) has; a null sink (rows of
    partitions written before the two-sink ledger) counts as `table`."""
    counts: dict[tuple[str, str], int] = {}
    if dead_letters.num_rows == 0:
        return counts
    sinks = dead_letters.column("sink").to_pylist()
    for sink, reason in zip(sinks, dead_letters.column("reason").to_pylist(), strict=True):
        key = (sink or TABLE_SINK, reason)
        counts[key] = counts.get(key, 0) + 1
    return counts


# Reason for a life-cycle message that is not a CloudEvents JSON object with our fields.
INVALID_EVENT = "invalid_event"

# Reason for a parser that raised something other than PayloadError: a bug, but one poison
# message must not crash-loop the writer and stall every pack behind it (DESIGN §3.6).
PARSER_ERROR = "parser_error"

# Where _parse_event leaves the event's data as JSON (not a CloudEvents attribute name).
_DATA_JSON = " data_json"

# A dead letter's detail is for a person: a few lines at most.
MAX_DETAIL_CHARS = 1000


class LedgerRecord(Protocol):
    """What `build_batch` needs of one inbound-ledger row."""

    seq: int  # the ledger's arrival order
    message_key: str
    topic: str
    payload: bytes
    qos: int
    received_time: float  # epoch seconds
    pack_id: int
    # Optional (read with getattr): `dead_reason`, a reason the ledger already decided (the row
    # lands as that dead letter, not as reads), and `dead_sink`, the sink it is a dead letter
    # for (`table` when absent; `upstream` for a message forwarding gave up on).


@dataclass(frozen=True)
class BatchTables:
    reads: pa.Table
    dead_letters: pa.Table
    events: pa.Table = field(default_factory=EVENTS_SCHEMA.empty_table)
    reader_events: pa.Table = field(default_factory=READER_EVENTS_SCHEMA.empty_table)
    # Each reader's messages in arrival order, for spark.reader_health (not a table).
    observations: tuple[ReaderObservation, ...] = ()


Parser = Callable[[bytes], tuple[TagRead, ...]]


def build_batch(
    records: Iterable[LedgerRecord],
    batch_id: int,
    parse: Parser | None = None,
    read_key: ReadKey = payload_hash_read_id,
    events_filter: str | None = None,
    max_payload_bytes: int = DEFAULT_MAX_BYTES,
    max_reads: int = DEFAULT_MAX_READS,
    management_filters: tuple[str, ...] = (),
    known_readers: Collection[str] = frozenset(),
    native: bool = True,
) -> BatchTables:
    """Parse every record: one `reads` row per tag read, one `dead_letters` row per bad message,
    one `events` row per message on a topic matching `events_filter` (the life-cycle topics,
    actors.config.routes.lifecycle_filter; None: no record is an event), and one
    `reader_events` row per management event: a message on a topic matching one of
    `management_filters` (it must be one, or it is dead-lettered as
    `invalid_management_event`), or any message the tag parser refuses whose shape is the
    management envelope (spark.zebra.management_event_in). `observations` lists each reader's
    data messages and management events in record order (spark.reader_health); a bad payload
    counts as a data message only from a reader that sent a valid one, in this batch or before
    (`known_readers`).

    Rows come in record order, then read order within a message, so the same records always give
    identical tables. `read_key` names each read (its `message_id`; persistence.keys.READ_KEYS).
    `parse` defaults to the Zebra parser with the `max_payload_bytes` / `max_reads` limits; a
    message on a topic `spark.zebra.topic_problem` refuses is dead-lettered as `invalid_topic`.
    The `reader_id` column holds `spark.zebra.safe_reader_id` of the reader's topic level (the
    `topic` column keeps the topic as it came); read keys are made from the level as it came.

    With the Zebra parser and `native` (the default), the tag data messages are first parsed in
    C++ (spark.zebra_arrow), and the Zebra parser decides only what that path hands back: the
    tables are the same either way (tests/spark/test_zebra_arrow.py builds both and compares).
    """
    records = records if isinstance(records, Sequence) else list(records)
    # topic -> (why it cannot be stored or None, reader level as it came, its safe name)
    topics: dict[str, tuple[str | None, str, str]] = {}
    native_reads = (
        _parse_natively(
            records, topics, events_filter, management_filters, max_payload_bytes, max_reads
        )
        if native and parse is None and read_key in _COLUMN_READ_KEYS
        else None
    )
    # record position -> its message's number in native_reads (the messages it took)
    taken: Collection[int] = () if native_reads is None else native_reads.taken
    if parse is None:
        parse = functools.partial(parse_payload, max_bytes=max_payload_bytes, max_reads=max_reads)
    events: list[tuple[object, dict, int]] = []
    management: list[tuple[object, ManagementEvent, int, str]] = []
    observations: list[ReaderObservation] = []
    # Readers that sent a valid tag event or management event in this batch or before: a bad
    # payload counts as a data message received only from these (junk on some topic is not a
    # reader whose silence anyone should be told about).
    valid_readers: set[str] = set()
    message_id: list[str] = []
    topic: list[str] = []
    reader_id: list[str] = []
    epc: list[str] = []
    antenna: list[int | None] = []
    peak_rssi: list[float | None] = []
    channel: list[float | None] = []
    phase: list[float | None] = []
    event_num: list[int | None] = []
    event_time: list[object] = []
    received: list[int] = []
    qos: list[int] = []
    pack_id: list[int] = []
    seq: list[int] = []
    # Each read's lenient fields as one tuple, turned into columns once at the end.
    lenient_rows: list[tuple] = []
    lenient_fields = operator.attrgetter(*(name for name, _ in _LENIENT_COLUMNS))

    dead_key: list[str] = []
    dead_topic: list[str] = []
    dead_payload: list[bytes] = []
    dead_reason: list[str] = []
    dead_detail: list[str] = []
    dead_qos: list[int] = []
    dead_received: list[int] = []
    dead_pack: list[int] = []
    dead_sink: list[str] = []
    dead_seq: list[int] = []

    position: list[int] = []  # the record each row of `reads` came from (not a column)
    for number, record in enumerate(records):
        if number in taken:  # a valid tag data message, its rows made natively
            safe_reader = topics[record.topic][2]
            valid_readers.add(safe_reader)
            observations.append(
                ReaderObservation(safe_reader, record.seq, record.received_time, DATA)
            )
            continue
        received_us = _epoch_micros(record.received_time)
        kind: str | None = None  # DATA or MANAGEMENT once the record is taken as one
        decided = getattr(record, "dead_reason", None)
        sink = TABLE_SINK
        record_topic = record.topic
        problem, reader, safe_reader = _topic_facts(topics, record_topic)
        try:
            if decided == INVALID_TOPIC:  # marked by the ledger: see its _insert
                raise PayloadError(
                    INVALID_TOPIC, "the topic was not valid UTF-8 (U+FFFD marks its bad bytes)"
                )
            if decided:
                sink = getattr(record, "dead_sink", None) or TABLE_SINK
                raise PayloadError(
                    decided,
                    "forwarding upstream gave up on this message (its reads are in `reads`)"
                    if sink == UPSTREAM_SINK
                    else "forwarding upstream gave up on this message",
                )
            if problem is not None:
                raise PayloadError(INVALID_TOPIC, problem)
            if events_filter is not None and topic_matches(events_filter, record_topic):
                events.append((record, _parse_event(record.payload), received_us))
                continue
            if management_filters and any(
                topic_matches(f, record_topic) for f in management_filters
            ):
                kind = MANAGEMENT
                event = parse_management_payload(record.payload, max_payload_bytes)
            else:
                kind = DATA
                try:
                    reads = parse(record.payload)
                    event = None
                except PayloadError as failure:
                    event = management_event_in(record.payload, failure, max_payload_bytes)
                    kind = MANAGEMENT
            if event is not None:
                management.append((record, event, received_us, safe_reader))
                valid_readers.add(safe_reader)
                observations.append(
                    ReaderObservation(
                        safe_reader,
                        record.seq,
                        record.received_time,
                        MANAGEMENT,
                        event.type,
                        event.is_heartbeat,
                        None
                        if event.counters is None
                        else {
                            "received": event.counters.received,
                            "sent": event.counters.sent,
                            "retained": event.counters.retained,
                            "dropped": event.counters.dropped,
                        },
                        1 if event.counters is None else event.counters.paths,
                    )
                )
                continue
        except PayloadError as exc:
            reason, detail = exc.reason, exc.detail
        except Exception as exc:  # see PARSER_ERROR
            log.exception("parser failed on message %s; dead-lettering it", record.message_key)
            reason, detail = PARSER_ERROR, f"{type(exc).__name__}: {exc}"
        else:
            reason = detail = ""
        if kind == DATA and reason != INVALID_MANAGEMENT_EVENT:  # a bad management event is none
            observation = ReaderObservation(safe_reader, record.seq, record.received_time, DATA)
            if not reason or safe_reader in valid_readers or safe_reader in known_readers:
                if not reason:
                    valid_readers.add(safe_reader)
                observations.append(observation)
        if reason:
            payload = bytes(record.payload)
            if len(payload) > max_payload_bytes:
                detail += (
                    f"; payload cut to its first {max_payload_bytes} of {len(payload)} bytes "
                    f"(sha256 of the whole: {hashlib.sha256(payload).hexdigest()})"
                )
                payload = payload[:max_payload_bytes]
            dead_key.append(record.message_key)
            dead_topic.append(_storable(record_topic))
            dead_payload.append(payload)
            dead_reason.append(reason)
            dead_detail.append(_storable(detail, MAX_DETAIL_CHARS))
            dead_qos.append(record.qos)
            dead_received.append(received_us)
            dead_pack.append(record.pack_id)
            dead_sink.append(sink)
            dead_seq.append(record.seq)
            continue

        key = record.message_key
        for index, read in enumerate(reads):
            message_id.append(read_key(key, reader, index, read))
            epc.append(read.epc)
            antenna.append(read.antenna)
            peak_rssi.append(read.peak_rssi)
            channel.append(read.channel)
            phase.append(read.phase)
            event_num.append(read.event_num)
            event_time.append(read.event_time)
            lenient_rows.append(lenient_fields(read))
        n = len(reads)
        position.extend([number] * n)
        topic.extend([record_topic] * n)
        reader_id.extend([safe_reader] * n)
        received.extend([received_us] * n)
        qos.extend([record.qos] * n)
        pack_id.extend([record.pack_id] * n)
        seq.extend([record.seq] * n)

    event_times = pa.array(event_time, type=UTC_MICROS)
    received_times = pa.array(received, type=UTC_MICROS)
    lenient_columns = (
        list(zip(*lenient_rows, strict=True)) if lenient_rows else [()] * len(_LENIENT_COLUMNS)
    )
    reads_table = pa.table(
        [
            pa.array(message_id, type=pa.string()),
            pa.array(topic, type=pa.string()),
            pa.array(reader_id, type=pa.string()),
            pa.array(epc, type=pa.string()),
            pa.array(antenna, type=pa.int32()),
            pa.array(peak_rssi, type=pa.float64()),
            pa.array(channel, type=pa.float64()),
            pa.array(phase, type=pa.float64()),
            pa.array(event_num, type=pa.int64()),
            event_times,
            received_times,
            pa.array(qos, type=pa.int8()),
            pa.array(pack_id, type=pa.int64()),
            pa.array([batch_id] * len(message_id), type=pa.int64()),
            _utc_dates(received_times),
            pa.array(seq, type=pa.int64()),
            *(
                pa.array(values, type=kind)
                for values, (_, kind) in zip(lenient_columns, _LENIENT_COLUMNS, strict=True)
            ),
        ],
        schema=READS_SCHEMA,
    )
    if native_reads is not None and native_reads.reads.num_rows:
        reads_table = _with_native_rows(reads_table, position, native_reads, batch_id, read_key)

    dead_received_times = pa.array(dead_received, type=UTC_MICROS)
    dead_table = pa.table(
        [
            pa.array(dead_key, type=pa.string()),
            pa.array(dead_topic, type=pa.string()),
            pa.array(dead_payload, type=pa.binary()),
            pa.array(dead_reason, type=pa.string()),
            pa.array(dead_detail, type=pa.string()),
            pa.array(dead_qos, type=pa.int8()),
            dead_received_times,
            pa.array(dead_pack, type=pa.int64()),
            pa.array([batch_id] * len(dead_key), type=pa.int64()),
            _utc_dates(dead_received_times),
            pa.array(dead_sink, type=pa.string()),
            pa.array(dead_seq, type=pa.int64()),
        ],
        schema=DEAD_LETTERS_SCHEMA,
    )
    return BatchTables(
        reads=reads_table,
        dead_letters=dead_table,
        events=_events_table(events, batch_id),
        reader_events=_reader_events_table(management, batch_id),
        observations=tuple(observations),
    )


def _topic_facts(
    topics: dict[str, tuple[str | None, str, str]], topic: str
) -> tuple[str | None, str, str]:
    """(why `topic` cannot be stored or None, its reader level as it came, its safe name),
    remembered in `topics` for the batch."""
    known = topics.get(topic)
    if known is None:
        reader = reader_id_from_topic(topic)
        known = topics[topic] = (topic_problem(topic), reader, safe_reader_id(reader))
    return known


@dataclass(frozen=True)
class _NativeBatch:
    """The batch's tag data messages through spark.zebra_arrow: `taken` maps the record position
    of each message it took to its number there; the lists hold, per message it was given (by
    that number), the columns `reads` needs of its record and its reader level as it came (for
    read keys)."""

    native: NativeReads
    taken: dict[int, int]
    keys: list[str]
    readers: list[str]
    safe_readers: list[str]
    topics: list[str]
    received: list[int]
    qos: list[int]
    pack_ids: list[int]
    seqs: list[int]
    positions: list[int]

    @property
    def reads(self) -> pa.Table:
        return self.native.reads


def _parse_natively(
    records: Sequence[LedgerRecord],
    topics: dict[str, tuple[str | None, str, str]],
    events_filter: str | None,
    management_filters: tuple[str, ...],
    max_payload_bytes: int,
    max_reads: int,
) -> _NativeBatch:
    """The records `build_batch` would give the tag parser, through spark.zebra_arrow first."""
    chosen: list[tuple[int, LedgerRecord, str, str]] = []
    for number, record in enumerate(records):
        if getattr(record, "dead_reason", None):
            continue
        problem, reader, safe_reader = _topic_facts(topics, record.topic)
        if problem is not None:
            continue
        if events_filter is not None and topic_matches(events_filter, record.topic):
            continue
        if management_filters and any(topic_matches(f, record.topic) for f in management_filters):
            continue
        chosen.append((number, record, reader, safe_reader))
    native = parse_columns([r.payload for _, r, _, _ in chosen], max_payload_bytes, max_reads)
    return _NativeBatch(
        native=native,
        taken={n: place for place, (n, _, _, _) in enumerate(chosen) if place not in native.judged},
        keys=[r.message_key for _, r, _, _ in chosen],
        readers=[reader for _, _, reader, _ in chosen],
        safe_readers=[safe for _, _, _, safe in chosen],
        topics=[r.topic for _, r, _, _ in chosen],
        received=[_epoch_micros(r.received_time) for _, r, _, _ in chosen],
        qos=[r.qos for _, r, _, _ in chosen],
        pack_ids=[r.pack_id for _, r, _, _ in chosen],
        seqs=[r.seq for _, r, _, _ in chosen],
        positions=[n for n, _, _, _ in chosen],
    )


def _payload_hash_ids(keys: pa.Array, readers: pa.Array, reads: pa.Table) -> pa.Array:
    """persistence.keys.payload_hash_read_id over columns: `{message key}:{index}`."""
    return pc.binary_join_element_wise(keys, reads.column("index").cast(pa.string()), ":")


def _read_fields_ids(keys: pa.Array, readers: pa.Array, reads: pa.Table) -> pa.Array:
    """persistence.keys.read_fields_read_id over columns: `{reader}/{eventNum}/{micros}`, or the
    payload-hash id for a read without an eventNum."""
    micros = reads.column("event_time").cast(pa.int64()).cast(pa.string())
    fields = pc.binary_join_element_wise(
        readers, reads.column("event_num").cast(pa.string()), micros, "/"
    )
    return pc.coalesce(fields, _payload_hash_ids(keys, readers, reads))


# The read keys spark.zebra_arrow's rows can be named by, over columns; with another read key
# every message goes to the Python parser.
_COLUMN_READ_KEYS: dict[ReadKey, Callable[[pa.Array, pa.Array, pa.Table], pa.Array]] = {
    payload_hash_read_id: _payload_hash_ids,
    read_fields_read_id: _read_fields_ids,
}


def _with_native_rows(
    reads_table: pa.Table,
    position: list[int],
    batch: _NativeBatch,
    batch_id: int,
    read_key: ReadKey,
) -> pa.Table:
    """`reads_table` (the Python parser's rows, from the records at `position`) and the native
    rows, in record order, then read order."""
    reads = batch.reads
    message = reads.column("message")

    def per_read(values: list, kind: pa.DataType) -> pa.Array:
        return pc.take(pa.array(values, type=kind), message)

    keys = per_read(batch.keys, pa.string())
    received = per_read(batch.received, UTC_MICROS)
    native_table = pa.table(
        [
            _COLUMN_READ_KEYS[read_key](keys, per_read(batch.readers, pa.string()), reads),
            per_read(batch.topics, pa.string()),
            per_read(batch.safe_readers, pa.string()),
            *(reads.column(name) for name in READS_SCHEMA.names[3:10]),
            received,
            per_read(batch.qos, pa.int8()),
            per_read(batch.pack_ids, pa.int64()),
            pa.array([batch_id] * reads.num_rows, type=pa.int64()),
            _utc_dates(received),
            per_read(batch.seqs, pa.int64()),
            *(reads.column(name) for name, _ in _LENIENT_COLUMNS[:-1]),
            pa.nulls(reads.num_rows, pa.string()),
        ],
        schema=READS_SCHEMA,
    )
    if not reads_table.num_rows:
        return native_table
    order = pa.array(position + per_read(batch.positions, pa.int64()).to_pylist(), pa.int64())
    both = pa.concat_tables([reads_table, native_table])
    return both.take(pc.sort_indices(order))


def _parse_event(payload: bytes) -> dict:
    """The CloudEvents dict of a life-cycle message; PayloadError when it is not one.

    Every value that lands in a typed column is checked here: anyone who can publish on the
    life-cycle topic could otherwise make the whole batch fail to convert, again at every retry.
    """
    try:
        event = json.loads(payload)
        if not isinstance(event, dict):
            raise TypeError("the event is not an object")
        time = datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        data = event["data"]
        if not isinstance(data, dict):
            raise TypeError("data is not an object")
        for key in ("id", "type", "source", "subject"):
            _check_text(event[key], key, optional=False)
        for key in ("clientName", "clientSessionName", "disconnectionReason"):
            _check_text(data.get(key), f"data.{key}", optional=True)
        number = data.get("sequenceNumber")
        if number is not None and (type(number) is not int or not 0 <= number < 2**63):
            raise TypeError("data.sequenceNumber is not an integer in range")
        # Here, not when the table is built: a RecursionError must be caught per message.
        data_json = json.dumps(data, sort_keys=True)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise PayloadError(INVALID_EVENT, f"{type(exc).__name__}: {exc}") from None
    return {**event, "time": time, _DATA_JSON: data_json}


def _check_text(value: object, name: str, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise TypeError(f"{name} is not a string")
    value.encode("utf-8")  # a lone surrogate from a JSON escape: UnicodeEncodeError, a ValueError


def _storable(text: str, limit: int | None = None) -> str:
    """`text` as valid UTF-8 (lone surrogates written as \\udXXX escapes), at most `limit`
    characters: a detail quotes what it refuses, and the column must still take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    return text


def _events_table(events: list[tuple[object, dict, int]], batch_id: int) -> pa.Table:
    times = pa.array([e["time"] for _, e, _ in events], type=UTC_MICROS)
    received = pa.array([stored for _, _, stored in events], type=UTC_MICROS)
    data = [e["data"] for _, e, _ in events]
    return pa.table(
        [
            pa.array([e["id"] for _, e, _ in events], type=pa.string()),
            pa.array([e["type"] for _, e, _ in events], type=pa.string()),
            pa.array([e["source"] for _, e, _ in events], type=pa.string()),
            pa.array([e["subject"] for _, e, _ in events], type=pa.string()),
            times,
            pa.array([d.get("clientName") for d in data], type=pa.string()),
            pa.array([d.get("clientSessionName") for d in data], type=pa.string()),
            pa.array([d.get("sequenceNumber") for d in data], type=pa.int64()),
            pa.array([d.get("disconnectionReason") for d in data], type=pa.string()),
            pa.array([e[_DATA_JSON] for _, e, _ in events], type=pa.string()),
            received,
            pa.array([r.pack_id for r, _, _ in events], type=pa.int64()),
            pa.array([batch_id] * len(events), type=pa.int64()),
            _utc_dates(received),
        ],
        schema=EVENTS_SCHEMA,
    )


def _reader_events_table(
    management: list[tuple[object, ManagementEvent, int, str]], batch_id: int
) -> pa.Table:
    received = pa.array([r for _, _, r, _ in management], type=UTC_MICROS)
    return pa.table(
        [
            pa.array([m.message_key for m, _, _, _ in management], type=pa.string()),
            pa.array([m.topic for m, _, _, _ in management], type=pa.string()),
            pa.array([reader for _, _, _, reader in management], type=pa.string()),
            pa.array([e.type for _, e, _, _ in management], type=pa.string()),
            pa.array([e.event_time for _, e, _, _ in management], type=UTC_MICROS),
            pa.array([e.component for _, e, _, _ in management], type=pa.string()),
            pa.array([e.event_num for _, e, _, _ in management], type=pa.int64()),
            pa.array([e.data_json for _, e, _, _ in management], type=pa.string()),
            received,
            pa.array([m.qos for m, _, _, _ in management], type=pa.int8()),
            pa.array([m.pack_id for m, _, _, _ in management], type=pa.int64()),
            pa.array([batch_id] * len(management), type=pa.int64()),
            _utc_dates(received),
            pa.array([m.seq for m, _, _, _ in management], type=pa.int64()),
        ],
        schema=READER_EVENTS_SCHEMA,
    )


def _epoch_micros(seconds: float) -> int:
    # round, not int(): 1.000001 * 1e6 is 1000000.9999999999 in binary floating point.
    return round(seconds * 1_000_000)


def _utc_dates(times: pa.Array) -> pa.Array:
    """'YYYY-MM-DD' of each timestamp, in UTC (the arrays are typed tz=UTC, so the cast to a date
    is taken on the UTC calendar)."""
    return times.cast(pa.date32()).cast(pa.string())
