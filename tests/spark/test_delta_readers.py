"""Readers that take no lock see one committed version of `reads`, whole, whatever runs beside them.

Readers in other processes — Spark (`format("delta")`), DuckDB (`delta_scan`), Polars
(`read_delta`) and delta-rs — read the table in a loop (tests/harness/delta_readers.py) while
batches land and OPTIMIZE and VACUUM run with no retention, so that compaction rewrites and
VACUUM deletes files under their feet. Every read must be the rows of one committed version
exactly: batches 1..m for some m (they commit in order), each with all of its rows, no key twice.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from spark.maintenance import DeltaMaintainer
from spark.tables import READS, ArrowTableWriter, table_path
from tests.harness.delta_readers import (
    ENGINES,
    ReaderProcess,
    VacuumWindow,
    delta_readers,
    key_digest,
    short_error,
    table_exists,
    unexplained_failures,
    vacuum_windows,
)

pytestmark = pytest.mark.spark

DAY_1 = "2026-11-21"
DAY_2 = "2026-11-22"
# The maintainer's clock: DAY_1 is closed (packed into big files), DAY_2 still open.
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC).timestamp()
BATCHES = 24
PASS_EVERY = 6  # batches between maintenance passes: 4 passes, each compacting 12 files
KEY = "message_id"
# A Spark JVM starts in 5-8 s on the CI machine (DESIGN §4); far longer on a loaded one.
START_TIMEOUT = 240.0
READ_TIMEOUT = 120.0
MIN_READS = 3


def batch_keys(batch_id: int) -> list[str]:
    """Batch K's keys: unique across batches, and a row count of its own (10 to 22)."""
    return [f"b{batch_id:03d}-r{i:02d}" for i in range(10 + (batch_id * 7) % 13)]


def batch_table(batch_id: int) -> pa.Table:
    keys = batch_keys(batch_id)
    return pa.table(
        {
            KEY: pa.array(keys, pa.string()),
            "epc": pa.array([f"epc-{key}" for key in keys], pa.string()),
            "date": pa.array([(DAY_1, DAY_2)[i % 2] for i in range(len(keys))], pa.string()),
        }
    )


def expected_batch(batch_id: int) -> tuple[int, str]:
    keys = batch_keys(batch_id)
    return len(keys), key_digest(keys)


def inconsistencies(read: dict) -> list[str]:
    """What makes one read something other than batches 1..m of this test, whole and once."""
    found = []
    batches = {int(b): rows for b, rows in read["batches"].items()}
    m = len(batches)
    if set(batches) != set(range(1, m + 1)):
        found.append(f"batches {sorted(batches)} are not 1..{m}")
    for batch_id, rows in batches.items():
        want_rows, want_digest = expected_batch(batch_id)
        if rows != want_rows or read["batch_digests"][str(batch_id)] != want_digest:
            found.append(f"batch {batch_id}: {rows} rows, expected {want_rows} (or other keys)")
    if read["duplicate_keys"]:
        found.append(f"keys read twice: {read['duplicate_keys'][:10]}")
    if not read["rows"] == read["distinct_keys"] == sum(batches.values()):
        found.append(f"{read['rows']} rows, {read['distinct_keys']} distinct keys")
    return found


def batches_at(version: int, landed: list[tuple[int, int]]) -> int:
    """How many batches the table holds at Delta `version`, from the writer's own record of
    (version, batches in) after each commit; maintenance commits change no data."""
    return max((count for at, count in landed if at <= version), default=0)


