import pytest

from actors.backoff import Backoff
from actors.clock import SimulatedClock


def test_every_step_doubles_within_25_percent_jitter_and_caps_at_120_seconds():
    expected_bases = [1, 2, 4, 8, 16, 32, 64, 120, 120, 120]
    for draw in (0.75, 1.0, 1.25):
        backoff = Backoff(1.0, 120.0, 0.25, uniform=lambda _lo, _hi, d=draw: d)
        delays = [backoff.next_delay() for _ in expected_bases]
        assert delays == [min(120.0, b * draw) for b in expected_bases]


def test_random_delays_stay_inside_the_bounds_of_their_step():
    backoff = Backoff(1.0, 120.0, 0.25)
    for attempt in range(40):
        low, high = backoff.bounds(attempt)
        delay = backoff.next_delay()
        assert low <= delay <= high <= 120.0


def test_reset_after_a_connection_starts_again_at_the_minimum():
    backoff = Backoff(1.0, 120.0, 0.0)
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 1.0


def test_a_days_long_outage_neither_overflows_nor_exceeds_the_cap():
    backoff = Backoff(1.0, 120.0, 0.25)
    delays = [backoff.next_delay() for _ in range(5000)]
    assert max(delays) <= 120.0
    assert min(delays[10:]) >= 90.0


def test_backoff_schedule_on_the_simulated_clock_reaches_the_cap_after_seven_doublings():
    clock = SimulatedClock(start_monotonic=0.0)
    backoff = Backoff(1.0, 120.0, 0.0)
    attempts = []

    def attempt():
        attempts.append(clock.monotonic())
        clock.call_later(backoff.next_delay(), attempt)

    clock.call_later(backoff.next_delay(), attempt)
    clock.advance(1 + 2 + 4 + 8 + 16 + 32 + 64 + 120 + 120)
    gaps = [b - a for a, b in zip([0.0, *attempts], attempts, strict=False)]
    assert gaps == [1, 2, 4, 8, 16, 32, 64, 120, 120]


@pytest.mark.parametrize(("low", "high", "jitter"), [(0, 10, 0.1), (5, 1, 0.1), (1, 10, 1.5)])
def test_nonsense_settings_are_refused(low, high, jitter):
    with pytest.raises(ValueError, match="bad backoff"):
        Backoff(low, high, jitter)
