"""Forwarding upstream against two real brokers: source -> fxgate -> upstream, and the table."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter

import psutil
import pytest

from actors.buffer import TierTwoBuffer
from actors.clock import RealClock, SimulatedClock
from actors.config.routes import DEFAULT_TARGET, Route
from actors.config.schema import load_config
from actors.devtools.simulate import expected_read_ids, simulate
from actors.ledger import LedgerRecord
from actors.messages import (
    Committed,
    Demand,
    Forwarded,
    ForwardRecorded,
    Grant,
    Pack,
    PackSealed,
    SessionEnded,
    SessionStarted,
)
from actors.mqtt.upstream import IDEMPOTENCY_PROPERTY, AckType, OutboundAck
from actors.outbound import OutboundLedger
from actors.supervisor import Supervisor
from spark.report import compare, landed_ids_spark
from tests.harness.checks import wait_until, wait_until_landed
from tests.harness.inbox import Inbox
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


@pytest.mark.parametrize(
    ("qos", "process"),
    [(0, "shared"), (1, "shared"), (2, "shared"), (1, "own"), (2, "own")],
)
def test_every_read_reaches_upstream_once_in_order_and_lands_in_the_table(
    forwarding_gateway, brokers, spark_session, qos, process
):
    source, upstream = brokers
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    try:
        gateway = forwarding_gateway(qos=qos, FXGATE__UPSTREAM__PROCESS=process)
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
        # Status shows the leg's actors wherever they run (a child reports every second).
        assert wait_until(lambda: gateway.status()["outbound"]["forwarded"] >= 1000, 30)
        assert gateway.status()["upstream"]["state"] == "connected"
    finally:
        cloud.close()


PUBLISH_LINE = re.compile(
    r"Received PUBLISH from (\S+) \(d(\d), q\d, r\d, m(\d+), '([^']+)', \.\.\. \((\d+) bytes\)"
)


@pytest.mark.parametrize("process", ["shared", "own"])
@pytest.mark.parametrize("point", ["after_publish_before_pubrec", "after_pubrec_before_pubcomp"])
def test_a_kill_mid_qos2_exchange_upstream_resends_the_same_packet_ids_and_delivers_once(
    point, process, mosquitto_factory, daemon_factory, tmp_path
):
    """With the forward leg in its own process the crash point, reached there, kills the daemon
    with it: the whole gateway dies at the point, as in one process."""
    source = mosquitto_factory()
    upstream = mosquitto_factory(debug_log=True)
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    data = tmp_path / "data"
    env = forwarding_environ(source, upstream, data, qos=2, FXGATE__UPSTREAM__PROCESS=process)
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


def reads_of(fake):
    """What the fake upstream received on the readers' route (not the life-cycle events)."""
    return [r for r in fake.received if r.topic.startswith("cloud/")]


def test_a_pubrec_refusing_with_quota_exceeded_is_retried_not_reported_delivered(
    mosquitto, spark_session, tmp_path
):
    from tests.harness.fake_broker import FakeBroker
    from tests.harness.mqtt import publish_all

    with FakeBroker() as fake:
        # Only the read is refused: the gateway's own life-cycle events go upstream too.
        fake.reply_publish([0x97], topic_filter="cloud/#")
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
            assert fake.wait_for(lambda f: len(reads_of(f)) >= 2, 30)
            assert gateway.wait_for_landed(1, timeout=60)
            stats = gateway.status()["outbound"]
        finally:
            gateway.stop()
            clock.close()
        refused, accepted = reads_of(fake)[:2]
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
        # The table does not wait for the cloud (DESIGN §7.1): every read lands meanwhile.
        assert gateway.wait_for_landed(600, timeout=60)
        assert cloud.messages == []  # and none of them reached upstream yet
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


class OneByOne:
    """The batch sends of the upstream client, as the single sends a fake client records."""

    def send_publishes(self, epoch, messages):
        return all([self.send_publish(epoch, m) for m in messages])

    def send_pubrels(self, epoch, packet_ids):
        return all([self.send_pubrel(epoch, p) for p in packet_ids])


class AckingClient(OneByOne):
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