def checked_reads(reader: ReaderProcess, windows: list[VacuumWindow]) -> list[dict]:
    """The reads of `reader` that returned rows, once it is known that it ended well, made
    MIN_READS of them, and that each read that failed did so on a file a VACUUM deleted
    under a snapshot the reader had opened before the OPTIMIZE that replaced it (with a
    retention of 0 nothing protects such a reader: Delta's rule, not an inconsistency)."""
    engine = reader.engine
    assert reader.proc.returncode == 0, f"{engine} reader:\n{reader.output()}"
    reads = reader.reads()
    unexplained = unexplained_failures(reads, windows)
    assert not unexplained, (
        f"{engine}: {len(unexplained)} read(s) failed other than on a vacuumed file: "
        f"{[(r['read'], r['started'], r['ended'], r['error']) for r in unexplained[:3]]}; "
        f"VACUUMs: {windows}"
    )
    good = [read for read in reads if "error" not in read]
    assert len(good) >= MIN_READS, f"{engine}: {len(good)} reads"
    return good


def failures_said(readers: dict[str, ReaderProcess]) -> str:
    """Each engine's reads and failed reads, with the first failure's own words."""
    parts = []
    for engine, reader in readers.items():
        reads = reader.reads()
        failed = [read for read in reads if "error" in read]
        part = f"{engine}: {len(reads) - len(failed)} reads, {len(failed)} failed"
        if failed:
            part += f" (first: {short_error(failed[0]['error'])})"
        parts.append(part)
    return "; ".join(parts)


def live_and_on_disk(path: str) -> tuple[int, int]:
    """(data files the current snapshot lists, Parquet files on disk) of the table."""
    from deltalake import DeltaTable

    on_disk = [f for f in Path(path).rglob("*.parquet") if "_delta_log" not in f.parts]
    return len(DeltaTable(path).file_uris()), len(on_disk)


@pytest.mark.timeout(600)
def test_lock_free_readers_of_every_engine_see_whole_versions_through_optimize_and_vacuum(
    tmp_path,
):
    from deltalake import DeltaTable

    tables = tmp_path / "tables"
    path = table_path(str(tables), READS)
    writer = ArrowTableWriter(None, tables, "fxgate-ledger-delta-readers-test")
    maintainer = DeltaMaintainer(tables, vacuum_retention_hours=0, tables=(READS,))
    landed: list[tuple[int, int]] = []  # (Delta version, batches in), after each commit
    passes = []  # (wall time the pass ended, its result, files on disk before it)
    started = time.monotonic()

    with delta_readers(ENGINES, path, tmp_path / "readers", key=KEY) as readers:
        for reader in readers.values():
            reader.wait_ready(START_TIMEOUT)
        # The table does not exist yet: each engine's first read is an empty one.
        before_table = time.time()
        for reader in readers.values():
            reader.wait_for_read_started_after(before_table, READ_TIMEOUT)

        for batch_id in range(1, BATCHES + 1):
            writer.write_batch(batch_id, {READS: batch_table(batch_id)})
            landed.append((DeltaTable(path).version(), batch_id))
            if batch_id % PASS_EVERY:
                continue
            on_disk_before = live_and_on_disk(path)[1]
            result = maintainer.run(NOW)
            passes.append((time.time(), result, on_disk_before))
            landed.append((DeltaTable(path).version(), batch_id))
            # Every engine reads the compacted and vacuumed table before the next batches.
            for reader in readers.values():
                reader.wait_for_read_started_after(passes[-1][0], READ_TIMEOUT)
        all_landed = time.time()
        for reader in readers.values():
            reader.wait_for_read_started_after(all_landed, READ_TIMEOUT)
    seconds = time.monotonic() - started

    # The maintenance really pulled files from under the readers: every pass compacted the
    # small files of both dates and VACUUM deleted the files it replaced from the disk.
    assert len(passes) == BATCHES // PASS_EVERY
    for _, result, on_disk_before in passes:
        (maintained,) = result.tables
        assert maintained.files_removed >= 2 * PASS_EVERY, result.summary()
        assert maintained.files_vacuumed >= maintained.files_removed, result.summary()
        assert on_disk_before >= 2 * PASS_EVERY
    live, on_disk = live_and_on_disk(path)
    assert on_disk == live <= 2, f"{on_disk} Parquet files on disk, {live} live"

    vacuumed_at = [ended for ended, result, _ in passes if result.tables[0].files_vacuumed]
    windows = vacuum_windows(path)
    assert len(windows) == len(passes)
    for engine, reader in readers.items():
        good = checked_reads(reader, windows)
        for read in good:
            problems = inconsistencies(read)
            assert not problems, f"{engine} read {read['read']}: {problems}"
            if read["version"] is not None:
                assert len(read["batches"]) == batches_at(read["version"], landed), read
        # Reads before the table existed were empty ones; reads after the last batch were
        # whole; reads came after a compaction and a VACUUM had removed files.
        assert not good[0]["exists"] and good[0]["rows"] == 0, good[0]
        assert len(good[-1]["batches"]) == BATCHES, good[-1]
        assert any(read["started"] > vacuumed_at[0] for read in good), engine
        assert len({len(read["batches"]) for read in good}) >= 3, f"{engine} saw few versions"
    print(f"{failures_said(readers)}; {seconds:.1f} s")


