import sqlite3
from pathlib import Path

from click.testing import CliRunner

from actors.app.cli import main
from actors.app.status import collect_status, format_status
from actors.clock import SimulatedClock
from actors.config.schema import load_config
from actors.ledger import InboundLedger
from actors.messages import Forwarded, Inbound
from tests.actors.test_ledger import RecordingAcks, publish

V1_SCHEMA = Path(__file__).parents[2] / "persistence" / "data" / "ledger_v1.sql"


def running_report(now: float) -> dict:
    return {
        "now": now,
        "table_lag_seconds": 12.5,
        "data_dir": "/var/lib/fxgate",
        "daemon": {
            "running": True,
            "pid": 4242,
            "wall_time": now - 3,
            "source": {
                "state": "waiting",
                "client_id": "fxgate-site1-gw1",
                "connects": 3,
                "disconnects": 3,
                "last_reason": "connection lost",
            },
            "ledger": {
                "paused_by": ["disk budget"],
                "budget": {
                    "paused": True,
                    "describe": "[ledger] max_bytes = 4.00 GiB: 4.01 GiB used; "
                    "min_free_bytes = 1.00 GiB: 20.00 GiB free",
                },
            },
            "intake": {"waiting_messages": 17},
            "lifecycle": [
                {
                    "name": "source",
                    "client_id": "fxgate-site1-gw1",
                    "state": "disconnected",
                    "sequence_number": 3,
                    "last_reason": "ConnectionLost",
                }
            ],
        },
        "ledger": {
            "exists": True,
            "pending_messages": 2000,
            "awaiting_pubrel": 4,
            "batches_open": 1,
            "last_pack_id": 77,
            "last_batch": {"batch_id": 9, "rows": 20000, "dead_letters": 2},
        },
        "tables": {"reads": 180000, "dead_letters": 2},
    }


def test_status_names_each_connection_depth_pause_and_the_table_lag_for_a_person():
    text = format_status(running_report(now=1_800_000_000.0))
    assert "daemon:     running (pid 4242, status written 3 s ago)" in text
    assert "source:     waiting as fxgate-site1-gw1" in text
    assert "last reason: connection lost" in text
    assert "17 message(s) handed to the ledger" in text
    assert (
        "events:     source fxgate-site1-gw1: disconnected, sequence 3, last reason ConnectionLost"
        in text
    )
    assert "and not yet stored; source paused: disk budget" in text
    assert (
        "PAUSED:     the ledger is at its disk budget ([ledger] max_bytes = 4.00 GiB: 4.01 GiB "
        "used; min_free_bytes = 1.00 GiB: 20.00 GiB free)" in text
    )
    assert "2000 message(s) not yet in the table, 4 QoS 2 awaiting PUBREL" in text
    assert "1 batch(es) open, last pack 77" in text
    assert "table lag:  12.5 s, 2000 message(s)" in text
    assert "last batch: 9 (20000 rows, 2 dead letters)" in text


def test_a_shared_group_members_status_names_the_groups_table_and_this_members_share():
    report = running_report(now=1_800_000_000.0)
    report["group_tables"] = "fxgate-env-a"
    report["daemon"]["group"] = {
        "tables": "fxgate-env-a",
        "member": "fxgate-env-a-a1",
        "rows_landed": 9000,
        "already_landed": 12,
        "merges_retried": 3,
    }
    text = format_status(report)
    assert (
        "tables:     group fxgate-env-a's, shared by its members: reads 180000 rows, "
        "dead_letters 2 rows" in text
    )
    assert (
        "this member: fxgate-env-a-a1 landed 9000 row(s) since its start; 12 more of its reads "
        "were in the table already (another member landed them); 3 merge(s) lost a commit race "
        "and were merged again" in text
    )
    # A gateway alone says neither.
    alone = format_status(running_report(now=1_800_000_000.0))
    assert "group" not in alone and "this member" not in alone


def test_collect_status_measures_each_sinks_lag_from_its_oldest_stored_read(tmp_path):
    config = load_config(None, {"FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data")}, "gw")
    clock = SimulatedClock()
    ledger = InboundLedger.start(
        config.gateway.ledger_path,
        clock,
        group_commit_max_delay=0.0,
        forward_topic=lambda topic: True,
    )
    try:
        acks = RecordingAcks(config.gateway.ledger_path)
        ledger.tell(Inbound(publish(1, b"first"), acks))
        acks.wait_for(1)
        clock.advance(30.0)
        ledger.tell(Inbound(publish(2, b"second"), acks))
        acks.wait_for(2)
        # The first one is upstream already; both still wait for the table.
        ledger.tell(Forwarded((1,)))
        ledger.proxy().stats().get(timeout=5)
    finally:
        ledger.stop()
    report = collect_status(config, now=clock.wall() + 5.0)
    assert report["ledger"]["pending_messages"] == 2
    assert report["ledger"]["upstream_pending_messages"] == 1
    assert report["table_lag_seconds"] == 35.0
    assert report["upstream_lag_seconds"] == 5.0
    assert report["daemon"] == {"running": False}
    text = format_status(report)
    assert "table lag:  35.0 s, 2 message(s)" in text
    assert "upstream lag: 5.0 s, 1 message(s) not yet acknowledged upstream" in text
    assert report["ledger"]["used_bytes"] > 0
    assert "disk:       ledger uses " in text and "of its 4.00 GiB budget" in text


