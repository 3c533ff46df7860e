"""The Zebra parser and the batch builder under hostile input: the new reasons, and a fuzz run of
more than 10,000 generated payloads and topics that must all end as rows or known dead letters."""

import json
import math
import threading
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark.schema import build_batch
from spark.topics import topic_matches, topic_problem
from spark.zebra import (
    BAD_TIMESTAMP,
    INVALID_JSON,
    INVALID_TOPIC,
    MAX_NESTING,
    NESTED_TOO_DEEP,
    NOT_A_TAG_EVENT,
    OVERSIZED,
    REASONS,
    TOO_MANY_READS,
    PayloadError,
    parse_payload,
)
from tests.spark.test_sanitise import Record

EVENT = {
    "data": {"idHex": "E28011606000020A1B2C3D4E", "antenna": 1, "eventNum": 1},
    "timestamp": "2026-11-21T10:00:00.123+0000",
}


def reason_of(payload: bytes, **limits) -> str:
    with pytest.raises(PayloadError) as caught:
        parse_payload(payload, **limits)
    assert caught.value.reason in REASONS
    return caught.value.reason


# -- nesting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b"[" * 100_000,  # never closed: refused for its depth before the decoder recurses
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        b'{"data": {"idHex": ' + b"[" * 2000 + b"]" * 2000 + b"}}",
        b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1),
    ],
)
def test_a_payload_nested_deeper_than_the_limit_is_nested_too_deep(payload):
    assert reason_of(payload) == NESTED_TOO_DEEP


def test_nesting_at_the_limit_is_decoded_and_judged_on_its_shape():
    payload = b"[" * MAX_NESTING + b"]" * MAX_NESTING
    assert reason_of(payload) == NOT_A_TAG_EVENT


def test_brackets_inside_strings_do_not_count_as_nesting():
    doc = [dict(EVENT, type="[" * 600 + '{\\"' + "{" * 600)] * 2
    reads = parse_payload(json.dumps(doc).encode())
    assert len(reads) == 2


def test_a_large_batch_with_many_brackets_but_shallow_nesting_parses():
    reads = parse_payload(json.dumps([EVENT] * 1000).encode())
    assert len(reads) == 1000


def call_at_depth(depth: int, function, *args):
    if depth == 0:
        return function(*args)
    return call_at_depth(depth - 1, function, *args)


@pytest.mark.parametrize("levels", [MAX_NESTING, MAX_NESTING + 1, 900, 990, 5000])
def test_the_verdict_on_a_deep_payload_does_not_depend_on_the_callers_stack(levels):
    """A replayed batch must dead-letter exactly what it did the first time, whatever thread
    and call depth builds it (a RecursionError in the decoder would not be so)."""
    payload = b"[" * levels + b"]" * levels
    here = reason_of(payload)
    results = []

    def deep():
        try:
            call_at_depth(300, parse_payload, payload)
        except PayloadError as error:
            results.append(error.reason)

    thread = threading.Thread(target=deep)
    thread.start()
    thread.join(30)
    assert results == [here]


# -- size, arrays, timestamps ------------------------------------------------------------------


def test_the_size_limit_is_checked_before_anything_is_decoded():
    assert reason_of(b"\xff" * 2000, max_bytes=1000) == OVERSIZED
    assert reason_of(b"[" * 2000, max_bytes=1000) == OVERSIZED


def test_the_default_size_limit_is_one_mebibyte():
    padded = json.dumps(dict(EVENT, pad="x" * (1024 * 1024 - 200))).encode()
    assert len(padded) <= 1024 * 1024
    assert len(parse_payload(padded)) == 1
    assert reason_of(padded + b" " * (1024 * 1024)) == OVERSIZED


def test_a_huge_array_of_tiny_elements_is_refused_by_count():
    assert reason_of(b"[" + b"0," * 200_000 + b"0]") == TOO_MANY_READS


@pytest.mark.parametrize(
    "stamp",
    ["0001-01-01T00:00:00+00:00", "1899-12-31T23:59:59Z", "3000-01-01T00:00:00Z", "9999-12-31Z"],
)
def test_a_timestamp_outside_the_plausible_years_is_a_bad_timestamp(stamp):
    assert reason_of(json.dumps(dict(EVENT, timestamp=stamp)).encode()) == BAD_TIMESTAMP


@pytest.mark.parametrize("stamp", ["1900-01-01T00:00:00Z", "2999-12-31T23:59:59.999999Z"])
def test_timestamps_at_the_edges_of_the_plausible_years_are_taken(stamp):
    assert len(parse_payload(json.dumps(dict(EVENT, timestamp=stamp)).encode())) == 1


