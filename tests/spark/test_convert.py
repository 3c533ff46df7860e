"""Conversion of the previous layout (``date=D/batch_id=N`` Parquet) into Delta tables, in place.

The fixtures write the previous layout with pyarrow as its writers left it: partition values in
the path only, a compacted date with `landing_batch_id` and its `.compaction.json`, two schema
generations, the hidden leftovers of killed writes and compactions, and the tables directory's
lock files. Every check compares a Counter of the row ids (`seq`) with the exact expectation.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from spark.convert import (
    COMPACTED_BASE,
    CONVERT_AFTER_COMMIT,
    CONVERT_AFTER_WRITE_BEFORE_COMMIT,
    CONVERT_DURING_REMOVAL,
    LEGACY_APP_ID,
    ConversionResult,
    convert_tables,
    legacy_tables,
)
from spark.tables import ArrowTableWriter, application_id, read_table_arrow, table_properties

REPO = Path(__file__).resolve().parents[2]
DAY1, DAY2, DAY3 = "2026-11-17", "2026-11-18", "2026-11-19"
COMPACTED = COMPACTED_BASE + 1
OPEN_BATCH = 11
BASE_TIME = datetime(2026, 11, 17, tzinfo=UTC)
# Small bounds, so the fixture's reads take five commits (see test_every_row...).
BOUNDS = {"chunk_rows": 25, "chunk_directories": 3}
LOCK_FILES = (".compaction.lock", ".swap.lock", ".swap.gate")


def received(seq: int) -> datetime:
    return BASE_TIME + timedelta(seconds=seq)


def reads_rows(seqs: list[int], generation: int, landing: list[int | None] | None = None):
    """Reads of the older generation (no `reader_mode`/`access_results`, tz-naive timestamps,
    as an older writer left them) or the newer one; `landing` adds `landing_batch_id`."""
    columns: dict[str, pa.Array] = {
        "seq": pa.array(seqs, pa.int64()),
        "epc": pa.array([f"E{s:08d}" for s in seqs]),
        "antenna": pa.array([1 + s % 4 for s in seqs], pa.int32()),
    }
    if generation == 1:
        naive = [received(s).replace(tzinfo=None) for s in seqs]
        columns["received_time"] = pa.array(naive, pa.timestamp("us"))
    else:
        columns["received_time"] = pa.array(
            [received(s) for s in seqs], pa.timestamp("us", tz="UTC")
        )
        columns["reader_mode"] = pa.array([f"MODE{s % 3}" for s in seqs])
        columns["access_results"] = pa.array([[f"r{s}"] for s in seqs], pa.list_(pa.string()))
    if landing is not None:
        columns["landing_batch_id"] = pa.array(landing, pa.int64())
    return pa.table(columns)


def events_rows(seqs: list[int]) -> pa.Table:
    return pa.table({"seq": pa.array(seqs, pa.int64()), "id": [f"ev{s}" for s in seqs]})


def write_dir(table_dir: Path, date: str, batch_id: int, *files: pa.Table) -> Path:
    directory = table_dir / f"date={date}" / f"batch_id={batch_id}"
    directory.mkdir(parents=True, exist_ok=True)
    for index, rows in enumerate(files):
        first = rows.column("seq")[0].as_py()
        pq.write_table(rows, directory / f"part-{index:05d}-{first}.snappy.parquet")
    return directory


@dataclass
class Legacy:
    """An old-layout tables directory and what each table must hold after conversion."""

    root: Path
    # table -> seq -> (date, landing batch)
    expected: dict[str, dict[int, tuple[str, int]]] = field(default_factory=dict)
    # (table, seq) -> reader_mode
    reader_mode: dict[tuple[str, int], str | None] = field(default_factory=dict)

    def land(self, table: str, date: str, batch_id: int, *files: pa.Table) -> Path:
        directory = write_dir(self.root / table, date, batch_id, *files)
        for rows in files:
            landing = (
                rows.column("landing_batch_id").to_pylist()
                if ("landing_batch_id" in rows.column_names)
                else [None] * rows.num_rows
            )
            modes = (
                rows.column("reader_mode").to_pylist()
                if "reader_mode" in rows.column_names
                else [None] * rows.num_rows
            )
            for seq, land, mode in zip(rows.column("seq").to_pylist(), landing, modes, strict=True):
                self.expected.setdefault(table, {})[seq] = (date, land or batch_id)
                self.reader_mode[table, seq] = mode
        return directory


def build_legacy(root: Path) -> Legacy:
    """reads: a compacted DAY1 (landing batches 1-3), landing batches 4-10 over DAY2 and DAY3
    (batch 4 spans both; 4-6 of the older generation; 8 in two files; 9 with an all-null
    `landing_batch_id`), open batch 11; events: batches 4, 5 and open 11. Plus leftovers."""
    legacy = Legacy(root)
    reads = root / "reads"
    compacted = legacy.land(
        "reads",
        DAY1,
        COMPACTED,
        reads_rows(list(range(1, 31)), 2, landing=[1 + (s - 1) // 10 for s in range(1, 31)]),
    )
    (compacted / ".compaction.json").write_text(json.dumps({"absorbed": [[1, 3]]}))
    (compacted / ".part-00000-x.snappy.parquet.crc").write_bytes(b"crc")
    legacy.land("reads", DAY2, 4, reads_rows(list(range(31, 36)), 1))
    legacy.land("reads", DAY3, 4, reads_rows(list(range(36, 41)), 1))
    legacy.land("reads", DAY2, 5, reads_rows(list(range(41, 51)), 1))
    legacy.land("reads", DAY2, 6, reads_rows(list(range(51, 61)), 1))
    legacy.land("reads", DAY3, 7, reads_rows(list(range(61, 71)), 2))
    legacy.land("reads", DAY3, 8, reads_rows(list(range(71, 75)), 2), reads_rows([75, 76], 2))
    legacy.land("reads", DAY3, 8, reads_rows(list(range(77, 81)), 2))  # a third file
    legacy.land("reads", DAY3, 9, reads_rows(list(range(81, 91)), 2, landing=[None] * 10))
    legacy.land("reads", DAY3, 10, reads_rows(list(range(91, 101)), 2))
    # The open batch: not in `expected`, the ledger replays it.
    write_dir(reads, DAY3, OPEN_BATCH, reads_rows(list(range(101, 111)), 2))
    legacy.land("events", DAY2, 4, events_rows([1, 2, 3]))
    legacy.land("events", DAY2, 5, events_rows([4, 5, 6]))
    write_dir(root / "events", DAY2, OPEN_BATCH, events_rows([7, 8, 9]))

    # Hidden leftovers, some with Parquet files that look like data: none of it ever was.
    hidden = [
        f".compacting-date={DAY2}-batch_id={COMPACTED + 1}/batch_id={COMPACTED + 1}",
        f".replaced-date={DAY1}-batch_id={COMPACTED}-1795000000/batch_id=3",
        f".landing-7-abc/date={DAY3}/batch_id=7",
        f".overwritten-abc-date={DAY3}-batch_id=6",
        ".spark-staging-1234/_temporary/0/date=2026-11-19/batch_id=12",
        "_temporary/0",
        f"date={DAY2}/_temporary/0",
    ]
    for number, relative in enumerate(hidden):
        directory = reads / relative
        directory.mkdir(parents=True)
        pq.write_table(reads_rows([900 + number], 2), directory / "part-00000.parquet")
    (reads / "_SUCCESS").write_bytes(b"")
    for name in LOCK_FILES:
        (root / name).write_text('{"role": "daemon", "pid": 1}')
    return legacy


def legacy_entries(root: Path) -> list[str]:
    """What of the previous layout is left: `batch_id=` directories in date directories,
    hidden leftovers anywhere outside the Delta log, the lock files."""
    found = [name for name in LOCK_FILES if (root / name).exists()]
    for table_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(table_dir.rglob("*")):
            relative = path.relative_to(root)
            if relative.parts[1] == "_delta_log":
                continue
            name = path.name
            if name.startswith((".", "_")) or name.startswith("batch_id="):
                found.append(str(relative))
    return found


def delta_files(table_dir: Path) -> set[str]:
    """The data files under `table_dir`'s date directories."""
    return {
        str(p.relative_to(table_dir))
        for p in table_dir.glob("date=*/*")
        if p.is_file() and p.suffix == ".parquet"
    }


