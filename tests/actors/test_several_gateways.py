"""Several gateways in one environment: one shared subscription, one table per environment that
every member lands into (DESIGN §7.12), every read landed once by the group, and once by a
gateway of another environment too.

What the broker does with the share of a member that is down is a mosquitto 2.0.11 fact, kept
here as tests with plain paho members (no JVM needed): it queues the share for that member's live
session, never for the others, delivers it when the member returns, and discards it when the
session expires. The fault test then runs three daemons (two in environment A, one in B) through
random SIGKILLs. FXGATE_GATEWAYS_SEED replays its random choices (the seed is printed).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from actors.config.schema import load_config
from actors.devtools.simulate import SimulationResult, expected_read_ids, simulate
from spark.report import compare, landed_ids_arrow, landed_ids_spark
from tests.harness.checks import settled, wait_until_landed_union
from tests.harness.daemon import DaemonProcess, gateway_env
from tests.harness.mqtt import publish_all

HOST = "gw-host"
GROUP = "fxgate"
SHARED_FILTER = f"$share/{GROUP}-env-a/facts/#"


def loaded(**overrides: str):
    environ = {f"FXGATE__SOURCE__{key.upper()}": value for key, value in overrides.items()}
    return load_config(None, environ=environ, hostname=HOST)


# --- identity and the operator's warnings: pure --------------------------------------------


def test_two_instances_of_one_environment_share_its_group_and_keep_their_own_client_ids():
    first = loaded(environment_id="env-a", instance_id="a1", shared_subscription_group=GROUP)
    second = loaded(environment_id="env-a", instance_id="a2", shared_subscription_group=GROUP)
    other = loaded(environment_id="env-b", instance_id="b1", shared_subscription_group=GROUP)
    assert first.identity.subscriptions == ("$share/fxgate-env-a/zebra/fx/+/reads",)
    assert second.identity.subscriptions == first.identity.subscriptions
    # The group is scoped by environment, so environment B gets every read, not a share of A's.
    assert other.identity.subscriptions == ("$share/fxgate-env-b/zebra/fx/+/reads",)
    assert {first.identity.client_id, second.identity.client_id, other.identity.client_id} == {
        "fxgate-env-a-a1",
        "fxgate-env-a-a2",
        "fxgate-env-b-b1",
    }


def test_the_default_session_outlives_the_reconnect_backoff_so_it_draws_no_warning():
    assert loaded(shared_subscription_group=GROUP).warnings() == []


def test_a_session_that_can_expire_within_one_reconnect_wait_is_warned_about():
    (warning,) = loaded(
        shared_subscription_group=GROUP, session_expiry_interval_seconds="3"
    ).warnings()
    assert warning.startswith(
        "source.session_expiry_interval_seconds = 3 is not above "
        "source.reconnect_max_delay_seconds (120)"
    )
    assert "share of group 'fxgate'" in warning
    assert "longest outage" in warning


def test_a_session_just_above_the_reconnect_backoff_draws_no_warning():
    config = loaded(
        shared_subscription_group=GROUP,
        session_expiry_interval_seconds="121",
        reconnect_max_delay_seconds="120",
    )
    assert config.warnings() == []


def test_a_clean_start_with_a_shared_group_is_warned_to_discard_the_queued_share():
    (warning,) = loaded(shared_subscription_group=GROUP, clean_session="true").warnings()
    assert warning.startswith("source.clean_session = true: every connect discards")
    assert "never given to another gateway" in warning


def test_a_zero_session_expiry_is_warned_about_with_and_without_a_group():
    (grouped,) = loaded(
        shared_subscription_group=GROUP, session_expiry_interval_seconds="0"
    ).warnings()
    (alone,) = loaded(session_expiry_interval_seconds="0").warnings()
    assert "the reads in flight to it are lost" in grouped
    assert "the reads published while it is away are not kept for it" in alone


# --- what mosquitto does with the share of a member that is down ---------------------------


class GroupMember:
    """A plain MQTT 5 member of a shared group, QoS 1, recording payloads under a condition that
    the members of one test share, so that a wait can look at all of them."""

    def __init__(
        self,
        broker,
        client_id: str,
        expiry: int,
        cond: threading.Condition,
        subscribe: bool = True,
    ) -> None:
        self.client_id = client_id
        self.payloads: list[bytes] = []
        self.cond = cond
        self.session_present: bool | None = None
        connected, subscribed = threading.Event(), threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
        )

        def on_connect(_c, _u, flags, _reason, _p) -> None:
            self.session_present = flags.session_present
            connected.set()

        self.client.on_connect = on_connect
        self.client.on_subscribe = lambda *_a: subscribed.set()
        self.client.on_message = self._on_message
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = expiry
        self.client.connect(broker.host, broker.port, clean_start=False, properties=properties)
        self.client.loop_start()
        assert connected.wait(10), f"{client_id} got no CONNACK"
        if subscribe:
            self.client.subscribe(SHARED_FILTER, qos=1)
            assert subscribed.wait(10), f"{client_id} got no SUBACK"

    def _on_message(self, _client, _userdata, message) -> None:
        with self.cond:
            self.payloads.append(bytes(message.payload))
            self.cond.notify_all()

    def got(self) -> list[bytes]:
        with self.cond:
            return list(self.payloads)

    def wait_until(self, holds: Callable[[list[bytes]], bool], timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: holds(self.payloads), timeout)

    def leave(self) -> None:
        """DISCONNECT keeping the session, as a gateway that stops or dies leaves it."""
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def members():
    made: list[GroupMember] = []
    cond = threading.Condition()

    def make(broker, client_id: str, expiry: int, subscribe: bool = True) -> GroupMember:
        member = GroupMember(broker, client_id, expiry, cond, subscribe)
        made.append(member)
        return member

    yield make
    for member in made:
        member.leave()


def batch(prefix: str, count: int) -> list[tuple[str, bytes]]:
    return [(f"facts/{prefix}", f"{prefix}-{i}".encode()) for i in range(count)]


def leave_and_wait(broker, member: GroupMember) -> None:
    mark = broker.line_count()
    member.leave()
    assert broker.wait_for_output(f"Client {member.client_id} disconnected", 10, start=mark)


@pytest.mark.broker
def test_the_share_of_a_member_down_with_a_live_session_waits_for_it_and_is_not_rerouted(
    mosquitto, members
):
    live = members(mosquitto, "member-live", expiry=3600)
    down = members(mosquitto, "member-down", expiry=3600)
    leave_and_wait(mosquitto, down)

    sent = batch("while-down", 100)
    publish_all(mosquitto.host, mosquitto.port, sent)
    back = members(mosquitto, "member-down", expiry=3600, subscribe=False)
    assert back.session_present is True

    payloads = {payload for _, payload in sent}
    assert live.wait_until(lambda got: len(got) + len(back.got()) >= len(payloads))
    from_live, from_back = live.got(), back.got()
    # The returning member gets its share from the broker's queue; the live member got only its
    # own share while the other was away (mosquitto 2.0.11 does not re-route a queued share).
    assert from_back and len(from_live) < len(payloads)
    assert set(from_live).isdisjoint(from_back)
    assert set(from_live) | set(from_back) == payloads
    assert len(from_live) + len(from_back) == len(payloads)


@pytest.mark.broker
def test_when_a_down_members_session_expires_the_broker_discards_the_share_queued_for_it(
    mosquitto, members
):
    live = members(mosquitto, "member-live", expiry=3600)
    brief = members(mosquitto, "member-brief", expiry=3)
    mark = mosquitto.line_count()
    leave_and_wait(mosquitto, brief)

    sent = batch("while-down", 100)
    publish_all(mosquitto.host, mosquitto.port, sent)
    assert mosquitto.wait_for_output("Expiring client member-brief due to timeout", 20, start=mark)
    # Publishing here ran well inside the 3 s: the expiry came after every read of the batch.
    lines = mosquitto.output().splitlines()[mark:]
    published_at = next(
        i for i, line in enumerate(lines) if "Client test-publisher disconnected" in line
    )
    expired_at = next(i for i, line in enumerate(lines) if "Expiring client member-brief" in line)
    assert published_at < expired_at

    # With its session gone the group has one member: reads published now all go to it, and
    # they follow the batch, so once they are in, the live member's share of the batch is too.
    after = batch("after-expiry", 10)
    publish_all(mosquitto.host, mosquitto.port, after, client_id="test-publisher-2")
    after_payloads = {payload for _, payload in after}
    assert live.wait_until(lambda got: after_payloads <= set(got))

    back = members(mosquitto, "member-brief", expiry=3)
    assert back.session_present is False
    again = batch("again", 10)
    publish_all(mosquitto.host, mosquitto.port, again, client_id="test-publisher-3")
    again_payloads = {payload for _, payload in again}
    assert live.wait_until(lambda got: again_payloads <= set(got) | set(back.got()))

    batch_payloads = {payload for _, payload in sent}
    kept = batch_payloads & set(live.got())
    assert not batch_payloads & set(back.got())
    # What was queued for the expired session is gone: nobody has it.
    lost = batch_payloads - kept
    assert 0 < len(lost) < len(batch_payloads)


# --- the fault test: two gateways in environment A, one in B, random SIGKILLs --------------

SEED = int(os.environ.get("FXGATE_GATEWAYS_SEED", str(random.SystemRandom().randrange(1 << 30))))
KILLS = 4
READERS = 2
MESSAGES_PER_READER = 800  # per QoS: 2 readers x 800 x 2 QoS = 3,200 reads
RATE = 100.0  # messages/s per QoS: about 16 s of publishing, long enough for the kills


@dataclass
class Gateway:
    name: str
    env: dict[str, str]
    data: Path
    daemon: DaemonProcess | None = None

    @property
    def tables(self) -> Path:
        """Where this gateway lands: its group's tables (`[spark] tables_dir`), else its own."""
        shared = self.env.get("FXGATE__SPARK__TABLES_DIR")
        return Path(shared) if shared else self.data / "tables"


