"""`fxgate dead-letters list`: what landed in the `dead_letters` table, and why.

Read with plain pyarrow from the table directory (no JVM, safe while the daemon runs: only
committed batch partitions are visible). Counts per reason first, then the newest rows, each
with enough of its payload to recognise it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from spark.progress import NO_PROGRESS, Progress

PAYLOAD_PREVIEW = 80
# Topics and details come from the readers' side: shown no longer than this, and escaped, so a
# hostile topic can neither flood the terminal nor steer it with control sequences.
TEXT_PREVIEW = 200


def shown(text: str | None, limit: int = TEXT_PREVIEW) -> str:
    """`text` safe to print on a terminal: non-printable characters escaped, long text cut."""
    if text is None:
        return ""
    cut = text[:limit]
    safe = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in cut)
    return safe + ("…" if len(text) > limit else "")


@dataclass(frozen=True)
class DeadLetter:
    message_key: str
    topic: str
    reason: str
    detail: str | None
    received_time: datetime | None
    batch_id: int | None
    payload: bytes | None
    qos: int = 1
    # The sink it is a dead letter for: `table` (null in partitions older than the column) or
    # `upstream` (forwarding gave up; its reads are in `reads`). A replay goes to that sink only.
    sink: str = "table"

    def preview(self) -> str:
        if self.payload is None:
            return "-"
        text = self.payload[:PAYLOAD_PREVIEW].decode("utf-8", errors="replace")
        more = "…" if len(self.payload) > PAYLOAD_PREVIEW else ""
        return repr(text + more)


# Rows turned into records between two advances of the progress.
_READ_BATCH_ROWS = 10_000


def load_dead_letters(
    tables_dir: Path, reason: str | None = None, progress: Progress = NO_PROGRESS
) -> list[DeadLetter]:
    """Every dead letter (of one reason, if given), newest first, from one snapshot of the
    Delta table (no lock: the daemon may be writing). `batch_id` is the batch it landed in.
    `progress` counts the dead letters turned into records, of the table's rows. Raises
    TablesNotReadable when the tables are not on this machine's disk."""
    from spark.schema import DEAD_LETTERS_SCHEMA
    from spark.tables import DEAD_LETTERS, read_table_arrow

    table = read_table_arrow(tables_dir, DEAD_LETTERS, DEAD_LETTERS_SCHEMA)
    progress.expect(table.num_rows)
    letters = []
    for batch in table.to_batches(max_chunksize=_READ_BATCH_ROWS):
        letters.extend(
            DeadLetter(
                row["message_key"],
                row["topic"],
                row["reason"],
                row.get("detail"),
                row.get("received_time"),
                row.get("batch_id"),
                row.get("payload"),
                row.get("qos") or 1,
                row.get("sink") or "table",
            )
            for row in batch.to_pylist()
            if reason is None or row["reason"] == reason
        )
        progress.advance(batch.num_rows)
    letters.sort(key=lambda d: (d.received_time is None, d.received_time), reverse=True)
    return letters


def format_dead_letters(letters: list[DeadLetter], limit: int) -> str:
    if not letters:
        return "no dead letters"
    counts = Counter(d.reason for d in letters)
    lines = [f"{len(letters)} dead letter(s): " + ", ".join(f"{r} {n}" for r, n in counts.items())]
    for letter in letters[:limit]:
        when = letter.received_time.isoformat() if letter.received_time else "-"
        lines.append(
            f"{when}  {shown(letter.reason)} ({letter.sink})  {shown(letter.topic)}  "
            f"key {letter.message_key}  "
            f"batch {letter.batch_id}  {shown(letter.detail)}".rstrip()
        )
        lines.append(f"    payload {letter.preview()}")
    if len(letters) > limit:
        lines.append(f"… {len(letters) - limit} more (--limit)")
    return "\n".join(lines)


def dead_letters_json(letters: list[DeadLetter], limit: int) -> dict:
    return {
        "total": len(letters),
        "by_reason": dict(Counter(d.reason for d in letters)),
        "newest": [
            {
                "message_key": d.message_key,
                "topic": d.topic,
                "reason": d.reason,
                "sink": d.sink,
                "detail": d.detail,
                "received_time": d.received_time.isoformat() if d.received_time else None,
                "batch_id": d.batch_id,
                "payload_preview": d.preview(),
            }
            for d in letters[:limit]
        ],
    }
