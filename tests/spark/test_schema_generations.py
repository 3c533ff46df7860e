"""A `reads` table holding batches of older schemas (before `seq`, before the tag data event's
other fields) and of the current one reads as one table: each batch that brought a column added
it to the Delta table's schema, so every Delta reader (Spark, delta-rs, pyarrow through
delta-rs, DuckDB) reads the union with no option of its own, older rows null in the columns
added after them (DESIGN §7.7). Both writers are shown, since either may have landed a batch."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from spark.location import spark_uri
from spark.schema import READS_SCHEMA, build_batch
from spark.tables import READS, ArrowTableWriter, TableWriter, read_table, read_table_arrow
from tests.harness.delta_readers import duckdb_connection
from tests.spark.test_sanitise import Record
from tests.spark.test_zebra_reader_modes import NEW_COLUMNS

pytestmark = pytest.mark.spark

APP = "fxgate-ledger-test"
TOPIC = "zebra/fx/fx9600-01/reads"


def payload(epc: str, day: str, **data) -> bytes:
    event = {
        "data": {"idHex": epc, "antenna": 1, "eventNum": 1, "format": "epc", "reads": 4, **data},
        "timestamp": f"{day}T10:00:00Z",
        "type": "INVENTORY",
        "hostName": "FX9600F0A1B2",
    }
    return json.dumps(event).encode()


def batch(batch_id: int, *payloads: bytes):
    records = [Record(f"b{batch_id}-{i}", TOPIC, p, seq=i) for i, p in enumerate(payloads)]
    return build_batch(records, batch_id=batch_id).reads


@pytest.fixture(params=[TableWriter, ArrowTableWriter])
def generations(request, spark_session, tmp_path):
    """Three batches over two dates: one without `seq` nor the new columns (the first schema),
    one without the new columns, one of today's schema carrying every new field."""
    writer = request.param(spark_session, tmp_path, APP)
    first = batch(1, payload("e2801a", "2026-11-20")).drop_columns(["seq", *NEW_COLUMNS])
    second = batch(2, payload("e2802a", "2026-11-21"), payload("e2802b", "2026-11-20"))
    current = batch(3, payload("e2803a", "2026-11-21", TID="E2801160", accessResults=["SUCCESS"]))
    writer.write_batch(1, {READS: first})
    writer.write_batch(2, {READS: second.drop_columns(list(NEW_COLUMNS))})
    writer.write_batch(3, {READS: current})
    return tmp_path


def file_columns(tables_dir, batch_id: int) -> set[str]:
    """The columns of the files that hold batch `batch_id` (each file holds one batch)."""
    found = set()
    for uri in DeltaTable(tables_dir / READS).file_uris():
        with pq.ParquetFile(uri) as part:
            if part.read(columns=["batch_id"]).column(0).unique().to_pylist() == [batch_id]:
                found.add(frozenset(part.schema_arrow.names))
    (columns,) = found
    return set(columns)


def by_epc(rows: list[dict]) -> dict[str, dict]:
    return {row["epc"]: row for row in rows}


def check(rows: dict[str, dict]) -> None:
    assert sorted(rows) == ["e2801a", "e2802a", "e2802b", "e2803a"]
    for epc in ("e2801a", "e2802a", "e2802b"):
        assert [rows[epc][c] for c in NEW_COLUMNS] == [None] * len(NEW_COLUMNS), epc
    assert rows["e2801a"]["seq"] is None and rows["e2802b"]["seq"] == 1
    current = rows["e2803a"]
    assert (current["reader_mode"], current["format"], current["read_count"]) == (
        "INVENTORY",
        "epc",
        4,
    )
    assert (current["tid"], list(current["access_results"])) == ("E2801160", ["SUCCESS"])
    assert json.loads(current["extra_fields"]) == {"hostName": "FX9600F0A1B2"}


def test_the_older_batches_files_really_lack_the_newer_columns(generations):
    assert "seq" not in file_columns(generations, 1)
    assert not set(NEW_COLUMNS) & file_columns(generations, 2)
    assert set(NEW_COLUMNS) <= file_columns(generations, 3)


def test_old_and_new_batches_read_together_through_spark_as_one_delta_table(
    spark_session, generations
):
    df = spark_session.read.format("delta").load(spark_uri(generations / READS))
    assert set(READS_SCHEMA.names) <= set(df.columns)
    check(by_epc([row.asDict() for row in df.collect()]))


def test_spark_sql_on_the_tables_view_finds_the_new_columns_filled_only_in_new_rows(
    spark_session, generations
):
    read_table(spark_session, generations, READS).createOrReplaceTempView("generations_reads")
    try:
        found = spark_session.sql(
            "SELECT epc, reader_mode, read_count, access_results FROM generations_reads "
            "WHERE read_count IS NOT NULL"
        ).collect()
    finally:
        spark_session.catalog.dropTempView("generations_reads")
    assert [tuple(row) for row in found] == [("e2803a", "INVENTORY", 4, ["SUCCESS"])]


def test_old_and_new_batches_read_together_through_delta_rs_and_its_pyarrow_dataset(
    generations,
):
    check(by_epc(read_table_arrow(generations, READS, READS_SCHEMA).to_pylist()))

    # The same without fxgate's helper: the table's own schema is the union of the batches'.
    plain = DeltaTable(generations / READS).to_pyarrow_dataset()
    assert set(READS_SCHEMA.names) <= set(plain.schema.names)
    check(by_epc(plain.to_table().to_pylist()))


def test_old_and_new_batches_read_together_through_duckdbs_delta_scan(generations):
    # The columns `check` looks at, handed over as Arrow (DuckDB hands timestamps with a zone to
    # Python objects through pytz, which fxgate does not install).
    wanted = ["epc", "seq", *NEW_COLUMNS]
    with duckdb_connection() as db:
        described = db.execute("DESCRIBE SELECT * FROM delta_scan(?)", [str(generations / READS)])
        names = [row[0] for row in described.fetchall()]
        found = db.execute(
            f"SELECT {', '.join(wanted)} FROM delta_scan(?)", [str(generations / READS)]
        ).fetch_arrow_table()
    assert set(READS_SCHEMA.names) <= set(names)
    check(by_epc(found.to_pylist()))
