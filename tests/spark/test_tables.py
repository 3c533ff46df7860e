from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark.tables import (
    DEAD_LETTERS,
    LANDING_PREFIX,
    OVERWRITTEN_PREFIX,
    PARTITION_SCHEMA,
    READS,
    ArrowTableWriter,
    TablesNotReadable,
    TableWriter,
    clean_staging,
    read_table,
    read_table_arrow,
)

pytestmark = pytest.mark.spark

# The two ways a batch is written (spark/tables.py): the contract tests run against both.
WRITERS = pytest.mark.parametrize("writer_class", [TableWriter, ArrowTableWriter])

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
        if path.name.startswith((".spark-staging", LANDING_PREFIX, OVERWRITTEN_PREFIX))
        or path.name == "_temporary"
    )


@WRITERS
def test_replaying_a_batch_replaces_its_rows_and_leaves_other_batches_alone(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path)
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


@WRITERS
def test_two_batches_on_two_dates_are_both_present_and_both_readers_see_the_same_ids(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path)
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


@WRITERS
def test_a_write_leaves_no_staging_or_temporary_directory_behind(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path)
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


@WRITERS
def test_an_empty_table_writes_no_rows_and_raises_nothing(spark_session, tmp_path, writer_class):
    empty = reads([])

    written = writer_class(spark_session, tmp_path).write_batch(
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


@WRITERS
def test_timestamps_and_integer_types_round_trip_through_the_non_spark_reader(
    spark_session, tmp_path, writer_class
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

    writer_class(spark_session, tmp_path).write_batch(6, {READS: table})
    back = read_table_arrow(tmp_path, READS).sort_by("i8")

    # Observed: every type comes back unchanged, the partition columns last.
    assert back.schema.remove_metadata() == pa.schema([*table.schema, ("batch_id", pa.int64())])
    assert back.select(list(columns)).to_pydict() == {k: v.to_pylist() for k, v in columns.items()}
    spark_row = read_table(spark_session, tmp_path, READS).orderBy("i8").first()
    assert spark_row.ts == stamp.replace(tzinfo=None)  # Spark hands back naive UTC here
    assert spark_row.i64 == -(2**63)


@WRITERS
def test_a_batch_id_column_is_added_when_missing_and_must_match_when_present(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path)
    with_ids = reads([1]).append_column("batch_id", pa.array([7], pa.int32()))

    writer.write_batch(7, {READS: with_ids})
    with pytest.raises(ValueError, match="batch_id"):
        writer.write_batch(8, {READS: with_ids})

    assert rows_by_batch(tmp_path) == {7: [(1, "first-1")]}


@WRITERS
def test_a_bad_table_is_rejected_before_any_table_of_the_batch_is_written(
    spark_session, tmp_path, writer_class
):
    no_date = reads([2]).drop_columns(["date"])
    bad_date = reads([3], date="21/11/2026")
    writer = writer_class(spark_session, tmp_path)

    with pytest.raises(ValueError, match="'date' column"):
        writer.write_batch(1, {DEAD_LETTERS: reads([1]), READS: no_date})
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        writer.write_batch(1, {DEAD_LETTERS: reads([1]), READS: bad_date})

    assert not (tmp_path / DEAD_LETTERS).exists()


def fx9600_batch(batch_id: int, messages: int = 4):
    """A real batch's tables (spark.schema.build_batch): FX9600 reads, one of them batched, and
    one malformed message, so that every column type of `reads` and `dead_letters` is there."""
    from actors.devtools.simulate import TagEventGenerator
    from persistence.records import LedgerRecord
    from spark.schema import build_batch

    generator = TagEventGenerator("fx9600-01", wall=lambda: 1.79e9)
    payloads = [generator.next_payload(3 if i == 0 else 1) for i in range(messages)]
    records = [
        LedgerRecord(
            seq=batch_id * 100 + i,
            message_key=f"{batch_id * 100 + i:032x}",
            topic="zebra/fx/fx9600-01/reads",
            payload=payload,
            qos=1,
            received_time=1.79e9,
            pack_id=batch_id,
        )
        for i, payload in enumerate([*payloads, b"{not json"])
    ]
    return build_batch(records, batch_id)


def test_spark_reads_the_arrow_writers_files_with_the_types_of_its_own(spark_session, tmp_path):
    spark_dir, arrow_dir, mixed_dir = tmp_path / "spark", tmp_path / "arrow", tmp_path / "mixed"
    first, second = fx9600_batch(1), fx9600_batch(2)
    for writer, _directory in (
        (TableWriter(spark_session, spark_dir), spark_dir),
        (ArrowTableWriter(spark_session, arrow_dir), arrow_dir),
    ):
        writer.write_batch(1, {READS: first.reads, DEAD_LETTERS: first.dead_letters})
    # One table with batches of both kinds: the daemon's tables after a change of master.
    TableWriter(spark_session, mixed_dir).write_batch(1, {READS: first.reads})
    ArrowTableWriter(spark_session, mixed_dir).write_batch(2, {READS: second.reads})

    for name in (READS, DEAD_LETTERS):
        by_spark = read_table(spark_session, spark_dir, name)
        by_arrow = read_table(spark_session, arrow_dir, name)
        assert by_arrow.dtypes == by_spark.dtypes
        assert sorted(by_arrow.collect()) == sorted(by_spark.collect())
        assert read_table_arrow(arrow_dir, name).schema.remove_metadata() == (
            read_table_arrow(spark_dir, name).schema.remove_metadata()
        )
    mixed = read_table(spark_session, mixed_dir, READS)
    assert mixed.dtypes == read_table(spark_session, spark_dir, READS).dtypes
    assert mixed.count() == first.reads.num_rows + second.reads.num_rows == 12
    assert sorted(read_table_arrow(mixed_dir, READS).column("message_id").to_pylist()) == sorted(
        first.reads.column("message_id").to_pylist() + second.reads.column("message_id").to_pylist()
    )


def test_a_kill_between_the_swaps_renames_hides_the_batch_until_its_replay_heals_it(
    spark_session, tmp_path, monkeypatch
):
    writer = ArrowTableWriter(spark_session, tmp_path)
    writer.write_batch(1, {READS: reads([1, 2], date=DAY_1)})
    writer.write_batch(2, {READS: reads([5], date=DAY_1)})
    renames = []
    real_rename = type(tmp_path).rename

    def killed_after_the_first(self, target):
        if renames:
            raise SystemExit("killed")  # stands in for the SIGKILL: nothing after it runs
        renames.append(target)
        return real_rename(self, target)

    monkeypatch.setattr(type(tmp_path), "rename", killed_after_the_first)
    with pytest.raises(SystemExit):
        writer.write_batch(1, {READS: reads([1, 2], date=DAY_1, payload="replay")})
    monkeypatch.undo()

    # The old partition is aside and the new one staged: neither reader sees batch 1.
    assert renames[0].name.startswith(OVERWRITTEN_PREFIX)
    assert rows_by_batch(tmp_path) == {2: [(5, "first-5")]}
    assert sorted(r.id for r in read_table(spark_session, tmp_path, READS).collect()) == [5]
    assert len(clean_staging(tmp_path)) == 2
    assert leftovers(tmp_path) == []

    writer.write_batch(1, {READS: reads([1, 2], date=DAY_1, payload="replay")})
    assert rows_by_batch(tmp_path) == {
        1: [(1, "replay-1"), (2, "replay-2")],
        2: [(5, "first-5")],
    }


def test_the_arrow_writer_leaves_its_files_synced_one_per_date_and_partition(
    spark_session, tmp_path
):
    table = pa.concat_tables([reads([1, 2], date=DAY_1), reads([3], date=DAY_2)])

    ArrowTableWriter(spark_session, tmp_path).write_batch(4, {READS: table})

    files = sorted(p.relative_to(tmp_path / READS) for p in (tmp_path / READS).rglob("*.parquet"))
    assert [str(p.parent) for p in files] == [
        f"date={DAY_1}/batch_id=4",
        f"date={DAY_2}/batch_id=4",
    ]
    # No partition column inside the files: the path holds them, as in Spark's files.
    assert pq.read_schema(tmp_path / READS / files[0]).names == ["id", "payload"]


def test_the_arrow_writer_refuses_tables_that_are_not_on_this_disk(spark_session):
    with pytest.raises(TablesNotReadable, match="not on this machine's disk"):
        ArrowTableWriter(spark_session, "hdfs://namenode/fxgate/tables")


def test_a_write_that_fails_leaves_the_old_partition_in_place_and_nothing_staged(
    spark_session, tmp_path, monkeypatch
):
    writer = ArrowTableWriter(spark_session, tmp_path)
    writer.write_batch(1, {READS: reads([1, 2], date=DAY_1)})
    real_rename = type(tmp_path).rename
    calls = []

    def refused_into_place(self, target):
        calls.append(target)
        if len(calls) == 2:  # the staged partition into place (the first moved the old aside)
            raise OSError(13, "Permission denied")
        return real_rename(self, target)

    monkeypatch.setattr(type(tmp_path), "rename", refused_into_place)
    with pytest.raises(OSError, match="Permission denied"):
        writer.write_batch(1, {READS: reads([1, 2], date=DAY_1, payload="replay")})
    monkeypatch.undo()

    assert rows_by_batch(tmp_path) == {1: [(1, "first-1"), (2, "first-2")]}
    assert leftovers(tmp_path) == []
