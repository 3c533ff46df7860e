"""Making the Spark JVM's class data archive (spark/cds.py says what it is and how a session
maps it): `python -m spark.cds_archive [PATH]`, which `make` runs at install."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from spark.cds import DEFAULT_ARCHIVE, LOG_FILE, dump_options
from spark.schema import build_batch
from spark.session import build_session, stop_session
from spark.tables import (
    DEAD_LETTERS,
    READER_EVENTS,
    READS,
    TableWriter,
    application_id,
    read_table,
)

# Dumping 15,000 classes took 18 s on this 2-vCPU machine while it was busy: well past the
# 10 s stop_session gives a JVM to exit.
DUMP_EXIT_TIMEOUT = 300.0


@dataclass(frozen=True)
class _Record:
    """A ledger record as spark.schema.build_batch takes it."""

    message_key: str
    topic: str
    payload: bytes
    qos: int = 1
    received_time: float = 1_795_000_000.0
    pack_id: int = 1
    seq: int = 0


def _tag(num: int, epc: str) -> dict:
    return {
        "data": {"idHex": epc, "antenna": 1, "peakRssi": -52, "eventNum": num, "format": "epc"},
        "timestamp": "2026-11-24T10:00:00.000+0000",
        "type": "SIMPLE",
    }


def _warm_up_records() -> list[_Record]:
    """One message of each kind the writer lands: a read, a batched array, a payload that is
    no JSON (a dead letter) and a heartbeat (a reader event)."""
    topic = "zebra/fx/fx9600-01/reads"
    heartbeat = {
        "type": "heartbeat",
        "timestamp": "2026-11-24T10:00:01.000+0000",
        "component": "RG",
        "eventNum": 4,
        "data": {"radio_control": {"messagesSent": 3}},
    }
    payloads = [
        json.dumps(_tag(1, "e28011606000020a1b2c3d01")).encode(),
        json.dumps(
            [_tag(2, "e28011606000020a1b2c3d02"), _tag(3, "e28011606000020a1b2c3d03")]
        ).encode(),
        b"not json",
        json.dumps(heartbeat).encode(),
    ]
    return [_Record(f"warm-up-{seq}", topic, p, seq=seq) for seq, p in enumerate(payloads, 1)]


def make_archive(archive: Path, work_dir: Path | None = None) -> float:
    """Write the archive of what the daemon's Spark loads; returns the seconds it took.
    Raises RuntimeError when the JVM wrote none."""
    archive = Path(archive).absolute()
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fxgate-cds-", dir=work_dir) as scratch:
        scratch_dir = Path(scratch)
        log_file = scratch_dir / LOG_FILE
        session = build_session(
            "local[2]",
            scratch_dir / "spark",
            class_data_archive=None,
            java_options=dump_options(partial, log_file),
        )
        try:
            # What the daemon's Spark does in its first minutes: a batch into every table the
            # writer lands (Delta appends), read back, an aggregate as `fxgate sql` runs them.
            tables_dir = scratch_dir / "tables"
            batch = build_batch(_warm_up_records(), batch_id=1)
            landed = {
                READS: batch.reads,
                DEAD_LETTERS: batch.dead_letters,
                READER_EVENTS: batch.reader_events,
            }
            TableWriter(session, tables_dir, application_id("cds-warm-up")).write_batch(1, landed)
            df = read_table(session, tables_dir, READS)
            df.groupBy("reader_id").count().collect()
            df.toArrow()
        finally:
            stop_session(session, exit_timeout=DUMP_EXIT_TIMEOUT)
        if not partial.is_file() or partial.stat().st_size == 0:
            tail = (
                log_file.read_text(errors="replace").splitlines()[-3:] if log_file.exists() else []
            )
            raise RuntimeError("the JVM wrote no class data archive: " + " | ".join(tail))
    os.replace(partial, archive)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark.cds_archive",
        description="Write the Spark JVM's class data archive (make does, at install).",
    )
    parser.add_argument("archive", nargs="?", type=Path, default=DEFAULT_ARCHIVE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        seconds = make_archive(args.archive)
    except Exception as error:  # the gateway works without it: say so, exit non-zero
        print(f"no class data archive for the Spark JVM: {error}", file=sys.stderr)
        return 1
    size = args.archive.stat().st_size / 2**20
    print(f"class data archive for the Spark JVM: {args.archive} ({size:.0f} MiB, {seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