def records_of(count, start=1, size=100, topic="zebra/fx/r1/reads"):
    return tuple(
        LedgerRecord(seq, f"k{seq}", topic, b"x" * size, 1, 0.0, None, to_upstream=True)
        for seq in range(start, start + count)
    )


class FakeLedger(Inbox):
    """The inbound ledger as tier 2 sees it: it feeds records from its log up to the window's
    limits (actors.feed), a payload's bytes allowed to overshoot by one record."""

    def __init__(self, log=()):
        super().__init__()
        self.log = list(log)
        self.buffer = None
        self.limit = self.limit_bytes = self.handed = self.handed_bytes = 0

    def tell(self, message):
        super().tell(message)
        if isinstance(message, Grant):
            with self.cond:
                self.limit = max(self.limit, message.limit)
                self.limit_bytes = max(self.limit_bytes, message.limit_bytes)
            self._feed()

    def connect(self, buffer):
        self.buffer = buffer
        self._feed()

    def _feed(self):
        with self.cond:
            if self.buffer is None:
                return
            taken = []
            while self.log and self.handed < self.limit and self.handed_bytes < self.limit_bytes:
                record = self.log.pop(0)
                self.handed += 1
                self.handed_bytes += record.size
                taken.append(record)
        if taken:
            self.buffer.tell(Committed(tuple(taken)))


def test_a_long_outage_keeps_tier2_within_its_caps_and_never_pauses_the_source(tmp_path):
    clock = SimulatedClock()
    ledger = FakeLedger(records_of(140))
    route = (Route(0, "zebra/fx/+/reads"),)
    outbound = OutboundLedger.start(
        tmp_path / "outbound.sqlite", clock, ledger, route, "env", processing_timeout=20.0
    )
    buffer = TierTwoBuffer.start(
        outbound, ledger, route, max_messages=100, max_bytes=10**6, low_watermark=0.5, pack_size=10
    )
    try:
        ledger.connect(buffer)
        outbound.proxy().set_buffer(buffer).get(timeout=5)
        # Tier 2 took its cap of 100 and handed the first pack of 10 to the outbound ledger
        # (unsent: no connection) and the next one to keep at hand; it takes more only at its
        # low watermark, so the rest waits in tier 1.
        assert wait_until(lambda: buffer.proxy().status().get(timeout=5)["tier2_messages"] == 80)
        # An hour of outage on the clock: pack timeouts come and go, nothing is lost or sent.
        for _ in range(180):
            clock.advance(20.0)
        status = buffer.proxy().status().get(timeout=5)
        assert (status["tier2_messages"], status["tier2_peak_messages"]) == (80, 100)
        assert len(ledger.log) == 40
        assert not [m for m in ledger.messages if type(m).__name__ in ("Pause", "Resume")]

        client = AckingClient()
        client.actor = outbound
        outbound.proxy().set_client(client).get(timeout=5)
        outbound.tell(SessionStarted(epoch=1, session_present=True, receive_maximum=20))
        reports = ledger.wait_for(lambda m: sum(len(x.done) for x in _reports(m)) == 140)
        assert [seq for r in _reports(reports) for seq in r.done] == list(range(1, 141))
        assert [m.message_key for m in client.sent] == [f"k{s}" for s in range(1, 141)]
        assert buffer.proxy().status().get(timeout=5)["tier2_peak_messages"] == 100
    finally:
        buffer.stop()
        outbound.stop()


def _reports(messages):
    return [m for m in messages if isinstance(m, Forwarded)]


def test_a_byte_cap_that_binds_first_never_stalls_the_feed():
    """Payloads of 100 bytes under a 1,000-byte cap: the bytes run out long before the message
    cap. Each pack handed out must open the window again (an additive credit stalled here)."""
    ledger, outbound = FakeLedger(records_of(95)), Inbox()
    buffer = TierTwoBuffer.start(
        outbound,
        ledger,
        (Route(0, "zebra/fx/+/reads"),),
        max_messages=100,
        max_bytes=1000,
        low_watermark=0.5,
        pack_size=10,
    )
    try:
        ledger.connect(buffer)
        for round_ in range(1, 11):
            buffer.tell(Demand())
            outbound.wait_for(round_)
        packs = [m.pack for m in outbound.messages]
        assert [r.seq for p in packs for r in p.records] == list(range(1, 96))
        assert buffer.proxy().status().get(timeout=5)["tier2_peak_messages"] <= 10
    finally:
        buffer.stop()


