"""The ledger is the buffer (DESIGN §2, §7.1): with the source broker as shipped, an outage of
either sink costs the gateway disk, never a read.

The source mosquitto here runs at its shipped limits (`max_queued_messages` 1000,
`max_inflight_messages` 20): past them it drops messages for a session that holds its acks, and
says so in its log ("Outgoing messages are being dropped"). The first design paused the source
when tier 2 filled and lost 20,600 of 30,000 reads that way in a 100 s upstream outage; here the
same shape of test, scaled down, loses none, and the table lands everything meanwhile.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest

from actors.backoff import Backoff
from actors.clock import RealClock
from actors.config.schema import load_config
from actors.devtools.mosquitto import SHIPPED_LIMITS
from actors.devtools.simulate import expected_read_ids, simulate
from actors.mqtt.upstream import IDEMPOTENCY_PROPERTY
from actors.supervisor import Supervisor
from spark.report import compare, landed_ids_spark
from tests.actors.test_outbound import forwarding_environ
from tests.harness.checks import wait_until, wait_until_landed
from tests.harness.mqtt import Collector

pytestmark = [pytest.mark.broker, pytest.mark.spark]

# mosquitto 2.0.11 as shipped: what operators run.
SHIPPED = SHIPPED_LIMITS
DROPPED = "Outgoing messages are being dropped"
READERS = ("fx9600-01", "fx9600-02")
TIER2_CAP = 100
# The readers' pace in the bursts below, in total: above the field's 150 msg/s per reader that
# issue 12 measured, and within what the gateway commits on a busy two-core box. A publisher
# unpaced on loopback outruns any subscriber there for a moment; once the session holds more than
# mosquitto's 1,000 queued, the broker drops (that is the broker's limit deciding, not the ledger:
# a loaded CI run saw 197 of 3,000 dropped that way, with every sink idle).
PACE = 1000


class SparkDown:
    """A table writer that fails while `failing` is set, and writes for real otherwise: Spark
    down for as long as a test says (the writer retries on its backoff meanwhile)."""

    def __init__(self) -> None:
        self.failing = threading.Event()
        self.failed = 0

    def __call__(self, session, tables_dir, **options):
        from spark.tables import TableWriter

        real = TableWriter(session, tables_dir, **options)
        outer = self

        class Writer:
            def cancel(self) -> None:
                real.cancel()

            def write_batch(self, batch_id, tables):
                if outer.failing.is_set():
                    outer.failed += 1
                    raise RuntimeError("injected: Spark is down")
                return real.write_batch(batch_id, tables)

        return Writer()


@pytest.fixture
def gateway_factory(spark_session, tmp_path):
    started = []

    def start(source, upstream, qos=1, writer_options=None, **extra):
        environ = forwarding_environ(
            source,
            upstream,
            tmp_path / "data",
            qos,
            FXGATE__BUFFER__MAX_MESSAGES=str(TIER2_CAP),
            **extra,
        )
        config = load_config(None, environ=environ, hostname="gw-test")
        clock = RealClock()
        supervisor = Supervisor(
            config, clock, session_factory=lambda: spark_session, writer_options=writer_options
        )
        started.append((supervisor, clock))
        supervisor.start()
        assert source.wait_for_output("fxgate-local-gw-test-gw-test 2 zebra/fx/+/reads", 15)
        return supervisor

    yield start
    for supervisor, clock in started:
        supervisor.stop()
        clock.close()


def assert_upstream_got_each_once_in_order(messages, published) -> None:
    keys = [props[IDEMPOTENCY_PROPERTY] for _, _, props in messages]
    assert Counter(keys) == Counter(r.message_key for r in published)
    for reader in READERS:
        sent = [r.message_key for r in published if reader in r.topic]
        got = [props[IDEMPOTENCY_PROPERTY] for t, _, props in messages if t.endswith(reader)]
        assert got == sent, f"{reader}: upstream order differs from the order published"


def assert_table_holds_each_once(spark_session, gateway, published) -> None:
    tables = gateway.config.spark.tables_path(gateway.config.gateway.data_path)
    ids, readers = landed_ids_spark(spark_session, tables)
    result = compare(expected_read_ids(published), ids, readers)
    assert result.exact, result


def where_they_waited(gateway, source) -> str:
    """The whole status (not pytest's cut of it) and whether the source broker dropped."""
    dropped = DROPPED in source.output()
    return f"source broker dropped: {dropped}\n" + json.dumps(
        gateway.status(), indent=1, default=str
    )


def reads_upstream(cloud) -> int:
    return len(cloud.messages)


def test_an_upstream_outage_lands_every_read_in_the_table_and_forwards_each_once_after(
    mosquitto_factory, gateway_factory, spark_session
):
    source = mosquitto_factory(**SHIPPED)
    upstream = mosquitto_factory()
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=1)
    try:
        upstream.stop()  # down for the whole publishing window
        gateway = gateway_factory(source, upstream)
        # 30 times tier 2's cap, three times what mosquitto queues for a session.
        result = simulate(source.host, source.port, readers=2, rate=PACE, count=1500, qos=1)
        assert len(result.published) == 3000 and result.failed == 0
        # Every read is in the table before the upstream is back (seen once not to within the
        # timeout, in a loaded CI run: the whole status says where they waited).
        landed = gateway.wait_for_landed(3000, timeout=120)
        assert landed, where_they_waited(gateway, source)
        assert reads_upstream(cloud) == 0
        assert DROPPED not in source.output()
        status = gateway.status()
        assert status["buffer"]["tier2_peak_messages"] <= TIER2_CAP
        assert status["ledger"]["lag"]["upstream"]["messages"] >= 3000 - TIER2_CAP
        assert status["ledger"]["lag"]["table"]["messages"] == 0
        assert status["ledger"]["paused_by"] == []

        upstream.start()
        messages = cloud.wait_for(3000, timeout=120)
        assert_upstream_got_each_once_in_order(messages, result.published)
        assert wait_until(
            lambda: gateway.status()["ledger"]["lag"]["upstream"]["messages"] == 0, 30
        )
    finally:
        cloud.close()
    assert_table_holds_each_once(spark_session, gateway, result.published)
    assert DROPPED not in source.output()


