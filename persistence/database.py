"""The ledger's SQLite database: tables, and an engine opened with the chosen durability.

`process` durability is WAL with synchronous=NORMAL: a commit survives `kill -9` of the daemon
(the WAL is in the OS page cache) but not a power cut. `power` is synchronous=FULL: every commit is
fsynced before it returns, so it survives power loss too (DESIGN §3.7).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

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

# One row per accepted inbound MQTT message. A row moves: committed (batch_id NULL) -> in a batch
# being written (batch_id set) -> landed (landed_time set, payload dropped). Landed rows stay, key
# only, for `retention` so that a late redelivery of the same message is recognised and acked
# without a second row; `packet_id` is set while a QoS 2 exchange waits for the broker's PUBREL.
inbound = Table(
    "inbound",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("message_key", String, nullable=False, unique=True),
    Column("topic", String, nullable=False),
    Column("payload", LargeBinary, nullable=True),
    Column("qos", Integer, nullable=False),
    Column("packet_id", Integer, nullable=True),
    Column("received_time", Float, nullable=False),
    Column("pack_id", Integer, nullable=True),
    Column("batch_id", Integer, nullable=True),
    Column("landed_time", Float, nullable=True),
    # Set when forwarding gave up on the message (or it expired): it lands in dead_letters.
    Column("dead_reason", String, nullable=True),
    # Wall time after which the message must not be forwarded (MQTT 5 message expiry).
    Column("expires_at", Float, nullable=True),
    sqlite_autoincrement=True,
)
Index("inbound_packet_id", inbound.c.packet_id, sqlite_where=inbound.c.packet_id.isnot(None))
Index("inbound_batch_id", inbound.c.batch_id)
Index("inbound_landed_time", inbound.c.landed_time)

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

# Small named counters that must never go back across restarts (pack ids).
counters = Table(
    "counters",
    metadata,
    Column("name", String, primary_key=True),
    Column("value", Integer, nullable=False),
)

SYNCHRONOUS = {"process": "NORMAL", "power": "FULL"}


def _prepare_file(path: Path) -> None:
    """What both openers below do before a writer opens the database at `path`."""
    private_directory(path.parent)  # owner-only: the data dir holds every read's payload
    check_database(path)  # a corrupt file is moved aside and refused, never recreated empty
    private_file(path)  # 0600 before SQLite opens it: its -wal and -shm inherit the mode


def connect_sqlite(path: Path, durability: str, schema: str) -> sqlite3.Connection:
    """A plain sqlite3 connection for an actor that owns a small file of its own (the outbound
    ledger, the life-cycle actor): WAL, the durability's synchronous level, the schema created.
    Call it in the owning actor's thread (on_start)."""
    path = Path(path)
    _prepare_file(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={SYNCHRONOUS[durability]}")
    db.executescript(schema)
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
        url = f"sqlite:///file:{path}?mode=ro&uri=true"
    else:
        _prepare_file(path)
        url = f"sqlite:///{path}"
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        if not readonly:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={SYNCHRONOUS[durability]}")
        cursor.execute("PRAGMA busy_timeout=5000")
        cursor.close()

    if not readonly:
        metadata.create_all(engine)
    return engine


def pragma(engine: Engine, name: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text(f"PRAGMA {name}")).scalar())
