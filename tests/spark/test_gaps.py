"""The pure eventNum rules shared by `fxgate audit` and the daemon's per-reader counters."""

import json
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark.gaps import (
    ReaderCounter,
    epoch_offsets,
    is_reset,
    missing_ranges,
    range_size,
    split_epochs,
)

numbers = st.integers(min_value=0, max_value=2**63 - 1)


# --- is_reset: a drop of more than half the previous number ---------------------------------


def test_a_drop_to_below_half_the_previous_number_is_a_reset():
    assert is_reset(1000, 1)
    assert is_reset(1000, 499)
    assert is_reset(3, 1)


def test_a_drop_to_half_or_more_is_not_a_reset_but_reordering():
    assert not is_reset(1000, 500)
    assert not is_reset(1000, 999)
    assert not is_reset(3, 2)


def test_a_rise_or_a_repeat_is_never_a_reset():
    assert not is_reset(5, 5)
    assert not is_reset(5, 6)
    assert not is_reset(0, 0)


@given(numbers, numbers)
def test_is_reset_is_exactly_new_below_half_of_previous_even_past_float_precision(previous, new):
    from fractions import Fraction

    assert is_reset(previous, new) == (new < Fraction(previous, 2))


# --- missing_ranges ------------------------------------------------------------------------


def test_missing_ranges_are_inclusive_and_one_per_run_of_absent_numbers():
    assert missing_ranges([1, 2, 5, 6, 8, 20]) == [(3, 4), (7, 7), (9, 19)]


def test_nothing_is_missing_before_the_first_or_after_the_last_number():
    assert missing_ranges([100, 101, 102]) == []
    assert missing_ranges([7]) == []
    assert missing_ranges([]) == []


def test_missing_ranges_refuses_numbers_out_of_order_or_repeated():
    with pytest.raises(ValueError, match="sorted and distinct"):
        missing_ranges([1, 3, 2])
    with pytest.raises(ValueError, match="sorted and distinct"):
        missing_ranges([1, 1])


@given(st.sets(st.integers(min_value=0, max_value=300), min_size=1))
def test_present_and_missing_together_cover_first_to_last_exactly_once(present):
    ordered = sorted(present)
    ranges = missing_ranges(ordered)
    absent = [n for first, last in ranges for n in range(first, last + 1)]
    assert sorted(absent + ordered) == list(range(ordered[0], ordered[-1] + 1))
    assert sum(range_size(*r) for r in ranges) == ordered[-1] - ordered[0] + 1 - len(ordered)
    # One range per run: two ranges never touch.
    assert all(b[0] - a[1] > 1 for a, b in pairwise(ranges))


# --- split_epochs --------------------------------------------------------------------------


def test_a_counter_that_starts_again_opens_a_new_epoch_instead_of_a_huge_gap():
    assert split_epochs([998, 999, 1000, 1, 2, 4]) == [[998, 999, 1000], [1, 2, 4]]


def test_a_small_step_back_stays_in_its_epoch():
    assert split_epochs([10, 12, 11, 13]) == [[10, 12, 11, 13]]


# --- epoch_offsets: several gateways' epoch counts on one -------------------------------------


def test_gateways_that_all_started_before_any_reset_count_epochs_alike():
    assert epoch_offsets({"a": 10, "b": 12}, {"a": [50, 90], "b": [51, 92]}) == {"a": 0, "b": 0}


def test_a_gateway_that_first_saw_the_reader_after_a_reset_starts_in_that_resets_epoch():
    offsets = epoch_offsets({"a": 10, "b": 60, "c": 100}, {"a": [50, 90], "b": [91]})
    assert offsets == {"a": 0, "b": 1, "c": 2}


def test_the_gateway_that_saw_the_most_resets_decides_the_offset():
    # b saw no read of the reader during a's second epoch (it found only one reset of two).
    offsets = epoch_offsets({"a": 10, "b": 11, "c": 100}, {"a": [50, 90], "b": [95]})
    assert offsets["c"] == 2


# --- ReaderCounter -------------------------------------------------------------------------


def test_the_counter_counts_numbers_skipped_forward_as_missing():
    counter = ReaderCounter().observe_all([5, 6, 9, 10, 15])
    assert counter.state() == {
        "received": 5,
        "without_event_num": 0,
        "missing": 2 + 4,
        "resets": 0,
        "last_event_num": 15,
    }


def test_the_counter_calls_a_reset_a_reset_and_counts_no_gap_for_it():
    counter = ReaderCounter().observe_all([1000, 1001, 3, 4, 6])
    assert (counter.resets, counter.missing, counter.last_event_num) == (1, 1, 6)


def test_events_without_an_event_number_are_counted_apart_and_change_nothing_else():
    counter = ReaderCounter().observe_all([1, None, 2, None, None])
    assert (counter.received, counter.without_event_num, counter.missing) == (2, 3, 0)
    assert counter.last_event_num == 2


def test_a_late_arrival_already_counted_missing_is_not_uncounted_nor_counted_twice():
    counter = ReaderCounter().observe_all([1, 2, 5, 3, 6])
    # 3 and 4 were counted missing when 5 came; 3 arriving late leaves that, and 6 follows 5.
    assert (counter.missing, counter.last_event_num, counter.resets) == (2, 6, 0)


def test_the_first_number_counts_nothing_missing_before_it():
    assert ReaderCounter().observe_all([1_000_000]).missing == 0


@st.composite
def in_order_streams(draw):
    """A reader's counter as it arrives in order: rising with gaps, and now and then a reset."""
    stream: list[int] = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        number = draw(st.integers(min_value=0, max_value=20))
        for _ in range(draw(st.integers(min_value=1, max_value=30))):
            stream.append(number)
            number += draw(st.integers(min_value=1, max_value=4))
        # The next epoch must start below half of where this one ended, or it is no reset.
        if stream[-1] < 60:
            stream.extend(range(stream[-1] + 1, 61))
    return stream


@given(in_order_streams())
def test_for_an_in_order_stream_the_counter_agrees_with_the_audit_rules(stream):
    counter = ReaderCounter().observe_all(stream)
    epochs = split_epochs(stream)
    assert counter.resets == len(epochs) - 1
    assert counter.missing == sum(
        range_size(*r) for epoch in epochs for r in missing_ranges(sorted(set(epoch)))
    )
    assert counter.last_event_num == max(epochs[-1])


@given(st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=10_000)), max_size=50))
def test_a_counter_saved_and_restored_counts_on_as_if_it_never_stopped(events):
    half = len(events) // 2
    whole = ReaderCounter().observe_all(events)
    first = ReaderCounter().observe_all(events[:half])
    saved = json.loads(json.dumps(first.state()))
    resumed = ReaderCounter.from_state(saved).observe_all(events[half:])
    assert resumed == whole
    assert resumed.state() == whole.state()


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"received": 1, "without_event_num": 0, "missing": 0, "resets": 0}, "lacks"),
        (
            {
                "received": 1,
                "without_event_num": 0,
                "missing": -1,
                "resets": 0,
                "last_event_num": 3,
            },
            "negative",
        ),
        (
            {
                "received": "1",
                "without_event_num": 0,
                "missing": 0,
                "resets": 0,
                "last_event_num": 3,
            },
            "not an integer",
        ),
        (
            {
                "received": 1,
                "without_event_num": 0,
                "missing": 0,
                "resets": 0,
                "last_event_num": 3,
                "extra": 1,
            },
            "unknown",
        ),
    ],
)
def test_a_corrupt_saved_state_is_refused_with_the_key_named(state, message):
    with pytest.raises(ValueError, match=message):
        ReaderCounter.from_state(state)