def test_a_failing_spark_leaves_the_source_acknowledged_and_then_with_both_sinks_down_too(
    mosquitto_factory, gateway_factory, spark_session
):
    source = mosquitto_factory(**SHIPPED)
    upstream = mosquitto_factory()
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=1)
    spark = SparkDown()
    spark.failing.set()
    try:
        gateway = gateway_factory(
            source,
            upstream,
            writer_options={"table_writer": spark, "retry_backoff": Backoff(0.2, 1.0, 0.0)},
            # A small credit: what Spark cannot take waits in the ledger, not in memory.
            FXGATE__SPARK__BACKLOG_HIGH_MESSAGES="500",
            FXGATE__SPARK__BACKLOG_LOW_MESSAGES="100",
        )
        first = simulate(source.host, source.port, readers=2, rate=PACE, count=1500, qos=1)
        assert len(first.published) == 3000
        # The upstream does not wait for the table: every read is there while Spark fails.
        messages = cloud.wait_for(3000, timeout=120)
        assert len(messages) == 3000, where_they_waited(gateway, source)
        assert_upstream_got_each_once_in_order(messages, first.published)
        status = gateway.status()
        assert gateway.rows_written == 0 and spark.failed > 0
        assert status["ledger"]["feeds"]["table"]["behind_from"] is not None
        assert status["ledger"]["lag"]["table"]["messages"] >= 3000
        assert DROPPED not in source.output()
        spark.failing.clear()
        assert gateway.wait_for_landed(3000, timeout=120)

        # Both sinks down at once: the ledger alone holds the lot, the source goes on.
        spark.failing.set()
        upstream.stop()
        second = simulate(source.host, source.port, readers=2, rate=PACE, count=1000, qos=1)
        assert len(second.published) == 2000
        assert wait_until(lambda: gateway.status()["ledger"]["accepted"] >= 5000, 60)
        lag = gateway.status()["ledger"]["lag"]
        assert lag["table"]["messages"] >= 2000 and lag["upstream"]["messages"] >= 2000
        assert DROPPED not in source.output()
        spark.failing.clear()
        upstream.start()
        assert gateway.wait_for_landed(5000, timeout=120)
        messages = cloud.wait_for(5000, timeout=120)
        assert_upstream_got_each_once_in_order(messages, first.published + second.published)
    finally:
        cloud.close()
    assert_table_holds_each_once(spark_session, gateway, first.published + second.published)


# -- the daemon, killed and paused -------------------------------------------------------------


