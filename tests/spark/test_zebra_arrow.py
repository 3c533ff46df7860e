"""The native columnar parse (spark.zebra_arrow) gives the batch the Python parser gives, on the
fuzz corpus, the real shapes and every input it hands to the judge; and it takes the shapes
readers send, so the judge is the exception."""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persistence.keys import read_fields_read_id
from spark.schema import build_batch
from spark.zebra import MAX_NESTING, PayloadError, parse_payload
from spark.zebra_arrow import parse_columns
from tests.spark.test_sanitise import Record
from tests.spark.test_zebra_fuzz import (
    COMPLETE_EVENTS,
    EVENTS_FILTER,
    MESSAGES_PER_EXAMPLE,
    PAYLOADS,
    TOPICS,
)
from tests.spark.test_zebra_reader_modes import SHAPES

TOPIC = "zebra/fx/fx9600-01/reads"
EVENT = {
    "data": {
        "idHex": "E28011606000020A1B2C3D4E",
        "antenna": 1,
        "peakRssi": -52,
        "eventNum": 7,
        "channel": 915.25,
        "phase": 12.5,
        "format": "epc",
        "reads": 1,
    },
    "timestamp": "2026-11-21T10:00:00.123+0000",
    "type": "SIMPLE",
}
LIMITS = {"max_payload_bytes": 4096, "max_reads": 30}


def records_of(payloads, topic=TOPIC):
    return [
        Record(f"k{index}", topic, payload, received_time=1.7e9 + index, seq=index)
        for index, payload in enumerate(payloads)
    ]


def assert_same_batch(records, **options) -> None:
    judge = build_batch(records, 1, native=False, **options)
    native = build_batch(records, 1, **options)
    for name in ("reads", "dead_letters", "events", "reader_events"):
        built = getattr(native, name)
        built.validate(full=True)
        assert built.equals(getattr(judge, name), check_metadata=True), name
    assert native.observations == judge.observations


def judged(payload: bytes, **limits) -> bool:
    return 0 in parse_columns([payload], **limits).judged


# -- the corpus -------------------------------------------------------------------------------


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.lists(
        st.tuples(TOPICS, PAYLOADS), min_size=MESSAGES_PER_EXAMPLE, max_size=MESSAGES_PER_EXAMPLE
    )
)
def test_every_fuzzed_batch_and_each_of_its_messages_alone_build_as_the_judge_builds_them(
    messages,
):
    records = [
        Record(f"k{index}", topic, payload, received_time=1.7e9 + index, seq=index)
        for index, (topic, payload) in enumerate(messages)
    ]
    assert_same_batch(records, events_filter=EVENTS_FILTER, **LIMITS)
    # Alone, a message is not handed back for its neighbour's sake: each one meets the native
    # path on its own.
    for record in records:
        assert_same_batch([record], events_filter=EVENTS_FILTER, **LIMITS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(COMPLETE_EVENTS, min_size=1, max_size=5), st.booleans())
def test_generated_events_build_as_the_judge_builds_them_with_either_read_key(events, array):
    payloads = [json.dumps(events).encode()] if array else [json.dumps(e).encode() for e in events]
    for read_key in ({}, {"read_key": read_fields_read_id}):
        assert_same_batch(records_of(payloads), **LIMITS, **read_key)


def test_every_reader_mode_shape_builds_as_the_judge_builds_it_and_is_taken_natively():
    payloads = [json.dumps(doc).encode() for doc, _ in SHAPES.values()]
    assert_same_batch(records_of(payloads))
    assert_same_batch(records_of(payloads), read_key=read_fields_read_id)
    # The shapes whose events hold only fields with a column are taken whole; the one with a
    # field the parser does not know (it lands in extra_fields) goes to the judge.
    native = parse_columns(payloads)
    for number, (name, (doc, _)) in enumerate(SHAPES.items()):
        events = doc if isinstance(doc, list) else [doc]
        known = all(
            set(e) <= {"data", "timestamp", "type"}
            and set(e["data"])
            <= {
                "idHex",
                "antenna",
                "peakRssi",
                "channel",
                "phase",
                "eventNum",
                "format",
                "reads",
                "TID",
                "USER",
                "EPC",
                "PC",
                "XPC",
                "CRC",
                "accessResults",
            }
            for e in events
        )
        assert (number in native.judged) != known, name


