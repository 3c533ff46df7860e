"""Where the tables live: a local directory, an object store, or a Hadoop-compatible URI
(`[spark] tables_dir`).

A location is a `Path` when the tables are on this machine's file system (a plain path, or a
`file:` URI) and the URI text otherwise: an object store that delta-rs reaches itself (Azure Blob
Storage or ADLS Gen2 as `az://container/path` or `abfss://container@account.dfs.core.windows.net/
path`; S3 as `s3://bucket/path`), or a file system only Spark reaches (`hdfs://namenode/fxgate`,
`s3a://bucket/fxgate`). Code that can only work on this disk (removing a killed job's leftovers,
the writer lock) asks `local_path`; code that works wherever delta-rs reaches asks
`delta_location`, which is None only for Spark's file systems.

An object store's credentials never appear in its URI: delta-rs (and the readers) take them
from the environment, the variables each store's own tools use (docs: object-store tables), or
from `[spark] store_credentials_file`, a file of those variables that each command reads when it
starts (`read_store_credentials`) and sets in its environment before any thread or child starts
(`apply_store_credentials`): delta-rs, obstore, the parse worker and Spark's Python workers then
all reach the store with the same settings.

Spark is always handed a URI (`spark_uri`), never a bare path: Hadoop resolves a bare path against
`fs.defaultFS`, which a cluster's configuration usually points at HDFS, so `/var/lib/fxgate/tables`
would be written there while every local reader looked on the gateway's disk.

This module imports nothing heavy: the config loader uses it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

# RFC 3986 scheme, then ':'; a plain path never starts like that (a ':' after a '/' is not one).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_LOCAL_HOSTS = frozenset({"", "localhost"})
# The object stores delta-rs lands into with no JVM: URI scheme -> the store, as logs name it.
OBJECT_STORES = {"az": "Azure", "abfs": "Azure", "abfss": "Azure", "s3": "S3"}

Location = Path | str

# The prefixes of the environment variables object stores take their settings from (delta-rs,
# obstore and the readers read them): what a store credentials file may set.
STORE_VARIABLES = ("AZURE_", "AZURITE_", "AWS_", "GOOGLE_")


def parse_location(text: str) -> Location:
    """`text` as a location: an absolute `Path` (plain paths are taken relative to the working
    directory, `~` expanded) or a checked URI. Raises ValueError with what to write instead."""
    match = _SCHEME.match(text)
    if match is None:
        return Path(os.path.abspath(os.path.expanduser(text)))
    scheme = match.group(1).lower()
    parts = urlsplit(text)
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise ValueError(f"{text!r}: a tables URI may not hold a query or a fragment")
    if scheme == "file":
        return _file_path(text, parts.netloc, parts.path)
    if not text[match.end() :].startswith("//"):
        raise ValueError(
            f"{text!r}: expected {scheme}://<authority>/<path> (or {scheme}:///<path> for the "
            "cluster's default authority)"
        )
    # In abfs[s]://container@account.dfs.core.windows.net/ the user part is the container.
    if parts.password is not None or (scheme in ("az", "s3") and parts.username is not None):
        # It would be logged and shown by `fxgate status`; Hadoop refuses it as well.
        raise ValueError(
            f"{scheme}://…: credentials may not be written into the URI; give them in the "
            "environment (AZURE_STORAGE_ACCOUNT_KEY, AWS_SECRET_ACCESS_KEY, ...) or to Spark "
            "in [spark.conf] (e.g. spark.hadoop.fs.s3a.access.key)"
        )
    if scheme in OBJECT_STORES and not parts.netloc:
        raise ValueError(
            f"{text!r}: name the {OBJECT_STORES[scheme]} "
            f"{'bucket' if scheme == 's3' else 'container'} ({scheme}://<name>/<path>)"
        )
    if not parts.netloc and parts.path in ("", "/"):
        raise ValueError(f"{text!r}: names no directory")
    return text.rstrip("/")


def _file_path(text: str, host: str, path: str) -> Path:
    if host.lower() not in _LOCAL_HOSTS:
        raise ValueError(
            f"{text!r}: a file: URI names a directory on this machine (file:///path); for "
            f"another host's disk use a mount or a cluster file system (hdfs://, s3a://)"
        )
    if not path.startswith("/"):
        raise ValueError(f"{text!r}: a file: URI needs an absolute path (file:///path)")
    # Taken literally, not percent-decoded: Hadoop's Path does the same with the URI it is
    # given, so the local readers look where Spark wrote.
    return Path(os.path.normpath(path))


def is_local_master(master: str) -> bool:
    """`local`, `local[2]`, `local[*]`, `local[2,3]`: the executors run inside the driver."""
    return master == "local" or master.startswith("local[")


def local_path(location: Location) -> Path | None:
    """The local directory of `location`, or None when it is not on this machine's disk."""
    if isinstance(location, Path) or _SCHEME.match(location) is None:
        return Path(os.path.abspath(location))
    parts = urlsplit(location)
    if parts.scheme.lower() == "file" and parts.netloc.lower() in _LOCAL_HOSTS:
        return Path(os.path.normpath(parts.path))
    return None


