"""Reconnect delays: doubling from a minimum to a cap, with symmetric jitter (HiveMQ Edge style).

Jitter spreads the reconnects of many gateways after a broker restart; the cap bounds how long an
operator waits after the far side comes back. Pure logic: the caller schedules on its clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Step n waits min(max, min_delay * 2**n) scaled by a factor drawn from
    [1 - jitter, 1 + jitter], never more than `max_delay`. `reset()` after a successful
    connection starts again at step 0."""

    def __init__(
        self,
        min_delay: float = 1.0,
        max_delay: float = 120.0,
        jitter: float = 0.25,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        if min_delay <= 0 or max_delay < min_delay or not 0 <= jitter <= 1:
            raise ValueError(f"bad backoff: min={min_delay} max={max_delay} jitter={jitter}")
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.jitter = jitter
        self._uniform = uniform
        self.attempt = 0

    def base(self, attempt: int) -> float:
        # 2**attempt overflows float for huge attempt counts after days of outage: cap first.
        if attempt >= 64:
            return self.max_delay
        return min(self.max_delay, self.min_delay * 2**attempt)

    def bounds(self, attempt: int) -> tuple[float, float]:
        base = self.base(attempt)
        return base * (1 - self.jitter), min(self.max_delay, base * (1 + self.jitter))

    def next_delay(self) -> float:
        base = self.base(self.attempt)
        self.attempt += 1
        return min(self.max_delay, base * self._uniform(1 - self.jitter, 1 + self.jitter))

    def reset(self) -> None:
        self.attempt = 0