def test_status_says_when_the_ledger_cannot_write_spark_fails_or_a_file_was_found_corrupt():
    now = 1_800_000_000.0
    report = running_report(now)
    report["daemon"]["ledger"].update(
        storage_error="database or disk is full (SQLITE_FULL)",
        storage_failing_seconds=42.0,
        storage_backlog=137,
    )
    report["daemon"]["spark"] = {
        "failures": 4,
        "total_failures": 9,
        "last_error": "RuntimeError: Lost executor 0",
        "next_retry_time": now + 8.0,
    }
    report["corrupt_files"] = ["/var/lib/fxgate/outbound.sqlite.corrupt-20261121T101500Z"]
    text = format_status(report)
    assert (
        "STORAGE:    the ledger cannot write for 42 s (database or disk is full (SQLITE_FULL)): "
        "nothing is acknowledged, 137 message(s) wait in memory" in text
    )
    assert "SPARK:      4 failed attempt(s) in a row (9 in all)" in text
    assert "RuntimeError: Lost executor 0, next retry in 8 s" in text
    assert "CORRUPT:    /var/lib/fxgate/outbound.sqlite.corrupt-20261121T101500Z" in text
    calm = running_report(now)
    calm["daemon"]["ledger"] = {"paused_by": []}
    healthy = format_status(calm)
    assert "PAUSED:" not in healthy
    assert "STORAGE:" not in healthy and "SPARK:" not in healthy and "CORRUPT:" not in healthy


def test_collect_status_lists_database_files_moved_aside_as_corrupt(tmp_path):
    config = load_config(None, environ={"FXGATE__GATEWAY__DATA_DIR": str(tmp_path)})
    moved = tmp_path / "ledger.sqlite.corrupt-20261121T101500Z"
    moved.write_bytes(b"garbage")
    report = collect_status(config)
    assert report["corrupt_files"] == [str(moved)]


def test_status_reads_each_readers_health_from_the_ledger_and_names_a_silent_one(tmp_path):
    """What the daemon committed with its last batch, read without the daemon: ages against the
    `now` status is given, the reader's own counters, the per-gateway reconciliation."""
    from persistence.database import open_engine
    from persistence.ledger_store import LedgerStore
    from spark.reader_health import ReaderHealth

    config = load_config(
        None,
        {
            "FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data"),
            "FXGATE__GATEWAY__HEALTH_READER_SILENT_SECONDS": "60",
        },
        "gw",
    )
    now = 1_800_000_000.0
    quiet = ReaderHealth(last_heard_time=now - 61, last_heartbeat_time=now - 61, heartbeats=1)
    talking = ReaderHealth(
        last_heard_time=now - 1,
        last_heartbeat_time=now - 8,
        heartbeats=3,
        events={"gpi": 2},
        data_messages=1500,
        received=1500,
        sent=1500,
        retained=0,
        dropped=0,
        paths=1,
        intervals=2,
        unaccounted=0,
        last_interval_sent=750,
        last_interval_received=750,
    )
    path = config.gateway.ledger_path
    store = LedgerStore(open_engine(path), path)
    try:
        store.insert("k1", "zebra/fx/fx9600-01/reads", b"x", 1, now)
        batch = store.begin_batch([(1, [1])], now)
        health = {"fx9600-01": talking.state(), "fx9600-02": quiet.state()}
        store.commit_batch(batch, 1, 0, now, retention=3600, health=health)
        store.commit()
    finally:
        store.close()

    report = collect_status(config, now=now)
    one = report["readers"]["fx9600-01"]
    assert one["heartbeat_age_seconds"] == 8 and one["silent"] is False
    assert one["reported"] == {"received": 1500, "sent": 1500, "retained": 0, "dropped": 0}
    assert one["reconciliation"]["scope"] == "per-gateway"
    assert one["reconciliation"]["unaccounted"] == 0
    assert report["readers"]["fx9600-02"]["silent"] is True
    text = format_status(report)
    assert (
        "reader:     fx9600-01: last heartbeat 8 s ago (3 heartbeat(s), 2 gpi), 1500 data "
        "message(s) received; its counters: sent 1500, received 1500, retained 0, dropped 0; "
        "reconciliation (per gateway): 0 sent and not received here over 2 heartbeat "
        "interval(s), last 750 sent / 750 received"
    ) in text
    assert "SILENT:     fx9600-02 has sent nothing for 61 s (limit 60 s)" in text
    assert "SILENT:     fx9600-01" not in text


def test_status_on_a_ledger_of_an_older_schema_says_what_to_do_without_a_traceback(tmp_path):
    with sqlite3.connect(tmp_path / "ledger.sqlite") as db:
        db.executescript(V1_SCHEMA.read_text())
    result = CliRunner().invoke(main, ["status"], env={"FXGATE__GATEWAY__DATA_DIR": str(tmp_path)})
    assert result.exit_code == 1, result.output
    assert "schema version 1: start the daemon of this fxgate once" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


def test_status_in_production_mode_asks_for_no_password_variable_and_run_still_does(tmp_path):
    """The service user's shell has no secrets.env: status connects to no broker, so production
    mode does not ask it for the password variable (`run` does, before anything else)."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[gateway]\nmode = "production"\n'
        f'data_dir = "{tmp_path / "data"}"\n'
        '[source]\nenvironment_id = "plant-7"\ninstance_id = "gw-1"\n'
        'username = "fx"\npassword_env = "FXGATE_TEST_UNSET_PASSWORD"\n'
    )
    status = CliRunner().invoke(main, ["status", "--config", str(config)])
    assert status.exit_code == 0, status.output
    assert "FXGATE_TEST_UNSET_PASSWORD" not in status.output
    run = CliRunner().invoke(main, ["run", "--config", str(config)])
    assert run.exit_code == 2
    assert "FXGATE_TEST_UNSET_PASSWORD is not set" in run.output
