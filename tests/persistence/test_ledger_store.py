"""LedgerStore against a temporary SQLite file: no actor, no thread, times passed in."""

import hashlib
import sqlite3
from pathlib import Path

import pytest

from persistence.database import (
    LEDGER_VERSION,
    SchemaTooNew,
    SchemaTooOld,
    check_versions,
    ledger_version,
    metadata,
    open_engine,
)
from persistence.ledger_store import LedgerStore
from persistence.records import TABLE, UPSTREAM

V1_SCHEMA = Path(__file__).parent / "data" / "ledger_v1.sql"
TOPIC = "zebra/fx/fx9600-01/reads"
NOW = 1_800_000_000.0


@pytest.fixture
def path(tmp_path):
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def store(path):
    store = LedgerStore(open_engine(path), path)
    yield store
    store.close()


def put(store, n, forward=False, landed_time=None, payload=None, topic=TOPIC):
    return store.insert(
        f"k{n}",
        topic,
        payload if payload is not None else b"payload-%d" % n,
        1,
        NOW + n,
        forward=forward,
        landed_time=landed_time,
    )


def payloads(path):
    with sqlite3.connect(path) as db:
        return db.execute("SELECT seq, payload FROM payloads ORDER BY seq").fetchall()


def test_a_stored_key_is_refused_the_second_time(store):
    assert put(store, 1) == 1
    assert put(store, 1) is None
    store.commit()
    assert store.seq_of("k1") == 1


def test_each_sink_reads_back_only_what_it_owes_in_seq_order_from_a_seq(store):
    for n in range(1, 6):
        put(store, n, forward=n % 2 == 1)
    put(store, 6, forward=True, landed_time=NOW)  # an upstream replay: not the table's
    store.commit()
    assert [r.seq for r in store.owed(TABLE, 1, 100)] == [1, 2, 3, 4, 5]
    assert [r.seq for r in store.owed(UPSTREAM, 1, 100)] == [1, 3, 5, 6]
    assert [r.seq for r in store.owed(UPSTREAM, 4, 2)] == [5, 6]
    record = store.owed(UPSTREAM, 6, 1)[0]
    assert (record.payload, record.to_table, record.to_upstream) == (b"payload-6", False, True)
    assert store.first_owed(TABLE) == 1 and store.first_owed(UPSTREAM) == 1


def test_a_batch_takes_rows_out_of_the_tables_feed_and_its_commit_lands_them(store, path):
    for n in range(1, 4):
        put(store, n, forward=n == 3)
    batch = store.begin_batch([(7, [1, 2, 3])], NOW)
    store.commit()
    assert store.owed(TABLE, 1, 10) == ()
    assert store.lag(TABLE).messages == 3  # in a batch, not yet landed
    assert [r.pack_id for r in store.batch_records(batch)] == [7, 7, 7]
    store.commit_batch(batch, 3, 0, NOW + 10, retention=3600)
    store.commit()
    # Landed: two payloads go; the third is still owed upstream and stays.
    assert payloads(path) == [(3, b"payload-3")]
    assert store.lag(TABLE).messages == 0
    assert store.counter("pack_id") == 7


def test_a_payload_goes_once_both_sinks_are_done_in_either_order(store, path):
    put(store, 1, forward=True)
    put(store, 2, forward=True)
    store.commit()
    store.forwarded([1], [], NOW)  # upstream first: the table still owes it
    store.commit()
    assert [seq for seq, _ in payloads(path)] == [1, 2]
    batch = store.begin_batch([(1, [1, 2])], NOW)
    store.commit_batch(batch, 2, 0, NOW, retention=3600)
    store.commit()
    assert [seq for seq, _ in payloads(path)] == [2]  # the table second: 1 goes now
    store.forwarded([2], [], NOW)
    store.commit()
    assert payloads(path) == []


def test_an_upstream_dead_letter_is_a_new_row_for_the_table_and_is_added_once(store, path):
    put(store, 1, forward=True)
    store.commit()
    (added,) = store.forwarded([], [(1, "forward_failed")], NOW + 50)
    assert store.forwarded([], [(1, "forward_failed")], NOW + 60) == []  # reported again
    store.commit()
    (record,) = store.records([added])
    assert (record.message_key, record.dead_reason, record.dead_sink) == (
        "k1/upstream",
        "forward_failed",
        "upstream",
    )
    assert (record.payload, record.to_table, record.to_upstream) == (b"payload-1", True, False)
    assert record.received_time == NOW + 50
    assert store.lag(UPSTREAM).messages == 0
    assert [r.seq for r in store.owed(TABLE, 1, 10)] == [1, added]


