"""A storage fault on demand: SQLite connections whose writes and commits fail as a full disk's.

`install(monkeypatch)` makes every engine that persistence.database opens (the inbound ledger's)
use `FaultySqlite` connections; `FAULTS.set(message)` then makes each write statement and commit
raise sqlite3.OperationalError(message) until `FAULTS.set(None)`, the way SQLite reports
SQLITE_FULL ("database or disk is full") or SQLITE_READONLY. The fault comes from the storage
layer itself: the ledger's own code runs unchanged above it.
"""

from __future__ import annotations

import sqlite3
import threading

import sqlalchemy

DISK_FULL = "database or disk is full"
READ_ONLY = "attempt to write a readonly database"
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


class Faults:
    """What the storage does now: None (works) or the message every write fails with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._message: str | None = None
        self.raised = 0

    def set(self, message: str | None) -> None:
        with self._lock:
            self._message = message
            self.raised = 0

    def check(self) -> None:
        with self._lock:
            message = self._message
            if message is not None:
                self.raised += 1
        if message is not None:
            raise sqlite3.OperationalError(message)


FAULTS = Faults()


def _is_write(sql: str) -> bool:
    return sql.lstrip().upper().startswith(_WRITES)


class _FailingWrites:
    """`execute` and `executemany` of a write statement fail while FAULTS says so: for cursors,
    and for connections too, whose own `execute` calls sqlite3's C code past FaultyCursor."""

    def execute(self, sql, parameters=(), /):
        if _is_write(sql):
            FAULTS.check()
        return super().execute(sql, parameters)

    def executemany(self, sql, seq_of_parameters, /):
        if _is_write(sql):
            FAULTS.check()
        return super().executemany(sql, seq_of_parameters)


class FaultyCursor(_FailingWrites, sqlite3.Cursor):
    pass


class FaultySqlite(_FailingWrites, sqlite3.Connection):
    """A connection whose writes and commits fail while FAULTS says so."""

    def cursor(self, factory=FaultyCursor):
        return super().cursor(factory)

    def commit(self):
        FAULTS.check()
        return super().commit()

    # `with connection:` commits in sqlite3's C code, past `commit` above: this makes it fail
    # the same way.
    def __exit__(self, exc_type, exc, traceback):
        if exc_type is None:
            try:
                FAULTS.check()
            except sqlite3.OperationalError:
                self.rollback()  # as a commit that failed for a full disk leaves it
                raise
        return super().__exit__(exc_type, exc, traceback)


class _Sqlite3WithFaults:
    """sqlite3 as persistence.database sees it, with FaultySqlite connections."""

    def __getattr__(self, name):
        return getattr(sqlite3, name)

    @staticmethod
    def connect(*args, **kwargs):
        kwargs.setdefault("factory", FaultySqlite)
        return sqlite3.connect(*args, **kwargs)


def install(monkeypatch) -> Faults:
    """Files opened from now on through persistence.database (the inbound ledger's engine, the
    outbound ledger's and the life-cycle store's connections) fail writes when told."""
    from persistence import database

    FAULTS.set(None)

    def create_engine(url, **kwargs):
        return sqlalchemy.create_engine(url, connect_args={"factory": FaultySqlite}, **kwargs)

    monkeypatch.setattr(database, "create_engine", create_engine)
    monkeypatch.setattr(database, "sqlite3", _Sqlite3WithFaults())
    return FAULTS
