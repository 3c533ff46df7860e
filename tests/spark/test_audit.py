"""`fxgate audit` over real Delta tables written the daemon's way (build_batch + TableWriter),
through the shared Spark session: ranges, resets, duplicates, several tables directories, and
batches written before the `seq` column."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from persistence.keys import message_key
from spark.audit import AuditError, AuditReport, audit_tables
from spark.gaps import missing_ranges, split_epochs
from spark.schema import build_batch
from spark.tables import READER_EVENTS, READS, ArrowTableWriter, TableWriter, count_rows

pytestmark = pytest.mark.spark

APP = "fxgate-ledger-test"

# 2026-11-21T10:00:00Z: received times count up from here, one millisecond per message.
T0 = 1_795_255_200.0


@dataclass(frozen=True)
class Record:
    """What build_batch reads of an inbound-ledger row."""

    seq: int
    message_key: str
    topic: str
    payload: bytes
    qos: int
    received_time: float
    pack_id: int


@dataclass(frozen=True)
class Event:
    reader: str
    event_num: int | None
    epc: str = "e28011606000020a1b2c3d4e"


def payload(event: Event) -> bytes:
    data: dict = {"idHex": event.epc, "antenna": 1, "peakRssi": -55, "channel": 902.75}
    if event.event_num is not None:
        data["eventNum"] = event.event_num
    # The same event number always gets the same event time: a re-sent read is the same content.
    millis = (event.event_num or 0) % 1000
    stamp = f"2026-11-21T10:00:00.{millis:03d}+0000"
    return json.dumps({"data": data, "timestamp": stamp, "type": "SIMPLE"}).encode()


def records(events: list[Event], first_seq: int = 1, times: list[float] | None = None):
    """One message per event, in ledger order; a message key of its own each, so that the same
    event twice is two rows (as a reader re-sending it in another message would make)."""
    made = []
    for index, event in enumerate(events):
        topic = f"zebra/fx/{event.reader}/reads"
        body = payload(event)
        seq = first_seq + index
        made.append(
            Record(
                seq=seq,
                message_key=message_key(topic, body + b" %d" % seq),
                topic=topic,
                payload=body,
                qos=1,
                received_time=times[index] if times is not None else T0 + seq / 1000,
                pack_id=seq,
            )
        )
    return made


def write(spark_session, tables: Path, batch_id: int, rows, drop_seq: bool = False) -> None:
    reads = build_batch(rows, batch_id).reads
    if drop_seq:  # as a batch written before the seq column existed
        reads = reads.drop_columns(["seq"])
    TableWriter(spark_session, tables, APP).write_batch(batch_id, {READS: reads})


def stream(reader: str, numbers) -> list[Event]:
    return [Event(reader, n) for n in numbers]


def without(numbers, gone) -> list[int]:
    return [n for n in numbers if n not in set(gone)]


def test_missing_event_numbers_are_reported_per_reader_as_exact_inclusive_ranges(
    spark_session, tmp_path
):
    events = stream("fx-a", without(range(1, 21), {5, 6, 7, 12, 19})) + stream(
        "fx-b", without(range(100, 111), {105})
    )
    write(spark_session, tmp_path, 1, records(events))

    report = audit_tables(spark_session, [tmp_path])

    found = report.to_json()
    assert found["complete"] is False
    assert found["tables"] == [str(tmp_path)]
    a, b = found["readers"]["fx-a"], found["readers"]["fx-b"]
    assert a["missing"] == [[5, 7], [12, 12], [19, 19]]
    assert (a["missing_count"], a["received"], a["resets"]) == (5, 15, 0)
    assert (a["first_event_num"], a["last_event_num"]) == (1, 20)
    assert (a["duplicates"], a["conflicts"], a["without_event_num"]) == (0, 0, 0)
    assert b["missing"] == [[105, 105]]
    assert b["missing_count"] == 1
    assert [epoch["missing"] for epoch in a["epochs"]] == [[[5, 7], [12, 12], [19, 19]]]
    lines = report.lines()
    assert lines[0].startswith("fx-a: 15 received, 5 missing in 3 range(s) (5-7, 12, 19)")
    assert lines[-1].startswith("INCOMPLETE: 2 reader(s), 6 eventNum missing in 4 range(s)")


def test_a_counter_reset_is_reported_as_a_reset_and_not_as_a_gap(spark_session, tmp_path):
    before = stream("fx-a", range(999_990, 1_000_001))
    after = stream("fx-a", without(range(1, 11), {4}))
    write(spark_session, tmp_path, 1, records(before + after))

    reader = audit_tables(spark_session, [tmp_path]).to_json()["readers"]["fx-a"]

    assert reader["resets"] == 1
    assert reader["missing"] == [[4, 4]]
    assert reader["missing_count"] == 1
    assert (reader["first_event_num"], reader["last_event_num"]) == (999_990, 10)
    assert [(e["epoch"], e["first_event_num"], e["last_event_num"]) for e in reader["epochs"]] == [
        (0, 999_990, 1_000_000),
        (1, 1, 10),
    ]
    assert reader["epochs"][1]["started"] < "2026-11-21T10:00:01Z"
    assert reader["epochs"][0]["started"] < reader["epochs"][1]["started"]


def test_the_same_read_twice_is_a_duplicate_and_two_reads_under_one_number_a_conflict(
    spark_session, tmp_path
):
    events = [
        *stream("fx-a", range(1, 6)),
        Event("fx-a", 3),  # the same read again, in another message
        Event("fx-a", 4, epc="e2800000000000000000ffff"),  # another read under number 4
        *stream("fx-a", range(6, 8)),
    ]
    write(spark_session, tmp_path, 1, records(events))

    report = audit_tables(spark_session, [tmp_path])

    reader = report.to_json()["readers"]["fx-a"]
    assert (reader["duplicates"], reader["conflicts"]) == (1, 1)
    assert reader["received"] == 9
    assert reader["epochs"][0]["distinct"] == 7
    assert reader["missing"] == []
    assert report.complete  # duplicates and conflicts are reported, not counted as loss


def test_reads_without_an_event_number_are_counted_and_not_audited(spark_session, tmp_path):
    events = [Event("fx-a", 1), Event("fx-a", None), Event("fx-a", 2), Event("fx-a", None)]
    events += [Event("fx-none", None)] * 3
    write(spark_session, tmp_path, 1, records(events))

    readers = audit_tables(spark_session, [tmp_path]).to_json()["readers"]

    assert (readers["fx-a"]["received"], readers["fx-a"]["without_event_num"]) == (2, 2)
    assert readers["fx-a"]["missing"] == []
    assert readers["fx-none"] == {
        "received": 0,
        "missing": [],
        "resets": 0,
        "missing_count": 0,
        "duplicates": 0,
        "conflicts": 0,
        "without_event_num": 3,
        "first_event_num": None,
        "last_event_num": None,
        "epochs": [],
    }


def test_the_tables_of_two_gateways_of_one_group_have_gaps_alone_and_none_together(
    spark_session, tmp_path
):
    """Each member of a shared group lands its share: alone, the other's share is a gap."""
    numbers = list(range(1, 31)) + list(range(1, 11))  # the counter starts again after 30
    shares = {"gw-1": [], "gw-2": []}
    times = {"gw-1": [], "gw-2": []}
    for index, n in enumerate(numbers):
        # The broker hands a shared group's messages round in turn.
        name = "gw-1" if index % 2 == 0 else "gw-2"
        shares[name].append(Event("fx-a", n))
        times[name].append(T0 + index)
    dirs = [tmp_path / name for name in shares]
    for directory, name in zip(dirs, shares, strict=True):
        write(spark_session, directory, 1, records(shares[name], times=times[name]))

    together = audit_tables(spark_session, dirs)
    alone = [audit_tables(spark_session, [directory]) for directory in dirs]

    reader = together.readers["fx-a"]
    assert together.complete and reader.missing == ()
    assert (reader.resets, reader.received) == (1, 40)
    assert together.tables == tuple(str(d) for d in dirs)
    assert all(not report.complete for report in alone)


