"""`fxgate sql` end to end on a table landed by the real writer: the queries of the useful-queries
page (docs/pages/tables/queries.md, read from the page itself, so what it shows is what runs),
three of them checked row by row, as text and as `--json`, and the failures with their exit
statuses.

Most runs are in process, the command's session swapped for the suite's (a JVM per run would cost
5-8 s each); one success and one failure run the command as its own process with its own JVM,
which is reaped whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

import spark.session
import spark.sql
from actors.app.cli import main
from spark.maintenance import DeltaMaintainer
from spark.schema import build_batch
from spark.tables import DEAD_LETTERS, READS, ArrowTableWriter, application_id
from spark.writer_lock import WriterLock
from tests.spark.test_sanitise import Record
from tests.spark.test_zebra_reader_modes import NEW_COLUMNS

pytestmark = pytest.mark.spark

QUERIES_PAGE = Path(__file__).resolve().parents[3] / "docs" / "pages" / "tables" / "queries.md"
NOW = datetime.now(UTC)
# Minute boundaries well inside the last hour, whenever the module runs.
BASE = (NOW - timedelta(minutes=40)).replace(second=0, microsecond=0)
OLD = BASE - timedelta(hours=3)
# When the ledger stored the reads: after the last of them (`date` is the day of this, DESIGN
# §7.7), still inside the last hour.
RECEIVED = (BASE + timedelta(minutes=2)).timestamp()
APP_ID = application_id("sql-test")


def page_queries(group: bool = False) -> dict[str, list[str]]:
    """The Spark SQL blocks of the queries page (those marked `engines: spark`), by the heading
    they are under: those for any table, or (`group`) those for a shared group's table only
    (marked `group` too)."""
    found: dict[str, list[str]] = {}
    heading = ""
    for match in re.finditer(
        r"^### (?P<heading>[^\n]+)$|<!-- engines: (?P<engines>[^>]*) -->\n```sql\n(?P<sql>.*?)```",
        QUERIES_PAGE.read_text(),
        re.MULTILINE | re.DOTALL,
    ):
        if match.group("heading"):
            heading = match.group("heading").strip()
        elif "spark" in match.group("engines") and group == ("group" in match.group("engines")):
            found.setdefault(heading, []).append(match.group("sql").strip())
    return found


def shown_queries() -> list[str]:
    """The three queries the tests below check row by row, as the page shows them."""
    queries = page_queries()
    return [
        queries["Reads per reader and antenna per minute"][0],
        queries["Tags seen in the last hour, first and last sighting"][0],
        queries["Dead letters by reason"][0],
    ]


def stamp(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def tag(epc: str, antenna: int, when: datetime, num: int, reads: int | None, mode="INVENTORY"):
    data = {"idHex": epc, "antenna": antenna, "eventNum": num, "format": "epc"}
    if reads is not None:
        data["reads"] = reads
    return {"data": data, "timestamp": stamp(when), "type": mode}


def message(topic_reader: str, doc, key: str, seq: int, received: float = RECEIVED) -> Record:
    topic = f"zebra/fx/{topic_reader}/reads"
    return Record(key, topic, json.dumps(doc).encode(), received_time=received, seq=seq)


def second(n: int) -> datetime:
    return BASE + timedelta(seconds=n)


@pytest.fixture(scope="module")
def data_dir(spark_session, tmp_path_factory) -> Path:
    """Two batches landed by the daemon's writer (Delta commits): one of the schema before the tag
    event's other fields, then reads of two readers over two minutes, dead letters of three
    reasons."""
    data = tmp_path_factory.mktemp("sql-data")
    writer = ArrowTableWriter(None, data / "tables", APP_ID)
    old = build_batch(
        [message("fx9600-02", tag("D4", 3, OLD, 1, None), "old", 0, OLD.timestamp() + 1)],
        batch_id=1,
    )
    writer.write_batch(1, {READS: old.reads.drop_columns(list(NEW_COLUMNS))})
    records = [
        message("fx9600-01", tag("A1", 1, second(5), 10, 4), "m1", 1),
        message("fx9600-01", tag("B2", 1, second(40), 11, 2), "m2", 2),
        message("fx9600-01", tag("A1", 2, second(20), 12, None, "SIMPLE"), "m3", 3),
        message("fx9600-01", tag("A1", 1, second(70), 13, 1), "m4", 4),
        message(
            "fx9600-02",
            [tag("C3", 1, second(90), 14, 3), tag("A1", 1, second(91), 15, 3)],
            "m5",
            5,
        ),
        Record("d1", "zebra/fx/fx9600-01/reads", b"not json", received_time=RECEIVED, seq=6),
        Record("d2", "zebra/fx/fx9600-02/reads", b"{also not", received_time=RECEIVED, seq=7),
        message("fx9600-01", tag("XYZ", 1, second(1), 16, 1), "d3", 8),  # bad_epc
        message("fx9600-01", {"data": {"idHex": "ab"}}, "d4", 9),  # no timestamp
    ]
    batch = build_batch(records, batch_id=2)
    assert batch.reads.num_rows == 6 and batch.dead_letters.num_rows == 4
    writer.write_batch(2, {READS: batch.reads, DEAD_LETTERS: batch.dead_letters})
    return data


@pytest.fixture(scope="module")
def config_file(data_dir) -> Path:
    path = data_dir / "gateway.toml"
    path.write_text(f'[gateway]\ndata_dir = "{data_dir}"\n')
    return path


@pytest.fixture
def in_process(spark_session, monkeypatch):
    """Run the command in this process on the suite's session (never stopped here), dropping
    the views it registered afterwards."""
    monkeypatch.setattr(spark.session, "build_session", lambda *_a, **_k: spark_session)
    monkeypatch.setattr(spark.session, "stop_session", lambda _session: None)

    def run(*args: str):
        return CliRunner().invoke(main, ["sql", *args])

    yield run
    for table in spark_session.catalog.listTables():
        if table.isTemporary:
            spark_session.catalog.dropTempView(table.name)


def utc(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


PER_MINUTE = [
    {"reader_id": "fx9600-02", "antenna": 3, "minute": OLD, "events": 1, "reads": 1},
    {"reader_id": "fx9600-01", "antenna": 1, "minute": BASE, "events": 2, "reads": 6},
    {"reader_id": "fx9600-01", "antenna": 2, "minute": BASE, "events": 1, "reads": 1},
    {"reader_id": "fx9600-01", "antenna": 1, "minute": second(60), "events": 1, "reads": 1},
    {"reader_id": "fx9600-02", "antenna": 1, "minute": second(60), "events": 2, "reads": 6},
]
# d4, three hours old, is not among them.
LAST_HOUR = [
    ("a1", 4, second(5), second(91), ["fx9600-01", "fx9600-02"]),
    ("c3", 1, second(90), second(90), ["fx9600-02"]),
    ("b2", 1, second(40), second(40), ["fx9600-01"]),
]
BY_REASON = [("invalid_json", 2), ("bad_epc", 1), ("missing_field", 1)]


def json_rows(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines()]


def test_the_page_shows_the_three_queries_and_more():
    assert len(shown_queries()) == 3
    assert sum(len(blocks) for blocks in page_queries().values()) >= 10


def test_every_spark_query_of_the_page_runs(in_process, config_file, data_dir):
    for heading, blocks in page_queries().items():
        for query in blocks:
            # A query of the Delta log names the tables directory of the page's example.
            query = query.replace("/var/lib/fxgate/tables", str(data_dir / "tables"))
            result = in_process("--config", str(config_file), query)
            assert result.exit_code == 0, f"{heading}:\n{query}\n{result.output}"


def test_the_group_query_counts_each_members_share_of_a_groups_one_table(in_process, tmp_path):
    """A shared group's members land into one table, each row with the member that landed it
    (DESIGN §7.12); a read both members received is one row, of the member that landed first."""
    from spark.tables import GroupTableWriter

    tables = tmp_path / "group-tables"
    # m3 is the same message (topic and payload) in both members' batches: the broker gave it
    # to both.
    both = message("fx9600-01", tag("A1", 1, second(3), 3, 1), "m3", 3)
    for batch_id, (member, records) in enumerate(
        (
            (
                "fxgate-env-a-a1",
                [
                    message("fx9600-01", tag("A1", 1, second(1), 1, 1), "m1", 1),
                    message("fx9600-01", tag("B2", 1, second(2), 2, 1), "m2", 2),
                    both,
                ],
            ),
            (
                "fxgate-env-a-a2",
                [both, message("fx9600-01", tag("C3", 1, second(4), 4, 1), "m4", 4)],
            ),
        ),
        start=1,
    ):
        reads = build_batch(records, batch_id).reads
        GroupTableWriter(
            None, tables, f"{APP_ID}-{batch_id}", group="fxgate-env-a", member=member
        ).write_batch(batch_id, {READS: reads})
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[gateway]\ndata_dir = "{tmp_path}"\n[spark]\ntables_dir = "{tables}"\n'
        '[source]\nshared_subscription_group = "fxgate"\nenvironment_id = "env-a"\n'
    )
    (((_, blocks),)) = page_queries(group=True).items()
    (query,) = blocks
    result = in_process("--config", str(config), "--json", query)
    assert result.exit_code == 0, result.output
    assert json_rows(result.stdout) == [
        {"landed_by": "fxgate-env-a-a1", "reads": 3},
        {"landed_by": "fxgate-env-a-a2", "reads": 1},
    ]


def test_reads_per_reader_and_antenna_per_minute_as_json(in_process, config_file):
    per_minute = shown_queries()[0]
    result = in_process("--config", str(config_file), "--json", per_minute)
    assert result.exit_code == 0, result.output
    assert json_rows(result.stdout) == [{**row, "minute": utc(row["minute"])} for row in PER_MINUTE]


def test_tags_seen_in_the_last_hour_with_first_and_last_seen_as_json(in_process, config_file):
    last_hour = shown_queries()[1]
    result = in_process("--config", str(config_file), "--json", last_hour)
    assert result.exit_code == 0, result.output
    assert json_rows(result.stdout) == [
        {
            "epc": epc,
            "events": events,
            "first_seen": utc(first),
            "last_seen": utc(last),
            "readers": readers,
        }
        for epc, events, first, last, readers in LAST_HOUR
    ]


def test_dead_letters_by_reason_as_json(in_process, config_file):
    by_reason = shown_queries()[2]
    result = in_process("--config", str(config_file), "--json", by_reason)
    assert result.exit_code == 0, result.output
    rows = json_rows(result.stdout)
    assert [(r["reason"], r["letters"]) for r in rows] == BY_REASON
    assert {r["sink"] for r in rows} == {"table"}
    assert all(r["first_received"].endswith("Z") for r in rows)


def test_each_shown_query_prints_a_readable_table_with_its_row_count(in_process, config_file):
    expected = [
        (["reader_id", "antenna", "minute", "events", "reads"], len(PER_MINUTE)),
        (["epc", "events", "first_seen", "last_seen", "readers"], len(LAST_HOUR)),
        (["reason", "sink", "letters", "first_received", "last_received"], len(BY_REASON)),
    ]
    for query, (columns, count) in zip(shown_queries(), expected, strict=True):
        result = in_process("--config", str(config_file), query)
        assert result.exit_code == 0, result.output
        header, rule, *rows, footer = result.stdout.splitlines()
        assert header.split() == columns
        assert set(rule.replace(" ", "")) == {"-"}
        assert len(rows) == count and footer == f"({count} rows)"
    # The first row of the per-minute table: its minute in UTC, numbers right-aligned.
    result = in_process("--config", str(config_file), shown_queries()[0])
    first = result.stdout.splitlines()[2]
    assert first.split() == [
        "fx9600-02",
        "3",
        *OLD.strftime("%Y-%m-%d %H:%M:%SZ").split(),
        "1",
        "1",
    ]


def test_the_new_columns_and_the_nulls_of_rows_landed_before_them_are_queryable(
    in_process, config_file
):
    result = in_process(
        "--config",
        str(config_file),
        "--json",
        "SELECT epc, reader_mode, format, read_count FROM reads WHERE antenna = 3 OR epc = 'b2' "
        "ORDER BY epc",
    )
    assert result.exit_code == 0, result.output
    assert json_rows(result.stdout) == [
        {"epc": "b2", "reader_mode": "INVENTORY", "format": "epc", "read_count": 2},
        {"epc": "d4", "reader_mode": None, "format": None, "read_count": None},
    ]


def test_a_table_with_nothing_landed_is_an_empty_view_with_its_columns(in_process, config_file):
    result = in_process(
        "--config",
        str(config_file),
        "SELECT count(*) AS n, max(heartbeat.event_time) AS last FROM reader_events heartbeat "
        "WHERE type = 'heartbeat'",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2].split() == ["0", "NULL"]


def test_another_table_directory_is_a_view_too(in_process, config_file, spark_session, data_dir):
    other = build_batch([message("fx9600-09", tag("EE", 1, second(0), 1, 1), "x", 0)], 3)
    ArrowTableWriter(None, data_dir / "tables", APP_ID).write_batch(3, {"archive": other.reads})
    result = in_process("--config", str(config_file), "--json", "SELECT epc FROM archive")
    assert result.exit_code == 0, result.output
    assert json_rows(result.stdout) == [{"epc": "ee"}]


def test_a_directory_that_is_no_table_is_left_out_with_a_note_and_queries_still_run(
    in_process, config_file, data_dir
):
    stray = data_dir / "tables" / "exports"
    stray.mkdir()
    (stray / "notes.parquet").write_text("not parquet at all")
    try:
        result = in_process(
            "--config", str(config_file), "--json", "SELECT count(*) AS n FROM reads"
        )
    finally:
        (stray / "notes.parquet").unlink()
        stray.rmdir()
    assert result.exit_code == 0, result.output
    assert json_rows(result.stdout) == [{"n": 7}]
    assert result.stderr.startswith("fxgate sql: exports is no table, left out: ")


def test_a_limit_cuts_the_result_and_says_so(in_process, config_file):
    query = "SELECT epc FROM reads ORDER BY event_time"
    text = in_process("--config", str(config_file), "--limit", "2", query)
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines()[2:] == [
        "d4",
        "a1",
        "(first 2 rows; --limit N shows more, --limit 0 all)",
    ]
    as_json = in_process("--config", str(config_file), "--json", "--limit", "2", query)
    assert as_json.exit_code == 0
    assert json_rows(as_json.stdout) == [{"epc": "d4"}, {"epc": "a1"}]
    assert as_json.stderr == "fxgate sql: only the first 2 rows; --limit 0 for all\n"


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("SELEC epc FROM reads", "[PARSE_SYNTAX_ERROR]"),
        ("SELECT * FROM no_such_table", "[TABLE_OR_VIEW_NOT_FOUND]"),
        ("SELECT no_such_column FROM reads", "[UNRESOLVED_COLUMN"),
        ("SELECT count(*) / 0 FROM reads", "[DIVIDE_BY_ZERO]"),
    ],
)
def test_a_query_spark_refuses_or_fails_exits_1_with_sparks_reason_and_no_stack(
    in_process, config_file, query, said
):
    result = in_process("--config", str(config_file), query)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"fxgate sql: query failed: {said}")
    assert "\tat " not in result.stderr and "Py4J" not in result.stderr


@pytest.mark.parametrize(
    "statement",
    [
        "VALUES (1, 'a')",
        "TABLE dead_letters",
        "WITH r AS (SELECT * FROM reads) SELECT count(*) AS n FROM r",
        "/* the reads */\nFROM reads SELECT epc",
        "SHOW TABLES",
        "SHOW COLUMNS IN reads",
        "DESCRIBE reads",
        "DESCRIBE reads epc",
        "EXPLAIN SELECT * FROM reads",
    ],
)
def test_queries_and_show_describe_explain_run(in_process, config_file, statement):
    result = in_process("--config", str(config_file), statement)
    assert result.exit_code == 0, result.stderr
    assert re.search(r"\(\d+ rows?\)", result.stdout), result.stdout


def files_under(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize(
    ("statement", "kind"),
    [
        ("INSERT OVERWRITE DIRECTORY '{out}' USING parquet SELECT * FROM reads", "InsertIntoDir"),
        ("FROM reads INSERT OVERWRITE DIRECTORY '{out}' USING parquet SELECT *", "InsertIntoDir"),
        ("INSERT INTO reads SELECT * FROM reads", "InsertIntoStatement"),
        ("CREATE TABLE t USING parquet LOCATION '{out}' AS SELECT 1 AS x", "CreateTableAsSelect"),
        ("DROP VIEW reads", "DropView"),
        ("CACHE TABLE reads", "CacheTable"),
        ("SET spark.sql.shuffle.partitions = 3", "SetCommand"),
        ("EXPLAIN SELECT 1; INSERT OVERWRITE DIRECTORY '{out}' SELECT 1", None),
    ],
)
def test_a_statement_that_could_write_is_refused_before_it_runs(
    in_process, config_file, data_dir, spark_session, tmp_path, statement, kind
):
    out = tmp_path / "out"
    before = files_under(data_dir / "tables")
    partitions = spark_session.conf.get("spark.sql.shuffle.partitions")
    result = in_process("--config", str(config_file), statement.format(out=out))
    assert result.exit_code == 1
    assert result.stdout == ""
    if kind is None:  # two statements: Spark's parser refuses them, and nothing runs either
        assert result.stderr.startswith("fxgate sql: query failed: [PARSE_SYNTAX_ERROR]")
    else:
        assert result.stderr.startswith(f"fxgate sql: refused: {kind} is not a query")
    assert not out.exists()
    assert files_under(data_dir / "tables") == before
    assert spark_session.conf.get("spark.sql.shuffle.partitions") == partitions
    assert not spark_session.catalog.isCached("reads")
    assert "t" not in {table.name for table in spark_session.catalog.listTables()}


def test_json_refuses_a_result_with_two_columns_of_one_name(in_process, config_file):
    result = in_process("--config", str(config_file), "--json", "SELECT epc, epc FROM reads")
    assert result.exit_code == 1
    assert "more than one column named 'epc'" in result.stderr


def test_the_query_takes_no_lock_and_runs_while_the_daemon_holds_the_tables(
    in_process, config_file, data_dir
):
    with WriterLock(data_dir / "tables", "daemon"):
        result = in_process(
            "--config", str(config_file), "--json", "SELECT count(*) AS n FROM reads"
        )
    assert result.exit_code == 0, result.output
    assert json_rows(result.stdout) == [{"n": 7}]


class KilledBeforeCommit(Exception):
    pass


def kill_before_commit(point):
    raise KilledBeforeCommit(point)


def test_the_query_reads_a_snapshot_not_the_files_of_a_killed_write_or_a_compaction(
    in_process, tmp_path
):
    """The tables directory holds the files of a write killed before its commit and, after an
    OPTIMIZE, the files it replaced (VACUUM keeps them for a day): a reader of the directory
    would count rows two or three times, a reader of the snapshot once."""
    tables = tmp_path / "tables"
    writer = ArrowTableWriter(None, tables, APP_ID)
    for batch_id, keys in ((1, ["a", "b"]), (2, ["c"])):
        records = [
            message("fx9600-01", tag(f"{n:02X}", 1, second(n), n, 1), key, n)
            for n, key in enumerate(keys, start=10 * batch_id)
        ]
        writer.write_batch(batch_id, {READS: build_batch(records, batch_id).reads})
    killed = ArrowTableWriter(None, tables, APP_ID, checkpoint=kill_before_commit)
    lost = build_batch([message("fx9600-01", tag("99", 1, second(9), 99, 1), "d", 99)], 3)
    with pytest.raises(KilledBeforeCommit):
        killed.write_batch(3, {READS: lost.reads})
    (maintained,) = DeltaMaintainer(tables).run(NOW.timestamp()).tables
    assert (maintained.files_removed, maintained.files_added) == (2, 1)
    assert len(list((tables / READS).glob("date=*/*.parquet"))) == 4
    config = tmp_path / "gateway.toml"
    config.write_text(f'[gateway]\ndata_dir = "{tmp_path}"\n[spark]\ntables_dir = "{tables}"\n')

    result = in_process(
        "--config",
        str(config),
        "--json",
        "SELECT count(*) AS n, count(DISTINCT message_id) AS ids, max(batch_id) AS batch "
        "FROM reads",
    )
    assert result.exit_code == 0, result.output
    assert json_rows(result.stdout) == [{"n": 3, "ids": 3, "batch": 2}]


def test_a_missing_tables_directory_exits_2_before_any_jvm_starts(tmp_path, monkeypatch):
    def no_jvm(*_args, **_kwargs):
        raise AssertionError("a JVM was started")

    monkeypatch.setattr(spark.session, "build_session", no_jvm)
    config = tmp_path / "gateway.toml"
    config.write_text(f'[gateway]\ndata_dir = "{tmp_path / "data"}"\n')
    result = CliRunner().invoke(main, ["sql", "--config", str(config), "SELECT 1"])
    assert result.exit_code == 2
    assert result.stderr == (
        f"fxgate sql: cannot query: tables directory {tmp_path / 'data' / 'tables'} "
        "does not exist\n"
    )


def test_a_spark_that_does_not_start_exits_2_with_the_cause(config_file, monkeypatch):
    def no_jvm(*_args, **_kwargs):
        raise RuntimeError("Java gateway process exited before sending its port number")

    monkeypatch.setattr(spark.session, "build_session", no_jvm)
    result = CliRunner().invoke(main, ["sql", "--config", str(config_file), "SELECT 1"])
    assert result.exit_code == 2
    assert result.stderr == (
        "fxgate sql: cannot query: Spark failed: RuntimeError: "
        "Java gateway process exited before sending its port number\n"
    )


def test_an_empty_query_is_a_usage_error(config_file):
    result = CliRunner().invoke(main, ["sql", "--config", str(config_file), "  "])
    assert result.exit_code == 2
    assert "the query is empty" in result.stderr


# -- as its own process ------------------------------------------------------------------------


def fxgate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m actors.app.cli ...` in its own process group (this environment, with `env`
    on top), killed with its JVM if it outlives the timeout or the test fails while it runs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "actors.app.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(QUERIES_PAGE.parents[3]), **(env or {})},
    )
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_command_as_its_own_process_prints_the_per_minute_table(config_file):
    result = fxgate("sql", "--config", str(config_file), shown_queries()[0])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["reader_id", "antenna", "minute", "events", "reads"]
    assert lines[-1] == f"({len(PER_MINUTE)} rows)"
    assert [line.split()[:2] for line in lines[2:-1]] == [
        [row["reader_id"], str(row["antenna"])] for row in PER_MINUTE
    ]


def test_the_command_as_its_own_process_exits_1_on_a_sql_error(config_file):
    result = fxgate("sql", "--config", str(config_file), "--json", "SELECT * FROM nowhere")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "fxgate sql: query failed: [TABLE_OR_VIEW_NOT_FOUND]" in result.stderr
    assert "\tat " not in result.stderr