def assert_converted(legacy: Legacy) -> None:
    """Every expected row once, with its date and landing batch; nothing legacy left."""
    for table, expected in legacy.expected.items():
        rows = read_table_arrow(legacy.root, table)
        seqs = rows.column("seq").to_pylist()
        assert Counter(seqs) == Counter(list(expected)), table
        placed = dict(
            zip(
                seqs,
                zip(
                    rows.column("date").to_pylist(),
                    rows.column("batch_id").to_pylist(),
                    strict=True,
                ),
                strict=True,
            )
        )
        assert placed == expected, table
    assert legacy_entries(legacy.root) == []


def convert(root: Path, **kwargs) -> ConversionResult:
    return convert_tables(root, open_batches=[OPEN_BATCH], **{**BOUNDS, **kwargs})


def test_every_row_lands_once_with_its_landing_batch_and_the_old_layout_is_gone(tmp_path):
    legacy = build_legacy(tmp_path)
    assert legacy_tables(tmp_path) == ["events", "reads"]

    result = convert(tmp_path)

    assert_converted(legacy)
    assert legacy_tables(tmp_path) == []
    reads, events = result.tables["reads"], result.tables["events"]
    # reads: 30 compacted rows + batches 4-10 of 10 rows each; events: 2 batches of 3.
    assert (reads.rows, reads.batches, reads.open_partitions) == (100, 8, 1)
    assert (events.rows, events.batches, events.commits, events.open_partitions) == (6, 2, 1, 1)
    assert result.lock_files_removed == 3
    # At most 25 rows and 3 directories per commit, a batch never split (4 spans two dates).
    history = DeltaTable(str(tmp_path / "reads")).history()
    chunks = [c["fxgate.legacyBatches"] for c in reversed(history) if "fxgate.legacyBatches" in c]
    assert chunks == ["4-5", "6-7", "8-9", "10-10", f"{COMPACTED}-{COMPACTED}"]
    assert reads.commits == 5
    delta = DeltaTable(str(tmp_path / "reads"))
    assert delta.transaction_version(LEGACY_APP_ID) == COMPACTED
    assert delta.metadata().partition_columns == ["date"]
    assert {k: v for k, v in delta.metadata().configuration.items()} == table_properties()
    # Only the files the log lists are in the date directories (no crash, no orphan).
    listed = {uri.split("/reads/", 1)[1] for uri in delta.file_uris()}
    assert delta_files(tmp_path / "reads") == listed
    assert "rows of 10 legacy batch(es) in 6 commit(s)" in result.summary()