def test_keys_are_pruned_after_the_retention_unless_still_owed_upstream(store):
    put(store, 1)
    put(store, 2, forward=True)
    batch = store.begin_batch([(1, [1, 2])], NOW)
    store.commit_batch(batch, 2, 0, NOW, retention=100)
    put(store, 3)
    later = store.begin_batch([(2, [3])], NOW + 200)
    store.commit_batch(later, 1, 0, NOW + 200, retention=100)
    store.commit()
    assert put(store, 1) == 4  # its key is gone: a new message
    assert put(store, 2) is None  # still owed upstream: kept, and its key with it


def test_lag_counts_and_dates_what_each_sink_owes(store):
    put(store, 1, forward=True)
    put(store, 2)
    store.commit()
    table, upstream = store.lag(TABLE), store.lag(UPSTREAM)
    assert (table.messages, table.oldest_received_time) == (2, NOW + 1)
    assert (upstream.messages, upstream.oldest_received_time) == (1, NOW + 1)
    assert upstream.age(NOW + 31) == 30.0


def test_used_bytes_fall_again_once_the_sinks_are_done(store):
    """The disk budget counts used pages: deleting payloads must free them (an UPDATE to NULL
    in place did not: measured, every page stayed in use)."""
    payload = b"x" * 400
    for n in range(1, 3001):
        put(store, n, payload=payload)
    store.commit()
    full = store.usage().used_bytes
    store.commit()
    batch = store.begin_batch([(1, list(range(1, 3001)))], NOW)
    store.commit_batch(batch, 3000, 0, NOW, retention=3600)
    store.commit()
    with store.conn.connection.driver_connection as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    emptied = store.usage().used_bytes
    assert full > 3000 * 400
    assert emptied < full - 3000 * 400 * 0.9


def test_stop_forwarding_clears_the_marks_and_drops_what_only_the_upstream_kept(store, path):
    put(store, 1, forward=True)
    batch = store.begin_batch([(1, [1])], NOW)
    store.commit_batch(batch, 1, 0, NOW, retention=3600)
    put(store, 2, forward=True)
    store.commit()
    assert store.stop_forwarding() == 2
    store.commit()
    assert payloads(path) == [(2, b"payload-2")]  # still owed to the table
    assert store.lag(UPSTREAM).messages == 0


# -- versions and migrations ------------------------------------------------------------------


def v1_file(path: Path) -> None:
    """A ledger as the previous schema left it, with rows in every state."""
    with sqlite3.connect(path) as db:
        db.executescript(V1_SCHEMA.read_text())
        rows = [
            # seq, key, payload, packet_id, batch_id, landed_time, dead_reason
            (1, "landed", None, None, 1, NOW, None),
            (2, "in-open-batch", b"p2", None, 2, None, None),
            (3, "failed-upstream", b"p3", None, 2, None, "forward_failed"),
            (4, "loose", b"p4", None, None, None, None),
            (5, "awaiting-pubrel", b"p5", 9, None, None, None),
            (6, "bad-topic", b"p6", None, None, None, "invalid_topic"),
        ]
        db.executemany(
            "INSERT INTO inbound (seq, message_key, topic, payload, qos, packet_id, "
            "received_time, batch_id, landed_time, dead_reason) "
            "VALUES (?, ?, 'zebra/fx/r1/reads', ?, 2, ?, 1.0, ?, ?, ?)",
            rows,
        )
        db.execute("INSERT INTO batches VALUES (1, 'committed', 1.0, 2.0, 1, 1, 0)")
        db.execute("INSERT INTO batches VALUES (2, 'writing', 3.0, NULL, 2, NULL, NULL)")
        db.execute("INSERT INTO counters VALUES ('pack_id', 5)")


def test_a_file_of_the_previous_schema_is_migrated_in_place_keeping_every_row(path):
    v1_file(path)
    store = LedgerStore(open_engine(path), path)
    try:
        assert store.conn.exec_driver_sql("PRAGMA user_version").scalar() == LEDGER_VERSION
        # Payloads moved to their table; the landed row had none.
        assert payloads(path) == [(2, b"p2"), (3, b"p3"), (4, b"p4"), (5, b"p5"), (6, b"p6")]
        # Loose rows may still be owed upstream; batched ones had been forwarded, and the
        # dead letters never go.
        assert [r.seq for r in store.owed(UPSTREAM, 1, 10)] == [4, 5]
        assert [r.seq for r in store.owed(TABLE, 1, 10)] == [4, 5, 6]
        assert store.open_batches() == [2]
        failed = store.batch_records(2)[1]
        assert (failed.dead_reason, failed.dead_sink) == ("forward_failed", "upstream")
        assert store.awaiting_pubrel() == {9: (5, "awaiting-pubrel")}
        assert store.counter("pack_id") == 5
    finally:
        store.close()


