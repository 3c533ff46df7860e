from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from spark.compaction import (
    COMPACTED_BASE,
    LANDING_BATCH_ID,
    MARKER,
    CompactionBusy,
    CompactionLock,
    Compactor,
    absorbed_dates,
    batch_dirs,
    closed_before,
    lock_holder,
    read_marker,
    without_absorbed,
)
from spark.readlock import reading
from spark.schema import READS_SCHEMA
from spark.tables import READS, TableWriter, read_table
from tests.spark.compaction_data import land_day, reads_rows

pytestmark = pytest.mark.spark

DAYS = ["2026-11-20", "2026-11-21", "2026-11-22"]


def spark_ids(session, tables_dir: Path) -> Counter:
    df = read_table(session, tables_dir, READS)
    return Counter(r.message_id for r in df.select("message_id").collect())


def arrow_ids(tables_dir: Path) -> Counter:
    dataset = ds.dataset(tables_dir / READS, partitioning="hive")
    return Counter(dataset.to_table(columns=["message_id"]).column(0).to_pylist())


def duckdb_ids(tables_dir: Path, con=None) -> Counter:
    con = con or duckdb.connect()
    glob = f"{tables_dir / READS}/date=*/batch_id=*/*.parquet"
    rows = con.execute(
        f"SELECT message_id FROM read_parquet('{glob}', hive_partitioning=true, union_by_name=true)"
    ).fetchall()
    return Counter(r[0] for r in rows)


def visible_files(table_dir: Path) -> list[Path]:
    return sorted(table_dir.glob("date=*/batch_id=*/*.parquet"))


def test_five_hundred_small_batches_become_one_file_per_date_with_every_row_once_for_every_reader(
    spark_session, tmp_path
):
    table_dir = tmp_path / READS
    rows = land_day(table_dir, DAYS, batches=500, rows=20)
    # Three more batches through Spark itself, one on each date.
    writer = TableWriter(spark_session, tmp_path)
    for index, day in enumerate(DAYS):
        writer.write_batch(501 + index, {READS: reads_rows(501 + index, day, 10, rows + 1)})
        rows += 10
    expected = Counter(f"m{s}" for s in range(1, rows + 1))
    before = {
        "spark": spark_ids(spark_session, tmp_path),
        "arrow": arrow_ids(tmp_path),
        "duckdb": duckdb_ids(tmp_path),
    }
    assert all(ids == expected for ids in before.values())
    assert len(list(table_dir.glob("date=*/batch_id=*"))) == 503

    result = Compactor(spark_session, tmp_path, wall=lambda: 1_000.0).run(closed_before=None)

    assert [(c.date, c.partitions, c.files, c.rows) for c in result.compacted] == [
        (DAYS[0], 168, 1, 3350),
        (DAYS[1], 168, 1, 3350),
        (DAYS[2], 167, 1, 3330),
    ]
    partitions = sorted(p.relative_to(table_dir).as_posix() for p in table_dir.glob("date=*/*"))
    assert partitions == [f"date={d}/batch_id={COMPACTED_BASE + 1}" for d in DAYS]
    assert len(visible_files(table_dir)) == 3
    assert spark_ids(spark_session, tmp_path) == expected
    assert arrow_ids(tmp_path) == expected
    assert duckdb_ids(tmp_path) == expected
    # Each row keeps its landing batch; the files hold the table's current columns.
    df = read_table(spark_session, tmp_path, READS)
    landing = {r.message_id: r[LANDING_BATCH_ID] for r in df.collect()}
    assert landing["m1"] == 1 and landing[f"m{rows}"] == 503
    assert [f.name for f in READS_SCHEMA if f.name not in ("date", "batch_id")] == [
        c for c in df.columns if c not in ("date", "batch_id", LANDING_BATCH_ID)
    ]
    # Date pruning is kept: one date is one directory.
    assert df.filter("date = '2026-11-21'").count() == 3350
    marker = read_marker(table_dir / f"date={DAYS[0]}" / f"batch_id={COMPACTED_BASE + 1}")
    assert marker["absorbed"] == [[1, 167], [501, 501]] and marker["rows"] == 3350


def test_a_date_bigger_than_the_target_becomes_files_of_consecutive_batch_runs(
    spark_session, tmp_path
):
    """One Spark job per output file, each over a run of consecutive batches about the target
    size: what a pass holds in memory does not grow with the day."""
    table_dir = tmp_path / READS
    rows = land_day(table_dir, DAYS[:1], batches=40, rows=20)
    batch_bytes = max(f.stat().st_size for f in visible_files(table_dir))
    compactor = Compactor(spark_session, tmp_path, target_file_bytes=10 * batch_bytes)
    (done,) = compactor.run(closed_before=None).compacted
    assert done.partitions == 40 and 4 <= done.files <= 5
    runs = []
    for path in visible_files(table_dir):
        landing = pq.read_table(path, columns=[LANDING_BATCH_ID]).column(0).to_pylist()
        runs.append((min(landing), max(landing), len(set(landing))))
    # Each file holds whole batches of one run, the runs do not overlap, and they cover 1-40.
    runs.sort()
    assert all(last - first + 1 == count for first, last, count in runs)
    assert [r[0] for r in runs[1:]] == [r[1] + 1 for r in runs[:-1]]
    assert runs[0][0] == 1 and runs[-1][1] == 40
    expected = Counter(f"m{s}" for s in range(1, rows + 1))
    assert arrow_ids(tmp_path) == expected == duckdb_ids(tmp_path)
    assert spark_ids(spark_session, tmp_path) == expected


