"""What landed against what was published: missing, duplicate and unexpected read ids.

Used by `fxgate report`, the demo and the fault-injection tests. The table is read both through
Spark (delta-spark) and without a JVM (delta-rs), each a snapshot of the Delta log: both must agree
with the publisher's record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from spark.tables import READS, read_table, read_table_arrow


@dataclass(frozen=True)
class Comparison:
    published: int
    landed: int
    missing: tuple[str, ...]
    duplicates: tuple[str, ...]
    unexpected: tuple[str, ...]
    per_reader: dict[str, int] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return not (self.missing or self.duplicates or self.unexpected)

    def lines(self) -> list[str]:
        out = [f"  {reader:<20} {rows:>8} rows" for reader, rows in sorted(self.per_reader.items())]
        out += [
            f"  published reads: {self.published}",
            f"  landed rows:     {self.landed}",
            f"  missing:         {len(self.missing)}",
            f"  duplicates:      {len(self.duplicates)}",
            f"  unexpected:      {len(self.unexpected)}",
        ]
        return out


def compare(
    expected: set[str],
    landed: Iterable[str],
    readers: Iterable[str] = (),
    tolerated: set[str] = frozenset(),
) -> Comparison:
    """`tolerated` ids may be present or not (publishes whose ack never came back), at most once."""
    landed = list(landed)
    counts = Counter(landed)
    per_reader = dict(Counter(readers))
    return Comparison(
        published=len(expected),
        landed=len(landed),
        missing=tuple(sorted(expected - counts.keys())),
        duplicates=tuple(sorted(k for k, n in counts.items() if n > 1)),
        unexpected=tuple(sorted(counts.keys() - expected - tolerated)),
        per_reader=per_reader,
    )


def landed_ids_spark(session, tables_dir) -> tuple[list[str], list[str]]:
    rows = read_table(session, tables_dir, READS).select("message_id", "reader_id").collect()
    return [r[0] for r in rows], [r[1] for r in rows]


def landed_ids_arrow(tables_dir) -> tuple[list[str], list[str]]:
    table = read_table_arrow(tables_dir, READS)
    if "message_id" not in table.column_names:
        return [], []
    return table.column("message_id").to_pylist(), table.column("reader_id").to_pylist()
