import json
from collections import Counter

import pytest
from click.testing import CliRunner

from actors.app.cli import main
from actors.ledger import LedgerRecord
from persistence.replay import pending_requests, read_request
from spark.schema import build_batch
from spark.tables import DEAD_LETTERS, ArrowTableWriter, application_id
from spark.writer_lock import WriterLock

TOPIC = "zebra/fx/fx9600-01/reads"
APP_ID = application_id("dead-letters-test")


def write_dead_letters(
    tables_dir,
    batch_id,
    payloads,
    received=1_800_000_000.0,
    topic=TOPIC,
    upstream_reason=None,
    **writer_options,
):
    """Dead letters of `payloads` as the writer lands them: the parser's (table), or with
    `upstream_reason` the upstream dead letters the ledger adds when forwarding gave up."""
    records = [
        LedgerRecord(
            i,
            f"key{batch_id}-{i}",
            topic,
            payload,
            1,
            received + i,
            1,
            upstream_reason,
            dead_sink=None if upstream_reason is None else "upstream",
        )
        for i, payload in enumerate(payloads)
    ]
    dead = build_batch(records, batch_id).dead_letters
    # One Delta commit, as the daemon's writer lands a batch.
    ArrowTableWriter(None, tables_dir, APP_ID, **writer_options).write_batch(
        batch_id, {DEAD_LETTERS: dead}
    )
    return dead


def run_cli(tmp_path, *args):
    env = {"FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data")}
    return CliRunner().invoke(main, ["dead-letters", "list", *args], env=env)


def test_lists_counts_per_reason_and_the_newest_dead_letters_first(tmp_path):
    tables = tmp_path / "data" / "tables"
    first = write_dead_letters(tables, 1, [b"not json", b"\xff\xfe"])
    second = write_dead_letters(tables, 2, [b"{}"], received=1_800_000_100.0)
    reasons = Counter(first.column("reason").to_pylist() + second.column("reason").to_pylist())

    result = run_cli(tmp_path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("3 dead letter(s): ")
    for reason, count in reasons.items():
        assert f"{reason} {count}" in lines[0]
    # Newest first: the batch-2 message arrived 100 s after the others.
    assert "key2-0" in lines[1] and "batch 2" in lines[1]
    assert "payload '{}'" in lines[2]
    assert "payload 'not json'" in result.output


def test_filters_by_reason_and_speaks_json(tmp_path):
    tables = tmp_path / "data" / "tables"
    dead = write_dead_letters(tables, 1, [b"not json", b"{}", b"also not json"])
    reason = dead.column("reason").to_pylist()[0]
    expected = dead.column("reason").to_pylist().count(reason)

    result = run_cli(tmp_path, "--reason", reason, "--json", "--limit", "1")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["total"] == expected
    assert report["by_reason"] == {reason: expected}
    assert len(report["newest"]) == 1
    assert report["newest"][0]["reason"] == reason


def test_an_empty_table_says_so(tmp_path):
    result = run_cli(tmp_path)
    assert result.exit_code == 0
    assert result.output.strip() == "no dead letters"


def run_replay(tmp_path, *args):
    env = {"FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data")}
    return CliRunner().invoke(main, ["dead-letters", "replay", *args], env=env)


def test_replay_requests_the_chosen_dead_letters_for_the_daemon(tmp_path):
    tables = tmp_path / "data" / "tables"
    dead = write_dead_letters(tables, 1, [b"not json", b"{}", b"also not json"])
    reason = dead.column("reason").to_pylist()[0]
    chosen = [
        (key, payload)
        for key, payload, r in zip(
            dead.column("message_key").to_pylist(),
            dead.column("payload").to_pylist(),
            dead.column("reason").to_pylist(),
            strict=True,
        )
        if r == reason
    ]

    result = run_replay(tmp_path, "--reason", reason)
    assert result.exit_code == 0, result.output
    (path,) = pending_requests(tmp_path / "data")
    _, messages = read_request(path)
    assert sorted((m.message_key, m.payload) for m in messages) == sorted(chosen)
    assert {m.topic for m in messages} == {TOPIC}


def test_an_upstream_dead_letter_is_listed_with_its_sink_and_replayed_to_the_upstream_only(
    tmp_path,
):
    tables = tmp_path / "data" / "tables"
    write_dead_letters(tables, 1, [b"not json"])
    write_dead_letters(tables, 2, [b'{"valid": "read"}'], upstream_reason="forward_failed")
    listed = run_cli(tmp_path, "--json")
    assert {(d["reason"], d["sink"]) for d in json.loads(listed.output)["newest"]} == {
        ("invalid_json", "table"),
        ("forward_failed", "upstream"),
    }
    assert "forward_failed (upstream)" in run_cli(tmp_path).output
    result = run_replay(tmp_path, "--reason", "forward_failed")
    assert result.exit_code == 0, result.output
    (path,) = pending_requests(tmp_path / "data")
    _, (message,) = read_request(path)
    assert (message.payload, message.sink) == (b'{"valid": "read"}', "upstream")