def member_env(
    broker, data: Path, environment: str, instance: str, tables: Path | None = None
) -> dict[str, str]:
    """A member of `environment`'s group; `tables`: the group's tables, shared by its members
    (unset: the member's own, `<data>/tables`)."""
    return {
        **gateway_env(broker, data),
        "FXGATE__SOURCE__ENVIRONMENT_ID": environment,
        "FXGATE__SOURCE__INSTANCE_ID": instance,
        "FXGATE__SOURCE__SHARED_SUBSCRIPTION_GROUP": GROUP,
        "FXGATE__SOURCE__RECONNECT_MIN_DELAY_SECONDS": "0.2",
        "FXGATE__SOURCE__RECONNECT_MAX_DELAY_SECONDS": "2.0",
        **({"FXGATE__SPARK__TABLES_DIR": str(tables)} if tables is not None else {}),
    }


def shares(tables: Path) -> dict[str, int]:
    """Rows of the group's `reads` per member that landed them (`landed_by`)."""
    from collections import Counter

    from spark.tables import LANDED_BY, READS, read_table_arrow

    table = read_table_arrow(tables, READS)
    return dict(Counter(table.column(LANDED_BY).to_pylist())) if table.num_rows else {}


class Publishing:
    """`simulate(...)` runs, one thread each; the test waits on their joint progress."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.sent: dict[str, int] = {}
        self.finished: set[str] = set()
        self.results: list[SimulationResult] = []
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def start(self, name: str, **kwargs) -> None:
        def progress(sent: int) -> None:
            with self.cond:
                self.sent[name] = sent
                self.cond.notify_all()

        def run() -> None:
            try:
                result = simulate(**kwargs, client_id_prefix=f"fx-sim-{name}", progress=progress)
                with self.cond:
                    self.results.append(result)
            except BaseException as error:  # raised again on the test's thread by join()
                with self.cond:
                    self.errors.append(error)
            finally:
                with self.cond:
                    self.finished.add(name)
                    self.cond.notify_all()

        thread = threading.Thread(target=run, name=f"publish-{name}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def wait_for(self, total: int, timeout: float) -> bool:
        """Until `total` messages are handed out in all, or every run has ended."""

        def reached() -> bool:
            ended = len(self.finished) == len(self.threads)
            return ended or sum(self.sent.values()) >= total

        with self.cond:
            return self.cond.wait_for(reached, timeout)

    def join(self, timeout: float) -> list[SimulationResult]:
        for thread in self.threads:
            thread.join(timeout)
            assert not thread.is_alive(), f"{thread.name} still publishing after {timeout} s"
        if self.errors:
            raise self.errors[0]
        return self.results


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_gateways_of_one_environment_and_one_of_another_each_land_every_read_once_through_kills(
    mosquitto, daemon_factory, spark_session, tmp_path
):
    rng = random.Random(SEED)
    total = 2 * READERS * MESSAGES_PER_READER
    kill_at = sorted(rng.sample(range(total // 10, total * 85 // 100), KILLS))
    gateways = {
        name: Gateway(
            name,
            member_env(
                mosquitto, tmp_path / name, environment, name, tmp_path / f"tables-{environment}"
            ),
            tmp_path / name,
        )
        for name, environment in (("a1", "env-a"), ("a2", "env-a"), ("b1", "env-b"))
    }
    victims = [rng.choice(sorted(gateways)) for _ in kill_at]
    print(f"several-gateways seed {SEED}: SIGKILL {list(zip(victims, kill_at, strict=True))}")

    for gateway in gateways.values():
        gateway.daemon = daemon_factory(gateway.env)
    for gateway in gateways.values():
        gateway.daemon.wait_for_log(r"source: subscribed to \$share/fxgate-env-", timeout=120)

    publishing = Publishing()
    common = {"host": mosquitto.host, "port": mosquitto.port, "readers": READERS, "rate": RATE}
    publishing.start("q1", **common, count=MESSAGES_PER_READER, qos=1, seed=1)
    publishing.start(
        "q2",
        **common,
        count=MESSAGES_PER_READER,
        qos=2,
        seed=2,
        topic_template="zebra/fx/q2-{reader}/reads",
    )
    restarted = []
    for victim, when in zip(victims, kill_at, strict=True):
        assert publishing.wait_for(when, timeout=120), f"publishing stalled before {when}"
        gateway = gateways[victim]
        gateway.daemon.kill()
        # Same data dir, same client id: the session and the share queued for it resume.
        gateway.daemon = daemon_factory(gateway.env)
        restarted.append(gateway.daemon)
    results = publishing.join(timeout=300)
    assert sum(result.failed for result in results) == 0
    expected = expected_read_ids(record for result in results for record in result.published)
    assert len(expected) == total

    environment_a = [gateways["a1"], gateways["a2"]]
    environment_b = [gateways["b1"]]
    for members_of_one in (environment_a, environment_b):
        pairs = [(gateway.daemon, gateway.data) for gateway in members_of_one]
        tables = members_of_one[0].tables
        try:
            wait_until_landed_union(pairs, len(expected), timeout=300, tables=tables)
        except AssertionError as stalled:
            found = compare(expected, landed_ids_arrow(tables)[0])
            raise AssertionError(f"{found.lines()}\n{stalled}") from None
    for gateway in gateways.values():
        if gateway.daemon in restarted:
            # The broker kept the killed gateway's session, and the share queued meanwhile.
            gateway.daemon.wait_for_log(r"connected to .* \(session present: True", timeout=10)
    for gateway in gateways.values():
        assert gateway.daemon.terminate() == 0, gateway.daemon.output()
        assert gateway.daemon.alive_spawned() == []

    landed_by = shares(gateways["a1"].tables)
    print(f"A's table by member: {landed_by}; B's: {shares(gateways['b1'].tables)}")
    # Both members took part, into the one table: the subscription was shared, not taken whole
    # by one of them.
    assert set(landed_by) == {"fxgate-env-a-a1", "fxgate-env-a-a2"}, landed_by
    assert all(rows > 0 for rows in landed_by.values()), landed_by
    for members_of_one in (environment_a, environment_b):
        tables = members_of_one[0].tables
        plain = compare(expected, landed_ids_arrow(tables)[0])
        assert plain.exact, plain.lines()
        ids, readers = landed_ids_spark(spark_session, tables)
        through_spark = compare(expected, ids, readers)
        assert through_spark.exact, through_spark.lines()
        assert through_spark.per_reader == {
            reader: MESSAGES_PER_READER
            for reader in ("fx9600-01", "fx9600-02", "q2-fx9600-01", "q2-fx9600-02")
        }


@pytest.mark.broker
def test_a_gateway_pointed_at_another_environments_table_is_refused_at_start(
    mosquitto, daemon_factory, tmp_path
):
    """Each environment's group lands into its own table: a member configured for env-b whose
    tables_dir holds env-a's tables stops at start (exit 2) and names both groups; so does a
    gateway alone. Nothing is written to the table."""
    from deltalake import DeltaTable

    from spark.tables import READS, GroupTableWriter, table_path
    from tests.spark.test_group_tables import reads

    tables = tmp_path / "tables-env-a"
    GroupTableWriter(
        None, tables, "fxgate-ledger-a1", group=f"{GROUP}-env-a", member="fxgate-env-a-a1"
    ).write_batch(1, {READS: reads(range(5))})
    version = DeltaTable(table_path(str(tables), READS)).version()

    stranger = daemon_factory(member_env(mosquitto, tmp_path / "b1", "env-b", "b1", tables))
    assert stranger.proc.wait(60) == 2, stranger.output()
    stranger.wait_for_log(
        r"not starting: .*reads is the table of shared group 'fxgate-env-a', and this gateway "
        r"is a member of 'fxgate-env-b'"
    )
    alone = daemon_factory(
        {**gateway_env(mosquitto, tmp_path / "c1"), "FXGATE__SPARK__TABLES_DIR": str(tables)}
    )
    assert alone.proc.wait(60) == 2, alone.output()
    alone.wait_for_log(r"not starting: .*has no \[source\] shared_subscription_group")
    assert DeltaTable(table_path(str(tables), READS)).version() == version


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_a_gateway_down_past_its_session_expiry_loses_its_queued_share_and_was_warned_at_start(
    mosquitto, daemon_factory, tmp_path
):
    """The operational rule, end to end: session expiry must exceed the longest outage of a
    member, or the share queued for it is discarded by the broker. 3 s here, for this test."""
    steady = Gateway("a1", member_env(mosquitto, tmp_path / "a1", "env-a", "a1"), tmp_path / "a1")
    brief_env = {
        **member_env(mosquitto, tmp_path / "a2", "env-a", "a2"),
        "FXGATE__SOURCE__SESSION_EXPIRY_INTERVAL_SECONDS": "3",
        # A backoff ceiling above the expiry: one reconnect wait could outlast the session.
        "FXGATE__SOURCE__RECONNECT_MAX_DELAY_SECONDS": "5.0",
    }
    steady.daemon = daemon_factory(steady.env)
    brief = daemon_factory(brief_env)
    brief.wait_for_log(
        r"WARNING .*source.session_expiry_interval_seconds = 3 is not above "
        r"source.reconnect_max_delay_seconds \(5\)"
    )
    for daemon in (steady.daemon, brief):
        daemon.wait_for_log(r"source: subscribed to \$share/fxgate-env-a/", timeout=120)
    # Stopped once it is fully up: a stop during the Spark start is another test's matter.
    brief.wait_for_log(r"spark writer ready", timeout=180)

    mark = mosquitto.line_count()
    # A graceful stop (session kept); the daemon goes on stopping its Spark session well after
    # its DISCONNECT, so publish on the broker's line, not on the daemon's exit.
    brief.remember_children()
    brief.proc.send_signal(signal.SIGTERM)
    assert mosquitto.wait_for_output("Client fxgate-env-a-a2 disconnected", 120, start=mark)
    published = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=100, qos=1)
    assert published.failed == 0
    assert mosquitto.wait_for_output("Expiring client fxgate-env-a-a2 due to timeout", 30, mark)
    lines = mosquitto.output().splitlines()[mark:]
    published_at = max(i for i, line in enumerate(lines) if "Client fx-sim-" in line)
    expired_at = next(
        i for i, line in enumerate(lines) if "Expiring client fxgate-env-a-a2" in line
    )
    assert published_at < expired_at, "the session expired before the reads were published:\n" + (
        "\n".join(lines)
    )

    # The group now has one member: these follow the batch to it, so once they have landed,
    # its share of the batch has landed too.
    after = simulate(
        mosquitto.host,
        mosquitto.port,
        readers=1,
        rate=0,
        count=10,
        qos=1,
        seed=9,
        topic_template="zebra/fx/after-{reader}/reads",
        client_id_prefix="fx-sim-after",
    )
    after_ids = expected_read_ids(after.published)
    wait_until_table_holds(steady.daemon, steady.data, after_ids)

    assert brief.proc.wait(120) == 0, brief.output()
    returned = daemon_factory(brief_env)
    returned.wait_for_log(r"as fxgate-env-a-a2 \(session present: False", timeout=120)
    assert steady.daemon.terminate() == 0

    expected = expected_read_ids(published.published)
    kept = set(landed_ids_arrow(steady.data / "tables")[0]) & expected
    found = compare(expected, landed_ids_arrow(steady.data / "tables")[0], tolerated=after_ids)
    # No duplicate and nothing foreign; what is missing is exactly the expired member's share,
    # which the broker discarded and never gave to the steady member.
    assert not found.duplicates and not found.unexpected, found.lines()
    assert found.missing and len(kept) + len(found.missing) == len(expected)
    assert 0 < len(kept) < len(expected)
    print(
        f"kept by the steady member: {len(kept)}, discarded with the expired session: "
        f"{len(found.missing)} of {len(expected)}"
    )


def wait_until_table_holds(daemon, data: Path, ids: set[str], timeout: float = 180.0) -> None:
    """Wait, on the daemon's 'batch written' lines, until its table holds every id in `ids` and
    its ledger has nothing pending."""
    deadline = time.monotonic() + timeout
    while True:
        mark = daemon.mark()
        held = set(landed_ids_arrow(data / "tables")[0])
        _, pending, open_batches = settled(data)
        if ids <= held and pending == 0 and open_batches == 0:
            return
        remaining = deadline - time.monotonic()
        assert remaining > 0, (
            f"{len(ids - held)} ids not landed, {pending} pending after {timeout} s"
        )
        daemon.wait_for_log(r"batch \d+ written", timeout=remaining, after=mark)
