"""The progress of long commands (actors/app/progress.py): plain lines on a stream that is not a
terminal (a first line, one per interval of the injected clock, a last one), a tqdm bar on one,
log lines in the daemon; and end to end, `fxgate compact`, `dead-letters replay` and `audit`
writing their plain lines on stderr while stdout carries their result alone."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from actors.app.cli import main
from actors.app.progress import ProgressReporter
from spark.tables import READS, ArrowTableWriter, application_id

DATE = "2026-11-20"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr in an operator's shell does."""

    def isatty(self) -> bool:
        return True


class WatchedStream(io.StringIO):
    """A stream that tells when something was written to it (from any thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def write(self, text: str) -> int:
        count = super().write(text)
        self.written.set()
        return count


def plain(clock: FakeClock, stream: io.StringIO | None = None) -> ProgressReporter:
    return ProgressReporter(stream or io.StringIO(), interval=5.0, clock=clock, heartbeat=False)


def test_off_a_terminal_a_first_line_a_line_per_interval_and_a_last_line_with_counts_and_rate():
    clock = FakeClock()
    stream = io.StringIO()
    progress = plain(clock, stream)

    progress.start("audit", 12, unit="tables", counts=("rows",))
    assert stream.getvalue() == "audit: 0/12 tables, 0 rows, 0.0 s\n"
    clock.now += 2
    progress.advance(3, rows=820)  # 2 s after the last line: not due
    clock.now += 3
    progress.advance(0, rows=1230, note="reader fx9600-01")  # 5 s: due
    clock.now += 4.9
    progress.advance(4, rows=1000)  # 4.9 s after the last line: not due
    clock.now += 0.1
    progress.advance(5, rows=1000)  # 5 s: due
    clock.now += 2
    progress.finish()

    assert stream.getvalue().splitlines() == [
        "audit: 0/12 tables, 0 rows, 0.0 s",
        "audit: 3/12 tables, 2,050 rows, 410 rows/s, 5.0 s; reader fx9600-01",
        "audit: 12/12 tables, 4,050 rows, 405 rows/s, 10.0 s; reader fx9600-01",
        "audit: done, 12/12 tables, 4,050 rows, 338 rows/s, 12.0 s",
    ]


def test_without_tallies_the_rate_is_of_the_unit_and_a_total_learnt_later_is_shown():
    clock = FakeClock()
    stream = io.StringIO()
    progress = plain(clock, stream)
    progress.start("dead-letters replay", unit="dead letters")
    progress.expect(40_000)
    clock.now += 8
    progress.advance(20_000)
    clock.now += 2
    progress.finish()
    assert stream.getvalue().splitlines() == [
        "dead-letters replay: 0 dead letters, 0.0 s",
        "dead-letters replay: 20,000/40,000 dead letters, 2,500 dead letters/s, 8.0 s",
        "dead-letters replay: done, 20,000/40,000 dead letters, 2,000 dead letters/s, 10.0 s",
    ]


def test_work_that_fails_inside_the_block_ends_with_a_stopped_line():
    clock = FakeClock()
    stream = io.StringIO()

    def failing_pass() -> None:
        with plain(clock, stream).start("compact", 4, unit="tables"):
            clock.now += 1.5
            raise RuntimeError("Spark failed")

    with pytest.raises(RuntimeError):
        failing_pass()
    assert stream.getvalue().splitlines()[-1] == "compact: stopped, 0/4 tables, 1.5 s"


def test_the_heartbeat_writes_a_due_line_while_the_work_holds_the_counts_still():
    clock = FakeClock()
    stream = WatchedStream()
    progress = ProgressReporter(stream, interval=0.01, clock=clock)  # heartbeat on
    progress.start("audit", 5, counts=("rows",), note="starting Spark")
    stream.written.clear()
    clock.now += 7.0  # a long Spark job: no advance comes
    assert stream.written.wait(10), "no line while the work was busy"
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert lines[1] == "audit: 0/5 steps, 0 rows, 7.0 s; starting Spark"
    assert lines[-1] == "audit: done, 0/5 steps, 0 rows, 7.0 s"


def test_on_a_terminal_a_tqdm_bar_is_drawn_in_place_with_the_counts():
    stream = Terminal()
    progress = ProgressReporter(stream, heartbeat=False)
    progress.start("compact", 4, unit="tables", counts=("files",))
    progress.advance(2, files=60)
    progress.finish()
    drawn = stream.getvalue()
    assert drawn.startswith("\rcompact:")
    assert drawn.count("\r") >= 2  # redrawn in place, not line after line
    assert "2/4" in drawn
    assert "60 files" in drawn
    assert "compact: 0/4 tables" not in drawn  # no plain line


def test_disabled_it_writes_nothing_anywhere():
    clock = FakeClock()
    stream = io.StringIO()
    progress = ProgressReporter(stream, clock=clock, enabled=False, heartbeat=False)
    with progress.start("audit", 3):
        clock.now += 60
        progress.advance(3, rows=10)
    assert stream.getvalue() == ""


def test_in_the_daemon_the_lines_go_to_its_log(caplog):
    clock = FakeClock()
    logger = logging.getLogger("tests.progress")
    progress = ProgressReporter.to_log(logger, interval=30, clock=clock)
    what = "converting the previous layout"
    with (
        caplog.at_level(logging.INFO, logger="tests.progress"),
        progress.start(what, unit="partitions", counts=("rows",)),
    ):
        progress.expect(10)
        clock.now += 30
        progress.advance(4, rows=12_000)
    assert [r.getMessage() for r in caplog.records] == [
        "converting the previous layout: 0 partitions, 0 rows, 0.0 s",
        "converting the previous layout: 4/10 partitions, 12,000 rows, 400 rows/s, 30.0 s",
        "converting the previous layout: done, 4/10 partitions, 12,000 rows, 400 rows/s, 30.0 s",
    ]


def test_the_conversion_of_the_previous_layout_counts_partitions_and_rows(tmp_path):
    """Three batches of the previous layout, one of them open (left to the ledger's replay):
    two partitions of the total, each counted once converted, with its rows."""
    import pyarrow.parquet as pq

    from spark.convert import convert_tables

    for batch, rows in ((1, 3), (2, 4), (3, 5)):
        directory = tmp_path / READS / f"date={DATE}" / f"batch_id={batch}"
        directory.mkdir(parents=True)
        ids = [f"b{batch}-{i}" for i in range(rows)]
        pq.write_table(pa.table({"message_id": ids}), directory / "part-00000.parquet")
    clock = FakeClock()
    stream = io.StringIO()
    with plain(clock, stream).start("converting", unit="partitions", counts=("rows",)) as progress:
        clock.now += 2
        result = convert_tables(tmp_path, open_batches={3}, progress=progress, chunk_rows=1)
    assert result.rows == 7
    assert stream.getvalue().splitlines()[-1] == (
        "converting: done, 2/2 partitions, 7 rows, 3.5 rows/s, 2.0 s"
    )


# -- end to end: the commands, in process (stderr is click's capture: not a terminal) ----------


def land_reads(tables: Path, batches: int, rows: int) -> None:
    """`batches` Delta commits of `rows` reads on one closed date, one file each."""
    writer = ArrowTableWriter(None, tables, application_id("progress-test"))
    for batch in range(1, batches + 1):
        ids = [f"b{batch}-{i}" for i in range(rows)]
        table = pa.table(
            {"message_id": ids, "reader_id": ["fx9600-01"] * rows, "date": [DATE] * rows}
        )
        writer.write_batch(batch, {READS: table})


def run(data: Path, *args: str):
    return CliRunner().invoke(main, list(args), env={"FXGATE__GATEWAY__DATA_DIR": str(data)})


def test_compact_writes_plain_progress_lines_on_stderr_and_its_result_alone_on_stdout(tmp_path):
    data = tmp_path / "data"
    land_reads(data / "tables", batches=6, rows=3)

    result = run(data, "compact")
    assert result.exit_code == 0, result.output
    assert re.fullmatch(
        r"maintenance pass: reads: 6 file\(s\) into 1, 0 vacuumed, version \d+ \(\d+\.\d+ s\)\n",
        result.stdout,
    )
    progress = [line for line in result.stderr.splitlines() if line.startswith("compact:")]
    assert progress[0] == "compact: 0 tables, 0 files, 0 vacuumed, 0.0 s"
    assert re.fullmatch(
        r"compact: done, 1/1 tables, 6 files, 0 vacuumed, [\d,.]+ files/s, \d+\.\d s",
        progress[-1],
    ), result.stderr

    # The same pass again, without progress: nothing on stderr but what it logs, and stdout
    # still only the result (nothing left to compact).
    quiet = run(data, "compact", "--no-progress")
    assert quiet.exit_code == 0, quiet.output
    assert not [line for line in quiet.stderr.splitlines() if line.startswith("compact:")]
    assert quiet.stdout.startswith("maintenance pass: reads: 0 file(s) into 0")


def test_dead_letters_replay_counts_the_dead_letters_read_on_stderr(tmp_path):
    from tests.actors.app.test_dead_letters import write_dead_letters

    tables = tmp_path / "data" / "tables"
    write_dead_letters(tables, 1, [b"not json", b"{}", b"also not json"])
    write_dead_letters(tables, 2, [b"[1]"])

    result = run(tmp_path / "data", "dead-letters", "replay", "--all", "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stdout == "would replay 4 dead letter(s)\n"
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "dead-letters replay: 0 dead letters, 0.0 s; reading the dead_letters table"
    )
    assert re.fullmatch(
        r"dead-letters replay: done, 4/4 dead letters, [\d,.]+ dead letters/s, \d+\.\d s",
        lines[-1],
    ), result.stderr


@pytest.mark.spark
def test_audit_writes_plain_progress_lines_on_stderr_and_only_its_json_on_stdout(
    spark_session, tmp_path, monkeypatch
):
    """The command's session is the suite's (no second JVM in this process)."""
    import spark.session
    from actors.ledger import LedgerRecord
    from spark.schema import build_batch

    records = [
        LedgerRecord(
            seq,
            f"key-{seq}",
            "zebra/fx/fx9600-01/reads",
            b'{"data": {"idHex": "e280", "antenna": 1, "eventNum": %d}, '
            b'"timestamp": "2026-11-21T10:00:00.000+0000", "type": "SIMPLE"}' % number,
            1,
            1_795_255_200.0 + seq,
            seq,
        )
        for seq, number in enumerate([1, 2, 3, 5, 6], start=1)  # 4 is missing
    ]
    tables = tmp_path / "tables"
    ArrowTableWriter(None, tables, application_id("audit-progress")).write_batch(
        1, {READS: build_batch(records, 1).reads}
    )
    monkeypatch.setattr(spark.session, "build_session", lambda *_a, **_k: spark_session)
    monkeypatch.setattr(spark.session, "stop_session", lambda _session: None)

    result = run(tmp_path / "data", "audit", "--tables", str(tables), "--json")
    assert result.exit_code == 1, result.output
    # stdout is the JSON report and nothing else.
    report = json.loads(result.stdout)
    assert report["readers"]["fx9600-01"]["missing"] == [[4, 4]]
    assert report["complete"] is False
    lines = result.stderr.splitlines()
    assert lines[0] == "audit: 0 steps, 0 rows, 0 readers, 0.0 s; starting Spark"
    assert re.fullmatch(
        r"audit: done, 4/4 steps, 5 rows, 1 readers, [\d,.]+ rows/s, \d+\.\d s", lines[-1]
    ), result.stderr


def test_report_writes_plain_progress_lines_on_stderr_and_its_comparison_on_stdout(tmp_path):
    from persistence.keys import read_id

    keys = [f"key-{i}" for i in range(3)]
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"topic": "zebra/fx/fx9600-01/reads", "message_key": k, "reads": 1}) + "\n"
            for k in keys
        )
    )
    ids = [read_id(k, 0) for k in keys]
    table = pa.table({"message_id": ids, "reader_id": ["fx9600-01"] * 3, "date": [DATE] * 3})
    ArrowTableWriter(None, tmp_path / "data" / "tables", application_id("report")).write_batch(
        1, {READS: table}
    )

    result = run(tmp_path / "data", "report", "--manifest", str(manifest))
    assert result.exit_code == 0, result.output
    # On this disk delta-rs reads the table: no JVM (a light install has none).
    assert result.stdout.startswith("reads table, read back with delta-rs:\n")
    assert result.stdout.endswith("EXACT: every published read landed once\n")
    assert "report:" not in result.stdout
    lines = result.stderr.splitlines()
    assert lines[0] == "report: 0/4 steps, 0 rows, 0.0 s; reading the manifest"
    assert re.fullmatch(r"report: done, 4/4 steps, 3 rows, [\d,.]+ rows/s, \d+\.\d s", lines[-1]), (
        result.stderr
    )