def test_tier2_hands_the_outbound_full_packs_from_a_backlog_and_a_trickle_at_once():
    ledger, outbound = FakeLedger(records_of(25)), Inbox()
    buffer = TierTwoBuffer.start(
        outbound, ledger, (Route(0, "zebra/fx/+/reads"),), max_messages=100, pack_size=10
    )
    try:
        ledger.connect(buffer)
        assert wait_until(lambda: buffer.proxy().status().get(timeout=5)["tier2_messages"] == 25)
        for _ in range(3):
            buffer.tell(Demand())
        packs = [m.pack for m in outbound.wait_for(3)]
        assert [len(p.records) for p in packs] == [10, 10, 5]
        assert [r.seq for p in packs for r in p.records] == list(range(1, 26))
        buffer.tell(Demand())
        buffer.tell(Committed(records_of(1, start=26)))
        (_, _, _, trickle) = outbound.wait_for(4)
        assert [r.seq for r in trickle.pack.records] == [26]
    finally:
        buffer.stop()


class ScriptedClient(OneByOne):
    """An upstream client that records what it is asked to send and answers as scripted:
    answer = None (never), "PUBACK", "PUBREC"."""

    def __init__(self, answer=None):
        self.actor = None
        self.answer = answer
        self.sent = []  # ("PUBLISH", packet_id, dup, message_key, expiry) | ("PUBREL", packet_id)
        self.cond = threading.Condition()

    def send_publish(self, epoch, message):
        with self.cond:
            self.sent.append(
                (
                    "PUBLISH",
                    message.packet_id,
                    message.dup,
                    message.message_key,
                    message.expiry_interval,
                )
            )
            self.cond.notify_all()
        if self.answer:
            kind = AckType.PUBACK if self.answer == "PUBACK" else AckType.PUBREC
            self.actor.tell(OutboundAck(epoch, message.packet_id, kind, 0, "Success"))
        return True

    def send_pubrel(self, epoch, packet_id):
        with self.cond:
            self.sent.append(("PUBREL", packet_id))
            self.cond.notify_all()
        return True

    def wait_sent(self, count, timeout=10):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.sent) >= count, timeout), self.sent
            return list(self.sent)


@pytest.fixture
def outbound_with(tmp_path):
    started = []

    def start(
        client=None,
        qos=1,
        packs=(),
        connected=True,
        receive_maximum=65535,
        target=DEFAULT_TARGET,
        **options,
    ):
        clock = SimulatedClock()
        writer = Inbox()
        options.setdefault("processing_timeout", 20.0)
        ref = OutboundLedger.start(
            tmp_path / "outbound.sqlite",
            clock,
            writer,
            (Route(0, "zebra/fx/+/reads", target, qos=qos),),
            "env",
            **options,
        )
        started.append(ref)
        if client is not None:
            client.actor = ref
            ref.proxy().set_client(client).get(timeout=5)
        if connected:
            ref.tell(SessionStarted(1, True, receive_maximum))
        for pack in packs:
            ref.tell(PackSealed(pack))
        return ref, clock, writer

    yield start
    for ref in started:
        ref.stop()


def test_the_next_pack_waits_at_hand_and_goes_out_only_once_the_current_one_is_acknowledged(
    outbound_with,
):
    client = ScriptedClient(answer=None)
    ref, _, _ = outbound_with(client)
    buffer = Inbox()
    ref.proxy().set_buffer(buffer).get(timeout=5)
    assert buffer.wait_for(2) == [Demand(), Demand()]  # the pack to forward and the next
    first, second = packs_of(2, 5)
    ref.tell(PackSealed(first))
    ref.tell(PackSealed(second))
    sent = client.wait_sent(5)
    # The window has room for all ten: the second pack still waits for the first.
    assert ref.proxy().status().get(timeout=5)["in_flight"] == 5
    assert [key for _, _, _, key, _ in client.sent] == [f"k{s}" for s in range(1, 6)]
    assert len(buffer.messages) == 2
    for _, packet_id, _, _, _ in sent:
        ref.tell(OutboundAck(1, packet_id, AckType.PUBACK, 0, "Success"))
    client.wait_sent(10)
    assert [key for _, _, _, key, _ in client.sent] == [f"k{s}" for s in range(1, 11)]
    # The first pack finished: one more is asked for, to be at hand after the second.
    assert buffer.wait_for(3)[2] == Demand()
    assert len(client.sent) == 10


