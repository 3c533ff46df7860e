"""Management events of the Zebra IoT Connector: recognised by their envelope, checked, and a
heartbeat's data-path counters read from either shape the reader gateway sends them in.

The shapes follow Zebra's IoT Connector documentation (zebradevs.github.io/rfid-ziotc-docs:
the heartbeat's radio_control / reader_gateway / system / userapps sections and the
NUM_DATA_MESSAGES_* heartbeat fields; gpi {pin, state}; error / warning {message};
firmwareUpdateProgress {status, imageDownloadProgress, overallUpdateProgress,
updateProgressDetails}) and, for `dataPathStatistics`, what a published capture of a live
reader showed in place of the documented flat counters.
"""

import json
from datetime import UTC, datetime

import pytest

from spark.zebra import (
    INVALID_JSON,
    INVALID_MANAGEMENT_EVENT,
    MISSING_FIELD,
    OVERSIZED,
    DataPathCounters,
    PayloadError,
    management_event_in,
    parse_management_payload,
    parse_payload,
)

STAMP = "2026-11-21T10:00:00.123+0000"


def envelope(kind: str, data: object, **overrides) -> dict:
    doc = {"component": "RG", "data": data, "eventNum": 327, "timestamp": STAMP, "type": kind}
    doc.update(overrides)
    return {k: v for k, v in doc.items() if v is not ...}


def live_heartbeat(sent: int = 3062, received: int = 3062) -> dict:
    """The layout a live FX9600 was seen to send: counters in `dataPathStatistics`."""
    return envelope(
        "heartbeat",
        {
            "radio_control": {
                "antennas": {"1": "connected", "2": "disconnected"},
                "cpu": 0.1,
                "numDataMessagesTxed": sent,
                "numTagReads": sent,
                "radioActivity": "inactive",
                "radioConnection": "connected",
                "uptime": "05:19:28",
            },
            "reader_gateway": {
                "cpu": 0.4,
                "dataPathStatistics": [
                    {
                        "numDataMessagesDropped": 0,
                        "numDataMessagesRetained": 2,
                        "numDataMessagesRxed": received,
                        "numDataMessagesTxed": sent,
                    }
                ],
                "numErrors": 7,
                "numManagementEventsTxed": 327,
                "numWarnings": 0,
                "uptime": "5:19:29",
            },
            "system": {"GPI": {"1": "HIGH", "2": "HIGH"}, "GPO": {"1": "LOW"}},
            "userapps": [],
        },
    )


def documented_heartbeat() -> dict:
    """The documented layout: the four counters flat in `reader_gateway`."""
    return envelope(
        "HEARTBEAT",
        {
            "reader_gateway": {
                "numDataMessagesRxed": 10,
                "numDataMessagesTxed": 9,
                "numDataMessagesRetained": 1,
                "numDataMessagesDropped": 0,
            }
        },
    )


def payload(doc: object) -> bytes:
    return json.dumps(doc).encode()


def recognised(doc: object):
    """What build_batch does with a message on a data topic: tag parser first, then the shape."""
    with pytest.raises(PayloadError) as refused:
        parse_payload(payload(doc))
    return management_event_in(payload(doc), refused.value)


def test_a_live_heartbeat_is_recognised_by_its_envelope_and_its_data_path_counters_are_read():
    event = recognised(live_heartbeat(sent=3062, received=3070))
    assert event.is_heartbeat
    assert (event.type, event.component, event.event_num) == ("heartbeat", "RG", 327)
    assert event.event_time == datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=UTC)
    assert event.counters == DataPathCounters(received=3070, sent=3062, retained=2, dropped=0)
    assert json.loads(event.data_json) == live_heartbeat(sent=3062, received=3070)["data"]


def test_the_documented_flat_counters_are_read_and_the_type_is_compared_without_case():
    event = recognised(documented_heartbeat())
    assert event.is_heartbeat and event.type == "HEARTBEAT"
    assert event.counters == DataPathCounters(received=10, sent=9, retained=1, dropped=0)


