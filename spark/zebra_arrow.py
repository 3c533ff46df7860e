"""Tag data events into Arrow columns in C++ (pyarrow's JSON reader), the Python parser as judge.

`spark.zebra.parse_payload` makes Python objects of every field of every event (a dict per
object, a `TagRead` per read, a tuple of its lenient fields), about 10 µs a read on a 2-core
box. Here the payloads of a batch go to `pyarrow.json.read_json` at once, as one
newline-delimited document with an explicit schema: it parses in C++ with the GIL released, and
every check the strict fields need (hexadecimal ids, ISO-8601 timestamps in range, finite
numbers) is an Arrow compute kernel over a column. Measured on the benchmark's events: about
3 µs a read for single events, 4 for arrays of 100 (`bench parse-where`'s shapes).

The Python parser stays the judge (DESIGN §7.8: the same rows and the same dead letters): this
path takes a message only when it is sure the judge would give the same reads, and hands every
other message back untouched (`NativeReads.judged`). What it hands back:
- a payload that does not start with `{` or `[`, holds a line break (the reader splits lines on
  them), is over the size limit, is not UTF-8, or is nested deeper than the judge's limit;
- a payload the reader refuses (a field of the wrong JSON type, a duplicated key, an integer
  out of its column's range, a lone surrogate escape, anything that is not JSON): the reader
  refuses the whole document, which is read again in halves until the payload is alone
  (`MAX_READS_PER_BATCH` reads at most; past them the judge takes the rest);
- an event with a field no column has (the judge keeps it in `extra_fields`), a null or
  non-hexadecimal `idHex`, a missing `data` or `timestamp`, a timestamp not of the plain
  `YYYY-MM-DDTHH:MM:SS[.ffffff](Z|±HH[:]MM)` shape or outside 1900..2999, a NaN or infinite
  number (the reader takes the literals, JSON does not), a null inside `accessResults`, an array
  that is empty or longer than the limit.

Each payload is wrapped before it is read: an event object as `{"e":[<payload>]}`, an array as
`{"e":<payload>}`, so both are one list column. A payload cannot escape its wrapper unseen: to
close it early it must add a key beside `e` (an unexpected column: refused like the rest), repeat
`e` (the reader refuses a duplicated key) or start a second object on the line (more rows than
lines: refused like the rest); an event object must also come out as a list of exactly one.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from spark.zebra import _EARLIEST, _LATEST, DEFAULT_MAX_BYTES, DEFAULT_MAX_READS, MAX_NESTING
from spark.zebra import _text_depth as text_depth

UTC_MICROS = pa.timestamp("us", tz="UTC")

# The event as spark.zebra keeps it: the strict fields and the lenient ones, in their columns'
# types. A JSON value of another type makes the reader refuse the batch (and the judge decide).
_DATA = pa.struct(
    [
        ("idHex", pa.string()),
        ("antenna", pa.int32()),
        ("peakRssi", pa.float64()),
        ("channel", pa.float64()),
        ("phase", pa.float64()),
        ("eventNum", pa.int64()),
        ("format", pa.string()),
        ("reads", pa.int64()),
        ("TID", pa.string()),
        ("USER", pa.string()),
        ("EPC", pa.string()),
        ("PC", pa.string()),
        ("XPC", pa.string()),
        ("CRC", pa.string()),
        ("accessResults", pa.list_(pa.string())),
    ]
)
_EVENT = pa.struct([("data", _DATA), ("timestamp", pa.string()), ("type", pa.string())])
_WRAPPED = pa.schema([("e", pa.list_(_EVENT))])
# "infer": a field the schema does not name becomes a column of its own, so that the events
# holding one can be handed to the judge (with "error" one such field would refuse the batch).
_PARSE = pj.ParseOptions(explicit_schema=_WRAPPED, unexpected_field_behavior="infer")

# The timestamps this path converts; every other form goes to the judge (Python's fromisoformat
# takes more). Arrow's conversion of these agrees with fromisoformat, invalid dates and offsets
# of 24 h included (tests/spark/test_zebra_arrow.py compares them).
_TIMESTAMP = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:?\d{2})$"
_HEX = r"^[0-9A-Fa-f]+$"
_FLOATS = ("peakRssi", "channel", "phase")
# The lenient data fields -> their `reads` columns (the envelope's `type` is reader_mode).
_LENIENT = (
    ("format", "format"),
    ("reads", "read_count"),
    ("TID", "tid"),
    ("USER", "user_memory"),
    ("EPC", "epc_memory"),
    ("PC", "pc"),
    ("XPC", "xpc"),
    ("CRC", "crc"),
    ("accessResults", "access_results"),
)
_OBJECT, _ARRAY = ord("{"), ord("[")
# Reads of the JSON reader a batch may spend finding the payloads it refuses (each refused
# read is read again in halves): past them the judge takes what is left. At about 0.3 ms a
# read, a batch of junk costs at most a few milliseconds more than the judge alone.
MAX_READS_PER_BATCH = 64

# The columns of `NativeReads.reads`, in order.
READ_COLUMNS = pa.schema(
    [
        ("message", pa.int64()),
        ("index", pa.int64()),
        ("epc", pa.string()),
        ("antenna", pa.int32()),
        ("peak_rssi", pa.float64()),
        ("channel", pa.float64()),
        ("phase", pa.float64()),
        ("event_num", pa.int64()),
        ("event_time", UTC_MICROS),
        ("reader_mode", pa.string()),
        *((column, _DATA.field(name).type) for name, column in _LENIENT),
    ]
)


@dataclass(frozen=True)
class NativeReads:
    """The reads of the payloads this path took, in payload order then read order: `message`
    is the payload's index, `index` the read's place in it; `judged` holds the index of every
    payload it did not take, for the Python parser."""

    reads: pa.Table
    judged: frozenset[int]


def parse_columns(
    payloads: Sequence[bytes],
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_reads: int = DEFAULT_MAX_READS,
) -> NativeReads:
    lines: list[tuple[int, bool]] = []  # (payload index, an array?) of each line to read
    judged: set[int] = set()
    for number, payload in enumerate(payloads):
        first = payload[0] if payload else None
        if (
            first not in (_OBJECT, _ARRAY)
            or len(payload) > max_bytes
            or b"\n" in payload
            or b"\r" in payload
            or _not_utf8(payload)  # the reader does not check; the columns must be UTF-8
            or _too_deep(payload)
        ):
            judged.add(number)
        else:
            lines.append((number, first == _ARRAY))
    tables: list[pa.Table] = []
    reads_left = [MAX_READS_PER_BATCH]

    def read(part: list[tuple[int, bool]]) -> None:
        """Read `part`; where the reader refuses it, each half again (a refused line alone goes
        to the judge), until the batch's reads are spent: then the judge takes the rest."""
        if not part:
            return
        if reads_left[0] <= 0:
            judged.update(number for number, _ in part)
            return
        reads_left[0] -= 1
        try:
            tables.append(_read(part, payloads, judged, max_reads))
        except pa.ArrowException:
            if len(part) == 1:
                judged.add(part[0][0])
                return
            half = len(part) // 2
            read(part[:half])
            read(part[half:])

    read(lines)
    if not tables:
        return NativeReads(READ_COLUMNS.empty_table(), frozenset(judged))
    return NativeReads(pa.concat_tables(tables), frozenset(judged))


