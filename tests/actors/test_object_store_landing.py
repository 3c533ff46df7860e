"""`fxgate run` landing into tables on an object store (issue 35), with no JVM: an Azurite
(tests/harness/azurite.py) reached as Azure is, the storage account variables in the daemons'
environment and `[spark] tables_dir = "az://fxgate/env-a"`; and, for the SIGKILLs test, a
SeaweedFS S3 gateway (tests/harness/seaweedfs.py) reached as S3 is, with `s3://fxgate/env-a`.

Through SIGKILLs of the daemon and a restart of the store while reads flow, and maintenance
passes on the daemon's schedule among them, the table holds every read the publishers got
acknowledged exactly once; readers in other processes (delta-rs, Polars, DuckDB), reading all
along, never see a read twice. The same for two members of one shared group on the one table
there. A store outage of a minute at the source broker's shipped queue limits, and a store that
refuses the credentials of `[spark] store_credentials_file` (403), are waited out with the reads
held in the ledger. FXGATE_OBJECT_STORE_SEED replays the random moments (the seed is printed).
"""

from __future__ import annotations

import base64
import os
import random
import time
from urllib.parse import parse_qs, quote

import pytest

from actors.devtools.simulate import expected_read_ids, simulate
from spark.report import compare, landed_ids_arrow
from spark.tables import READS, table_path
from tests.actors.test_several_gateways import Publishing, member_env, shares
from tests.harness.checks import wait_until, wait_until_landed, wait_until_landed_union
from tests.harness.daemon import gateway_env
from tests.harness.delta_readers import delta_readers

SEED = int(
    os.environ.get("FXGATE_OBJECT_STORE_SEED", str(random.SystemRandom().randrange(1 << 30)))
)
READERS = 2
MESSAGES_PER_READER = 500  # per QoS: 2 readers x 500 x 2 QoS = 2,000 reads
RATE = 80.0  # messages/s per QoS: about 6 s of publishing
# Passes often enough that several run while the reads land (OPTIMIZE, VACUUM, checkpoints).
MAINTENANCE = {
    "FXGATE__COMPACTION__START_DELAY_SECONDS": "1",
    "FXGATE__COMPACTION__INTERVAL_SECONDS": "3",
}
ENGINES = ("deltalake", "polars", "duckdb")


def publish(publishing: Publishing, broker) -> None:
    common = {"host": broker.host, "port": broker.port, "readers": READERS, "rate": RATE}
    publishing.start("q1", **common, count=MESSAGES_PER_READER, qos=1, seed=11)
    publishing.start(
        "q2",
        **common,
        count=MESSAGES_PER_READER,
        qos=2,
        seed=12,
        topic_template="zebra/fx/q2-{reader}/reads",
    )


