"""`fxgate run` as a real process: start-up errors, graceful SIGTERM, status, no orphans."""

import json
import os
import subprocess
import sys

import pytest

from actors.simulate import expected_read_ids, simulate
from spark.report import compare, landed_ids_arrow

pytestmark = pytest.mark.broker


def fxgate(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "actors.cli", *args],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_bad_config_file_fails_at_start_listing_every_error_with_its_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[source]\nport = "abc"\n\n[packs]\nmax_mesages = 10\n')
    result = fxgate("run", "--config", str(bad))
    assert result.returncode == 2
    assert "source.port" in result.stderr
    assert "packs.max_mesages" in result.stderr
    assert "did you mean 'max_messages'" in result.stderr


def test_production_mode_without_an_environment_id_refuses_to_start(tmp_path):
    conf = tmp_path / "prod.toml"
    conf.write_text('[gateway]\nmode = "production"\n')
    env = {k: v for k, v in os.environ.items() if k != "MQTT_ENVIRONMENT_ID"}
    result = subprocess.run(
        [sys.executable, "-m", "actors.cli", "run", "--config", str(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "source.environment_id" in result.stderr


@pytest.mark.spark
def test_sigterm_flushes_every_read_into_the_table_exits_0_and_leaves_no_process(
    mosquitto, daemon_factory, tmp_path
):
    data = tmp_path / "data"
    env = {
        "FXGATE__SOURCE__PORT": str(mosquitto.port),
        "FXGATE__GATEWAY__DATA_DIR": str(data),
        # Long linger and batch waits: only the graceful stop can flush these reads in time.
        "FXGATE__PACKS__LINGER_SECONDS": "600",
        "FXGATE__SPARK__BATCH_MAX_SECONDS": "600",
    }
    daemon = daemon_factory(env)
    daemon.wait_for_log(r"source: subscribed to zebra/fx/\+/reads", timeout=60)
    daemon.wait_for_log(r"spark writer ready", timeout=120)
    jvms = daemon.remember_children()
    assert jvms, "the Spark JVM should be a child of the daemon"

    result = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=150, qos=2)
    mark = daemon.mark()
    status = fxgate("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["daemon"]["running"] is True
    assert report["daemon"]["source"]["state"] == "connected"

    assert daemon.terminate() == 0
    daemon.wait_for_log(r"batch \d+ written: \d+ messages", after=mark)
    assert daemon.alive_spawned() == []

    ids, _ = landed_ids_arrow(data / "tables")
    assert compare(expected_read_ids(result.published), ids).exact

    after = fxgate("status", env=env)
    assert after.returncode == 0
    assert "daemon:     not running" in after.stdout
    assert "reads 300 rows" in after.stdout
    assert "0 message(s) not yet in the table" in after.stdout
