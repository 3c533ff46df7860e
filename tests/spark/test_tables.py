"""The contract of both table writers (spark/tables.py): Delta tables partitioned by `date`,
exactly once through the log's transaction identifier (application id, batch id), and readable
the same by every Delta reader: delta-rs, Spark `format("delta")` and DuckDB's delta extension."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from spark.location import spark_uri
from spark.tables import (
    BETWEEN_TABLES,
    DATE_OF,
    DEAD_LETTERS,
    LANDED_NOT_COMMITTED,
    READS,
    RECEIVE_DATE,
    TABLES,
    ArrowTableWriter,
    TablesNotReadable,
    TableWriter,
    application_id,
    count_rows,
    is_delta_table,
    read_table,
    read_table_arrow,
    table_properties,
)
from tests.harness.delta_readers import duckdb_connection

pytestmark = pytest.mark.spark

APP = "fxgate-ledger-test"
OTHER_APP = "fxgate-ledger-other-gateway"

# The two ways a batch is written (spark/tables.py): the contract tests run against both.
WRITERS = pytest.mark.parametrize("writer_class", [TableWriter, ArrowTableWriter])
# A batch landed by one writer and replayed by the other (the daemon after a change of
# `landing`), both ways round.
CROSSINGS = pytest.mark.parametrize(
    ("first_class", "then_class"),
    [(TableWriter, ArrowTableWriter), (ArrowTableWriter, TableWriter)],
    ids=["spark-then-arrow", "arrow-then-spark"],
)

DAY_1 = "2026-11-21"
DAY_2 = "2026-11-22"
STAMP = datetime(2026, 11, 21, 23, 59, 59, 123456, tzinfo=UTC)


class Killed(Exception):
    """Stands in for a SIGKILL at a crash point: nothing after it runs."""


def reads(ids: list[int], date: str = DAY_1, payload: str = "first") -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "payload": pa.array([f"{payload}-{i}" for i in ids], pa.string()),
            "date": pa.array([date] * len(ids), pa.string()),
        }
    )


def typed(date: str = DAY_1) -> pa.Table:
    """A column of every kind a gateway table holds, NOT NULL where the source said so."""
    columns = {
        "s": pa.array(["a", None], pa.string()),
        "i8": pa.array([-128, 127], pa.int8()),
        "i16": pa.array([-32768, 32767], pa.int16()),
        "i32": pa.array([-(2**31), 2**31 - 1], pa.int32()),
        "i64": pa.array([-(2**63), 2**63 - 1], pa.int64()),
        "f64": pa.array([0.1, None], pa.float64()),
        "ts": pa.array([STAMP, None], pa.timestamp("us", tz="UTC")),
        "b": pa.array([b"\x00\xff", b""], pa.binary()),
        "date": pa.array([date, date], pa.string()),
    }
    schema = pa.schema(
        [pa.field(name, array.type, nullable=name != "i64") for name, array in columns.items()]
    )
    return pa.table(columns, schema=schema)


def rows_by_batch(tables_dir, name: str = READS) -> dict[int, list[tuple[int, str]]]:
    table = read_table_arrow(tables_dir, name).sort_by("id")
    found: dict[int, list[tuple[int, str]]] = {}
    for row in table.to_pylist():
        found.setdefault(row["batch_id"], []).append((row["id"], row["payload"]))
    return found


def landed(ids, payload: str = "first") -> list[tuple[int, str]]:
    return [(i, f"{payload}-{i}") for i in ids]


def versions(tables_dir: Path) -> dict[str, int]:
    """Each table's Delta version: a skipped write commits nothing, so it stays."""
    return {
        name: DeltaTable(tables_dir / name).version()
        for name in TABLES
        if is_delta_table(tables_dir / name)
    }


def files_on_disk(table: Path) -> set[str]:
    return {str(p) for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}


def commit_actions(table: Path, version: int) -> list[tuple[str, dict]]:
    """The actions of one commit as the Delta log holds them (one JSON object a line)."""
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [next(iter(json.loads(line).items())) for line in text.splitlines() if line]


# -- the three readers, each the way its users read ---------------------------------------------


def by_delta_rs(table: Path) -> pa.Table:
    return DeltaTable(table).to_pyarrow_table()