def test_columns_of_each_schema_generation_keep_their_values(tmp_path):
    legacy = build_legacy(tmp_path)
    convert(tmp_path)

    rows = read_table_arrow(tmp_path, "reads").to_pylist()
    assert {r["seq"]: r["reader_mode"] for r in rows} == {
        seq: legacy.reader_mode["reads", seq] for seq in legacy.expected["reads"]
    }
    # The older generation's tz-naive timestamps were UTC: the same instants come back.
    assert {r["seq"]: r["received_time"] for r in rows} == {
        seq: received(seq) for seq in legacy.expected["reads"]
    }
    assert {r["seq"]: r["access_results"] for r in rows if r["seq"] in (1, 31, 61)} == {
        1: ["r1"],
        31: None,
        61: ["r61"],
    }
    assert "landing_batch_id" not in read_table_arrow(tmp_path, "reads").column_names


def test_a_second_run_does_nothing_and_reads_no_parquet_file(tmp_path, monkeypatch):
    build_legacy(tmp_path)
    convert(tmp_path)
    versions = {t: DeltaTable(str(tmp_path / t)).version() for t in ("reads", "events")}

    def no_parquet(*args, **kwargs):
        raise AssertionError("a converted table's Parquet files were read")

    for name in ("read_metadata", "read_schema", "ParquetFile"):
        monkeypatch.setattr(pq, name, no_parquet)
    again = convert(tmp_path)

    assert not again.done
    assert again.summary() == "no table of the previous layout"
    assert {t: DeltaTable(str(tmp_path / t)).version() for t in versions} == versions