def test_single_events_and_arrays_of_them_are_taken_natively_in_message_order():
    payloads = [
        json.dumps(EVENT).encode(),
        json.dumps([EVENT, EVENT, EVENT]).encode(),
        json.dumps(dict(EVENT, timestamp="2026-11-21T10:00:00Z")).encode(),
    ]
    native = parse_columns(payloads)
    assert native.judged == frozenset()
    assert native.reads.column("message").to_pylist() == [0, 1, 1, 1, 2]
    assert native.reads.column("index").to_pylist() == [0, 0, 1, 2, 0]
    assert native.reads.column("epc").to_pylist() == ["e28011606000020a1b2c3d4e"] * 5


def test_a_batch_mixing_judged_and_native_messages_keeps_record_order():
    payloads = [
        json.dumps(EVENT).encode(),
        b"{not json",
        json.dumps([EVENT, dict(EVENT, extra=1)]).encode(),  # judged: a field without a column
        json.dumps([EVENT, EVENT]).encode(),
        json.dumps(dict(EVENT, data=dict(EVENT["data"], idHex="not hex"))).encode(),
        json.dumps(EVENT).encode(),
    ]
    native = parse_columns(payloads)
    assert native.judged == {1, 2, 4}
    assert native.reads.column("message").to_pylist() == [0, 3, 3, 5]
    assert_same_batch(records_of(payloads))


# -- what the native path hands to the judge ---------------------------------------------------

EVENT_TEXT = json.dumps(EVENT)
DATA_TEXT = json.dumps(EVENT["data"])