# -- the same readers beside the real daemon --------------------------------------------------

ROUNDS = 3
PER_ROUND = 1000  # messages per round, one read each, from two readers
SLICE = 100  # messages published at once
READERS = ("fx9600-01", "fx9600-02")
# A pass line of the daemon whose VACUUM deleted files of `reads` (spark/maintenance.py's
# summary, as actors/writer.py logs it).
VACUUMING_PASS = (
    r"maintenance pass \(\w+\): (?:.*; )?reads: \d+ file\(s\) into \d+, [1-9]\d* vacuumed"
)
BATCH_WRITTEN = r"(?i)batch \d+ written"


def write_daemon_config(path: Path, broker, data: Path) -> Path:
    """Short packs and batches, and a maintenance pass every second that vacuums at once."""
    path.write_text(
        f"""
[gateway]
data_dir = "{data}"

[source]
port = {broker.port}

[packs]
max_messages = 50
linger_seconds = 0.2

[spark]
batch_max_seconds = 0.5

[compaction]
enabled = true
start_delay_seconds = 1
interval_seconds = 1
vacuum_retention_hours = 0
"""
    )
    return path


def tag_events(count: int) -> tuple[list[tuple[str, bytes]], set[str]]:
    """`count` tag events of READERS, interleaved, and the `message_id` each must land as."""
    from actors.devtools.simulate import TagEventGenerator
    from persistence.keys import message_key, read_id

    generators = [TagEventGenerator(reader, seed=11) for reader in READERS]
    messages = []
    for index in range(count):
        generator = generators[index % len(generators)]
        messages.append((f"zebra/fx/{generator.reader}/reads", generator.next_payload()))
    return messages, {read_id(message_key(topic, payload), 0) for topic, payload in messages}


def wait_until_counted(daemon, path: str, expected: int, timeout: float = 120.0) -> None:
    """Wait, on the daemon's 'batch written' lines, until the table's log counts `expected`
    rows (delta-rs, from the files' statistics: no data file is opened, so nothing here races
    with a VACUUM)."""
    from deltalake import DeltaTable

    deadline = time.monotonic() + timeout
    while True:
        mark = daemon.mark()
        rows = DeltaTable(path).count() if table_exists(path) else 0
        if rows >= expected:
            return
        remaining = deadline - time.monotonic()
        assert remaining > 0 and daemon.exit_status() is None, (
            f"{rows} of {expected} rows after {timeout} s (daemon exit status "
            f"{daemon.exit_status()}); log tail:\n{daemon.output(last=60)}"
        )
        try:
            daemon.wait_for_log(BATCH_WRITTEN, timeout=min(remaining, 5.0), after=mark)
        except AssertionError:
            continue  # the checks above decide


def batch_contents(table) -> dict[int, tuple[int, str]]:
    """{batch id: (rows, key digest)} of a table read with the key and batch id columns."""
    keys: dict[int, list[str]] = {}
    for key, batch_id in zip(
        table.column(KEY).to_pylist(), table.column("batch_id").to_pylist(), strict=True
    ):
        keys.setdefault(batch_id, []).append(key)
    return {batch_id: (len(v), key_digest(v)) for batch_id, v in sorted(keys.items())}


