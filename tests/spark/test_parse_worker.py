"""The parse worker: a batch prepared in a child process is the batch prepared in the writer's
thread, on the fuzz corpus and the real shapes; a dead worker says so; no worker outlives the
process that started it."""

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persistence.records import ReaderCount
from spark.parse_worker import (
    HELPER_NICENESS,
    SPLIT_MIN_BYTES,
    BuildOptions,
    ParseWorker,
    ParseWorkerDied,
    _Helper,
    prepare_batch,
)
from spark.schema import join_parts
from tests.harness.checks import wait_until
from tests.spark.test_sanitise import Record
from tests.spark.test_zebra_fuzz import EVENTS_FILTER, MESSAGES_PER_EXAMPLE, PAYLOADS, TOPICS
from tests.spark.test_zebra_management import envelope, live_heartbeat
from tests.spark.test_zebra_reader_modes import SHAPES

FUZZ_OPTIONS = BuildOptions(events_filter=EVENTS_FILTER, max_payload_bytes=4096, max_reads=30)
MANAGEMENT = "zebra/fx/+/mgmt"
TAG = (
    b'{"data": {"idHex": "E28011606000020A1B2C3D4E", "eventNum": %d}, '
    b'"timestamp": "2026-11-21T10:00:00.123+0000"}'
)


@pytest.fixture(scope="module")
def fuzz_worker():
    worker = ParseWorker(FUZZ_OPTIONS)
    worker.start()
    yield worker
    worker.stop()


def assert_same_tables(built, expected) -> None:
    for name in ("reads", "dead_letters", "events", "reader_events"):
        assert getattr(built, name).equals(getattr(expected, name), check_metadata=True), name
    assert built.observations == expected.observations


def assert_same(here, there) -> None:
    assert_same_tables(there.tables, here.tables)
    assert there.readers == here.readers
    assert there.health == here.health


@settings(
    # 300 examples of 10 messages, each batch made in both places.
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.lists(
        st.tuples(TOPICS, PAYLOADS), min_size=MESSAGES_PER_EXAMPLE, max_size=MESSAGES_PER_EXAMPLE
    )
)
def test_the_worker_prepares_every_fuzzed_batch_exactly_as_the_writers_thread_does(
    fuzz_worker, messages
):
    records = [
        Record(f"k{index}", topic, payload, received_time=1.7e9 + index, seq=index)
        for index, (topic, payload) in enumerate(messages)
    ]
    here = prepare_batch(records, 1, FUZZ_OPTIONS, {}, {})
    there = fuzz_worker.prepare(records, 1, {}, {})
    assert_same(here, there)


def test_every_reader_modes_shape_and_management_event_comes_back_with_the_same_counters():
    options = BuildOptions(management_filters=(MANAGEMENT,))
    records = [
        Record(f"shape-{seq}", "zebra/fx/fx9600-01/reads", json.dumps(doc).encode(), seq=seq)
        for seq, (doc, _) in enumerate(SHAPES.values())
    ]
    beat = json.dumps(live_heartbeat()).encode()
    gpi = json.dumps(envelope("gpi", {"pin": 1, "state": "HIGH"}, eventNum=7)).encode()
    start = len(records)
    records += [
        Record("beat", "zebra/fx/fx9600-01/mgmt", beat, seq=start),
        Record("gpi", "zebra/fx/fx9600-01/mgmt", gpi, seq=start + 1),
        Record("tag", "zebra/fx/fx9600-01/reads", TAG % 9, seq=start + 2),
        Record("junk", "zebra/fx/fx9600-02/reads", b"{not json", seq=start + 3),
    ]
    readers = {"fx9600-01": ReaderCount("fx9600-01", 3, 3, 0, 0, 0)}
    health = {"fx9600-02": {"data_messages": 4}}
    here = prepare_batch(records, 5, options, readers, health)
    assert here.tables.reads.num_rows > len(SHAPES)
    assert here.tables.reader_events.num_rows == 2
    assert here.tables.dead_letters.column("reason").to_pylist() == ["invalid_json"]
    assert set(here.health) == {"fx9600-01", "fx9600-02"}
    assert here.readers["fx9600-01"].received > 3

    worker = ParseWorker(options)
    worker.start()
    try:
        there = worker.prepare(records, 5, readers, health)
        without_counting = worker.prepare(records, 5, None, health)
    finally:
        worker.stop()
    assert_same(here, there)
    assert without_counting.readers is None
    assert not there.tables.observations  # they are in `health`


