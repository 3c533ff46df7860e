"""The commands on tables on an object store (issue 35), against a real Azurite reached as Azure
is (the storage account variables in the environment, `tables_dir = "az://..."`): `status`
counts them, `dead-letters list` lists them, `compact` runs a pass there (no lock file, each
OPTIMIZE claimed), `report` reads them with delta-rs; `sql` and `audit`, which go through Spark,
say that fxgate's Spark does not reach the store and what to use instead. None starts a JVM."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pytest
from click.testing import CliRunner

from actors.app.cli import main
from spark.tables import READS, ArrowTableWriter, application_id, read_table_arrow
from tests.actors.app.test_dead_letters import write_dead_letters
from tests.spark.test_group_tables import reads

APP = application_id("object-store-commands")


@pytest.fixture
def tables(azurite) -> str:
    return azurite.create_container("fxgate") + "/env-a"


def run(tmp_path, tables: str, *args: str):
    env = {"FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data"), "FXGATE__SPARK__TABLES_DIR": tables}
    return CliRunner().invoke(main, list(args), env=env)


def land_small_batches(tables: str, batches: int = 4) -> None:
    writer = ArrowTableWriter(None, tables, APP)
    for batch in range(1, batches + 1):
        writer.write_batch(batch, {READS: reads(range(10 * batch, 10 * batch + 10))})


def test_status_counts_the_tables_on_the_store_and_says_so_when_it_is_down(
    azurite, tables, tmp_path
):
    land_small_batches(tables)
    shown = run(tmp_path, tables, "status", "--json")
    assert shown.exit_code == 0, shown.output
    counted = json.loads(shown.output)["tables"]
    assert counted["reads"] == 40
    azurite.stop()
    down = run(tmp_path, tables, "status", "--json")
    assert down.exit_code == 0, down.output
    unreachable = json.loads(down.output)["tables"]
    assert unreachable["reads"] is None
    assert tables in unreachable["unreadable"]


def test_dead_letters_are_listed_from_the_store_and_replayed_through_the_daemon(tables, tmp_path):
    from persistence.replay import pending_requests, read_request

    dead = write_dead_letters(tables, 1, [b"not json", b"{}"])
    listed = run(tmp_path, tables, "dead-letters", "list", "--json")
    assert listed.exit_code == 0, listed.output
    shown = json.loads(listed.output)
    assert Counter(shown["by_reason"]) == Counter(dead.column("reason").to_pylist())
    replayed = run(tmp_path, tables, "dead-letters", "replay", "--all")
    assert replayed.exit_code == 0, replayed.output
    (path,) = pending_requests(tmp_path / "data")
    _, messages = read_request(path)
    assert sorted(m.payload for m in messages) == sorted(dead.column("payload").to_pylist())


def test_compact_runs_a_claimed_pass_on_the_store_and_every_read_stays_once(tables, tmp_path):
    land_small_batches(tables)
    done = run(tmp_path, tables, "compact", "--no-progress")
    assert done.exit_code == 0, done.output
    assert "reads: 4 file(s) into 1" in done.output
    ids = read_table_arrow(tables, READS).column("message_id").to_pylist()
    assert sorted(ids) == sorted(reads(range(10, 50)).column("message_id").to_pylist())
    # Claimed, not locked: the table says which pass claimed it last.
    from deltalake import DeltaTable

    from spark.tables import MAINTAINED_BY, table_path

    claim = DeltaTable(table_path(tables, READS)).metadata().configuration[MAINTAINED_BY]
    assert claim.endswith("(fxgate compact)")


def test_report_reads_the_store_with_delta_rs_and_names_a_read_landed_twice(tables, tmp_path):
    from persistence.keys import read_id

    keys = [f"key-{i}" for i in range(3)]
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"topic": "zebra/fx/fx9600-01/reads", "message_key": k, "reads": 1}) + "\n"
            for k in keys
        )
    )
    ids = [read_id(k, 0) for k in keys]
    table = pa.table(
        {"message_id": ids, "reader_id": ["fx9600-01"] * 3, "date": ["2026-11-29"] * 3}
    )
    writer = ArrowTableWriter(None, tables, APP)
    writer.write_batch(1, {READS: table})
    reported = run(tmp_path, tables, "report", "--manifest", str(manifest), "--no-progress")
    assert reported.exit_code == 0, reported.output
    assert "reads table on Azure, read back with delta-rs:" in reported.output
    assert "EXACT: every published read landed once" in reported.output
    # Another gateway's append of one of them: the report sees it on the store.
    ArrowTableWriter(None, tables, application_id("another")).write_batch(1, {READS: table[:1]})
    twice = run(tmp_path, tables, "report", "--manifest", str(manifest), "--no-progress")
    assert twice.exit_code == 1, twice.output
    assert "MISMATCH" in twice.output


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (("sql", "SELECT count(*) FROM reads"), "query them with DuckDB or Polars"),
        (("audit",), "the audit reads through Spark"),
    ],
)
def test_the_commands_that_go_through_spark_say_it_does_not_reach_the_store(
    tables, tmp_path, command, says
):
    refused = run(tmp_path, tables, *command)
    assert refused.exit_code == 2, refused.output
    assert says in refused.output
    assert "Azure" in refused.output
