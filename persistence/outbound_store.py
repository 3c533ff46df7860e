"""OutboundStore: every SQL statement on the outbound ledger's file (`outbound.sqlite`).

One row per message on its way upstream: its packet id while in flight, its state
(`publish` | `pubrel` | `acked` | `failed` | `dead`), the attempts and, for a dead one, the reason.
The ids and states are what make a restart re-send the same packet ids (DESIGN §3.2); a row
stays until the inbound ledger has recorded the message as done upstream (`forget`).

Writes are decided one by one and go to the file together at `commit`: the ack states first
(one statement for a whole mailbox of acks, a later decision on the same row winning), then the
rest in the order they were decided. A commit that meets a storage fault is rolled back and keeps
every pending write, so the retry writes them all; the owner (actors.outbound) decides when to
retry. No threads, no clock: tested against a temporary file on its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from persistence.database import OUTBOUND_VERSION, connect_sqlite

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbound (
    seq INTEGER PRIMARY KEY,       -- the inbound ledger's row
    packet_id INTEGER,             -- while in flight
    state TEXT NOT NULL,           -- publish | pubrel | acked | failed | dead
    attempts INTEGER NOT NULL DEFAULT 0,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS outbound_packet_id ON outbound (packet_id);
"""

DEFAULT_DEAD_REASON = "forward_failed"


class OutboundStore:
    """One connection to `outbound.sqlite`; call it only from the thread that opened it."""

    def __init__(self, path: Path, durability: str) -> None:
        self.path = Path(path)
        self._db = connect_sqlite(self.path, durability, SCHEMA, OUTBOUND_VERSION, table="outbound")
        # (state, seq) decided by acks, written in one statement before anything else.
        self._states: list[tuple[str, int]] = []
        # Statements (sql, rows) in the order they were decided, executed at the next commit.
        self._writes: list[tuple[str, list[tuple]]] = []

    def close(self) -> None:
        self._db.close()

    # -- reading (at start) -----------------------------------------------------------------

    def known(self) -> dict[int, tuple[str, int | None, int]]:
        """seq -> (state, packet id, attempts) of every row."""
        return {
            seq: (state, packet_id, attempts)
            for seq, state, packet_id, attempts in self._db.execute(
                "SELECT seq, state, packet_id, attempts FROM outbound"
            )
        }

    def dead(self) -> list[tuple[int, str]]:
        """(seq, reason) of the messages given up on."""
        return list(
            self._db.execute(
                "SELECT seq, coalesce(reason, ?) FROM outbound WHERE state = 'dead'",
                (DEFAULT_DEAD_REASON,),
            )
        )

    # -- decisions, written at the next commit ----------------------------------------------

    @property
    def pending(self) -> bool:
        return bool(self._states or self._writes)

    def set_state(self, seq: int, state: str) -> None:
        """An ack decided the state of `seq`: `pubrel` keeps its packet id, the others drop it."""
        self._states.append((state, seq))

    def in_flight(self, rows: Iterable[tuple[int, int, int]]) -> None:
        """(seq, packet id, attempts) about to be published: recorded before they leave."""
        self._write(
            "INSERT INTO outbound (seq, packet_id, state, attempts) VALUES (?, ?, 'publish', ?) "
            "ON CONFLICT (seq) DO UPDATE SET packet_id = excluded.packet_id, "
            "state = 'publish', attempts = excluded.attempts",
            list(rows),
        )

    def sent(self, seqs: Iterable[int]) -> None:
        """QoS 0 messages about to be published once: done, as far as this ledger goes (no
        packet id, never sent again), recorded before they leave."""
        self._write(
            "INSERT INTO outbound (seq, packet_id, state, attempts) VALUES (?, NULL, 'acked', 1) "
            "ON CONFLICT (seq) DO UPDATE SET packet_id = NULL, state = 'acked'",
            [(s,) for s in seqs],
        )

    def publish_again(self, seqs: Iterable[int]) -> None:
        """Awaiting PUBCOMP when the broker lost the session: they are to be published again."""
        self._write("UPDATE outbound SET state = 'publish' WHERE seq = ?", [(s,) for s in seqs])

    def give_up(self, seq: int, attempts: int, reason: str) -> None:
        self._write(
            "INSERT INTO outbound (seq, packet_id, state, attempts, reason) "
            "VALUES (?, NULL, 'dead', ?, ?) ON CONFLICT (seq) DO UPDATE SET packet_id = NULL, "
            "state = 'dead', reason = excluded.reason",
            [(seq, attempts, reason)],
        )

    def forget(self, seqs: Iterable[int]) -> None:
        """The inbound ledger recorded these as done upstream: their rows can go."""
        self._write("DELETE FROM outbound WHERE seq = ?", [(s,) for s in seqs])

    def _write(self, sql: str, rows: list[tuple]) -> None:
        self._flush_states()
        self._writes.append((sql, rows))

    def _flush_states(self) -> None:
        # A later write to the same row must win over an ack decided before it.
        if self._states:
            states, self._states = self._states, []
            self._writes.append(
                (
                    "UPDATE outbound SET state = ?1, packet_id = "
                    "CASE ?1 WHEN 'pubrel' THEN packet_id ELSE NULL END WHERE seq = ?2",
                    states,
                )
            )

    def commit(self) -> None:
        """Write everything pending and commit. A sqlite3.Error goes up after a rollback, the
        pending writes kept for the next attempt."""
        self._flush_states()
        try:
            for sql, rows in self._writes:
                self._db.executemany(sql, rows)
            self._db.commit()
        except sqlite3.Error:
            try:
                self._db.rollback()
            except sqlite3.Error:
                pass  # SQLite may have rolled back already; the writes are still pending
            raise
        self._writes.clear()