def by_spark(session, table: Path) -> pa.Table:
    return session.read.format("delta").load(spark_uri(table)).toArrow()


def by_duckdb(table: Path) -> pa.Table:
    with duckdb_connection() as connection:
        return connection.execute("SELECT * FROM delta_scan(?)", [str(table)]).fetch_arrow_table()


def every_reader(session, table: Path) -> dict[str, pa.Table]:
    return {
        "delta-rs": by_delta_rs(table),
        "spark": by_spark(session, table),
        "duckdb": by_duckdb(table),
    }


def logical(kind: pa.DataType) -> pa.DataType:
    """A column's type with what differs only in the engine's Arrow encoding made equal (Spark
    hands large strings, DuckDB names the zone as the machine's); a timestamp with no zone
    stays as it is, and so fails the comparison."""
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_timestamp(kind) and kind.tz is not None:
        return pa.timestamp(kind.unit, tz="UTC")
    return kind


def canonical(table: pa.Table, *key: str) -> tuple[dict[str, pa.DataType], list[dict]]:
    """(column -> type, rows sorted by the `key` columns) of a read, timestamps in UTC, whatever
    the engine's column order."""
    types = {field.name: logical(field.type) for field in table.schema}
    cast = pa.table({name: table.column(name).cast(types[name]) for name in sorted(types)})
    return types, sorted(cast.to_pylist(), key=lambda row: tuple(row[k] for k in key))


def kill_at(point: str):
    def checkpoint(name: str) -> None:
        if name == point:
            raise Killed(name)

    return checkpoint


# -- exactly once -------------------------------------------------------------------------------


@WRITERS
def test_a_batch_lands_each_row_once_and_its_replays_add_nothing(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path, APP)
    batch = {READS: reads([1, 2, 3]), DEAD_LETTERS: reads([9], DAY_2)}
    assert writer.write_batch(1, batch) == {READS: 3, DEAD_LETTERS: 1}
    landed_once = versions(tmp_path)

    # The ledger replays a batch whose landing it did not record: again and again, and after
    # a restart (a writer with nothing open).
    for again in (writer, writer, writer_class(spark_session, tmp_path, APP)):
        assert again.write_batch(1, batch) == {READS: 3, DEAD_LETTERS: 1}

    assert versions(tmp_path) == landed_once
    assert rows_by_batch(tmp_path) == {1: landed([1, 2, 3])}
    assert rows_by_batch(tmp_path, DEAD_LETTERS) == {1: landed([9])}
    assert count_rows(tmp_path, READS) == 3
    assert read_table(spark_session, tmp_path, READS).count() == 3


@WRITERS
def test_a_batch_that_reached_only_some_of_its_tables_lands_once_in_each_when_replayed(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path, APP)
    writer.write_batch(1, {READS: reads([1]), DEAD_LETTERS: reads([9])})
    # Batch 2 reached `reads`, then the daemon died before its `dead_letters` commit.
    writer.write_batch(2, {READS: reads([2, 3])})
    assert (writer.last_version(READS), writer.last_version(DEAD_LETTERS)) == (2, 1)

    full = {READS: reads([2, 3]), DEAD_LETTERS: reads([19, 20])}
    assert writer.write_batch(2, full) == {READS: 2, DEAD_LETTERS: 2}

    assert rows_by_batch(tmp_path) == {1: landed([1]), 2: landed([2, 3])}
    assert rows_by_batch(tmp_path, DEAD_LETTERS) == {1: landed([9]), 2: landed([19, 20])}
    assert (writer.last_version(READS), writer.last_version(DEAD_LETTERS)) == (2, 2)


@WRITERS
def test_a_batch_id_at_or_below_the_tables_last_version_is_skipped(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path, APP)
    writer.write_batch(5, {READS: reads([1])})
    before = versions(tmp_path)

    assert writer.write_batch(3, {READS: reads([2])}) == {READS: 1}
    assert writer.write_batch(5, {READS: reads([3])}) == {READS: 1}

    assert versions(tmp_path) == before
    assert rows_by_batch(tmp_path) == {5: landed([1])}
    assert DeltaTable(tmp_path / READS).transaction_version(APP) == 5


