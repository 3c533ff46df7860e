"""Forwarding upstream against two real brokers: source -> fxgate -> upstream, and the table."""

import re
import threading
from collections import Counter

import pytest

from actors.clock import RealClock, SimulatedClock
from actors.config import load_config
from actors.connection import SessionStarted
from actors.pack import Pack, PackSealed
from actors.routes import Route
from actors.simulate import expected_read_ids, simulate
from actors.supervisor import Supervisor
from actors.upstream_client import IDEMPOTENCY_PROPERTY, AckType, OutboundAck
from persistence.inbound_ledger import LedgerRecord
from persistence.outbound_ledger import OutboundLedger
from spark.report import compare, landed_ids_spark
from tests.harness.checks import wait_until_landed
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


PUBLISH_LINE = re.compile(
    r"Received PUBLISH from (\S+) \(d(\d), q\d, r\d, m(\d+), '([^']+)', \.\.\. \((\d+) bytes\)"
)


@pytest.mark.parametrize("point", ["after_publish_before_pubrec", "after_pubrec_before_pubcomp"])
def test_a_kill_mid_qos2_exchange_upstream_resends_the_same_packet_ids_and_delivers_once(
    point, mosquitto_factory, daemon_factory, tmp_path
):
    source = mosquitto_factory()
    upstream = mosquitto_factory(debug_log=True)
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    data = tmp_path / "data"
    env = forwarding_environ(source, upstream, data, qos=2)
    try:
        doomed = daemon_factory({**env, "FXGATE_CRASH_AT": f"{point}:30"})
        doomed.wait_for_log(r"source: subscribed", timeout=60)
        result = simulate(source.host, source.port, readers=2, rate=0, count=200, qos=2)
        assert doomed.proc.wait(120) == -9, doomed.output()[-3000:]
        assert doomed.count_logs(f"crash point {point} reached") == 1

        survivor = daemon_factory(env)
        wait_until_landed(survivor, data, 400)
        assert survivor.terminate() == 0
        messages = cloud.wait_for(400)
    finally:
        cloud.close()

    keys = Counter(props[IDEMPOTENCY_PROPERTY] for _, _, props in messages)
    assert keys == Counter(r.message_key for r in result.published)  # each exactly once

    # Scan the broker's log in order: a DUP re-send must carry the id (and the topic and size)
    # of the latest original PUBLISH with that id; ids are reused over a run.
    latest: dict[int, tuple[str, str]] = {}
    resent = []
    for client, dup, mid, topic, size in PUBLISH_LINE.findall(upstream.output()):
        if not client.startswith("fxgate-upstream"):
            continue
        if dup == "0":
            latest[int(mid)] = (topic, size)
        else:
            resent.append((int(mid), (topic, size), latest.get(int(mid))))
    if point == "after_publish_before_pubrec":
        assert resent, "the restart should re-send the unacknowledged PUBLISHes with DUP"
        # A re-send whose original died in our socket buffer reaches the broker first as DUP;
        # any the broker had seen must come back under the same id.
        seen_before = [(mid, message, original) for mid, message, original in resent if original]
        assert seen_before, "no re-send of a PUBLISH the broker had already received"
        for mid, message, original in seen_before:
            assert message == original, f"DUP re-send of m{mid} is not the message first sent"
    else:
        pubrels = re.findall(
            r"Received PUBREL from fxgate-upstream\S* \(Mid: (\d+)\)", upstream.output()
        )
        assert len(pubrels) > len(set(pubrels)), "the restart should re-send a PUBREL"


GOOD_READ = (
    b'{"data": {"idHex": "e2801160600002054cc2096f", "antenna": 1, "eventNum": 7}, '
    b'"timestamp": "2026-11-21T10:00:00.000+0000"}'
)


def test_a_pubrec_refusing_with_quota_exceeded_is_retried_not_reported_delivered(
    mosquitto, spark_session, tmp_path
):
    from tests.harness.fake_broker import FakeBroker
    from tests.harness.mqtt import publish_all

    with FakeBroker() as fake:
        fake.reply_publish([0x97])
        environ = forwarding_environ(
            mosquitto,
            fake,
            tmp_path / "data",
            qos=2,
            FXGATE__PACKS__PROCESSING_TIMEOUT_SECONDS="1",
        )
        config = load_config(None, environ=environ, hostname="gw-test")
        clock = RealClock()
        gateway = Supervisor(config, clock, session_factory=lambda: spark_session)
        gateway.start()
        try:
            assert mosquitto.wait_for_output("fxgate-local-gw-test-gw-test 2 zebra/fx", 15)
            publish_all(mosquitto.host, mosquitto.port, [("zebra/fx/fx9600-05/reads", GOOD_READ)])
            assert fake.wait_for(lambda f: len(f.received) >= 2, 30)
            assert gateway.wait_for_landed(1, timeout=60)
            stats = gateway.ref("outbound").proxy().status().get(timeout=5)
        finally:
            gateway.stop()
            clock.close()
        refused, accepted = fake.received[:2]
        assert refused.payload == accepted.payload == GOOD_READ
        assert (
            dict(refused.user_properties)[IDEMPOTENCY_PROPERTY]
            == dict(accepted.user_properties)[IDEMPOTENCY_PROPERTY]
        )
        # No PUBREL for the refused exchange (it ended at the 0x97 PUBREC); one for the retry.
        assert [pid for _, pid in fake.pubrels] == [accepted.packet_id]
        assert stats["failed_acks"] == 1
        assert stats["retries"] >= 1


