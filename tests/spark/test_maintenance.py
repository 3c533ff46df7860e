"""Table maintenance through Delta's own operations (spark/maintenance.py): OPTIMIZE packs the
small files of every date, VACUUM deletes what no snapshot within the retention lists, and a
checkpoint with log clean-up bounds the log, with every row kept once and the gateway's
transaction identifier (its exactly-once gate) intact. `DeltaMaintainer` runs with no JVM; the
`SparkMaintainer` smoke test at the end starts one."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark.maintenance import (
    AFTER_OPTIMIZE_BEFORE_VACUUM,
    DeltaMaintainer,
    PassResult,
    SparkMaintainer,
    utc_date,
)
from spark.tables import (
    DEAD_LETTERS,
    LANDED_NOT_COMMITTED,
    READS,
    ArrowTableWriter,
    read_table_arrow,
    table_properties,
)

APP = "fxgate-ledger-test"
CLOSED = "2026-11-20"
OPEN = "2026-11-21"
# The pass's wall time: noon of the open date (UTC).
NOW = datetime(2026, 11, 21, 12, tzinfo=UTC).timestamp()
# Large enough that every date of these tests packs into one file.
BIG = 64 * 1024 * 1024


class Killed(Exception):
    """Stands in for a SIGKILL at a crash point: nothing after it runs."""


def kill_at(point: str):
    def checkpoint(name: str) -> None:
        if name == point:
            raise Killed(name)

    return checkpoint


def rows(batch_id: int, date: str, count: int = 40) -> pa.Table:
    ids = [batch_id * 1000 + i for i in range(count)]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "payload": [f"read {i} " + "x" * 100 for i in ids],
            "date": [date] * count,
        }
    )


def land(tables_dir: Path, batches: range, writer: ArrowTableWriter | None = None):
    """One small file per batch per table, batches alternating between the closed and the
    open date (a gateway's first hours after midnight)."""
    writer = writer or ArrowTableWriter(None, tables_dir, APP)
    for batch_id in batches:
        date = CLOSED if batch_id % 2 else OPEN
        writer.write_batch(
            batch_id, {READS: rows(batch_id, date), DEAD_LETTERS: rows(batch_id, date, 3)}
        )
    return writer


def keys(tables_dir: Path, name: str = READS) -> Counter:
    table = read_table_arrow(tables_dir, name)
    return Counter(
        zip(table.column("id").to_pylist(), table.column("batch_id").to_pylist(), strict=True)
    )


def live_files(table: Path, date: str | None = None) -> list[str]:
    listed = DeltaTable(table).file_uris()
    return [f for f in listed if date is None or f"/date={date}/" in f]


def files_on_disk(table: Path) -> set[str]:
    return {str(path) for path in table.rglob("*.parquet") if "_delta_log" not in path.parts}


def log_actions(table: Path, version: int) -> list[tuple[str, dict]]:
    """The actions of one commit, as the Delta log holds them (one JSON object a line)."""
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [next(iter(json.loads(line).items())) for line in text.splitlines() if line]


def age(paths, hours: float) -> None:
    then = time.time() - hours * 3600
    for path in paths:
        os.utime(path, (then, then))


def test_the_pass_time_is_on_the_open_date():
    assert utc_date(NOW) == OPEN


def test_a_pass_compacts_the_small_files_of_closed_and_open_dates_and_keeps_every_row_once(
    tmp_path,
):
    land(tmp_path, range(1, 21))
    reads = tmp_path / READS
    before = keys(tmp_path)
    dead_before = keys(tmp_path, DEAD_LETTERS)
    assert (len(live_files(reads, CLOSED)), len(live_files(reads, OPEN))) == (10, 10)

    result = DeltaMaintainer(tmp_path, target_file_bytes=BIG, open_file_bytes=BIG).run(NOW)

    assert (len(live_files(reads, CLOSED)), len(live_files(reads, OPEN))) == (1, 1)
    assert len(live_files(tmp_path / DEAD_LETTERS)) == 2
    assert keys(tmp_path) == before
    assert max(before.values()) == 1 and len(before) == 20 * 40
    assert keys(tmp_path, DEAD_LETTERS) == dead_before
    assert [(t.table, t.files_removed, t.files_added) for t in result.tables] == [
        (READS, 20, 2),
        (DEAD_LETTERS, 20, 2),
    ]
    # A compaction commit changes no data (a reader following the log skips it) and keeps
    # no file of a date apart from its date.
    optimize = [c["version"] for c in DeltaTable(reads).history() if c["operation"] == "OPTIMIZE"]
    assert len(optimize) == 2
    for version in optimize:
        actions = log_actions(reads, version)
        assert {kind for kind, _ in actions} == {"commitInfo", "add", "remove"}
        assert {a["dataChange"] for kind, a in actions if kind in ("add", "remove")} == {False}


def test_the_open_date_is_packed_to_the_open_target_and_closed_dates_to_the_full_target(tmp_path):
    land(tmp_path, range(1, 21))
    reads = tmp_path / READS
    largest = max(os.path.getsize(f) for f in live_files(reads, OPEN))
    # About three of today's files per bin: today is packed, but not into one file.
    open_target = 3 * largest + largest // 2

    DeltaMaintainer(tmp_path, target_file_bytes=BIG, open_file_bytes=open_target).run(NOW)

    assert len(live_files(reads, CLOSED)) == 1
    assert 1 < len(live_files(reads, OPEN)) < 10
    targets = {
        commit["operationParameters"]["predicate"]: int(commit["operationParameters"]["targetSize"])
        for commit in DeltaTable(reads).history()
        if commit["operation"] == "OPTIMIZE"
    }
    assert targets == {
        f"[\"date < '{OPEN}'\"]": BIG,
        f"[\"date >= '{OPEN}'\"]": open_target,
    }


def test_once_the_open_date_is_closed_the_next_pass_packs_it_whole(tmp_path):
    land(tmp_path, range(1, 21))
    reads = tmp_path / READS
    largest = max(os.path.getsize(f) for f in live_files(reads, OPEN))
    maintainer = DeltaMaintainer(tmp_path, target_file_bytes=BIG, open_file_bytes=2 * largest)
    maintainer.run(NOW)
    assert len(live_files(reads, OPEN)) > 1

    maintainer.run(NOW + 86400)

    assert (len(live_files(reads, CLOSED)), len(live_files(reads, OPEN))) == (1, 1)


def test_the_gateways_transaction_version_survives_optimize_and_older_batches_stay_skipped(
    tmp_path,
):
    writer = land(tmp_path, range(1, 11))
    reads = tmp_path / READS
    DeltaMaintainer(tmp_path, target_file_bytes=BIG, open_file_bytes=BIG).run(NOW)
    assert DeltaTable(reads).transaction_version(APP) == 10
    before, version = keys(tmp_path), DeltaTable(reads).version()

    # The writer that was running (its snapshot updated incrementally) and a restarted one.
    for again in (writer, ArrowTableWriter(None, tmp_path, APP)):
        for batch_id in (10, 4):
            assert again.write_batch(batch_id, {READS: rows(batch_id, OPEN, 5)}) == {READS: 5}
        assert again.last_version(READS) == 10

    assert (keys(tmp_path), DeltaTable(reads).version()) == (before, version)
    writer.write_batch(11, {READS: rows(11, OPEN)})
    assert DeltaTable(reads).transaction_version(APP) == 11
    assert len(keys(tmp_path)) == len(before) + 40


def test_vacuum_without_retention_deletes_the_replaced_files_and_an_orphan_of_a_killed_write(
    tmp_path,
):
    writer = land(tmp_path, range(1, 11))
    reads = tmp_path / READS
    replaced = set(live_files(reads))
    with pytest.raises(Killed):
        ArrowTableWriter(None, tmp_path, APP, checkpoint=kill_at(LANDED_NOT_COMMITTED)).write_batch(
            11, {READS: rows(11, OPEN)}
        )
    (orphan,) = files_on_disk(reads) - replaced
    age([orphan], hours=1)  # the write was killed an hour ago
    writer.write_batch(11, {READS: rows(11, OPEN)})  # the ledger's replay, after the restart
    replaced = set(live_files(reads))
    before = keys(tmp_path)

    result = DeltaMaintainer(
        tmp_path, target_file_bytes=BIG, open_file_bytes=BIG, vacuum_retention_hours=0
    ).run(NOW)

    assert files_on_disk(reads) == set(live_files(reads))
    assert not Path(orphan).exists()
    assert not replaced & files_on_disk(reads)
    assert keys(tmp_path) == before
    assert max(before.values()) == 1 and len(before) == 11 * 40
    assert result.tables[0].files_vacuumed == len(replaced) + 1


def test_within_the_retention_a_reader_of_the_snapshot_before_the_pass_still_finds_its_files(
    tmp_path,
):
    land(tmp_path, range(1, 11))
    reads = tmp_path / READS
    opened = DeltaTable(reads)  # a reader that opened the table before the pass
    before = opened.to_pyarrow_table()

    DeltaMaintainer(
        tmp_path, target_file_bytes=BIG, open_file_bytes=BIG, vacuum_retention_hours=24
    ).run(NOW)

    assert len(live_files(reads)) == 2
    assert opened.to_pyarrow_table().sort_by("id").equals(before.sort_by("id"))
    assert set(opened.file_uris()) <= files_on_disk(reads)


def test_a_pass_writes_a_checkpoint_and_the_next_removes_the_commits_older_than_the_log_retention(
    tmp_path,
):
    short, long = tmp_path / "short", tmp_path / "long"
    for tables_dir, hours in ((short, 1), (long, 48)):
        writer = ArrowTableWriter(
            None, tables_dir, APP, properties=table_properties(log_retention_hours=hours)
        )
        land(tables_dir, range(1, 6), writer)
        first = DeltaMaintainer(tables_dir).run(NOW).tables[0].version
        log = tables_dir / READS / "_delta_log"
        assert (log / f"{first:020d}.checkpoint.parquet").is_file()
        assert (log / "_last_checkpoint").is_file()
        # Two hours later (the log's files say when they were written): a few more batches.
        age(log.iterdir(), hours=2)
        land(tables_dir, range(6, 9), writer)
        DeltaMaintainer(tables_dir).run(NOW)
        kept = sorted(int(p.name[:20]) for p in log.glob("*.json"))
        if hours == 1:
            # Everything before the checkpoint older than the retention is gone; from it on, every
            # version within the retention can still be rebuilt.
            assert kept[0] == first
        else:
            assert kept == list(range(kept[-1] + 1))
        table = DeltaTable(tables_dir / READS)
        assert table.transaction_version(APP) == 8
        assert len(keys(tables_dir)) == 8 * 40
        version = table.version()
        assert writer.write_batch(8, {READS: rows(8, OPEN)}) == {READS: 40}
        assert ArrowTableWriter(None, tables_dir, APP).write_batch(3, {READS: rows(3, OPEN)}) == {
            READS: 40
        }
        assert DeltaTable(tables_dir / READS).version() == version


@pytest.mark.parametrize("log_cleanup", [True, False])
def test_a_writer_whose_passes_clean_the_log_leaves_the_expired_entries_to_them(
    tmp_path, log_cleanup
):
    """delta-rs deletes the expired log entries after every commit, listing the whole log to
    find them; a writer whose own passes do it (the daemon's, with compaction on) leaves them
    to the next pass."""
    writer = ArrowTableWriter(
        None,
        tmp_path,
        APP,
        properties=table_properties(log_retention_hours=1),
        log_cleanup=log_cleanup,
    )
    land(tmp_path, range(1, 6), writer)
    first = DeltaMaintainer(tmp_path).run(NOW).tables[0].version
    log = tmp_path / READS / "_delta_log"
    age(log.iterdir(), hours=2)
    land(tmp_path, range(6, 9), writer)
    commits = sorted(int(p.name[:20]) for p in log.glob("*.json"))
    assert (commits[0] == first) is log_cleanup
    DeltaMaintainer(tmp_path).run(NOW)
    assert min(int(p.name[:20]) for p in log.glob("*.json")) == first
    assert len(keys(tmp_path)) == 8 * 40


def test_a_pass_killed_after_optimize_leaves_every_row_and_the_next_pass_vacuums(tmp_path):
    land(tmp_path, range(1, 11))
    reads = tmp_path / READS
    before = keys(tmp_path)
    replaced = set(live_files(reads))
    killed = DeltaMaintainer(
        tmp_path,
        target_file_bytes=BIG,
        open_file_bytes=BIG,
        vacuum_retention_hours=0,
        checkpoint=kill_at(AFTER_OPTIMIZE_BEFORE_VACUUM),
    )

    with pytest.raises(Killed):
        killed.run(NOW)

    assert len(live_files(reads)) == 2
    assert replaced <= files_on_disk(reads)  # not vacuumed yet
    assert keys(tmp_path) == before
    DeltaMaintainer(tmp_path, vacuum_retention_hours=0).run(NOW)
    assert files_on_disk(reads) == set(live_files(reads))
    assert keys(tmp_path) == before


def test_a_pass_over_a_tables_directory_without_tables_does_nothing(tmp_path):
    (tmp_path / READS).mkdir()  # a directory, but no Delta log: not a table

    result = DeltaMaintainer(tmp_path).run(NOW)

    assert result.tables == ()
    assert result.summary() == "no table yet"
    assert isinstance(result, PassResult)


def test_the_delta_rs_maintainer_refuses_tables_that_are_not_on_this_disk():
    with pytest.raises(ValueError, match="SparkMaintainer"):
        DeltaMaintainer("s3a://bucket/fxgate/tables")


@pytest.mark.spark
def test_the_spark_maintainer_compacts_and_vacuums_keeping_every_row_and_the_transaction(
    spark_session, tmp_path
):
    land(tmp_path, range(1, 11))
    reads = tmp_path / READS
    with pytest.raises(Killed):  # a write killed before its commit, an hour ago
        ArrowTableWriter(None, tmp_path, APP, checkpoint=kill_at(LANDED_NOT_COMMITTED)).write_batch(
            11, {READS: rows(11, OPEN)}
        )
    (orphan,) = files_on_disk(reads) - set(live_files(reads))
    age([orphan], hours=1)
    before = keys(tmp_path)
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    previous = spark_session.conf.get(key, None)
    try:
        # One table: delta-spark's VACUUM alone takes tens of seconds on local[2].
        result = SparkMaintainer(
            spark_session, tmp_path, vacuum_retention_hours=0, tables=(READS,)
        ).run(NOW)
    finally:
        if previous is None:
            spark_session.conf.unset(key)
        else:
            spark_session.conf.set(key, previous)

    assert [(t.table, t.files_removed, t.files_added) for t in result.tables] == [(READS, 10, 2)]
    assert (len(live_files(reads, CLOSED)), len(live_files(reads, OPEN))) == (1, 1)
    assert files_on_disk(reads) == set(live_files(reads))  # replaced files and the orphan gone
    assert keys(tmp_path) == before
    table = DeltaTable(reads)
    assert table.transaction_version(APP) == 10
    assert result.tables[0].version == table.version()
    assert ArrowTableWriter(None, tmp_path, APP).write_batch(7, {READS: rows(7, OPEN)}) == {
        READS: 40
    }
    assert keys(tmp_path) == before
