import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

from persistence.keys import message_key
from spark.schema import (
    DEAD_LETTERS_SCHEMA,
    EVENTS_SCHEMA,
    READER_EVENTS_SCHEMA,
    READS_SCHEMA,
    build_batch,
    dead_letter_reasons,
)
from spark.zebra import TagRead

TOPIC = "zebra/fx/fx9600-01/reads"
RECEIVED = datetime(2026, 11, 22, 0, 0, 1, 250000, tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class Record:
    message_key: str
    topic: str
    payload: bytes
    qos: int
    received_time: float
    pack_id: int
    seq: int = 0


def event(epc: str, stamp: str, event_num: int = 1) -> dict:
    return {
        "data": {
            "idHex": epc,
            "antenna": 2,
            "peakRssi": -61,
            "eventNum": event_num,
            "channel": 902.75,
            "phase": 90.5,
        },
        "timestamp": stamp,
        "type": "SIMPLE",
    }


def record(doc_or_bytes, topic: str = TOPIC, pack_id: int = 1, qos: int = 1) -> Record:
    payload = doc_or_bytes if isinstance(doc_or_bytes, bytes) else json.dumps(doc_or_bytes).encode()
    return Record(message_key(topic, payload), topic, payload, qos, RECEIVED, pack_id)


def mixed_records() -> list[Record]:
    return [
        record(event("E280AA", "2026-11-21T23:59:59.999+0000", 1)),
        record(b"not json", pack_id=2),
        record(event("e280bb", "2026-11-22T00:00:00.000Z", 2), topic="zebra/fx/fx9600-02/reads"),
        record(event("e280zz", "2026-11-22T00:00:00Z", 3), qos=2, pack_id=3),
    ]


def test_mixed_batch_gives_one_read_row_per_good_record_and_one_dead_letter_per_bad_one():
    records = mixed_records()
    batch = build_batch(records, batch_id=42)

    reads = batch.reads.to_pylist()
    assert [r["message_id"] for r in reads] == [
        f"{records[0].message_key}:0",
        f"{records[2].message_key}:0",
    ]
    assert [r["epc"] for r in reads] == ["e280aa", "e280bb"]
    assert [r["reader_id"] for r in reads] == ["fx9600-01", "fx9600-02"]
    assert [r["topic"] for r in reads] == [TOPIC, "zebra/fx/fx9600-02/reads"]
    assert reads[0]["event_time"] == datetime(2026, 11, 21, 23, 59, 59, 999000, tzinfo=UTC)
    assert reads[0]["received_time"] == datetime(2026, 11, 22, 0, 0, 1, 250000, tzinfo=UTC)
    assert {r["batch_id"] for r in reads} == {42}
    assert (reads[0]["antenna"], reads[0]["peak_rssi"], reads[0]["event_num"]) == (2, -61.0, 1)

    dead = batch.dead_letters.to_pylist()
    assert [(d["message_key"], d["reason"]) for d in dead] == [
        (records[1].message_key, "invalid_json"),
        (records[3].message_key, "bad_epc"),
    ]
    assert dead[0]["payload"] == b"not json"
    assert dead[1]["qos"] == 2 and dead[1]["pack_id"] == 3 and dead[1]["batch_id"] == 42
    assert "e280zz" in dead[1]["detail"]


def test_date_partition_is_the_utc_day_of_receipt_not_of_the_reader_clock():
    batch = build_batch(mixed_records(), batch_id=1)
    # Read one second before midnight, received after it: it lands in the day it was received
    # (DESIGN §7.7), and event_time keeps the reader's day.
    assert batch.reads.column("date").to_pylist() == ["2026-11-22", "2026-11-22"]
    assert [t.day for t in batch.reads.column("event_time").to_pylist()] == [21, 22]


def test_dead_letter_date_partition_is_the_utc_day_of_receipt():
    batch = build_batch(mixed_records(), batch_id=1)
    assert batch.dead_letters.column("date").to_pylist() == ["2026-11-22", "2026-11-22"]


def test_non_utc_event_time_is_kept_on_the_utc_timeline():
    batch = build_batch([record(event("e280", "2026-11-22T01:30:00+02:00"))], batch_id=1)
    assert batch.reads.column("event_time").to_pylist() == [
        datetime(2026, 11, 21, 23, 30, tzinfo=UTC)
    ]
    assert batch.reads.column("date").to_pylist() == ["2026-11-22"]  # received then


def test_the_same_records_always_build_identical_tables():
    first = build_batch(mixed_records(), batch_id=9)
    second = build_batch(mixed_records(), batch_id=9)
    assert first.reads.equals(second.reads)
    assert first.dead_letters.equals(second.dead_letters)
    assert first.reads.num_rows == 2 and first.dead_letters.num_rows == 2


def test_an_array_message_gives_index_suffixed_ids_in_read_order():
    batched = record([event(f"e280{i:02x}", "2026-11-21T10:00:00Z", i) for i in range(3)])
    single = record(event("e280ff", "2026-11-21T10:00:01Z", 9))
    batch = build_batch([batched, single], batch_id=1)
    assert batch.reads.column("message_id").to_pylist() == [
        f"{batched.message_key}:0",
        f"{batched.message_key}:1",
        f"{batched.message_key}:2",
        f"{single.message_key}:0",
    ]
    assert batch.reads.column("event_num").to_pylist() == [0, 1, 2, 9]
    assert batch.reads.column("pack_id").to_pylist() == [1, 1, 1, 1]


def test_tables_match_the_schemas_exactly():
    batch = build_batch(mixed_records(), batch_id=1)
    assert batch.reads.schema.equals(READS_SCHEMA, check_metadata=True)
    assert batch.dead_letters.schema.equals(DEAD_LETTERS_SCHEMA, check_metadata=True)
    assert READS_SCHEMA.field("message_id").nullable is False
    assert READS_SCHEMA.field("event_time").type == pa.timestamp("us", tz="UTC")
    assert READS_SCHEMA.field("antenna").type == pa.int32()
    assert READS_SCHEMA.field("qos").type == pa.int8()


def test_an_empty_batch_still_has_both_schemas():
    batch = build_batch([], batch_id=1)
    assert batch.reads.num_rows == 0 and batch.reads.schema.equals(READS_SCHEMA)
    assert batch.dead_letters.num_rows == 0
    assert batch.dead_letters.schema.equals(DEAD_LETTERS_SCHEMA)


def test_absent_optional_fields_become_nulls():
    doc = {"data": {"idHex": "e280"}, "timestamp": "2026-11-21T10:00:00Z"}
    (row,) = build_batch([record(doc)], batch_id=1).reads.to_pylist()
    assert [row[c] for c in ("antenna", "peak_rssi", "channel", "phase", "event_num")] == [None] * 5


def test_a_parser_that_crashes_dead_letters_the_message_instead_of_failing_the_batch():
    def parse(payload: bytes) -> tuple[TagRead, ...]:
        if payload == b"poison":
            raise KeyError("bug")
        return (TagRead("e280", 1, -50.0, 902.75, 1.0, 1, datetime(2026, 1, 1, tzinfo=UTC)),)

    batch = build_batch([record(b"ok"), record(b"poison")], batch_id=1, parse=parse)
    assert batch.reads.num_rows == 1
    assert batch.dead_letters.column("reason").to_pylist() == ["parser_error"]


# --- life-cycle events ---------------------------------------------------------------------------

LIFECYCLE_FILTER = "fxgate/dev/+/lifecycle"


def lifecycle_event(client: str = "fxgate-dev-gw", reason: str | None = None) -> dict:
    data = {
        "clientName": client,
        "clientAuthenticationName": client,
        "clientSessionName": client,
        "sequenceNumber": 3,
    }
    if reason is not None:
        data["disconnectionReason"] = reason
    return {
        "specversion": "1.0",
        "id": f"id-{client}-{reason}",
        "type": "fxgate.MQTTClientSessionDisconnected",
        "source": "fxgate/dev/fxgate-dev-gw",
        "subject": f"clients/{client}/sessions/{client}",
        "time": "2026-11-21T23:59:59.500000Z",
        "datacontenttype": "application/json",
        "data": data,
    }


def test_lifecycle_records_land_in_events_and_reads_are_unchanged():
    readings = mixed_records()
    lifecycle = record(
        lifecycle_event(reason="ConnectionLost"), topic="fxgate/dev/fxgate-dev-gw/lifecycle"
    )
    with_events = build_batch(
        [*readings[:2], lifecycle, *readings[2:]], 9, events_filter=LIFECYCLE_FILTER
    )
    without = build_batch(readings, 9)
    assert with_events.reads == without.reads
    assert with_events.dead_letters == without.dead_letters
    assert with_events.events.schema == EVENTS_SCHEMA
    (row,) = with_events.events.to_pylist()
    assert row == {
        "id": "id-fxgate-dev-gw-ConnectionLost",
        "type": "fxgate.MQTTClientSessionDisconnected",
        "source": "fxgate/dev/fxgate-dev-gw",
        "subject": "clients/fxgate-dev-gw/sessions/fxgate-dev-gw",
        "time": datetime(2026, 11, 21, 23, 59, 59, 500000, tzinfo=UTC),
        "client_id": "fxgate-dev-gw",
        "session": "fxgate-dev-gw",
        "sequence_number": 3,
        "disconnection_reason": "ConnectionLost",
        "data": json.dumps(lifecycle_event(reason="ConnectionLost")["data"], sort_keys=True),
        "received_time": datetime(2026, 11, 22, 0, 0, 1, 250000, tzinfo=UTC),
        "pack_id": 1,
        "batch_id": 9,
        "date": "2026-11-22",  # received then (DESIGN §7.7), its time the day before
    }


def test_without_an_events_filter_a_lifecycle_record_is_not_an_event():
    lifecycle = record(lifecycle_event(), topic="fxgate/dev/fxgate-dev-gw/lifecycle")
    batch = build_batch([lifecycle], 1)
    assert batch.events.num_rows == 0
    assert batch.dead_letters.num_rows == 1  # not a Zebra payload: as before this change


def test_a_broken_lifecycle_payload_is_a_dead_letter_not_an_event():
    broken = record(b'{"id": "x"}', topic="fxgate/dev/c/lifecycle")
    batch = build_batch([broken], 1, events_filter=LIFECYCLE_FILTER)
    assert batch.events.num_rows == 0
    assert batch.dead_letters.column("reason").to_pylist() == ["invalid_event"]


# -- management events -> reader_events -----------------------------------------------------

MGMT_TOPIC = "zebra/fx/fx9600-01/management"


def heartbeat(sent: int, event_num: int = 40) -> dict:
    return {
        "component": "RG",
        "data": {
            "reader_gateway": {
                "dataPathStatistics": [
                    {
                        "numDataMessagesRxed": sent,
                        "numDataMessagesTxed": sent,
                        "numDataMessagesRetained": 0,
                        "numDataMessagesDropped": 0,
                    }
                ]
            }
        },
        "eventNum": event_num,
        "timestamp": "2026-11-21T23:59:59.000+0000",
        "type": "heartbeat",
    }


def sequenced(records: list[Record]) -> list[Record]:
    return [
        Record(r.message_key, r.topic, r.payload, r.qos, r.received_time, r.pack_id, seq)
        for seq, r in enumerate(records, start=1)
    ]


def test_management_events_land_in_reader_events_with_the_envelope_typed_and_the_body_as_json():
    gpi = {"component": "RG", "data": {"pin": 2, "state": "LOW"}, "eventNum": 41,
           "timestamp": "2026-11-21T10:00:00Z", "type": "gpi"}  # fmt: skip
    records = sequenced(
        [
            record(heartbeat(1), topic=MGMT_TOPIC),
            record(event("e280aa", "2026-11-21T10:00:00Z", 1)),
            record(gpi, qos=0),  # on the data topic: recognised by its shape
        ]
    )
    batch = build_batch(records, batch_id=5, management_filters=("zebra/fx/+/management",))
    assert batch.reads.num_rows == 1 and batch.dead_letters.num_rows == 0
    assert batch.reader_events.schema == READER_EVENTS_SCHEMA
    rows = batch.reader_events.to_pylist()
    assert [(r["type"], r["component"], r["event_num"], r["seq"]) for r in rows] == [
        ("heartbeat", "RG", 40, 1),
        ("gpi", "RG", 41, 3),
    ]
    assert [r["reader_id"] for r in rows] == ["fx9600-01", "fx9600-01"]  # level before the last
    assert rows[0]["message_key"] == records[0].message_key and rows[0]["topic"] == MGMT_TOPIC
    assert json.loads(rows[1]["data"]) == {"pin": 2, "state": "LOW"}
    assert rows[0]["event_time"] == datetime(2026, 11, 21, 23, 59, 59, tzinfo=UTC)
    # Partitioned by the day of receipt (DESIGN §7.7), not by the reader's clock.
    assert [r["date"] for r in rows] == ["2026-11-22", "2026-11-22"]
    assert [r["batch_id"] for r in rows] == [5, 5] and rows[1]["qos"] == 0
    assert [(o.seq, o.kind, o.heartbeat) for o in batch.observations] == [
        (1, "management", True),
        (2, "data", False),
        (3, "management", False),
    ]
    assert batch.observations[0].counters["sent"] == 1


def test_a_malformed_management_event_is_a_dead_letter_with_its_reason_and_no_data_message():
    bad = dict(heartbeat(1), timestamp="not a time")
    records = sequenced(
        [
            record(event("e280aa", "2026-11-21T10:00:00Z", 1)),
            record(bad),  # on the data topic, shaped as an envelope
            record(event("e280aa", "2026-11-21T10:00:00Z", 2), topic=MGMT_TOPIC),  # wrong place
        ]
    )
    batch = build_batch(records, batch_id=1, management_filters=("zebra/fx/+/management",))
    assert batch.reader_events.num_rows == 0
    assert [d["reason"] for d in batch.dead_letters.to_pylist()] == [
        "invalid_management_event",
        "invalid_management_event",
    ]
    assert [o.seq for o in batch.observations] == [1]


def test_a_bad_payload_counts_as_a_data_message_only_from_a_reader_known_to_send_good_ones():
    junk = [record(b"not json", topic="zebra/fx/nobody/reads")]
    assert build_batch(sequenced(junk), batch_id=1).observations == ()
    known = build_batch(sequenced(junk), batch_id=1, known_readers={"nobody"})
    assert [o.kind for o in known.observations] == ["data"]


def test_replaying_a_batch_with_management_events_builds_identical_tables():
    records = sequenced(
        [record(heartbeat(3), topic=MGMT_TOPIC), record(event("e280", "2026-11-21T10:00:00Z"))]
    )
    first = build_batch(records, batch_id=2, management_filters=("zebra/fx/+/management",))
    again = build_batch(records, batch_id=2, management_filters=("zebra/fx/+/management",))
    assert first.reader_events.equals(again.reader_events)
    assert first.observations == again.observations


def test_a_batchs_dead_letters_are_counted_by_sink_and_reason_a_null_sink_as_table():
    tables = build_batch(mixed_records(), batch_id=1)
    counted = dead_letter_reasons(tables.dead_letters)
    reasons = tables.dead_letters.column("reason").to_pylist()
    assert sum(counted.values()) == tables.dead_letters.num_rows == len(reasons) >= 2
    assert {reason for _, reason in counted} == set(reasons)
    older = pa.table({"sink": [None, "upstream"], "reason": ["invalid_json", "expired"]})
    assert dead_letter_reasons(older) == {("table", "invalid_json"): 1, ("upstream", "expired"): 1}