@pytest.mark.parametrize(
    "payload",
    [
        # Numbers JSON does not have: the reader takes NaN and Infinity, the judge refuses them.
        EVENT_TEXT.replace('"phase": 12.5', '"phase": NaN').encode(),
        EVENT_TEXT.replace('"phase": 12.5', '"phase": Infinity').encode(),
        EVENT_TEXT.replace('"peakRssi": -52', '"peakRssi": -Infinity').encode(),
        EVENT_TEXT.replace('"peakRssi": -52', '"peakRssi": 1e400').encode(),
        # A key twice: the judge keeps the last one.
        EVENT_TEXT.replace('"antenna": 1', '"antenna": 1, "antenna": 2').encode(),
        # Wrong JSON types, in strict and in lenient fields.
        EVENT_TEXT.replace('"antenna": 1', '"antenna": 1.0').encode(),
        EVENT_TEXT.replace('"antenna": 1', '"antenna": "1"').encode(),
        EVENT_TEXT.replace('"antenna": 1', '"antenna": 2147483648').encode(),
        EVENT_TEXT.replace('"reads": 1', '"reads": "3"').encode(),
        EVENT_TEXT.replace('"format": "epc"', '"format": 5').encode(),
        EVENT_TEXT.replace('"eventNum": 7', '"eventNum": 9223372036854775808').encode(),
        EVENT_TEXT.replace('"eventNum": 7', '"eventNum": true').encode(),
        # Fields without a column, a null one too.
        EVENT_TEXT.replace('"reads": 1', '"reads": 1, "userDefined": null').encode(),
        EVENT_TEXT.replace('"reads": 1', '"reads": 1, "userDefined": {"a": [1]}').encode(),
        EVENT_TEXT.replace('"type": "SIMPLE"', '"type": "SIMPLE", "x": 1').encode(),
        EVENT_TEXT.replace('"reads": 1', '"reads": 1, "accessResults": ["ok", null]').encode(),
        # Missing, null or bad strict fields.
        EVENT_TEXT.replace('"idHex": "E28011606000020A1B2C3D4E"', '"idHex": null').encode(),
        EVENT_TEXT.replace('"idHex": "E28011606000020A1B2C3D4E"', '"idHex": ""').encode(),
        EVENT_TEXT.replace('"idHex": "E28011606000020A1B2C3D4E"', '"idHex": "E2 80"').encode(),
        EVENT_TEXT.replace('"idHex": "E28011606000020A1B2C3D4E"', '"idHex": "\\u0000"').encode(),
        json.dumps({"timestamp": EVENT["timestamp"]}).encode(),
        json.dumps({"data": EVENT["data"]}).encode(),
        json.dumps({"data": None, "timestamp": EVENT["timestamp"]}).encode(),
        json.dumps({"data": "x", "timestamp": EVENT["timestamp"]}).encode(),
        json.dumps(dict(EVENT, timestamp="2026-11-21T10:00:00.123")).encode(),
        json.dumps(dict(EVENT, timestamp="2026-11-21 10:00:00+0000")).encode(),
        json.dumps(dict(EVENT, timestamp="2026-02-30T10:00:00Z")).encode(),
        json.dumps(dict(EVENT, timestamp="2026-11-21T24:00:00Z")).encode(),
        json.dumps(dict(EVENT, timestamp="1899-12-31T23:59:59Z")).encode(),
        json.dumps(dict(EVENT, timestamp="3000-01-01T00:00:00Z")).encode(),
        json.dumps(dict(EVENT, timestamp="2999-12-31T23:00:00-0100")).encode(),
        json.dumps(dict(EVENT, timestamp="2026-11-21T10:00:00.1234567Z")).encode(),
        json.dumps(dict(EVENT, timestamp=5)).encode(),
        # Shapes.
        b"[]",
        json.dumps([EVENT] * 31).encode(),  # past max_reads
        json.dumps([EVENT, None]).encode(),
        json.dumps([EVENT, 5]).encode(),
        json.dumps([[EVENT]]).encode(),
        b"5",
        b'"text"',
        b"null",
        b"",
        b" " + EVENT_TEXT.encode(),
        json.dumps(EVENT, indent=1).encode(),  # line breaks
        EVENT_TEXT.replace(", ", ",\r").encode(),
        EVENT_TEXT.encode() + b" " + EVENT_TEXT.encode(),  # two documents
        EVENT_TEXT.encode() + b" x",
        # Out of the wrapper: `{"e":[` + payload + `]}` and `{"e":` + payload + `}`.
        EVENT_TEXT.encode() + b'], "e": [' + EVENT_TEXT.encode(),
        EVENT_TEXT.encode() + b'], "f": [1',
        EVENT_TEXT.encode() + b"]}" + b'{"e": [' + EVENT_TEXT.encode(),
        EVENT_TEXT.encode() + b", " + EVENT_TEXT.encode(),
        b"[" + EVENT_TEXT.encode() + b'], "e": [' + EVENT_TEXT.encode() + b"]",
        b"[" + EVENT_TEXT.encode() + b'], "f": 1',
        b"[" + EVENT_TEXT.encode() + b"]}" + b'{"e": [' + EVENT_TEXT.encode() + b"]",
        # Encoding and nesting.
        EVENT_TEXT.replace("SIMPLE", "SIMPLE\\ud800").encode(),
        EVENT_TEXT.replace("SIMPLE", "SIMPLE").encode().replace(b"SIMPLE", b"SIMPLE\xff"),
        EVENT_TEXT.replace('"reads": 1', '"reads": 1, "deep": ' + "[" * 600 + "]" * 600).encode(),
        b"{" * (MAX_NESTING + 1),
    ],
)
def test_what_the_native_path_cannot_vouch_for_goes_to_the_judge_and_builds_the_same(payload):
    assert judged(payload, max_reads=30)
    # Alone, and between two good messages that the native path does take.
    good = json.dumps(EVENT).encode()
    assert_same_batch(records_of([payload]), max_reads=30)
    assert_same_batch(records_of([good, payload, good]), max_reads=30)


