"""The reconciliation of a reader's own `sent` counter with what reached the gateway, and the
silent flag: pure rules, fed observations in arrival order."""

from hypothesis import given, settings
from hypothesis import strategies as st

from spark.reader_health import (
    DATA,
    MANAGEMENT,
    ReaderHealth,
    ReaderObservation,
    heartbeat_age,
    is_silent,
    observe_all,
)

READER = "fx9600-01"


class Reader:
    """Observations of one reader, numbered in arrival order."""

    def __init__(self) -> None:
        self.seq = 0
        self.time = 1000.0

    def data(self, n: int = 1) -> list[ReaderObservation]:
        out = []
        for _ in range(n):
            self.seq += 1
            self.time += 1
            out.append(ReaderObservation(READER, self.seq, self.time, DATA))
        return out

    def heartbeat(self, sent: int | None, paths: int = 1) -> ReaderObservation:
        self.seq += 1
        self.time += 1
        counters = {"received": sent, "sent": sent, "retained": 0, "dropped": 0}
        return ReaderObservation(
            READER, self.seq, self.time, MANAGEMENT, "heartbeat", True, counters, paths
        )

    def event(self, kind: str) -> ReaderObservation:
        self.seq += 1
        self.time += 1
        return ReaderObservation(READER, self.seq, self.time, MANAGEMENT, kind)


def health_after(observations) -> ReaderHealth:
    health = ReaderHealth()
    for observation in observations:
        health.observe(observation)
    return health


def test_every_message_sent_and_received_between_two_heartbeats_reconciles_to_zero():
    r = Reader()
    health = health_after([r.heartbeat(100), *r.data(25), r.heartbeat(125)])
    assert (health.intervals, health.unaccounted) == (1, 0)
    assert (health.last_interval_sent, health.last_interval_received) == (25, 25)
    assert health.sent == 125 and health.heartbeats == 2 and health.data_messages == 25


def test_messages_lost_on_the_way_show_as_the_difference_and_it_grows():
    r = Reader()
    health = health_after(
        [r.heartbeat(0), *r.data(7), r.heartbeat(10), *r.data(5), r.heartbeat(20)]
    )
    assert health.unaccounted == (10 - 7) + (10 - 5)
    assert health.intervals == 2


def test_a_message_that_overtakes_a_heartbeat_evens_out_over_the_next_interval():
    r = Reader()
    # The reader sent 10 before its second heartbeat; one of them arrived after it.
    health = health_after([r.heartbeat(0), *r.data(9), r.heartbeat(10), *r.data(1 + 5)])
    assert health.unaccounted == 1
    health.observe(r.heartbeat(15))
    assert health.unaccounted == 0


def test_data_before_the_first_heartbeat_is_not_compared_with_anything():
    r = Reader()
    health = health_after([*r.data(50), r.heartbeat(500), *r.data(3), r.heartbeat(503)])
    assert (health.intervals, health.unaccounted, health.data_messages) == (1, 0, 53)


def test_a_counter_reset_by_a_reboot_is_not_counted_as_loss():
    r = Reader()
    health = health_after(
        [r.heartbeat(1000), *r.data(4), r.heartbeat(3), *r.data(2), r.heartbeat(5)]
    )
    assert health.counter_resets == 1
    assert (health.intervals, health.unaccounted) == (1, 0)


def test_a_heartbeat_without_a_usable_counter_leaves_the_interval_open():
    r = Reader()
    health = health_after(
        [r.heartbeat(10), *r.data(2), r.heartbeat(None), *r.data(3), r.heartbeat(15)]
    )
    assert (health.intervals, health.unaccounted, health.heartbeats) == (1, 0, 3)
    # Two data paths: `sent` counts each message once per endpoint, so it is not compared.
    health.observe(r.heartbeat(99, paths=2))
    assert (health.intervals, health.unaccounted) == (1, 0)


def test_other_management_events_are_counted_per_type_and_are_no_data_messages():
    r = Reader()
    health = health_after([r.heartbeat(0), r.event("gpi"), r.event("gpi"), r.event("error")])
    health.observe(r.heartbeat(0))
    assert health.events == {"gpi": 2, "error": 1}
    assert (health.data_messages, health.unaccounted) == (0, 0)


def test_state_round_trips_and_observe_all_never_changes_what_it_was_given():
    r = Reader()
    known = {READER: health_after([r.heartbeat(0), r.event("gpi")]).state()}
    frozen = {READER: dict(known[READER], events=dict(known[READER]["events"]))}
    after = observe_all(known, [*r.data(3), r.heartbeat(4), r.event("gpi")])
    assert known == frozen
    assert after[READER]["unaccounted"] == 1
    assert after[READER]["events"] == {"gpi": 2}
    assert ReaderHealth.from_state(after[READER]).state() == after[READER]
    # A newer fxgate's key is left out, an older one's missing key takes its default.
    assert ReaderHealth.from_state({**after[READER], "surprise": 1}).state() == after[READER]
    older = {k: v for k, v in after[READER].items() if k != "counter_resets"}
    assert ReaderHealth.from_state(older).counter_resets == 0


def test_heartbeat_age_and_the_silent_flag_follow_the_clock_they_are_given():
    r = Reader()
    state = health_after([r.heartbeat(0), *r.data(1)]).state()
    heard = state["last_heard_time"]
    assert heartbeat_age(state, heard + 10) == 11
    assert not is_silent(state, heard + 300, limit=300)
    assert is_silent(state, heard + 300.5, limit=300)
    assert not is_silent(state, heard + 10_000, limit=0)  # 0 switches the flag off
    assert not is_silent(ReaderHealth().state(), 10_000, limit=1)  # never heard: not silent


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.just("heartbeat"), st.sampled_from(["delivered", "dropped"])),
        max_size=60,
    )
)
def test_the_reconciliation_equals_the_messages_dropped_between_the_first_and_last_heartbeat(
    script,
):
    """A reader with honest counters: whatever the mix, the running figure is exactly what was
    lost on the way between its first and its last heartbeat."""
    r = Reader()
    health = ReaderHealth()
    sent = 0
    lost_between = 0
    lost_since_heartbeat = 0
    seen_heartbeat = False
    for step in script:
        if step == "heartbeat":
            health.observe(r.heartbeat(sent))
            if seen_heartbeat:
                lost_between += lost_since_heartbeat
            seen_heartbeat = True
            lost_since_heartbeat = 0
            continue
        sent += 1
        if step == "delivered":
            health.observe(r.data()[0])
        else:
            lost_since_heartbeat += 1
    assert health.unaccounted == lost_between
    assert health.counter_resets == 0
