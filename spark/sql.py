"""`fxgate sql`: Spark SQL over the gateway's tables, each one a temporary view of its name.

Every table of `TABLES` is registered, read the way `spark.tables.read_table` reads it: one
snapshot of the Delta table (schema changes are additive, so rows landed before a column was
added read as null in it; `date` a string, `batch_id` a long), taking no lock of ours. A table
that has no Delta log yet is an empty view with its full schema, so a query is checked against
the columns it will have. Any other Delta table found under a local tables directory (a name
starting with a letter) is registered as well; a directory that is no Delta table is left out,
with a note.

It only reads. A statement runs when Spark's parser takes it as a query (`SELECT`, `WITH`, `VALUES`,
`TABLE`, `FROM ... SELECT`: `parseQuery`, the grammar's own rule for them) or parses to one of the
statements in `READ_ONLY_STATEMENTS` (`SHOW`, `DESCRIBE`, `EXPLAIN`). Anything else (`INSERT`,
`INSERT OVERWRITE DIRECTORY`, `CREATE`, `DROP`, `SET`, `CACHE`, `ADD JAR`, ...) is refused before
Spark runs it: Spark runs a command as the statement is handed to it, and one aimed at the
tables directory would rewrite the gateway's tables under the daemon.

A query's result comes back through Arrow (`DataFrame.toArrow`), so timestamps keep their UTC
zone whatever the Python process's local zone is. At most `limit` rows are fetched (`df.limit`,
so Spark stops early); the caller is told when there were more.

Formatting is pure: `format_table` for a person (aligned columns, NULL, times in UTC, long or
multi-line text cut and escaped), `json_lines` for a program (one JSON object per row, in column
order). Nothing here starts or stops a session: the command owns its session.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark.errors import ParseException, PySparkException
from pyspark.sql import SparkSession

from spark.location import Location, local_path
from spark.schema import (
    DEAD_LETTERS_SCHEMA,
    EVENTS_SCHEMA,
    READER_EVENTS_SCHEMA,
    READS_SCHEMA,
)
from spark.tables import (
    DEAD_LETTERS,
    EVENTS,
    READER_EVENTS,
    READS,
    is_delta_table,
    read_table,
    table_path,
)

# The tables the gateway writes, with the schema an empty one is registered with.
TABLES: Mapping[str, pa.Schema] = {
    READS: READS_SCHEMA,
    DEAD_LETTERS: DEAD_LETTERS_SCHEMA,
    EVENTS: EVENTS_SCHEMA,
    READER_EVENTS: READER_EVENTS_SCHEMA,
}

# A cell of the text table: longer text is cut (the JSON output never is).
MAX_CELL_CHARS = 60

# A directory under the tables directory that is a table (as spark.tables.table_path allows):
# Spark and pyarrow skip names starting with `.` or `_`, and so does this.
_TABLE_DIR = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class CannotQuery(ValueError):
    """No query can run: the tables directory is not there, or a table cannot be read (the
    command exits 2)."""


class QueryFailed(Exception):
    """Spark refused or failed the query (the command exits 1); the message is one line or a
    few, without the JVM's stack."""


class QueryRefused(QueryFailed):
    """The statement is not a query and could write or change state: it did not run."""


# Statements beyond queries that only read, by the class of Spark's parsed plan.
READ_ONLY_STATEMENTS = frozenset(
    {
        "ShowTables",
        "ShowViews",
        "ShowColumns",
        "ShowFunctions",
        "ShowTableProperties",
        "DescribeRelation",
        "DescribeColumn",
        "DescribeFunction",
        "DescribeQueryCommand",
        "ExplainCommand",
    }
)


@dataclass(frozen=True)
class QueryResult:
    columns: tuple[str, ...]
    types: tuple[str, ...]  # Spark's simple type strings: "bigint", "timestamp", ...
    rows: tuple[tuple, ...]
    truncated: bool  # there were more rows than the limit