def _read(
    part: list[tuple[int, bool]], payloads: Sequence[bytes], judged: set[int], max_reads: int
) -> pa.Table:
    """The native reads of `part`'s payloads (the others of it added to `judged`); raises
    pyarrow's errors where the reader refuses the document, or the document is not one row
    per payload: the reader's own refusals (a field of another JSON type, a duplicated key,
    not JSON), a payload that left its wrapper, a timestamp of the plain shape that is no date
    (February 30th: the conversion refuses the whole column), and what Arrow cannot do with a
    field's inferred type (a list of nulls in an object beside `e`)."""
    chunks: list[bytes] = []
    for number, array in part:
        chunks += (
            (b'{"e":', payloads[number], b"}\n")
            if array
            else (b'{"e":[', payloads[number], b"]}\n")
        )
    document = b"".join(chunks)
    table = pj.read_json(
        io.BytesIO(document),
        read_options=pj.ReadOptions(use_threads=False, block_size=len(document) + 1),
        parse_options=_PARSE,
    )
    if table.num_rows != len(part) or table.schema.names != ["e"]:
        raise pa.ArrowInvalid("a payload is not one document in its wrapper")
    events = table.column("e").combine_chunks()
    if not isinstance(events, pa.ListArray):
        raise pa.ArrowInvalid("the events are not a list")
    return _take(
        events, [number for number, _ in part], [array for _, array in part], judged, max_reads
    )