@pytest.mark.broker
@pytest.mark.timeout(900)
def test_lock_free_readers_see_whole_versions_while_the_daemon_lands_and_maintains_reads(
    mosquitto, daemon_factory, tmp_path
):
    from deltalake import DeltaTable

    from tests.harness.mqtt import publish_all

    data = tmp_path / "data"
    path = str(data / "tables" / READS)
    config = write_daemon_config(tmp_path / "gateway.toml", mosquitto, data)
    messages, published = tag_events(ROUNDS * PER_ROUND)
    known = tmp_path / "published-keys.txt"
    known.write_text("\n".join(sorted(published)) + "\n")
    started = time.monotonic()

    daemon = daemon_factory({}, config)
    daemon.wait_for_log(r"source: subscribed to zebra/fx/\+/reads", timeout=120)
    # Pacing of the fast engines: 5 reads a second each leaves the CPUs to the daemon.
    with delta_readers(
        ENGINES, path, tmp_path / "readers", known_keys=known, min_interval=0.2
    ) as readers:
        for reader in readers.values():
            reader.wait_ready(START_TIMEOUT)
        vacuumed_at = []  # wall times by which a pass had vacuumed files of `reads`
        for round_ in range(ROUNDS):
            mark = daemon.mark()
            # In slices, each landed before the next: many batches, many small files for the
            # passes to compact and vacuum while the readers read.
            for first in range(round_ * PER_ROUND, (round_ + 1) * PER_ROUND, SLICE):
                publish_all(
                    mosquitto.host,
                    mosquitto.port,
                    messages[first : first + SLICE],
                    qos=1,
                    client_id=f"readers-test-{first}",
                )
                wait_until_counted(daemon, path, first + SLICE)
            # A pass compacted and vacuumed files of this round's batches (a pass runs every
            # second, between the writes); then every engine reads again.
            daemon.wait_for_log(VACUUMING_PASS, timeout=60, after=mark)
            vacuumed_at.append(time.time())
            for reader in readers.values():
                reader.wait_for_read_started_after(vacuumed_at[-1], READ_TIMEOUT)
    assert daemon.terminate() == 0, daemon.output(last=60)
    seconds = time.monotonic() - started

    # The table as it ended, read once the daemon has stopped: what was published, once each.
    final = DeltaTable(path).to_pyarrow_table(columns=[KEY, "batch_id"])
    assert sorted(final.column(KEY).to_pylist()) == sorted(published)
    contents = batch_contents(final)
    order = list(contents)  # batch ids in increasing order: the order they committed in
    passes = daemon.count_logs(VACUUMING_PASS)
    assert passes >= ROUNDS

    windows = vacuum_windows(path)
    for engine, reader in readers.items():
        good = checked_reads(reader, windows)
        for read in good:
            # Whole batches, the first m of those that landed, in the order they committed;
            # only published keys, none twice.
            batches = {int(b): rows for b, rows in read["batches"].items()}
            m = len(batches)
            assert sorted(batches) == order[:m], f"{engine} read {read['read']}: {sorted(batches)}"
            for batch_id, rows in batches.items():
                assert (rows, read["batch_digests"][str(batch_id)]) == contents[batch_id], (
                    f"{engine} read {read['read']}: batch {batch_id} has {rows} rows, "
                    f"expected {contents[batch_id][0]} (or other keys)"
                )
            assert read["duplicate_keys"] == [] and read["unknown_keys"] == 0, read
            assert read["rows"] == read["distinct_keys"] == sum(batches.values())
        # The last read, after everything landed and was compacted: exactly what was published.
        last = good[-1]
        assert last["started"] > vacuumed_at[-1]
        assert last["rows"] == last["distinct_keys"] == len(published), last["rows"]
        assert any(read["started"] > vacuumed_at[0] for read in good)
    print(f"{failures_said(readers)}; {passes} vacuuming passes; {seconds:.1f} s")
