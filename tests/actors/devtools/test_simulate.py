import itertools
import json
import threading
from collections import defaultdict

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from actors.clock import SimulatedClock
from actors.devtools.broker_process import free_port
from actors.devtools.simulate import (
    FCC_CHANNELS_MHZ,
    Pacer,
    PublishedRecord,
    SimulationResult,
    TagEventGenerator,
    expected_read_ids,
    format_reader_timestamp,
    read_manifest,
    reader_names,
    simulate,
    write_manifest,
)
from persistence.keys import message_key
from spark.zebra import parse_payload

WALL = 1_800_000_000.123456  # 2027-01-15T08:00:00.123456Z


def fixed_wall() -> float:
    return WALL


def payloads(generator: TagEventGenerator, n: int, batch: int = 1) -> list[bytes]:
    return [generator.next_payload(batch) for _ in range(n)]


def test_reader_names_are_numbered_from_one_with_two_digits():
    assert reader_names(3) == ["fx9600-01", "fx9600-02", "fx9600-03"]


def test_generator_with_the_same_seed_reader_and_clock_repeats_its_payloads_exactly():
    first = payloads(TagEventGenerator("fx9600-01", seed=7, wall=fixed_wall), 50, batch=3)
    second = payloads(TagEventGenerator("fx9600-01", seed=7, wall=fixed_wall), 50, batch=3)
    assert first == second


def test_generator_payloads_differ_by_seed_and_by_reader():
    base = payloads(TagEventGenerator("fx9600-01", seed=7, wall=fixed_wall), 20)
    assert base != payloads(TagEventGenerator("fx9600-01", seed=8, wall=fixed_wall), 20)
    assert base != payloads(TagEventGenerator("fx9600-02", seed=7, wall=fixed_wall), 20)


def test_event_num_counts_up_from_one_per_reader_across_single_and_batched_payloads():
    one = TagEventGenerator("fx9600-01", wall=fixed_wall)
    two = TagEventGenerator("fx9600-02", wall=fixed_wall)
    nums_one = [
        r.event_num for p in (one.next_payload(), one.next_payload(4)) for r in parse_payload(p)
    ]
    nums_two = [r.event_num for r in parse_payload(two.next_payload(2))]
    assert nums_one == [1, 2, 3, 4, 5]
    assert nums_two == [1, 2]


def test_batch_payload_is_a_json_array_that_the_parser_reads_whole():
    payload = TagEventGenerator("fx9600-01", wall=fixed_wall).next_payload(batch=5)
    assert isinstance(json.loads(payload), list)
    assert len(parse_payload(payload)) == 5


def test_single_payload_is_one_json_object():
    payload = TagEventGenerator("fx9600-01", wall=fixed_wall).next_payload()
    assert isinstance(json.loads(payload), dict)
    assert len(parse_payload(payload)) == 1


def test_zero_batch_is_refused():
    with pytest.raises(ValueError):
        TagEventGenerator("fx9600-01").next_payload(0)


def test_fcc_hop_table_has_fifty_channels_from_902_75_to_927_25_mhz():
    assert len(FCC_CHANNELS_MHZ) == 50
    assert FCC_CHANNELS_MHZ[0] == 902.75 and FCC_CHANNELS_MHZ[-1] == 927.25
    assert all(b - a == 0.5 for a, b in itertools.pairwise(FCC_CHANNELS_MHZ))


def test_generated_reads_stay_within_what_an_fx9600_reports():
    generator = TagEventGenerator("fx9600-01", seed=3, wall=fixed_wall)
    reads = [r for p in payloads(generator, 400, batch=5) for r in parse_payload(p)]
    assert {r.channel for r in reads} <= set(FCC_CHANNELS_MHZ)
    assert len({r.channel for r in reads}) > 40  # hops over the table, not stuck on a channel
    assert {r.antenna for r in reads} == {1, 2, 3, 4}
    assert all(-75 <= r.peak_rssi <= -35 and r.peak_rssi.is_integer() for r in reads)
    assert all(0 <= r.phase <= 180 and round(r.phase, 1) == r.phase for r in reads)
    assert all(len(r.epc) == 24 and r.epc.startswith("e280") for r in reads)
    assert len({r.epc for r in reads}) <= 500