def test_an_open_batch_is_left_to_the_replay_even_inside_a_compacted_date(tmp_path):
    """The ledger replays an open batch into Delta itself: converting its rows would land them
    twice, whether they sit in its own partition or were absorbed by a compaction."""
    table = tmp_path / "reads"
    write_dir(table, DAY1, COMPACTED, reads_rows([1, 2, 3, 4], 2, landing=[1, OPEN_BATCH, 2, None]))
    write_dir(table, DAY2, 2, reads_rows([5, 6], 2))
    write_dir(table, DAY2, OPEN_BATCH, reads_rows([7, 8], 2))

    result = convert_tables(tmp_path, open_batches=[OPEN_BATCH, 99])

    rows = read_table_arrow(tmp_path, "reads")
    assert Counter(
        zip(rows.column("seq").to_pylist(), rows.column("batch_id").to_pylist(), strict=True)
    ) == (Counter({(1, 1): 1, (3, 2): 1, (4, COMPACTED): 1, (5, 2): 1, (6, 2): 1}))
    assert result.tables["reads"].open_partitions == 1
    assert not (table / f"date={DAY2}" / f"batch_id={OPEN_BATCH}").exists()
    assert legacy_entries(tmp_path) == []


def test_a_table_only_of_open_batches_makes_no_delta_table(tmp_path):
    write_dir(tmp_path / "events", DAY2, OPEN_BATCH, events_rows([1, 2]))

    result = convert_tables(tmp_path, open_batches=[OPEN_BATCH])

    assert result.tables["events"].commits == 0
    assert not (tmp_path / "events" / "_delta_log").exists()
    assert legacy_entries(tmp_path) == []
    assert legacy_tables(tmp_path) == []


def test_legacy_rows_join_a_delta_table_that_exists_and_new_columns_are_added(tmp_path):
    """A Delta table already there (a conversion cut short, or one the new writer made):
    its rows and its ledger's version stay, the legacy rows join them, a legacy column the
    table lacks is added."""
    app = application_id("gw1")
    landed = pa.table(
        {
            "seq": pa.array([1000], pa.int64()),
            "epc": ["E1000"],
            "date": [DAY3],
            "pack_id": pa.array([7], pa.int64()),
        }
    )
    ArrowTableWriter(None, tmp_path, app).write_batch(1, {"reads": landed})
    legacy = build_legacy(tmp_path)

    convert(tmp_path)

    rows = read_table_arrow(tmp_path, "reads")
    expected = {**legacy.expected["reads"], 1000: (DAY3, 1)}
    assert Counter(rows.column("seq").to_pylist()) == Counter(list(expected))
    modes = dict(
        zip(rows.column("seq").to_pylist(), rows.column("reader_mode").to_pylist(), strict=True)
    )
    assert modes[1000] is None
    assert modes[61] == legacy.reader_mode["reads", 61]
    delta = DeltaTable(str(tmp_path / "reads"))
    assert delta.transaction_version(app) == 1
    assert delta.transaction_version(LEGACY_APP_ID) == COMPACTED


def test_a_table_partitioned_otherwise_is_refused_and_left_as_it_is(tmp_path):
    table = tmp_path / "reads"
    DeltaTable.create(
        str(table),
        schema=pa.schema([("seq", pa.int64()), ("day", pa.string())]),
        partition_by=["day"],
    )
    write_dir(table, DAY2, 2, reads_rows([5, 6], 2))

    with pytest.raises(ValueError, match="partitioned by"):
        convert_tables(tmp_path)
    assert legacy_tables(tmp_path) == ["reads"]


def test_an_unreadable_legacy_file_stops_the_conversion_and_removes_nothing(tmp_path):
    """A legacy file that is not Parquet stops the table's conversion with an error before its
    chunk commits; what was committed stays, nothing is removed, and once the file is put right
    a rerun lands every row once."""
    legacy = build_legacy(tmp_path)
    bad = sorted((tmp_path / "reads" / f"date={DAY3}" / "batch_id=8").glob("*.parquet"))[0]
    good = bad.read_bytes()
    bad.write_bytes(b"not parquet")

    with pytest.raises(pa.ArrowInvalid):
        convert(tmp_path)

    # events converted and removed; reads' first chunk (batches 4-5) committed, its second
    # (6-7, whose bound is checked on batch 8's footer) not, nothing of reads removed.
    seqs = read_table_arrow(tmp_path, "reads").column("seq").to_pylist()
    assert Counter(seqs) == Counter(range(31, 51))
    assert legacy_tables(tmp_path) == ["reads"]

    bad.write_bytes(good)
    convert(tmp_path)

    assert_converted(legacy)