def test_counters_over_several_data_paths_are_summed_and_say_how_many_paths():
    doc = live_heartbeat()
    paths = doc["data"]["reader_gateway"]["dataPathStatistics"]
    paths.append(dict(paths[0], numDataMessagesTxed=5))
    event = recognised(doc)
    assert event.counters.sent == 3062 + 5
    assert event.counters.paths == 2


def test_a_heartbeat_with_an_odd_counter_is_kept_with_that_counter_unknown():
    doc = live_heartbeat()
    doc["data"]["reader_gateway"]["dataPathStatistics"][0]["numDataMessagesTxed"] = "many"
    event = recognised(doc)
    assert event.counters.sent is None and event.counters.received == 3062


def test_a_heartbeat_without_reader_gateway_section_has_no_counters():
    assert recognised(envelope("heartbeat", {"system": {}})).counters is None


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("gpi", {"pin": 2, "state": "LOW"}),
        ("gpo", {"pin": 1, "state": "HIGH"}),
        ("error", {"message": "radio: antenna 3 disconnected"}),
        ("warning", {"message": "flash usage above 90 %"}),
        (
            "firmwareUpdateProgress",
            {
                "status": "started",
                "imageDownloadProgress": 0,
                "overallUpdateProgress": 0,
                "updateProgressDetails": None,
            },
        ),
    ],
)
def test_gpi_gpo_error_warning_and_firmware_progress_events_are_recognised(kind, data):
    event = recognised(envelope(kind, data))
    assert event.type == kind and not event.is_heartbeat and event.counters is None
    assert json.loads(event.data_json) == data


def test_an_envelope_with_only_event_num_and_no_component_is_still_one():
    event = recognised(envelope("gpi", {"pin": 1, "state": "HIGH"}, component=...))
    assert event.component is None and event.event_num == 327


def test_a_tag_data_event_is_never_taken_for_a_management_event():
    tag = {"data": {"idHex": "e280aa", "eventNum": 5}, "timestamp": STAMP, "type": "SIMPLE"}
    assert len(parse_payload(payload(tag))) == 1
    # A tag event missing its idHex stays a bad tag event: it has no component, no eventNum on top.
    broken = {"data": {"eventNum": 5}, "timestamp": STAMP, "type": "SIMPLE"}
    with pytest.raises(PayloadError) as refused:
        parse_payload(payload(broken))
    with pytest.raises(PayloadError) as again:
        management_event_in(payload(broken), refused.value)
    assert again.value is refused.value and again.value.reason == MISSING_FIELD


@pytest.mark.parametrize(
    ("doc", "detail"),
    [
        (envelope("heartbeat", {}, timestamp="yesterday"), "not ISO-8601"),
        (envelope("heartbeat", {}, timestamp="2026-11-21T10:00:00"), "no UTC offset"),
        (envelope("heartbeat", {}, eventNum="327"), "eventNum: expected an integer"),
        (envelope("heartbeat", {}, eventNum=-1), "negative"),
        (envelope("gpi", {}, component=7), "component: expected a string"),
        (envelope("", {}), "type: expected a non-empty string"),
        (envelope(["gpi"], {}), "type: expected a non-empty string"),
    ],
)
def test_a_malformed_management_event_is_refused_with_its_own_reason(doc, detail):
    with pytest.raises(PayloadError) as refused:
        recognised(doc)
    assert refused.value.reason == INVALID_MANAGEMENT_EVENT
    assert detail in refused.value.detail


def test_on_a_management_topic_anything_but_an_envelope_is_refused():
    assert parse_management_payload(payload(live_heartbeat())).is_heartbeat
    for doc, reason in [
        ({"data": {"idHex": "e280"}, "timestamp": STAMP, "type": "SIMPLE"}, "invalid_management"),
        ([live_heartbeat()], "invalid_management"),
        (envelope("gpi", "pin 2 low"), "invalid_management"),
    ]:
        with pytest.raises(PayloadError) as refused:
            parse_management_payload(payload(doc))
        assert refused.value.reason.startswith(reason), doc
    with pytest.raises(PayloadError) as refused:
        parse_management_payload(b"{not json")
    assert refused.value.reason == INVALID_JSON
    with pytest.raises(PayloadError) as refused:
        parse_management_payload(payload(live_heartbeat()), max_bytes=10)
    assert refused.value.reason == OVERSIZED
