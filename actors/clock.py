"""The one injected clock that every delay, timeout, backoff and expiry goes through (DESIGN §6).

`RealClock` runs timers on one daemon thread; `SimulatedClock` runs nothing until a test calls
`advance()`, which fires every timer that has come due, in due-time order, on the caller's thread.
Timer callbacks must stay thin: they `tell` an actor and return.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""

    def wall(self) -> float:
        """Seconds since the epoch, for timestamps stored in rows and events."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` once, `delay` seconds from now. The handle cancels it."""


@dataclass(order=True)
class _Timer:
    due: float
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class _TimerHeap:
    """Due-time ordered timers; ties keep scheduling order."""

    def __init__(self) -> None:
        self._heap: list[_Timer] = []
        self._seq = itertools.count()

    def push(self, due: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(due, next(self._seq), callback)
        heapq.heappush(self._heap, timer)
        return timer

    def pop_due(self, now: float) -> _Timer | None:
        while self._heap and self._heap[0].cancelled:
            heapq.heappop(self._heap)
        if self._heap and self._heap[0].due <= now:
            return heapq.heappop(self._heap)
        return None

    def next_due(self) -> float | None:
        while self._heap and self._heap[0].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0].due if self._heap else None

    def __len__(self) -> int:
        return sum(1 for t in self._heap if not t.cancelled)


class RealClock:
    """Wall and monotonic time from the OS; timers fire on one background thread."""

    # Bound at import so that freezegun, which patches `time.*` in modules it does not ignore,
    # cannot freeze the daemon's timers; rows still get frozen wall time through `wall()`.
    _monotonic = staticmethod(time.monotonic)

    def __init__(self) -> None:
        self._timers = _TimerHeap()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def monotonic(self) -> float:
        return self._monotonic()

    def wall(self) -> float:
        return time.time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        with self._cond:
            if self._closed:
                raise RuntimeError("clock is closed")
            timer = self._timers.push(self.monotonic() + max(0.0, delay), callback)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fxgate-clock", daemon=True)
                self._thread.start()
            self._cond.notify()
        return timer

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    timer = self._timers.pop_due(self.monotonic())
                    if timer is not None:
                        break
                    due = self._timers.next_due()
                    self._cond.wait(None if due is None else max(0.0, due - self.monotonic()))
            timer.callback()


class SimulatedClock:
    """A clock that moves only when a test advances it.

    `advance(seconds)` moves time forward step by step to each due timer, fires it, and goes on
    until the target time; timers scheduled by callbacks during the advance fire too if they fall
    due before the target. Thread-safe: actors may schedule while a test advances.
    """

    def __init__(self, start_monotonic: float = 1000.0, start_wall: float = 1_800_000_000.0):
        self._now = start_monotonic
        self._wall_offset = start_wall - start_monotonic
        self._timers = _TimerHeap()
        self._lock = threading.Lock()
        self._scheduled = threading.Condition(self._lock)

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def wall(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        with self._lock:
            timer = self._timers.push(self._now + max(0.0, delay), callback)
            self._scheduled.notify_all()
            return timer

    def pending(self) -> int:
        """Timers not yet fired or cancelled."""
        with self._lock:
            return len(self._timers)

    def next_due_in(self) -> float | None:
        """Seconds until the next timer, or None when none is scheduled."""
        with self._lock:
            due = self._timers.next_due()
            return None if due is None else due - self._now

    def wait_for_timers(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Block (real time) until at least `count` timers are pending: lets a test wait for an
        actor to schedule its next timer before it advances the clock."""
        with self._scheduled:
            return self._scheduled.wait_for(lambda: len(self._timers) >= count, timeout)

    def advance(self, seconds: float) -> int:
        """Move time forward by `seconds`, firing due timers in order. Returns how many fired."""
        with self._lock:
            target = self._now + seconds
        fired = 0
        while True:
            with self._lock:
                timer = self._timers.pop_due(target)
                if timer is None:
                    self._now = target
                    return fired
                self._now = max(self._now, timer.due)
            timer.callback()
            fired += 1
