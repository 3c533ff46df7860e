"""The soak: random SIGKILLs of the daemon, broker restarts and connection flaps while four readers
publish; afterwards the table must equal the publishers' acknowledged set exactly.

Sizes come from the environment so that `make soak` runs the full schedule and CI a short one:
FXGATE_SOAK_KILLS (default 4), FXGATE_SOAK_BROKER_RESTARTS (2), FXGATE_SOAK_FLAPS (10),
FXGATE_SOAK_SEED (random choices; printed so a failure can be replayed).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from actors.devtools.simulate import expected_read_ids
from spark.report import compare, landed_ids_arrow, landed_ids_spark
from tests.harness.checks import wait_until_landed
from tests.harness.proxy import FaultProxy
from tests.harness.publisher import SoakPublisher

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("FXGATE_SOAK_KILLS", "4"))
RESTARTS = int(os.environ.get("FXGATE_SOAK_BROKER_RESTARTS", "2"))
FLAPS = int(os.environ.get("FXGATE_SOAK_FLAPS", "10"))
SEED = int(os.environ.get("FXGATE_SOAK_SEED", str(random.SystemRandom().randrange(1 << 30))))
FLAPS_PER_BURST = 5
RESULTS = (
    Path(os.environ.get("FXGATE_SOAK_RESULTS", "")) if "FXGATE_SOAK_RESULTS" in os.environ else None
)


def schedule(rng: random.Random) -> list[str]:
    flap_bursts = -(-FLAPS // FLAPS_PER_BURST)
    events = ["kill"] * KILLS + ["restart"] * RESTARTS + ["flap"] * flap_bursts
    rng.shuffle(events)
    if RESTARTS:
        # One of the restarts is a SIGKILL of the broker right after an autosave.
        events[events.index("restart")] = "broker-kill"
    return events


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("qos", [1, 2])
def test_soak_table_equals_the_acknowledged_set_through_kills_restarts_and_flaps(
    qos, mosquitto, daemon_factory, spark_session, tmp_path
):
    rng = random.Random(SEED * 10 + qos)
    print(f"soak seed {SEED}: {KILLS} kills, {RESTARTS} broker restarts, {FLAPS} flaps, QoS {qos}")
    proxy = FaultProxy(mosquitto.host, mosquitto.port)
    proxy.start()
    data = tmp_path / "data"
    env = {
        "FXGATE__SOURCE__PORT": str(proxy.port),
        "FXGATE__SOURCE__RECONNECT_MIN_DELAY_SECONDS": "0.2",
        "FXGATE__SOURCE__RECONNECT_MAX_DELAY_SECONDS": "2.0",
        "FXGATE__GATEWAY__DATA_DIR": str(data),
        "FXGATE__PACKS__LINGER_SECONDS": "0.2",
        "FXGATE__PACKS__MAX_MESSAGES": "50",
        "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
    }
    publisher = SoakPublisher(
        mosquitto.host, mosquitto.port, readers=4, qos=qos, rate=300, seed=qos
    )
    started = time.monotonic()
    counts = {"kill": 0, "restart": 0, "broker-kill": 0, "flap": 0}
    try:
        daemon = daemon_factory(env)
        daemon.wait_for_log(r"source: subscribed", timeout=60)
        publisher.start()
        for event in schedule(rng):
            # A random amount of progress between faults: the kill lands at a random moment.
            assert publisher.wait_for_acks(len(publisher.acked) + rng.randrange(50, 600), 120)
            if event == "kill":
                daemon.kill()
                daemon = daemon_factory(env)
                counts["kill"] += 1
            elif event == "restart":
                mosquitto.restart()
                counts["restart"] += 1
            elif event == "broker-kill":
                publisher.pause()
                assert publisher.wait_idle(60)
                # mosquitto logs "Saving" as a save begins; once the next one begins, the
                # first (which holds everything the readers got acked) is complete on disk.
                mark = mosquitto.line_count()
                assert mosquitto.wait_for_output("Saving in-memory database", 10, start=mark)
                mark = mosquitto.line_count()
                assert mosquitto.wait_for_output("Saving in-memory database", 10, start=mark)
                mosquitto.kill()
                mosquitto.start()
                publisher.resume()
                counts["broker-kill"] += 1
            else:
                proxy.flap(FLAPS_PER_BURST, timeout=60)
                counts["flap"] += FLAPS_PER_BURST
        publisher.stop()
        expected = expected_read_ids(publisher.acked)
        assert not publisher.refused
        try:
            wait_until_landed(daemon, data, len(expected), timeout=240)
        except AssertionError as stalled:
            found = compare(expected, landed_ids_arrow(data / "tables")[0])
            raise AssertionError(f"{found.lines()}\n{stalled}") from None
        assert daemon.terminate() == 0
    finally:
        proxy.close()

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
    print(json.dumps(summary))
    if RESULTS is not None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"soak-qos{qos}.json").write_text(json.dumps(summary, indent=2) + "\n")
    assert plain.exact, plain.lines()
    assert through_spark.exact, through_spark.lines()
