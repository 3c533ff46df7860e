"""What an operator drives from outside: SIGUSR1 stack dumps, the bounded stop, the settings
behind them, and the example systemd unit."""

import configparser
import logging
import os
import signal
import threading
from pathlib import Path

import pytest

from actors.app.daemon import EXIT_STOP_TIMEOUT, StopDeadline, dump_stacks
from actors.app.metrics import HealthThresholds
from actors.clock import SimulatedClock
from actors.config.schema import load_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_a_stack_dump_names_every_thread_with_its_stack(caplog):
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="InboundLedger-99", daemon=True)
    worker.start()
    try:
        with caplog.at_level(logging.WARNING, logger="actors.app.daemon"):
            dump_stacks("test")
    finally:
        release.set()
        worker.join(5)
    dumped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    ours = [m for m in dumped if m.startswith("stack of thread InboundLedger-99 ")]
    assert len(ours) == 1
    assert "in wait" in ours[0]  # the frame it is blocked in, not just its name
    assert any(m.startswith("stack of thread MainThread ") for m in dumped)


def test_the_stop_deadline_exits_3_naming_what_still_runs_once_the_timeout_passes(caplog):
    clock = SimulatedClock(start_monotonic=0.0)
    exits = []
    deadline = StopDeadline(
        clock, 60.0, still_running=lambda: ["SparkWriterActor"], exit=exits.append
    )
    deadline.arm()
    clock.advance(59)
    assert exits == []
    with caplog.at_level(logging.WARNING, logger="actors.app.daemon"):
        clock.advance(2)
    assert exits == [EXIT_STOP_TIMEOUT]
    assert "did not finish within 60 s; still running: SparkWriterActor" in caplog.text
    assert "stack of thread MainThread" in caplog.text


def test_a_stop_that_finishes_in_time_disarms_the_deadline():
    clock = SimulatedClock(start_monotonic=0.0)
    exits = []
    deadline = StopDeadline(clock, 60.0, still_running=list, exit=exits.append)
    deadline.arm()
    clock.advance(30)
    deadline.disarm()
    clock.advance(600)
    assert exits == []


def test_operator_settings_have_defaults_parse_from_the_environment_and_are_summarised():
    default = load_config(None, environ={}, hostname="gw")
    assert default.gateway.stop_timeout_seconds == 60.0
    assert default.gateway.metrics_port == 0
    assert "stop timeout 60 s, metrics off" in default.summary_lines()
    config = load_config(
        None,
        environ={
            "FXGATE__GATEWAY__STOP_TIMEOUT_SECONDS": "15",
            "FXGATE__GATEWAY__METRICS_PORT": "9108",
            "FXGATE__GATEWAY__HEALTH_CONNECTION_DOWN_SECONDS": "5",
            "FXGATE__GATEWAY__HEALTH_SPARK_FAILURES": "7",
        },
        hostname="gw",
    )
    summary = "\n".join(config.summary_lines())
    assert "stop timeout 15 s" in summary
    assert "metrics on http://127.0.0.1:9108/metrics" in summary
    assert "connection down > 5 s" in summary
    assert "7 failed table write attempts in a row" in summary
    assert HealthThresholds.from_config(config.gateway).spark_failures == 7
    assert HealthThresholds.from_config(default.gateway).spark_failures == 3


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("stop_timeout_seconds", "0"),
        ("metrics_port", "70000"),
        ("metrics_host", '""'),
        ("health_spark_failures", "0"),
    ],
)
def test_bad_operator_settings_name_the_key(key, value):
    from actors.config.schema import ConfigError

    with pytest.raises(ConfigError) as error:
        load_config(None, environ={f"FXGATE__GATEWAY__{key.upper()}": value}, hostname="gw")
    assert f"gateway.{key}" in str(error.value)


def test_the_systemd_unit_stops_with_sigterm_a_little_after_the_daemons_own_stop_timeout():
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read(CONFIGS / "fxgate.service")
    service = unit["Service"]
    stop_timeout = load_config(None, environ={}, hostname="gw").gateway.stop_timeout_seconds
    assert service["ExecStart"].endswith("fxgate run --config /etc/fxgate/gateway.toml")
    assert service["KillSignal"] == "SIGTERM"
    assert stop_timeout < int(service["TimeoutStopSec"]) <= stop_timeout + 30
    assert service["Restart"] == "on-failure"
    # A config error (2) and a corrupt database (4) need a person, not a loop.
    assert service["RestartPreventExitStatus"].split() == ["2", "4"]
    assert service["StateDirectoryMode"] == "0700"
    assert service["User"] == "fxgate"
    assert service["StateDirectory"] == "fxgate"
    assert "EnvironmentFile" in service
    # SIGUSR1 is a diagnostic, not a reload: `systemctl reload` must not pretend to reload.
    assert "ExecReload" not in service
    assert "systemctl kill -s USR1 fxgate" in (CONFIGS / "fxgate.service").read_text()


@pytest.mark.broker
@pytest.mark.spark
def test_sigusr1_logs_every_actor_threads_stack_and_the_daemon_keeps_running(
    mosquitto, daemon_factory, tmp_path
):
    env = {
        "FXGATE__SOURCE__PORT": str(mosquitto.port),
        "FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data"),
    }
    daemon = daemon_factory(env)
    daemon.wait_for_log(r"source: subscribed to zebra/fx/\+/reads", timeout=60)
    mark = daemon.mark()
    os.kill(daemon.pid, signal.SIGUSR1)
    daemon.wait_for_log(r"WARNING actors\.app\.daemon: stack dump \(SIGUSR1\)", after=mark)
    for actor in ("InboundLedger", "PackActor", "ConnectionActor", "SparkWriterActor"):
        daemon.wait_for_log(rf"stack of thread {actor}-\d+ ", timeout=10, after=mark)
    assert daemon.proc.poll() is None
    # Still working: a second dump is answered as well, then the orderly stop.
    mark = daemon.mark()
    os.kill(daemon.pid, signal.SIGUSR1)
    daemon.wait_for_log(r"stack of thread InboundLedger-\d+ ", timeout=10, after=mark)
    assert daemon.terminate() == 0
    assert daemon.count_logs(r"did not finish within") == 0
