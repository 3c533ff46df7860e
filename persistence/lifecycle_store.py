"""LifecycleStore: every SQL statement on the life-cycle file (`lifecycle.sqlite`).

Two tables: each configured client's state (its sequence number first: it must never go back,
DESIGN §1), and an outbox with one row per event and sink that has not taken it yet. A client's
new state and its event are one transaction (`record`), so a kill between them cannot leave a
number without its event or an event without its number. The owner (actors.lifecycle) decides
what to record and hands the events on; no threads, no clock here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import astuple, dataclass
from pathlib import Path

from persistence.database import LIFECYCLE_VERSION, connect_sqlite

SCHEMA = """
CREATE TABLE IF NOT EXISTS clients (
    client_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,                 -- the connection's role: source | upstream
    authentication_name TEXT NOT NULL,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    created_on REAL NOT NULL,
    updated_on REAL NOT NULL,
    sequence_number INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,                -- configured | connected | disconnected
    session_name TEXT,
    last_reason TEXT,
    last_event_time REAL
);
CREATE TABLE IF NOT EXISTS outbox (
    position INTEGER NOT NULL,          -- emission order
    sink TEXT NOT NULL,                 -- the sink that has not taken it yet
    event TEXT NOT NULL,                -- the CloudEvent as JSON
    PRIMARY KEY (position, sink)
);
"""


@dataclass(frozen=True, slots=True)
class ClientRow:
    """One client as the file keeps it (the columns of `clients`, in order)."""

    client_id: str
    name: str
    authentication_name: str
    host: str
    port: int
    fingerprint: str
    created_on: float
    updated_on: float
    sequence_number: int
    state: str
    session_name: str | None
    last_reason: str | None
    last_event_time: float | None


_COLUMNS = ", ".join(ClientRow.__slots__)


class LifecycleStore:
    """One connection to `lifecycle.sqlite`; call it only from the thread that opened it."""

    def __init__(self, path: Path, durability: str) -> None:
        self.path = Path(path)
        self._db = connect_sqlite(self.path, durability, SCHEMA, LIFECYCLE_VERSION, "clients")

    def close(self) -> None:
        self._db.close()

    def clients(self) -> list[ClientRow]:
        return [ClientRow(*row) for row in self._db.execute(f"SELECT {_COLUMNS} FROM clients")]

    def record(
        self, client: ClientRow | str, position: int, sinks: Iterable[str], event: str
    ) -> None:
        """The client's new state (a client id alone: the client was deleted) and its event,
        owed to each of `sinks`: one transaction."""
        with self._db:
            if isinstance(client, str):
                self._db.execute("DELETE FROM clients WHERE client_id = ?", (client,))
            else:
                self._db.execute(
                    f"INSERT OR REPLACE INTO clients ({_COLUMNS}) "
                    f"VALUES ({', '.join('?' * len(ClientRow.__slots__))})",
                    astuple(client),
                )
            self._db.executemany(
                "INSERT INTO outbox (position, sink, event) VALUES (?, ?, ?)",
                [(position, sink, event) for sink in sinks],
            )

    def taken(self, position: int, sink: str) -> None:
        """`sink` has the event at `position`."""
        with self._db:
            self._db.execute("DELETE FROM outbox WHERE position = ? AND sink = ?", (position, sink))

    def outbox(self) -> list[tuple[int, str, str]]:
        """(position, sink, event JSON) of every event a sink has not taken, in order."""
        return list(
            self._db.execute("SELECT position, sink, event FROM outbox ORDER BY position, sink")
        )

    def drop_sinks(self, sinks: Iterable[str]) -> None:
        """Forget what is owed to sinks that are no longer configured."""
        with self._db:
            self._db.executemany("DELETE FROM outbox WHERE sink = ?", [(s,) for s in sinks])
