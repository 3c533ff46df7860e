"""Owner-only permissions for what the daemon stores: the data directory (0700), the SQLite files
(0600) and the tables directory (0700).

The ledger holds every read's payload and the broker's packet ids; nobody but the daemon's user
has a reason to read it, let alone write it. Directories are made 0700 and files 0600 when they
are created; an existing one that grants group or other access is tightened, once, with a log
line — unless it is not ours or is a shared sticky directory such as /tmp (a mistaken
`data_dir = "/tmp"` must not lock everyone else out of /tmp), which only gets a warning.

SQLite creates a database's -wal and -shm files with the database file's own permissions, so a
0600 database file keeps them private too.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_GROUP_OTHER = 0o077
# What SQLite keeps beside a database in WAL mode.
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def private_directory(directory: Path) -> Path:
    """`directory` created 0700 (missing parents as usual), or tightened to owner-only."""
    directory = Path(directory)
    # umask only takes bits away, so 0700 stays 0700.
    directory.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    _tighten(directory, PRIVATE_DIR)
    return directory


def private_file(path: Path) -> Path:
    """`path` created empty with 0600 if missing, else tightened; its SQLite companions too."""
    path = Path(path)
    try:
        # O_EXCL: never truncate a file that appeared meanwhile; an existing one is tightened.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except FileExistsError:
        _tighten(path, PRIVATE_FILE)
    except OSError as error:
        # A full or read-only disk: SQLite's own open reports it, as the storage-fault handling
        # (persistence.storage_faults) expects.
        log.debug("%s not created ahead of SQLite: %s", path, error)
    for suffix in SQLITE_COMPANIONS:
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            _tighten(companion, PRIVATE_FILE)
    return path


def _tighten(path: Path, private: int) -> None:
    info = os.stat(path)
    mode = stat.S_IMODE(info.st_mode)
    if not mode & _GROUP_OTHER:
        return
    if info.st_uid != os.geteuid() or mode & stat.S_ISVTX:
        log.warning(
            "%s is accessible by group or others (mode %04o) and is not the daemon's own to "
            "change; give fxgate a directory of its own",
            path,
            mode,
        )
        return
    try:
        os.chmod(path, mode & private)
    except OSError as error:  # e.g. a file system remounted read-only: not a reason to stop
        log.warning("%s is accessible by group or others (mode %04o): %s", path, mode, error)
        return
    log.info("%s: group and other access removed (mode %04o -> %04o)", path, mode, mode & private)