def test_a_shared_groups_one_table_audits_each_members_share_in_its_own_ledger_order(
    spark_session, tmp_path
):
    """In a group's one table (DESIGN §7.12) each member's `seq` counts in its own ledger: a1
    stored 1..50 as seqs 1..50, a2 51..100 as seqs 1..50. Ordered by `seq` across members
    (51 then 2: a drop of more than half) the audit would call resets and gaps; per member
    (`landed_by`), the reader's run is whole."""
    from spark.tables import GroupTableWriter

    for batch_id, (member, numbers) in enumerate(
        (("fxgate-env-a-a1", range(1, 51)), ("fxgate-env-a-a2", range(51, 101))), start=1
    ):
        reads = build_batch(records(stream("fx-a", numbers)), batch_id).reads
        GroupTableWriter(
            None, tmp_path, f"{APP}-{member}", group="fxgate-env-a", member=member
        ).write_batch(batch_id, {READS: reads})

    report = audit_tables(spark_session, [tmp_path])
    reader = report.readers["fx-a"]
    assert report.complete, report.lines()
    assert (reader.resets, reader.missing, reader.received) == (0, (), 100)


def test_a_gateway_that_stamps_a_read_late_makes_no_false_reset_in_the_union(
    spark_session, tmp_path
):
    """Measured with two daemons of one group: one stamped eventNum 48 60 ms after the other
    had stamped 98. By the clocks, 98 then 48 is a drop of more than half: not a reset."""
    first = stream("fx-a", without(range(1, 101), {48}))
    late = stream("fx-a", [48])
    write(
        spark_session,
        tmp_path / "gw-1",
        1,
        records(first, times=[T0 + n / 1000 for n in range(1, 100)]),
    )
    write(spark_session, tmp_path / "gw-2", 1, records(late, times=[T0 + 0.160]))

    reader = audit_tables(spark_session, [tmp_path / "gw-1", tmp_path / "gw-2"]).readers["fx-a"]

    assert (reader.resets, reader.missing, reader.received) == (0, (), 100)