@WRITERS
def test_two_gateways_writing_one_table_with_the_same_batch_ids_both_land(
    spark_session, tmp_path, writer_class
):
    one = writer_class(spark_session, tmp_path, APP)
    two = writer_class(spark_session, tmp_path, OTHER_APP)
    for batch_id, first, second in ((1, [1, 2], [11, 12]), (2, [3], [13])):
        one.write_batch(batch_id, {READS: reads(first)})
        two.write_batch(batch_id, {READS: reads(second, payload="two")})
    assert two.write_batch(2, {READS: reads([13], payload="two")}) == {READS: 1}

    assert sorted(read_table_arrow(tmp_path, READS).column("id").to_pylist()) == [
        1,
        2,
        3,
        11,
        12,
        13,
    ]
    table = DeltaTable(tmp_path / READS)
    assert (table.transaction_version(APP), table.transaction_version(OTHER_APP)) == (2, 2)


@WRITERS
def test_each_commit_carries_the_application_id_and_the_batch_id_in_the_delta_log(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path, APP)
    assert writer.last_version(READS) is None  # no table yet

    for batch_id in (1, 2, 7):
        writer.write_batch(batch_id, {READS: reads([batch_id])})

    table = DeltaTable(tmp_path / READS)
    assert table.transaction_version(APP) == writer.last_version(READS) == 7
    assert table.transaction_version(OTHER_APP) is None
    transactions = [
        (action["appId"], action["version"])
        for kind, action in commit_actions(tmp_path / READS, table.version())
        if kind == "txn"
    ]
    assert transactions == [(APP, 7)]


@CROSSINGS
def test_a_batch_landed_by_one_writer_is_landed_once_when_replayed_by_the_other(
    spark_session, tmp_path, first_class, then_class
):
    first = first_class(spark_session, tmp_path, APP)
    then = then_class(spark_session, tmp_path, APP)
    batch_1 = {READS: reads([1, 2]), DEAD_LETTERS: reads([9], DAY_2)}
    batch_2 = {READS: reads([3]), DEAD_LETTERS: reads([19], DAY_2)}
    first.write_batch(1, batch_1)
    first.write_batch(2, {READS: batch_2[READS]})  # killed before batch 2's dead letters
    before = versions(tmp_path)

    assert then.write_batch(1, batch_1) == {READS: 2, DEAD_LETTERS: 1}
    assert versions(tmp_path) == before
    assert then.write_batch(2, batch_2) == {READS: 1, DEAD_LETTERS: 1}
    assert versions(tmp_path) == {READS: before[READS], DEAD_LETTERS: before[DEAD_LETTERS] + 1}

    then.write_batch(3, {READS: reads([4])})
    assert first.write_batch(3, {READS: reads([4])}) == {READS: 1}
    assert (first.last_version(READS), then.last_version(READS)) == (3, 3)
    assert rows_by_batch(tmp_path) == {
        1: landed([1, 2]),
        2: landed([3]),
        3: landed([4]),
    }
    assert rows_by_batch(tmp_path, DEAD_LETTERS) == {1: landed([9]), 2: landed([19])}
    assert read_table(spark_session, tmp_path, READS).count() == 4


# -- a crash between the files and the commit ---------------------------------------------------


@pytest.mark.parametrize("replay_class", [ArrowTableWriter, TableWriter])
def test_a_kill_between_the_files_and_the_commit_leaves_nothing_readable_and_the_replay_lands_once(
    spark_session, tmp_path, replay_class
):
    table = tmp_path / READS
    ArrowTableWriter(spark_session, tmp_path, APP).write_batch(1, {READS: reads([1, 2])})
    files, version = files_on_disk(table), DeltaTable(table).version()
    killed = ArrowTableWriter(
        spark_session, tmp_path, APP, checkpoint=kill_at(LANDED_NOT_COMMITTED)
    )

    with pytest.raises(Killed):
        killed.write_batch(2, {READS: reads([3, 4], DAY_2)})

    assert len(files_on_disk(table) - files) == 1  # written and synced, listed by no commit
    assert DeltaTable(table).version() == version
    assert DeltaTable(table).transaction_version(APP) == 1
    for reader, read in every_reader(spark_session, table).items():
        assert sorted(read.column("id").to_pylist()) == [1, 2], reader

    replay = replay_class(spark_session, tmp_path, APP)
    assert replay.write_batch(2, {READS: reads([3, 4], DAY_2)}) == {READS: 2}
    assert replay.write_batch(2, {READS: reads([3, 4], DAY_2)}) == {READS: 2}

    assert rows_by_batch(tmp_path) == {1: landed([1, 2]), 2: landed([3, 4])}
    for reader, read in every_reader(spark_session, table).items():
        assert sorted(read.column("id").to_pylist()) == [1, 2, 3, 4], reader


