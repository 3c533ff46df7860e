"""Landing batches for the compaction tests and benchmark: the layout the writer makes.

Through Spark (`TableWriter`) a batch costs 0.25 s, so most batches here are written with pyarrow
straight into `date=D/batch_id=N/part-00000.parquet`, the way Spark's job commit leaves them:
the partition columns in the path only, the rest of the table's columns in the file.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark.schema import READS_SCHEMA

BASE_TIME_US = 1_795_000_000_000_000  # 2026-11-18


def reads_rows(batch_id: int, date: str, count: int, first_seq: int) -> pa.Table:
    """`count` reads of batch `batch_id` on `date`, with the writer's columns."""
    seqs = list(range(first_seq, first_seq + count))
    day = int(date[-2:])
    times = [BASE_TIME_US + day * 86_400_000_000 + s for s in seqs]
    columns = {
        "message_id": [f"m{s}" for s in seqs],
        "topic": ["zebra/fx/r1/reads"] * count,
        "reader_id": ["r1"] * count,
        "epc": [f"E{s:020d}" for s in seqs],
        "antenna": [1 + s % 4 for s in seqs],
        "peak_rssi": [-50.0 - s % 20 for s in seqs],
        "channel": [915.25] * count,
        "phase": [0.0] * count,
        "event_num": seqs,
        "event_time": times,
        "received_time": times,
        "qos": [1] * count,
        "pack_id": [batch_id * 10] * count,
        "batch_id": [batch_id] * count,
        "date": [date] * count,
        "seq": seqs,
    }
    # Columns a read of this shape leaves null (the FX9600 fields it does not carry).
    arrays = [
        pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(count, f.type)
        for f in READS_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=READS_SCHEMA)


def land_with_pyarrow(table_dir: Path, batch_id: int, table: pa.Table) -> None:
    """One landing partition per date in `table`, as Spark's commit leaves it."""
    for date in sorted(set(table.column("date").to_pylist())):
        part = table.filter(pa.compute.equal(table.column("date"), date))
        directory = Path(table_dir) / f"date={date}" / f"batch_id={batch_id}"
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(part.drop_columns(["date", "batch_id"]), directory / "part-00000.parquet")


def land_day(table_dir: Path, dates: list[str], batches: int, rows: int, first: int = 1) -> int:
    """`batches` batches of `rows` reads, spread over `dates` in order; returns the rows."""
    seq = 1
    for index in range(batches):
        batch_id = first + index
        date = dates[index * len(dates) // batches]
        land_with_pyarrow(table_dir, batch_id, reads_rows(batch_id, date, rows, seq))
        seq += rows
    return seq - 1
