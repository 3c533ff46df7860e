"""Readers of a Delta table as its users read it, with no lock and no fxgate code in the read.

Each engine reads the way its users would: Spark `spark.read.format("delta").load(path)`,
DuckDB `delta_scan('path')` (the delta extension from the PyPI package `duckdb-ext-delta`,
loaded from its file: nothing is downloaded), Polars `pl.read_delta(path)`, and delta-rs
`DeltaTable(path).to_pyarrow_table()`. Only the key and `batch_id` columns are asked for.

The command line reads one table in a loop, in its own process, until a stop file appears (or a
count or a time runs out, so that it always ends), and writes one JSON line per read:

    python -m tests.harness.delta_readers --engine duckdb --table PATH \\
        --until-file STOP --out reads.jsonl [--key message_id] [--keys]

A line holds the engine, the read's number, its wall-clock start and end, the Delta version
read where the engine says it (delta-rs; null elsewhere), the row count, the number of distinct
keys and the keys seen more than once, the rows per `batch_id` and, per batch, an
order-independent digest of its keys (so a test can tell "the same rows" from "as many rows").
`--keys` adds the sorted keys themselves. A read that raised is a line with `error` instead.

A table with no commit yet is an empty read (`exists: false`): every Delta reader raises on a
missing table, so the log is looked at first; once a commit is there, the table never goes away,
and an engine that raises from then on is recorded as an error.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil

ENGINES = ("spark", "duckdb", "polars", "deltalake")
DEFAULT_KEY = "message_id"
BATCH_ID = "batch_id"
# The first line every reader writes once its engine is up (a Spark JVM takes seconds).
READY = "ready"
# Delta's own log files: a commit or a checkpoint (part); anything else is not yet a table.
_LOG_ENTRY = re.compile(r"^\d{20}\.(json|checkpoint(\.\d+\.\d+)?\.parquet)$")
# Delta rebuilds a snapshot's state in this many partitions (50 by default: 50 tasks per new
# version for a table of a few files, on a local[1] reader).
SPARK_CONF = {"spark.databricks.delta.snapshotPartitions": "1"}
# A reader lives for a minute or two: the C2 compiler's warm-up costs more CPU than it saves.
# Measured once each on the 2-vCPU box under a load of about 14: a reader's first read of a
# small table took 63 s with both settings and 238 s with neither (1.3-1.8 s per read after).
SPARK_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1",)
# Delta's jars in the local Maven repository: where the session finds them until `make` has
# fetched them into the virtualenv (spark.session.delta_jars).
_M2_DELTA = Path.home() / ".m2" / "repository" / "io" / "delta"
_M2_JARS = (
    _M2_DELTA / "delta-spark_4.2_2.13" / "4.4.0" / "delta-spark_4.2_2.13-4.4.0.jar",
    _M2_DELTA / "delta-storage" / "4.4.0" / "delta-storage-4.4.0.jar",
)


class ReaderSetupError(RuntimeError):
    """An engine cannot be set up on this machine (a package or a jar is missing)."""


def table_exists(path: str | Path) -> bool:
    """Whether the Delta log at `path` has a commit or a checkpoint (a local path, or an object
    store's URI: delta-rs asks the store, with the store's variables from the environment)."""
    if "://" in str(path):
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(str(path))
    log = Path(path) / "_delta_log"
    try:
        return any(_LOG_ENTRY.match(entry.name) for entry in os.scandir(log))
    except FileNotFoundError:
        return False


def duckdb_extension_path() -> Path:
    """The delta extension file of the PyPI package `duckdb-ext-delta` for this DuckDB."""
    import duckdb

    spec = importlib.util.find_spec("duckdb_ext")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    platform = duckdb.connect().execute("PRAGMA platform").fetchone()[0]
    relative = Path("extensions") / f"v{duckdb.__version__}" / platform / "delta.duckdb_extension"
    for root in roots:
        candidate = Path(root) / relative
        if candidate.is_file():
            return candidate
    raise ReaderSetupError(
        f"DuckDB's delta extension is not installed (looked for duckdb_ext/{relative}); "
        "`make` installs it (the PyPI package duckdb-ext-delta, pinned with duckdb in setup.cfg)"
    )


def duckdb_connection():
    """An in-memory DuckDB connection with the delta extension loaded from its installed file;
    autoinstall and autoload are off, so DuckDB never reaches for the network. Where the
    environment names an Azure storage account (`AZURE_STORAGE_ACCOUNT_NAME`), the azure
    extension (PyPI's `duckdb-ext-azure`) is loaded too, with a secret of that account; where it
    names an AWS access key (`AWS_ACCESS_KEY_ID`), the httpfs extension with an S3 secret of that
    key (and of `AWS_ENDPOINT_URL`'s server, when one is named): as a DuckDB user reads tables
    there (docs: object-store tables)."""
    import duckdb

    path = duckdb_extension_path()
    connection = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    account = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if account:
        connection.execute(f"LOAD '{path.with_name('azure.duckdb_extension')}'")
        parts = [f"AccountName={account}"]
        if key := os.environ.get("AZURE_STORAGE_ACCOUNT_KEY"):
            parts.append(f"AccountKey={key}")
        if emulator := os.environ.get("AZURITE_BLOB_STORAGE_URL"):
            parts += ["DefaultEndpointsProtocol=http", f"BlobEndpoint={emulator}/{account}"]
        connection.execute("CREATE SECRET (TYPE azure, CONNECTION_STRING ?)", [";".join(parts)])
    if key_id := os.environ.get("AWS_ACCESS_KEY_ID"):
        connection.execute(f"LOAD '{path.with_name('httpfs.duckdb_extension')}'")
        options = {
            "KEY_ID": key_id,
            "SECRET": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            "REGION": os.environ.get("AWS_REGION", "us-east-1"),
        }
        if endpoint := os.environ.get("AWS_ENDPOINT_URL"):
            parts = urlsplit(endpoint)
            options |= {"ENDPOINT": parts.netloc, "URL_STYLE": "path"}
            options["USE_SSL"] = parts.scheme == "https"
        listed = ", ".join(f"{name} ?" for name in options)
        connection.execute(f"CREATE SECRET (TYPE s3, {listed})", list(options.values()))
    connection.execute(f"LOAD '{path}'")
    return connection


def maven_jars_dir(work_dir: Path) -> Path:
    """A directory holding Delta's jars from the local Maven repository (links to them)."""
    missing = [str(jar) for jar in _M2_JARS if not jar.is_file()]
    if missing:
        raise ReaderSetupError(f"Delta's jars are neither installed nor in {', '.join(missing)}")
    directory = work_dir / "delta-jars"
    directory.mkdir(parents=True, exist_ok=True)
    for jar in _M2_JARS:
        link = directory / jar.name
        if not link.exists():
            link.symlink_to(jar)
    return directory


@contextmanager
def spark_session(work_dir: Path) -> Iterator[object]:
    """A local Spark session with the project's settings, Delta's jars, extension and catalog
    (spark.session.build_session), as an operator's Spark reads the tables."""
    from spark.session import DeltaJarsMissing, build_session, stop_session

    work_dir = Path(work_dir).absolute()
    try:
        session = build_session(
            "local[1]",
            work_dir,
            app_name="delta-reader",
            conf=SPARK_CONF,
            java_options=SPARK_JAVA_OPTIONS,
        )
    except DeltaJarsMissing:  # `make` has not fetched them into the virtualenv yet
        session = build_session(
            "local[1]",
            work_dir,
            app_name="delta-reader",
            conf=SPARK_CONF,
            java_options=SPARK_JAVA_OPTIONS,
            jars_dir=maven_jars_dir(work_dir),
        )
    try:
        yield session
    finally:
        stop_session(session)


# One read of the table at a path: a pyarrow table of the key and batch id columns. The read
# puts the Delta version of its snapshot into the record where the engine says it, as soon as
# it knows it (so that a read that fails still says which snapshot it had).
Read = Callable[[str, dict], object]


@contextmanager
def engine_reader(engine: str, key: str, work_dir: Path) -> Iterator[Read]:
    """A function that reads the table at a path once, through `engine`, the users' way."""
    columns = [key, BATCH_ID]
    if engine == "spark":
        with spark_session(work_dir) as session:
            yield (
                lambda path, record: (
                    session.read.format("delta").load(path).select(*columns).toArrow()
                )
            )
    elif engine == "duckdb":
        connection = duckdb_connection()
        try:
            yield lambda path, record: connection.execute(
                f'SELECT "{key}", "{BATCH_ID}" FROM delta_scan(?)', [path]
            ).fetch_arrow_table()
        finally:
            connection.close()
    elif engine == "polars":
        import polars as pl

        yield lambda path, record: pl.read_delta(path, columns=columns).to_arrow()
    elif engine == "deltalake":
        from deltalake import DeltaTable

        def read(path: str, record: dict):
            table = DeltaTable(path)
            record["version"] = table.version()
            return table.to_pyarrow_table(columns=columns)

        yield read
    else:
        raise ValueError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")


def key_digest(keys) -> str:
    """An order-independent digest of a multiset of keys: the sum of their hashes, mod 2**64
    (a duplicate changes it, unlike a xor)."""
    total = 0
    for value in keys:
        digest = hashlib.blake2b(str(value).encode("utf-8"), digest_size=8).digest()
        total = (total + int.from_bytes(digest, "big")) % (1 << 64)
    return f"{total:016x}"


def summarise(
    table, key: str, with_keys: bool = False, known: frozenset[str] | None = None
) -> dict[str, object]:
    """Rows, distinct keys, duplicated keys, rows and key digest per batch of one read; with
    `known`, also how many keys are not among them (and a few of those)."""
    keys = table.column(key).to_pylist()
    batch_ids = table.column(BATCH_ID).to_pylist()
    counts = Counter(keys)
    per_batch: dict[int, list] = {}
    for value, batch_id in zip(keys, batch_ids, strict=True):
        per_batch.setdefault(batch_id, []).append(value)
    summary: dict[str, object] = {
        "rows": len(keys),
        "distinct_keys": len(counts),
        "duplicate_keys": sorted(str(k) for k, n in counts.items() if n > 1),
        # JSON object keys are strings; batch ids are ints (null: a row without one).
        "batches": {str(b): len(v) for b, v in sorted(per_batch.items(), key=_batch_order)},
        "batch_digests": {
            str(b): key_digest(v) for b, v in sorted(per_batch.items(), key=_batch_order)
        },
    }
    if with_keys:
        summary["keys"] = sorted(str(k) for k in keys)
    if known is not None:
        unknown = sorted(str(k) for k in counts if str(k) not in known)
        summary["unknown_keys"] = len(unknown)
        summary["unknown_sample"] = unknown[:5]
    return summary


def _batch_order(item) -> tuple[bool, int]:
    batch_id = item[0]
    return (batch_id is None, batch_id or 0)


def read_loop(
    engine: str,
    table: str,
    until_file: Path,
    out: Path,
    *,
    key: str = DEFAULT_KEY,
    with_keys: bool = False,
    known_keys: Path | None = None,
    max_reads: int = 100_000,
    max_seconds: float = 300.0,
    min_interval: float = 0.05,
    work_dir: Path | None = None,
) -> int:
    """Read `table` through `engine` until `until_file` exists, `max_reads` reads were made or
    `max_seconds` passed, starting a read at most every `min_interval` seconds; one JSON line
    per read into `out`. `known_keys`: a file of keys, one a line; each read then counts the
    keys it holds that are not in it. Returns the number of reads."""
    work_dir = Path(work_dir) if work_dir is not None else out.parent / f"{engine}-work"
    deadline = time.monotonic() + max_seconds
    pause = threading.Event()
    known = None
    if known_keys is not None:
        known = frozenset(known_keys.read_text(encoding="utf-8").split())
    made = 0
    with out.open("a", encoding="utf-8") as sink:

        def write(record: dict[str, object]) -> None:
            sink.write(json.dumps({"engine": engine, **record}) + "\n")
            sink.flush()

        with engine_reader(engine, key, work_dir) as read:
            write({"event": READY, "time": time.time()})
            # The stop file is checked before each read (it ends the loop between two reads).
            while made < max_reads and time.monotonic() < deadline and not until_file.exists():
                made += 1
                started = time.time()
                record: dict[str, object] = {"read": made, "started": started, "version": None}
                try:
                    if table_exists(table):
                        record["exists"] = True
                        result = read(table, record)
                        record.update(summarise(result, key, with_keys, known))
                    else:
                        record["exists"] = False
                        record.update(rows=0, distinct_keys=0, duplicate_keys=[], batches={})
                        record.update(batch_digests={})
                        if with_keys:
                            record["keys"] = []
                        if known is not None:
                            record.update(unknown_keys=0, unknown_sample=[])
                except Exception as error:  # a failed read is a finding: recorded, not fatal
                    record["error"] = f"{type(error).__name__}: {error}"
                record["ended"] = time.time()
                write(record)
                # Pacing, not synchronisation: a read of a small table takes milliseconds, and
                # a loop without a pause would take a CPU from the writer it runs beside.
                pause.wait(max(0.0, min_interval - (record["ended"] - started)))
            write({"event": "stopped", "time": time.time(), "reads": made})
    return made


# How each engine says that a data file of its snapshot was gone when it went to read it.
MISSING_FILE = re.compile(r"FILE_NOT_EXIST|FileNotFound|NoSuchFile|No such file", re.IGNORECASE)


# A commit's timestamp is taken as delta-rs prepares it, before the commit file is in place:
# a read that started up to this long after it may still have had the version before it (seen:
# 8 ms on a loaded box). Only for engines that do not say which version they read.
COMMIT_VISIBLE_SLACK = 1.0


@dataclass(frozen=True)
class VacuumWindow:
    """One maintenance pass as the table's log tells it: its last OPTIMIZE commit (from that
    version on, no snapshot lists the files it replaced), and the start and end of the VACUUM
    that deleted them; times in wall-clock seconds."""

    optimize_version: int
    optimized: float
    vacuum_started: float
    vacuum_ended: float
    deleted: int

    def explains(self, read: dict[str, object]) -> bool:
        """Whether a read that failed on a missing file had a snapshot from before this pass's
        OPTIMIZE (by its version where the engine said it, else by its start time) and was
        still reading when the VACUUM began."""
        if read.get("version") is not None:
            before = int(read["version"]) < self.optimize_version
        else:
            before = float(read["started"]) < self.optimized + COMMIT_VISIBLE_SLACK
        return before and float(read["ended"]) > self.vacuum_started - 0.002  # ms timestamps


def vacuum_windows(path: str | Path) -> list[VacuumWindow]:
    """The passes whose VACUUM deleted files, from the table's history (delta-rs)."""
    from deltalake import DeltaTable

    windows = []
    optimized = started = None
    for entry in sorted(DeltaTable(str(path)).history(), key=lambda e: e["version"]):
        seconds = entry["timestamp"] / 1000
        operation = entry["operation"]
        if operation == "OPTIMIZE":
            optimized = (entry["version"], seconds)
        elif operation == "VACUUM START":
            started = seconds
        elif operation == "VACUUM END":
            deleted = int((entry.get("operationMetrics") or {}).get("numDeletedFiles", 0))
            if deleted and optimized is not None and started is not None:
                windows.append(VacuumWindow(*optimized, started, seconds, deleted))
            optimized = started = None
    return windows


def short_error(text: str) -> str:
    """The line of an engine's error (a Java stack trace, often) that says what went wrong."""
    lines = str(text).splitlines()
    said = next((line for line in lines if MISSING_FILE.search(line)), lines[0] if lines else "")
    return said.strip()[:400]


def unexplained_failures(
    reads: list[dict[str, object]], windows: list[VacuumWindow]
) -> list[dict[str, object]]:
    """The failed reads that are not a file deleted by a VACUUM under a snapshot the reader had
    opened before the OPTIMIZE that replaced it (Delta's rule: the retention is what protects
    a reader; a retention of 0 protects none)."""
    return [
        read
        for read in reads
        if "error" in read
        and not (
            MISSING_FILE.search(str(read["error"]))
            and any(window.explains(read) for window in windows)
        )
    ]


def load_lines(path: Path) -> list[dict[str, object]]:
    """The JSON lines a reader wrote so far (a last line still being written is left out)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the line being written
    return lines


def reads_of(lines: list[dict[str, object]]) -> list[dict[str, object]]:
    """The read records among a reader's lines (not its ready/stopped lines)."""
    return [line for line in lines if "read" in line]


def wait_for_lines(
    path: Path,
    predicate: Callable[[list[dict[str, object]]], bool],
    timeout: float,
    alive: Callable[[], bool] = lambda: True,
    poll: float = 0.05,
) -> list[dict[str, object]]:
    """Poll the reader's output until `predicate(lines)` holds; AssertionError after `timeout`
    or as soon as `alive()` says the reader has exited without it."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        lines = load_lines(path)
        if predicate(lines):
            return lines
        if not alive():
            lines = load_lines(path)
            if predicate(lines):
                return lines
            raise AssertionError(f"reader writing {path} exited; its lines: {lines[-5:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no such lines in {path} after {timeout} s: {lines[-5:]}")
        pause.wait(poll)


class ReaderProcess:
    """One reader loop in a subprocess (this module's command line), started by a test."""

    def __init__(self, engine: str, out: Path, log: Path, proc: subprocess.Popen) -> None:
        self.engine = engine
        self.out = out
        self.log = log
        self.proc = proc
        # What the reader spawned (its Spark JVM), by PID; psutil's handle refuses to signal a
        # PID that another process has taken since.
        self.spawned: dict[int, psutil.Process] = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def lines(self) -> list[dict[str, object]]:
        return load_lines(self.out)

    def reads(self) -> list[dict[str, object]]:
        return reads_of(self.lines())

    def output(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout: float) -> None:
        """Until the engine is up (a Spark JVM takes seconds); fails if the reader exited."""
        try:
            wait_for_lines(
                self.out,
                lambda lines: any(line.get("event") == READY for line in lines),
                timeout,
                self.alive,
            )
        except AssertionError as error:
            raise AssertionError(
                f"{self.engine} reader not ready: {error}\n{self.output()}"
            ) from None

    def wait_for_read_started_after(self, moment: float, timeout: float) -> dict[str, object]:
        """The first read that started after wall time `moment` and returned rows, once done
        (a read that failed does not count: the next one is waited for)."""

        def found(lines) -> list[dict[str, object]]:
            return [r for r in reads_of(lines) if r["started"] > moment and "error" not in r]

        try:
            lines = wait_for_lines(self.out, lambda lines: bool(found(lines)), timeout, self.alive)
        except AssertionError as error:
            raise AssertionError(
                f"{self.engine} reader made no read after {moment}: {error}\n{self.output()}"
            ) from None
        return found(lines)[0]

    def remember_children(self) -> None:
        """Record what the reader spawned (a Spark JVM), so that it can be reaped too."""
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                self.spawned.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def reap(self, timeout: float) -> int | None:
        """Wait up to `timeout` for the reader to end by itself (the stop file), then kill it
        and whatever it spawned, by PID. Its exit status (None: it had to be killed)."""
        self.remember_children()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.remember_children()
            self.proc.kill()
            self.proc.wait(30)
            return None
        finally:
            for child in self.spawned.values():
                try:
                    child.kill()
                    child.wait(30)
                except psutil.NoSuchProcess:
                    pass


# The repository's root: the command line is `python -m tests.harness.delta_readers` from there.
_ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def delta_readers(
    engines: Iterable[str],
    table: str | Path,
    work_dir: Path,
    *,
    key: str = DEFAULT_KEY,
    with_keys: bool = False,
    known_keys: Path | None = None,
    max_seconds: float = 600.0,
    min_interval: float = 0.05,
    stop_timeout: float = 60.0,
) -> Iterator[dict[str, ReaderProcess]]:
    """Start one reader subprocess per engine on `table`; on the way out, pass or fail, create
    the stop file and reap every one of them (by PID, with what they spawned)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    stop = work_dir / "stop"
    started: dict[str, ReaderProcess] = {}
    try:
        for engine in engines:
            out = work_dir / f"{engine}.jsonl"
            log = work_dir / f"{engine}.log"
            argv = [
                sys.executable,
                "-m",
                "tests.harness.delta_readers",
                f"--engine={engine}",
                f"--table={table}",
                f"--until-file={stop}",
                f"--out={out}",
                f"--key={key}",
                f"--max-seconds={max_seconds}",
                f"--work-dir={work_dir / f'{engine}-work'}",
                f"--min-interval={min_interval}",
                *(["--keys"] if with_keys else []),
                *([f"--known-keys={known_keys}"] if known_keys is not None else []),
            ]
            with log.open("wb") as sink:
                proc = subprocess.Popen(
                    argv, cwd=_ROOT, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            started[engine] = ReaderProcess(engine, out, log, proc)
        yield started
    finally:
        stop.touch()
        for reader in started.values():
            reader.reap(stop_timeout)


def read_once(
    engine: str,
    table: str | Path,
    work_dir: Path,
    *,
    key: str = DEFAULT_KEY,
    timeout: float = 240.0,
) -> dict[str, object]:
    """One read of `table` through `engine` in a process of its own (this module's command
    line), with its keys: what a user of that engine would see now. Fails on a read that raised
    or a reader that did not end in time (it is killed by PID, with what it spawned)."""
    with delta_readers([engine], table, work_dir, key=key, with_keys=True) as readers:
        reader = readers[engine]
        reader.wait_ready(timeout)
        record = reader.wait_for_read_started_after(0.0, timeout)
    assert "error" not in record, record
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.delta_readers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("--table", required=True, help="path of the Delta table")
    parser.add_argument("--until-file", type=Path, required=True, help="stop once it exists")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    parser.add_argument("--key", default=DEFAULT_KEY, help="the key column")
    parser.add_argument("--keys", action="store_true", help="write every read's keys too")
    parser.add_argument("--known-keys", type=Path, help="count keys not in this file (a line each)")
    parser.add_argument("--max-reads", type=int, default=100_000)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--min-interval", type=float, default=0.05, help="seconds between reads")
    parser.add_argument("--work-dir", type=Path, help="Spark's scratch directory")
    args = parser.parse_args(argv)
    try:
        read_loop(
            args.engine,
            args.table,
            args.until_file,
            args.out,
            key=args.key,
            with_keys=args.keys,
            known_keys=args.known_keys,
            max_reads=args.max_reads,
            max_seconds=args.max_seconds,
            min_interval=args.min_interval,
            work_dir=args.work_dir,
        )
    except ReaderSetupError as error:
        print(f"delta reader: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    status = main()
    # Out without the interpreter's finalisation: its last line is written and flushed, and
    # delta-rs' native threads, still winding down at exit, can abort a finalising process
    # ("terminate called without an active exception", SIGABRT: delta-io/delta-rs#2184; seen
    # once in a CI run, a deltalake reader ending with status -6).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
