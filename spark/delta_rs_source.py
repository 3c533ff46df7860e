"""Spark reading Delta tables on an object store through delta-rs: a Python data source (Spark's
Data Source API) for the commands that run through fxgate's Spark (`audit`, `sql`, `report`)
when the tables are where that Spark has no connector (Azure, S3: spark/location.py).

delta-rs does the Delta part, as it does for every other reader of ours: the snapshot (one
version, read once when the query is planned), its files, their partition values and the
columns a file lacks (older files, before a column was added). This module only hands its
pyarrow dataset to Spark, a data file per partition of the scan, each read as Arrow record
batches in Spark's Python worker (which reaches the store with the same environment variables as
the daemon). Nothing is copied to this disk, and memory holds a batch of one file at a time.

    session.read.format(FORMAT).load("az://fxgate/env-a/reads")
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

FORMAT = "fxgate_delta_rs"
# Rows per record batch handed to Spark (pyarrow's default for a scan is about 131,000).
BATCH_ROWS = 65_536


@dataclass(frozen=True)
class _Files(InputPartition):
    """One partition of the scan: data files of the snapshot, by the dataset's paths."""

    paths: tuple[str, ...]


def register(session) -> None:
    """Make `FORMAT` known to `session` (once is enough; again is harmless)."""
    session.dataSource.register(DeltaRsSource)


class DeltaRsSource(DataSource):
    """`load(path)`: the Delta table at `path` (an object store's URI), as delta-rs reads it."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(_snapshot(self.options["path"], None).schema)

    def reader(self, schema) -> DataSourceReader:
        return _Reader(self.options["path"], schema)


class _Reader(DataSourceReader):
    def __init__(self, path: str, schema) -> None:
        from deltalake import DeltaTable

        self.path = path
        self.columns = [field.name for field in schema.fields]
        # One version for the whole scan: every partition reads the snapshot planned here.
        self.version = DeltaTable(path).version()

    def partitions(self) -> Sequence[InputPartition]:
        dataset = _snapshot(self.path, self.version)
        paths = [fragment.path for fragment in dataset.get_fragments()]
        return [_Files((path,)) for path in paths] or [_Files(())]

    def read(self, partition: InputPartition) -> Iterator:
        if not partition.paths:
            return
        wanted = set(partition.paths)
        dataset = _snapshot(self.path, self.version)
        for fragment in dataset.get_fragments():
            if fragment.path in wanted:
                yield from fragment.to_batches(
                    columns=self.columns, schema=dataset.schema, batch_size=BATCH_ROWS
                )


def _snapshot(path: str, version: int | None):
    """The pyarrow dataset of the table at `path` (at `version`; None: the latest)."""
    from deltalake import DeltaTable

    return DeltaTable(path, version=version).to_pyarrow_dataset()
