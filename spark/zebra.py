"""The Zebra IoT Connector "tag data event": what an FX9600 publishes for every tag it reads.

One MQTT message holds one event object, or (with batching on in the reader's connector config) a
JSON array of them:

    {"data": {"idHex": "e280...", "antenna": 1, "peakRssi": -52, "eventNum": 1234,
              "channel": 915.25, "phase": 12.5, "format": "epc", "reads": 1},
     "timestamp": "2026-11-21T10:00:00.123+0000", "type": "SIMPLE"}

`parse_payload` turns a payload into `TagRead`s or raises `PayloadError` with a fixed reason code.
Every field of an event is kept (`TagRead`): the few the table has always had are checked strictly
(a wrong type rejects the message), the fields added later (the reader mode `type`, `format`,
`reads`, the tag memory and access fields) are taken leniently, because they were never a reason
to refuse a message and must not become one (DESIGN §7.8: the same dead letters as before). A
value that does not fit its column, and every field this parser does not know, is kept as JSON
in `extra_fields`, in the place the event had it: nothing a reader sends is thrown away.
A message is all or nothing: one bad element rejects the whole message, which then lands whole in
`dead_letters` (DESIGN §3.6) — keeping the good half would make the message neither stored nor
dead-lettered, and a replay could not tell which reads of it belong where.

Hostile input is bounded before it costs anything: the size first, then the nesting depth, then
the number of events. Every outcome is a pure function of the bytes (never of the thread that
parses them), so a batch replayed after a crash dead-letters exactly what it did before.

The same reader also publishes **management events** (the connector's "management events"
interface: heartbeats, GPI and GPO pin changes, errors, warnings, firmware update progress), one
envelope for all of them:

    {"type": "heartbeat", "timestamp": "2026-11-21T10:00:00.123+0000", "component": "RG",
     "eventNum": 327, "data": {"reader_gateway": {"dataPathStatistics": [
         {"numDataMessagesRxed": 3062, "numDataMessagesTxed": 3062,
          "numDataMessagesRetained": 0, "numDataMessagesDropped": 0}], ...}, ...}}

A tag data event never carries `component` nor a top-level `eventNum` (its counter is inside
`data`), so the envelope is told apart by its shape (`management_event_in`), or by the topic it
came on when the operator names the management topics; `parse_management_payload` checks one.
A heartbeat's data-path counters come from `data.reader_gateway`: flat `numDataMessages*`
fields as Zebra's documentation shows them, or the `dataPathStatistics` array that live readers
were seen to send instead (`DataPathCounters`).

Topics and reader ids come from whoever can publish to the broker: `topic_problem` says when a
topic cannot be stored as it is, and `safe_reader_id` turns a reader's topic level into a name
that is safe as a file name or a partition value.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate

import orjson

from spark.topics import show

DEFAULT_MAX_BYTES = 1024 * 1024
DEFAULT_MAX_READS = 10_000
# A tag event is 2 levels deep (3 in an array). The limit sits far below the interpreter's
# recursion limit (1000 frames, shared with the caller's stack), so that a RecursionError inside
# the json decoder can never decide a message's fate: which messages are too deep must not depend
# on how deep the calling thread happens to be.
MAX_NESTING = 512

# Reason codes: stored in dead_letters.reason and counted by operators, so they never change.
OVERSIZED = "oversized"  # payload over max_bytes; checked before any decoding
INVALID_UTF8 = "invalid_utf8"  # payload not UTF-8
INVALID_JSON = "invalid_json"  # not JSON (NaN/Infinity too, or an int too long to convert)
NOT_A_TAG_EVENT = "not_a_tag_event"  # not an event object / array of them with a data object
EMPTY_ARRAY = "empty_array"  # an array with no events
TOO_MANY_READS = "too_many_reads"  # more events than max_reads in one message
MISSING_FIELD = "missing_field"  # no data.idHex or timestamp
WRONG_TYPE = "wrong_type"  # a field of the wrong JSON type, or out of its column's range
BAD_TIMESTAMP = "bad_timestamp"  # not ISO-8601, no offset, or outside _EARLIEST.._LATEST
BAD_EPC = "bad_epc"  # idHex not hexadecimal
NESTED_TOO_DEEP = "nested_too_deep"  # JSON nested deeper than MAX_NESTING
INVALID_TOPIC = "invalid_topic"  # not a valid MQTT topic name (topic_problem), set by the batch
# A management event envelope with a bad field, or a message on a management topic that is not one.
INVALID_MANAGEMENT_EVENT = "invalid_management_event"

REASONS = frozenset(
    {
        OVERSIZED,
        INVALID_UTF8,
        INVALID_JSON,
        NOT_A_TAG_EVENT,
        EMPTY_ARRAY,
        TOO_MANY_READS,
        MISSING_FIELD,
        WRONG_TYPE,
        BAD_TIMESTAMP,
        BAD_EPC,
        NESTED_TOO_DEEP,
        INVALID_TOPIC,
        INVALID_MANAGEMENT_EVENT,
    }
)

# The columns these land in are int32 (antenna) and int64 (eventNum): a value out of range must be
# rejected here, as bad input, not blow up the Arrow conversion of a whole batch later.
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)

_HEX = re.compile(r"[0-9A-Fa-f]+")
_NOT_A_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP = [1 if b in b"[{" else -1 for b in range(256)]
# No tag was read outside these years; the bounds keep garbage clocks out of the `date` partitions
# and out of what Python can convert back (pyspark's collect() failed on 0001-01-01 UTC: its
# local-time conversion gave year 0).
_EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
_LATEST = datetime(3000, 1, 1, tzinfo=UTC)


# Not frozen, though nothing changes a TagRead once made: a frozen dataclass sets each field
# through object.__setattr__, which cost 1.9 µs a read (a fifth of a batch's parse); a plain
# slotted one costs 0.4 µs.
@dataclass(slots=True)
class TagRead:
    epc: str
    antenna: int | None
    peak_rssi: float | None
    channel: float | None
    phase: float | None
    event_num: int | None
    event_time: datetime
    # The fields below are taken leniently (see the module's docstring): None when absent, null,
    # or of a type that does not fit (the value is then in extra_fields).
    reader_mode: str | None = None  # `type`: SIMPLE, INVENTORY, PORTAL, CONVEYOR, CUSTOM, ...
    format: str | None = None  # data.format: how idHex is written ("epc")
    read_count: int | None = None  # data.reads: reads of the tag in the report interval
    tid: str | None = None  # data.TID: the TID memory bank, hex
    user_memory: str | None = None  # data.USER: the USER memory bank, hex
    epc_memory: str | None = None  # data.EPC: the whole EPC memory bank, hex
    pc: str | None = None  # data.PC: the protocol control bits, hex
    xpc: str | None = None  # data.XPC: the extended protocol control bits, hex
    crc: str | None = None  # data.CRC: the tag's CRC, hex
    access_results: tuple[str, ...] | None = None  # data.accessResults, one per access operation
    # Every other field of the event, and any value above that did not fit its column, as a
    # JSON object shaped like the event ({"data": {...}, ...}, sorted keys); None when nothing.
    extra_fields: str | None = None


class PayloadError(ValueError):
    """A payload that is not a well-formed tag data event; `reason` is one of `REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def parse_payload(
    payload: bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_reads: int = DEFAULT_MAX_READS
) -> tuple[TagRead, ...]:
    """Every read of one message, in message order; raises `PayloadError` if any part is bad."""
    if len(payload) > max_bytes:
        raise PayloadError(OVERSIZED, f"{len(payload)} bytes, limit {max_bytes}")
    raw = bytes(payload)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(INVALID_UTF8, f"at byte {exc.start}: {exc.reason}") from None
    # A document cannot nest deeper than it has opening brackets, nor have more of them than
    # characters: only a payload with many (a large batch, or an attack) needs its depth
    # measured, and it is measured on the text, before the decoder recurses into it.
    if (
        len(text) > MAX_NESTING
        and text.count("[") + text.count("{") > MAX_NESTING
        and _text_depth(text) > MAX_NESTING
    ):
        raise PayloadError(NESTED_TOO_DEEP, f"nested deeper than {MAX_NESTING} levels")
    try:
        doc = _loads(raw, text)
    except RecursionError:  # cannot happen below MAX_NESTING; kept so it never escapes
        raise PayloadError(NESTED_TOO_DEEP, f"nested deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:
        raise PayloadError(INVALID_JSON, str(exc)) from None

    if isinstance(doc, dict):
        return (_parse_event(doc, ""),)
    if isinstance(doc, list):
        if not doc:
            raise PayloadError(EMPTY_ARRAY, "the array holds no events")
        if len(doc) > max_reads:
            raise PayloadError(TOO_MANY_READS, f"{len(doc)} events, limit {max_reads}")
        return tuple(_parse_event(event, f"[{i}].") for i, event in enumerate(doc))
    raise PayloadError(NOT_A_TAG_EVENT, f"top level is {_json_type(doc)}, not an object or array")


def _text_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text, strings left out. Never below the depth the
    decoder reaches in the valid part of the text: once the escaped backslashes and quotes are
    gone, every quote left opens or closes a string, as the decoder sees it; past the first
    invalid character the decoder goes no deeper, whatever is counted there. (A regex over the
    strings took four times as long.)"""
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(unescaped.split('"')[::2])
    brackets = outside.encode("utf-8", "surrogatepass").translate(None, _NOT_A_BRACKET)
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)


def _parse_event(event: object, where: str) -> TagRead:
    if not isinstance(event, dict):
        place = f"element {where[:-1]}" if where else "top level"
        raise PayloadError(NOT_A_TAG_EVENT, f"{place} is {_json_type(event)}, not an object")
    data = event.get("data")
    if not isinstance(data, dict):
        seen = "missing" if data is None else _json_type(data)
        raise PayloadError(NOT_A_TAG_EVENT, f"{where}data is {seen}, not an object")

    epc = data.get("idHex")
    if epc is None:
        raise PayloadError(MISSING_FIELD, f"{where}data.idHex")
    if type(epc) is not str:
        raise _wrong_type(f"{where}data.idHex", "a string", epc)
    if not _HEX.fullmatch(epc):
        raise PayloadError(BAD_EPC, f"{where}data.idHex {show(epc)} is not hexadecimal")

    antenna = _opt_int(data.get("antenna"), where, "data.antenna", _INT32)
    peak_rssi = _opt_float(data.get("peakRssi"), where, "data.peakRssi")
    channel = _opt_float(data.get("channel"), where, "data.channel")
    phase = _opt_float(data.get("phase"), where, "data.phase")
    event_num = _opt_int(data.get("eventNum"), where, "data.eventNum", _INT64)
    event_time = _timestamp(event.get("timestamp"), where)
    # Only now, after every check that can refuse the message: the lenient fields never decide
    # a message's fate, whatever they hold.
    return TagRead(
        epc.lower(),
        antenna,
        peak_rssi,
        channel,
        phase,
        event_num,
        event_time,
        *_lenient_fields(event, data),
    )


# The envelope's fields; every other top-level field of an event is kept in extra_fields.
_ENVELOPE = frozenset({"data", "timestamp", "type"})
# Data fields -> their place in the tuple _lenient_fields returns (after reader_mode); -1 for
# the fields checked strictly above; every other data field is kept in extra_fields.
_READ_COUNT = 1
_ACCESS_RESULTS = 8
_DATA_SLOTS = {
    "idHex": -1,
    "antenna": -1,
    "peakRssi": -1,
    "channel": -1,
    "phase": -1,
    "eventNum": -1,
    "format": 0,
    "reads": _READ_COUNT,
    # The tag memory fields are hex as the reader wrote them (not lower-cased like the EPC key):
    # any string is kept in its column.
    "TID": 2,
    "USER": 3,
    "EPC": 4,
    "PC": 5,
    "XPC": 6,
    "CRC": 7,
    "accessResults": _ACCESS_RESULTS,
}


_COMMON_DATA = frozenset(key for key, slot in _DATA_SLOTS.items() if slot <= _READ_COUNT)
# TID to accessResults, and extra_fields: None.
_NO_MEMORY_FIELDS = (None,) * 8


def _lenient_fields(event: dict, data: dict) -> tuple:
    """TagRead's lenient fields of one event, in TagRead's order from `reader_mode` to
    `extra_fields`: the event's unknown fields and the known ones whose value did not fit their
    column, as JSON. (One pass over `data`: it costs about a microsecond an event.)"""
    if data.keys() <= _COMMON_DATA and event.keys() <= _ENVELOPE:
        # What nearly every event is: the strict fields, format and reads, its mode.
        mode, kind, count = event.get("type"), data.get("format"), data.get("reads")
        if (
            (mode is None or (type(mode) is str and mode.isascii()))
            and (kind is None or (type(kind) is str and kind.isascii()))
            and (count is None or (type(count) is int and _INT64[0] <= count <= _INT64[1]))
        ):
            return (mode, kind, count, *_NO_MEMORY_FIELDS)
    extra: dict[str, object] = {}
    if not event.keys() <= _ENVELOPE:
        extra = {key: event[key] for key in event.keys() - _ENVELOPE}
    mode = event.get("type")
    if mode is not None and not _is_text(mode):
        extra["type"] = mode
        mode = None
    values: list[object] = [None] * 9
    extra_data: dict[str, object] = {}
    for key, value in data.items():
        slot = _DATA_SLOTS.get(key)
        if slot is None:
            extra_data[key] = value
        elif slot < 0 or value is None:
            continue
        elif slot == _READ_COUNT:
            if type(value) is int and _INT64[0] <= value <= _INT64[1]:
                values[slot] = value
            else:
                extra_data[key] = value
        elif slot == _ACCESS_RESULTS:
            if type(value) is list and all(map(_is_text, value)):
                values[slot] = tuple(value)
            else:
                extra_data[key] = value
        elif _is_text(value):
            values[slot] = value
        else:
            extra_data[key] = value
    if extra_data:
        extra["data"] = extra_data
    return (mode, *values, _extra_json(extra) if extra else None)


def _is_text(value: object) -> bool:
    """A string a UTF-8 column can take (a JSON escape can make a lone surrogate)."""
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# A JSON string as json.dumps writes it, or a bare (non-finite) number name outside strings.
_STRING_OR_INFINITY = re.compile(r'"(?:[^"\\]|\\.)*"|(-?)Infinity')


def _extra_json(extra: dict) -> str:
    """`extra` as JSON text that a UTF-8 column takes and any JSON parser reads."""
    try:
        try:
            text = json.dumps(extra, sort_keys=True, ensure_ascii=False, allow_nan=False)
            text.encode("utf-8")
            return text
        except (UnicodeEncodeError, ValueError):
            pass
        # A lone surrogate (ensure_ascii escapes it as \\udXXX), or a number too large for a
        # float (1e400 decodes to inf): written as 1e999, which JSON parsers read back as inf.
        text = json.dumps(extra, sort_keys=True, ensure_ascii=True, allow_nan=True)
    except RecursionError:
        # As for the decoder (parse_payload): not below MAX_NESTING; kept so it never escapes.
        raise PayloadError(NESTED_TOO_DEEP, f"nested deeper than {MAX_NESTING} levels") from None
    return _STRING_OR_INFINITY.sub(_finite_literal, text)


def _finite_literal(match: re.Match) -> str:
    return match.group(0) if match.group(1) is None else f"{match.group(1)}1e999"


def _timestamp(value: object, where: str) -> datetime:
    if value is None:
        raise PayloadError(MISSING_FIELD, f"{where}timestamp")
    if type(value) is not str:
        raise _wrong_type(f"{where}timestamp", "a string", value)
    # Python 3.11's fromisoformat takes every form the readers send: "+0000" (the FX9600's own),
    # "+00:00", "Z", with or without fractional seconds.
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise PayloadError(
            BAD_TIMESTAMP, f"{where}timestamp {show(value)} is not ISO-8601"
        ) from None
    if parsed.tzinfo is None:
        # A local time of unknown zone cannot be placed on the UTC timeline; guessing would
        # silently shift reads into the wrong date partition.
        raise PayloadError(BAD_TIMESTAMP, f"{where}timestamp {show(value)} has no UTC offset")
    if parsed.tzinfo is not UTC:
        try:
            parsed = parsed.astimezone(UTC)
        except OverflowError:
            raise PayloadError(
                BAD_TIMESTAMP, f"{where}timestamp {show(value)} is out of range"
            ) from None
    if not _EARLIEST <= parsed < _LATEST:
        raise PayloadError(
            BAD_TIMESTAMP,
            f"{where}timestamp {show(value)} is outside {_EARLIEST.year}..{_LATEST.year - 1}",
        )
    return parsed


def _opt_int(value: object, where: str, name: str, bounds: tuple[int, int]) -> int | None:
    if value is None:
        return None
    # `type(...) is int` on purpose: JSON true/false arrive as bool, a subclass of int.
    if type(value) is not int:
        raise _wrong_type(f"{where}{name}", "an integer", value)
    if not bounds[0] <= value <= bounds[1]:
        raise PayloadError(WRONG_TYPE, f"{where}{name}: integer {show(value)} is out of range")
    return value


def _opt_float(value: object, where: str, name: str) -> float | None:
    if value is None:
        return None
    kind = type(value)
    if kind is float:
        result = value
    elif kind is int:
        try:
            result = float(value)
        except OverflowError:
            raise PayloadError(
                WRONG_TYPE, f"{where}{name}: {show(value)} is out of range"
            ) from None
    else:
        raise _wrong_type(f"{where}{name}", "a number", value)
    if not math.isfinite(result):
        raise PayloadError(WRONG_TYPE, f"{where}{name}: {show(value)} is not a finite number")
    return result


# -- management events ------------------------------------------------------------------------

# The envelope's `type` of a heartbeat; other types (gpi, gpo, error, warning,
# firmwareUpdateProgress, userapp) are stored alike and counted per type. Compared in lower case:
# the documentation and captures disagree on the case of some names.
HEARTBEAT = "heartbeat"

# Tag parse failures after which a payload may still be a management event: a JSON object whose
# `data` is an object without `idHex` (MISSING_FIELD) or is not an object (NOT_A_TAG_EVENT).
_MAYBE_MANAGEMENT = frozenset({MISSING_FIELD, NOT_A_TAG_EVENT})

# heartbeat data.reader_gateway counter -> DataPathCounters field.
_PATH_COUNTERS = {
    "numDataMessagesRxed": "received",
    "numDataMessagesTxed": "sent",
    "numDataMessagesRetained": "retained",
    "numDataMessagesDropped": "dropped",
}


@dataclass(frozen=True, slots=True)
class DataPathCounters:
    """The reader gateway's own data-message counters, from one heartbeat: `sent` is what the
    reader published to its data endpoint(s). `paths` is how many data paths they were summed
    over (more than one: several data endpoints, and `sent` counts each message once per
    endpoint). A counter the heartbeat did not carry is None."""

    received: int | None
    sent: int | None
    retained: int | None
    dropped: int | None
    paths: int = 1


@dataclass(frozen=True, slots=True)
class ManagementEvent:
    type: str  # as the reader spelled it
    event_time: datetime
    component: str | None
    event_num: int | None
    data_json: str  # `data` as JSON with sorted keys
    counters: DataPathCounters | None = None  # heartbeats only

    @property
    def is_heartbeat(self) -> bool:
        return self.type.lower() == HEARTBEAT


def parse_management_payload(payload: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> ManagementEvent:
    """The management event of a message that must be one (it came on a management topic);
    raises `PayloadError` with the size, encoding and JSON reasons of `parse_payload`, or
    `invalid_management_event` when the document is not a well-formed envelope."""
    doc = _decode(payload, max_bytes)
    if not _has_envelope(doc):
        raise PayloadError(
            INVALID_MANAGEMENT_EVENT,
            "not a management event: expected an object with type, timestamp and data, and "
            "component or eventNum",
        )
    return _management_event(doc)


def management_event_in(
    payload: bytes, failure: PayloadError, max_bytes: int = DEFAULT_MAX_BYTES
) -> ManagementEvent:
    """After `parse_payload` refused `payload` with `failure`: the management event it holds, if
    its shape is one; otherwise `failure` is raised again (the message is a bad tag event).
    Only the few tag failures a management event causes decode the payload a second time."""
    if failure.reason not in _MAYBE_MANAGEMENT:
        raise failure
    try:
        doc = _decode(payload, max_bytes)
    except PayloadError:
        raise failure from None
    if not _has_envelope(doc):
        raise failure
    return _management_event(doc)


def _decode(payload: bytes, max_bytes: int) -> object:
    if len(payload) > max_bytes:
        raise PayloadError(OVERSIZED, f"{len(payload)} bytes, limit {max_bytes}")
    raw = bytes(payload)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(INVALID_UTF8, f"at byte {exc.start}: {exc.reason}") from None
    if len(text) > MAX_NESTING and _text_depth(text) > MAX_NESTING:
        raise PayloadError(NESTED_TOO_DEEP, f"nested deeper than {MAX_NESTING} levels")
    try:
        return _loads(raw, text)
    except RecursionError:
        raise PayloadError(NESTED_TOO_DEEP, f"nested deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:
        raise PayloadError(INVALID_JSON, str(exc)) from None


def _has_envelope(doc: object) -> bool:
    """The management envelope's shape: type, timestamp and data at the top level, with
    component or a top-level eventNum (a tag event has neither), and no tag id in data."""
    return (
        isinstance(doc, dict)
        and {"type", "timestamp", "data"} <= doc.keys()
        and ("component" in doc or "eventNum" in doc)
        and not (isinstance(doc["data"], dict) and "idHex" in doc["data"])
    )


def _management_event(doc: dict) -> ManagementEvent:
    """Check every envelope field that lands in a typed column; the body is kept as JSON and
    only a heartbeat's counters are read from it (leniently: an odd counter is None, the
    heartbeat still counts)."""
    kind = doc["type"]
    if type(kind) is not str or not kind:
        raise _invalid("type", "a non-empty string", kind)
    component = doc.get("component")
    if component is not None and type(component) is not str:
        raise _invalid("component", "a string", component)
    data = doc["data"]
    if not isinstance(data, dict):
        raise _invalid("data", "an object", data)
    try:
        for text in (kind, component):
            if text is not None:
                text.encode("utf-8")
        event_num = _opt_int(doc.get("eventNum"), "", "eventNum", _INT64)
        if event_num is not None and event_num < 0:
            raise PayloadError(WRONG_TYPE, f"eventNum {event_num} is negative")
        event_time = _timestamp(doc["timestamp"], "")
        data_json = json.dumps(data, sort_keys=True, allow_nan=False)
    except PayloadError as exc:
        raise PayloadError(INVALID_MANAGEMENT_EVENT, exc.detail) from None
    except (UnicodeEncodeError, ValueError, RecursionError) as exc:
        raise PayloadError(INVALID_MANAGEMENT_EVENT, f"{type(exc).__name__}: {exc}") from None
    counters = data_path_counters(data) if kind.lower() == HEARTBEAT else None
    return ManagementEvent(kind, event_time, component, event_num, data_json, counters)


def _invalid(field: str, expected: str, value: object) -> PayloadError:
    return PayloadError(
        INVALID_MANAGEMENT_EVENT, f"{field}: expected {expected}, got {_json_type(value)}"
    )


def data_path_counters(data: dict) -> DataPathCounters | None:
    """The reader gateway's data-message counters of a heartbeat's `data` (summed over its data
    paths), or None when it carries none; also what the tables' reconciliation reads back from
    a stored heartbeat (spark/reconcile.py)."""
    gateway = data.get("reader_gateway")
    if not isinstance(gateway, dict):
        return None
    paths = gateway.get("dataPathStatistics")
    if isinstance(paths, list) and paths and all(isinstance(p, dict) for p in paths):
        sources = paths
    elif any(name in gateway for name in _PATH_COUNTERS):
        sources = [gateway]
    else:
        return None
    totals: dict[str, int | None] = {}
    for name, field in _PATH_COUNTERS.items():
        values = [source.get(name) for source in sources]
        if all(type(v) is int and 0 <= v <= _INT64[1] for v in values):
            totals[field] = sum(values)  # type: ignore[arg-type]
        else:
            totals[field] = None
    return DataPathCounters(**totals, paths=len(sources))


def _wrong_type(field: str, expected: str, value: object) -> PayloadError:
    return PayloadError(WRONG_TYPE, f"{field}: expected {expected}, got {_json_type(value)}")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _reject_constant(name: str) -> float:
    # json accepts NaN/Infinity, which are not JSON (RFC 8259 §6).
    raise ValueError(f"{name} is not valid JSON")


# One decoder for all calls: json.loads with any keyword builds a new decoder each time, which
# cost 2 of the 7 µs a tag event took to parse.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)

# An integer literal of 19 digits or more may lie outside int64..uint64, which orjson reads as a
# float where json keeps the int (19 decimal digits in a string only cost the slow path). Looked
# for as a run of "0" once every digit is "0" and every other byte " ": a tenth of a regex's cost.
_DIGITS_AS_ZERO = bytes(b"0"[0] if chr(b).isdigit() and b < 128 else b" "[0] for b in range(256))
_LONG_DIGITS = b"0" * 19


def _loads(raw: bytes, text: str) -> object:
    """What `_DECODER` makes of `text` (the UTF-8 `raw`), by orjson where the two agree.

    json decoding was half of what a batch cost to parse (bench parse-where); orjson reads the
    same documents about three times faster. They differ on a few inputs, and each goes to
    json: orjson refuses what json takes (a lone surrogate escape, a number beyond a double's
    range such as 1e400) and reads an integer beyond 64 bits as a float. So json decides every
    document orjson refuses, and every one with a long run of digits; otherwise both give the
    same values (tests/spark/test_zebra.py compares them on generated documents and the corpus).
    """
    if _LONG_DIGITS not in raw.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return _DECODER.decode(text)