def test_no_more_than_the_brokers_receive_maximum_is_ever_in_flight(outbound_with):
    client = ScriptedClient(answer=None)
    ref, _, _ = outbound_with(client, packs=packs_of(1, 50), receive_maximum=5)
    client.wait_sent(5)
    assert ref.proxy().status().get(timeout=5)["in_flight"] == 5
    assert len(client.sent) == 5


def test_retry_all_gives_the_unacknowledged_their_retries_then_dead_letters_them(
    outbound_with,
):
    client = ScriptedClient(answer=None)
    ref, clock, writer = outbound_with(client, packs=packs_of(1, 2), retries=3)
    client.wait_sent(2)
    for _ in range(3):
        assert clock.wait_for_timers(1)
        clock.advance(20.0)
    # Not sent again on the live connection (MQTT 5 §4.4; HiveMQ CE counts a copy against its
    # Receive Maximum until the connection ends: actors/outbound.py, `_give_up_expired_live`).
    assert ref.proxy().status().get(timeout=5)["retries"] == 3
    assert len(client.sent) == 2
    clock.advance(20.0)
    (report,) = writer.wait_for(lambda m: len(m) == 1)
    assert report.dead == ((1, "forward_failed"), (2, "forward_failed"))
    assert report.done == () and report.reply_to == ref
    assert ref.proxy().status().get(timeout=5)["dead"] == 2


def test_an_upstream_outage_does_not_count_against_the_packs_retries(outbound_with):
    client = ScriptedClient(answer=None)
    ref, clock, writer = outbound_with(client, packs=packs_of(1, 2), retries=1)
    client.wait_sent(2)
    assert clock.wait_for_timers(1)
    ref.tell(SessionEnded(1, "connection lost"))
    # Ten processing timeouts of outage: nothing is given up on, nothing is even timed.
    ref.proxy().status().get(timeout=5)
    for _ in range(10):
        clock.advance(20.0)
    assert ref.proxy().status().get(timeout=5)["dead"] == 0
    assert clock.pending() == 0
    assert writer.messages == []

    ref.tell(SessionStarted(2, True, 65535))
    resent = client.wait_sent(4)[-2:]
    assert [d for _, _, d, *_ in resent] == [True, True]
    # Connected again, the pack's own budget applies: one retry, then dead letters.
    assert clock.wait_for_timers(1)
    clock.advance(20.0)
    assert ref.proxy().status().get(timeout=5)["retries"] == 1
    assert clock.wait_for_timers(1)
    clock.advance(20.0)
    (report,) = writer.wait_for(lambda m: len(m) == 1)
    assert [reason for _, reason in report.dead] == ["forward_failed"] * 2


def test_a_refused_message_sent_again_is_stored_in_flight_not_refused(outbound_with, tmp_path):
    client = ScriptedClient(answer=None)
    ref, clock, _ = outbound_with(client, packs=packs_of(1, 1))
    (first,) = client.wait_sent(1)
    ref.tell(OutboundAck(1, first[1], AckType.PUBACK, 0x97, "Quota exceeded"))
    assert clock.wait_for_timers(1)
    clock.advance(20.0)  # RETRY_ALL: the refused message goes again, with a new packet id
    again = client.wait_sent(2)[-1]
    ref.proxy().status().get(timeout=5)
    with sqlite3.connect(tmp_path / "outbound.sqlite") as db:
        rows = db.execute("SELECT state, packet_id, attempts FROM outbound").fetchall()
    # Refused, then sent again: the row says in flight, with the new id, second attempt.
    assert rows == [("publish", again[1], 2)]


