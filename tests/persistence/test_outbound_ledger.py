"""Forwarding upstream against two real brokers: source -> fxgate -> upstream, and the table."""

from collections import Counter

import pytest

from actors.clock import RealClock
from actors.config import load_config
from actors.simulate import expected_read_ids, simulate
from actors.supervisor import Supervisor
from actors.upstream_client import IDEMPOTENCY_PROPERTY
from spark.report import compare, landed_ids_spark
from tests.harness.mqtt import Collector

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def forwarding_environ(source, upstream, data, qos=2, **extra):
    return {
        "FXGATE__SOURCE__PORT": str(source.port),
        "FXGATE__GATEWAY__DATA_DIR": str(data),
        "FXGATE__PACKS__LINGER_SECONDS": "0.2",
        "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
        "FXGATE__UPSTREAM__HOST": upstream.host,
        "FXGATE__UPSTREAM__PORT": str(upstream.port),
        "FXGATE__UPSTREAM__RECONNECT_MIN_DELAY_SECONDS": "0.2",
        "FXGATE__UPSTREAM__RECONNECT_MAX_DELAY_SECONDS": "1.0",
        "FXGATE__ROUTES__0__SOURCE": "zebra/fx/+/reads",
        "FXGATE__ROUTES__0__TARGET": "cloud/{environment}/{reader}",
        "FXGATE__ROUTES__0__QOS": str(qos),
        **extra,
    }


@pytest.fixture
def brokers(mosquitto_factory):
    return mosquitto_factory(), mosquitto_factory()


@pytest.fixture
def forwarding_gateway(brokers, spark_session, tmp_path):
    started = []

    def start(qos=2, **extra):
        source, upstream = brokers
        environ = forwarding_environ(source, upstream, tmp_path / "data", qos, **extra)
        config = load_config(None, environ=environ, hostname="gw-test")
        clock = RealClock()
        supervisor = Supervisor(config, clock, session_factory=lambda: spark_session)
        supervisor.start()
        started.append((supervisor, clock))
        assert source.wait_for_output("fxgate-local-gw-test-gw-test 2 zebra/fx/+/reads", 15)
        return supervisor

    yield start
    for supervisor, clock in started:
        supervisor.stop()
        clock.close()


@pytest.mark.parametrize("qos", [1, 2])
def test_every_read_reaches_upstream_once_in_order_and_lands_in_the_table(
    forwarding_gateway, brokers, spark_session, qos
):
    source, upstream = brokers
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    try:
        gateway = forwarding_gateway(qos=qos)
        result = simulate(source.host, source.port, readers=2, rate=0, count=500, qos=qos)
        messages = cloud.wait_for(1000)
        keys = [props[IDEMPOTENCY_PROPERTY] for _, _, props in messages]
        assert Counter(keys) == Counter(r.message_key for r in result.published)
        # Per reader, upstream sees the reads in the order they were published.
        for reader in ("fx9600-01", "fx9600-02"):
            sent = [r.message_key for r in result.published if reader in r.topic]
            got = [props[IDEMPOTENCY_PROPERTY] for t, _, props in messages if t.endswith(reader)]
            assert got == sent
        assert {t for t, _, _ in messages} == {
            "cloud/local-gw-test/fx9600-01",
            "cloud/local-gw-test/fx9600-02",
        }
        assert gateway.wait_for_landed(1000, timeout=60)
        tables = gateway.config.spark.tables_path(gateway.config.gateway.data_path)
        ids, readers = landed_ids_spark(spark_session, tables)
        assert compare(expected_read_ids(result.published), ids, readers).exact
    finally:
        cloud.close()