def test_a_migration_that_fails_leaves_the_file_as_it_was(path, monkeypatch):
    from persistence import database

    v1_file(path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()

    def broken(db):
        db.execute("CREATE TABLE payloads (seq INTEGER PRIMARY KEY, payload BLOB)")
        raise RuntimeError("power cut in the middle")

    monkeypatch.setattr(database, "_ledger_1_to_2", broken)
    with pytest.raises(RuntimeError, match="power cut"):
        open_engine(path)
    with sqlite3.connect(path) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        assert "payloads" not in tables
        assert db.execute("PRAGMA user_version").fetchone() == (0,)
    monkeypatch.undo()
    store = LedgerStore(open_engine(path), path)  # and the next start migrates it
    store.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() != before


def test_a_file_newer_than_this_code_is_refused_and_left_untouched(path, tmp_path):
    store = LedgerStore(open_engine(path), path)
    store.close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {LEDGER_VERSION + 1}")
    before = path.read_bytes()
    with pytest.raises(SchemaTooNew, match="newer than this fxgate"):
        check_versions(tmp_path)
    with pytest.raises(SchemaTooNew):
        open_engine(path)
    with pytest.raises(SchemaTooNew):
        open_engine(path, readonly=True)
    assert path.read_bytes() == before


def test_a_reader_asks_for_the_daemon_to_migrate_a_file_of_the_previous_schema(path):
    v1_file(path)
    with pytest.raises(SchemaTooOld, match="start the daemon"):
        open_engine(path, readonly=True)


def test_a_new_ledger_is_never_seen_with_its_tables_but_without_its_version(path, monkeypatch):
    """Seen between the two, a new file read as version 1: `fxgate status` during the daemon's
    first start was told to migrate it, and a kill there left a file no start could open."""
    seen = []
    create_all = metadata.create_all

    def watched(bind, *args, **kwargs):
        create_all(bind, *args, **kwargs)
        seen.append(ledger_version(path))  # another connection's view, before the commit

    monkeypatch.setattr(metadata, "create_all", watched)
    open_engine(path).dispose()
    assert seen == [0]
    assert ledger_version(path) == LEDGER_VERSION


def test_batches_are_counted_by_state_and_the_newest_committed_is_named(store):
    assert (store.batch_counts(), store.last_batch()) == ((0, 0), None)
    put(store, 1)
    put(store, 2)
    first = store.begin_batch([(1, [1])], NOW)
    store.commit_batch(first, 1, 0, NOW + 5, retention=3600)
    store.begin_batch([(2, [2])], NOW + 6)
    store.commit()
    assert store.batch_counts() == (1, 1)
    assert store.last_batch() == (first, NOW + 5, 1, 0)


def test_reader_health_is_committed_with_its_batch_and_read_back_after_a_reopen(store, path):
    put(store, 1)
    batch = store.begin_batch([(1, [1])], NOW)
    store.commit()
    assert store.reader_health() == {}
    state = {"heartbeats": 2, "unaccounted": 5, "events": {"gpi": 1}, "sent": None}
    store.commit_batch(batch, 1, 0, NOW + 1, retention=3600, health={"fx9600-01": state})
    store.rollback()  # not committed: nothing of it stays
    assert store.reader_health() == {}
    store.commit_batch(batch, 1, 0, NOW + 1, retention=3600, health={"fx9600-01": state})
    store.commit()
    store.commit_batch(
        batch, 1, 0, NOW + 2, retention=3600, health={"fx9600-01": {**state, "heartbeats": 3}}
    )
    store.commit()
    store.close()
    reader = LedgerStore(open_engine(path, readonly=True), path)
    try:
        assert reader.reader_health() == {"fx9600-01": {**state, "heartbeats": 3}}
    finally:
        reader.close()


def test_a_ledger_written_before_reader_health_existed_reads_as_having_none(path):
    store = LedgerStore(open_engine(path), path)
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE reader_health")
    reader = LedgerStore(open_engine(path, readonly=True), path)
    try:
        assert reader.reader_health() == {}
    finally:
        reader.close()
    # The daemon's next start adds the table (additive: no new schema version).
    store = LedgerStore(open_engine(path), path)
    try:
        assert store.reader_health() == {}
    finally:
        store.close()
