"""An upgrade keeps what is waiting (DESIGN §7.11): a gateway started on the data directory an older
fxgate left — ledger of schema version 1, outbound file without a recorded version, tables in the
`date=/batch_id=` Parquet layout before Delta, dated by the reader's clock — delivers each message
once, whatever state it was in, and its tables become Delta tables holding every row once, each
in its receive date (DESIGN §7.7)."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from datetime import UTC
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from actors.clock import RealClock
from actors.config.schema import load_config
from actors.mqtt.upstream import IDEMPOTENCY_PROPERTY
from actors.supervisor import Supervisor
from persistence.database import LEDGER_VERSION, OUTBOUND_VERSION
from persistence.keys import message_key, read_id
from persistence.outbound_store import SCHEMA as OUTBOUND_SCHEMA
from persistence.records import LedgerRecord
from spark.report import compare, landed_ids_arrow, landed_ids_spark
from spark.schema import build_batch
from spark.tables import DATE_OF, READS, RECEIVE_DATE, read_table_arrow
from tests.actors.test_outbound import PUBLISH_LINE, forwarding_environ
from tests.harness.checks import wait_until
from tests.harness.mqtt import Collector

pytestmark = [pytest.mark.broker, pytest.mark.spark]

V1_SCHEMA = Path(__file__).parents[1] / "persistence" / "data" / "ledger_v1.sql"
TOPIC = "zebra/fx/fx9600-01/reads"


def payload(n: int) -> bytes:
    return json.dumps(
        {
            "data": {"idHex": f"e28011606000020a1b2c3d{n:02x}", "antenna": 1, "eventNum": n},
            "timestamp": "2026-11-21T10:00:00.000+0000",
        }
    ).encode()


def key(n: int) -> str:
    return message_key(TOPIC, payload(n))


def previous_version_data_dir(data: Path, received: float) -> None:
    """What the older fxgate left: message 1 landed; 2 and 3 in a batch begun and not committed
    (that version forwarded a pack before landing it: they are upstream already); 4 in flight
    upstream (packet id 7, PUBLISH sent, no PUBACK); 5 stored at QoS 2, waiting for the source's
    PUBREL (packet id 9); 6 stored, not yet forwarded nor packed."""
    data.mkdir(parents=True, mode=0o700)
    with sqlite3.connect(data / "ledger.sqlite") as db:
        db.executescript(V1_SCHEMA.read_text())
        rows = [
            # seq, payload, qos, packet_id, pack_id, batch_id, landed_time
            (1, None, 1, None, 1, 1, received),
            (2, payload(2), 1, None, 2, 2, None),
            (3, payload(3), 1, None, 2, 2, None),
            (4, payload(4), 1, None, None, None, None),
            (5, payload(5), 2, 9, None, None, None),
            (6, payload(6), 1, None, None, None, None),
        ]
        db.executemany(
            "INSERT INTO inbound (seq, message_key, topic, payload, qos, packet_id, received_time,"
            " pack_id, batch_id, landed_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (seq, key(seq), TOPIC, body, qos, pid, received, pack, batch, landed)
                for seq, body, qos, pid, pack, batch, landed in rows
            ],
        )
        db.execute(
            "INSERT INTO batches VALUES (1, 'committed', ?, ?, 1, 1, 0)", (received, received)
        )
        db.execute("INSERT INTO batches VALUES (2, 'writing', ?, NULL, 2, NULL, NULL)", (received,))
        db.execute("INSERT INTO counters VALUES ('pack_id', 2)")
    with sqlite3.connect(data / "outbound.sqlite") as db:
        db.executescript(OUTBOUND_SCHEMA)
        db.execute("INSERT INTO outbound VALUES (4, 7, 'publish', 1, NULL)")
    for name in ("ledger.sqlite", "outbound.sqlite"):
        (data / name).chmod(0o600)
    # Its tables: batch 1 (message 1) landed; batch 2 half written when it stopped (message 2's
    # partition of a batch the ledger never committed: the replay lands 2 and 3, this must not).
    legacy_partition(data / "tables", 1, [1], received)
    legacy_partition(data / "tables", 2, [2], received)


def legacy_partition(tables: Path, batch_id: int, messages: list[int], received: float) -> None:
    """`reads/date=D/batch_id=N/part-00000.parquet` as the fxgate before Delta wrote it: the
    reads' columns in the file, the partition columns in the path."""
    records = [
        LedgerRecord(n, key(n), TOPIC, payload(n), 1, received, pack_id=batch_id) for n in messages
    ]
    reads = build_batch(records, batch_id).reads
    # That fxgate took the date from the reader's timestamp, a day other than the receive date.
    date = reads.column("event_time")[0].as_py().strftime("%Y-%m-%d")
    assert date != reads.column("date")[0].as_py()
    directory = tables / "reads" / f"date={date}" / f"batch_id={batch_id}"
    directory.mkdir(parents=True)
    pq.write_table(reads.drop_columns(["date", "batch_id"]), directory / "part-00000.parquet")