def check_tables_dir(tables_dir: Location) -> None:
    """Raise CannotQuery unless a local `tables_dir` is a directory (a remote one is
    Spark's to find, an object store's delta-rs's); checked before a JVM starts, so a wrong
    path fails at once."""
    local = local_path(tables_dir)
    if local is None:
        return
    try:
        mode = os.stat(local).st_mode
    except FileNotFoundError:
        raise CannotQuery(f"tables directory {local} does not exist") from None
    except OSError as error:
        raise CannotQuery(f"cannot read tables directory {local}: {error.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise CannotQuery(f"tables directory {local} is not a directory")


def table_names(tables_dir: Location) -> list[str]:
    """The gateway's tables, then any other table directory found under a local `tables_dir`."""
    names = list(TABLES)
    local = local_path(tables_dir)
    if local is not None:
        try:
            found = sorted(
                entry.name
                for entry in os.scandir(local)
                if entry.is_dir() and _TABLE_DIR.match(entry.name) and entry.name not in TABLES
            )
        except OSError as error:
            raise CannotQuery(f"cannot list tables directory {local}: {error.strerror}") from None
        names.extend(found)
    return names


def register_tables(session: SparkSession, tables_dir: Location) -> dict[str, str]:
    """Register every table as a temporary view of its name. Returns the other directories
    that could not be read as a table (name -> why): they are left out, since a stray
    directory must not stop every query; a gateway table that cannot be read raises
    CannotQuery."""
    skipped: dict[str, str] = {}
    local = local_path(tables_dir)
    for name in table_names(tables_dir):
        if name not in TABLES and local is not None and not is_delta_table(table_path(local, name)):
            skipped[name] = "no Delta table there (no _delta_log)"
            continue
        try:
            df = read_table(session, tables_dir, name, TABLES.get(name))
        except (PySparkException, Py4JJavaError) as error:
            if name in TABLES:
                raise CannotQuery(f"cannot read table {name}: {describe_error(error)}") from None
            skipped[name] = describe_error(error).splitlines()[0]
            continue
        df.createOrReplaceTempView(name)
    return skipped


def run_query(session: SparkSession, query: str, limit: int) -> QueryResult:
    """Run one SQL statement; at most `limit` rows (0: every row). Raises QueryFailed."""
    if limit < 0:
        raise ValueError(f"limit must be 0 or more, got {limit}")
    try:
        check_read_only(session, query)
        df = session.sql(query)
        fields = df.schema.fields
        fetched = (df.limit(limit + 1) if limit else df).toArrow()
    except (PySparkException, Py4JJavaError) as error:
        raise QueryFailed(describe_error(error)) from None
    rows = list(zip(*(column.to_pylist() for column in fetched.columns), strict=True))
    truncated = bool(limit) and len(rows) > limit
    return QueryResult(
        columns=tuple(field.name for field in fields),
        types=tuple(field.dataType.simpleString() for field in fields),
        rows=tuple(rows[:limit] if truncated else rows),
        truncated=truncated,
    )


def check_read_only(session: SparkSession, query: str) -> None:
    """Raise QueryRefused unless `query` only reads (module docstring). Parsing runs nothing;
    a statement Spark cannot parse raises its ParseException, as running it would."""
    parser = session._jsparkSession.sessionState().sqlParser()
    try:
        parser.parseQuery(query)
        return
    except (ParseException, Py4JJavaError):
        pass  # not a query: which statement it is decides
    statement = parser.parsePlan(query).getClass().getSimpleName()
    if statement not in READ_ONLY_STATEMENTS:
        raise QueryRefused(
            f"{statement} is not a query and could write or change state, so it did not run; "
            "fxgate sql runs queries (SELECT, WITH, VALUES, TABLE) and SHOW, DESCRIBE, EXPLAIN"
        )


def describe_error(error: Exception) -> str:
    """What Spark said, without the JVM stack or the logical plan it appends."""
    java = error.java_exception if isinstance(error, Py4JJavaError) else None
    text = str(error) if java is None else str(java.toString())
    kept: list[str] = []
    for line in text.strip().splitlines():
        # An analysis error appends the plan ('Project ..., +- ...), a runtime error the JVM's
        # stack; the "== SQL ==" excerpt with its caret under the culprit stays.
        if line.startswith(("'", "+-", ":-", "\tat ", "JVM stacktrace")) and kept:
            break
        kept.append(line.rstrip())
    return "\n".join(kept).strip() or type(error).__name__


# -- output ------------------------------------------------------------------------------------

_NUMERIC = re.compile(r"^(tinyint|smallint|int|bigint|float|double|decimal.*)$")


def format_table(result: QueryResult, max_cell: int = MAX_CELL_CHARS) -> str:
    """The result as aligned text columns with a header and a row count."""
    cells = [[_cell(value, max_cell) for value in row] for row in result.rows]
    widths = [
        max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(result.columns)
    ]
    right = [bool(_NUMERIC.match(kind)) for kind in result.types]

    def line(values: Iterable[str]) -> str:
        return "  ".join(
            value.rjust(width) if align else value.ljust(width)
            for value, width, align in zip(values, widths, right, strict=True)
        ).rstrip()

    lines = [line(result.columns), line("-" * width for width in widths)]
    lines.extend(line(row) for row in cells)
    count = len(result.rows)
    if result.truncated:
        lines.append(f"(first {count} rows; --limit N shows more, --limit 0 all)")
    else:
        lines.append(f"({count} row{'' if count == 1 else 's'})")
    return "\n".join(lines)


def json_lines(result: QueryResult) -> Iterator[str]:
    """One JSON object per row, keys in column order; raises QueryFailed when two columns
    share a name (one would hide the other)."""
    seen: set[str] = set()
    for name in result.columns:
        if name in seen:
            raise QueryFailed(
                f"the result has more than one column named {name!r}: name them apart with AS"
            )
        seen.add(name)
    for row in result.rows:
        yield json.dumps(
            {name: _json_value(value) for name, value in zip(result.columns, row, strict=True)},
            ensure_ascii=False,
        )


def _cell(value: object, max_cell: int) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, datetime):
        return _utc_text(value, sep=" ")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        text = value
    elif isinstance(value, bytes):
        text = value.decode("utf-8", "backslashreplace")
    elif isinstance(value, (list, dict, tuple)):
        text = json.dumps(_json_value(value), ensure_ascii=False)
    else:  # int, bool, Decimal, date, timedelta
        return str(value)
    # Text is cut (numbers and times never are) ...
    if max_cell and len(text) > max_cell:
        text = text[: max_cell - 1] + "…"
    if not text.isprintable():
        # ... and kept to one line where nothing a reader sent can steer the terminal (an ESC
        # sequence in a topic): what is not printable is shown as its escape.
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return text


def _json_value(value: object) -> object:
    """A JSON value for what Arrow hands back: times as ISO 8601 in UTC ('Z'), dates as
    YYYY-MM-DD, binary as base64, decimals as numbers, intervals as seconds, maps as objects
    (as lists of [key, value] when a key is not a string), non-finite floats as strings."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime):
        return _utc_text(value, sep="T")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(_is_pair(item) for item in value):
        # pyarrow hands a map back as a list of (key, value) tuples.
        if all(isinstance(k, str) for k, _ in value):
            return {k: _json_value(v) for k, v in value}
        return [[_json_value(k), _json_value(v)] for k, v in value]
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    return str(value)


def _is_pair(item: object) -> bool:
    return isinstance(item, tuple) and len(item) == 2


def _utc_text(value: datetime, sep: str) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(sep=sep) + "Z"
