"""The tables' read lock (spark/readlock.py): a reader holding it never sees a compaction swap
half way through its listing, and the swap and the readers each give up in time.

Without the lock, the same loop as the first test (the date swapped to and fro while pyarrow
and DuckDB read) gave answers with a date's rows missing and no error, in about one read in
ten: both pass over a directory that vanished between listing its parent and listing it.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from spark.compaction import exchange
from spark.readlock import SWAP_LOCK_FILE, TablesBusy, reading, swapping

BATCHES = 40
ROWS = 5


def write(directory: Path, ids: list[str]) -> None:
    directory.mkdir(parents=True)
    pq.write_table(pa.table({"message_id": ids}), directory / "part-00000.parquet")


@pytest.fixture
def tables(tmp_path) -> Path:
    """`reads` with a date of 40 landing batches, the same rows compacted into one staged
    directory beside it, and a second date that never changes."""
    table = tmp_path / "reads"
    ids = [f"m{b}-{i}" for b in range(BATCHES) for i in range(ROWS)]
    for b in range(BATCHES):
        write(table / "date=2026-11-20" / f"batch_id={b + 1}", ids[b * ROWS : (b + 1) * ROWS])
    write(table / ".compacting-date=2026-11-20-batch_id=1000000000000001" / "batch_id=1", ids)
    write(table / "date=2026-11-21" / "batch_id=41", ["other"])
    return tmp_path


def arrow_ids(tables_dir: Path) -> Counter:
    dataset = ds.dataset(tables_dir / "reads", partitioning="hive")
    return Counter(dataset.to_table(columns=["message_id"]).column(0).to_pylist())


def duckdb_ids(tables_dir: Path, con) -> Counter:
    glob = f"{tables_dir / 'reads'}/date=*/batch_id=*/*.parquet"
    query = f"SELECT message_id FROM read_parquet('{glob}', hive_partitioning=true)"
    return Counter(r[0] for r in con.execute(query).fetchall())


def test_readers_holding_the_lock_see_every_row_once_while_a_date_is_swapped_to_and_fro(tables):
    expected = arrow_ids(tables)
    assert sum(expected.values()) == BATCHES * ROWS + 1
    staged = next((tables / "reads").glob(".compacting-*"))
    date_dir = tables / "reads" / "date=2026-11-20"
    stop = threading.Event()
    swaps = Counter()
    wrong: list[str] = []
    done = Counter()
    con = duckdb.connect()

    def swapper():
        while not stop.is_set():
            with swapping(tables, wait_seconds=5) as held:
                if held:
                    assert exchange(staged, date_dir)
                    swaps["made"] += 1
                else:
                    swaps["gave up"] += 1

    def read_loop(name, read, times):
        for _ in range(times):
            with reading(tables):
                ids = read()
            if ids != expected:
                wrong.append(f"{name}: {sum(expected.values()) - sum(ids.values())} rows short")
            done[name] += 1

    threads = [
        threading.Thread(target=read_loop, args=("arrow", lambda: arrow_ids(tables), 150)),
        threading.Thread(target=read_loop, args=("duckdb", lambda: duckdb_ids(tables, con), 150)),
    ]
    swap_thread = threading.Thread(target=swapper)
    swap_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    swap_thread.join(timeout=30)
    assert done == {"arrow": 150, "duckdb": 150}
    assert wrong == []
    # The readers did not simply hold the swap off: it went to and fro between their reads.
    assert swaps["made"] >= 50, swaps


def test_a_swap_waits_for_a_reader_and_gives_up_when_the_reader_outlasts_its_wait(tables):
    with reading(tables), swapping(tables, wait_seconds=0.05) as held:
        assert held is False
    with swapping(tables, wait_seconds=0.05) as held:
        assert held is True


def test_a_reader_gives_up_with_tables_busy_when_a_swap_outlasts_its_wait(tables):
    with swapping(tables, wait_seconds=0) as held:
        assert held
        busy = pytest.raises(TablesBusy, match=r"\.swap\.lock was held for a compaction swap")
        with busy, reading(tables, wait_seconds=0.05):
            pass
        # Readers share the lock with one another, never with a swap.
    with reading(tables, wait_seconds=0), reading(tables, wait_seconds=0):
        pass


def test_the_lock_file_is_hidden_from_readers_and_remote_tables_need_none(tables):
    with reading(tables):
        pass
    assert (tables / SWAP_LOCK_FILE).exists()
    assert sum(arrow_ids(tables).values()) == BATCHES * ROWS + 1
    with reading("hdfs://namenode:8020/fxgate/tables", wait_seconds=0):
        pass  # nothing to lock there: compaction never runs on remote tables


def test_a_reader_of_a_tables_directory_it_cannot_write_reads_without_the_lock(tmp_path):
    missing = tmp_path / "not-there"
    with reading(missing, wait_seconds=0):
        pass
    assert not missing.exists()
