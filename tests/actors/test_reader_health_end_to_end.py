"""Management events through the real daemon and mosquitto: `reader_events` lands each event
once through a kill and the batch's replay, and a broker that drops data messages while the
gateway is away shows up in the heartbeat reconciliation as exactly the number it dropped.

The oracle is independent of the gateway's own figures: what each simulated reader published and
had acknowledged (its honest counters) against the rows its data left in the `reads` table.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from actors.app.status import collect_status
from actors.config.schema import load_config
from actors.devtools.simulate import simulate
from spark.audit import audit_tables
from spark.tables import DEAD_LETTERS, READER_EVENTS, READS, read_table, read_table_arrow
from tests.harness.checks import settled, wait_until_landed
from tests.harness.daemon import gateway_env

pytestmark = [pytest.mark.broker, pytest.mark.spark]

MANAGEMENT = '["zebra/fx/+/mgmt"]'
READERS = ("fx9600-01", "fx9600-02")
CLIENT_ID = "fxgate-health-gw"  # fxgate-{environment}-{instance}, as the env below says
QUEUE_LIMIT = 50
# Per reader, while the gateway is stopped: past its Receive Maximum (packs.max_messages = 50)
# and the broker's queue of QUEUE_LIMIT for both readers together.
BURST = 120


def health_env(broker, data: Path) -> dict[str, str]:
    return {
        **gateway_env(broker, data),
        "FXGATE__SOURCE__MANAGEMENT_TOPICS": MANAGEMENT,
        "FXGATE__SOURCE__ENVIRONMENT_ID": "health",
        "FXGATE__SOURCE__INSTANCE_ID": "gw",
    }


def readers_now(env: dict[str, str]) -> dict:
    """`fxgate status`'s reader summaries, read from the data directory."""
    return collect_status(load_config(None, environ=env))["readers"]


def wait_for_batches(daemon, condition, what: str, timeout: float = 120.0):
    """Wait, on the daemon's 'batch N written' lines, until `condition()` holds."""
    daemon.wait_for_batches(condition, lambda: f"{what}: not", timeout)


@contextmanager
def stopped(daemon):
    """SIGSTOP the daemon (it neither reads its socket nor acks); SIGCONT on the way out."""
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(daemon.pid, signal.SIGCONT)


@pytest.mark.timeout(600)
def test_reader_events_land_once_through_a_kill_after_the_spark_job_and_the_batchs_replay(
    mosquitto, daemon_factory, spark_session, tmp_path
):
    data = tmp_path / "data"
    env = health_env(mosquitto, data)
    doomed = daemon_factory({**env, "FXGATE_CRASH_AT": "after_spark_job_before_mark:1"})
    doomed.wait_for_log(r"source: subscribed to zebra/fx/\+/mgmt", timeout=120)
    result = simulate(
        mosquitto.host,
        mosquitto.port,
        readers=2,
        rate=0,
        count=60,
        qos=1,
        heartbeat_every=20,
        gpi_every=15,
    )
    assert result.failed == 0
    # Per reader: heartbeats at 0, 20, 40 and 60 data messages; a GPI change after each 15.
    assert len(result.management) == 2 * (4 + 4)
    assert doomed.proc.wait(180) == -9, doomed.output()
    assert doomed.count_logs("crash point after_spark_job_before_mark reached") == 1

    survivor = daemon_factory(env)
    wait_until_landed(survivor, data, 120)

    rows = read_table_arrow(data / "tables", READER_EVENTS).to_pylist()
    keys = [row["message_key"] for row in rows]
    assert sorted(keys) == sorted(r.message_key for r in result.management)  # each once
    assert {row["reader_id"] for row in rows} == set(READERS)
    assert sorted({row["type"] for row in rows}) == ["gpi", "heartbeat"]
    through_spark = read_table(spark_session, data / "tables", READER_EVENTS)
    assert through_spark.count() == len(result.management)
    assert through_spark.select("message_key").distinct().count() == len(result.management)
    assert read_table_arrow(data / "tables", READS).num_rows == 120
    assert read_table_arrow(data / "tables", DEAD_LETTERS).num_rows == 0

    # One eventNum counter per reader for both kinds (DESIGN §7.9): the audit over reads and
    # reader_events finds every number, 60 tag events and 8 management events per reader.
    audit = audit_tables(spark_session, [data / "tables"]).to_json()
    assert audit["complete"] is True, audit
    assert {r: v["received"] for r, v in audit["readers"].items()} == dict.fromkeys(READERS, 68)

    # The replayed batch was counted once: 4 heartbeats, 60 data messages, nothing unaccounted.
    for reader, view in readers_now(env).items():
        assert view["heartbeats"] == 4, reader
        assert view["events"] == {"gpi": 4}, reader
        assert view["data_messages"] == 60, reader
        assert view["reported"]["sent"] == 60, reader
        assert view["reconciliation"]["intervals"] == 3, reader
        assert view["reconciliation"]["unaccounted"] == 0, reader
    assert survivor.terminate() == 0