def test_a_second_pass_takes_late_batches_into_a_new_compacted_directory_and_keeps_what_it_had(
    spark_session, tmp_path
):
    table_dir = tmp_path / READS
    land_day(table_dir, DAYS[:1], batches=10, rows=5)
    compactor = Compactor(spark_session, tmp_path, wall=lambda: 1_000.0, grace_seconds=10)
    compactor.run(closed_before=None)
    land_day(table_dir, DAYS[:1], batches=2, rows=5, first=11)  # seqs 1-10 again: new ids below
    result = compactor.run(closed_before=None)

    (done,) = result.compacted
    assert done.partitions == 3 and done.batch_id == COMPACTED_BASE + 2
    marker = read_marker(table_dir / f"date={DAYS[0]}" / f"batch_id={COMPACTED_BASE + 2}")
    assert marker["absorbed"] == [[1, 12]]
    assert sum(arrow_ids(tmp_path).values()) == 60
    # Nothing to do the third time.
    assert Compactor(spark_session, tmp_path).run(closed_before=None).compacted == []


def test_only_dates_before_the_closed_boundary_and_without_an_open_batch_are_compacted(
    spark_session, tmp_path
):
    table_dir = tmp_path / READS
    land_day(table_dir, DAYS, batches=9, rows=3)  # batches 1-3, 4-6, 7-9 on the three days

    result = Compactor(spark_session, tmp_path).run(closed_before=DAYS[2], exclude_batches={5})

    assert [c.date for c in result.compacted] == [DAYS[0]]
    assert [(s[1], s[2]) for s in result.skipped] == [
        (DAYS[1], "batch(es) [[5, 5]] not committed yet")
    ]
    assert sorted(batch_dirs(table_dir / f"date={DAYS[1]}")) == [4, 5, 6]
    assert sorted(batch_dirs(table_dir / f"date={DAYS[2]}")) == [7, 8, 9]


def test_the_closed_boundary_is_today_or_the_date_of_the_oldest_row_the_ledger_still_owes():
    day = 86_400.0
    now = 20_000 * day + 3_600  # 2024-10-04 01:00 UTC
    assert closed_before(now, None) == "2024-10-04"
    assert closed_before(now, now - 2 * day) == "2024-10-02"
    assert closed_before(now, now - 60) == "2024-10-04"


def test_old_partitions_are_rewritten_into_the_current_schema(spark_session, tmp_path):
    table_dir = tmp_path / READS
    old = reads_rows(1, DAYS[0], 4, 1).drop_columns(["seq", "date", "batch_id"])  # before `seq`
    directory = table_dir / f"date={DAYS[0]}" / "batch_id=1"
    directory.mkdir(parents=True)
    pq.write_table(old, directory / "part-00000.parquet")
    land_day(table_dir, DAYS[:1], batches=1, rows=2, first=2)

    Compactor(spark_session, tmp_path).run(closed_before=None)

    (file,) = visible_files(table_dir)
    schema = pq.read_schema(file)
    assert "seq" in schema.names and schema.field("seq").type == pa.int64()
    assert schema.field("event_time").type == pa.timestamp("us", tz="UTC")
    table = ds.dataset(table_dir, partitioning="hive").to_table().sort_by("message_id")
    seqs = sorted(table.column("seq").to_pylist(), key=lambda v: (v is not None, v or 0))
    assert seqs == [None, None, None, None, 1, 2]


def test_a_replayed_batch_whose_date_was_compacted_lands_nothing_twice(spark_session, tmp_path):
    writer = TableWriter(spark_session, tmp_path)
    first = reads_rows(1, DAYS[0], 5, 1)
    replayed = pa.concat_tables([first, reads_rows(1, DAYS[1], 3, 6)])
    writer.write_batch(1, {READS: replayed})  # the job ran; the ledger never heard (a kill)
    writer.write_batch(2, {READS: reads_rows(2, DAYS[0], 5, 100)})
    Compactor(spark_session, tmp_path).run(closed_before=DAYS[1])  # batch 1 taken in on day 0

    tables, absorbed = without_absorbed(tmp_path, 1, {READS: replayed})
    writer.write_batch(1, tables)

    assert absorbed == {READS: {DAYS[0]}}
    assert absorbed_dates(tmp_path, 2, [READS]) == {READS: {DAYS[0]}}
    assert absorbed_dates(tmp_path, 3, [READS]) == {}
    expected = Counter([*(f"m{s}" for s in range(1, 9)), *(f"m{s}" for s in range(100, 105))])
    assert spark_ids(spark_session, tmp_path) == expected
    assert arrow_ids(tmp_path) == expected
    assert duckdb_ids(tmp_path) == expected