@WRITERS
def test_a_kill_between_two_tables_of_a_batch_is_healed_by_its_replay(
    spark_session, tmp_path, writer_class
):
    batch = {READS: reads([1, 2]), DEAD_LETTERS: reads([9])}
    killed = writer_class(spark_session, tmp_path, APP, checkpoint=kill_at(BETWEEN_TABLES))

    with pytest.raises(Killed):
        killed.write_batch(1, batch)

    assert rows_by_batch(tmp_path) == {1: landed([1, 2])}
    assert read_table_arrow(tmp_path, DEAD_LETTERS).num_rows == 0
    landed_first = versions(tmp_path)
    replay = writer_class(spark_session, tmp_path, APP)
    assert replay.write_batch(1, batch) == {READS: 2, DEAD_LETTERS: 1}
    assert versions(tmp_path)[READS] == landed_first[READS]
    assert rows_by_batch(tmp_path) == {1: landed([1, 2])}
    assert rows_by_batch(tmp_path, DEAD_LETTERS) == {1: landed([9])}
    assert (replay.last_version(READS), replay.last_version(DEAD_LETTERS)) == (1, 1)


def test_a_kill_in_a_tables_first_write_leaves_it_made_and_empty_to_every_reader(
    spark_session, tmp_path
):
    killed = ArrowTableWriter(
        spark_session, tmp_path, APP, checkpoint=kill_at(LANDED_NOT_COMMITTED)
    )

    with pytest.raises(Killed):
        killed.write_batch(1, {READS: reads([1, 2])})

    # The table was made (its first commit holds only its schema); its batch is not in.
    table = DeltaTable(tmp_path / READS)
    assert (table.version(), table.transaction_version(APP)) == (0, None)
    assert count_rows(tmp_path, READS) == 0
    for reader, read in every_reader(spark_session, tmp_path / READS).items():
        assert (read.num_rows, "id" in read.column_names) == (0, True), reader

    replay = ArrowTableWriter(spark_session, tmp_path, APP)
    assert replay.write_batch(1, {READS: reads([1, 2])}) == {READS: 2}
    assert rows_by_batch(tmp_path) == {1: landed([1, 2])}


# -- what every Delta reader reads --------------------------------------------------------------


@WRITERS
def test_every_reader_reads_the_same_rows_and_types_with_timestamps_in_utc(
    spark_session, tmp_path, writer_class
):
    table = pa.concat_tables([typed(DAY_1), typed(DAY_2)])
    writer_class(spark_session, tmp_path, APP).write_batch(6, {READS: table})
    expected_types = {
        **{field.name: field.type for field in table.schema},
        "batch_id": pa.int64(),
    }
    _, expected_rows = canonical(
        table.append_column("batch_id", pa.array([6] * table.num_rows, pa.int64())), "date", "i8"
    )

    reads_back = every_reader(spark_session, tmp_path / READS)

    assert reads_back["delta-rs"].schema.field("ts").type == pa.timestamp("us", tz="UTC")
    for reader, read in reads_back.items():
        assert canonical(read, "date", "i8") == (expected_types, expected_rows), reader
    spark_types = dict(read_table(spark_session, tmp_path, READS).dtypes)
    assert (spark_types["ts"], spark_types["date"], spark_types["batch_id"]) == (
        "timestamp",
        "string",
        "bigint",
    )


