"""The core guarantees (DESIGN §3) against each real broker the harness starts: mosquitto 2.0.11,
HiveMQ CE (embedded) and Mochi MQTT v2, side by side so that the matrix is visible in one place.

Two scenarios per broker, each combining several guarantees so that the matrix stays cheap (the
gateways land with pyarrow, delta-rs, and no JVM; one Spark session for the whole run audits):

1. Gateways in one shared group (two; three on HiveMQ), landing into the group's one table
   (DESIGN §7.12), QoS 1 and QoS 2 readers, each gateway forwarding at QoS 2 to the same
   broker: a SIGKILL of a gateway while reads arrive; it stays down while more are published
   and the broker restarts, then comes back. The group's table, read by delta-rs and DuckDB in
   other processes, must equal what the publishers got acknowledged, each read once, whatever
   the broker did with the killed member's reads; the upstream must hold every read (same
   packet ids after the kill, DESIGN §3.2); and the audit of the one table must find nothing
   missing.
2. The broker at its shipped queue limit: an upstream outage for the whole test while readers
   publish three times that limit loses nothing (the ledger is the buffer, §2); then the gateway
   holds its acks (SIGSTOP) past the limit, the broker drops, and the audit names exactly the
   eventNums the table lacks (§3.8).

The oracle is the publishers' own record (what the broker acknowledged to them), never the
gateway's. Where a broker breaks a guarantee, the test first checks the measured shape of the
break and then xfails with its reason (the constants below hold the measurements); where a broker
cannot produce a case at all, it skips, saying why.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from actors.devtools.broker_process import free_port
from actors.devtools.mosquitto import SHIPPED_LIMITS
from actors.devtools.simulate import (
    PublishedRecord,
    TagEventGenerator,
    expected_read_ids,
    simulate,
)
from actors.mqtt.upstream import IDEMPOTENCY_PROPERTY
from persistence.keys import message_key
from spark.audit import audit_tables
from spark.report import compare, landed_ids_arrow
from spark.tables import READS, read_table_arrow, table_path
from tests.actors.test_audit_end_to_end import runs, stopped
from tests.actors.test_several_gateways import (
    Gateway,
    Publishing,
    shares,
    wait_until_table_holds,
)
from tests.harness.checks import settled, wait_until_landed, wait_until_landed_union
from tests.harness.daemon import gateway_env
from tests.harness.delta_readers import read_once
from tests.harness.mqtt import Collector

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

KINDS = ("mosquitto", "hivemq", "mochi")
# Each broker as operators run it. The fixture's mosquitto holds far more than its shipped
# 1,000 on purpose (actors/devtools/mosquitto.py); HiveMQ's and Mochi's fixtures are shipped.
SHIPPED = {"mosquitto": SHIPPED_LIMITS, "hivemq": {}, "mochi": {}}

GROUP = "fxgate"
ENVIRONMENT = "env-a"


def restart(broker) -> None:
    """A broker restart that keeps every session and queued message it acknowledged: a graceful
    stop (SIGTERM) and a start, for each broker, because a SIGKILL loses acknowledged reads in
    each of them, measured:

    - mosquitto saves its state only at a graceful stop or an autosave: a SIGKILL between two
      saves loses what came since (tests/harness/test_brokers.py).
    - HiveMQ CE: a plain paho member of a shared group (persistent session, connected) after a
      SIGKILL and a restart reconnected with its session present and its SUBSCRIBE to
      $share/g/t/# granted again, and got none of 5 reads published then (5 of 5 after a
      graceful stop); with the gateways here, all 160 reads published after the restart lost.
    - Mochi v2.7.9 writes a QoS 1 PUBACK (a QoS 2 PUBREC) before it stores the message for the
      subscribers (server.go processPublish: WritePacket(ack), then publishToSubscribers, whose
      Pebble write is the OnQosPublish hook): SIGKILLed right after the readers' last acks, it
      lost the last read of one reader (down-q1-fx9600-02 #40 of 40), which no gateway ever got.
    """
    broker.stop()
    broker.start()


def forwarding_to(broker, qos: int, **extra: str) -> dict[str, str]:
    return {
        "FXGATE__UPSTREAM__HOST": broker.host,
        "FXGATE__UPSTREAM__PORT": str(broker.port),
        "FXGATE__UPSTREAM__RECONNECT_MIN_DELAY_SECONDS": "0.2",
        "FXGATE__UPSTREAM__RECONNECT_MAX_DELAY_SECONDS": "1.0",
        "FXGATE__ROUTES__0__SOURCE": "zebra/fx/+/reads",
        "FXGATE__ROUTES__0__TARGET": "cloud/{environment}/{reader}",
        "FXGATE__ROUTES__0__QOS": str(qos),
        **extra,
    }


def member_env(broker, data: Path, instance: str, tables: Path) -> dict[str, str]:
    return {
        **gateway_env(broker, data),
        "FXGATE__SPARK__TABLES_DIR": str(tables),
        "FXGATE__SOURCE__ENVIRONMENT_ID": ENVIRONMENT,
        "FXGATE__SOURCE__INSTANCE_ID": instance,
        "FXGATE__SOURCE__SHARED_SUBSCRIPTION_GROUP": GROUP,
        "FXGATE__SOURCE__RECONNECT_MIN_DELAY_SECONDS": "0.2",
        "FXGATE__SOURCE__RECONNECT_MAX_DELAY_SECONDS": "1.0",
        # The upstream is the same broker: each read goes back to it on cloud/..., at QoS 2.
        **forwarding_to(broker, qos=2),
    }


SUBSCRIBED = r"source: subscribed to \$share/fxgate-env-a/"
# What the daemon's output shows when the upstream connection's network thread died.
UPSTREAM_THREAD_DIED = r"Exception in thread paho-mqtt-client-fxgate-upstream"
# Measured with HiveMQ CE: a SUBSCRIBE to $share/g/t/# at QoS 2 is granted QoS 1 (t/# at QoS 2 is
# granted 2), and the QoS 1 reads in flight to a member that is SIGKILLed are sent at once to the
# other member (MQTT 5 §4.8.2 allows it), although the killed one had committed them to its
# ledger: it lands them at its restart, the other lands them too. With a table per member the
# union held them twice (9 reads in one run); the group's one table holds them once, and the
# member that lands second says so ("already landed by another member"). Upstream, each member
# forwards what it received: such a read goes up once from each (ALREADY_LANDED counts them).
ALREADY_LANDED = r"table reads: (\d+) of \d+ row\(s\) already landed by another member"
# After a graceful restart HiveMQ CE (6-20 reads in seven runs) and Mochi 2.7.9 (3) delivered QoS
# 2 reads to the cloud subscriber twice, each table holding them once. Located on the wire
# (tests/brokers/test_restart_qos2.py): each broker loses QoS 2 state across its restart, HiveMQ
# the packet ids it received from fxgate and had not been released from (it takes fxgate's DUP
# re-send for a new message), Mochi that the subscriber had PUBRECed (it re-sends the PUBLISH,
# not the PUBREL). mosquitto keeps both.
RESTART_QOS2 = {
    "hivemq": "HiveMQ CE delivered QoS 2 reads cut by its graceful restart to the cloud "
    "subscriber twice: it keeps the ids of QoS 2 PUBLISHes it has not been released from in "
    "memory only, and took fxgate's DUP re-send of each for a new message",
    "mochi": "Mochi 2.7.9 delivered QoS 2 reads cut by its graceful restart to the cloud "
    "subscriber twice: it does not store that the subscriber PUBRECed them, and re-sent the "
    "PUBLISH instead of the PUBREL",
}
# Measured with Mochi v2.7.9: what it queued for a1 while a1 was down it re-sends at a1's
# connect sorted by creation second, unstably within one (Inflight.GetAll), so a reader's reads
# reach the table out of publish order (MQTT 5 §4.6 asks for the order kept). The audit orders a
# reader's reads by arrival (DESIGN §7.9) and takes each step back for a counter reset, and the
# numbers then skipped for gaps: seen, "4 reset(s)" and false missing ranges for readers whose
# every eventNum was in the tables.
MOCHI_ORDER = (
    "Mochi re-sends a returning member's queued share out of publish order; the audit, which "
    "orders by arrival, reports resets and gaps for eventNums that are all in the tables"
)
MOCHI_TAKEOVER_LOSS = (
    "Mochi 2.7.9 never delivered QoS 2 reads it took (PUBCOMP to fxgate) while the cloud "
    "subscriber's session was being taken over at its reconnect"
)
# The gateway's Receive Maximum toward the source: packs.max_messages, 50 in gateway_env.
RECEIVE_MAXIMUM = 50
# Scenario 1's sizes: per reader, two readers per QoS. Live at RATE msg/s per QoS for about 2 s.
LIVE = 100
RATE = 100.0
WHILE_DOWN = 40
AFTER = 40


def publish_both_qos(broker, phase: str, count: int, rate: float) -> list[PublishedRecord]:
    """`count` reads per reader from two QoS 1 and two QoS 2 readers of their own (each
    simulate() run numbers its events from 1, so each phase has readers of its own)."""
    results = start_both_qos(broker, phase, count, rate).join(timeout=120)
    assert sum(result.failed for result in results) == 0
    return [record for result in results for record in result.published]


def start_both_qos(broker, phase: str, count: int, rate: float) -> Publishing:
    publishing = Publishing()
    for qos in (1, 2):
        publishing.start(
            f"{phase}-q{qos}",
            host=broker.host,
            port=broker.port,
            readers=2,
            rate=rate,
            count=count,
            qos=qos,
            seed=qos,
            topic_template=f"zebra/fx/{phase}-q{qos}-{{reader}}/reads",
        )
    return publishing


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", KINDS)
def test_two_gateways_of_a_shared_group_land_and_forward_each_read_once_through_a_kill_and_a_broker_restart(  # noqa: E501
    kind, broker_factory, daemon_factory, spark_session, tmp_path
):
    broker = broker_factory(kind)
    # The cloud side reads the upstream (the same broker) with a persistent session, so that
    # what is forwarded while the broker restarts waits for it.
    cloud = Collector(broker.host, broker.port, "cloud/#", qos=2, client_id="cloud")
    tables = tmp_path / "group-tables"
    members = ("a1", "a2", "a3") if kind == "hivemq" else ("a1", "a2")
    gateways = [
        Gateway(name, member_env(broker, tmp_path / name, name, tables), tmp_path / name)
        for name in members
    ]
    a1 = gateways[0]
    try:
        for gateway in gateways:
            gateway.daemon = daemon_factory(gateway.env)
        for gateway in gateways:
            gateway.daemon.wait_for_log(SUBSCRIBED, timeout=120)

        # 1. Live, a SIGKILL of a1 a third of the way in: its unacked inbound reads come again
        # from the broker, its unacked forwards go again with the same packet ids. a1 stays
        # down while the rest is published: its share waits in its session at the broker
        # (mosquitto, Mochi; HiveMQ gives it to a2, the member that is online).
        publishing = start_both_qos(broker, "live", LIVE, RATE)
        assert publishing.wait_for(4 * LIVE // 3, timeout=60)
        a1.daemon.kill()
        results = publishing.join(timeout=120)
        assert sum(result.failed for result in results) == 0
        published = [record for result in results for record in result.published]
        published += publish_both_qos(broker, "down", WHILE_DOWN, rate=0)

        # 2. The broker restarted with a1 still down, and the others connected (with reads of
        # their own share, and forwards, possibly in flight), then a1 back: its share waited
        # through it.
        marks = [gateway.daemon.mark() for gateway in gateways[1:]]
        restart(broker)
        a1.daemon = daemon_factory(a1.env)
        for gateway, mark in zip(gateways[1:], marks, strict=True):
            gateway.daemon.wait_for_log(SUBSCRIBED, timeout=60, after=mark)
        a1.daemon.wait_for_log(SUBSCRIBED, timeout=60)

        # 3. Both back: more reads, shared again.
        published += publish_both_qos(broker, "after", AFTER, rate=0)

        expected = expected_read_ids(published)
        assert len(expected) == 4 * (LIVE + WHILE_DOWN + AFTER)
        wait_until_group_holds(kind, gateways, tables, expected)
        wanted = Counter(record.message_key for record in published)

        def upstream_done() -> bool:
            if any(gateway.daemon.count_logs(UPSTREAM_THREAD_DIED) for gateway in gateways):
                return True  # nothing more goes upstream from that gateway
            return len(cloud.messages) >= len(wanted) and set(upstream_keys(cloud)) >= set(wanted)

        with cloud.cond:
            cloud.cond.wait_for(upstream_done, 120)
        upstream_died = [g.name for g in gateways if g.daemon.count_logs(UPSTREAM_THREAD_DIED)]
        for gateway in gateways:
            assert gateway.daemon.terminate() == 0, gateway.daemon.output()
        upstream = upstream_keys(cloud)
    finally:
        cloud.close()
        keep_logs(tmp_path, broker, gateways)

    by_member = shares(tables)
    # Reads of a member's batches another member had landed first: the copies the broker made.
    doubled = sum(
        int(count)
        for gateway in gateways
        for count in re.findall(ALREADY_LANDED, gateway.daemon.output())
    )
    print(
        f"{kind}: the group's table by member {by_member}; landed already by another member "
        f"{doubled}; upstream {sum(upstream.values())} deliveries of {len(upstream)} reads"
    )
    if kind != "hivemq":
        # Every member took part: the subscription was shared, not taken whole by one of them.
        # HiveMQ CE chooses its own way: measured, shares of 160 and 560 in one run, 0 and 720
        # in another (a1, back after the restart, subscribed and granted, was given none).
        assert set(by_member) == {f"fxgate-env-a-{name}" for name in members}, by_member
    if kind == "mosquitto":
        # mosquitto never gives a member's reads to another (DESIGN §4): no copy to skip.
        assert doubled == 0
    # The group's one table, as its users read it, each in a process of its own, taking no lock:
    # every read the publishers got acknowledged, once, whatever the broker did with a1's.
    found = compare(expected, landed_ids_arrow(tables)[0])
    assert found.exact, found.lines()
    for engine in ("deltalake", "duckdb"):
        read = read_once(engine, table_path(str(tables), READS), tmp_path / f"read-{engine}")
        assert read["duplicate_keys"] == [], (engine, read["duplicate_keys"][:10])
        assert set(read["keys"]) == expected and read["rows"] == len(expected), engine
    known: list[str] = []  # a broker's measured failing, each checked for its shape first
    # The audit of the group's table: nothing missing, every reader's count in full.
    report = audit_tables(spark_session, [tables])
    per_reader = Counter(record.topic.split("/")[-2] for record in published)
    received = {
        name: reader.received - reader.duplicates for name, reader in report.readers.items()
    }
    assert received == per_reader, report.lines()
    if kind == "mochi" and not report.complete:
        # Every eventNum it calls missing is in the table: taken for gaps and resets only
        # because Mochi re-sent a1's share out of order.
        assert all(reader.resets for reader in report.readers.values() if reader.missing_count)
        landed = landed_numbers(tables)
        for name, reader in report.readers.items():
            for first, last in reader.missing:
                assert set(range(first, last + 1)) <= landed[name], (name, first, last)
        known.append(MOCHI_ORDER)
    else:
        assert report.complete, report.lines()
    # Mochi answers a QoS 1 PUBLISH with PUBACK 0x01, a code MQTT 5 defines for no PUBACK:
    # the upstream client's network thread died on it until it was named safely
    # (actors/mqtt/upstream.py, _reason_name), and nothing more went upstream.
    assert not upstream_died
    # QoS 2 upstream: every read, through the kill and the broker restart (§7.5).
    lost_upstream = set(wanted) - set(upstream)
    assert set(upstream) <= set(wanted), len(set(upstream) - set(wanted))
    if kind == "mochi" and lost_upstream:
        # Measured on the wire (tests/brokers/test_restart_qos2.py): Mochi completes fxgate's
        # QoS 2 exchange (PUBCOMP) for reads it takes while the cloud subscriber's session is
        # being taken over at its reconnect, and never delivers them (7-19 in five of six runs
        # there; 1 in a fresh-clone run here). Each is in the table.
        known.append(f"{MOCHI_TAKEOVER_LOSS} ({len(lost_upstream)} this run)")
    else:
        assert not lost_upstream, {"missing": len(lost_upstream)}
    # Each member forwards what it received, once (the same packet ids after its kill): a read
    # the broker gave to two members goes up twice, never more from that, and no more reads go
    # up twice than the members found landed already.
    twice = {key for key, n in upstream.items() if n > 1}
    by_redispatch = len(twice) <= doubled and all(upstream[key] <= 2 for key in twice)
    if kind in ("hivemq", "mochi") and twice and not by_redispatch:
        # One delivery again, never more, of each exchange cut by the restart, on top of the
        # copies a re-dispatch made (measured: CI at 7f6d3c7 saw both in one run).
        assert all(upstream[key] <= 4 for key in twice), {key: upstream[key] for key in twice}
        known.append(f"{RESTART_QOS2[kind]} ({len(twice)} this run, {doubled} re-dispatched)")
    else:
        assert by_redispatch, f"{len(twice)} reads twice upstream, {doubled} re-dispatched"
    if known:
        pytest.xfail("; ".join(known))


def keep_logs(folder: Path, broker, gateways: list[Gateway]) -> None:
    """The broker's and each gateway's output beside the test's data, for a failure's story."""
    (folder / f"{broker.kind}.log").write_text(broker.output())
    for gateway in gateways:
        if gateway.daemon is not None:
            (folder / f"{gateway.name}.log").write_text(gateway.daemon.output())


def wait_until_group_holds(
    kind: str, gateways: list[Gateway], tables: Path, expected: set[str]
) -> None:
    """Wait until the group's table holds every expected read and no member's ledger has
    anything pending or a batch open."""
    try:
        wait_until_landed_union(
            [(gateway.daemon, gateway.data) for gateway in gateways],
            len(expected),
            timeout=180,
            tables=tables,
        )
    except AssertionError as stalled:
        found = compare(expected, landed_ids_arrow(tables)[0])
        raise AssertionError(f"{kind}: " + "\n".join(found.lines()) + f"\n{stalled}") from None


def upstream_keys(cloud: Collector) -> Counter:
    return Counter(props[IDEMPOTENCY_PROPERTY] for _, _, props in cloud.messages)


# -- scenario 2: the shipped queue limit -------------------------------------------------------

# Readers' total pace during the outage: what the gateway commits on a busy two-core box, above
# the field's 150 msg/s per reader (tests/actors/test_ledger_is_the_buffer.py).
PACE = 1000
OUTAGE_PER_READER = 1500  # 3,000 reads: three times a 1,000 queue, thirty times tier 2's cap
TIER2_CAP = 100
# Per reader, published while the gateway holds its acks: past what the broker keeps for it.
# mosquitto and HiveMQ: 1,000 queued plus the window in flight (20 and the gateway's 50).
# (Mochi keeps 8,192 per client in flight and queued together; see MOCHI_HELD_ACKS.)
BURST = {"mosquitto": 600, "hivemq": 600}
# Measured with Mochi v2.7.9. Past a client's Receive Maximum Mochi keeps a message unsent in
# its in-flight store; when quota frees it sends one (Inflight.NextImmediate) and deletes it from
# the store at once, so that message's PUBACK finds nothing and never returns the quota. A plain
# subscriber with Receive Maximum 50 holding its acks while 300 QoS 1 messages were published got
# 50; once it acked them, 51 more, then nothing for 10 s; the other 199 came only at its next
# connect, out of order. With the gateway: during the outage (3,000 reads at 1,000 msg/s) the
# table held 419 after 120 s, the rest waiting in Mochi for a reconnect that a live connection
# never makes (in another run the gateway kept up and all 3,000 landed); after SIGSTOP, 2 x 4,200
# reads, SIGCONT and a tail, the table held 28 of each reader's 4,200, out of order. So neither
# the outage at Mochi's limit (8,192 per client, "client store quota reached" past it) nor an
# exact audit of its drops can be shown: the broker stalls first.
MOCHI_HELD_ACKS = (
    "Mochi v2.7.9 stops sending to a live connection that fell one Receive Maximum behind "
    "(Inflight.NextImmediate deletes the message it sends, so its PUBACK never returns the "
    "quota) until the client reconnects: measured 419 of 3,000 reads landed in 120 s at "
    "1,000 msg/s, and 28 of 4,200 per reader after the gateway held its acks"
)
BURST_READERS = ("burst-01", "burst-02")
CHUNK = 500  # messages per publishing connection: paho's queue scan is quadratic (DESIGN §4)
WINDOW = 10  # publishes in flight: HiveMQ's Receive Maximum
# Of a burst, at least this many reach the gateway once it acks again: what the broker queues
# for it. Once they have landed the broker's queue has room again, and a tail is kept.
KEPT_AT_LEAST = {"mosquitto": 1000, "hivemq": 1000}


def publish_events(broker, generators, per_reader: int, client_id: str) -> list[PublishedRecord]:
    """`per_reader` events from each reader, the readers interleaved, QoS 1, in connections of
    CHUNK messages, each acknowledged by the broker (which says nothing of whether it kept it)."""
    messages = [
        (f"zebra/fx/{generator.reader}/reads", generator.next_payload())
        for _ in range(per_reader)
        for generator in generators
    ]
    for start in range(0, len(messages), CHUNK):
        publish_acknowledged(broker, messages[start : start + CHUNK], f"{client_id}-{start}")
    return [PublishedRecord(topic, message_key(topic, payload), 1) for topic, payload in messages]


def publish_acknowledged(broker, messages, client_id: str, timeout: float = 60.0) -> None:
    """Publish at QoS 1 with at most WINDOW in flight, and wait until each is acknowledged.

    HiveMQ grants a Receive Maximum of 10 and disconnects (0x93) a client with an 11th QoS 1
    PUBLISH in flight; paho's default window is 20 (tests.harness.mqtt.publish_all's)."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )
    client.max_inflight_messages_set(WINDOW)
    cond = threading.Condition()
    connected = threading.Event()
    settled: dict[int, bool] = {}

    def on_publish(_c, _u, mid, reason_code, _p) -> None:
        with cond:
            settled[mid] = not reason_code.is_failure
            cond.notify_all()

    client.on_connect = lambda *_args: connected.set()
    client.on_publish = on_publish
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        assert connected.wait(timeout), f"{client_id}: no CONNACK"
        mids = [client.publish(topic, payload, qos=1).mid for topic, payload in messages]
        with cond:
            done = cond.wait_for(lambda: len(settled) >= len(mids), timeout)
            assert done, f"{client_id}: {len(settled)} of {len(mids)} publishes acknowledged"
            assert all(settled.values()), f"{client_id}: some publishes refused"
    finally:
        client.disconnect()
        client.loop_stop()