def test_a_gateway_that_first_saw_a_reader_after_its_reset_joins_the_reset_epoch(
    spark_session, tmp_path
):
    before = stream("fx-a", range(1000, 1011))
    after = stream("fx-a", range(1, 6))
    times = [T0 + i for i in range(11)] + [T0 + 20 + i for i in range(5)]
    write(spark_session, tmp_path / "gw-1", 1, records(before + after, times=times))
    # The second gateway joined the group later: its first reads are 6..10 of the new counter.
    joined = stream("fx-a", range(6, 11))
    write(
        spark_session, tmp_path / "gw-2", 1, records(joined, times=[T0 + 30 + i for i in range(5)])
    )

    reader = audit_tables(spark_session, [tmp_path / "gw-1", tmp_path / "gw-2"]).readers["fx-a"]

    assert reader.resets == 1
    assert reader.missing == ()
    assert [(e.first_event_num, e.last_event_num, e.received) for e in reader.epochs] == [
        (1000, 1010, 11),
        (1, 10, 10),
    ]


def test_within_one_gateway_the_ledger_seq_orders_reads_not_the_clock(spark_session, tmp_path):
    # The clock stepped back: received times run backwards while the ledger seq runs forwards.
    events = stream("fx-a", [1000, 1001, 1, 2])
    times = [T0 + 10, T0 + 9, T0 + 8, T0 + 7]
    write(spark_session, tmp_path, 1, records(events, times=times))

    reader = audit_tables(spark_session, [tmp_path]).readers["fx-a"]

    assert reader.resets == 1
    assert reader.missing == ()


def test_batches_written_before_the_seq_column_still_audit_ordered_by_receive_time(
    spark_session, tmp_path
):
    # Old batches (no seq column), ordered by received_time only: 1000, 1001, then a reset.
    old = stream("fx-a", [1, 2, 1001, 1000])
    old_times = [T0 + 4, T0 + 5, T0 + 2, T0 + 1]
    write(spark_session, tmp_path, 1, records(old, times=old_times), drop_seq=True)
    alone = audit_tables(spark_session, [tmp_path]).readers["fx-a"]
    assert (alone.resets, alone.missing) == (1, ())

    # Newer batches carry seq and follow the old ones.
    new = stream("fx-a", [3, 4, 6])
    write(spark_session, tmp_path, 2, records(new, first_seq=1, times=[T0, T0, T0]))
    mixed = audit_tables(spark_session, [tmp_path]).readers["fx-a"]
    assert (mixed.resets, mixed.missing, mixed.received) == (1, ((5, 5),), 7)


def test_random_streams_audit_exactly_as_the_pure_rules_say(spark_session, tmp_path):
    """Gaps, resets, repeats and small steps back, several readers in one table: Spark's answer
    is the pure reference (spark.gaps) applied to each reader's stream in ledger order."""
    rng = random.Random(2026)
    streams: dict[str, list[int]] = {}
    for r in range(4):
        reader = f"fx-{r}"
        numbers: list[int] = []
        n = rng.randrange(0, 50)
        for _ in range(300):
            step = rng.random()
            if step < 0.02:
                n = rng.randrange(0, 5)  # a reset
            elif step < 0.05:
                n = max(n - rng.randrange(1, 3), 0)  # a late one
            elif step < 0.08:
                pass  # a repeat
            else:
                n += 1 if rng.random() < 0.85 else rng.randrange(2, 6)
            numbers.append(n)
        streams[reader] = numbers
    # Readers interleaved in the ledger, each reader's own order kept.
    interleaved = [
        e for group in zip(*(stream(r, n) for r, n in streams.items()), strict=True) for e in group
    ]
    write(spark_session, tmp_path, 1, records(interleaved))

    report = audit_tables(spark_session, [tmp_path])

    for reader, numbers in streams.items():
        epochs = split_epochs(numbers)
        got = report.readers[reader]
        assert got.resets == len(epochs) - 1, reader
        assert [e.missing for e in got.epochs] == [
            tuple(missing_ranges(sorted(set(epoch)))) for epoch in epochs
        ], reader
        assert [e.duplicates for e in got.epochs] == [
            len([n for n in set(epoch) if epoch.count(n) > 1]) for epoch in epochs
        ], reader
        assert got.conflicts == 0