def test_timestamp_is_the_wall_clock_in_the_readers_own_format():
    assert format_reader_timestamp(WALL) == "2027-01-15T08:00:00.123+0000"
    (read,) = parse_payload(TagEventGenerator("fx9600-01", wall=fixed_wall).next_payload())
    assert read.event_time.isoformat() == "2027-01-15T08:00:00.123000+00:00"


def test_expected_read_ids_cover_every_read_of_every_published_message():
    published = [PublishedRecord("t/a/reads", "k1", 1), PublishedRecord("t/b/reads", "k2", 3)]
    assert expected_read_ids(published) == {"k1:0", "k2:0", "k2:1", "k2:2"}


def test_manifest_round_trips_the_published_records(tmp_path):
    published = [PublishedRecord("t/a/reads", "k1", 1), PublishedRecord("t/b/reads", "k2", 3)]
    path = tmp_path / "manifest.jsonl"
    write_manifest(path, SimulationResult(published, failed=1, seconds=0.5))
    assert read_manifest(path) == published
    assert not list(tmp_path.glob("*.tmp"))


def test_pacer_holds_each_message_until_its_slot_on_the_injected_clock():
    clock = SimulatedClock(start_monotonic=1000.0)
    pacer = Pacer(clock, rate=10.0)
    pacer.wait_turn(0)  # slot 0 is now: must not block (the test would hang here otherwise)
    released_at: list[float] = []
    done = threading.Event()

    def third_message() -> None:
        pacer.wait_turn(3)
        released_at.append(clock.monotonic())
        done.set()

    waiter = threading.Thread(target=third_message)
    waiter.start()
    try:
        assert clock.wait_for_timers(1, timeout=5), "pacer did not wait for its slot"
        assert clock.next_due_in() == pytest.approx(0.3)
        assert not done.is_set()
        clock.advance(0.3)
        assert done.wait(5)
        assert released_at == [pytest.approx(1000.3)]
    finally:
        clock.advance(10)
        waiter.join(5)


def test_pacer_with_rate_zero_never_waits():
    clock = SimulatedClock()
    pacer = Pacer(clock, rate=0)
    for index in range(1000):
        pacer.wait_turn(index)
    assert clock.pending() == 0


def test_simulate_against_no_broker_raises_and_leaves_no_paho_thread():
    with pytest.raises(OSError):
        simulate("127.0.0.1", free_port(), readers=2, rate=0, count=1, client_id_prefix="nobody")
    assert not [t for t in threading.enumerate() if "nobody" in t.name]


class Subscriber:
    """A bare paho client recording every message it is delivered, by message key."""

    def __init__(self, host: str, port: int, topic: str) -> None:
        self.keys: list[str] = []
        self.by_topic: dict[str, list[str]] = defaultdict(list)
        self._cond = threading.Condition()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="test-subscriber", protocol=mqtt.MQTTv5
        )
        self.client.on_subscribe = lambda *args: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(host, port, clean_start=True)
        self.client.loop_start()
        self.client.subscribe(topic, qos=2)
        assert self._subscribed.wait(10), "no SUBACK"

    def _on_message(self, client, userdata, message) -> None:
        key = message_key(message.topic, message.payload)
        with self._cond:
            self.keys.append(key)
            self.by_topic[message.topic].append(key)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 30) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.keys) >= count, timeout)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.broker
