"""A batch made ready to write (spark.prepare.prepare_batch): its tables, the readers' event
counters after its reads, with the management events' numbers in their places, and the health
of the readers it observed; the writer's committed states are not changed."""

import json

from persistence.records import ReaderCount
from spark.prepare import BuildOptions, prepare_batch
from tests.spark.test_sanitise import Record
from tests.spark.test_zebra_management import envelope, live_heartbeat
from tests.spark.test_zebra_reader_modes import SHAPES

MANAGEMENT = "zebra/fx/+/mgmt"
TAG = (
    b'{"data": {"idHex": "E28011606000020A1B2C3D4E", "eventNum": %d}, '
    b'"timestamp": "2026-11-21T10:00:00.123+0000"}'
)


def test_every_reader_modes_shape_and_management_event_is_counted_and_observed():
    options = BuildOptions(management_filters=(MANAGEMENT,))
    records = [
        Record(f"shape-{seq}", "zebra/fx/fx9600-01/reads", json.dumps(doc).encode(), seq=seq)
        for seq, (doc, _) in enumerate(SHAPES.values())
    ]
    beat = json.dumps(live_heartbeat()).encode()
    gpi = json.dumps(envelope("gpi", {"pin": 1, "state": "HIGH"}, eventNum=7)).encode()
    start = len(records)
    records += [
        Record("beat", "zebra/fx/fx9600-01/mgmt", beat, seq=start),
        Record("gpi", "zebra/fx/fx9600-01/mgmt", gpi, seq=start + 1),
        Record("tag", "zebra/fx/fx9600-01/reads", TAG % 9, seq=start + 2),
        Record("junk", "zebra/fx/fx9600-02/reads", b"{not json", seq=start + 3),
    ]
    readers = {"fx9600-01": ReaderCount("fx9600-01", 3, 3, 0, 0, 0)}
    health = {"fx9600-02": {"data_messages": 4}}
    prepared = prepare_batch(records, 5, options, readers, health)
    tables = prepared.tables
    assert tables.reads.num_rows > len(SHAPES)
    assert set(tables.reads.column("batch_id").to_pylist()) == {5}
    assert tables.reader_events.num_rows == 2
    assert tables.dead_letters.column("reason").to_pylist() == ["invalid_json"]
    assert not tables.observations  # they are in `health`
    # A bad payload counts as a data message of a reader already known (fx9600-02).
    assert set(prepared.health) == {"fx9600-01", "fx9600-02"}
    assert prepared.health["fx9600-02"]["data_messages"] == 5
    counted = prepared.readers["fx9600-01"]
    # Every read and management event with an event number on one counter (DESIGN §7.9).
    numbered = sum(
        n is not None
        for table in (tables.reads, tables.reader_events)
        for n in table.column("event_num").to_pylist()
    )
    assert numbered == tables.reads.num_rows + 2
    assert counted.received == 3 + numbered
    assert counted.last_event_num == 9
    # The committed states are the writer's: unchanged.
    assert readers == {"fx9600-01": ReaderCount("fx9600-01", 3, 3, 0, 0, 0)}
    assert health == {"fx9600-02": {"data_messages": 4}}
    assert prepare_batch(records, 5, options, None, health).readers is None


def test_a_management_event_numbered_between_two_reads_is_no_gap_in_them():
    options = BuildOptions(management_filters=(MANAGEMENT,))
    gpi = json.dumps(envelope("gpi", {"pin": 1, "state": "HIGH"}, eventNum=2)).encode()
    records = [
        Record("a", "zebra/fx/fx9600-01/reads", TAG % 1, seq=1),
        Record("gpi", "zebra/fx/fx9600-01/mgmt", gpi, seq=2),
        Record("b", "zebra/fx/fx9600-01/reads", TAG % 3, seq=3),
    ]
    counted = prepare_batch(records, 1, options, {}, {}).readers["fx9600-01"]
    assert (counted.received, counted.missing, counted.last_event_num) == (3, 0, 3)
    alone = [records[0], records[2]]
    gap = prepare_batch(alone, 1, options, {}, {}).readers["fx9600-01"]
    assert (gap.received, gap.missing, gap.last_event_num) == (2, 1, 3)
