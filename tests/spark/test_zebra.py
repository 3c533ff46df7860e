import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from spark.topics import reader_id_from_topic
from spark.zebra import PayloadError, TagRead, parse_payload


def event(**overrides) -> dict:
    doc = {
        "data": {
            "idHex": "E28011606000020A1B2C3D4E",
            "antenna": 1,
            "peakRssi": -52,
            "eventNum": 1234,
            "channel": 915.25,
            "phase": 12.5,
            "format": "epc",
            "reads": 1,
        },
        "timestamp": "2026-11-21T10:00:00.123+0000",
        "type": "SIMPLE",
    }
    for key, value in overrides.items():
        if key.startswith("data_"):
            doc["data"][key[5:]] = value
        else:
            doc[key] = value
    return doc


def without(doc: dict, path: str) -> dict:
    target = doc
    *parents, leaf = path.split(".")
    for part in parents:
        target = target[part]
    del target[leaf]
    return doc


def encode(doc: object) -> bytes:
    return json.dumps(doc).encode()


def rejection(payload: bytes, **limits) -> PayloadError:
    with pytest.raises(PayloadError) as caught:
        parse_payload(payload, **limits)
    return caught.value


def test_single_event_parses_into_one_tag_read_with_lowercase_epc_and_utc_time():
    assert parse_payload(encode(event())) == (
        TagRead(
            epc="e28011606000020a1b2c3d4e",
            antenna=1,
            peak_rssi=-52.0,
            channel=915.25,
            phase=12.5,
            event_num=1234,
            event_time=datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=UTC),
            reader_mode="SIMPLE",
            format="epc",
            read_count=1,
        ),
    )


