import threading

import pytest

from actors.clock import RealClock, SimulatedClock


def test_simulated_timers_fire_only_when_the_clock_is_advanced_past_them():
    clock = SimulatedClock()
    fired = []
    clock.call_later(5.0, lambda: fired.append("five"))
    clock.call_later(1.0, lambda: fired.append("one"))

    assert clock.advance(0.999) == 0
    assert fired == []
    assert clock.advance(0.001) == 1
    assert fired == ["one"]
    clock.advance(10)
    assert fired == ["one", "five"]


def test_simulated_time_stands_at_each_timer_due_time_while_it_fires():
    clock = SimulatedClock(start_monotonic=100.0)
    seen = []
    clock.call_later(3.0, lambda: seen.append(clock.monotonic()))
    clock.advance(10)
    assert seen == [103.0]
    assert clock.monotonic() == 110.0


def test_timers_scheduled_by_a_firing_timer_fire_in_the_same_advance_when_due():
    clock = SimulatedClock()
    fired = []

    def first():
        fired.append("first")
        clock.call_later(2.0, lambda: fired.append("second"))

    clock.call_later(1.0, first)
    clock.advance(2.5)
    assert fired == ["first"]
    clock.advance(0.5)
    assert fired == ["first", "second"]


def test_cancelled_timer_never_fires():
    clock = SimulatedClock()
    fired = []
    handle = clock.call_later(1.0, lambda: fired.append(1))
    handle.cancel()
    clock.advance(5)
    assert fired == []
    assert clock.pending() == 0


def test_wall_time_moves_with_the_simulated_clock():
    clock = SimulatedClock(start_monotonic=0.0, start_wall=1_000.0)
    clock.advance(60)
    assert clock.wall() == 1_060.0


def test_wait_for_timers_returns_once_another_thread_schedules_one():
    clock = SimulatedClock()
    threading.Thread(target=lambda: clock.call_later(1.0, lambda: None)).start()
    assert clock.wait_for_timers(1, timeout=5)
    assert clock.next_due_in() == pytest.approx(1.0)


def test_real_clock_runs_timers_in_due_order_on_its_own_thread():
    clock = RealClock()
    done = threading.Event()
    order = []
    try:
        clock.call_later(0.05, lambda: (order.append("late"), done.set()))
        clock.call_later(0.0, lambda: order.append("early"))
        assert done.wait(5)
        assert order == ["early", "late"]
    finally:
        clock.close()