def test_an_exception_in_the_child_is_raised_in_the_parent_as_itself():
    worker = ParseWorker(BuildOptions(idempotency_key="no-such-key"))
    worker.start()
    try:
        with pytest.raises(KeyError, match="no-such-key"):
            worker.prepare([Record("k", "zebra/fx/r1/reads", TAG % 1)], 1, {}, {})
        # ... and the worker goes on with the next batch.
        worker.options = BuildOptions()
        assert worker.prepare([Record("k", "zebra/fx/r1/reads", TAG % 1)], 1, {}, {}).tables
    finally:
        worker.stop()


def test_a_killed_worker_is_reported_as_dead_with_its_exit_status():
    worker = ParseWorker(BuildOptions())
    worker.start()
    pid = worker.pid
    try:
        os.kill(pid, signal.SIGKILL)
        # The worker's reply thread reads the end of the pipe and reaps it: we only watch.
        assert wait_until(lambda: not psutil.pid_exists(pid), timeout=30)
        with pytest.raises(ParseWorkerDied, match=f"pid {pid}"):
            worker.prepare([Record("k", "zebra/fx/r1/reads", TAG % 1)], 1, {}, {})
    finally:
        worker.stop()
    assert not psutil.pid_exists(pid)


def test_stop_ends_the_worker_and_the_worker_ends_when_its_parent_is_killed(tmp_path):
    worker = ParseWorker(BuildOptions())
    worker.start()
    pid = worker.pid
    worker.stop()
    assert not psutil.pid_exists(pid)

    # A parent killed with SIGKILL: its worker reads the end of its stdin and exits.
    script = textwrap.dedent(
        """
        import sys
        from spark.parse_worker import BuildOptions, ParseWorker
        worker = ParseWorker(BuildOptions(), helpers=1)
        worker.start()
        print(worker.pid, flush=True)
        sys.stdin.read()
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    child, helpers = None, []
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        assert wait_until(child.children, timeout=30)
        helpers = child.children()
        assert [arg for arg in helpers[0].cmdline() if arg == "--part"] == ["--part"]
        # It yields the cores to the daemon's intake.
        niceness = min(19, child.nice() + HELPER_NICENESS)
        assert wait_until(lambda: helpers[0].nice() == niceness, timeout=30)
        parent.kill()
        parent.wait(30)
        # Both exit by themselves (no one signals them); wait_procs returns those still alive.
        _, alive = psutil.wait_procs([child, *helpers], timeout=30)
        assert not alive, f"{[p.pid for p in alive]} outlived the killed parent"
    finally:
        parent.kill()
        parent.wait(30)
        for process in [child, *helpers]:
            if process is not None and process.is_running():
                process.kill()


# -- a batch built in parts (spark.schema.join_parts, the worker's helpers) ----------------------


def build(records, options=FUZZ_OPTIONS, known=frozenset(), part=False):
    return options.build(records, 1, known, part)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    messages=st.lists(
        st.tuples(TOPICS, PAYLOADS), min_size=MESSAGES_PER_EXAMPLE, max_size=MESSAGES_PER_EXAMPLE
    ),
    known=st.frozensets(st.sampled_from(["fx9600-01", "fx9600-02", "r1"])),
    cuts=st.lists(st.integers(1, MESSAGES_PER_EXAMPLE - 1), min_size=1, max_size=3, unique=True),
)
def test_a_fuzzed_batch_built_in_parts_and_joined_equals_it_built_whole(messages, known, cuts):
    records = [
        Record(f"k{index}", topic, payload, received_time=1.7e9 + index, seq=index)
        for index, (topic, payload) in enumerate(messages)
    ]
    bounds = [0, *sorted(cuts), len(records)]
    parts = [build(records[a:b], known=known, part=True) for a, b in itertools.pairwise(bounds)]
    assert_same_tables(join_parts(parts), build(records, known=known))


def test_a_bad_payload_counts_for_a_reader_that_an_earlier_part_proved_valid():
    # fx9600-01: junk before its first valid message (not counted), then junk after it, in the
    # next part (counted). fx9600-02 only ever sends junk: never counted.
    records = [
        Record("a", "zebra/fx/fx9600-01/reads", b"{junk", seq=1),
        Record("b", "zebra/fx/fx9600-02/reads", b"{junk", seq=2),
        Record("c", "zebra/fx/fx9600-01/reads", TAG % 1, seq=3),
        Record("d", "zebra/fx/fx9600-01/reads", b"{junk", seq=4),
        Record("e", "zebra/fx/fx9600-02/reads", b"{junk", seq=5),
    ]
    whole = build(records)
    assert [(o.reader_id, o.seq) for o in whole.observations] == [
        ("fx9600-01", 3),
        ("fx9600-01", 4),
    ]
    for cut in range(1, len(records)):
        parts = [build(records[:cut], part=True), build(records[cut:], part=True)]
        assert_same_tables(join_parts(parts), whole)
    # Joined without the part before it, the junk of the second part stays uncounted.
    assert not join_parts([build(records[3:], part=True)]).observations


def big_batch() -> list:
    """More than SPLIT_MIN_BYTES of batched FX9600 payloads from two readers, with junk from a
    third reader that only a valid message in the first half makes countable."""
    from actors.devtools.simulate import TagEventGenerator

    generators = [TagEventGenerator(f"fx9600-0{n}", wall=lambda: 1.79e9) for n in (1, 2)]
    records = []
    for index in range(150):
        topic = f"zebra/fx/fx9600-0{1 + index % 2}/reads"
        payload = generators[index % 2].next_payload(50)
        if index == 10:
            topic, payload = "zebra/fx/fx9600-03/reads", TAG % 7
        elif index % 17 == 0 or index > 140:
            topic, payload = "zebra/fx/fx9600-03/reads", b"{junk"
        records.append(Record(f"m{index}", topic, payload, received_time=1.79e9, seq=index))
    assert sum(len(r.payload) for r in records) > SPLIT_MIN_BYTES
    return records


def test_a_large_batch_is_built_in_parts_by_the_helper_and_comes_out_as_if_built_whole():
    records = big_batch()
    readers = {"fx9600-01": ReaderCount("fx9600-01", 0, 0, 0, 0, 0)}
    here = prepare_batch(records, 3, BuildOptions(), readers, {})
    helper = _Helper()
    asked = []
    send = helper.send
    helper.send = lambda run, *rest: (asked.append(len(run)), send(run, *rest))
    try:
        there = prepare_batch(records, 3, BuildOptions(), readers, {}, [helper])
        assert len(asked) == 1 and 0 < asked[0] < len(records)
        assert_same(here, there)

        # A helper that died: the next batch is built here alone, the same all the same.
        os.kill(helper.pid, signal.SIGKILL)
        again = prepare_batch(records, 3, BuildOptions(), readers, {}, [helper])
        assert not helper.alive
        assert_same(here, again)
    finally:
        helper.close()


def test_the_worker_with_a_helper_prepares_a_large_batch_as_the_writers_thread_does():
    records = big_batch()
    here = prepare_batch(records, 4, BuildOptions(), {}, {"fx9600-02": {"data_messages": 1}})
    worker = ParseWorker(BuildOptions(), helpers=1)
    worker.start()
    try:
        there = worker.prepare(records, 4, {}, {"fx9600-02": {"data_messages": 1}})
        helpers = psutil.Process(worker.pid).children()
    finally:
        worker.stop()
    assert_same(here, there)
    assert len(helpers) == 1
    assert not any(p.is_running() for p in helpers)
