"""`fxgate simulate --heartbeat-every --gpi-every`: management events next to the tag data."""

import json

import pytest
from click.testing import CliRunner

from actors.app.cli import main
from spark.zebra import parse_management_payload
from tests.harness.mqtt import Collector

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