def test_reads_wait_through_an_upstream_outage_and_arrive_once_in_order(
    forwarding_gateway, brokers, spark_session
):
    source, upstream = brokers
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=1)
    try:
        gateway = forwarding_gateway(qos=1)
        upstream.stop()
        result = simulate(source.host, source.port, readers=2, rate=0, count=300, qos=1)
        assert gateway.rows_written == 0  # nothing reached upstream, so nothing is in the table
        upstream.start()
        messages = cloud.wait_for(600, timeout=90)
        keys = [props[IDEMPOTENCY_PROPERTY] for _, _, props in messages]
        assert Counter(keys) == Counter(r.message_key for r in result.published)
        for reader in ("fx9600-01", "fx9600-02"):
            sent = [r.message_key for r in result.published if reader in r.topic]
            got = [props[IDEMPOTENCY_PROPERTY] for t, _, props in messages if t.endswith(reader)]
            assert got == sent
        assert gateway.wait_for_landed(600, timeout=60)
    finally:
        cloud.close()


class Inbox:
    def __init__(self):
        self.messages = []
        self.cond = threading.Condition()

    def tell(self, message):
        with self.cond:
            self.messages.append(message)
            self.cond.notify_all()

    def wait_for(self, predicate, timeout=10):
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.messages), timeout), self.messages
            return list(self.messages)


class AckingClient:
    """Stands in for the upstream client: every PUBLISH is PUBACKed at once."""

    def __init__(self):
        self.actor = None
        self.sent = []

    def send_publish(self, epoch, message):
        self.sent.append(message)
        self.actor.tell(OutboundAck(epoch, message.packet_id, AckType.PUBACK, 0, "Success"))
        return True

    def send_pubrel(self, epoch, packet_id):
        return True


def packs_of(count, size, start=1):
    seq = start
    for pack_id in range(count):
        records = []
        for _ in range(size):
            records.append(
                LedgerRecord(seq, f"k{seq}", "zebra/fx/r1/reads", b"x" * 100, 1, 0.0, pack_id)
            )
            seq += 1
        yield Pack(pack_id, tuple(records))


class FakeInbound(Inbox):
    """The inbound ledger as the forwarder sees it: Pause/Resume, and tier-1 reads by seq."""

    def __init__(self, records):
        super().__init__()
        self.by_seq = {r.seq: r for r in records}
        self.reads = 0

    def proxy(self):
        return self

    def records(self, seqs):
        self.reads += 1
        found = tuple(self.by_seq[s] for s in seqs)

        class Done:
            def get(self, timeout=None):
                return found

        return Done()


def test_a_long_outage_keeps_tier2_within_its_caps_and_pauses_and_resumes_the_source(tmp_path):
    clock = SimulatedClock()
    packs = list(packs_of(14, 10))
    writer = Inbox()
    source = FakeInbound([r for p in packs for r in p.records])
    outbound = OutboundLedger.start(
        tmp_path / "outbound.sqlite",
        clock,
        writer,
        (Route(0, "zebra/fx/+/reads"),),
        "env",
        buffer_max_messages=100,
        buffer_max_bytes=10**6,
        high_watermark=0.8,
        low_watermark=0.5,
        processing_timeout=20.0,
        source=source,
    )
    try:
        fills = []
        for pack in packs:
            outbound.tell(PackSealed(pack))
            fills.append(outbound.proxy().status().get(timeout=5)["tier2_messages"])
        # The first pack went in flight (not sent: no connection); 80 queued pauses the source;
        # past 100 the rest waits in tier 1 with only its ids in memory.
        assert max(fills) == 100
        assert [type(m).__name__ for m in source.messages] == ["Pause"]
        # An hour of outage on the clock: pack timeouts come and go, nothing is lost or sent.
        for _ in range(180):
            clock.advance(20.0)
        status = outbound.proxy().status().get(timeout=5)
        assert (status["tier2_messages"], status["tier1_waiting_packs"]) == (100, 3)

        client = AckingClient()
        client.actor = outbound
        outbound.proxy().set_client(client).get(timeout=5)
        outbound.tell(SessionStarted(epoch=1, session_present=True, receive_maximum=20))
        acknowledged = writer.wait_for(lambda m: len(m) == 14)
        assert [m.pack.pack_id for m in acknowledged] == list(range(14))
        assert [type(m).__name__ for m in source.wait_for(lambda m: len(m) == 2)] == [
            "Pause",
            "Resume",
        ]
        assert [m.message_key for m in client.sent] == [f"k{s}" for s in range(1, 141)]
        assert source.reads == 3
    finally:
        outbound.stop()
