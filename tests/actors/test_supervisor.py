"""The whole path in one process: real mosquitto -> actors -> ledger -> Spark table."""

import json

import pykka
import pytest

from actors.app.dead_letters import load_dead_letters
from actors.clock import RealClock
from actors.config.schema import load_config
from actors.devtools.simulate import expected_read_ids, simulate
from actors.supervisor import Supervisor
from persistence.replay import ReplayMessage, replay_key, write_request
from spark.report import compare, landed_ids_arrow, landed_ids_spark
from spark.tables import DEAD_LETTERS, read_table
from tests.harness.mqtt import publish_all

pytestmark = [pytest.mark.broker, pytest.mark.spark]


@pytest.fixture
def overrides():
    return {}


def quick_config(broker, data, **overrides):
    """The embedded defaults, pointed at the test broker and `data`, with short batching waits."""
    environ = {
        "FXGATE__SOURCE__PORT": str(broker.port),
        "FXGATE__GATEWAY__DATA_DIR": str(data),
        "FXGATE__PACKS__LINGER_SECONDS": "0.2",
        "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
        **overrides,
    }
    return load_config(None, environ=environ, hostname="gw-test")


@pytest.fixture
def gateway(mosquitto, spark_session, tmp_path, overrides):
    """A started Supervisor on the embedded defaults, pointed at the test broker and tmp_path."""
    config = quick_config(mosquitto, tmp_path / "data", **overrides)
    clock = RealClock()
    supervisor = Supervisor(config, clock, session_factory=lambda: spark_session)
    supervisor.start()
    assert mosquitto.wait_for_output(f"{config.identity.subscriptions[0]}", 15)
    yield supervisor
    supervisor.stop()
    clock.close()


@pytest.mark.parametrize("qos", [1, 2])
def test_two_readers_times_2000_reads_land_exactly_once(gateway, mosquitto, spark_session, qos):
    result = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=2000, qos=qos)
    assert result.failed == 0
    expected = expected_read_ids(result.published)
    assert len(expected) == 4000

    assert gateway.wait_for_landed(4000, timeout=120)
    tables = gateway.config.spark.tables_path(gateway.config.gateway.data_path)
    ids, readers = landed_ids_spark(spark_session, tables)
    through_spark = compare(expected, ids, readers)
    assert through_spark.exact, through_spark.lines()
    assert through_spark.per_reader == {"fx9600-01": 2000, "fx9600-02": 2000}
    assert compare(expected, landed_ids_arrow(tables)[0]).exact


def test_rows_keep_each_readers_order_of_arrival(gateway, mosquitto, spark_session):
    result = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=300, qos=1)
    assert gateway.wait_for_landed(600, timeout=60)
    tables = gateway.config.spark.tables_path(gateway.config.gateway.data_path)
    rows = read_table(spark_session, tables, "reads").select("reader_id", "event_num", "pack_id")
    by_reader: dict[str, list[tuple[int, int]]] = {}
    for reader, event_num, pack_id in rows.collect():
        by_reader.setdefault(reader, []).append((pack_id, event_num))
    for reader, pairs in by_reader.items():
        pairs.sort()
        assert [e for _, e in pairs] == sorted(e for _, e in pairs), reader
    assert len(result.published) == 600


def test_a_malformed_payload_goes_to_dead_letters_and_the_next_good_read_still_lands(
    gateway, mosquitto, spark_session
):
    good = (
        b'{"data": {"idHex": "e2801160600002054cc2096f", "antenna": 1, "peakRssi": -51, '
        b'"eventNum": 1}, "timestamp": "2026-11-21T10:00:00.000+0000", "type": "SIMPLE"}'
    )
    publish_all(
        mosquitto.host,
        mosquitto.port,
        [("zebra/fx/fx9600-07/reads", b"{not json"), ("zebra/fx/fx9600-07/reads", good)],
        qos=1,
    )
    assert gateway.wait_for_landed(1, dead_letters=1, timeout=60)
    tables = gateway.config.spark.tables_path(gateway.config.gateway.data_path)
    dead = read_table(spark_session, tables, DEAD_LETTERS).collect()
    assert [(d["topic"], d["reason"], bytes(d["payload"])) for d in dead] == [
        ("zebra/fx/fx9600-07/reads", "invalid_json", b"{not json")
    ]
    reads = read_table(spark_session, tables, "reads").collect()
    assert [(r["reader_id"], r["epc"], r["event_num"]) for r in reads] == [
        ("fx9600-07", "e2801160600002054cc2096f", 1)
    ]
    assert gateway.ref("source").is_alive()
    # Counted by sink and reason for /metrics, and the status snapshot (written as JSON by the
    # daemon every second) still serialises with the last batch in it.
    assert gateway.dead_letters_by_reason == {"table/invalid_json": 1}
    assert json.loads(json.dumps(gateway.status()))["last_batch"]["dead_letter_reasons"] == [
        ["table", "invalid_json", 1]
    ]


