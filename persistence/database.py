"""The ledger's SQLite database: tables, and an engine opened with the chosen durability.

`process` durability is WAL with synchronous=NORMAL: a commit survives `kill -9` of the daemon
(the WAL is in the OS page cache) but not a power cut. `power` is synchronous=FULL: every commit is
fsynced before it returns, so it survives power loss too (DESIGN §3.7).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import (
    Column,
    Engine,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    text,
)

from persistence.permissions import private_directory, private_file
from persistence.storage_faults import check_database

log = logging.getLogger(__name__)

metadata = MetaData()

# One row per accepted inbound MQTT message: the ledger, read by two sinks (DESIGN §7.1). For the
# table a row moves: committed (batch_id NULL) -> in a batch being written (batch_id set) -> landed
# (landed_time set). For the upstream, `forward` is 1 while the message is owed upstream and NULL
# once it was acknowledged there or given up on (or when nothing upstream wants it). Its payload
# sits in `payloads` until every sink that owes it is done, then goes: a row deleted from there
# frees its page, a payload set to NULL in place did not (measured: 100,000 rows of 178 bytes kept
# all 31 MB of their pages in use). The key row stays, payload gone, for `retention` after
# landing, so that a late redelivery of the same message is recognised and acked without a second
# row; `packet_id` is set while a QoS 2 exchange waits for the broker's PUBREL.
inbound = Table(
    "inbound",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("message_key", String, nullable=False, unique=True),
    Column("topic", String, nullable=False),
    Column("qos", Integer, nullable=False),
    Column("packet_id", Integer, nullable=True),
    Column("received_time", Float, nullable=False),
    Column("pack_id", Integer, nullable=True),
    Column("batch_id", Integer, nullable=True),
    # When the table was done with the row: its batch committed, or (a row the table does not owe:
    # the replay of an upstream dead letter) when it was stored.
    Column("landed_time", Float, nullable=True),
    # Set on a row that lands as a dead letter, not as reads: `invalid_topic` at intake, or the
    # reason forwarding gave up (with dead_sink 'upstream') on the dead-letter row the ledger adds.
    Column("dead_reason", String, nullable=True),
    # Wall time after which the message must not be forwarded (MQTT 5 message expiry).
    Column("expires_at", Float, nullable=True),
    # 1 while the upstream sink owes the message; NULL when it does not (any more).
    Column("forward", Integer, nullable=True),
    # Which sink a dead_reason is for: NULL (the table's own) or 'upstream'.
    Column("dead_sink", String, nullable=True),
    sqlite_autoincrement=True,
)
Index("inbound_packet_id", inbound.c.packet_id, sqlite_where=inbound.c.packet_id.isnot(None))
Index("inbound_batch_id", inbound.c.batch_id)
Index("inbound_landed_time", inbound.c.landed_time)
# The upstream sink's cursor reads rows still owed upstream, in seq order.
Index("inbound_forward", inbound.c.seq, sqlite_where=inbound.c.forward.isnot(None))

# The payload of each row some sink still owes; deleted (with its page) when none does.
payloads = Table(
    "payloads",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("payload", LargeBinary, nullable=False),
)

# A batch id is recorded here before its Spark job starts, so a crash at any point replays the same
# batch with the same rows into the same partitions (an overwrite, never a second append).
batches = Table(
    "batches",
    metadata,
    Column("batch_id", Integer, primary_key=True, autoincrement=True),
    Column("state", String, nullable=False),  # writing | committed
    Column("started_time", Float, nullable=False),
    Column("committed_time", Float, nullable=True),
    Column("messages", Integer, nullable=False),
    Column("rows", Integer, nullable=True),
    Column("dead_letters", Integer, nullable=True),
    sqlite_autoincrement=True,
)

# With per-read keys from payload fields, one read can come in two different messages. The first
# batch to claim a read id owns it; a replay of that batch finds its own claims again, so the
# filtered rows are the same on every attempt, and the table never holds a read id twice.
read_claims = Table(
    "read_claims",
    metadata,
    Column("message_id", String, primary_key=True),
    Column("batch_id", Integer, nullable=False),
    Column("claimed_time", Float, nullable=False),
)
Index("read_claims_batch_id", read_claims.c.batch_id)
Index("read_claims_claimed_time", read_claims.c.claimed_time)

# Each reader's event-number counters (spark.gaps), updated in the same transaction as the batch
# that landed the reads: a replayed batch never counts twice, and a restart goes on counting.
reader_counters = Table(
    "reader_counters",
    metadata,
    Column("reader_id", String, primary_key=True),
    Column("last_event_num", Integer, nullable=True),
    Column("received", Integer, nullable=False),
    Column("missing", Integer, nullable=False),
    Column("resets", Integer, nullable=False),
    Column("without_event_num", Integer, nullable=False),
)

# Each reader's health as seen through its messages (spark.reader_health: heartbeats, its own
# counters, the reconciliation), as JSON, updated in the same transaction as the batch that
# landed them, like reader_counters. A table added without a new schema version: create_all
# adds it to an existing file, and an older fxgate leaves a table it does not know alone.
reader_health = Table(
    "reader_health",
    metadata,
    Column("reader_id", String, primary_key=True),
    Column("state", String, nullable=False),
)

# Small named counters that must never go back across restarts (pack ids).
counters = Table(
    "counters",
    metadata,
    Column("name", String, primary_key=True),
    Column("value", Integer, nullable=False),
)

# Facts about this ledger that never change once made: `gateway_id`, a random id made with the
# ledger, from which the tables' Delta application id comes (spark.tables.application_id). Added
# without a new schema version, as reader_health was: create_all adds it to an older file, whose
# first start after the upgrade makes the id.
identity = Table(
    "identity",
    metadata,
    Column("name", String, primary_key=True),
    Column("value", String, nullable=False),
)

SYNCHRONOUS = {"process": "NORMAL", "power": "FULL"}
WAL_SIZE_LIMIT = 16 * 1024 * 1024

# Each SQLite file records the version of its schema in `PRAGMA user_version` (DESIGN §7.11). A
# file of an older version is migrated in place at start, in one transaction; one of a newer
# version is refused and never altered. Version 1 is every file written before versions were
# recorded (user_version 0 with tables in it).
LEDGER_VERSION = 2
OUTBOUND_VERSION = 1
LIFECYCLE_VERSION = 1
SCHEMA_VERSIONS = {
    "ledger.sqlite": LEDGER_VERSION,
    "outbound.sqlite": OUTBOUND_VERSION,
    "lifecycle.sqlite": LIFECYCLE_VERSION,
}


class SchemaTooNew(RuntimeError):
    """A database file written by a newer fxgate: this one cannot know what its rows mean."""


class SchemaTooOld(RuntimeError):
    """A read-only reader met a file the daemon has not migrated yet."""


def file_version(db: sqlite3.Connection, table: str) -> int:
    """The schema version of an open file: its user_version, 1 for a file of tables written
    before versions were recorded, 0 for an empty file."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version:
        return version
    found = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return 1 if found else 0