def test_replay_needs_a_selection_and_a_dry_run_writes_nothing(tmp_path):
    write_dead_letters(tmp_path / "data" / "tables", 1, [b"not json"])
    assert run_replay(tmp_path).exit_code == 2
    result = run_replay(tmp_path, "--all", "--dry-run")
    assert result.exit_code == 0
    assert "would replay 1 dead letter(s)" in result.output
    assert pending_requests(tmp_path / "data") == []


def test_a_hostile_topic_is_listed_escaped_and_cut_never_raw_on_the_terminal(tmp_path):
    tables = tmp_path / "data" / "tables"
    # ESC [2J clears a terminal; the reader level is 5,000 characters long.
    topic = "zebra/fx/\x1b[2J" + "r" * 5000 + "/reads"
    write_dead_letters(tables, 1, [b"not json"], topic=topic)
    result = run_cli(tmp_path)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output
    assert "zebra/fx/\\x1b[2J" in result.output
    assert max(len(line) for line in result.output.splitlines()) < 600


def test_tables_this_machine_cannot_read_are_a_clear_error_not_a_traceback(tmp_path):
    env = {
        "FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data"),
        "FXGATE__SPARK__TABLES_DIR": "hdfs://namenode:8020/fxgate/tables",
    }
    result = CliRunner().invoke(main, ["dead-letters", "list"], env=env)
    assert result.exit_code == 1
    assert "cannot read the dead letters here" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


class KilledBeforeCommit(Exception):
    pass


def kill_before_commit(point):
    raise KilledBeforeCommit(point)


def listed_keys(tmp_path) -> Counter:
    result = run_cli(tmp_path, "--json", "--limit", "100")
    assert result.exit_code == 0, result.output
    return Counter(d["message_key"] for d in json.loads(result.output)["newest"])


def test_the_list_reads_a_snapshot_without_a_lock_so_a_write_killed_before_its_commit_is_not_listed(
    tmp_path,
):
    tables = tmp_path / "data" / "tables"
    write_dead_letters(tables, 1, [b"not json"])
    with pytest.raises(KilledBeforeCommit, match="landing_after_write_before_commit"):
        write_dead_letters(tables, 2, [b"{}"], checkpoint=kill_before_commit)
    # The killed write's file is in the table's directory, and no snapshot lists it.
    on_disk = list((tables / DEAD_LETTERS).glob("date=*/*.parquet"))
    assert len(on_disk) == 2

    # The daemon holds the writer lock while it runs; readers take no lock and list anyway.
    with WriterLock(tables, "daemon"):
        assert listed_keys(tmp_path) == Counter(["key1-0"])
        result = run_cli(tmp_path)
    assert result.output.splitlines()[0].startswith("1 dead letter(s): ")


def test_a_compacted_dead_letter_is_listed_once_with_the_batch_it_landed_in(tmp_path):
    """OPTIMIZE folds the batches' files into one and keeps each row's `batch_id`; the list
    reads the snapshot after it, not the replaced files still on disk (VACUUM keeps them)."""
    from spark.maintenance import DeltaMaintainer

    tables = tmp_path / "data" / "tables"
    write_dead_letters(tables, 1, [b"not json"])
    write_dead_letters(tables, 2, [b"{}"], received=1_800_000_100.0)
    write_dead_letters(tables, 3, [b"\xff"], received=1_800_000_200.0)
    result = DeltaMaintainer(tables).run(1_800_000_300.0)
    (maintained,) = result.tables
    assert (maintained.table, maintained.files_removed, maintained.files_added) == (
        DEAD_LETTERS,
        3,
        1,
    )
    assert maintained.files_vacuumed == 0  # within the retention: still on disk
    assert len(list((tables / DEAD_LETTERS).glob("date=*/*.parquet"))) == 4

    assert listed_keys(tmp_path) == Counter(["key1-0", "key2-0", "key3-0"])
    lines = run_cli(tmp_path).output.splitlines()
    assert lines[0].startswith("3 dead letter(s): ")
    for batch in (1, 2, 3):
        (line,) = [line for line in lines if f"key{batch}-0" in line]
        assert f"batch {batch} " in line
