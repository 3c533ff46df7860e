import shutil

import pytest

from actors.clock import SimulatedClock
from actors.ledger import InboundLedger
from actors.messages import TakeReplays
from persistence.replay import (
    REPLAY_DIR,
    ReplayMessage,
    pending_requests,
    read_request,
    replay_key,
    write_request,
)
from tests.actors.test_ledger import listen
from tests.harness.checks import wait_until

TOPIC = "zebra/fx/fx9600-01/reads"


def start_ledger(tmp_path, **options):
    ledger = InboundLedger.start(
        tmp_path / "ledger.sqlite", SimulatedClock(), group_commit_max_delay=0.0, **options
    )
    return ledger, listen(ledger)


def test_a_request_round_trips_through_its_file(tmp_path):
    messages = [
        ReplayMessage("k1", TOPIC, b"\x00\xffbytes", 2),
        ReplayMessage("k2", TOPIC, b"{}", 1, sink="upstream"),
    ]
    path = write_request(tmp_path, messages)
    assert pending_requests(tmp_path) == [path]
    request, read = read_request(path)
    assert read == messages
    assert path.name == f"{request}.jsonl"
    assert write_request(tmp_path, []) is None


def test_the_ledger_takes_a_request_as_new_rows_under_replay_keys_and_deletes_it(tmp_path):
    ledger, listener = start_ledger(tmp_path)
    try:
        path = write_request(tmp_path, [ReplayMessage("k1", TOPIC, b"fixed", 1)])
        request = path.name.removesuffix(".jsonl")
        ledger.tell(TakeReplays(tmp_path))
        with listener.cond:
            assert listener.cond.wait_for(lambda: listener.records, 5)
        (record,) = listener.records
        assert (record.message_key, record.payload) == (replay_key("k1", request), b"fixed")
        # The rows are handed on at the commit, just before the file is deleted.
        assert wait_until(lambda: pending_requests(tmp_path) == [], timeout=5)
    finally:
        ledger.stop()


def test_a_request_taken_twice_after_a_crash_stores_nothing_twice(tmp_path):
    ledger, listener = start_ledger(tmp_path)
    try:
        path = write_request(
            tmp_path, [ReplayMessage("k1", TOPIC, b"a", 1), ReplayMessage("k2", TOPIC, b"b", 1)]
        )
        kept = tmp_path / "kept.jsonl"
        shutil.copy(path, kept)
        ledger.tell(TakeReplays(tmp_path))
        with listener.cond:
            assert listener.cond.wait_for(lambda: len(listener.records) == 2, 5)
        # As if the ledger died between its commit and the file's deletion: once the first
        # take is over (the file, and maybe its directory, gone), the file is back.
        assert wait_until(lambda: not pending_requests(tmp_path), 5)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(kept, path)
        assert pending_requests(tmp_path) == [path]
        ledger.tell(TakeReplays(tmp_path))
        assert wait_until(lambda: not pending_requests(tmp_path), 5)
        stats = ledger.proxy().stats().get(timeout=5)
        assert (stats["accepted"], len(listener.records)) == (2, 2)
    finally:
        ledger.stop()


def test_an_unreadable_request_is_moved_aside_not_retried_forever(tmp_path):
    ledger, listener = start_ledger(tmp_path)
    try:
        directory = tmp_path / REPLAY_DIR
        directory.mkdir()
        (directory / "broken.jsonl").write_text("{not json\n")
        ledger.tell(TakeReplays(tmp_path))
        assert wait_until((directory / "broken.invalid").exists, 5)
        assert pending_requests(tmp_path) == []
        assert listener.records == []
    finally:
        ledger.stop()


@pytest.mark.parametrize(
    "line",
    [
        '{"message_key": "k", "topic": "zebra/fx/\\udcff/reads", "payload": "", "qos": 1}',
        '{"message_key": "k", "topic": 7, "payload": "", "qos": 1}',
        '{"message_key": "k", "topic": "t", "payload": "", "qos": 300}',
        '{"message_key": "k", "topic": "t", "payload": "", "qos": true}',
        '{"message_key": "k", "topic": "t", "payload": "not base64!", "qos": 1}',
        '{"message_key": "k", "topic": "t", "qos": 1}',
        '{"message_key": "k", "topic": "t", "payload": "", "qos": 1, "sink": "cloud"}',
        "[1, 2",
    ],
)
def test_a_hand_written_request_with_a_bad_line_is_refused_as_a_whole(tmp_path, line):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises((ValueError, KeyError)):
        read_request(path)


def test_the_ledger_moves_a_request_it_cannot_take_aside_and_keeps_running(tmp_path):
    ledger, listener = start_ledger(tmp_path)
    try:
        directory = tmp_path / REPLAY_DIR
        directory.mkdir()
        bad = directory / "bad.jsonl"
        bad.write_text('{"message_key": "k", "topic": "\\ud800", "payload": "", "qos": 1}\n')
        ledger.tell(TakeReplays(tmp_path))
        assert wait_until((directory / "bad.invalid").exists, timeout=5)
        good = write_request(tmp_path, [ReplayMessage("k1", TOPIC, b"fixed", 1)])
        ledger.tell(TakeReplays(tmp_path))
        with listener.cond:
            assert listener.cond.wait_for(lambda: listener.records, 5)
        assert wait_until(lambda: not good.exists(), timeout=5)
    finally:
        ledger.stop()


def test_an_upstream_dead_letter_is_replayed_to_the_upstream_only(tmp_path):
    """Its reads are in the table already (DESIGN §7.2): the replay must not land them twice."""
    ledger, table = start_ledger(tmp_path, forward_topic=lambda topic: True)
    upstream = listen(ledger, "upstream")
    try:
        write_request(
            tmp_path,
            [
                ReplayMessage("k1", TOPIC, b"to the cloud", 1, sink="upstream"),
                ReplayMessage("k2", TOPIC, b"to the table", 1, sink="table"),
            ],
        )
        ledger.tell(TakeReplays(tmp_path))
        (cloud,) = upstream.wait_for(1)
        (local,) = table.wait_for(1)
        assert (cloud.payload, cloud.to_table, cloud.to_upstream) == (b"to the cloud", False, True)
        assert (local.payload, local.to_table, local.to_upstream) == (b"to the table", True, False)
        ledger.proxy().stats().get(timeout=5)
        assert len(table.records) == len(upstream.records) == 1
    finally:
        ledger.stop()