def broker_counts(broker) -> tuple[int, int]:
    """(PUBLISHes the broker sent the gateway, acks it had back), from mosquitto's debug log."""
    lines = broker.output().splitlines()
    sent = sum(1 for line in lines if f"Sending PUBLISH to {CLIENT_ID} " in line)
    acked = sum(1 for line in lines if f"Received PUBACK from {CLIENT_ID} " in line)
    return sent, acked


def drained(broker, data: Path) -> bool:
    """Everything the broker sent the gateway is acknowledged and landed: the broker's queue
    for it is empty (an ack makes mosquitto send the next queued message in the same step)."""
    sent, acked = broker_counts(broker)
    _, pending, open_batches = settled(data)
    return sent == acked and pending == open_batches == 0


def landed_per_reader(data: Path) -> dict[str, int]:
    table = read_table_arrow(data / "tables", READS).select(["reader_id"]).to_pylist()
    counts: dict[str, int] = {}
    for row in table:
        counts[row["reader_id"]] = counts.get(row["reader_id"], 0) + 1
    return counts


@pytest.mark.timeout(600)
def test_a_broker_drop_while_the_gateway_is_away_shows_as_exactly_the_dropped_count(
    mosquitto_factory, daemon_factory, tmp_path
):
    broker = mosquitto_factory(max_queued_messages=QUEUE_LIMIT, debug_log=True)
    data = tmp_path / "data"
    env = health_env(broker, data)
    daemon = daemon_factory(env)
    daemon.wait_for_log(r"source: subscribed to zebra/fx/\+/mgmt", timeout=120)
    daemon.wait_for_log(r"spark writer ready", timeout=180)
    counters: dict = {}  # each simulated reader's own counters, carried across the phases

    # 1. The gateway is there: a heartbeat, a few data messages, a heartbeat; all land.
    simulate(broker.host, broker.port, 2, 0, 5, heartbeat_every=100, counters=counters)
    wait_for_batches(
        daemon,
        lambda: (
            drained(broker, data)
            and all(v["heartbeats"] == 2 for v in readers_now(env).values())
            and len(readers_now(env)) == 2
        ),
        "the first heartbeats",
    )
    before = readers_now(env)
    assert all(v["reconciliation"]["unaccounted"] == 0 for v in before.values()), before

    # 2. The gateway stops reading; the readers publish on, and the broker drops past its queue
    #    while telling them every message was accepted.
    mark = broker.line_count()
    with stopped(daemon):
        burst = simulate(broker.host, broker.port, 2, 0, BURST, counters=counters)
        assert burst.failed == 0 and len(burst.published) == 2 * BURST
        assert broker.wait_for_output(
            f"Outgoing messages are being dropped for client {CLIENT_ID}", 10, start=mark
        ), broker.output()
    wait_for_batches(daemon, lambda: drained(broker, data), "the queued messages to land")

    # 3. The gateway is back: the readers' next heartbeats carry what they really sent.
    simulate(broker.host, broker.port, 2, 0, 0, heartbeat_every=1, counters=counters)
    wait_for_batches(
        daemon,
        lambda: (
            drained(broker, data) and all(v["heartbeats"] == 4 for v in readers_now(env).values())
        ),
        "the heartbeats after the outage",
    )

    landed = landed_per_reader(data)
    after = readers_now(env)
    for reader in READERS:
        published = counters[reader].sent
        assert published == 5 + BURST
        dropped = published - landed[reader]
        assert dropped > 0, f"{reader}: the broker dropped nothing; the test proves nothing"
        view = after[reader]
        assert view["reported"]["sent"] == published
        assert view["data_messages"] == landed[reader]
        assert view["reconciliation"]["unaccounted"] == dropped, (reader, view, landed)
        assert view["reconciliation"]["counter_resets"] == 0
    print(
        "dropped by mosquitto and shown by the reconciliation: "
        + ", ".join(f"{r}: {after[r]['reconciliation']['unaccounted']}" for r in READERS)
    )
    assert daemon.terminate() == 0