def wait_for_rows(daemon, data: Path, rows: int, timeout: float = 60.0) -> None:
    """Wait, on the daemon's 'batch written' lines, until the reads table holds `rows` rows or
    more."""
    daemon.wait_for_batches(
        lambda: settled(data)[0] >= rows, lambda: f"{settled(data)[0]} rows, not {rows},", timeout
    )


def landed_numbers(tables: Path) -> dict[str, set[int]]:
    rows = read_table_arrow(tables, READS).select(["reader_id", "event_num"]).to_pylist()
    found: dict[str, set[int]] = {}
    for row in rows:
        found.setdefault(row["reader_id"], set()).add(row["event_num"])
    return found


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", KINDS)
def test_at_the_shipped_queue_limit_an_outage_loses_nothing_and_the_audit_names_exactly_the_brokers_drops(  # noqa: E501
    kind, broker_factory, daemon_factory, spark_session, tmp_path
):
    if kind == "mochi":
        pytest.skip(MOCHI_HELD_ACKS)
    source = broker_factory(kind, **SHIPPED[kind])
    data = tmp_path / "data"
    # The upstream is a loopback port nobody listens on: an outage for the whole test.
    env = {
        **gateway_env(source, data),
        "FXGATE__SOURCE__INSTANCE_ID": "gw",
        **forwarding_to(source, qos=1, FXGATE__UPSTREAM__PORT=str(free_port())),
        "FXGATE__BUFFER__MAX_MESSAGES": str(TIER2_CAP),
    }
    daemon = daemon_factory(env)
    daemon.wait_for_log(r"source: subscribed to zebra/fx/\+/reads", timeout=120)

    # 1. The outage: the source goes on being acknowledged, the ledger holds the upstream's
    # backlog, and the table lands every read although three times the broker's queue was sent.
    outage = simulate(
        source.host, source.port, readers=2, rate=PACE, count=OUTAGE_PER_READER, qos=1
    )
    assert outage.failed == 0
    expected = expected_read_ids(outage.published)
    wait_until_landed(daemon, data, len(expected), timeout=120)
    found = compare(expected, landed_ids_arrow(data / "tables")[0])
    assert found.exact, found.lines()
    daemon.wait_for_log(r"the upstream's backlog waits in tier 1", timeout=10)

    # 2. The gateway holds its acks past the broker's limit: the broker drops, silently to the
    # publisher, and only the audit of the table can tell what.
    generators = [TagEventGenerator(reader, seed=7) for reader in BURST_READERS]
    with stopped(daemon):
        burst = publish_events(source, generators, BURST[kind], "burst")
    published = outage.published + burst
    wait_for_rows(daemon, data, len(expected) + KEPT_AT_LEAST[kind])
    # A tail after the burst brackets its last gap between landed numbers. Should a tail still
    # meet a full queue (dropped like the burst's end), one more goes, until one lands.
    for attempt in range(5):
        tail = publish_events(source, generators, 1, f"tail-{attempt}")
        published += tail
        try:
            wait_until_table_holds(daemon, data, expected_read_ids(tail), timeout=10)
            break
        except AssertionError:
            continue
    else:
        raise AssertionError(f"{kind}: no tail landed in 5 attempts")
    assert daemon.terminate() == 0, daemon.output()

    everything = expected_read_ids(published)
    found = compare(everything, landed_ids_arrow(data / "tables")[0])
    assert not found.duplicates and not found.unexpected, found.lines()
    landed = landed_numbers(data / "tables")
    report = audit_tables(spark_session, [data / "tables"])
    assert not report.complete
    for reader in ("fx9600-01", "fx9600-02"):
        assert report.readers[reader].missing == (), report.lines()
        assert report.readers[reader].received == OUTAGE_PER_READER
    dropped = {}
    for generator in generators:
        reader = generator.reader
        lost = set(range(1, generator.event_num + 1)) - landed[reader]
        dropped[reader] = len(lost)
        assert lost, f"{kind}: {reader}: nothing was dropped; the test proves nothing"
        found_here = report.readers[reader]
        expected_runs = tuple(tuple(run) for run in runs(lost))
        assert found_here.missing == expected_runs, (reader, found_here.missing, expected_runs)
        assert found_here.received == len(landed[reader])
        assert (found_here.resets, found_here.duplicates, found_here.conflicts) == (0, 0, 0)
        assert found_here.last_event_num == generator.event_num
    assert found.missing and len(found.missing) == sum(dropped.values())
    print(f"{kind}: dropped while the gateway held its acks: {dropped}; {report.lines()}")