def test_array_of_events_parses_into_reads_in_message_order():
    reads = parse_payload(encode([event(data_eventNum=n) for n in (7, 8, 9)]))
    assert [r.event_num for r in reads] == [7, 8, 9]


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-11-21T10:00:00.123+0000", datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=UTC)),
        ("2026-11-21T10:00:00.123+00:00", datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=UTC)),
        ("2026-11-21T10:00:00.123Z", datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=UTC)),
        ("2026-11-21T10:00:00+0000", datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)),
        ("2026-11-21T10:00:00+00:00", datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)),
        ("2026-11-21T10:00:00Z", datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)),
        ("2026-11-21T11:30:00.5+01:30", datetime(2026, 11, 21, 10, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_every_timestamp_form_becomes_an_aware_utc_datetime(stamp, expected):
    (read,) = parse_payload(encode(event(timestamp=stamp)))
    assert read.event_time == expected
    assert read.event_time.tzinfo is UTC


def test_fractional_peak_rssi_is_kept_as_a_float():
    (read,) = parse_payload(encode(event(data_peakRssi=-52.5)))
    assert read.peak_rssi == -52.5


def test_optional_fields_may_be_absent_or_null():
    doc = event(data_antenna=None)
    for name in ("peakRssi", "channel", "phase", "eventNum"):
        without(doc, f"data.{name}")
    (read,) = parse_payload(encode(doc))
    assert (read.antenna, read.peak_rssi, read.channel, read.phase, read.event_num) == (None,) * 5


def test_unknown_fields_are_kept_as_json_shaped_like_the_event_and_change_nothing_else():
    doc = event(data_userDefined="x", data_tid="E2801160", extra={"nested": [1, 2]})
    (read,) = parse_payload(encode(doc))
    assert json.loads(read.extra_fields) == {
        "data": {"userDefined": "x", "tid": "E2801160"},
        "extra": {"nested": [1, 2]},
    }
    (plain,) = parse_payload(encode(event()))
    assert plain.extra_fields is None
    assert replace(read, extra_fields=None) == plain


def test_a_known_field_of_an_unexpected_type_is_kept_in_extra_fields_not_refused():
    doc = event(type=7, data_reads="3", data_TID=["E280"], data_accessResults="SUCCESS")
    (read,) = parse_payload(encode(doc))
    assert (read.reader_mode, read.read_count, read.tid, read.access_results) == (None,) * 4
    assert json.loads(read.extra_fields) == {
        "type": 7,
        "data": {"reads": "3", "TID": ["E280"], "accessResults": "SUCCESS"},
    }


def test_extra_fields_stay_valid_utf8_json_for_lone_surrogates_and_overflowing_numbers():
    payload = (
        b'{"data": {"idHex": "ab", "big": 1e400, "small": -1e400, "odd": "\\ud800",'
        b' "word": "Infinity", "PC": "\\udc00"}, "timestamp": "2026-11-21T10:00:00Z"}'
    )
    (read,) = parse_payload(payload)
    read.extra_fields.encode("utf-8")
    assert read.pc is None  # a lone surrogate is no text for a UTF-8 column
    assert json.loads(read.extra_fields) == {
        "data": {
            "big": float("inf"),
            "small": float("-inf"),
            "odd": "\ud800",
            "word": "Infinity",
            "PC": "\udc00",
        }
    }


def test_oversized_payload_is_rejected_before_decoding():
    error = rejection(b"x" * 101, max_bytes=100)
    assert (error.reason, error.detail) == ("oversized", "101 bytes, limit 100")


def test_payload_at_the_size_limit_is_accepted():
    payload = encode(event())
    assert len(parse_payload(payload, max_bytes=len(payload))) == 1


def test_invalid_utf8_is_rejected():
    assert rejection(b'{"data": "\xff"}').reason == "invalid_utf8"


def test_text_that_is_not_json_is_rejected():
    assert rejection(b"epc=e280,antenna=1").reason == "invalid_json"


def test_nan_is_not_json():
    assert rejection(encode(event()).replace(b"-52", b"NaN")).reason == "invalid_json"


def test_a_list_of_ints_is_not_a_tag_event():
    error = rejection(b"[1, 2, 3]")
    assert error.reason == "not_a_tag_event"
    assert "[0]" in error.detail


def test_a_json_scalar_is_not_a_tag_event():
    assert rejection(b'"hello"').reason == "not_a_tag_event"


def test_an_object_without_a_data_object_is_not_a_tag_event():
    assert rejection(encode({"timestamp": "2026-11-21T10:00:00Z"})).reason == "not_a_tag_event"
    assert rejection(encode(event(data=[1]))).reason == "not_a_tag_event"


def test_an_empty_array_is_rejected():
    assert rejection(b"[]").reason == "empty_array"


def test_more_events_than_max_reads_are_rejected():
    error = rejection(encode([event()] * 4), max_reads=3)
    assert (error.reason, error.detail) == ("too_many_reads", "4 events, limit 3")


def test_missing_id_hex_names_the_field():
    error = rejection(encode(without(event(), "data.idHex")))
    assert (error.reason, error.detail) == ("missing_field", "data.idHex")


def test_missing_timestamp_names_the_field():
    error = rejection(encode(without(event(), "timestamp")))
    assert (error.reason, error.detail) == ("missing_field", "timestamp")


def test_antenna_given_as_a_string_is_the_wrong_type():
    error = rejection(encode(event(data_antenna="1")))
    assert error.reason == "wrong_type"
    assert "data.antenna" in error.detail and "string" in error.detail


def test_antenna_given_as_a_boolean_is_the_wrong_type_although_bool_is_an_int():
    error = rejection(encode(event(data_antenna=True)))
    assert error.reason == "wrong_type"
    assert "data.antenna" in error.detail and "boolean" in error.detail


def test_antenna_beyond_int32_is_rejected_rather_than_breaking_the_arrow_column():
    assert rejection(encode(event(data_antenna=2**31))).reason == "wrong_type"


def test_peak_rssi_given_as_a_string_is_the_wrong_type():
    error = rejection(encode(event(data_peakRssi="-52")))
    assert error.reason == "wrong_type"
    assert "data.peakRssi" in error.detail


def test_event_num_given_as_a_float_is_the_wrong_type():
    assert rejection(encode(event(data_eventNum=12.0))).reason == "wrong_type"


@pytest.mark.parametrize(
    "stamp", ["yesterday", "2026-13-01T00:00:00Z", "2026-11-21T10:00:00", "2026-11-21", ""]
)
def test_unparseable_or_zoneless_timestamp_is_a_bad_timestamp(stamp):
    assert rejection(encode(event(timestamp=stamp))).reason == "bad_timestamp"


def test_timestamp_given_as_a_number_is_the_wrong_type():
    assert rejection(encode(event(timestamp=1795000000))).reason == "wrong_type"


@pytest.mark.parametrize("epc", ["e280-1160", "xyz", "", " e280"])
def test_non_hex_epc_is_a_bad_epc(epc):
    assert rejection(encode(event(data_idHex=epc))).reason == "bad_epc"


def test_one_bad_element_rejects_the_whole_array_and_names_its_index():
    doc = [event(), without(event(), "timestamp"), event()]
    error = rejection(encode(doc))
    assert (error.reason, error.detail) == ("missing_field", "[1].timestamp")


def test_bad_element_detail_names_its_index_for_nested_fields_too():
    doc = [event(), event(), without(event(), "data.idHex")]
    assert rejection(encode(doc)).detail == "[2].data.idHex"


def test_a_non_object_element_in_an_array_names_its_index():
    error = rejection(encode([event(), 5]))
    assert error.reason == "not_a_tag_event"
    assert "[1]" in error.detail


def test_payload_error_is_a_value_error_carrying_reason_and_detail():
    error = rejection(b"[]")
    assert isinstance(error, ValueError)
    assert str(error) == f"empty_array: {error.detail}"


def test_detail_never_carries_a_lone_surrogate_into_a_utf8_column():
    error = rejection(b'{"data": {"idHex": "\\ud800"}, "timestamp": "2026-11-21T10:00:00Z"}')
    assert error.reason == "bad_epc"
    error.detail.encode("utf-8")


@pytest.mark.parametrize(
    ("topic", "reader"),
    [
        ("zebra/fx/fx9600-01/reads", "fx9600-01"),
        ("site-a/dock-3/events", "dock-3"),
        ("reader7/reads", "reader7"),
        ("reads", "reads"),
        ("/reads", "/reads"),
    ],
)
def test_reader_id_comes_from_the_topic(topic, reader):
    assert reader_id_from_topic(topic) == reader
