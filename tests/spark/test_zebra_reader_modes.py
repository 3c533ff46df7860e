"""Every field of an FX9600 tag data event, in the shapes each reader mode sends, lands in its own
column of `reads`: from the parser, through the Arrow building, into a table written by the real
writer and read back through Spark and pyarrow.

The shapes follow Zebra's IoT Connector documentation (zebradevs.github.io/rfid-ziotc-docs): the
operating modes (SIMPLE, INVENTORY with its peak RSSI and read count per antenna and interval,
PORTAL, CONVEYOR, CUSTOM, DIRECTIONALITY), the tag metadata a CUSTOM mode can ask for (PC, CRC,
XPC, the EPC, TID and USER memory banks, seen count = `reads`), and an access operation's result
as it shows it (`accessResults`, one entry per operation). What DIRECTIONALITY adds beyond these
is not in the pages we read; its event here carries the common fields and one field the parser
does not know, which must survive in `extra_fields`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from spark.schema import READS_SCHEMA, build_batch
from spark.tables import READS, TableWriter, read_table, read_table_arrow
from spark.zebra import PayloadError, parse_payload
from tests.spark.test_sanitise import Record
from tests.spark.test_zebra_fuzz import ANY_TEXT, COMPLETE_EVENTS, JSON_VALUES

APP = "fxgate-ledger-test"
TOPIC = "zebra/fx/fx9600-01/reads"
WHEN = "2026-11-21T10:00:00.123+0000"
EVENT_TIME = datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=UTC)

# The columns this issue added; with the older ones, what each shape below decides (absent: null).
NEW_COLUMNS = (
    "reader_mode",
    "format",
    "read_count",
    "tid",
    "user_memory",
    "epc_memory",
    "pc",
    "xpc",
    "crc",
    "access_results",
    "extra_fields",
)
DECIDED = (
    "epc",
    "antenna",
    "peak_rssi",
    "channel",
    "phase",
    "event_num",
    "event_time",
    *NEW_COLUMNS,
)

SHAPES = {
    # Every unique tag in the field of view, once: the bare minimum of fields.
    "simple": (
        {
            "data": {"eventNum": 11, "format": "epc", "idHex": "E28011606000020A1B2C3D01"},
            "timestamp": WHEN,
            "type": "SIMPLE",
        },
        [{"epc": "e28011606000020a1b2c3d01", "reader_mode": "SIMPLE", "format": "epc"}],
    ),
    # Each unique tag per antenna per interval, with its peak RSSI and how often it was read.
    "inventory": (
        {
            "data": {
                "antenna": 2,
                "eventNum": 12,
                "format": "epc",
                "idHex": "E28011606000020A1B2C3D02",
                "peakRssi": -61,
                "reads": 14,
            },
            "timestamp": WHEN,
            "type": "INVENTORY",
        },
        [
            {
                "epc": "e28011606000020a1b2c3d02",
                "antenna": 2,
                "peak_rssi": -61.0,
                "reader_mode": "INVENTORY",
                "format": "epc",
                "read_count": 14,
            }
        ],
    ),
    # Reads after a GPI trigger until no new tag shows up.
    "portal": (
        {
            "data": {
                "antenna": 1,
                "eventNum": 13,
                "format": "epc",
                "idHex": "E28011606000020A1B2C3D03",
                "peakRssi": -48,
                "reads": 3,
            },
            "timestamp": WHEN,
            "type": "PORTAL",
        },
        [
            {
                "epc": "e28011606000020a1b2c3d03",
                "antenna": 1,
                "peak_rssi": -48.0,
                "reader_mode": "PORTAL",
                "format": "epc",
                "read_count": 3,
            }
        ],
    ),
    "conveyor": (
        {
            "data": {
                "antenna": 3,
                "eventNum": 14,
                "format": "epc",
                "idHex": "E28011606000020A1B2C3D04",
                "peakRssi": -55.5,
                "reads": 7,
            },
            "timestamp": WHEN,
            "type": "CONVEYOR",
        },
        [
            {
                "epc": "e28011606000020a1b2c3d04",
                "antenna": 3,
                "peak_rssi": -55.5,
                "reader_mode": "CONVEYOR",
                "format": "epc",
                "read_count": 7,
            }
        ],
    ),
    # CUSTOM with every tag metadata flag: each read reported (reportFilter duration 0), so
    # phase and channel are there and the seen count is 1.
    "custom with all tag metadata": (
        {
            "data": {
                "CRC": "5A3C",
                "EPC": "5A3C3000E28011606000020A1B2C3D05",
                "PC": "3000",
                "TID": "E2801160200074CF085909AD",
                "USER": "0000111122223333",
                "XPC": "0000",
                "antenna": 4,
                "channel": 915.75,
                "eventNum": 15,
                "format": "epc",
                "idHex": "E28011606000020A1B2C3D05",
                "peakRssi": -50,
                "phase": 171.56,
                "reads": 1,
            },
            "timestamp": WHEN,
            "type": "CUSTOM",
        },
        [
            {
                "epc": "e28011606000020a1b2c3d05",
                "antenna": 4,
                "peak_rssi": -50.0,
                "channel": 915.75,
                "phase": 171.56,
                "reader_mode": "CUSTOM",
                "format": "epc",
                "read_count": 1,
                "tid": "E2801160200074CF085909AD",
                "user_memory": "0000111122223333",
                "epc_memory": "5A3C3000E28011606000020A1B2C3D05",
                "pc": "3000",
                "xpc": "0000",
                "crc": "5A3C",
            }
        ],
    ),
    # The results of a READ of EPC word 2 and a WRITE, as the access-operation page shows them.
    "custom with tag access results": (
        {
            "data": {
                "accessResults": ["bbbb", "SUCCESS"],
                "eventNum": 84,
                "format": "epc",
                "idHex": "bbbbbbbbbbbbbbbbbbbbbbbb",
            },
            "timestamp": "2023-04-13T11:49:33.809+0000",
            "type": "CUSTOM",
        },
        [
            {
                "epc": "bbbbbbbbbbbbbbbbbbbbbbbb",
                "event_time": datetime(2023, 4, 13, 11, 49, 33, 809000, tzinfo=UTC),
                "reader_mode": "CUSTOM",
                "format": "epc",
                "access_results": ["bbbb", "SUCCESS"],
            }
        ],
    ),
    # A field this parser does not know (in data and at the top level): kept, not dropped.
    "directionality with an unknown field": (
        {
            "data": {
                "antenna": 1,
                "eventNum": 16,
                "format": "epc",
                "idHex": "E28011606000020A1B2C3D06",
                "peakRssi": -58,
                "reads": 5,
                "userDefined": {"door": "dock-3", "zones": [1, 2]},
            },
            "timestamp": WHEN,
            "type": "DIRECTIONALITY",
            "hostName": "FX9600F0A1B2",
        },
        [
            {
                "epc": "e28011606000020a1b2c3d06",
                "antenna": 1,
                "peak_rssi": -58.0,
                "reader_mode": "DIRECTIONALITY",
                "format": "epc",
                "read_count": 5,
                "extra_fields": {
                    "data": {"userDefined": {"door": "dock-3", "zones": [1, 2]}},
                    "hostName": "FX9600F0A1B2",
                },
            }
        ],
    ),
    # Batching on in the connector: one message, an array of events, each its own row.
    "batched inventory array": (
        [
            {
                "data": {
                    "antenna": antenna,
                    "eventNum": 20 + antenna,
                    "format": "epc",
                    "idHex": f"E28011606000020A1B2C3D1{antenna}",
                    "peakRssi": -40 - antenna,
                    "reads": 10 * antenna,
                },
                "timestamp": WHEN,
                "type": "INVENTORY",
            }
            for antenna in (1, 2, 3)
        ],
        [
            {
                "epc": f"e28011606000020a1b2c3d1{antenna}",
                "antenna": antenna,
                "peak_rssi": float(-40 - antenna),
                "event_num": 20 + antenna,
                "reader_mode": "INVENTORY",
                "format": "epc",
                "read_count": 10 * antenna,
            }
            for antenna in (1, 2, 3)
        ],
    ),
}


def expected_rows(name: str) -> list[dict]:
    """Every column the shape decides, nulls included: a field landing in the wrong column, or
    a column left null, fails the comparison."""
    doc, rows = SHAPES[name]
    events = doc if isinstance(doc, list) else [doc]
    full = []
    for event, row in zip(events, rows, strict=True):
        base = {
            "antenna": None,
            "peak_rssi": None,
            "channel": None,
            "phase": None,
            "event_num": event["data"]["eventNum"],
            "event_time": EVENT_TIME,
            **dict.fromkeys(NEW_COLUMNS),
        }
        full.append({**base, **row})
    return full


def record(name: str, seq: int) -> Record:
    payload = json.dumps(SHAPES[name][0]).encode()
    return Record(f"key-{seq}", TOPIC, payload, seq=seq)


def landed(row: dict) -> dict:
    """A table row reduced to what the shapes decide, JSON text parsed."""
    picked = {column: row[column] for column in DECIDED}
    if picked["extra_fields"] is not None:
        picked["extra_fields"] = json.loads(picked["extra_fields"])
    return picked


@pytest.fixture(scope="module")
def batch():
    return build_batch([record(name, seq) for seq, name in enumerate(SHAPES)], batch_id=7)


@pytest.fixture(scope="module")
def tables_dir(spark_session, tmp_path_factory, batch):
    """All shapes landed once, by the writer the daemon uses (one Spark job for the module)."""
    tables = tmp_path_factory.mktemp("reader-modes")
    assert TableWriter(spark_session, tables, APP).write_batch(7, {READS: batch.reads}) == {
        READS: sum(len(rows) for _, rows in SHAPES.values())
    }
    return tables


def rows_of(rows: list[dict], name: str) -> list[dict]:
    seq = list(SHAPES).index(name)
    return [landed(row) for row in rows if row["message_id"].startswith(f"key-{seq}:")]


@pytest.mark.parametrize("name", SHAPES)
def test_each_reader_modes_event_parses_with_every_field_in_its_place(name):
    reads = parse_payload(json.dumps(SHAPES[name][0]).encode())
    parsed = [
        landed({"message_id": "", **{f: getattr(read, f) for f in read.__slots__}})
        for read in reads
    ]
    for row in parsed:
        if row["access_results"] is not None:
            row["access_results"] = list(row["access_results"])
    assert parsed == expected_rows(name)


@pytest.mark.parametrize("name", SHAPES)
def test_each_reader_modes_event_builds_into_the_reads_schema_with_every_field_in_its_column(
    batch, name
):
    assert batch.reads.schema.equals(READS_SCHEMA, check_metadata=True)
    assert batch.dead_letters.num_rows == 0
    assert rows_of(batch.reads.to_pylist(), name) == expected_rows(name)


@pytest.mark.spark
@pytest.mark.parametrize("name", SHAPES)
def test_each_reader_modes_event_reads_back_from_the_written_table_through_pyarrow(
    tables_dir, name
):
    table = read_table_arrow(tables_dir, READS, READS_SCHEMA)
    assert (
        table.schema.field("access_results").type.value_type
        == READS_SCHEMA.field("access_results").type.value_type
    )
    assert rows_of(table.to_pylist(), name) == expected_rows(name)


@pytest.mark.spark
def test_every_reader_modes_event_reads_back_from_the_written_table_through_spark(
    spark_session, tables_dir
):
    df = read_table(spark_session, tables_dir, READS)
    types = dict(df.dtypes)
    assert {column: types[column] for column in NEW_COLUMNS} == {
        "reader_mode": "string",
        "format": "string",
        "read_count": "bigint",
        "tid": "string",
        "user_memory": "string",
        "epc_memory": "string",
        "pc": "string",
        "xpc": "string",
        "crc": "string",
        "access_results": "array<string>",
        "extra_fields": "string",
    }
    rows = [row.asDict() for row in df.collect()]
    for row in rows:  # Spark hands back naive UTC datetimes (the session time zone is UTC)
        row["event_time"] = row["event_time"].replace(tzinfo=UTC)
    for name in SHAPES:
        assert rows_of(rows, name) == expected_rows(name), name


# -- the lenient fields never decide a message's fate ---------------------------------------

LENIENT_DATA_NAMES = ("format", "reads", "TID", "USER", "EPC", "PC", "XPC", "CRC", "accessResults")
STRICT_DATA_NAMES = {"idHex", "antenna", "peakRssi", "channel", "phase", "eventNum"}
ADDED_DATA = st.dictionaries(
    st.sampled_from(LENIENT_DATA_NAMES) | ANY_TEXT.filter(lambda k: k not in STRICT_DATA_NAMES),
    JSON_VALUES | st.lists(ANY_TEXT, max_size=3) | st.integers(-(2**70), 2**70),
    max_size=5,
)
ADDED_TOP = st.dictionaries(
    st.just("type") | ANY_TEXT.filter(lambda k: k not in {"data", "timestamp"}),
    JSON_VALUES,
    max_size=3,
)


def verdict(payload: bytes) -> tuple:
    """What the message becomes, judged on the fields the table always had."""
    try:
        reads = parse_payload(payload)
    except PayloadError as error:
        return ("dead", error.reason)
    return ("rows", [read_key_fields(r) for r in reads])


def read_key_fields(read) -> tuple:
    return (
        read.epc,
        read.antenna,
        read.peak_rssi,
        read.channel,
        read.phase,
        read.event_num,
        read.event_time,
    )


@settings(max_examples=400, deadline=None)
@given(COMPLETE_EVENTS, ADDED_DATA, ADDED_TOP)
def test_added_or_unknown_fields_of_any_value_never_change_a_verdict_and_are_all_kept(
    event, added_data, added_top
):
    plain = {**event, "data": dict(event["data"])}
    plain.pop("type", None)
    extended = {**plain, **added_top, "data": {**plain["data"], **added_data}}
    try:  # ASCII-escaped: lone surrogates stay JSON escapes; no Infinity, which is not JSON
        payload = json.dumps(extended, allow_nan=False).encode()
    except ValueError:
        assume(False)

    outcome = verdict(payload)
    assert outcome == verdict(json.dumps(plain).encode())
    if outcome[0] == "dead":
        return
    (read,) = parse_payload(payload)
    extra = json.loads(read.extra_fields) if read.extra_fields is not None else {}
    typed = {
        "format": read.format,
        "reads": read.read_count,
        "TID": read.tid,
        "USER": read.user_memory,
        "EPC": read.epc_memory,
        "PC": read.pc,
        "XPC": read.xpc,
        "CRC": read.crc,
        "accessResults": None if read.access_results is None else list(read.access_results),
    }
    for name, value in added_data.items():
        if value is None:
            continue
        assert typed.get(name) == value or extra["data"][name] == value, name
    for name, value in added_top.items():
        if value is None:
            continue
        assert (name == "type" and read.reader_mode == value) or extra[name] == value, name

    # ... and the row builds: every text valid UTF-8, every value in its column's type.
    reads = build_batch([Record("k", TOPIC, payload)], batch_id=1).reads
    reads.validate(full=True)
    assert reads.column("extra_fields").to_pylist() == [read.extra_fields]