@WRITERS
def test_a_table_is_reader_1_writer_2_with_no_table_feature_and_every_column_nullable(
    spark_session, tmp_path, writer_class
):
    writer_class(spark_session, tmp_path, APP).write_batch(1, {READS: typed()})

    table = DeltaTable(tmp_path / READS)
    protocol = table.protocol()
    assert (
        protocol.min_reader_version,
        protocol.min_writer_version,
        protocol.reader_features,
        protocol.writer_features,
    ) == (1, 2, None, None)
    # fxgate's properties and nothing else: no deletion vectors, no column mapping. delta-spark
    # takes only `delta.` properties from a write: the writer marks its tables' receive date
    # (DATE_OF) at its next start (spark.tables.spark_redate_by_receipt).
    own = {DATE_OF: RECEIVE_DATE} if writer_class is ArrowTableWriter else {}
    assert table.metadata().configuration == {**table_properties(), **own}
    assert table.metadata().partition_columns == ["date"]
    fields = json.loads(table.schema().to_json())["fields"]
    assert [f["name"] for f in fields if not f["nullable"]] == []
    types = {f["name"]: f["type"] for f in fields}
    assert (types["ts"], types["date"], types["batch_id"]) == ("timestamp", "string", "long")
    # Each file the log lists keeps its rows' batch id as an ordinary column.
    parts = files_on_disk(tmp_path / READS)
    assert parts == set(table.file_uris())
    for part in parts:
        assert pq.read_schema(part).field("batch_id").type == pa.int64()


@WRITERS
def test_a_later_batch_with_a_new_column_adds_it_and_older_rows_read_null_in_every_reader(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path, APP)
    writer.write_batch(1, {READS: reads([1, 2])})
    writer.write_batch(2, {READS: reads([3]).append_column("antenna", pa.array([4], pa.int32()))})
    writer.write_batch(3, {READS: reads([5])})  # a batch without it after one with it

    fields = json.loads(DeltaTable(tmp_path / READS).schema().to_json())["fields"]
    assert {"name": "antenna", "type": "integer", "nullable": True, "metadata": {}} in fields
    for reader, read in every_reader(spark_session, tmp_path / READS).items():
        ids, antennas = read.column("id").to_pylist(), read.column("antenna").to_pylist()
        antenna = dict(zip(ids, antennas, strict=True))
        assert antenna == {1: None, 2: None, 3: 4, 5: None}, reader


# -- shape of a batch and of the tables ----------------------------------------------------------


@WRITERS
def test_an_empty_table_writes_no_rows_and_raises_nothing(spark_session, tmp_path, writer_class):
    written = writer_class(spark_session, tmp_path, APP).write_batch(
        5, {DEAD_LETTERS: reads([]), READS: reads([1])}
    )

    assert written == {DEAD_LETTERS: 0, READS: 1}
    assert not (tmp_path / DEAD_LETTERS).exists()
    assert read_table_arrow(tmp_path, DEAD_LETTERS).num_rows == 0
    assert read_table(spark_session, tmp_path, DEAD_LETTERS).count() == 0
    assert count_rows(tmp_path, DEAD_LETTERS) == 0
    assert read_table_arrow(tmp_path, READS).num_rows == 1


def test_an_absent_table_reads_as_an_empty_table_with_the_schema_asked_for(spark_session, tmp_path):
    schema = pa.schema([("id", pa.int64()), ("date", pa.string())])

    assert read_table_arrow(tmp_path, READS).schema.names == ["date", "batch_id"]
    assert read_table_arrow(tmp_path, READS, schema=schema) == schema.empty_table()
    df = read_table(spark_session, tmp_path, READS, schema=schema)
    assert df.columns == ["id", "date"]
    assert df.count() == 0


def test_files_in_a_table_directory_without_a_delta_log_are_no_table_to_any_reader(
    spark_session, tmp_path
):
    # What a Spark job killed before the first commit of a table leaves.
    (tmp_path / READS / f"date={DAY_1}").mkdir(parents=True)
    pq.write_table(reads([1]), tmp_path / READS / f"date={DAY_1}" / "part-00000.parquet")

    assert read_table_arrow(tmp_path, READS).num_rows == 0
    assert read_table(spark_session, tmp_path, READS).count() == 0
    assert count_rows(tmp_path, READS) == 0


