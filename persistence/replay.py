"""Replay requests: dead letters sent through the pipeline again, after a fix.

`fxgate dead-letters replay` may run while the daemon runs, and the ledger database has one
owner (the InboundLedger), so the command does not touch it: it writes a request file into
`<data_dir>/replay/` (written to a temporary name, then renamed, so a half-written file is never
read). The InboundLedger takes each request as new messages under a new key,
`<original key>/replay-<request>`, commits them and only then deletes the file. A crash between
the two takes the same file again: the same keys, refused as duplicates, so a replay lands once.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPLAY_DIR = "replay"
SUFFIX = ".jsonl"


@dataclass(frozen=True)
class ReplayMessage:
    message_key: str  # the key it had: the replay's key is derived from it
    topic: str
    payload: bytes
    qos: int
    # The sink it is a dead letter for, and so the one sink it is replayed to: `table` (it goes
    # through the parser again) or `upstream` (forwarded again; its reads are in the table).
    sink: str = "table"


def replay_key(message_key: str, request: str) -> str:
    return f"{message_key}/replay-{request}"


def write_request(data_dir: Path, messages: Iterable[ReplayMessage]) -> Path | None:
    """One request file with these messages; None when there is nothing to replay."""
    lines = [
        json.dumps(
            {
                "message_key": m.message_key,
                "topic": m.topic,
                "payload": base64.b64encode(m.payload).decode("ascii"),
                "qos": m.qos,
                "sink": m.sink,
            }
        )
        for m in messages
    ]
    if not lines:
        return None
    directory = Path(data_dir) / REPLAY_DIR
    directory.mkdir(parents=True, exist_ok=True)
    request = uuid.uuid4().hex[:12]
    final = directory / f"{request}{SUFFIX}"
    tmp = directory / f".{request}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, final)
    return final


def pending_requests(data_dir: Path) -> list[Path]:
    directory = Path(data_dir) / REPLAY_DIR
    if not directory.is_dir():
        return []
    return sorted(directory.glob(f"*{SUFFIX}"), key=lambda p: (p.stat().st_mtime, p.name))


def read_request(path: Path) -> tuple[str, list[ReplayMessage]]:
    """(request id, messages) of one request file; ValueError, KeyError or OSError when it is
    not one (the ledger then moves it aside).

    A request file can be written by hand, so every field is checked here: a topic that is not
    text (a lone surrogate from a JSON escape cannot be hashed into a key) or a QoS the `qos`
    column cannot hold would otherwise fail in the ledger or the Spark writer at every restart.
    """
    messages = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        key, topic, qos = row["message_key"], row["topic"], row["qos"]
        if not isinstance(key, str) or not isinstance(topic, str):
            raise ValueError(f"line {number}: message_key and topic must be strings")
        topic.encode("utf-8")  # UnicodeEncodeError is a ValueError
        if qos not in (0, 1, 2) or isinstance(qos, bool):
            raise ValueError(f"line {number}: qos must be 0, 1 or 2, not {qos!r}")
        # Requests written before dead letters had a sink are table replays.
        sink = row.get("sink", "table")
        if sink not in ("table", "upstream"):
            raise ValueError(f"line {number}: sink must be 'table' or 'upstream', not {sink!r}")
        messages.append(
            ReplayMessage(key, topic, base64.b64decode(row["payload"], validate=True), qos, sink)
        )
    return path.name.removesuffix(SUFFIX), messages