def test_skip_all_dead_letters_what_is_unacknowledged_at_the_first_timeout(outbound_with):
    client = ScriptedClient(answer=None)
    _, clock, writer = outbound_with(client, packs=packs_of(1, 3), ack_strategy="SKIP_ALL")
    client.wait_sent(3)
    assert clock.wait_for_timers(1)
    clock.advance(20.0)
    (report,) = writer.wait_for(lambda m: len(m) == 1)
    assert report.dead == ((1, "forward_failed"), (2, "forward_failed"), (3, "forward_failed"))
    assert len(client.sent) == 3  # nothing re-sent


def test_an_expired_message_is_not_forwarded_and_the_rest_carries_its_remaining_interval(
    outbound_with,
):
    client = ScriptedClient(answer="PUBACK")
    clock_now = SimulatedClock().wall()  # both clocks start at the same wall time
    expired = LedgerRecord(1, "old", "zebra/fx/r1/reads", b"x", 1, 0.0, 0, None, clock_now - 1)
    fresh = LedgerRecord(2, "new", "zebra/fx/r1/reads", b"y", 1, 0.0, 0, None, clock_now + 30)
    _, _, writer = outbound_with(client, packs=[Pack(0, (expired, fresh))])
    (report,) = writer.wait_for(lambda m: len(m) == 1)
    assert (report.done, report.dead) == ((2,), ((1, "expired"),))
    assert [(key, expiry) for _, _, _, key, expiry in client.sent] == [("new", 30)]


def test_without_a_session_pending_pubrels_become_publishes_again(outbound_with):
    client = ScriptedClient(answer="PUBREC")
    ref, _, _ = outbound_with(client, qos=2, packs=packs_of(1, 1))
    assert [kind for kind, *_ in client.wait_sent(2)] == ["PUBLISH", "PUBREL"]
    ref.tell(SessionStarted(2, session_present=False, receive_maximum=65535))
    sent = client.wait_sent(3)
    assert sent[2][0] == "PUBLISH" and sent[2][3] == "k1"
    assert ref.proxy().status().get(timeout=5)["possible_duplicates"] == 1


@pytest.mark.parametrize(("overflow", "kept"), [("drop_new", [1, 10]), ("drop_oldest", [21, 30])])
def test_a_full_tier2_drops_qos0_by_policy_and_reports_every_drop(overflow, kept):
    # Nobody takes packs (upstream down); tier 2 holds 10, the other 20 QoS 0 messages overflow.
    outbound = Inbox()
    ledger = FakeLedger(records_of(30))
    route = (Route(0, "zebra/fx/+/reads", qos=0),)
    buffer = TierTwoBuffer.start(outbound, ledger, route, max_messages=10, overflow=overflow)
    try:
        ledger.connect(buffer)
        reports = ledger.wait_for(lambda m: sum(len(r.dead) for r in _reports(m)) == 20)
        dead = [entry for r in _reports(reports) for entry in r.dead]
        assert {reason for _, reason in dead} == {"overflow_dropped"}
        assert buffer.proxy().status().get(timeout=5)["dropped_qos0"] == 20
        assert buffer.proxy().status().get(timeout=5)["tier2_peak_messages"] == 10
        buffer.tell(Demand())
        (handed,) = outbound.wait_for(1)
        assert [handed.pack.records[0].seq, handed.pack.records[-1].seq] == kept
        assert sorted(seq for seq, _ in dead) == sorted(
            set(range(1, 31)) - set(range(kept[0], kept[1] + 1))
        )
    finally:
        buffer.stop()


def test_with_persist_qos0_a_full_tier2_keeps_qos0_waiting_in_tier1(tmp_path):
    outbound = Inbox()
    ledger = FakeLedger(records_of(30))
    route = (Route(0, "zebra/fx/+/reads", qos=0),)
    buffer = TierTwoBuffer.start(
        outbound, ledger, route, max_messages=10, persist_qos0=True, pack_size=10
    )
    try:
        ledger.connect(buffer)
        assert wait_until(lambda: buffer.proxy().status().get(timeout=5)["tier2_messages"] == 10)
        status = buffer.proxy().status().get(timeout=5)
        assert (status["dropped_qos0"], len(ledger.log)) == (0, 20)
        for _ in range(3):
            buffer.tell(Demand())
        handed = outbound.wait_for(3)
        assert [r.seq for m in handed for r in m.pack.records] == list(range(1, 31))
        assert not _reports(ledger.messages)
    finally:
        buffer.stop()