def _too_new(path: Path, version: int, known: int) -> SchemaTooNew:
    return SchemaTooNew(
        f"{path} has schema version {version}, newer than this fxgate's {known}: it was written "
        f"by a newer fxgate. It is left as it is; run that version (or a newer one) on it"
    )


def check_versions(data_dir: Path) -> None:
    """Refuse (SchemaTooNew) if any database file of `data_dir` is newer than this code; a
    read-only look that changes nothing, for the daemon to call before it opens anything."""
    for name, known in SCHEMA_VERSIONS.items():
        path = Path(data_dir) / name
        if not path.exists() or path.stat().st_size == 0:
            continue
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError:
            continue  # not readable as a database: the opener's corruption check deals with it
        finally:
            db.close()
        if version > known:
            raise _too_new(path, version, known)


def _migrate_ledger(path: Path) -> None:
    """Bring a ledger file to LEDGER_VERSION, in one transaction, before the engine opens it."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        version = file_version(db, "inbound")
        if version > LEDGER_VERSION:
            raise _too_new(path, version, LEDGER_VERSION)
        if version in (0, LEDGER_VERSION):
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            _ledger_1_to_2(db)
            db.execute(f"PRAGMA user_version = {LEDGER_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        log.info("ledger %s migrated from schema version %d to %d", path, version, LEDGER_VERSION)
    finally:
        db.close()


def _ledger_1_to_2(db: sqlite3.Connection) -> None:
    """Version 1 forwarded a pack first and landed it once the upstream had it, and kept the
    payload in the row. Version 2 feeds both sinks from the ledger on their own (DESIGN §7.1):
    payloads move to their own table, and every message not yet in a batch may still be owed
    upstream (the outbound ledger's own file says which of them it already finished; a ledger
    without forwarding clears the mark at start). A batch begun by version 1 is replayed as it
    was: its forwarding failures are upstream dead letters."""
    db.execute("CREATE TABLE payloads (seq INTEGER NOT NULL PRIMARY KEY, payload BLOB NOT NULL)")
    db.execute(
        "INSERT INTO payloads (seq, payload) SELECT seq, payload FROM inbound "
        "WHERE payload IS NOT NULL"
    )
    db.execute("ALTER TABLE inbound DROP COLUMN payload")
    db.execute("ALTER TABLE inbound ADD COLUMN forward INTEGER")
    db.execute("ALTER TABLE inbound ADD COLUMN dead_sink VARCHAR")
    db.execute(
        "UPDATE inbound SET forward = 1 "
        "WHERE landed_time IS NULL AND batch_id IS NULL AND dead_reason IS NULL"
    )
    db.execute(
        "UPDATE inbound SET dead_sink = 'upstream' "
        "WHERE dead_reason IN ('forward_failed', 'expired', 'overflow_dropped')"
    )
    db.execute("CREATE INDEX inbound_forward ON inbound (seq) WHERE forward IS NOT NULL")


def _prepare_file(path: Path) -> None:
    """What both openers below do before a writer opens the database at `path`."""
    private_directory(path.parent)  # owner-only: the data dir holds every read's payload
    check_database(path)  # a corrupt file is moved aside and refused, never recreated empty
    private_file(path)  # 0600 before SQLite opens it: its -wal and -shm inherit the mode


def connect_sqlite(
    path: Path, durability: str, schema: str, version: int = 1, table: str | None = None
) -> sqlite3.Connection:
    """A plain sqlite3 connection for an actor that owns a small file of its own (the outbound
    ledger, the life-cycle actor): WAL, the durability's synchronous level, the schema created
    and its `version` recorded; a file of a newer version (its main `table` named) is refused.
    Call it in the owning actor's thread (on_start)."""
    path = Path(path)
    _prepare_file(path)
    db = sqlite3.connect(path)
    try:
        if table is not None and file_version(db, table) > version:
            raise _too_new(path, file_version(db, table), version)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={SYNCHRONOUS[durability]}")
        db.executescript(schema)
        db.execute(f"PRAGMA user_version = {version}")
    except BaseException:
        db.close()
        raise
    return db


