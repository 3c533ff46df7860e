"""Every table is partitioned by receive date (DESIGN §7.7). An earlier fxgate took `reads`'s and
`events`'s `date` from the event's own timestamp; its tables are brought to the receive date once
(spark.tables.redate_by_receipt, or its Spark twin for tables only Spark reaches): each row once,
the batches' transaction identifiers kept, the table marked so that no later start scans it."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from persistence.records import LedgerRecord
from spark.schema import build_batch
from spark.tables import (
    DATE_OF,
    DEAD_LETTERS,
    PARTITION_COLUMNS,
    READS,
    RECEIVE_DATE,
    ArrowTableWriter,
    TableWriter,
    delta_schema,
    redate_by_receipt,
    spark_redate_by_receipt,
    table_properties,
)
from tests.harness.delta_readers import duckdb_connection

pytestmark = pytest.mark.spark

APP = "fxgate-ledger-test"
TOPIC = "zebra/fx/fx9600-01/reads"
RECEIVED = datetime(2026, 11, 22, 0, 0, 1, tzinfo=UTC).timestamp()


def payload(epc: str, stamp: str, number: int) -> bytes:
    return (
        f'{{"data": {{"idHex": "{epc}", "antenna": 1, "eventNum": {number}}}, '
        f'"timestamp": "{stamp}"}}'
    ).encode()


def batch_one():
    """Batch 1: a read stamped one second before midnight and received after it, one read of the
    next day, and a dead letter."""
    bodies = [
        payload("e28011606000020a1b2c3d01", "2026-11-21T23:59:59.000+0000", 1),
        payload("e28011606000020a1b2c3d02", "2026-11-22T00:00:00.500+0000", 2),
        b"{not json",
    ]
    records = [
        LedgerRecord(seq, f"{seq:032x}", TOPIC, body, 1, RECEIVED, pack_id=1)
        for seq, body in enumerate(bodies, start=1)
    ]
    return build_batch(records, batch_id=1)


def earlier_batch():
    """Batch 1 as the fxgate before the receive date landed it: reads in the reader's day (a
    dead letter's date was always the receive date)."""
    batch = batch_one()
    reader_days = pc.strftime(batch.reads.column("event_time"), format="%Y-%m-%d")
    reads = batch.reads.set_column(
        batch.reads.schema.get_field_index("date"), "date", reader_days.cast(pa.string())
    )
    return {READS: reads, DEAD_LETTERS: batch.dead_letters}


def earlier_tables(session, tables) -> None:
    """The earlier fxgate's tables: made without the mark, batch 1 committed with its
    transaction identifier."""
    batch = earlier_batch()
    for name, table in batch.items():
        DeltaTable.create(
            str(tables / name),
            schema=delta_schema(table),
            partition_by=list(PARTITION_COLUMNS),
            configuration=table_properties(),
        )
    ArrowTableWriter(session, tables, APP).write_batch(1, batch)


def dates(tables, name: str) -> dict[str, str]:
    """message key or id -> `date`, read through DuckDB's delta extension (another engine,
    taking no lock of ours)."""
    key = "message_id" if name == READS else "message_key"
    with duckdb_connection() as connection:
        rows = connection.execute(
            f"SELECT {key}, date FROM delta_scan(?)", [str(tables / name)]
        ).fetchall()
    assert len(rows) == len({k for k, _ in rows})  # each row once
    return dict(rows)


def files(tables, name: str) -> set[str]:
    actions = DeltaTable(str(tables / name)).get_add_actions(flatten=True)
    return set(actions.column("path").to_pylist())


REDATES = pytest.mark.parametrize(
    ("redate", "writer_class"),
    [
        (lambda session, tables: redate_by_receipt(tables), ArrowTableWriter),
        (spark_redate_by_receipt, TableWriter),
    ],
    ids=["delta-rs", "spark"],
)


@REDATES
def test_an_earlier_tables_reader_dated_rows_move_to_their_receive_day_once(
    spark_session, tmp_path, redate, writer_class
):
    earlier_tables(spark_session, tmp_path)
    before = dates(tmp_path, READS)
    assert sorted(before.values()) == ["2026-11-21", "2026-11-22"]
    untouched = {path for path in files(tmp_path, READS) if path.startswith("date=2026-11-22/")}

    moved = redate(spark_session, tmp_path)

    assert moved == {READS: 1, DEAD_LETTERS: 0}
    after = dates(tmp_path, READS)
    assert after == {key: "2026-11-22" for key in before}
    assert set(dates(tmp_path, DEAD_LETTERS).values()) == {"2026-11-22"}
    # Only the file that held the moved row was rewritten.
    assert untouched < files(tmp_path, READS)
    assert not any(path.startswith("date=2026-11-21/") for path in files(tmp_path, READS))
    for name in (READS, DEAD_LETTERS):
        table = DeltaTable(str(tmp_path / name))
        assert table.metadata().configuration[DATE_OF] == RECEIVE_DATE
        assert table.transaction_version(APP) == 1

    # Marked: the next start neither scans nor commits; the batch's replay is still skipped.
    version = DeltaTable(str(tmp_path / READS)).version()
    assert redate(spark_session, tmp_path) == {}
    writer = writer_class(spark_session, tmp_path, APP)
    assert writer.last_version(READS) == 1
    writer.write_batch(1, earlier_batch())
    assert DeltaTable(str(tmp_path / READS)).version() == version
    assert dates(tmp_path, READS) == after


def test_a_table_this_fxgate_makes_is_marked_from_its_first_commit(spark_session, tmp_path):
    batch = batch_one()
    ArrowTableWriter(spark_session, tmp_path, APP).write_batch(
        1, {READS: batch.reads, DEAD_LETTERS: batch.dead_letters}
    )
    assert set(dates(tmp_path, READS).values()) == {"2026-11-22"}
    for name in (READS, DEAD_LETTERS):
        assert DeltaTable(str(tmp_path / name)).metadata().configuration[DATE_OF] == RECEIVE_DATE
    assert redate_by_receipt(tmp_path) == {}