def test_sigkills_during_the_outage_and_during_the_drain_leave_each_sink_exactly_once(
    mosquitto_factory, daemon_factory, tmp_path
):
    source = mosquitto_factory(**SHIPPED)
    upstream = mosquitto_factory()
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    data = tmp_path / "data"
    env = forwarding_environ(
        source, upstream, data, qos=2, FXGATE__BUFFER__MAX_MESSAGES=str(TIER2_CAP)
    )
    try:
        upstream.stop()
        first = daemon_factory(env)
        first.wait_for_log(r"source: subscribed", timeout=60)
        early = simulate(source.host, source.port, readers=2, rate=0, count=400, qos=1)
        first.wait_for_log(r"the upstream's backlog waits in tier 1", timeout=60)
        first.kill()  # during the outage

        second = daemon_factory(env)
        second.wait_for_log(r"source: subscribed", timeout=60)
        late = simulate(source.host, source.port, readers=2, rate=0, count=300, seed=1, qos=1)
        mark = second.mark()
        upstream.start()
        second.wait_for_log(r"pack \d+ acknowledged upstream: [1-9]", timeout=60, after=mark)
        second.kill()  # during the drain

        third = daemon_factory(env)
        published = early.published + late.published
        wait_until_landed(third, data, len(published))
        messages = cloud.wait_for(len(published), timeout=120)
        assert third.terminate() == 0
    finally:
        cloud.close()
    # QoS 2 upstream: exactly once through both kills (same packet ids after each).
    assert_upstream_got_each_once_in_order(messages, published)
    assert DROPPED not in source.output()


def test_at_its_disk_budget_the_ledger_pauses_the_source_loudly_and_resumes_when_freed(
    mosquitto_factory, daemon_factory, tmp_path
):
    from tests.actors.app.test_metrics import free_port, get, scrape

    source = mosquitto_factory(**SHIPPED)
    upstream = mosquitto_factory()
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=1)
    data = tmp_path / "data"
    port = free_port()
    env = forwarding_environ(
        source,
        upstream,
        data,
        qos=1,
        FXGATE__BUFFER__MAX_MESSAGES=str(TIER2_CAP),
        FXGATE__GATEWAY__METRICS_PORT=str(port),
        # About 2,700 reads of the simulator's size (375 bytes each in the ledger, measured);
        # once both sinks are done their keys alone (163 bytes each) stay below the 90 % at
        # which the source resumes (docs/pages/operating/disk-budget.md).
        FXGATE__LEDGER__MAX_BYTES=str(1024 * 1024),
        FXGATE__LEDGER__MIN_FREE_BYTES="0",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        upstream.stop()  # nothing leaves the ledger for the upstream: it fills
        daemon = daemon_factory(env)
        daemon.wait_for_log(r"source: subscribed", timeout=60)
        published = []
        chunk = 0
        while daemon.count_logs("ledger at its disk budget") == 0:
            assert chunk < 80, "the budget was never reached"
            sent = simulate(source.host, source.port, readers=2, rate=0, count=50, seed=chunk)
            published += sent.published
            chunk += 1
        warning = daemon.wait_for_log(r"WARNING .*ledger at its disk budget \(([^)]*)\)")
        assert "[ledger] max_bytes = 1.00 MiB" in warning.group(1)
        # Paused: what the readers send now waits in the broker (within its queue limit).
        for more in range(3):
            sent = simulate(source.host, source.port, readers=2, rate=0, count=50, seed=100 + more)
            published += sent.published
        assert wait_until(lambda: scrape(base).get("fxgate_source_paused") == 1, 30)
        status, body = get(f"{base}/healthz")
        assert status == 503
        assert any("at its disk budget" in reason for reason in json_reasons(body))

        upstream.start()  # the upstream drains the ledger: payloads go, the source resumes
        daemon.wait_for_log(r"ledger back within its disk budget", timeout=120)
        wait_until_landed(daemon, data, len(published))
        messages = cloud.wait_for(len(published), timeout=120)
        assert wait_until(lambda: scrape(base).get("fxgate_source_paused") == 0, 30)
        assert wait_until(lambda: get(f"{base}/healthz")[0] == 200, 30), get(f"{base}/healthz")
        assert daemon.terminate() == 0
    finally:
        cloud.close()
    assert Counter(props[IDEMPOTENCY_PROPERTY] for _, _, props in messages) == Counter(
        r.message_key for r in published
    )
    assert DROPPED not in source.output()


def json_reasons(body: str) -> list[str]:
    import json

    return json.loads(body)["reasons"]