def test_an_integer_too_long_to_convert_is_invalid_json_not_a_crash():
    assert reason_of(b'{"data": {"idHex": "ab", "antenna": ' + b"9" * 5000 + b"}}") == INVALID_JSON


# -- the fuzz run ------------------------------------------------------------------------------

# Text with everything JSON can carry through an escape, lone surrogates and NUL included.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | ANY_TEXT
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(ANY_TEXT, children, max_size=4)
    ),
    max_leaves=6,
)
HEX = st.text("0123456789abcdefABCDEF", min_size=1, max_size=24)
PLAUSIBLE_STAMPS = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
).map(lambda d: d.isoformat())


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, each drawn `weight` times in `sum(weights)`: one_of(a, a, b) would
    not do it, since one_of counts equal branches once."""
    # Each copy a distinct object (an identity map): cheaper to draw than a flatmap.
    return st.one_of(*(strategy.map(_same) for weight, strategy in choices for _ in range(weight)))


def _same(value):
    return value


STAMPS = weighted(
    (5, PLAUSIBLE_STAMPS),
    (
        1,
        st.datetimes(
            min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
        ).map(lambda d: d.isoformat()),
    ),
    (1, st.datetimes().map(lambda d: d.isoformat())),  # no offset
    (1, st.sampled_from(["2026-11-21T10:00:00.123+0000", "2026-11-21T10:00:00Z", "", "never"])),
)


def field(good: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a plausible value, one time in eight any JSON value at all."""
    return weighted((7, good), (1, JSON_VALUES))


OPTIONAL_DATA = {
    # Out-of-range numbers, infinities and the like come from JSON_VALUES.
    "antenna": field(st.integers(-(2**31), 2**31 - 1)),
    "peakRssi": field(st.integers(-90, -20) | st.floats(-1e300, 1e300)),
    "channel": field(st.floats(902, 928)),
    "phase": field(st.floats(-180, 180)),
    "eventNum": field(st.integers(-(2**63), 2**63 - 1)),
}
# Complete events (each field may still be wrong) and events with any part missing.
COMPLETE_EVENTS = st.fixed_dictionaries(
    {
        "data": st.fixed_dictionaries({"idHex": field(HEX)}, optional=OPTIONAL_DATA),
        "timestamp": field(STAMPS),
    },
    optional={"type": st.just("SIMPLE")},
)
PARTIAL_EVENTS = st.fixed_dictionaries(
    {},
    optional={
        "data": field(st.fixed_dictionaries({}, optional={"idHex": field(HEX), **OPTIONAL_DATA})),
        "timestamp": field(STAMPS),
    },
)
EVENTS = weighted((3, COMPLETE_EVENTS), (1, PARTIAL_EVENTS))


def dumps(doc: object, ascii_only: bool) -> bytes:
    return json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def spliced(data: bytes, at: int, insert: bytes, cut: int) -> bytes:
    at = at % (len(data) + 1)
    return data[:at] + insert + data[at + cut :]


DOCS = weighted((4, EVENTS), (2, st.lists(EVENTS, max_size=6)), (1, JSON_VALUES))
ENCODED = st.builds(dumps, DOCS, st.booleans())
PAYLOADS = weighted(
    (6, ENCODED),
    # Damaged in transit: a few bytes inserted or cut anywhere (invalid UTF-8, broken JSON).
    (
        2,
        st.builds(
            spliced, ENCODED, st.integers(0, 10_000), st.binary(max_size=3), st.integers(0, 3)
        ),
    ),
    (1, st.binary(max_size=64)),
    (
        1,
        st.integers(0, 3 * MAX_NESTING).flatmap(
            lambda n: st.sampled_from(
                [b"[" * n + b"]" * n, b"[" * n, b'{"a":' * n + b"0" + b"}" * n, b"{" * n]
            )
        ),
    ),
    (1, st.builds(lambda n: b"[" + b"{}," * n + b"{}]", st.integers(0, 40))),
)
TOPICS = weighted(
    (2, st.just("zebra/fx/fx9600-01/reads")),
    (2, st.builds("zebra/fx/{}/reads".format, st.text(st.characters(exclude_categories=())))),
    (1, st.text(st.characters(exclude_categories=()), max_size=30)),
)


def check_reads(reads) -> None:
    assert reads, "a message without reads must be a PayloadError"
    for read in reads:
        assert read.epc and all(c in "0123456789abcdef" for c in read.epc)
        assert read.antenna is None or -(2**31) <= read.antenna < 2**31
        assert read.event_num is None or -(2**63) <= read.event_num < 2**63
        for value in (read.peak_rssi, read.channel, read.phase):
            assert value is None or (type(value) is float and math.isfinite(value))
        assert read.event_time.tzinfo is UTC
        assert 1900 <= read.event_time.year < 3000