@pytest.mark.parametrize("qos", [1, 2])
def test_simulate_publishes_every_message_and_records_acks(mosquitto, qos):
    subscriber = Subscriber(mosquitto.host, mosquitto.port, "zebra/fx/+/reads")
    handed: list[int] = []
    try:
        result = simulate(
            mosquitto.host,
            mosquitto.port,
            readers=2,
            rate=0,
            count=50,
            qos=qos,
            batch=2,
            seed=1,
            progress=handed.append,
        )
        assert result.failed == 0
        assert len(result.published) == 100
        assert subscriber.wait_for(100), f"subscriber saw {len(subscriber.keys)} of 100"
    finally:
        subscriber.close()

    published_keys = [r.message_key for r in result.published]
    assert len(set(published_keys)) == 100
    assert sorted(subscriber.keys) == sorted(published_keys)  # exactly these, none twice
    for topic in ("zebra/fx/fx9600-01/reads", "zebra/fx/fx9600-02/reads"):
        in_publish_order = [r.message_key for r in result.published if r.topic == topic]
        assert len(in_publish_order) == 50
        assert subscriber.by_topic[topic] == in_publish_order  # per-reader order holds
    assert {r.reads for r in result.published} == {2}
    assert handed == list(range(1, 101))
    assert not [t for t in threading.enumerate() if "fx-sim" in t.name]


def test_event_timestamps_are_the_wall_time_frozen_by_freezegun():
    import json

    from freezegun import freeze_time

    with freeze_time("2026-11-21 10:00:00.250"):
        event = json.loads(TagEventGenerator("fx9600-01", seed=3).next_payload())
    assert event["timestamp"] == "2026-11-21T10:00:00.250+0000"


@pytest.mark.broker
def test_simulated_heartbeats_report_exactly_the_data_messages_acknowledged_before_them(mosquitto):
    """Received in the order the broker routed them, each heartbeat's `sent` equals the data
    messages of its reader that came before it; GPI changes toggle their pin; all of a reader's
    events are numbered on one counter."""
    from spark.zebra import parse_management_payload
    from tests.harness.mqtt import Collector

    collector = Collector(mosquitto.host, mosquitto.port, "zebra/fx/#", qos=1)
    counters = {}
    try:
        result = simulate(
            mosquitto.host,
            mosquitto.port,
            readers=2,
            rate=0,
            count=25,
            qos=1,
            heartbeat_every=10,
            gpi_every=5,
            counters=counters,
        )
        # Per reader: heartbeats at 0, 10, 20 and 25 data messages, GPI after each 5.
        assert len(result.published) == 50 and len(result.management) == 2 * (4 + 5)
        messages = collector.wait_for(50 + 18)
    finally:
        collector.close()
    assert len(messages) == 68
    data_seen: dict[str, int] = defaultdict(int)
    reported: dict[str, list[int]] = defaultdict(list)
    gpi: dict[str, list[str]] = defaultdict(list)
    numbers: dict[str, list[int]] = defaultdict(list)
    for topic, payload, _ in messages:
        reader = topic.split("/")[-2]
        if topic.endswith("/reads"):
            data_seen[reader] += 1
            numbers[reader] += [read.event_num for read in parse_payload(payload)]
            continue
        assert topic == f"zebra/fx/{reader}/mgmt"
        event = parse_management_payload(payload)
        numbers[reader].append(event.event_num)
        if event.is_heartbeat:
            assert event.counters.sent == data_seen[reader], (reader, event)
            reported[reader].append(event.counters.sent)
        else:
            gpi[reader].append(json.loads(event.data_json)["state"])
    assert reported == {"fx9600-01": [0, 10, 20, 25], "fx9600-02": [0, 10, 20, 25]}
    # Tag and management events share the reader's eventNum counter (DESIGN §7.9): no gap.
    assert {r: sorted(n) for r, n in numbers.items()} == {
        r: list(range(1, 25 + 4 + 5 + 1)) for r in ("fx9600-01", "fx9600-02")
    }
    assert gpi["fx9600-01"] == ["HIGH", "LOW", "HIGH", "LOW", "HIGH"]
    assert counters["fx9600-01"].sent == 25 and counters["fx9600-01"].received == 25

    # The same counters carried into the next run go on counting.
    more = simulate(mosquitto.host, mosquitto.port, 2, 0, 3, heartbeat_every=100, counters=counters)
    assert len(more.management) == 4
    assert counters["fx9600-02"].sent == 28
