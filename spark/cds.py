"""A class-data-sharing archive for the Spark JVM: the classes a gateway's Spark loads, parsed
and laid out once at install time (`make`), mapped by every later start.

Every start of the daemon (and of `fxgate sql`, `audit`, `compact`, `report`) starts a JVM that
loads and verifies some 15,000 classes before Spark is ready: 4-6 s on this machine, and the
first write after it pays more for the rest. Java 17 can dump the classes a run loaded into a
*dynamic archive* when that JVM exits (`-XX:ArchiveClassesAtExit`); a later JVM with the same
class path maps it (`-XX:SharedArchiveFile`) instead of loading them again.

`spark.cds_archive` runs what the daemon's Spark does (a session, a table write of every kind
the writer lands, a read back and a query) in a JVM that dumps its classes at exit, into a
temporary name renamed into place once complete. `build_session` (spark/session.py) adds the
archive to the JVM's options when `[spark] class_data_archive` names one ("auto":
`DEFAULT_ARCHIVE`, the one `make` writes into the virtualenv, when it exists). A JVM that cannot
use it (another JDK, the jars reinstalled since, a damaged file) starts as it would without it:
nothing fails, the session's start says so at WARNING, and `make` writes it again. The JVM's own
account of it goes to `cds.log` in the session's work directory, never to the console.
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_ARCHIVE = Path(sys.prefix) / "share" / "fxgate" / "spark-classes.jsa"
AUTO = "auto"
LOG_FILE = "cds.log"


def resolve(setting: str | Path | None) -> Path | None:
    """The archive a session should map: None for "" or None (off); for "auto" the install's
    archive if `make` wrote one; otherwise the path given (whether or not it exists: a JVM
    without it says so in `cds.log`, and `archive_status` reports it)."""
    if setting is None or str(setting) == "":
        return None
    if str(setting) == AUTO:
        return DEFAULT_ARCHIVE if DEFAULT_ARCHIVE.is_file() else None
    return Path(setting)


def java_options(archive: Path, log_file: Path) -> list[str]:
    """JVM options that map `archive`, with the JVM's CDS messages in `log_file` only."""
    return _options(f"-XX:SharedArchiveFile={archive}", log_file)


def dump_options(archive: Path, log_file: Path) -> list[str]:
    """JVM options that dump the classes loaded into `archive` at exit."""
    return _options(f"-XX:ArchiveClassesAtExit={archive}", log_file)


def _options(archive_option: str, log_file: Path) -> list[str]:
    # Off on the console (where a dump prints a warning per class it skips), on in the file.
    return [
        archive_option,
        "-Xlog:cds=off",
        "-Xlog:cds+dynamic=off",
        f"-Xlog:cds=info:file={log_file}",
    ]


def archive_status(archive: Path, log_file: Path) -> str | None:
    """None when the JVM that wrote `log_file` mapped `archive`; otherwise why not."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError as error:
        return f"no account of it from the JVM ({error.strerror})"
    refusals = [
        line.split("UseSharedSpaces:", 1)[1].strip() for line in lines if "UseSharedSpaces:" in line
    ]
    if refusals:
        return "; ".join(dict.fromkeys(refusals))
    if not any(f"Opened archive {archive}." in line for line in lines):
        return "the JVM did not open it"
    return None