def object_store(location: Location) -> str | None:
    """The object store `location` is on ("Azure", "S3"), or None."""
    if isinstance(location, Path):
        return None
    match = _SCHEME.match(location)
    return None if match is None else OBJECT_STORES.get(match.group(1).lower())


def delta_location(location: Location) -> str | None:
    """What delta-rs opens for `location`: a local directory's path, or an object store's URI;
    None where only Spark reaches the tables (`hdfs://`, `s3a://`)."""
    local = local_path(location)
    if local is not None:
        return str(local)
    if object_store(location) is not None:
        return str(location).rstrip("/")
    return None


def spark_uri(location: Location) -> str:
    """What to hand Spark: a URI with its scheme, so `fs.defaultFS` never decides."""
    local = local_path(location)
    if local is None:
        return str(location).rstrip("/")
    # Not Path.as_uri(): that percent-encodes, and Hadoop would take '%20' literally.
    return "file://" + str(local.absolute())


def read_store_credentials(path: str) -> dict[str, str]:
    """The variables in the store credentials file at `path`: `NAME=value` lines (`#` comments,
    quoted values, `export` allowed, as in a systemd EnvironmentFile), every name a store's
    (`STORE_VARIABLES`). Raises OSError, or ValueError saying what is wrong on which lines, never
    what they hold."""
    from dotenv.parser import parse_stream

    with open(path, encoding="utf-8") as stream:
        try:
            bindings = list(parse_stream(stream))
        except UnicodeDecodeError:
            raise ValueError("the file is not UTF-8 text") from None
    # Lines are named by number, never by what they hold: a value pasted on a line of its own
    # reads as a name. A line python-dotenv cannot read is an error, not a skipped variable.
    problems = []
    for binding in bindings:
        line = binding.original.line
        if binding.error:
            problems.append(f"line {line}: not NAME=value")
        elif binding.key is not None and not binding.key.startswith(STORE_VARIABLES):
            problems.append(
                f"line {line}: not a store's variable (the file holds only variables starting "
                f"with {', '.join(STORE_VARIABLES)})"
            )
        elif binding.key is not None and not binding.value:
            problems.append(f"line {line}: no value (write NAME=value)")
    if problems:
        raise ValueError("; ".join(problems))
    values = {binding.key: binding.value for binding in bindings if binding.key is not None}
    if not values:
        raise ValueError("the file sets no variable (it holds NAME=value lines)")
    return values


def apply_store_credentials(path: str, environ=os.environ) -> list[str]:
    """Set the variables of the store credentials file at `path` in `environ` (over any of the
    same names); their names, sorted. Call it once as a process starts, before it starts a
    thread or a child: the native libraries read the environment from their own threads."""
    values = read_store_credentials(path)
    environ.update(values)
    return sorted(values)
