"""LifecycleStore against a temporary SQLite file: no actor, no thread."""

import sqlite3

import pytest

from persistence.lifecycle_store import ClientRow, LifecycleStore


def client(sequence=1, state="connected"):
    return ClientRow(
        "fxgate-site-gw", "source", "fxgate-site-gw", "127.0.0.1", 1883, "f00d",
        1.0, 2.0, sequence, state, "session-1", None, 3.0,
    )  # fmt: skip


@pytest.fixture
def store(tmp_path):
    store = LifecycleStore(tmp_path / "lifecycle.sqlite", "process")
    yield store
    store.close()


def test_a_clients_state_and_its_event_are_kept_together(store):
    store.record(client(1), 1, ["ledger", "mqtt"], '{"id": "e1"}')
    assert store.clients() == [client(1)]
    assert store.outbox() == [(1, "ledger", '{"id": "e1"}'), (1, "mqtt", '{"id": "e1"}')]


def test_a_sink_that_took_an_event_is_done_with_it_and_the_others_still_owe_it(store):
    store.record(client(1), 1, ["ledger", "mqtt"], '{"id": "e1"}')
    store.record(client(2), 2, ["ledger", "mqtt"], '{"id": "e2"}')
    store.taken(1, "ledger")
    store.drop_sinks(["mqtt"])
    assert store.outbox() == [(2, "ledger", '{"id": "e2"}')]
    assert store.clients() == [client(2)]  # the latest state, one row per client


def test_a_deleted_client_goes_with_its_event_in_one_transaction(store):
    store.record(client(1), 1, ["ledger"], '{"id": "e1"}')
    store.record("fxgate-site-gw", 2, ["ledger"], '{"id": "deleted"}')
    assert store.clients() == []
    assert [position for position, _, _ in store.outbox()] == [1, 2]


def test_a_failed_record_leaves_neither_the_state_nor_the_event(store, tmp_path):
    store.record(client(1), 1, ["ledger"], '{"id": "e1"}')
    with pytest.raises(sqlite3.IntegrityError):
        # The same position twice for one sink: the outbox refuses, and the state goes too.
        store.record(client(2), 1, ["ledger"], '{"id": "again"}')
    assert store.clients() == [client(1)]
    assert store.outbox() == [(1, "ledger", '{"id": "e1"}')]
