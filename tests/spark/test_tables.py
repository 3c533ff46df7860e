from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark.tables import (
    DEAD_LETTERS,
    PARTITION_SCHEMA,
    READS,
    TableWriter,
    clean_staging,
    read_table,
    read_table_arrow,
)

pytestmark = pytest.mark.spark

DAY_1 = "2026-11-21"
DAY_2 = "2026-11-22"


def reads(ids: list[int], date: str = DAY_1, payload: str = "first") -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "payload": pa.array([f"{payload}-{i}" for i in ids], pa.string()),
            "date": pa.array([date] * len(ids), pa.string()),
        }
    )


def rows_by_batch(tables_dir, name: str = READS) -> dict[int, list[tuple[int, str]]]:
    table = read_table_arrow(tables_dir, name).sort_by("id")
    found: dict[int, list[tuple[int, str]]] = {}
    for row in table.to_pylist():
        found.setdefault(row["batch_id"], []).append((row["id"], row["payload"]))
    return found


def leftovers(tables_dir) -> list[str]:
    return sorted(
        str(path.relative_to(tables_dir))
        for path in tables_dir.rglob("*")
        if path.name.startswith(".spark-staging") or path.name == "_temporary"
    )


def test_replaying_a_batch_replaces_its_rows_and_leaves_other_batches_alone(
    spark_session, tmp_path
):
    writer = TableWriter(spark_session, tmp_path)
    writer.write_batch(1, {READS: reads([1, 2, 3, 4, 5])})
    writer.write_batch(2, {READS: reads([10, 11], payload="other")})

    written = writer.write_batch(1, {READS: reads([1, 2, 3, 4, 5], payload="replay")})

    assert written == {READS: 5}
    assert rows_by_batch(tmp_path) == {
        1: [(i, f"replay-{i}") for i in (1, 2, 3, 4, 5)],
        2: [(10, "other-10"), (11, "other-11")],
    }
    assert read_table(spark_session, tmp_path, READS).count() == 7


def test_a_replay_stays_dynamic_when_the_session_default_was_switched_to_static(
    spark_session, tmp_path
):
    writer = TableWriter(spark_session, tmp_path)
    writer.write_batch(1, {READS: reads([1, 2])})
    key = "spark.sql.sources.partitionOverwriteMode"
    spark_session.conf.set(key, "static")
    try:
        writer.write_batch(2, {READS: reads([3])})
    finally:
        spark_session.conf.set(key, "dynamic")

    assert sorted(rows_by_batch(tmp_path)) == [1, 2]


def test_two_batches_on_two_dates_are_both_present_and_both_readers_see_the_same_ids(
    spark_session, tmp_path
):
    writer = TableWriter(spark_session, tmp_path)
    writer.write_batch(3, {READS: reads([1, 2, 3], date=DAY_1)})
    writer.write_batch(4, {READS: reads([4, 5], date=DAY_2)})

    arrow = read_table_arrow(tmp_path, READS)
    spark = read_table(spark_session, tmp_path, READS)

    spark_rows = sorted((r.id, r.date, r.batch_id) for r in spark.collect())
    arrow_rows = sorted(
        zip(*(arrow.column(c).to_pylist() for c in ("id", "date", "batch_id")), strict=True)
    )
    assert spark_rows == arrow_rows
    assert spark_rows == [
        (1, DAY_1, 3),
        (2, DAY_1, 3),
        (3, DAY_1, 3),
        (4, DAY_2, 4),
        (5, DAY_2, 4),
    ]
    assert arrow.schema.field("date").type == pa.string()
    assert arrow.schema.field("batch_id").type == pa.int64()
    assert dict(spark.dtypes)["date"] == "string"
    assert dict(spark.dtypes)["batch_id"] == "bigint"


def test_a_write_leaves_no_staging_or_temporary_directory_behind(spark_session, tmp_path):
    writer = TableWriter(spark_session, tmp_path)
    writer.write_batch(1, {READS: reads([1, 2], date=DAY_1), DEAD_LETTERS: reads([9], DAY_2)})
    writer.write_batch(1, {READS: reads([1, 2], date=DAY_1), DEAD_LETTERS: reads([9], DAY_2)})

    assert (tmp_path / READS / f"date={DAY_1}" / "batch_id=1").is_dir()
    assert (tmp_path / DEAD_LETTERS / f"date={DAY_2}" / "batch_id=1").is_dir()
    assert leftovers(tmp_path) == []