def test_an_existing_but_empty_reads_table_audits_to_no_readers(spark_session, tmp_path):
    # A first batch killed before its commit leaves the table made, with its schema, no rows.
    def killed(name: str) -> None:
        raise RuntimeError(f"killed at {name}")

    reads = build_batch(records(stream("fx-a", [1, 2])), 1).reads
    with pytest.raises(RuntimeError, match="killed at"):
        ArrowTableWriter(spark_session, tmp_path, APP, checkpoint=killed).write_batch(
            1, {READS: reads}
        )
    assert count_rows(tmp_path, READS) == 0

    report = audit_tables(spark_session, [tmp_path])
    assert report == AuditReport((str(tmp_path),))
    assert report.complete
    assert report.to_json() == {"readers": {}, "complete": True, "tables": [str(tmp_path)]}


def test_a_missing_directory_or_a_directory_without_reads_cannot_be_audited(
    spark_session, tmp_path
):
    with pytest.raises(AuditError, match="does not exist"):
        audit_tables(spark_session, [tmp_path / "nowhere"])
    with pytest.raises(AuditError, match="holds no reads table"):
        audit_tables(spark_session, [tmp_path])
    (tmp_path / READS).mkdir()  # a directory, but no Delta log: not a table
    with pytest.raises(AuditError, match="no Delta log there"):
        audit_tables(spark_session, [tmp_path])


def test_a_table_without_the_reads_columns_cannot_be_audited(spark_session, tmp_path):
    import pyarrow as pa

    other = pa.table({"x": pa.array([1], pa.int64()), "date": pa.array(["2026-11-21"])})
    TableWriter(spark_session, tmp_path, APP).write_batch(1, {READS: other})
    with pytest.raises(AuditError, match="not a reads table: no column event_num"):
        audit_tables(spark_session, [tmp_path])


def management_record(reader: str, event_num: int | None, seq: int) -> Record:
    """A heartbeat of `reader` numbered on its one counter (DESIGN §7.9), on its mgmt topic."""
    topic = f"zebra/fx/{reader}/mgmt"
    doc = {"component": "RG", "data": {}, "timestamp": "2026-11-21T10:00:00.000+0000",
           "type": "heartbeat"}  # fmt: skip
    if event_num is not None:
        doc["eventNum"] = event_num
    body = json.dumps(doc).encode()
    return Record(seq, message_key(topic, body), topic, body, 1, T0 + seq / 1000, seq)


def test_a_number_in_reader_events_is_present_and_only_a_number_in_neither_is_missing(
    spark_session, tmp_path
):
    """Tag events 1-3, a heartbeat numbered 4, tag events 5-6, a GPI-like event without a
    number, tag event 8: only 7 is missing; the heartbeat fills 4."""
    rows = records(stream("fx-a", [1, 2, 3]))
    rows.append(management_record("fx-a", 4, 4))
    rows += records(stream("fx-a", [5, 6]), first_seq=5)
    rows.append(management_record("fx-a", None, 7))
    rows += records(stream("fx-a", [8]), first_seq=8)
    batch = build_batch(rows, 1)
    assert batch.reader_events.num_rows == 2
    TableWriter(spark_session, tmp_path, APP).write_batch(
        1, {READS: batch.reads, READER_EVENTS: batch.reader_events}
    )

    found = audit_tables(spark_session, [tmp_path]).to_json()["readers"]["fx-a"]
    assert found["missing"] == [[7, 7]]
    assert (found["received"], found["resets"], found["without_event_num"]) == (7, 0, 0)
    assert (found["first_event_num"], found["last_event_num"]) == (1, 8)


def test_without_a_reader_events_table_the_audit_reads_the_reads_alone(spark_session, tmp_path):
    write(spark_session, tmp_path, 1, records(stream("fx-a", [1, 2, 4])))
    found = audit_tables(spark_session, [tmp_path]).to_json()["readers"]["fx-a"]
    assert found["missing"] == [[3, 3]]