def test_the_judge_does_not_refuse_every_message_the_native_path_hands_it():
    # A lenient field of an odd type is no reason to refuse: the judge keeps it in extra_fields,
    # and the native path only had to step aside.
    payload = EVENT_TEXT.replace('"reads": 1', '"reads": "3"').encode()
    assert judged(payload)
    (read,) = parse_payload(payload)
    assert json.loads(read.extra_fields) == {"data": {"reads": "3"}}


def test_whitespace_after_the_document_is_json_and_taken_natively():
    payload = EVENT_TEXT.encode() + b"  "
    assert not judged(payload)
    assert_same_batch(records_of([payload]))


def test_a_payload_over_the_size_limit_is_left_to_the_judge():
    payload = json.dumps(EVENT).encode()
    assert judged(payload, max_bytes=len(payload) - 1)
    assert not judged(payload, max_bytes=len(payload))


# -- timestamps -------------------------------------------------------------------------------

DIGITS = st.text("0123456789", min_size=2, max_size=2)
STAMP_TEXT = st.builds(
    "{}-{}-{}T{}:{}:{}{}{}".format,
    st.text("0123456789", min_size=4, max_size=4),
    DIGITS,
    DIGITS,
    DIGITS,
    DIGITS,
    DIGITS,
    st.sampled_from(["", ".1", ".12", ".123", ".1234", ".12345", ".123456"]),
    st.sampled_from(["Z", "+0000", "+00:00", "-0530", "+05:30", "+2359", "-23:59", "+2400"])
    | st.builds("{}{}:{}".format, st.sampled_from("+-"), DIGITS, DIGITS),
)


@settings(max_examples=500, deadline=None)
@given(STAMP_TEXT)
def test_a_timestamp_the_native_path_takes_is_the_one_the_judge_reads(stamp):
    payload = json.dumps(dict(EVENT, timestamp=stamp)).encode()
    native = parse_columns([payload])
    try:
        (expected,) = parse_payload(payload)
    except PayloadError:
        assert native.judged == {0}
        return
    if native.judged:
        return  # left to the judge, which took it: the rows are the judge's
    (taken,) = native.reads.column("event_time").to_pylist()
    assert taken == expected.event_time
    assert isinstance(taken, datetime)


def test_a_payload_the_reader_refuses_is_found_by_halves_and_alone_goes_to_the_judge():
    bad_date = json.dumps(dict(EVENT, timestamp="2026-02-30T10:00:00Z")).encode()
    not_json = b'{"data": '
    good = json.dumps(EVENT).encode()
    payloads = [good, bad_date, good, good, not_json, good, good]
    native = parse_columns(payloads)
    assert native.judged == {1, 4}
    assert native.reads.column("message").to_pylist() == [0, 2, 3, 5, 6]
    assert_same_batch(records_of(payloads))


def test_a_batch_of_junk_spends_a_bounded_number_of_reads_then_the_judge_takes_the_rest():
    good = json.dumps(EVENT).encode()
    payloads = [good if n % 2 else b'{"data": 1}' for n in range(400)]
    native = parse_columns(payloads)
    # Each refused line costs reads; the budget ends the search long before 400 lines.
    assert len(native.judged) > 200
    assert_same_batch(records_of(payloads))


def test_no_native_row_is_made_from_a_message_the_judge_was_handed():
    # The second message's first event is fine, its second is not: none of it may be taken.
    payload = json.dumps([EVENT, dict(EVENT, timestamp="1800-01-01T00:00:00Z")]).encode()
    native = parse_columns([json.dumps(EVENT).encode(), payload])
    assert native.judged == {1}
    assert native.reads.column("message").to_pylist() == [0]
    assert isinstance(native.reads, pa.Table)