def test_persist_false_downgrades_to_qos0_with_a_warning_and_still_delivers(
    forwarding_gateway, brokers, caplog
):
    source, upstream = brokers
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    try:
        forwarding_gateway(qos=2, FXGATE__ROUTES__0__PERSIST="false")
        assert "persist = false downgrades QoS 2 to 0" in caplog.text
        result = simulate(source.host, source.port, readers=1, rate=0, count=50, qos=1)
        messages = cloud.wait_for(50)
        assert len(messages) == 50
        assert cloud.qos_seen == {0}
        assert len(result.published) == 50
    finally:
        cloud.close()


def test_the_flapping_sequence_delivers_m2_m3_m4_in_order_each_once_at_qos2(
    brokers, spark_session, tmp_path
):
    """HiveMQ Edge's flapping case: M1 acked, M2 sent then cut before its ack, M3 buffered while
    down, M4 new after the reconnect."""
    from tests.harness.mqtt import publish_all
    from tests.harness.proxy import FaultProxy

    source, upstream = brokers
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    topic = "zebra/fx/fx9600-09/reads"

    def read(n):
        return GOOD_READ.replace(b'"eventNum": 7', b'"eventNum": %d' % n)

    with FaultProxy(upstream.host, upstream.port) as proxy:
        environ = forwarding_environ(source, upstream, tmp_path / "data", qos=2)
        environ["FXGATE__UPSTREAM__PORT"] = str(proxy.port)
        config = load_config(None, environ=environ, hostname="gw-test")
        clock = RealClock()
        gateway = Supervisor(config, clock, session_factory=lambda: spark_session)
        gateway.start()
        try:
            assert source.wait_for_output("fxgate-local-gw-test-gw-test 2 zebra/fx", 15)
            publish_all(source.host, source.port, [(topic, read(1))], qos=2)
            assert len(cloud.wait_for(1)) == 1
            proxy.stall()  # M2 leaves fxgate but never reaches the broker
            publish_all(source.host, source.port, [(topic, read(2))], qos=2)
            assert wait_until(lambda: gateway.status()["outbound"]["in_flight"] == 1)
            proxy.refuse()
            proxy.cut()  # the link drops before M2's PUBREC; reconnects are refused
            publish_all(source.host, source.port, [(topic, read(3))], qos=2)  # buffered
            proxy.accept()
            proxy.resume()
            assert proxy.wait_for_connections(2, 30)
            publish_all(source.host, source.port, [(topic, read(4))], qos=2)
            messages = cloud.wait_for(4)
            assert gateway.wait_for_landed(4, timeout=60)
        finally:
            gateway.stop()
            clock.close()
    cloud.close()
    assert [payload for _, payload, _ in messages] == [read(1), read(2), read(3), read(4)]


@pytest.mark.parametrize("process", ["shared", "own"])
def test_a_restart_with_reads_in_tier1_and_in_flight_delivers_each_once_in_order(
    process, mosquitto_factory, daemon_factory, tmp_path
):
    source = mosquitto_factory()
    upstream = mosquitto_factory()
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    data = tmp_path / "data"
    env = forwarding_environ(
        source,
        upstream,
        data,
        qos=2,
        FXGATE__BUFFER__MAX_MESSAGES="100",  # most of what waits is in tier 1, not tier 2
        FXGATE__UPSTREAM__PROCESS=process,
    )
    try:
        upstream.stop()
        first = daemon_factory(env)
        first.wait_for_log(r"source: subscribed", timeout=60)
        result = simulate(source.host, source.port, readers=2, rate=0, count=300, qos=2)
        first.wait_for_log(r"the upstream's backlog waits in tier 1", timeout=60)
        first.kill()
        upstream.start()
        second = daemon_factory(env)
        wait_until_landed(second, data, 600)
        # The table does not wait for the upstream: once upstream has every read too, the
        # status file (rewritten every second) comes to say nothing is in flight.
        cloud.wait_for(600)
        said: list[str] = []

        def settled() -> bool:
            said.append(fxgate_status(env))
            return "forwarding: 0 in flight (window 20)" in said[-1]

        wait_until(settled, timeout=30, interval=0.5)
        status = said[-1]
        assert "upstream:   connected as fxgate-upstream-" in status
        assert "forwarding: 0 in flight (window 20)" in status
        assert "reads 600 rows" in status
        assert second.terminate() == 0
        messages = cloud.wait_for(600)
    finally:
        cloud.close()
    keys = [props[IDEMPOTENCY_PROPERTY] for _, _, props in messages]
    assert Counter(keys) == Counter(r.message_key for r in result.published)
    for reader in ("fx9600-01", "fx9600-02"):
        sent = [r.message_key for r in result.published if reader in r.topic]
        got = [props[IDEMPOTENCY_PROPERTY] for t, _, props in messages if t.endswith(reader)]
        assert got == sent