def _take(
    events: pa.ListArray,
    wrapped: list[int],
    arrays: list[bool],
    judged: set[int],
    max_reads: int,
) -> pa.Table:
    lengths = events.value_lengths().to_pylist()
    for line, (length, array) in enumerate(zip(lengths, arrays, strict=True)):
        if length is None or (length != 1 if not array else not 1 <= length <= max_reads):
            judged.add(wrapped[line])
    flat = events.flatten()
    parents = events.value_parent_indices()
    lines = pa.array(wrapped, pa.int64())
    message = pc.take(lines, parents)
    index = pc.subtract(
        pa.array(range(len(flat)), pa.int64()), pc.take(events.offsets, parents).cast(pa.int64())
    )
    columns = {"message": message, "index": index, "event": flat}

    def judge(unsure: pa.Array | None) -> None:
        """Hand the messages of the events `unsure` marks to the judge, and drop all their
        events (a message is taken whole or not at all)."""
        if unsure is not None and unsure.true_count:
            judged.update(columns["message"].filter(unsure).to_pylist())
        if judged:
            keep = pc.invert(pc.is_in(columns["message"], pa.array(sorted(judged), pa.int64())))
            if keep.false_count:
                for name, column in columns.items():
                    columns[name] = column.filter(keep)

    judge(_unsure(flat, events.type.value_type))
    event_time = columns["event"].field("timestamp").cast(UTC_MICROS)
    columns["event_time"] = event_time
    early, late = pa.scalar(_EARLIEST, UTC_MICROS), pa.scalar(_LATEST, UTC_MICROS)
    judge(pc.or_(pc.less(event_time, early), pc.greater_equal(event_time, late)))
    message, index, event_time = columns["message"], columns["index"], columns["event_time"]
    flat = columns["event"]
    data = flat.field("data")
    reads = pa.table(
        [
            message,
            index,
            pc.utf8_lower(data.field("idHex")),
            data.field("antenna"),
            data.field("peakRssi"),
            data.field("channel"),
            data.field("phase"),
            data.field("eventNum"),
            event_time,
            flat.field("type"),
            *(data.field(name) for name, _ in _LENIENT),
        ],
        schema=READ_COLUMNS,
    )
    return reads


def _unsure(flat: pa.StructArray, event_type: pa.StructType) -> pa.Array | None:
    """Per event, True where the judge must decide (the module's docstring), or None if none."""
    data = flat.field("data")
    checks = [
        flat.is_null(),
        data.is_null(),
        pc.invert(pc.fill_null(pc.match_substring_regex(data.field("idHex"), _HEX), False)),
        pc.invert(
            pc.fill_null(pc.match_substring_regex(flat.field("timestamp"), _TIMESTAMP), False)
        ),
        *(pc.invert(pc.fill_null(pc.is_finite(data.field(name)), True)) for name in _FLOATS),
    ]
    access = data.field("accessResults")
    if access.flatten().null_count:
        checks.append(_lists_with_nulls(access))
    extra = [f.name for f in event_type if f.name not in _EVENT.names]
    extra_data = [f.name for f in data.type if f.name not in _DATA.names]
    checks += [_present(flat.field(name)) for name in extra]
    checks += [_present(data.field(name)) for name in extra_data]
    found = None
    for check in checks:
        found = check if found is None else pc.or_(found, check)
    return found if found is not None and found.true_count else None


def _present(column: pa.Array) -> pa.Array:
    """Where an event holds a field no column has: set, or (a JSON null read as type null, which
    cannot tell the events apart) everywhere."""
    if pa.types.is_null(column.type):
        return pa.array([True] * len(column))
    return column.is_valid()


def _lists_with_nulls(lists: pa.ListArray) -> pa.Array:
    """Per list, True when it holds a null element (the judge keeps such a list in extra_fields)."""
    parents = pc.list_parent_indices(lists)
    holders = set(parents.filter(lists.flatten().is_null()).to_pylist())
    return pa.array([row in holders for row in range(len(lists))])


def _too_deep(payload: bytes) -> bool:
    if payload.count(b"[") + payload.count(b"{") <= MAX_NESTING:
        return False
    try:
        return text_depth(payload.decode("utf-8")) > MAX_NESTING
    except UnicodeDecodeError:
        return True


def _not_utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
