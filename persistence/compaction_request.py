"""Maintenance requests: `fxgate compact` while the daemon runs.

One process writes a tables directory at a time, and while the daemon runs it is the daemon
(DESIGN §7.7): its Spark writer maintains the tables between its writes. So the command, finding
the daemon holding the writer lock (spark/writer_lock.py), leaves a request file in
`<data_dir>/compact/` (written to a hidden name, then renamed), as `fxgate dead-letters replay`
does; the supervisor sees it within a second and tells the writer, which runs a pass and then
deletes the requests it ran for. A crash before the deletion runs the pass again at the next
start: a pass is idempotent.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

COMPACT_DIR = "compact"
SUFFIX = ".request"


def write_compaction_request(data_dir: Path) -> Path:
    directory = Path(data_dir) / COMPACT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex[:12]
    tmp, final = directory / f".{name}.tmp", directory / f"{name}{SUFFIX}"
    tmp.write_text(json.dumps({"pid": os.getpid()}) + "\n")
    os.replace(tmp, final)
    return final


def pending_compaction_requests(data_dir: Path) -> list[Path]:
    directory = Path(data_dir) / COMPACT_DIR
    if not directory.is_dir():
        return []
    return sorted(directory.glob(f"*{SUFFIX}"))


def done(requests: list[Path]) -> None:
    for path in requests:
        path.unlink(missing_ok=True)
