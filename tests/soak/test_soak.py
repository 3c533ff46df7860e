"""The soak: random SIGKILLs of the daemon, broker restarts and connection flaps while four readers
publish; afterwards the table must equal the publishers' acknowledged set exactly.

Sizes come from the environment so that `make soak` runs the full schedule and CI a short one:
FXGATE_SOAK_KILLS (default 4), FXGATE_SOAK_BROKER_RESTARTS (2), FXGATE_SOAK_FLAPS (10),
FXGATE_SOAK_FORWARD_KILLS (2, the forwarding soak's SIGKILLs of the forward process alone),
FXGATE_SOAK_SEED (random choices; printed so a failure can be replayed), FXGATE_SOAK_QOS (the
inbound QoS levels each soak runs at, "1,2" in `make soak`; CI runs the table soak at QoS 1 and
the forwarding soak at QoS 2, where upstream must hold every read exactly once).

The forwarding soak adds a route upstream, through a second proxy to a second broker: its
connection flaps too, and the forward process is killed alone. Upstream must hold every
acknowledged read as well: exactly once at QoS 2; at QoS 1, every one at least once, the
duplicates counted (DESIGN §7.5).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from actors.devtools.simulate import expected_read_ids
from actors.mqtt.upstream import IDEMPOTENCY_PROPERTY
from spark.report import compare, landed_ids_arrow, landed_ids_spark
from tests.harness.checks import wait_until_landed
from tests.harness.mqtt import Collector
from tests.harness.proxy import FaultProxy
from tests.harness.publisher import SoakPublisher

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("FXGATE_SOAK_KILLS", "4"))
RESTARTS = int(os.environ.get("FXGATE_SOAK_BROKER_RESTARTS", "2"))
FLAPS = int(os.environ.get("FXGATE_SOAK_FLAPS", "10"))
FORWARD_KILLS = int(os.environ.get("FXGATE_SOAK_FORWARD_KILLS", "2"))
SEED = int(os.environ.get("FXGATE_SOAK_SEED", str(random.SystemRandom().randrange(1 << 30))))
FLAPS_PER_BURST = 5


def _qos_levels(short_schedule: int) -> list[int]:
    levels = os.environ.get("FXGATE_SOAK_QOS")
    return [int(level) for level in levels.split(",")] if levels else [short_schedule]


RESULTS = (
    Path(os.environ.get("FXGATE_SOAK_RESULTS", "")) if "FXGATE_SOAK_RESULTS" in os.environ else None
)


EVENTS = ("kill", "restart", "broker-kill", "flap", "upstream-flap", "forward-kill")


def schedule(rng: random.Random, forwarding: bool = False) -> list[str]:
    flap_bursts = -(-FLAPS // FLAPS_PER_BURST)
    events = ["kill"] * KILLS + ["restart"] * RESTARTS + ["flap"] * flap_bursts
    if forwarding:
        events += ["upstream-flap"] * flap_bursts + ["forward-kill"] * FORWARD_KILLS
    rng.shuffle(events)
    if RESTARTS:
        # One of the restarts is a SIGKILL of the broker right after an autosave.
        events[events.index("restart")] = "broker-kill"
    return events


class Faults:
    """Applies the soak's events in turn, each after a random amount of progress, so that each
    lands at a random moment; keeps the daemon that is running now and counts what was done."""

    def __init__(
        self, rng, publisher, daemon_factory, env, source, source_proxy, upstream_proxy=None
    ):
        self.rng = rng
        self.publisher = publisher
        self.daemon_factory = daemon_factory
        self.env = env
        self.source = source
        self.source_proxy = source_proxy
        self.upstream_proxy = upstream_proxy
        self.counts = {event: 0 for event in EVENTS}
        self.daemon = daemon_factory(env)

    def run(self, events: list[str]) -> None:
        self.daemon.wait_for_log(r"source: subscribed", timeout=60)
        self.publisher.start()
        for event in events:
            progress = self.rng.randrange(50, 600)
            assert self.publisher.wait_for_acks(len(self.publisher.acked) + progress, 120)
            getattr(self, "_" + event.replace("-", "_"))()
            self.counts[event] += FLAPS_PER_BURST if event.endswith("flap") else 1

    def _kill(self) -> None:
        self.daemon.kill()
        self.daemon = self.daemon_factory(self.env)

    def _restart(self) -> None:
        self.source.restart()

    def _broker_kill(self) -> None:
        self.publisher.pause()
        assert self.publisher.wait_idle(60)
        # mosquitto logs "Saving" as a save begins; once the next one begins, the first (which
        # holds everything the readers got acked) is complete on disk.
        for _ in range(2):
            mark = self.source.line_count()
            assert self.source.wait_for_output("Saving in-memory database", 10, start=mark)
        self.source.kill()
        self.source.start()
        self.publisher.resume()

    def _flap(self) -> None:
        self.source_proxy.flap(FLAPS_PER_BURST, timeout=60)

    def _upstream_flap(self) -> None:
        self.upstream_proxy.flap(FLAPS_PER_BURST, timeout=60)

    def _forward_kill(self) -> None:
        """SIGKILL the forward process alone: the daemon restarts its actors and a new one."""
        child = forward_process_of(self.daemon)
        mark = self.daemon.mark()  # after its start line: the restart's is the next one
        os.kill(child, signal.SIGKILL)
        self.daemon.wait_for_log(r"actor forward died.*restarting all actors", after=mark)
        self.daemon.wait_for_log(r"forward process started", after=mark)


def forward_process_of(daemon) -> int:
    daemon.wait_for_log(r"forward process started", timeout=60)
    for child in psutil.Process(daemon.pid).children():
        try:
            if "actors.forward_process" in child.cmdline():
                return child.pid
        except psutil.Error:  # a child already gone, or a zombie not yet reaped
            continue
    raise AssertionError(f"the daemon has no forward process; log:\n{daemon.output()}")


def daemon_env(source_proxy, data: Path) -> dict[str, str]:
    return {
        "FXGATE__SOURCE__PORT": str(source_proxy.port),
        "FXGATE__SOURCE__RECONNECT_MIN_DELAY_SECONDS": "0.2",
        "FXGATE__SOURCE__RECONNECT_MAX_DELAY_SECONDS": "2.0",
        "FXGATE__GATEWAY__DATA_DIR": str(data),
        "FXGATE__PACKS__LINGER_SECONDS": "0.2",
        "FXGATE__PACKS__MAX_MESSAGES": "50",
        "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
    }


def report(summary: dict, name: str) -> None:
    print(json.dumps(summary))
    if RESULTS is not None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / name).write_text(json.dumps(summary, indent=2) + "\n")


def wait_for_the_table(daemon, data: Path, expected) -> None:
    try:
        wait_until_landed(daemon, data, len(expected), timeout=240)
    except AssertionError as stalled:
        found = compare(expected, landed_ids_arrow(data / "tables")[0])
        raise AssertionError(f"{found.lines()}\n{stalled}") from None


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("qos", _qos_levels(1))
def test_soak_table_equals_the_acknowledged_set_through_kills_restarts_and_flaps(
    qos, mosquitto, daemon_factory, spark_session, tmp_path
):
    rng = random.Random(SEED * 10 + qos)
    print(f"soak seed {SEED}: {KILLS} kills, {RESTARTS} broker restarts, {FLAPS} flaps, QoS {qos}")
    proxy = FaultProxy(mosquitto.host, mosquitto.port)
    proxy.start()
    data = tmp_path / "data"
    publisher = SoakPublisher(
        mosquitto.host, mosquitto.port, readers=4, qos=qos, rate=300, seed=qos
    )
    started = time.monotonic()
    try:
        faults = Faults(rng, publisher, daemon_factory, daemon_env(proxy, data), mosquitto, proxy)
        faults.run(schedule(rng))
        publisher.stop()
        expected = expected_read_ids(publisher.acked)
        assert not publisher.refused
        wait_for_the_table(faults.daemon, data, expected)
        assert faults.daemon.terminate() == 0
    finally:
        proxy.close()
    counts = faults.counts

    ids, _ = landed_ids_arrow(data / "tables")
    plain = compare(expected, ids)
    ids, readers = landed_ids_spark(spark_session, data / "tables")
    through_spark = compare(expected, ids, readers)
    seconds = time.monotonic() - started
    summary = {
        "qos": qos,
        "seed": SEED,
        "daemon_kills": counts["kill"],
        "broker_restarts": counts["restart"] + counts["broker-kill"],
        "broker_sigkills_after_autosave": counts["broker-kill"],
        "proxy_flaps": counts["flap"],
        "published_acknowledged": len(expected),
        "landed": through_spark.landed,
        "missing": len(through_spark.missing),
        "duplicates": len(through_spark.duplicates),
        "unexpected": len(through_spark.unexpected),
        "seconds": round(seconds, 1),
    }
    report(summary, f"soak-qos{qos}.json")
    assert plain.exact, plain.lines()
    assert through_spark.exact, through_spark.lines()


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("qos", _qos_levels(2))
def test_forwarding_soak_table_and_upstream_hold_every_acknowledged_read_through_the_same_faults(
    qos, mosquitto_factory, daemon_factory, spark_session, tmp_path
):
    rng = random.Random(SEED * 10 + qos + 5)
    print(
        f"forwarding soak seed {SEED}: {KILLS} kills, {RESTARTS} broker restarts, {FLAPS} flaps "
        f"on each side, {FORWARD_KILLS} kills of the forward process, QoS {qos}"
    )
    source, upstream = mosquitto_factory(), mosquitto_factory()
    source_proxy = FaultProxy(source.host, source.port)
    upstream_proxy = FaultProxy(upstream.host, upstream.port)
    source_proxy.start()
    upstream_proxy.start()
    # The cloud side reads the upstream broker directly: only the gateway's link flaps.
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=2)
    data = tmp_path / "data"
    env = {
        **daemon_env(source_proxy, data),
        "FXGATE__UPSTREAM__HOST": upstream.host,
        "FXGATE__UPSTREAM__PORT": str(upstream_proxy.port),
        "FXGATE__UPSTREAM__RECONNECT_MIN_DELAY_SECONDS": "0.2",
        "FXGATE__UPSTREAM__RECONNECT_MAX_DELAY_SECONDS": "1.0",
        "FXGATE__ROUTES__0__SOURCE": "zebra/fx/+/reads",
        "FXGATE__ROUTES__0__TARGET": "cloud/{environment}/{reader}",
        "FXGATE__ROUTES__0__QOS": str(qos),
        # Each kill of the forward process restarts the daemon's actors: the full schedule
        # would pass the default budget of 3 restarts in 300 s, which the soak does not test.
        "FXGATE__GATEWAY__MAX_RESTARTS": "100",
    }
    publisher = SoakPublisher(source.host, source.port, readers=4, qos=qos, rate=300, seed=qos)
    started = time.monotonic()
    try:
        faults = Faults(rng, publisher, daemon_factory, env, source, source_proxy, upstream_proxy)
        faults.run(schedule(rng, forwarding=True))
        publisher.stop()
        expected = expected_read_ids(publisher.acked)
        assert not publisher.refused
        wait_for_the_table(faults.daemon, data, expected)
        wanted = Counter(record.message_key for record in publisher.acked)
        with cloud.cond:
            # The count first: the set is built only once enough messages are in.
            cloud.cond.wait_for(
                lambda: (
                    len(cloud.messages) >= len(wanted) and set(upstream_keys(cloud)) >= set(wanted)
                ),
                240,
            )
        assert faults.daemon.terminate() == 0
        # Whatever the broker still had on its way to the cloud side is delivered by now.
        keys = upstream_keys(cloud)
    finally:
        cloud.close()
        source_proxy.close()
        upstream_proxy.close()

    ids, readers = landed_ids_spark(spark_session, data / "tables")
    through_spark = compare(expected, ids, readers)
    counts = faults.counts
    summary = {
        "qos": qos,
        "seed": SEED,
        "daemon_kills": counts["kill"],
        "forward_process_kills": counts["forward-kill"],
        "broker_restarts": counts["restart"] + counts["broker-kill"],
        "source_flaps": counts["flap"],
        "upstream_flaps": counts["upstream-flap"],
        "published_acknowledged": len(expected),
        "landed": through_spark.landed,
        "missing": len(through_spark.missing),
        "duplicates": len(through_spark.duplicates),
        "upstream_messages": sum(keys.values()),
        "upstream_missing": len(set(wanted) - set(keys)),
        "upstream_duplicates": sum(n - 1 for n in keys.values() if n > 1),
        "upstream_unexpected": len(set(keys) - set(wanted)),
        "seconds": round(time.monotonic() - started, 1),
    }
    report(summary, f"soak-forward-qos{qos}.json")
    assert through_spark.exact, through_spark.lines()
    assert set(keys) == set(wanted), summary
    if qos == 2:
        assert keys == wanted, summary  # exactly once upstream (DESIGN §7.5)


def upstream_keys(cloud: Collector) -> Counter:
    return Counter(props[IDEMPOTENCY_PROPERTY] for _, _, props in cloud.messages)
