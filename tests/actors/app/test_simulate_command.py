"""`fxgate simulate`: management events next to the tag data (`--heartbeat-every`,
`--gpi-every`), and a local broker of the operator's kind (`--broker`)."""

import json
import os
import re
import signal
import sys

import psutil
import pytest
from click.testing import CliRunner

from actors.app.cli import BROKER_KINDS, main
from actors.devtools.broker_kinds import BROKERS
from actors.devtools.broker_process import free_port
from spark.zebra import parse_management_payload
from tests.harness.mqtt import Collector
from tests.harness.watched_process import WatchedProcess

pytestmark = pytest.mark.broker


def test_simulate_publishes_heartbeats_and_gpi_changes_on_the_management_topic(mosquitto):
    collector = Collector(mosquitto.host, mosquitto.port, "site/+/events", qos=1)
    try:
        result = CliRunner().invoke(
            main,
            [
                "simulate",
                "--port", str(mosquitto.port),
                "--readers", "1",
                "--count", "6",
                "--rate", "0",
                "--heartbeat-every", "3",
                "--gpi-every", "2",
                "--management-topic", "site/{reader}/events",
            ],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        # Heartbeats at 0, 3 and 6 data messages; GPI changes after 2, 4 and 6.
        assert "published 6 messages (6 reads, 6 management events)" in result.output
        messages = collector.wait_for(6, timeout=10)
    finally:
        collector.close()
    events = [parse_management_payload(payload) for _, payload, _ in messages]
    assert [t for t, _, _ in messages] == ["site/fx9600-01/events"] * 6
    assert [e.counters.sent for e in events if e.is_heartbeat] == [0, 3, 6]
    assert [json.loads(e.data_json)["pin"] for e in events if e.type == "gpi"] == [1, 1, 1]


class SimulateProcess(WatchedProcess):
    """`fxgate simulate` as a process of its own: it waits for a signal, so it can't run inside
    the test's process."""

    def __init__(self, *args: str) -> None:
        super().__init__()
        self._launch([sys.executable, "-m", "actors.app.cli", "simulate", *args], os.environ)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        found = self._first_match(pattern, timeout)
        assert found, f"no {pattern!r} within {timeout} s:\n{self.output()}"
        return found

    def end(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def test_the_cli_offers_exactly_the_brokers_the_harness_can_start():
    assert set(BROKER_KINDS) == set(BROKERS)


def test_simulate_with_a_broker_starts_it_publishes_keeps_it_for_the_gateway_and_stops_it(
    tmp_path,
):
    """A broker of the operator's kind for a trial run, as shipped: Mochi here (it starts in a
    fraction of a second; the same code starts mosquitto and HiveMQ)."""
    port = free_port()
    simulation = SimulateProcess(
        "--broker", "mochi", "--broker-dir", str(tmp_path / "mochi"),
        "--port", str(port), "--readers", "1", "--count", "3", "--rate", "0",
    )  # fmt: skip
    try:
        started = simulation.wait_for(r"mochi on 127\.0\.0\.1:(\d+) \(pid (\d+)")
        assert int(started.group(1)) == port
        broker_pid = int(started.group(2))
        simulation.wait_for(r"published 3 messages .* 0 failed")
        simulation.wait_for(r"keeps running on 127\.0\.0\.1:\d+")
        # The broker is still there for a gateway: another simulation publishes to it.
        collector = Collector("127.0.0.1", port, "zebra/fx/+/reads", qos=1)
        try:
            again = CliRunner().invoke(
                main, ["simulate", "--port", str(port), "--count", "2", "--rate", "0"]
            )
            assert again.exit_code == 0, again.output
            assert len(collector.wait_for(4, timeout=10)) == 4  # 2 readers x 2
        finally:
            collector.close()
        simulation.proc.send_signal(signal.SIGTERM)
        assert simulation.proc.wait(30) == 0
        assert "SIGTERM: stopping mochi" in simulation.output()
        assert not psutil.pid_exists(broker_pid) or psutil.Process(broker_pid).status() == "zombie"
    finally:
        simulation.end()