def check_readers(readers) -> int:
    """Every read each reader made saw each key once (a read made while the store was down
    failed, and says so); how many reads saw rows."""
    seen = 0
    for engine, reader in readers.items():
        for read in reader.reads():
            if "error" in read:
                continue
            assert read["duplicate_keys"] == [], (engine, read)
            seen += read["rows"] > 0
    return seen


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_daemon_lands_into_the_store_through_sigkills_and_its_restart_each_read_once(
    mosquitto, object_store_process, daemon_factory, tmp_path
):
    store = object_store_process
    rng = random.Random(SEED)
    total = 2 * READERS * MESSAGES_PER_READER
    kill_at = sorted(rng.sample(range(total // 10, total * 8 // 10), 2))
    restart_at = rng.randrange(total // 5, total * 7 // 10)
    print(f"object-store seed {SEED}: SIGKILL at {kill_at}, store restart at {restart_at}")
    tables = store.create_root("fxgate") + "/env-a"
    data = tmp_path / "gw"
    env = {**gateway_env(mosquitto, data), "FXGATE__SPARK__TABLES_DIR": tables, **MAINTENANCE}

    daemon = daemon_factory(env)
    daemon.wait_for_log(r"source: subscribed to ", timeout=120)
    outputs = []
    with delta_readers(ENGINES, table_path(tables, READS), tmp_path / "readers") as readers:
        publishing = Publishing()
        publish(publishing, mosquitto)
        for moment, what in sorted([(k, "kill") for k in kill_at] + [(restart_at, "store")]):
            assert publishing.wait_for(moment, timeout=120), f"publishing stalled at {moment}"
            if what == "kill":
                daemon.kill()
                outputs.append(daemon.output())
                daemon = daemon_factory(env)
            else:
                # The ledger holds the reads while the store is away; the writer's backoff
                # lands them once it is back, with the same batch ids.
                mark = daemon.mark()
                store.stop()
                daemon.wait_for_log(r"batch \d+: table write failed", timeout=120, after=mark)
                store.start()
        results = publishing.join(timeout=300)
        assert sum(result.failed for result in results) == 0
        expected = expected_read_ids(record for result in results for record in result.published)
        assert len(expected) == total
        wait_until_landed(daemon, data, total, timeout=300, tables=tables)
        daemon.wait_for_log(r"maintenance pass \(scheduled\): reads: ", timeout=60)
        # Each reader reads the whole table once more, after the last pass.
        landed_at = time.time()
        for reader in readers.values():
            assert reader.wait_for_read_started_after(landed_at, 120)["rows"] == total
    assert daemon.terminate() == 0, daemon.output()
    assert daemon.alive_spawned() == []
    landed = compare(expected, landed_ids_arrow(tables)[0])
    assert landed.exact, landed.lines()
    assert check_readers(readers) > 0
    log = "\n".join([*outputs, daemon.output()])
    assert "no writer lock there" in log
    assert "Spark" not in log.split("batches are committed", 1)[1].split("\n", 1)[0]


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_members_of_a_group_land_into_one_azure_table_through_sigkills_each_read_once(
    mosquitto, azurite, daemon_factory, tmp_path
):
    rng = random.Random(SEED + 1)
    total = 2 * READERS * MESSAGES_PER_READER
    kill_at = sorted(rng.sample(range(total // 10, total * 8 // 10), 3))
    victims = [rng.choice(("a1", "a2")) for _ in kill_at]
    print(f"object-store group seed {SEED}: SIGKILL {list(zip(victims, kill_at, strict=True))}")
    tables = azurite.create_root("fxgate") + "/env-a"
    envs = {
        name: {
            **member_env(mosquitto, tmp_path / name, "env-a", name),
            "FXGATE__SPARK__TABLES_DIR": tables,
            **MAINTENANCE,
        }
        for name in ("a1", "a2")
    }
    daemons = {name: daemon_factory(env) for name, env in envs.items()}
    for daemon in daemons.values():
        daemon.wait_for_log(r"source: subscribed to \$share/fxgate-env-a/", timeout=120)
    with delta_readers(ENGINES, table_path(tables, READS), tmp_path / "readers") as readers:
        publishing = Publishing()
        publish(publishing, mosquitto)
        for victim, moment in zip(victims, kill_at, strict=True):
            assert publishing.wait_for(moment, timeout=120), f"publishing stalled at {moment}"
            daemons[victim].kill()
            daemons[victim] = daemon_factory(envs[victim])
        results = publishing.join(timeout=300)
        assert sum(result.failed for result in results) == 0
        expected = expected_read_ids(record for result in results for record in result.published)
        pairs = [(daemons[name], tmp_path / name) for name in ("a1", "a2")]
        wait_until_landed_union(pairs, len(expected), timeout=300, tables=tables)
    for daemon in daemons.values():
        assert daemon.terminate() == 0, daemon.output()
        assert daemon.alive_spawned() == []
    landed = compare(expected, landed_ids_arrow(tables)[0])
    assert landed.exact, landed.lines()
    assert set(shares(tables)) == {"fxgate-env-a-a1", "fxgate-env-a-a2"}
    assert check_readers(readers) > 0


# How long the store stays away in the outage test: minutes, the writer's backoff at its cap and
# many attempts failed (each one object_store's own ten quick retries); the readers publish at its
# start and again halfway. The backlog's size, not the outage's length, is what the ledger holds.
OUTAGE_SECONDS = 120.0


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_store_outage_at_the_shipped_queue_limits_loses_nothing_and_lands_the_backlog_after(
    mosquitto_factory, azurite, tmp_path
):
    from actors.backoff import Backoff
    from actors.clock import RealClock
    from actors.config.schema import load_config
    from actors.devtools.mosquitto import SHIPPED_LIMITS
    from actors.supervisor import Supervisor
    from tests.actors.test_ledger_is_the_buffer import (
        DROPPED,
        PACE,
        assert_upstream_got_each_once_in_order,
    )
    from tests.actors.test_outbound import forwarding_environ
    from tests.harness.mqtt import Collector

    source = mosquitto_factory(**SHIPPED_LIMITS)
    upstream = mosquitto_factory()
    tables = azurite.create_root("fxgate") + "/env-a"
    environ = forwarding_environ(
        source, upstream, tmp_path / "data", 1, FXGATE__SPARK__TABLES_DIR=tables
    )
    config = load_config(None, environ=environ, hostname="gw-test")
    clock = RealClock()
    supervisor = Supervisor(
        config,
        clock,
        session_factory=lambda: pytest.fail("no Spark session for tables on an object store"),
        writer_options={"retry_backoff": Backoff(0.5, 4.0, 0.0)},
    )
    cloud = Collector(upstream.host, upstream.port, "cloud/#", qos=1)
    try:
        supervisor.start()
        assert source.wait_for_output("fxgate-local-gw-test-gw-test 2 zebra/fx/+/reads", 15)
        azurite.stop()
        outage_began = clock.wall()
        published = []
        for wave in range(2):
            if wave:
                assert wait_until(lambda: clock.wall() - outage_began >= OUTAGE_SECONDS / 2, 120)
            sent = simulate(
                source.host, source.port, readers=2, rate=PACE, count=750, qos=1, seed=wave
            )
            # Every read acknowledged to the readers, and forwarded, while the store is away.
            assert sent.failed == 0 and len(sent.published) == 1500
            published += sent.published
        messages = cloud.wait_for(3000, timeout=120)
        assert_upstream_got_each_once_in_order(messages, published)

        def out_long_enough() -> bool:
            health = supervisor.status().get("spark") or {}
            failing = health.get("failing_since") is not None and health.get("failures", 0) >= 3
            return failing and clock.wall() - outage_began >= OUTAGE_SECONDS

        # The writer's state, not a sleep: it has failed attempt after attempt for the outage.
        assert wait_until(out_long_enough, OUTAGE_SECONDS + 60)
        status = supervisor.status()
        assert supervisor.rows_written == 0
        assert "MicrosoftAzure" in status["spark"]["last_error"], status["spark"]
        assert status["ledger"]["lag"]["table"]["messages"] >= 3000
        assert DROPPED not in source.output()
        azurite.start()
        assert supervisor.wait_for_landed(3000, timeout=120), supervisor.status()
    finally:
        cloud.close()
        supervisor.stop()
        clock.close()
    landed = compare(expected_read_ids(published), landed_ids_arrow(tables)[0])
    assert landed.exact, landed.lines()


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_store_refusing_the_credentials_file_is_waited_out_and_the_corrected_file_lands_once(
    mosquitto, azurite, daemon_factory, tmp_path, monkeypatch
):
    """The daemon takes its store credentials from `[spark] store_credentials_file` alone: the
    account and a SAS, as the docs advise. With a SAS signed by another key Azure (Azurite checks
    the signature as Azure does) answers 403 to every write: the reads are acknowledged and
    held in the ledger, /healthz says the writes fail, and no signature is ever logged. With
    the file corrected and the daemon restarted, every read lands once."""
    from tests.actors.app.test_metrics import free_port, get
    from tests.actors.test_ledger_is_the_buffer import json_reasons

    tables = azurite.create_root("fxgate") + "/env-a"
    key = azurite.environment()
    right = {name: value for name, value in key.items() if name != "AZURE_STORAGE_ACCOUNT_KEY"}
    right["AZURE_STORAGE_SAS_TOKEN"] = azurite.sas_token()
    other_key = base64.b64encode(b"not the account's key, 64 bytes long like Azure's keys......")
    wrong = {**right, "AZURE_STORAGE_SAS_TOKEN": azurite.sas_token(key=other_key.decode())}
    for name in key:  # the daemons reach the store through the file alone
        monkeypatch.delenv(name)
    credentials = tmp_path / "store.env"
    credentials.write_text("".join(f"{name}={value}\n" for name, value in wrong.items()))
    credentials.chmod(0o600)
    port = free_port()
    env = {
        **gateway_env(mosquitto, tmp_path / "gw"),
        "FXGATE__SPARK__TABLES_DIR": tables,
        "FXGATE__SPARK__STORE_CREDENTIALS_FILE": str(credentials),
        "FXGATE__GATEWAY__METRICS_PORT": str(port),
    }
    daemon = daemon_factory(env)
    daemon.wait_for_log(r"source: subscribed to ", timeout=120)
    published = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=300, qos=1)
    assert published.failed == 0 and len(published.published) == 600
    daemon.wait_for_log(r"batch \d+: table write failed \(attempt 3\)", timeout=120)

    def refused() -> bool:
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        return status == 503 and any("writes failing" in r for r in json_reasons(body))

    assert wait_until(refused, 30), get(f"http://127.0.0.1:{port}/healthz")
    assert daemon.terminate() == 0, daemon.output()
    refusals = daemon.output()
    assert "store credentials: AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_SAS_TOKEN, " in refusals
    # Azure's 403, as object_store words it.
    assert (
        "table write failed (attempt 1): Kernel error -> The operation lacked the necessary "
        "privileges" in refusals
    )

    credentials.write_text("".join(f"{name}={value}\n" for name, value in right.items()))
    daemon = daemon_factory(env)  # its environment taken: this process's reads the store now
    for name, value in right.items():
        monkeypatch.setenv(name, value)
    wait_until_landed(daemon, tmp_path / "gw", 600, timeout=180, tables=tables)
    assert daemon.terminate() == 0, daemon.output()
    logged = refusals + daemon.output()
    for token in (wrong["AZURE_STORAGE_SAS_TOKEN"], right["AZURE_STORAGE_SAS_TOKEN"]):
        signature = parse_qs(token)["sig"][0]
        assert signature not in logged and quote(signature, safe="") not in logged
    landed = compare(expected_read_ids(published.published), landed_ids_arrow(tables)[0])
    assert landed.exact, landed.lines()