CHILD = """
import os, signal, sys
from pathlib import Path
from spark.convert import convert_tables

root, target, hit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
hits = 0

def checkpoint(name):
    global hits
    if name == target:
        hits += 1
        if hits == hit:
            os.kill(os.getpid(), signal.SIGKILL)

convert_tables(root, open_batches=[int(sys.argv[4])], checkpoint=checkpoint, **eval(sys.argv[5]))
"""


def convert_and_kill(root: Path, target: str, hit: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), target, str(hit), str(OPEN_BATCH), repr(BOUNDS)],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == -signal.SIGKILL, process.stderr


@pytest.mark.parametrize(
    ("target", "hit"),
    [
        (CONVERT_AFTER_WRITE_BEFORE_COMMIT, 1),  # events' first chunk: its table just created
        (CONVERT_AFTER_WRITE_BEFORE_COMMIT, 3),  # reads' second chunk, its first committed
        (CONVERT_AFTER_COMMIT, 1),
        (CONVERT_AFTER_COMMIT, 4),  # reads' third commit
        (CONVERT_DURING_REMOVAL, 1),  # events: one legacy directory gone, one left
        (CONVERT_DURING_REMOVAL, 2),  # reads: the same, events done
    ],
)
def test_a_conversion_killed_at_any_step_lands_every_row_once_on_the_rerun(tmp_path, target, hit):
    legacy = build_legacy(tmp_path)

    convert_and_kill(tmp_path, target, hit)

    # What the kill left: no row twice, none that was not expected, the old layout still there.
    before = {}
    for table, expected in legacy.expected.items():
        rows = read_table_arrow(tmp_path, table)  # no Delta table yet: no `seq` column
        seqs = rows.column("seq").to_pylist() if "seq" in rows.column_names else []
        counts = Counter(seqs)
        assert set(counts) <= set(expected) and max(counts.values(), default=1) == 1
        before[table] = len(seqs)
    assert legacy_tables(tmp_path) != []

    rerun = convert(tmp_path)

    assert_converted(legacy)
    for table, expected in legacy.expected.items():
        done = rerun.tables.get(table)
        assert before[table] + (done.rows if done else 0) == len(expected), table
    assert not convert(tmp_path).done


def duckdb_with_delta():
    """A DuckDB connection with the delta extension loaded, from DuckDB's own extension
    directory or from the `duckdb-ext-delta` package's build for this DuckDB version; None when
    neither is there (nothing is downloaded)."""
    duckdb = pytest.importorskip("duckdb")
    config = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    connection = duckdb.connect(config=config)
    installed = connection.execute(
        "SELECT installed FROM duckdb_extensions() WHERE extension_name = 'delta'"
    ).fetchall()
    if installed == [(True,)]:
        connection.execute("LOAD delta")
        return connection
    spec = importlib.util.find_spec("duckdb_ext")
    for root in [] if spec is None else list(spec.submodule_search_locations or []):
        for built in Path(root).glob(f"extensions/v{duckdb.__version__}/*/delta.duckdb_extension"):
            connection = duckdb.connect(config={**config, "allow_unsigned_extensions": True})
            connection.execute(f"LOAD '{built}'")
            return connection
    return None


def test_the_converted_table_reads_in_duckdb_delta_scan(tmp_path):
    connection = duckdb_with_delta()
    if connection is None:
        pytest.skip("DuckDB's delta extension is not installed for this DuckDB version")
    legacy = build_legacy(tmp_path)
    convert(tmp_path)

    found = connection.execute(
        "SELECT seq, date, batch_id, reader_mode FROM delta_scan(?)", [str(tmp_path / "reads")]
    ).fetchall()

    assert Counter(seq for seq, *_ in found) == Counter(list(legacy.expected["reads"]))
    assert {seq: (str(date), batch) for seq, date, batch, _ in found} == legacy.expected["reads"]
    assert {seq: mode for seq, *_, mode in found} == {
        seq: legacy.reader_mode["reads", seq] for seq in legacy.expected["reads"]
    }