def test_leftovers_of_a_killed_job_are_ignored_by_both_readers_and_removed_by_clean_staging(
    spark_session, tmp_path
):
    TableWriter(spark_session, tmp_path).write_batch(1, {READS: reads([1, 2])})
    orphan = reads([100, 101]).drop_columns(["date"])
    # The shape a SIGKILL of Python and JVM left (see spark/tables.py), and Hadoop's
    # plain committer directory at the table root.
    staging = tmp_path / READS / ".spark-staging-0f6e"
    attempt = staging / "_temporary/0/_temporary/attempt_1_0001_m_000000_2"
    temporary = tmp_path / READS / "_temporary"
    for directory in (
        attempt / f"date={DAY_1}/batch_id=2",
        temporary / f"0/date={DAY_1}/batch_id=3",
    ):
        directory.mkdir(parents=True)
        pq.write_table(orphan, directory / "part-00000-orphan.c000.snappy.parquet")

    assert sorted(read_table_arrow(tmp_path, READS).column("id").to_pylist()) == [1, 2]
    assert sorted(r.id for r in read_table(spark_session, tmp_path, READS).collect()) == [1, 2]

    assert clean_staging(tmp_path) == sorted([staging, temporary])
    assert leftovers(tmp_path) == []
    assert clean_staging(tmp_path) == []
    assert sorted(read_table_arrow(tmp_path, READS).column("id").to_pylist()) == [1, 2]


def test_an_empty_table_writes_no_rows_and_raises_nothing(spark_session, tmp_path):
    empty = reads([])

    written = TableWriter(spark_session, tmp_path).write_batch(
        5, {DEAD_LETTERS: empty, READS: reads([1])}
    )

    assert written == {DEAD_LETTERS: 0, READS: 1}
    assert not (tmp_path / DEAD_LETTERS).exists()
    assert read_table_arrow(tmp_path, DEAD_LETTERS).num_rows == 0
    assert read_table(spark_session, tmp_path, DEAD_LETTERS).count() == 0
    assert read_table_arrow(tmp_path, READS).num_rows == 1


def test_an_absent_table_reads_as_an_empty_table_with_the_schema_asked_for(spark_session, tmp_path):
    schema = pa.schema([("id", pa.int64())]).append(PARTITION_SCHEMA.field(0))

    assert read_table_arrow(tmp_path, READS).schema == PARTITION_SCHEMA
    assert read_table_arrow(tmp_path, READS, schema=schema) == schema.empty_table()
    df = read_table(spark_session, tmp_path, READS, schema=schema)
    assert df.columns == ["id", "date"]
    assert df.count() == 0


def test_a_table_holding_only_a_killed_first_write_reads_as_empty(spark_session, tmp_path):
    attempt = tmp_path / READS / ".spark-staging-0f6e/_temporary/0/_temporary/attempt_1"
    (attempt / f"date={DAY_1}/batch_id=1").mkdir(parents=True)
    pq.write_table(reads([1]), attempt / f"date={DAY_1}/batch_id=1/part-00000.parquet")

    assert read_table_arrow(tmp_path, READS).num_rows == 0
    assert read_table(spark_session, tmp_path, READS).count() == 0


def test_timestamps_and_integer_types_round_trip_through_the_non_spark_reader(
    spark_session, tmp_path
):
    stamp = datetime(2026, 11, 21, 23, 59, 59, 123456, tzinfo=UTC)
    columns = {
        "s": pa.array(["a", None], pa.string()),
        "i8": pa.array([-128, 127], pa.int8()),
        "i16": pa.array([-32768, 32767], pa.int16()),
        "i32": pa.array([-(2**31), 2**31 - 1], pa.int32()),
        "i64": pa.array([-(2**63), 2**63 - 1], pa.int64()),
        "f64": pa.array([0.1, None], pa.float64()),
        "ts": pa.array([stamp, None], pa.timestamp("us", tz="UTC")),
        "b": pa.array([b"\x00\xff", b""], pa.binary()),
    }
    table = pa.table({**columns, "date": [DAY_1, DAY_1]})

    TableWriter(spark_session, tmp_path).write_batch(6, {READS: table})
    back = read_table_arrow(tmp_path, READS).sort_by("i8")

    # Observed: every type comes back unchanged, the partition columns last.
    assert back.schema.remove_metadata() == pa.schema([*table.schema, ("batch_id", pa.int64())])
    assert back.select(list(columns)).to_pydict() == {k: v.to_pylist() for k, v in columns.items()}
    spark_row = read_table(spark_session, tmp_path, READS).orderBy("i8").first()
    assert spark_row.ts == stamp.replace(tzinfo=None)  # Spark hands back naive UTC here
    assert spark_row.i64 == -(2**63)


def test_a_batch_id_column_is_added_when_missing_and_must_match_when_present(
    spark_session, tmp_path
):
    writer = TableWriter(spark_session, tmp_path)
    with_ids = reads([1]).append_column("batch_id", pa.array([7], pa.int32()))

    writer.write_batch(7, {READS: with_ids})
    with pytest.raises(ValueError, match="batch_id"):
        writer.write_batch(8, {READS: with_ids})

    assert rows_by_batch(tmp_path) == {7: [(1, "first-1")]}


def test_a_bad_table_is_rejected_before_any_table_of_the_batch_is_written(spark_session, tmp_path):
    no_date = reads([2]).drop_columns(["date"])
    bad_date = reads([3], date="21/11/2026")
    writer = TableWriter(spark_session, tmp_path)

    with pytest.raises(ValueError, match="'date' column"):
        writer.write_batch(1, {DEAD_LETTERS: reads([1]), READS: no_date})
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        writer.write_batch(1, {DEAD_LETTERS: reads([1]), READS: bad_date})

    assert not (tmp_path / DEAD_LETTERS).exists()
