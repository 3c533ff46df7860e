"""spark.sql's pure parts: which directories become views, how a result prints as text and as
JSON Lines, what is kept of Spark's error text. The command itself runs end to end in
tests/actors/app/test_sql_command.py."""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from spark.sql import (
    TABLES,
    CannotQuery,
    QueryFailed,
    QueryResult,
    check_tables_dir,
    describe_error,
    format_table,
    json_lines,
    table_names,
)


def result(columns, types, rows, truncated=False) -> QueryResult:
    return QueryResult(tuple(columns), tuple(types), tuple(tuple(r) for r in rows), truncated)


def test_the_gateways_tables_come_first_then_every_other_table_directory(tmp_path):
    for name in ("reads", "zz_archive", "audit_copy", "_compaction", ".trash", "9lives"):
        (tmp_path / name).mkdir()
    (tmp_path / "notes").write_text("a file, not a table")
    assert table_names(tmp_path) == [*TABLES, "audit_copy", "zz_archive"]


def test_a_remote_tables_directory_is_left_to_spark_and_lists_only_the_gateways_tables():
    check_tables_dir("hdfs://namenode:8020/fxgate/tables")
    assert table_names("hdfs://namenode:8020/fxgate/tables") == list(TABLES)


def test_a_tables_path_that_is_a_file_cannot_be_queried(tmp_path):
    (tmp_path / "tables").write_text("")
    with pytest.raises(CannotQuery, match="is not a directory"):
        check_tables_dir(tmp_path / "tables")


def test_the_text_table_aligns_numbers_right_and_text_left_and_counts_its_rows():
    text = format_table(
        result(
            ["reader_id", "antenna", "reads"],
            ["string", "int", "bigint"],
            [("fx9600-01", 1, 12), ("fx9600-02", None, 3)],
        )
    )
    assert text.splitlines() == [
        "reader_id  antenna  reads",
        "---------  -------  -----",
        "fx9600-01        1     12",
        "fx9600-02     NULL      3",
        "(2 rows)",
    ]


def test_cells_show_times_in_utc_and_cut_long_text_and_escape_control_characters():
    when = datetime(2026, 11, 21, 10, 0, 5, 250000, tzinfo=UTC)
    text = format_table(
        result(
            ["when", "topic", "payload", "access_results"],
            ["timestamp", "string", "binary", "array<string>"],
            [(when, "a/\x1b[2Jb\n" + "x" * 100, b"\xffok", ["bbbb", "SUCCESS"])],
        ),
        max_cell=20,
    )
    row = text.splitlines()[2]
    assert row.startswith("2026-11-21 10:00:05.250000Z  ")
    assert "  a/\\x1b[2Jb\\nxxxxxxxxxxx…  " in row  # cut to 20 characters, then escaped
    assert "\\xffok" in row and '["bbbb", "SUCCESS"]' in row
    assert text.splitlines()[-1] == "(1 row)"


def test_a_cut_result_says_how_to_see_more():
    text = format_table(result(["n"], ["int"], [(1,)], truncated=True))
    assert text.splitlines()[-1] == "(first 1 rows; --limit N shows more, --limit 0 all)"


def test_json_lines_give_one_object_per_row_with_values_a_program_can_take():
    when = datetime(2026, 11, 21, 10, 0, 5, tzinfo=UTC)
    rows = [
        (
            when,
            date(2026, 11, 21),
            b"\x00\xff",
            Decimal("12"),
            Decimal("1.5"),
            float("nan"),
            float("-inf"),
            timedelta(seconds=90),
            [("a", 1), ("b", None)],
            [{"x": 1, "when": when}],
            "é",
        )
    ]
    columns = list("abcdefghijk")
    (line,) = json_lines(result(columns, ["?"] * len(columns), rows))
    assert list(json.loads(line).items()) == [
        ("a", "2026-11-21T10:00:05Z"),
        ("b", "2026-11-21"),
        ("c", base64.b64encode(b"\x00\xff").decode()),
        ("d", 12),
        ("e", 1.5),
        ("f", "NaN"),
        ("g", "-Infinity"),
        ("h", 90.0),
        ("i", {"a": 1, "b": None}),
        ("j", [{"x": 1, "when": "2026-11-21T10:00:05Z"}]),
        ("k", "é"),
    ]


def test_json_lines_refuse_two_columns_of_one_name():
    with pytest.raises(QueryFailed, match="more than one column named 'epc'"):
        list(json_lines(result(["epc", "epc"], ["string", "string"], [("a", "b")])))


def test_an_error_keeps_sparks_message_and_sql_excerpt_but_not_the_plan_or_the_stack():
    error = RuntimeError(
        "[DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012\n"
        "== SQL (line 1, position 8) ==\n"
        "SELECT 1/0\n"
        "       ^^^\n"
        "\n"
        "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.divideByZeroError(x.scala:1)\n"
    )
    assert describe_error(error) == (
        "[DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012\n"
        "== SQL (line 1, position 8) ==\n"
        "SELECT 1/0\n"
        "       ^^^"
    )
    analysis = RuntimeError(
        "[TABLE_OR_VIEW_NOT_FOUND] The table `nope` cannot be found. SQLSTATE: 42P01;\n"
        "'Project [*]\n"
        "+- 'UnresolvedRelation [nope], [], false\n"
    )
    assert describe_error(analysis) == (
        "[TABLE_OR_VIEW_NOT_FOUND] The table `nope` cannot be found. SQLSTATE: 42P01;"
    )