def open_engine(path: Path, durability: str = "process", readonly: bool = False) -> Engine:
    """An engine whose every connection has WAL and the durability's synchronous level.

    Create it (and its connections) in the thread that will use it: sqlite3 connections refuse
    other threads.
    """
    if durability not in SYNCHRONOUS:
        raise ValueError(f"durability must be one of {sorted(SYNCHRONOUS)}, not {durability!r}")
    path = Path(path)
    if readonly:
        _check_readable_version(path)
        url = f"sqlite:///file:{path}?mode=ro&uri=true"
    else:
        _prepare_file(path)
        _migrate_ledger(path)
        url = f"sqlite:///{path}"
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        if not readonly:
            cursor.execute("PRAGMA journal_mode=WAL")
            # A checkpoint leaves the WAL file at its largest size unless told otherwise; cut
            # back to this, the file's growth is its pages (what the disk budget counts).
            cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        cursor.execute(f"PRAGMA synchronous={SYNCHRONOUS[durability]}")
        cursor.execute("PRAGMA busy_timeout=5000")
        cursor.close()

    if not readonly:
        # The tables and their version in one transaction: the sqlite3 module commits each DDL
        # statement on its own unless a BEGIN is explicit, and a file seen between the two (by
        # `fxgate status` during the first start, or left by a kill then) read as version 1.
        with engine.connect() as conn:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            metadata.create_all(conn)
            conn.exec_driver_sql(f"PRAGMA user_version = {LEDGER_VERSION}")
            conn.exec_driver_sql("COMMIT")
    return engine


def ledger_version(path: Path) -> int:
    """The schema version of the ledger file at `path`, read-only (0: no file, or none of its
    tables committed yet, as while the daemon creates it)."""
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    try:
        return file_version(db, "inbound")
    finally:
        db.close()


def _check_readable_version(path: Path) -> None:
    """A reader of a ledger (status, the test checks) knows only the current schema."""
    version = ledger_version(path)
    if version > LEDGER_VERSION:
        raise _too_new(path, version, LEDGER_VERSION)
    if 0 < version < LEDGER_VERSION:
        raise SchemaTooOld(
            f"{path} has schema version {version}: start the daemon of this fxgate once, it "
            f"migrates the file to version {LEDGER_VERSION} in place"
        )


def pragma(engine: Engine, name: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text(f"PRAGMA {name}")).scalar())