def test_a_data_dir_of_the_previous_schema_delivers_every_waiting_message_once(
    mosquitto_factory, spark_session, tmp_path
):
    source, upstream = mosquitto_factory(), mosquitto_factory(debug_log=True)
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    data = tmp_path / "data"
    clock = RealClock()
    previous_version_data_dir(data, clock.wall())
    config = load_config(
        None, environ=forwarding_environ(source, upstream, data, qos=1), hostname="gw-test"
    )
    gateway = Supervisor(config, clock, session_factory=lambda: spark_session)
    try:
        gateway.start()
        # 1 converted from the old layout; 2 and 3 replayed as their batch (its old partial
        # partition not converted); 4, 5, 6 packed anew: each once in the table.
        assert gateway.wait_for_landed(5, timeout=90)
        # 4, 5 and 6 go upstream (4 under its old packet id); 2 and 3 had gone already.
        messages = cloud.wait_for(3, timeout=60)
        assert wait_until(
            lambda: gateway.status()["ledger"]["lag"]["upstream"]["messages"] == 0, 30
        )
        cloud.wait_for(4, timeout=1)  # nothing more comes
    finally:
        gateway.stop()
        clock.close()
        cloud.close()
    tables = config.spark.tables_path(config.gateway.data_path)
    expected = {read_id(key(n), 0) for n in (1, 2, 3, 4, 5, 6)}
    ids, readers = landed_ids_spark(spark_session, tables)
    result = compare(expected, ids, readers)
    assert result.exact, result
    assert compare(expected, landed_ids_arrow(tables)[0]).exact
    assert not list((tables / "reads").glob("date=*/batch_id=*"))  # the old layout is gone
    rows = read_table_arrow(tables, READS).to_pylist()
    assert [row["date"] for row in rows] == [
        row["received_time"].astimezone(UTC).strftime("%Y-%m-%d") for row in rows
    ]
    assert DeltaTable(str(tables / READS)).metadata().configuration[DATE_OF] == RECEIVE_DATE
    keys = Counter(props[IDEMPOTENCY_PROPERTY] for _, _, props in messages)
    assert keys == Counter(key(n) for n in (4, 5, 6))
    assert cloud.messages == messages
    # The message that was in flight went out again, with DUP, under the packet id it had.
    resent = [
        (dup, int(mid), topic)
        for client, dup, mid, topic, _size in PUBLISH_LINE.findall(upstream.output())
        if client.startswith("fxgate-upstream") and topic.startswith("cloud/")
    ]
    assert resent[0] == ("1", 7, "cloud/local-gw-test/fx9600-01"), resent
    with sqlite3.connect(data / "ledger.sqlite") as db:
        assert db.execute("PRAGMA user_version").fetchone() == (LEDGER_VERSION,)
    with sqlite3.connect(data / "outbound.sqlite") as db:
        assert db.execute("PRAGMA user_version").fetchone() == (OUTBOUND_VERSION,)


def test_a_data_dir_written_by_a_newer_fxgate_is_refused_and_left_as_it_was(
    mosquitto, daemon_factory, tmp_path
):
    data = tmp_path / "data"
    previous_version_data_dir(data, 1_800_000_000.0)
    with sqlite3.connect(data / "ledger.sqlite") as db:
        db.execute(f"PRAGMA user_version = {LEDGER_VERSION + 1}")
    before = {name: (data / name).read_bytes() for name in ("ledger.sqlite", "outbound.sqlite")}
    daemon = daemon_factory(
        {"FXGATE__SOURCE__PORT": str(mosquitto.port), "FXGATE__GATEWAY__DATA_DIR": str(data)}
    )
    assert daemon.proc.wait(60) == 2
    daemon.wait_for_log(r"CRITICAL .*not starting: .*ledger\.sqlite has schema version 3", 5)
    assert {name: (data / name).read_bytes() for name in before} == before