def zebra_event(event_num: int, epc: str) -> dict:
    return {
        "data": {"idHex": epc, "antenna": 2, "peakRssi": -60, "eventNum": event_num},
        "timestamp": f"2026-11-21T10:00:{event_num:02d}.000+0000",
        "type": "SIMPLE",
    }


@pytest.mark.parametrize("overrides", [{"FXGATE__LEDGER__IDEMPOTENCY_KEY": "read_fields"}])
def test_with_read_field_keys_a_read_resent_in_another_message_is_stored_once(
    gateway, mosquitto, spark_session
):
    import json

    topic = "zebra/fx/fx9600-03/reads"
    first = json.dumps([zebra_event(1, "e2a1"), zebra_event(2, "e2b2")]).encode()
    second = json.dumps([zebra_event(2, "e2b2"), zebra_event(3, "e2c3")]).encode()
    publish_all(mosquitto.host, mosquitto.port, [(topic, first)], qos=1)
    assert gateway.wait_for_landed(2, timeout=60)
    publish_all(mosquitto.host, mosquitto.port, [(topic, second)], qos=1)
    assert gateway.wait_for_landed(3, timeout=60)
    tables = gateway.config.spark.tables_path(gateway.config.gateway.data_path)
    rows = read_table(spark_session, tables, "reads").select("message_id", "epc").collect()
    assert sorted((r["message_id"].split("/")[1], r["epc"]) for r in rows) == [
        ("1", "e2a1"),
        ("2", "e2b2"),
        ("3", "e2c3"),
    ]
    assert gateway.batches_written == 2


def test_a_replayed_dead_letter_goes_through_the_pipeline_again_under_a_new_key(
    gateway, mosquitto, spark_session, tmp_path
):
    publish_all(mosquitto.host, mosquitto.port, [("zebra/fx/fx9600-07/reads", b"{not json")])
    assert gateway.wait_for_landed(0, dead_letters=1, timeout=60)
    data = gateway.config.gateway.data_path
    tables = gateway.config.spark.tables_path(data)
    (letter,) = load_dead_letters(tables)
    request = write_request(
        data, [ReplayMessage(letter.message_key, letter.topic, letter.payload, letter.qos)]
    )
    # What the daemon does once a second.
    gateway.take_requests()
    assert gateway.wait_for_landed(0, dead_letters=2, timeout=60)
    dead = read_table(spark_session, tables, DEAD_LETTERS).collect()
    replayed = replay_key(letter.message_key, request.name.removesuffix(".jsonl"))
    assert sorted(d["message_key"] for d in dead) == sorted([letter.message_key, replayed])
    assert not request.exists()


def test_status_asks_each_actor_through_a_proxy_made_once(gateway, mosquitto, monkeypatch):
    # Making a pykka proxy introspects the whole actor: status, asked every second, makes one per
    # actor once and asks through it from then on, and still reports what is current.
    made = []
    make = pykka.ActorRef.proxy

    def counted(ref):
        made.append(ref)
        return make(ref)

    monkeypatch.setattr(pykka.ActorRef, "proxy", counted)
    before = gateway.status()
    asked = {name for name in ("source", "ledger", "lifecycle") if name in before}
    assert asked == {"source", "ledger", "lifecycle"}
    assert len(made) == len(set(map(id, made))) >= len(asked)
    made.clear()

    result = simulate(mosquitto.host, mosquitto.port, readers=1, rate=0, count=20, qos=1)
    assert gateway.wait_for_landed(20, timeout=60)
    after = gateway.status()
    assert made == []
    # Current, not the first snapshot again (a life-cycle event may be accepted meanwhile).
    assert after["ledger"]["accepted"] - before["ledger"]["accepted"] >= len(result.published)
