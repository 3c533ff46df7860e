"""Topics and reader ids from a hostile publisher: safe names, refused topics, storable rows."""

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from persistence.keys import message_key
from spark.schema import MAX_DETAIL_CHARS, build_batch
from spark.tables import DEAD_LETTERS, EVENTS, READS, TableWriter, read_table_arrow
from spark.topics import MAX_SAFE_NAME_BYTES, reader_id_from_topic, safe_reader_id, topic_problem
from spark.zebra import INVALID_TOPIC, OVERSIZED

APP = "fxgate-ledger-test"
RECEIVED = datetime(2026, 11, 21, 12, 0, tzinfo=UTC).timestamp()
EVENT = {
    "data": {"idHex": "e28011606000020a1b2c3d4e", "antenna": 1, "eventNum": 7},
    "timestamp": "2026-11-21T10:00:00.000+0000",
}
PAYLOAD = json.dumps(EVENT).encode()


@dataclass(frozen=True)
class Record:
    message_key: str
    topic: str
    payload: bytes
    qos: int = 1
    received_time: float = RECEIVED
    pack_id: int = 1
    seq: int = 0


def record(topic: str, payload: bytes = PAYLOAD) -> Record:
    # persistence.keys.message_key, except that it takes a topic no broker would deliver.
    return Record(message_key(topic.encode("utf-8", "replace").decode(), payload), topic, payload)


def assert_safe_name(name: str) -> None:
    """What a file name, a path component and a Hive partition value need."""
    assert name.isascii() and name.isprintable(), name
    assert not set(name) & set("/\\\x00=: "), name
    assert name not in ("", ".", "..") and name[0] not in "._", name
    assert len(name.encode()) <= MAX_SAFE_NAME_BYTES, name


# -- safe_reader_id -------------------------------------------------------------------------


@pytest.mark.parametrize("reader", ["fx9600-01", "FX9600_0A1B2C", "dock.door.3", "r"])
def test_ordinary_reader_names_are_kept_unchanged(reader):
    assert safe_reader_id(reader) == reader


@pytest.mark.parametrize(
    ("reader", "safe"),
    [
        ("..", "%2E."),
        (".", "%2E"),
        ("../../etc/passwd", "%2E.%2F..%2Fetc%2Fpasswd"),
        ("a/b", "a%2Fb"),
        ("a\\b", "a%5Cb"),
        ("nul\x00here", "nul%00here"),
        ("tab\tbell\x07", "tab%09bell%07"),
        ("_hidden", "%5Fhidden"),
        ("date=2026-01-01", "date%3D2026-01-01"),
        ("100%", "100%25"),
        ("a b", "a%20b"),
        ("é", "%C3%A9"),
        ("漢😀", "%E6%BC%A2%F0%9F%98%80"),
        ("~", "%7E"),
        ("C:", "C%3A"),
    ],
)
def test_unsafe_reader_names_are_escaped_reversibly(reader, safe):
    assert safe_reader_id(reader) == safe
    assert unquote(safe) == reader
    assert_safe_name(safe)


def test_a_very_long_reader_name_is_cut_and_ends_in_a_hash_of_the_whole_name():
    reader = "x" * 300
    safe = safe_reader_id(reader)
    assert len(safe) == MAX_SAFE_NAME_BYTES
    assert safe.endswith("~" + hashlib.sha256(reader.encode()).hexdigest()[:32])
    assert safe.startswith("x" * 100)
    assert_safe_name(safe)


def test_two_long_names_with_one_prefix_get_different_safe_names():
    assert safe_reader_id("é" * 100 + "a") != safe_reader_id("é" * 100 + "b")


def test_a_long_escaped_name_is_never_cut_inside_an_escape():
    for pad in range(3):
        safe = safe_reader_id("a" * pad + "é" * 200)
        kept = safe.split("~")[0]
        assert re.fullmatch(r"a*(%[0-9A-F]{2})*", kept), kept
        assert_safe_name(safe)


def test_an_empty_reader_gets_a_name_no_other_reader_escapes_to():
    assert safe_reader_id("") == "%"


def test_a_lone_surrogate_is_escaped_instead_of_raising():
    safe = safe_reader_id("r\ud800")
    assert safe == "r%ED%A0%80"
    assert_safe_name(safe)


@settings(max_examples=2000, deadline=None)
@given(st.text(max_size=300))
def test_any_reader_name_becomes_a_safe_name_that_reads_back_unless_hashed(reader):
    safe = safe_reader_id(reader)
    if reader:
        assert_safe_name(safe)
    if "~" not in safe and reader:
        assert unquote(safe, errors="surrogatepass") == reader


