"""Storage faults: which SQLite errors mean "the disk, not the data", and corrupt files at start.

A full disk (SQLITE_FULL), a data directory gone read-only (SQLITE_READONLY; ext4 remounts itself
read-only after an error, and writes then fail as SQLITE_IOERR) or a failing device are states of
the machine, not bugs: the owners of the SQLite files (the inbound and outbound ledgers, the
life-cycle store) roll back, keep what they were doing in memory or leave it with the broker, and
retry on the clock instead of dying, because a dead actor restarts into the same full disk and the
restart budget turns that into an exit, then into systemd's crash loop.

A corrupt file is different: no retry helps, and recreating it empty would silently lose what it
held. `check_database` (called by every opener in persistence.database) moves the file and its
-wal/-shm aside as `<name>.corrupt-<UTC time>` and refuses to start; as long as that moved file
sits beside the database, every later start refuses too, naming it. The operator salvages it or
removes it (docs/pages/operating/faults.md); only then is a new, empty file created.
"""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger(__name__)

# Primary result codes (the low byte of an extended code) that a retry can outlive.
_TRANSIENT = {
    sqlite3.SQLITE_FULL: "SQLITE_FULL",
    sqlite3.SQLITE_READONLY: "SQLITE_READONLY",
    sqlite3.SQLITE_IOERR: "SQLITE_IOERR",
    sqlite3.SQLITE_CANTOPEN: "SQLITE_CANTOPEN",
    sqlite3.SQLITE_BUSY: "SQLITE_BUSY",
    sqlite3.SQLITE_LOCKED: "SQLITE_LOCKED",
    sqlite3.SQLITE_NOMEM: "SQLITE_NOMEM",
}
_CORRUPT = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
# An error raised without a result code (an injected one, or an old driver): its text decides.
_TRANSIENT_TEXT = (
    "database or disk is full",
    "readonly database",
    "disk i/o error",
    "unable to open database file",
    "database is locked",
)

CORRUPT_MARK = ".corrupt-"


class StorageUnavailable(RuntimeError):
    """The ledger cannot write now (disk full, read-only, I/O error); raised to whoever asked for
    a write meanwhile. The asker retries later: nothing it asked for was stored."""


class CorruptDatabase(RuntimeError):
    """A database file is corrupt, or was found corrupt before and not yet dealt with."""


def sqlite_error(error: BaseException) -> BaseException:
    """The sqlite3 exception behind a SQLAlchemy one (`DBAPIError.orig`), else `error`."""
    orig = getattr(error, "orig", None)
    return orig if isinstance(orig, sqlite3.Error) else error


def _code(error: BaseException) -> int | None:
    code = getattr(sqlite_error(error), "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_storage_fault(error: BaseException) -> bool:
    """True for an error that says the storage cannot write now, not that a statement is wrong."""
    error = sqlite_error(error)
    if not isinstance(error, sqlite3.OperationalError | sqlite3.DatabaseError):
        return False
    code = _code(error)
    if code is not None:
        return code in _TRANSIENT
    text = str(error).lower()
    return any(fragment in text for fragment in _TRANSIENT_TEXT)


def is_corruption(error: BaseException) -> bool:
    error = sqlite_error(error)
    if not isinstance(error, sqlite3.DatabaseError):
        return False
    code = _code(error)
    if code is not None:
        return code in _CORRUPT
    text = str(error).lower()
    return "not a database" in text or "malformed" in text


def cannot_open(path: Path, error: BaseException) -> StorageUnavailable:
    """The StorageUnavailable for a database file a storage fault keeps from opening."""
    return StorageUnavailable(
        f"cannot open {path}: {describe(error)}; is {path.parent} mounted, writable and not full?"
    )


def describe(error: BaseException) -> str:
    """One line for an operator: SQLite's message and its result code's name."""
    error = sqlite_error(error)
    name = getattr(error, "sqlite_errorname", None)
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return f"{text} ({name})" if name else text


# The SQLite files of a data directory that `check_database` guards.
DATABASE_FILES = ("ledger.sqlite", "outbound.sqlite", "lifecycle.sqlite")


def corrupt_files(data_dir: Path) -> list[Path]:
    """Every file of `data_dir` moved aside as corrupt and still waiting for the operator."""
    return [p for name in DATABASE_FILES for p in corrupt_leftovers(Path(data_dir) / name)]


def corrupt_leftovers(path: Path) -> list[Path]:
    """Files moved aside by an earlier `check_database` of `path`, oldest first."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    prefix = path.name + CORRUPT_MARK
    return sorted(
        p
        for p in path.parent.iterdir()
        if p.name.startswith(prefix) and not p.name.endswith(("-wal", "-shm"))
    )


def move_aside(path: Path) -> Path:
    """Rename `path` and its -wal/-shm to `<name>.corrupt-<UTC time>[-wal|-shm]`; returns the
    new name of the main file. The WAL goes with it: it may hold the newest committed rows."""
    path = Path(path)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}{CORRUPT_MARK}{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{CORRUPT_MARK}{stamp}.{n}")
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.replace(target.with_name(target.name + suffix))
    path.replace(target)
    return target


def _refusal(path: Path, moved: Path, found: str) -> str:
    return (
        f"{path} {found}; it was moved aside to {moved.name} (with its -wal/-shm) and fxgate "
        f"will not create a new, empty {path.name} while that file is there, because the rows "
        f"it holds would be lost without a word. Salvage what you can, e.g. "
        f"`sqlite3 {moved} .recover | sqlite3 {path}` (then check it with "
        f"`sqlite3 {path} 'PRAGMA quick_check'`), and move {moved.name} out of {path.parent}; or "
        f"move it out to start with an empty {path.name} (messages it held that had not reached "
        f"the table are lost unless a broker still holds them)."
    )


def check_database(path: Path) -> None:
    """Before a writer opens `path`: refuse while an earlier corrupt copy waits for the operator,
    then check an existing file with `PRAGMA quick_check`; a corrupt one is moved aside.

    Raises CorruptDatabase (do not start) or StorageUnavailable (the file cannot be opened)."""
    path = Path(path)
    leftovers = corrupt_leftovers(path)
    if leftovers:
        message = _refusal(path, leftovers[-1], "was found corrupt at an earlier start")
        log.error("%s", message)
        raise CorruptDatabase(message)
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        problems = _quick_check(path)
    except sqlite3.DatabaseError as error:
        if not is_corruption(error):
            if is_storage_fault(error):
                raise cannot_open(path, error) from error
            raise
        problems = [describe(error)]
    if not problems:
        return
    moved = move_aside(path)
    message = _refusal(path, moved, f"is corrupt ({'; '.join(problems[:3])})")
    log.error("%s", message)
    raise CorruptDatabase(message)


def _quick_check(path: Path) -> list[str]:
    """`PRAGMA quick_check`'s complaints (none for a sound file); it reads every page but skips
    the index-content checks of integrity_check. Read-only on purpose: it sees the WAL's frames
    but never checkpoints them into a file that may be corrupt, nor deletes the WAL on close
    (a read-write connection did both here), so what is moved aside is what the kill left."""
    db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    try:
        rows = [row[0] for row in db.execute("PRAGMA quick_check")]
    finally:
        db.close()
    return [] if rows == ["ok"] else rows