@WRITERS
def test_a_batch_id_column_is_added_when_missing_and_must_match_when_present(
    spark_session, tmp_path, writer_class
):
    writer = writer_class(spark_session, tmp_path, APP)
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
    writer = writer_class(spark_session, tmp_path, APP)

    with pytest.raises(ValueError, match="'date' column"):
        writer.write_batch(1, {DEAD_LETTERS: reads([1]), READS: no_date})
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        writer.write_batch(1, {DEAD_LETTERS: reads([1]), READS: bad_date})
    with pytest.raises(ValueError, match="positive int"):
        writer.write_batch(0, {READS: reads([1])})

    assert not (tmp_path / DEAD_LETTERS).exists()
    assert not (tmp_path / READS).exists()


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


def test_spark_reads_the_arrow_writers_tables_with_the_types_of_its_own(spark_session, tmp_path):
    spark_dir, arrow_dir, mixed_dir = tmp_path / "spark", tmp_path / "arrow", tmp_path / "mixed"
    first, second = fx9600_batch(1), fx9600_batch(2)
    for writer in (
        TableWriter(spark_session, spark_dir, APP),
        ArrowTableWriter(spark_session, arrow_dir, APP),
    ):
        writer.write_batch(1, {READS: first.reads, DEAD_LETTERS: first.dead_letters})
    # One table with batches of both kinds: the daemon's tables after a change of landing.
    TableWriter(spark_session, mixed_dir, APP).write_batch(1, {READS: first.reads})
    ArrowTableWriter(spark_session, mixed_dir, APP).write_batch(2, {READS: second.reads})

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


def test_the_arrow_writer_commits_one_file_per_date_under_its_date_directory(
    spark_session, tmp_path
):
    table = pa.concat_tables([reads([1, 2], date=DAY_1), reads([3], date=DAY_2)])

    ArrowTableWriter(spark_session, tmp_path, APP).write_batch(4, {READS: table})

    table_dir = tmp_path / READS
    adds = [
        action
        for kind, action in commit_actions(table_dir, DeltaTable(table_dir).version())
        if kind == "add"
    ]
    commit = sorted(
        (add["path"].split("/")[0], add["partitionValues"], json.loads(add["stats"])["numRecords"])
        for add in adds
    )
    assert commit == [(f"date={DAY_1}", {"date": DAY_1}, 2), (f"date={DAY_2}", {"date": DAY_2}, 1)]
    files = sorted(Path(f).relative_to(tmp_path / READS) for f in files_on_disk(tmp_path / READS))
    assert [str(p.parent) for p in files] == [f"date={DAY_1}", f"date={DAY_2}"]
    assert pq.read_schema(tmp_path / READS / files[0]).names == ["id", "payload", "batch_id"]


def test_the_arrow_writer_refuses_tables_only_spark_reaches(spark_session):
    for location in ("hdfs://namenode/fxgate/tables", "s3a://bucket/fxgate/tables"):
        with pytest.raises(TablesNotReadable, match="batches go through Spark there"):
            ArrowTableWriter(spark_session, location, APP)


def test_a_gateways_application_id_is_made_from_its_ledger_id_and_refuses_odd_ids():
    assert application_id("3f2a-gw.1") == "fxgate-ledger-3f2a-gw.1"
    for bad in ("", "a b", "gw/1", "gw\n"):
        with pytest.raises(ValueError, match="invalid gateway id"):
            application_id(bad)


def test_a_batch_column_of_another_type_is_cast_to_the_tables_or_refused_before_any_file(tmp_path):
    writer = ArrowTableWriter(None, tmp_path, APP)
    day = ["2026-11-27"]
    writer.write_batch(1, {READS: pa.table({"n": pa.array([1], pa.int64()), "date": day})})
    writer.write_batch(2, {READS: pa.table({"n": pa.array([2], pa.int32()), "date": day})})
    files = sorted((tmp_path / READS).rglob("*.parquet"))
    with pytest.raises(ValueError, match="column 'n' is int64 in the table"):
        writer.write_batch(3, {READS: pa.table({"n": ["x"], "date": day})})
    assert sorted((tmp_path / READS).rglob("*.parquet")) == files  # nothing written
    table = read_table_arrow(tmp_path, READS)
    assert table.schema.field("n").type == pa.int64()
    assert sorted(table.column("n").to_pylist()) == [1, 2]
    assert writer.last_version(READS) == 2
