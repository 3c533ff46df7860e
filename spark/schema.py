"""Arrow schemas of the `reads`, `dead_letters` and `events` tables, and ledger records → Arrow
tables.

The Spark writer hands `createDataFrame` a `pyarrow.Table` because that is the fast path (DESIGN §4:
~140k rows/s, tuples are 3x slower). `build_batch` is a pure function of its records and batch id:
a batch replayed after a crash must rebuild exactly the rows it wrote before, so that overwriting
its partition is a no-op for the rows and the table never holds a duplicate (DESIGN §3.1).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import pyarrow as pa

from actors.routes import topic_matches
from persistence.keys import ReadKey, payload_hash_read_id
from spark.zebra import PayloadError, TagRead, parse_payload, reader_id_from_topic

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
        # 'YYYY-MM-DD' of event_time in UTC: the partition column.
        pa.field("date", pa.string()),
    ]
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
        # 'YYYY-MM-DD' of the event's time in UTC.
        pa.field("date", pa.string()),
    ]
)

# Reason for a life-cycle message that is not a CloudEvents JSON object with our fields.
INVALID_EVENT = "invalid_event"

# Reason for a parser that raised something other than PayloadError: a bug, but one poison
# message must not crash-loop the writer and stall every pack behind it (DESIGN §3.6).
PARSER_ERROR = "parser_error"


class LedgerRecord(Protocol):
    """What `build_batch` needs of one inbound-ledger row."""

    message_key: str
    topic: str
    payload: bytes
    qos: int
    received_time: float  # epoch seconds
    pack_id: int


@dataclass(frozen=True)
class BatchTables:
    reads: pa.Table
    dead_letters: pa.Table
    events: pa.Table = field(default_factory=EVENTS_SCHEMA.empty_table)


Parser = Callable[[bytes], tuple[TagRead, ...]]


def build_batch(
    records: Iterable[LedgerRecord],
    batch_id: int,
    parse: Parser = parse_payload,
    read_key: ReadKey = payload_hash_read_id,
    events_filter: str | None = None,
) -> BatchTables:
    """Parse every record: one `reads` row per tag read, one `dead_letters` row per bad message,
    and one `events` row per message on a topic matching `events_filter` (the life-cycle topics,
    actors.routes.lifecycle_filter; None: no record is an event).

    Rows come in record order, then read order within a message, so the same records always give
    identical tables. `read_key` names each read (its `message_id`; persistence.keys.READ_KEYS).
    """
    events: list[tuple[object, dict, int]] = []
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

    dead_key: list[str] = []
    dead_topic: list[str] = []
    dead_payload: list[bytes] = []
    dead_reason: list[str] = []
    dead_detail: list[str] = []
    dead_qos: list[int] = []
    dead_received: list[int] = []
    dead_pack: list[int] = []

    readers: dict[str, str] = {}
    for record in records:
        received_us = _epoch_micros(record.received_time)
        forward_failure = getattr(record, "dead_reason", None)
        try:
            if forward_failure:
                raise PayloadError(forward_failure, "forwarding upstream gave up on this message")
            if events_filter is not None and topic_matches(events_filter, record.topic):
                events.append((record, _parse_event(record.payload), received_us))
                continue
            reads = parse(record.payload)
        except PayloadError as exc:
            reason, detail = exc.reason, exc.detail
        except Exception as exc:  # see PARSER_ERROR
            log.exception("parser failed on message %s; dead-lettering it", record.message_key)
            reason, detail = PARSER_ERROR, f"{type(exc).__name__}: {exc}"
        else:
            reason = detail = ""
        if reason:
            dead_key.append(record.message_key)
            dead_topic.append(record.topic)
            dead_payload.append(bytes(record.payload))
            dead_reason.append(reason)
            dead_detail.append(detail)
            dead_qos.append(record.qos)
            dead_received.append(received_us)
            dead_pack.append(record.pack_id)
            continue

        record_topic = record.topic
        reader = readers.get(record_topic)
        if reader is None:
            reader = readers[record_topic] = reader_id_from_topic(record_topic)
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
        n = len(reads)
        topic.extend([record_topic] * n)
        reader_id.extend([reader] * n)
        received.extend([received_us] * n)
        qos.extend([record.qos] * n)
        pack_id.extend([record.pack_id] * n)

    event_times = pa.array(event_time, type=UTC_MICROS)
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
            pa.array(received, type=UTC_MICROS),
            pa.array(qos, type=pa.int8()),
            pa.array(pack_id, type=pa.int64()),
            pa.array([batch_id] * len(message_id), type=pa.int64()),
            _utc_dates(event_times),
        ],
        schema=READS_SCHEMA,
    )

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
        ],
        schema=DEAD_LETTERS_SCHEMA,
    )
    return BatchTables(
        reads=reads_table,
        dead_letters=dead_table,
        events=_events_table(events, batch_id),
    )


def _parse_event(payload: bytes) -> dict:
    """The CloudEvents dict of a life-cycle message; PayloadError when it is not one."""
    try:
        event = json.loads(payload)
        time = datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        if not isinstance(event["data"], dict):
            raise TypeError("data is not an object")
        for key in ("id", "type", "source", "subject"):
            if not isinstance(event[key], str):
                raise TypeError(f"{key} is not a string")
    except (ValueError, KeyError, TypeError) as exc:
        raise PayloadError(INVALID_EVENT, f"{type(exc).__name__}: {exc}") from None
    return {**event, "time": time}


def _events_table(events: list[tuple[object, dict, int]], batch_id: int) -> pa.Table:
    times = pa.array([e["time"] for _, e, _ in events], type=UTC_MICROS)
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
            pa.array([json.dumps(d, sort_keys=True) for d in data], type=pa.string()),
            pa.array([received for _, _, received in events], type=UTC_MICROS),
            pa.array([r.pack_id for r, _, _ in events], type=pa.int64()),
            pa.array([batch_id] * len(events), type=pa.int64()),
            _utc_dates(times),
        ],
        schema=EVENTS_SCHEMA,
    )


def _epoch_micros(seconds: float) -> int:
    # round, not int(): 1.000001 * 1e6 is 1000000.9999999999 in binary floating point.
    return round(seconds * 1_000_000)


def _utc_dates(times: pa.Array) -> pa.Array:
    """'YYYY-MM-DD' of each timestamp, in UTC (the arrays are typed tz=UTC, so the cast to a date
    is taken on the UTC calendar)."""
    return times.cast(pa.date32()).cast(pa.string())