MESSAGES_PER_EXAMPLE = 10


@settings(
    # 1,000 examples of 10 messages: 10,000 generated payloads and topics. Drawn as lists,
    # since hypothesis's cost per example, not per message, bounds the run.
    max_examples=1_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.lists(
        st.tuples(TOPICS, PAYLOADS), min_size=MESSAGES_PER_EXAMPLE, max_size=MESSAGES_PER_EXAMPLE
    )
)
def test_every_generated_payload_and_topic_ends_as_rows_or_one_known_dead_letter(messages):
    records, expected = [], []
    for index, (topic, payload) in enumerate(messages):
        key = f"k{index}"
        records.append(Record(key, topic, payload, received_time=1.7e9))
        expected.append(expect(key, topic, payload))

    # The batch builder, all messages in one batch: a bad one never spoils the one after it.
    batch = build_batch(
        records, batch_id=1, max_payload_bytes=4096, max_reads=30, events_filter=EVENTS_FILTER
    )
    for table in (batch.reads, batch.dead_letters, batch.events):
        table.validate(full=True)  # every string valid UTF-8, every value in its type
    reads = [r["message_id"] for r in batch.reads.to_pylist()]
    dead = [(d["message_key"], d["reason"], d["payload"]) for d in batch.dead_letters.to_pylist()]
    assert reads == [read for outcome in expected if outcome[0] == "rows" for read in outcome[1]]
    assert dead == [outcome[1] for outcome in expected if outcome[0] == "dead"]


EVENTS_FILTER = "fxgate/test/+/lifecycle"


def expect(key: str, topic: str, payload: bytes) -> tuple:
    """What one message must become, from the parser alone: rows that fit the table, or a
    PayloadError with a known reason."""
    if topic_matches(EVENTS_FILTER, topic) and topic_problem(topic) is None:
        return ("event", key)
    reads, reason = None, None
    try:
        reads = parse_payload(payload, max_bytes=4096, max_reads=30)
    except PayloadError as error:
        reason = error.reason
    if reads is None:
        assert reason in REASONS
    else:
        check_reads(reads)
    if topic_problem(topic) is not None:
        reason = INVALID_TOPIC
    if reason is not None:
        return ("dead", (key, reason, payload[:4096]))
    return ("rows", [f"{key}:{i}" for i in range(len(reads))])


# -- orjson where it reads as json does (spark.zebra._loads) ------------------------------------

NUMBER_TEXT = st.from_regex(
    r"\A-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][-+]?[0-9]{1,3})?\Z", fullmatch=True
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),  # lone surrogates too: json.dumps escapes them as \udXXX
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)


def read_by_json(text: str) -> str:
    from spark.zebra import _DECODER

    try:
        return repr(_DECODER.decode(text))
    except ValueError:
        return "refused"


def read_fast(text: str) -> str:
    from spark.zebra import _loads

    try:
        return repr(_loads(text.encode("utf-8", "surrogatepass"), text))
    except ValueError:
        return "refused"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON_VALUES, ascii_only=st.booleans())
def test_the_fast_decoder_reads_every_document_as_json_does(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    if not ascii_only:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # not a payload: parse_payload refuses it as invalid_utf8
            return
    # repr tells 1 from 1.0 and -0.0 from 0.0: the values must be the same, types and all.
    assert read_fast(text) == read_by_json(text)


@settings(max_examples=1500, deadline=None)
@given(number=NUMBER_TEXT, wrap=st.sampled_from(["{}", "[{}]", '{{"data": {{"eventNum": {}}}}}']))
def test_the_fast_decoder_reads_every_number_as_json_does(number, wrap):
    text = wrap.format(number)
    assert read_fast(text) == read_by_json(text)


@pytest.mark.parametrize(
    "text",
    [
        "[18446744073709551616]",  # one past uint64: orjson gives a float
        "[-9223372036854775809]",  # one below int64
        "[123456789012345678901234567890]",
        "[1e400]",  # json: inf, kept in extra_fields as 1e999; orjson refuses it
        '["\\ud800"]',  # a lone surrogate escape: json keeps it, orjson refuses it
        "[NaN]",  # both refuse
        '{"a": 1, "a": 2}',
    ],
)
def test_the_inputs_where_orjson_and_json_differ_are_read_as_json_reads_them(text):
    assert read_fast(text) == read_by_json(text)
