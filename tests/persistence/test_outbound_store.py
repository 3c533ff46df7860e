"""OutboundStore against a temporary SQLite file: no actor, no thread."""

import sqlite3

import pytest

from persistence.outbound_store import OutboundStore
from tests.harness import faulty_sqlite
from tests.harness.faulty_sqlite import DISK_FULL


@pytest.fixture
def store(tmp_path):
    store = OutboundStore(tmp_path / "outbound.sqlite", "process")
    yield store
    store.close()


def rows(store):
    with sqlite3.connect(store.path) as db:
        return db.execute(
            "SELECT seq, packet_id, state, attempts, reason FROM outbound ORDER BY seq"
        ).fetchall()


def test_nothing_reaches_the_file_before_the_commit_and_everything_after(store):
    store.in_flight([(1, 7, 1), (2, 8, 1)])
    assert store.pending and rows(store) == []
    store.commit()
    assert not store.pending
    assert rows(store) == [(1, 7, "publish", 1, None), (2, 8, "publish", 1, None)]


def test_ack_states_keep_the_packet_id_only_while_awaiting_pubcomp(store):
    store.in_flight([(1, 7, 1), (2, 8, 1)])
    store.commit()
    store.set_state(1, "pubrel")
    store.set_state(2, "acked")
    store.commit()
    assert rows(store) == [(1, 7, "pubrel", 1, None), (2, None, "acked", 1, None)]
    assert store.known() == {1: ("pubrel", 7, 1), 2: ("acked", None, 1)}


def test_a_write_decided_after_an_ack_wins_over_it(store):
    store.in_flight([(1, 7, 1)])
    store.commit()
    store.set_state(1, "failed")  # refused by the broker ...
    store.in_flight([(1, 9, 2)])  # ... and sent again under a new id before the commit
    store.commit()
    assert rows(store) == [(1, 9, "publish", 2, None)]


def test_dead_messages_keep_their_reason_and_forget_removes_rows(store):
    store.in_flight([(1, 7, 1), (2, 8, 1)])
    store.give_up(1, 4, "forward_failed")
    store.publish_again([2])
    store.commit()
    assert store.dead() == [(1, "forward_failed")]
    store.forget([1, 2])
    store.commit()
    assert rows(store) == []


def test_a_commit_on_a_full_disk_keeps_every_pending_write_for_the_retry(tmp_path, monkeypatch):
    faults = faulty_sqlite.install(monkeypatch)
    store = OutboundStore(tmp_path / "outbound.sqlite", "process")
    try:
        store.in_flight([(1, 7, 1)])
        store.set_state(1, "acked")
        faults.set(DISK_FULL)
        with pytest.raises(sqlite3.OperationalError, match="disk is full"):
            store.commit()
        assert store.pending
        faults.set(None)
        store.commit()
        assert rows(store) == [(1, None, "acked", 1, None)]
    finally:
        faulty_sqlite.FAULTS.set(None)
        store.close()