@settings(max_examples=1000, deadline=None)
@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_different_readers_never_share_a_safe_name(first, second):
    if first != second:
        assert safe_reader_id(first) != safe_reader_id(second)


def test_every_safe_name_stays_inside_the_directory_it_is_joined_to(tmp_path):
    hostile = ["..", ".", "../..", "/etc", "a/../../b", "\x00", "_x", "." * 300, "~root", "C:\\"]
    for reader in hostile:
        joined = (tmp_path / safe_reader_id(reader)).resolve()
        assert joined.parent == tmp_path.resolve(), reader


# -- topic_problem --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    ["zebra/fx/fx9600-01/reads", "zebra/fx/../reads", "zebra/fx/é漢/reads", "/", "a" * 65535],
)
def test_topics_a_broker_would_accept_can_be_stored(topic):
    assert topic_problem(topic) is None


@pytest.mark.parametrize(
    ("topic", "why"),
    [
        ("", "empty"),
        ("zebra/fx/a\x00b/reads", "NUL"),
        ("zebra/fx/+/reads", "wildcard"),
        ("zebra/#", "wildcard"),
        ("zebra/fx/\udcff/reads", "UTF-8"),
        ("a" * 65536, "longer than MQTT allows"),
        ("é" * 40000, "longer than MQTT allows"),
    ],
)
def test_topics_that_are_not_valid_mqtt_topic_names_are_refused_with_the_rule(topic, why):
    assert why in topic_problem(topic)


# -- build_batch with hostile topics and payloads --------------------------------------------


def test_a_message_on_an_invalid_topic_is_dead_lettered_and_the_next_one_lands():
    bad, good = record("zebra/fx/a\x00b/reads"), record("zebra/fx/fx9600-01/reads")
    batch = build_batch([bad, good], batch_id=1)
    (dead,) = batch.dead_letters.to_pylist()
    assert dead["reason"] == INVALID_TOPIC
    assert dead["topic"] == "zebra/fx/a\x00b/reads"
    assert "NUL" in dead["detail"]
    assert batch.reads.column("message_id").to_pylist() == [f"{good.message_key}:0"]


def test_a_topic_with_a_lone_surrogate_is_dead_lettered_with_a_storable_topic():
    topic = "zebra/fx/\udcff/reads"
    batch = build_batch([record(topic)], batch_id=1)
    (dead,) = batch.dead_letters.to_pylist()
    assert dead["reason"] == INVALID_TOPIC
    assert dead["topic"] == "zebra/fx/\\udcff/reads"
    dead["detail"].encode("utf-8")  # the column took it, and it reads back as UTF-8


def test_reads_from_a_hostile_reader_level_keep_the_topic_and_get_a_safe_reader_id():
    topics = ["zebra/fx/../reads", "zebra/fx/é漢😀/reads", "zebra/fx/" + "r" * 300 + "/reads"]
    batch = build_batch([record(t) for t in topics], batch_id=1)
    rows = batch.reads.to_pylist()
    assert [r["topic"] for r in rows] == topics
    assert [r["reader_id"] for r in rows] == [
        safe_reader_id(reader_id_from_topic(t)) for t in topics
    ]
    assert rows[0]["reader_id"] == "%2E."
    for row in rows:
        assert_safe_name(row["reader_id"])


def test_the_read_key_is_made_from_the_reader_level_as_it_came():
    seen = []

    def key(message_key, reader, index, read):
        seen.append(reader)
        return f"{message_key}:{index}"

    build_batch([record("zebra/fx/é/reads")], batch_id=1, read_key=key)
    assert seen == ["é"]


def test_an_oversized_payload_is_dead_lettered_with_its_payload_cut_and_hashed():
    payload = json.dumps([EVENT] * 40).encode()
    batch = build_batch([record("zebra/fx/r/reads", payload)], 1, max_payload_bytes=1024)
    (dead,) = batch.dead_letters.to_pylist()
    assert dead["reason"] == OVERSIZED
    assert dead["payload"] == payload[:1024]
    assert f"first 1024 of {len(payload)} bytes" in dead["detail"]
    assert hashlib.sha256(payload).hexdigest() in dead["detail"]


def test_a_payload_within_the_limit_keeps_its_whole_payload_in_the_dead_letter():
    payload = b"{not json" + b" " * 500
    (dead,) = build_batch([record("zebra/fx/r/reads", payload)], 1).dead_letters.to_pylist()
    assert dead["payload"] == payload and "cut" not in dead["detail"]


