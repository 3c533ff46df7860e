"""The commands on tables on an object store (issue 35), each on Azure and on S3: a real Azurite
reached as Azure is (the storage account variables in the environment, `tables_dir =
"az://..."`) and a real SeaweedFS S3 gateway reached as S3 is (the AWS variables, `s3://...`):
`status`
counts them, `dead-letters list` lists them, `compact` runs a pass there (no lock file, each
OPTIMIZE claimed), `report` reads them with delta-rs, all with no JVM; `sql` and `audit` run
through Spark as anywhere, the tables read by delta-rs and handed to Spark
(spark/delta_rs_source.py)."""

from __future__ import annotations

import json
import subprocess
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
def store(object_store_process):
    return object_store_process


@pytest.fixture
def tables(store) -> str:
    return store.create_root("fxgate") + "/env-a"


def run(tmp_path, tables: str, *args: str):
    env = {"FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data"), "FXGATE__SPARK__TABLES_DIR": tables}
    return CliRunner().invoke(main, list(args), env=env)


def land_small_batches(tables: str, batches: int = 4) -> None:
    writer = ArrowTableWriter(None, tables, APP)
    for batch in range(1, batches + 1):
        writer.write_batch(batch, {READS: reads(range(10 * batch, 10 * batch + 10))})


def test_status_counts_the_tables_on_the_store_and_says_so_when_it_is_down(store, tables, tmp_path):
    land_small_batches(tables)
    shown = run(tmp_path, tables, "status", "--json")
    assert shown.exit_code == 0, shown.output
    counted = json.loads(shown.output)["tables"]
    assert counted["reads"] == 40
    store.stop()
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
    place = "Azure" if tables.startswith("az://") else "S3"
    assert f"reads table on {place}, read back with delta-rs:" in reported.output
    assert "EXACT: every published read landed once" in reported.output
    # Another gateway's append of one of them: the report sees it on the store.
    ArrowTableWriter(None, tables, application_id("another")).write_batch(1, {READS: table[:1]})
    twice = run(tmp_path, tables, "report", "--manifest", str(manifest), "--no-progress")
    assert twice.exit_code == 1, twice.output
    assert "MISMATCH" in twice.output


def run_process(tmp_path, tables: str, *args: str) -> subprocess.CompletedProcess:
    """The command as its own process, as on a gateway: `sql` and `audit` start a Spark session
    there, whose JVM, and the Python workers that read the store for it, inherit the store's
    variables from the command's environment. (In this process, the command would take the
    suite's session, started before the test's Azurite, and stop it on its way out.)"""
    from tests.actors.app.test_sql_command import fxgate

    env = {"FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data"), "FXGATE__SPARK__TABLES_DIR": tables}
    return fxgate(*args, env=env)


@pytest.mark.spark
def test_sql_queries_the_stores_tables_through_delta_rs(tables, tmp_path):
    land_small_batches(tables)
    # A later batch brings a column the older files lack: they read it as null.
    later = reads(range(50, 60))
    later = later.append_column("note", pa.array(["new"] * later.num_rows))
    ArrowTableWriter(None, tables, APP).write_batch(5, {READS: later})
    counted = run_process(
        tmp_path,
        tables,
        "sql",
        "--json",
        "SELECT count(*) AS n, count(DISTINCT message_id) AS ids, count(note) AS notes, "
        "min(date) AS day FROM reads",
    )
    assert counted.returncode == 0, counted.stderr
    (row,) = [json.loads(line) for line in counted.stdout.splitlines() if line.startswith("{")]
    assert row == {"n": 50, "ids": 50, "notes": 10, "day": "2026-11-29"}


@pytest.mark.spark
def test_audit_finds_a_gap_in_the_stores_reads_table(tables, tmp_path):
    whole = reads(range(10, 50))
    numbers = whole.column("event_num").to_pylist()
    gap = [n for n in numbers if n not in (23, 24, 25)]
    writer = ArrowTableWriter(None, tables, APP)
    writer.write_batch(1, {READS: whole.filter(pa.array([n in gap for n in numbers]))})
    audited = run_process(tmp_path, tables, "audit", "--json", "--no-progress")
    assert audited.returncode == 1, audited.stderr
    report = json.loads(audited.stdout)
    assert report["complete"] is False
    assert report["readers"]["fx9600-01"]["missing"] == [[23, 25]], report