def fxgate_status(env) -> str:
    """What `fxgate status` prints for the daemon of `env`."""
    return subprocess.run(
        [sys.executable, "-m", "actors.app.cli", "status"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


FORWARD_STARTED = r"forward process started \(pid (\d+)\)"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_forward_process_ends_with_a_killed_daemon(mosquitto_factory, daemon_factory, tmp_path):
    source, upstream = mosquitto_factory(), mosquitto_factory()
    env = forwarding_environ(source, upstream, tmp_path / "data", FXGATE__UPSTREAM__PROCESS="own")
    daemon = daemon_factory(env)
    child = int(daemon.wait_for_log(FORWARD_STARTED).group(1))
    daemon.wait_for_log(r"source: subscribed", timeout=60)
    assert child in daemon.remember_children()
    daemon.kill()
    assert wait_until(lambda: _gone(child), 30), "the forward process outlived the daemon"


def test_a_killed_forward_process_is_restarted_and_every_read_arrives_once(
    mosquitto_factory, daemon_factory, tmp_path
):
    """SIGKILL of the child alone, mid-stream at QoS 2: the daemon restarts its actors and a new
    child, which re-sends what was in flight with the same packet ids; each read arrives once
    upstream and lands once."""
    source, upstream = mosquitto_factory(), mosquitto_factory()
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    data = tmp_path / "data"
    env = forwarding_environ(source, upstream, data, qos=2, FXGATE__UPSTREAM__PROCESS="own")
    try:
        daemon = daemon_factory(env)
        child = int(daemon.wait_for_log(FORWARD_STARTED).group(1))
        daemon.wait_for_log(r"source: subscribed", timeout=60)
        published: list = []
        sender = threading.Thread(
            target=lambda: published.append(
                simulate(source.host, source.port, readers=2, rate=400, count=300, qos=2)
            )
        )
        sender.start()
        try:
            assert len(cloud.wait_for(50)) >= 50
            mark = daemon.mark()
            os.kill(child, signal.SIGKILL)
            daemon.wait_for_log(r"actor forward died.*restarting all actors", after=mark)
            daemon.wait_for_log(
                rf"the forward process \(pid {child}\) had ended: exit status -9", after=mark
            )
            second = int(daemon.wait_for_log(FORWARD_STARTED, after=mark).group(1))
            assert second != child
        finally:
            sender.join(60)
        (result,) = published
        assert result.failed == 0
        wait_until_landed(daemon, data, 600)
        messages = cloud.wait_for(600)
        assert daemon.terminate() == 0
    finally:
        cloud.close()
    keys = Counter(props[IDEMPOTENCY_PROPERTY] for _, _, props in messages)
    assert keys == Counter(r.message_key for r in result.published)


def test_after_a_reconnect_resends_respect_a_smaller_receive_maximum(outbound_with):
    client = ScriptedClient(answer=None)
    ref, _, _ = outbound_with(client, packs=packs_of(1, 10), receive_maximum=20)
    first = client.wait_sent(10)
    ref.tell(SessionStarted(2, session_present=True, receive_maximum=3))
    resent = client.wait_sent(13)[10:]
    assert [(pid, dup) for _, pid, dup, *_ in resent] == [(p, True) for _, p, *_ in first[:3]]
    ref.proxy().status().get(timeout=5)  # nothing more was sent meanwhile
    assert len(client.sent) == 13
    ref.tell(OutboundAck(2, first[0][1], AckType.PUBACK, 0, "Success"))
    (next_one,) = client.wait_sent(14)[13:]
    assert next_one[1:3] == (first[3][1], True)


def test_life_cycle_events_reach_the_upstream_broker_on_their_own_topic(
    forwarding_gateway, brokers
):
    _, upstream = brokers
    events = Collector(upstream.host, upstream.port, "fxgate/+/+/lifecycle", qos=1)
    try:
        gateway = forwarding_gateway(qos=1)
        source_id = gateway.config.identity.client_id
        upstream_id = gateway.config.identity.upstream_client_id
        # Each client: created-or-updated, then connected.
        messages = events.wait_for(4)
    finally:
        events.close()
    by_topic = {}
    for topic, payload, props in messages:
        event = json.loads(payload)
        by_topic.setdefault(topic, []).append(event["type"].rsplit(".", 1)[1])
        # Forwarded like a read: with its idempotency key.
        assert IDEMPOTENCY_PROPERTY in props
    assert set(by_topic) == {
        f"fxgate/local-gw-test/{source_id}/lifecycle",
        f"fxgate/local-gw-test/{upstream_id}/lifecycle",
    }
    for kinds in by_topic.values():
        assert "MQTTClientSessionConnected" in kinds


def test_an_upstream_topic_mqtt_cannot_carry_is_dead_lettered_and_the_pack_goes_on(
    outbound_with,
):
    """`x/{topic}` on a topic near MQTT's 65,535-byte limit renders one past it: encoding it
    would raise in the actor at every start; it is given up on and the pack behind it flows."""
    long_topic = "zebra/fx/" + "r" * 65_520 + "/reads"
    records = (
        LedgerRecord(1, "k1", long_topic, b"x", 1, 0.0, 0),
        LedgerRecord(2, "k2", "zebra/fx/r1/reads", b"y", 1, 0.0, 0),
    )
    client = ScriptedClient(answer="PUBACK")
    ref, _, writer = outbound_with(client, packs=[Pack(0, records)], target="x/{topic}")
    (report,) = writer.wait_for(1)
    assert (report.done, report.dead) == ((2,), ((1, "invalid_topic"),))
    assert [key for _, _, _, key, _ in client.sent] == ["k2"]
    assert ref.is_alive()


def test_a_message_the_ledger_marked_dead_is_not_forwarded(outbound_with):
    """The inbound ledger marks a message whose topic was not UTF-8 (`invalid_topic`): it lands
    in the table as that dead letter, never goes upstream, and is done for the upstream."""
    records = (
        LedgerRecord(1, "k1", "zebra/fx/r\ufffd1/reads", b"x", 1, 0.0, 0, "invalid_topic"),
        LedgerRecord(2, "k2", "zebra/fx/r1/reads", b"y", 1, 0.0, 0),
    )
    client = ScriptedClient(answer="PUBACK")
    _, _, writer = outbound_with(client, packs=[Pack(0, records)])
    (report,) = writer.wait_for(1)
    assert (report.done, report.dead) == ((1, 2), ())
    assert [key for _, _, _, key, _ in client.sent] == ["k2"]


def test_finished_rows_stay_until_the_ledger_recorded_them_and_are_reported_again_at_start(
    outbound_with, tmp_path
):
    """A kill between the report and the ledger's commit must not forward the message again:
    its row stays here, and the next start reports it once more."""
    client = ScriptedClient(answer="PUBACK")
    ref, _, ledger = outbound_with(client, packs=packs_of(1, 2))
    (report,) = ledger.wait_for(1)
    assert report.done == (1, 2)
    ref.proxy().status().get(timeout=5)
    with sqlite3.connect(tmp_path / "outbound.sqlite") as db:
        assert db.execute("SELECT seq, state FROM outbound ORDER BY seq").fetchall() == [
            (1, "acked"),
            (2, "acked"),
        ]
    ref.stop()
    again, _, ledger = outbound_with(client, connected=False)
    (report,) = ledger.wait_for(1)
    assert (report.done, report.reply_to) == ((1, 2), again)
    again.tell(ForwardRecorded((1, 2)))
    again.proxy().status().get(timeout=5)
    with sqlite3.connect(tmp_path / "outbound.sqlite") as db:
        assert db.execute("SELECT count(*) FROM outbound").fetchone() == (0,)