def test_a_parser_error_detail_is_made_storable_and_short():
    def parse(_payload):
        raise RuntimeError("\udcff" + "boom " * 1000)

    (dead,) = build_batch([record("zebra/fx/r/reads")], 1, parse=parse).dead_letters.to_pylist()
    assert dead["reason"] == "parser_error"
    assert dead["detail"].startswith("RuntimeError: \\udcffboom")
    assert len(dead["detail"]) == MAX_DETAIL_CHARS


LIFECYCLE_FILTER = "fxgate/test/+/lifecycle"
LIFECYCLE_TOPIC = "fxgate/test/gw/lifecycle"


def lifecycle_event(**data) -> bytes:
    return json.dumps(
        {
            "id": "1",
            "type": "fxgate.client.connected",
            "source": "fxgate/test/gw",
            "subject": "clients/gw",
            "time": "2026-11-21T10:00:00.000000Z",
            "data": {"clientName": "gw", "sequenceNumber": 1, **data},
        }
    ).encode()


@pytest.mark.parametrize(
    "payload",
    [
        lifecycle_event(sequenceNumber="one"),
        lifecycle_event(sequenceNumber=2**64),
        lifecycle_event(sequenceNumber=True),
        lifecycle_event(clientName=["gw"]),
        lifecycle_event(clientName="\udcff"),
        lifecycle_event(disconnectionReason=7),
        b"[1, 2]",
        b'{"time": 5}',
        b"[" * 5000 + b"]" * 5000,
        b'{"id": "1", "data": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ],
)
def test_a_malformed_life_cycle_event_is_dead_lettered_not_a_failed_batch(payload):
    batch = build_batch([record(LIFECYCLE_TOPIC, payload)], 1, events_filter=LIFECYCLE_FILTER)
    assert batch.events.num_rows == 0
    (dead,) = batch.dead_letters.to_pylist()
    assert dead["reason"] == "invalid_event"


def test_a_well_formed_life_cycle_event_still_lands_in_the_events_table():
    batch = build_batch(
        [record(LIFECYCLE_TOPIC, lifecycle_event())], 1, events_filter=LIFECYCLE_FILTER
    )
    (row,) = batch.events.to_pylist()
    assert (row["client_id"], row["sequence_number"]) == ("gw", 1)
    assert json.loads(row["data"]) == {"clientName": "gw", "sequenceNumber": 1}


# -- what reaches the file system --------------------------------------------------------------


@pytest.mark.spark
def test_hostile_topics_and_readers_write_files_only_under_the_tables_date_partitions_and_logs(
    spark_session, tmp_path
):
    tables = tmp_path / "tables"
    topics = [
        "zebra/fx/../reads",
        "zebra/fx/../../../../tmp/reads",
        "../../escape",
        "zebra/fx/date=2000-01-01/reads",
        "zebra/fx/_temporary/reads",
        "zebra/fx/.hidden/reads",
        "zebra/fx/é漢😀/reads",
        "zebra/fx/" + "x" * 300 + "/reads",
        "zebra/fx/a\x00b/reads",
    ]
    records = [record(t) for t in topics] + [record(t, b"\xff not utf-8") for t in topics]
    batch = build_batch(records, batch_id=5)
    TableWriter(spark_session, tables, APP).write_batch(
        5, {READS: batch.reads, DEAD_LETTERS: batch.dead_letters, EVENTS: batch.events}
    )

    files = [
        Path(root, name).relative_to(tables).as_posix()
        for root, _dirs, names in os.walk(tables)
        for name in names
        if not name.startswith(".")  # Hadoop's checksum files sit beside each file
    ]
    data = [f for f in files if "/_delta_log/" not in f]
    layout = re.compile(r"(reads|dead_letters)/date=2026-11-2[01]/part-[^/]+\.parquet")
    assert data and all(layout.fullmatch(f) for f in data), data
    log = re.compile(r"(reads|dead_letters)/_delta_log/\d{20}\.(json|crc)")
    assert all(log.fullmatch(f) for f in files if f not in data), files
    for entry in tmp_path.iterdir():
        assert entry.name == "tables"
    # Each data file is one the log lists: nothing was written beside the tables' snapshots.
    for name in (READS, DEAD_LETTERS):
        listed = {
            Path(uri).relative_to(tables).as_posix()
            for uri in DeltaTable(tables / name).file_uris()
        }
        assert listed == {f for f in data if f.startswith(f"{name}/")}

    reads = read_table_arrow(tables, READS).to_pylist()
    assert sorted(r["topic"] for r in reads) == sorted(topics[:-1])
    for row in reads:
        assert_safe_name(row["reader_id"])
    dead = read_table_arrow(tables, DEAD_LETTERS).to_pylist()
    assert sorted(d["reason"] for d in dead) == sorted(["invalid_topic"] * 2 + ["invalid_utf8"] * 8)
