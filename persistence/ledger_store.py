"""LedgerStore: every SQL statement on the inbound ledger's file, and nothing else.

No threads, no actors, no clock: times and decisions come in as arguments, so the store is tested
against a temporary SQLite file on its own (tests/persistence/test_ledger_store.py). Its owner
(the InboundLedger actor) decides when to commit; a storage fault raised here goes up unchanged
for the owner to roll back and retry (persistence.storage_faults).

The ledger is one log read by two sinks, each with its own progress (DESIGN §7.1):
- the table: a row is owed while `landed_time` is NULL; a batch takes rows (`batch_id`) and its
  commit lands them;
- the upstream: a row is owed while `forward` is set; the outbound ledger reports each message
  it finished (acknowledged, or given up on: then an upstream dead-letter row is added here, to
  land in `dead_letters` like any row).
A payload is deleted as soon as no sink owes its row; the key row stays for the retention that
recognises redeliveries.

Per-message statements (the hot path of ingest) go straight to the sqlite3 cursor inside the
transaction SQLAlchemy opened: SQLAlchemy's per-statement work cost more than the insert itself
(py-spy, the ingest benchmark).
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from sqlalchemy import Engine

from persistence.disk_budget import free_bytes
from persistence.records import TABLE, UPSTREAM, DiskUsage, LedgerRecord, ReaderCount, SinkLag

PACK_COUNTER = "pack_id"
UPSTREAM_DEAD_SUFFIX = "/upstream"

_RECORD_COLUMNS = (
    "i.seq, i.message_key, i.topic, p.payload, i.qos, i.received_time, i.pack_id, "
    "i.dead_reason, i.expires_at, i.dead_sink, i.landed_time IS NULL, i.forward IS NOT NULL"
)
_RECORDS = f"SELECT {_RECORD_COLUMNS} FROM inbound i LEFT JOIN payloads p ON p.seq = i.seq"
# What each sink still owes, as a condition on `inbound i`.
_OWED = {
    TABLE: "i.landed_time IS NULL AND i.batch_id IS NULL",
    UPSTREAM: "i.forward IS NOT NULL",
}
# What each sink's lag counts: the table's includes rows in a batch not yet committed.
_LAG = {TABLE: "i.landed_time IS NULL", UPSTREAM: "i.forward IS NOT NULL"}
# Rows no sink owes any more: their payloads go.
_DONE = "landed_time IS NOT NULL AND forward IS NULL"


def seq_runs(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, distinct seqs as inclusive (first, last) runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return runs


def _record(row: tuple) -> LedgerRecord:
    seq, key, topic, payload, qos, received, pack, dead, expires, sink, table, upstream = row
    return LedgerRecord(
        seq,
        key,
        topic,
        b"" if payload is None else payload,
        qos,
        received,
        pack,
        dead,
        expires,
        sink,
        bool(table),
        bool(upstream),
    )


class LedgerStore:
    """One connection to the ledger file; call it only from the thread that made it."""

    def __init__(self, engine: Engine, path: Path) -> None:
        self._engine = engine
        self.path = Path(path)
        self._checkpoints = True
        self._connect()

    def _connect(self) -> None:
        self.conn = self._engine.connect()
        self._cursor = self.conn.connection.driver_connection.cursor()
        if not self._checkpoints:
            self._cursor.execute("PRAGMA wal_autocheckpoint=0")

    # -- transactions -----------------------------------------------------------------------

    def _run(self, sql: str, params: Sequence = ()) -> sqlite3.Cursor:
        if not self.conn.in_transaction():
            # So that SQLAlchemy's commit() commits what the raw cursor wrote.
            self.conn.begin()
        cursor = self._cursor
        cursor.execute(sql, params)
        return cursor

    def _run_many(self, sql: str, rows: Iterable[Sequence]) -> None:
        if not self.conn.in_transaction():
            self.conn.begin()
        self._cursor.executemany(sql, rows)

    def commit(self) -> None:
        self.conn.commit()

    @property
    def engine(self) -> Engine:
        return self._engine

    def leave_checkpoints(self) -> None:
        """This connection's commits no longer checkpoint the WAL: a checkpointer of its own
        does (persistence.wal_checkpoint). A connection made after a failed rollback too."""
        self._checkpoints = False
        self._cursor.execute("PRAGMA wal_autocheckpoint=0")

    def rollback(self) -> None:
        """Roll back; a connection left in an unknown state is replaced by a fresh one."""
        try:
            self.conn.rollback()
        except Exception:
            try:
                self.conn.invalidate()
            except Exception:
                pass
            self._connect()
            raise

    def close(self) -> None:
        self.conn.close()
        self._engine.dispose()

    # -- intake -----------------------------------------------------------------------------

    def insert(
        self,
        key: str,
        topic: str,
        payload: bytes,
        qos: int,
        received_time: float,
        expires_at: float | None = None,
        dead_reason: str | None = None,
        forward: bool = False,
        landed_time: float | None = None,
    ) -> int | None:
        """Store a message under `key`; its seq, or None when the key is stored already.
        `forward` marks it owed upstream; `landed_time` marks it not owed to the table."""
        cursor = self._run(
            "INSERT INTO inbound (message_key, topic, qos, received_time, expires_at, "
            "dead_reason, forward, landed_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (message_key) DO NOTHING",
            (
                key,
                topic,
                qos,
                received_time,
                expires_at,
                dead_reason,
                1 if forward else None,
                landed_time,
            ),
        )
        if cursor.rowcount == 0:
            return None
        seq = cursor.lastrowid
        if forward or landed_time is None:
            cursor.execute("INSERT INTO payloads (seq, payload) VALUES (?, ?)", (seq, payload))
        return seq

    def seq_of(self, key: str) -> int:
        (seq,) = self._run("SELECT seq FROM inbound WHERE message_key = ?", (key,)).fetchone()
        return seq

    def set_packet_id(self, seq: int, packet_id: int | None) -> None:
        self._run("UPDATE inbound SET packet_id = ? WHERE seq = ?", (packet_id, seq))

    def clear_packet_ids(self, released: Iterable[tuple[int, int]]) -> None:
        """QoS 2 exchanges that are over: (seq, packet id) each; a row the id has gone to
        another exchange of since is left alone."""
        self._run_many(
            "UPDATE inbound SET packet_id = NULL WHERE seq = ? AND packet_id = ?", released
        )

    def awaiting_pubrel(self) -> dict[int, tuple[int, str]]:
        """packet id -> (seq, key) of the QoS 2 exchanges that wait for the broker's PUBREL."""
        rows = self._run(
            "SELECT packet_id, seq, message_key FROM inbound WHERE packet_id IS NOT NULL"
        ).fetchall()
        return {pid: (seq, key) for pid, seq, key in rows}

    def probe(self, now: float) -> None:
        """A tiny write that proves the storage takes writes again."""
        self._run(
            "INSERT INTO counters (name, value) VALUES ('storage_probe', ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (int(now),),
        )

    # -- reading the log back ---------------------------------------------------------------

    def owed(self, sink: str, from_seq: int, limit: int) -> tuple[LedgerRecord, ...]:
        """Up to `limit` rows `sink` still owes, from `from_seq` on, in seq order."""
        rows = self._run(
            f"{_RECORDS} WHERE {_OWED[sink]} AND i.seq >= ? ORDER BY i.seq LIMIT ?",
            (from_seq, limit),
        ).fetchall()
        return tuple(_record(row) for row in rows)

    def first_owed(self, sink: str) -> int | None:
        (seq,) = self._run(f"SELECT min(i.seq) FROM inbound i WHERE {_OWED[sink]}").fetchone()
        return seq

    def batch_records(self, batch_id: int) -> tuple[LedgerRecord, ...]:
        rows = self._run(f"{_RECORDS} WHERE i.batch_id = ? ORDER BY i.seq", (batch_id,))
        return tuple(_record(row) for row in rows.fetchall())

    def records(self, seqs: Sequence[int]) -> tuple[LedgerRecord, ...]:
        """Stored rows by seq, in seq order."""
        found: list[LedgerRecord] = []
        for first, last in seq_runs(seqs):
            rows = self._run(
                f"{_RECORDS} WHERE i.seq BETWEEN ? AND ? ORDER BY i.seq", (first, last)
            ).fetchall()
            found.extend(_record(row) for row in rows)
        return tuple(found)

    def open_batches(self) -> list[int]:
        rows = self._run(
            "SELECT batch_id FROM batches WHERE state = 'writing' ORDER BY batch_id"
        ).fetchall()
        return [batch_id for (batch_id,) in rows]

    def last_seq(self) -> int:
        (seq,) = self._run("SELECT max(seq) FROM inbound").fetchone()
        return seq or 0

    def gateway_id(self) -> str:
        """This ledger's random id, made (and committed by the caller) on the first ask."""
        row = self._run("SELECT value FROM identity WHERE name = 'gateway_id'").fetchone()
        if row:
            return row[0]
        made = uuid.uuid4().hex
        self._run("INSERT INTO identity (name, value) VALUES ('gateway_id', ?)", (made,))
        return made

    def counter(self, name: str) -> int:
        row = self._run("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    # -- the table's batches ----------------------------------------------------------------

    def begin_batch(self, packs: Sequence[tuple[int, Sequence[int]]], now: float) -> int:
        """Record a batch and the packs (pack id, row seqs) it holds, before its Spark job."""
        seqs = sum(len(s) for _, s in packs)
        batch_id = self._run(
            "INSERT INTO batches (state, started_time, messages) VALUES ('writing', ?, ?)",
            (now, seqs),
        ).lastrowid
        # A pack's seqs are nearly always one run (arrival order): one statement per run, not
        # per row, keeps the ledger thread (and so ingest) from stalling on a 20,000-row batch.
        self._run_many(
            "UPDATE inbound SET pack_id = ?, batch_id = ? WHERE seq BETWEEN ? AND ?",
            [
                (pack_id, batch_id, first, last)
                for pack_id, pack_seqs in packs
                for first, last in seq_runs(pack_seqs)
            ],
        )
        self._run(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)",
            (PACK_COUNTER, max(pack_id for pack_id, _ in packs)),
        )
        return batch_id

    def claim_reads(self, batch_id: int, read_ids: Sequence[str], now: float) -> set[str]:
        """Claim read ids for a batch; returns those the batch owns (new, or claimed by an
        earlier attempt of the same batch)."""
        self._run_many(
            "INSERT INTO read_claims (message_id, batch_id, claimed_time) VALUES (?, ?, ?) "
            "ON CONFLICT (message_id) DO NOTHING",
            [(read_id, batch_id, now) for read_id in read_ids],
        )
        rows = self._run("SELECT message_id FROM read_claims WHERE batch_id = ?", (batch_id,))
        return {row[0] for row in rows.fetchall()}

    def commit_batch(
        self,
        batch_id: int,
        rows: int,
        dead_letters: int,
        now: float,
        retention: float,
        readers: Mapping[str, ReaderCount] | None = None,
        health: Mapping[str, Mapping[str, object]] | None = None,
    ) -> None:
        """The batch is in the tables: mark it and its rows landed, delete the payloads no sink
        owes any more, update the readers' counters and health states, prune keys older than
        `retention`."""
        self._run(
            "UPDATE batches SET state = 'committed', committed_time = ?, rows = ?, "
            "dead_letters = ? WHERE batch_id = ?",
            (now, rows, dead_letters, batch_id),
        )
        self._run("UPDATE inbound SET landed_time = ? WHERE batch_id = ?", (now, batch_id))
        self._run(
            "DELETE FROM payloads WHERE seq IN "
            "(SELECT seq FROM inbound WHERE batch_id = ? AND forward IS NULL)",
            (batch_id,),
        )
        if readers:
            self._save_readers(readers.values())
        if health:
            self._run_many(
                "INSERT INTO reader_health (reader_id, state) VALUES (?, ?) "
                "ON CONFLICT (reader_id) DO UPDATE SET state = excluded.state",
                [(reader, json.dumps(state, sort_keys=True)) for reader, state in health.items()],
            )
        self._run(
            "DELETE FROM inbound WHERE landed_time < ? AND packet_id IS NULL AND forward IS NULL",
            (now - retention,),
        )
        self._run("DELETE FROM read_claims WHERE claimed_time < ?", (now - retention,))

    # -- the upstream's progress ------------------------------------------------------------

    def forwarded(
        self, done: Sequence[int], dead: Sequence[tuple[int, str]], now: float
    ) -> list[int]:
        """The outbound ledger finished these messages: `done` acknowledged upstream (or not
        for upstream at all), `dead` given up on, with the reason. Each dead one gets an
        upstream dead-letter row (its key + '/upstream', owed to the table only), once: a report
        repeated after a restart finds the message no longer owed and adds nothing. Returns
        the seqs of the dead-letter rows added."""
        added = []
        for seq, reason in dead:
            cursor = self._run(
                "INSERT INTO inbound (message_key, topic, qos, received_time, dead_reason, "
                "dead_sink) SELECT message_key || ?, topic, qos, ?, ?, ? FROM inbound "
                "WHERE seq = ? AND forward IS NOT NULL ON CONFLICT (message_key) DO NOTHING",
                (UPSTREAM_DEAD_SUFFIX, now, reason, UPSTREAM, seq),
            )
            if cursor.rowcount:
                added.append(cursor.lastrowid)
                cursor.execute(
                    "INSERT INTO payloads (seq, payload) SELECT ?, payload FROM payloads "
                    "WHERE seq = ?",
                    (cursor.lastrowid, seq),
                )
        finished = [(seq,) for seq in done] + [(seq,) for seq, _ in dead]
        self._run_many("UPDATE inbound SET forward = NULL WHERE seq = ?", finished)
        self._run_many(
            "DELETE FROM payloads WHERE seq = ?1 AND EXISTS "
            "(SELECT 1 FROM inbound WHERE seq = ?1 AND landed_time IS NOT NULL)",
            finished,
        )
        return added

    def stop_forwarding(self) -> int:
        """Forwarding is off: no row is owed upstream any more. Returns how many were."""
        count = self._run("UPDATE inbound SET forward = NULL WHERE forward IS NOT NULL").rowcount
        self.purge_done()
        return count

    def purge_done(self) -> int:
        """Delete every payload no sink owes (leftovers of an older version, or of a change of
        configuration). Returns how many."""
        return self._run(
            f"DELETE FROM payloads WHERE seq IN (SELECT seq FROM inbound WHERE {_DONE})"
        ).rowcount

    # -- readers' counters ------------------------------------------------------------------

    def reader_counts(self) -> dict[str, ReaderCount]:
        rows = self._run(
            "SELECT reader_id, last_event_num, received, missing, resets, without_event_num "
            "FROM reader_counters"
        ).fetchall()
        return {row[0]: ReaderCount(*row) for row in rows}

    def reader_health(self) -> dict[str, dict]:
        """Each reader's health state (spark.reader_health) as of the last committed batch; none
        from a file no daemon of this version has opened yet (the table does not exist)."""
        try:
            rows = self._run("SELECT reader_id, state FROM reader_health").fetchall()
        except sqlite3.OperationalError as error:
            if "no such table" not in str(error):
                raise
            return {}
        return {reader: json.loads(state) for reader, state in rows}

    def _save_readers(self, counts: Iterable[ReaderCount]) -> None:
        self._run_many(
            "INSERT INTO reader_counters (reader_id, last_event_num, received, missing, resets, "
            "without_event_num) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (reader_id) DO UPDATE SET "
            "last_event_num = excluded.last_event_num, received = excluded.received, "
            "missing = excluded.missing, resets = excluded.resets, "
            "without_event_num = excluded.without_event_num",
            [
                (
                    c.reader_id,
                    c.last_event_num,
                    c.received,
                    c.missing,
                    c.resets,
                    c.without_event_num,
                )
                for c in counts
            ],
        )

    # -- status -----------------------------------------------------------------------------

    def lag(self, sink: str) -> SinkLag:
        """How many messages `sink` owes, and when the oldest of them arrived. The oldest is the
        first by seq (arrival order), found through the sink's index, not by a scan."""
        (count,) = self._run(f"SELECT count(*) FROM inbound i WHERE {_LAG[sink]}").fetchone()
        oldest = None
        if count:
            (oldest,) = self._run(
                f"SELECT i.received_time FROM inbound i WHERE {_LAG[sink]} ORDER BY i.seq LIMIT 1"
            ).fetchone()
        return SinkLag(sink, count, oldest)

    def batch_counts(self) -> tuple[int, int]:
        """(batches committed, batches begun and not committed)."""
        rows = dict(self._run("SELECT state, count(*) FROM batches GROUP BY state").fetchall())
        return rows.get("committed", 0), rows.get("writing", 0)

    def last_batch(self) -> tuple[int, float, int, int] | None:
        """(batch id, committed time, rows, dead letters) of the newest committed batch."""
        return self._run(
            "SELECT batch_id, committed_time, rows, dead_letters FROM batches "
            "WHERE state = 'committed' ORDER BY batch_id DESC LIMIT 1"
        ).fetchone()

    def pending(self) -> int:
        """Rows not yet in the table (in a batch or not)."""
        (count,) = self._run("SELECT count(*) FROM inbound WHERE landed_time IS NULL").fetchone()
        return count

    def usage(self) -> DiskUsage:
        """The file's used pages (those still in the write-ahead log included: the count is the
        database as this connection sees it), and the free space beside it. The WAL file itself
        is not counted: it is reused, and cut back to database.WAL_SIZE_LIMIT at checkpoints."""
        (pages,) = self._run("PRAGMA page_count").fetchone()
        (free_pages,) = self._run("PRAGMA freelist_count").fetchone()
        (page_size,) = self._run("PRAGMA page_size").fetchone()
        return DiskUsage((pages - free_pages) * page_size, free_bytes(self.path.parent))