def test_replaced_directories_stay_for_the_grace_period_then_go(spark_session, tmp_path):
    table_dir = tmp_path / READS
    land_day(table_dir, DAYS[:1], batches=3, rows=2)
    now = [1_000.0]
    compactor = Compactor(spark_session, tmp_path, wall=lambda: now[0], grace_seconds=600)
    compactor.run(closed_before=None)
    (replaced,) = [p for p in table_dir.iterdir() if p.name.startswith(".replaced-")]
    assert sorted(batch_dirs(replaced)) == [1, 2, 3]

    now[0] += 599
    assert compactor.run(closed_before=None).removed == 0 and replaced.exists()
    now[0] += 1
    assert compactor.run(closed_before=None).removed == 1 and not replaced.exists()


def test_readers_in_a_loop_during_a_pass_never_see_a_row_twice_or_a_row_missing(
    spark_session, tmp_path
):
    """pyarrow and DuckDB read in a loop on their own thread under the tables' read lock (they
    start no JVM and read in tens of milliseconds, so many reads fall inside the pass); Spark
    reads before and after (its session is the one compacting: a reader thread on it would
    queue behind the pass). Every read returns each row exactly once, and none fails: the lock
    keeps the swaps out of their listings (tests/spark/test_readlock.py shows it for many)."""
    table_dir = tmp_path / READS
    rows = land_day(table_dir, DAYS, batches=300, rows=10)
    expected = Counter(f"m{s}" for s in range(1, rows + 1))
    assert spark_ids(spark_session, tmp_path) == expected
    stop = threading.Event()
    outcomes: Counter = Counter()
    wrong: list[str] = []

    def read_loop(name, read):
        while not stop.is_set():
            try:
                with reading(tmp_path):
                    ids = read()
            except (OSError, duckdb.IOException) as error:
                wrong.append(f"{name}: {error}")
                continue
            if ids == expected:
                outcomes[(name, "exact")] += 1
            else:
                dup = sum(1 for v in ids.values() if v > 1)
                wrong.append(f"{name}: {dup} duplicated, {len(expected - ids)} missing")

    con = duckdb.connect()
    threads = [
        threading.Thread(target=read_loop, args=("arrow", lambda: arrow_ids(tmp_path))),
        threading.Thread(target=read_loop, args=("duckdb", lambda: duckdb_ids(tmp_path, con))),
    ]
    for t in threads:
        t.start()
    try:
        result = Compactor(spark_session, tmp_path).run(closed_before=None)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert len(result.compacted) == 3
    assert wrong == [], outcomes
    assert outcomes[("arrow", "exact")] > 0 and outcomes[("duckdb", "exact")] > 0
    assert spark_ids(spark_session, tmp_path) == expected
    assert arrow_ids(tmp_path) == expected == duckdb_ids(tmp_path)


def test_a_date_whose_readers_hold_the_read_lock_past_the_wait_is_left_for_the_next_pass(
    spark_session, tmp_path
):
    land_day(tmp_path / READS, DAYS[:1], batches=5, rows=4)
    expected = arrow_ids(tmp_path)
    compactor = Compactor(spark_session, tmp_path, swap_wait_seconds=0.05)
    with reading(tmp_path):  # a long query by a reader that holds the lock
        result = compactor.run(closed_before=None)
        assert result.compacted == []
        assert result.skipped == [(READS, DAYS[0], "readers held the tables' read lock for 0.05 s")]
        # Nothing half made is left, and the date is as it was.
        assert list((tmp_path / READS).glob(".*")) == []
        assert len(list((tmp_path / READS).glob("date=*/batch_id=*"))) == 5
        assert arrow_ids(tmp_path) == expected
    (done,) = compactor.run(closed_before=None).compacted
    assert done.partitions == 5
    assert arrow_ids(tmp_path) == expected == duckdb_ids(tmp_path)


def test_one_process_holds_the_compaction_lock_and_says_who_it_is(tmp_path):
    assert lock_holder(tmp_path) is None
    with CompactionLock(tmp_path, "daemon"):
        holder = lock_holder(tmp_path)
        assert holder["role"] == "daemon" and isinstance(holder["pid"], int)
        with pytest.raises(CompactionBusy, match="daemon"):
            CompactionLock(tmp_path, "command").acquire()
    assert lock_holder(tmp_path) is None
    CompactionLock(tmp_path, "command").acquire().release()


def test_the_marker_is_hidden_from_every_reader(spark_session, tmp_path):
    land_day(tmp_path / READS, DAYS[:1], batches=2, rows=2)
    Compactor(spark_session, tmp_path).run(closed_before=None)
    (directory,) = (tmp_path / READS).glob("date=*/batch_id=*")
    assert (directory / MARKER).exists()
    assert sum(arrow_ids(tmp_path).values()) == 4 == sum(duckdb_ids(tmp_path).values())
