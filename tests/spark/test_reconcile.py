"""The heartbeat reconciliation over the tables (spark/reconcile.py): the rules alone, then over a
shared group's one table, where each member holds only its share and the table the whole stream."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from persistence.keys import message_key
from spark.reconcile import Heartbeat, Interval, intervals, reconcile_tables
from spark.schema import build_batch
from spark.tables import READER_EVENTS, READS, GroupTableWriter
from tests.spark.test_audit import Record

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
READER = "fx-a"


def test_intervals_join_consecutive_usable_heartbeats_and_a_drop_of_sent_is_a_reset():
    beats = [
        Heartbeat(30, 25),
        Heartbeat(10, 5),  # out of order: the reader's clock orders them
        Heartbeat(20, None),  # no counter: changes nothing
        Heartbeat(40, 40, paths=2),  # two data paths: not comparable
        Heartbeat(50, 3),  # a reboot
        Heartbeat(60, 9),
    ]
    found, resets = intervals(beats)
    assert found == [Interval(10, 30, 20), Interval(50, 60, 6)]
    assert resets == 1
    assert intervals([Heartbeat(1, 1)]) == ([], 0)


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"


def data_message(number: int, seq: int, events: int = 1) -> Record:
    """Data message `number` of the reader: `events` tag events stamped `number` seconds in."""
    when = T0 + timedelta(seconds=number)
    docs = [
        {
            "data": {"idHex": f"e2801160600002{number:04x}{i:02x}", "antenna": 1},
            "timestamp": stamp(when + timedelta(milliseconds=i)),
            "type": "SIMPLE",
        }
        for i in range(events)
    ]
    body = json.dumps(docs if events > 1 else docs[0]).encode()
    topic = f"zebra/fx/{READER}/reads"
    return Record(seq, message_key(topic, body), topic, body, 1, when.timestamp() + 1, seq)


def heartbeat(seconds: float, sent: int, seq: int) -> Record:
    counters = {"numDataMessagesTxed": sent, "numDataMessagesRxed": sent}
    doc = {
        "component": "RG",
        "data": {"reader_gateway": {"dataPathStatistics": [counters]}},
        "timestamp": stamp(T0 + timedelta(seconds=seconds)),
        "type": "heartbeat",
    }
    body = json.dumps(doc).encode()
    topic = f"zebra/fx/{READER}/mgmt"
    when = (T0 + timedelta(seconds=seconds)).timestamp() + 1
    return Record(seq, message_key(topic, body), topic, body, 1, when, seq)


def land_the_groups_stream(tables, lost: int = 17) -> None:
    """The reader sends 30 data messages (every third a batched one of three events) and a
    heartbeat before, in the middle and after; the broker hands them to two members in turn and
    loses message `lost`. Each member lands its share into the group's table."""
    shares: dict[str, list[Record]] = {"fxgate-env-a-a1": [], "fxgate-env-a-a2": []}
    members = sorted(shares)
    for number in range(1, 31):
        if number != lost:
            record = data_message(number, seq=number, events=3 if number % 3 == 0 else 1)
            shares[members[number % 2]].append(record)
    shares[members[0]].append(heartbeat(0.5, 100, seq=100))
    shares[members[1]].append(heartbeat(15.5, 115, seq=101))
    shares[members[0]].append(heartbeat(30.5, 130, seq=102))
    for batch_id, member in enumerate(members, start=1):
        batch = build_batch(shares[member], batch_id)
        GroupTableWriter(
            None, tables, f"fxgate-ledger-{member}", group="fxgate-env-a", member=member
        ).write_batch(batch_id, {READS: batch.reads, READER_EVENTS: batch.reader_events})


@pytest.mark.spark
def test_over_a_groups_one_table_the_reconciliation_sees_the_whole_stream_and_names_one_loss(
    spark_session, tmp_path
):
    """Each member alone holds half the stream; the group's table holds 29 of the 30 data
    messages the reader counted: 1 unaccounted."""
    land_the_groups_stream(tmp_path)
    (found,) = reconcile_tables(spark_session, [tmp_path]).values()
    assert found.reader_id == READER
    assert (found.heartbeats, found.intervals, found.resets) == (3, 2, 0)
    assert (found.sent, found.received, found.unaccounted) == (30, 29, 1)
    assert found.to_json()["unaccounted"] == 1
    assert (
        "the reader sent 30 data message(s) over 2 heartbeat interval(s), the table holds 29"
        in (found.line())
    )


@pytest.mark.spark
def test_fxgate_audit_prints_each_readers_reconciliation_and_puts_it_in_its_json(
    spark_session, monkeypatch, tmp_path
):
    from click.testing import CliRunner

    import spark.session
    from actors.app.cli import main

    tables = tmp_path / "tables"
    land_the_groups_stream(tables)
    monkeypatch.setattr(spark.session, "build_session", lambda *_a, **_k: spark_session)
    monkeypatch.setattr(spark.session, "stop_session", lambda _session: None)
    env = {
        "FXGATE__GATEWAY__DATA_DIR": str(tmp_path),
        "FXGATE__SOURCE__SHARED_SUBSCRIPTION_GROUP": "fxgate",
        "FXGATE__SOURCE__ENVIRONMENT_ID": "env-a",
    }
    text = CliRunner().invoke(main, ["audit", "--no-progress"], env=env)
    # Message 17 carried no eventNum here: the audit proper finds nothing missing (exit 0).
    assert text.exit_code == 0, text.output
    assert (
        "heartbeats: fx-a: the reader sent 30 data message(s) over 2 heartbeat interval(s), the "
        "table holds 29: 1 unaccounted, 0 counter reset(s)" in text.output
    )
    as_json = CliRunner().invoke(main, ["audit", "--no-progress", "--json"], env=env)
    reconciliation = json.loads(as_json.stdout)["reconciliation"]
    assert reconciliation[READER]["unaccounted"] == 1
