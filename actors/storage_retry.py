"""StorageRetry: one storage fault, from the first failed write to the write that succeeds again.

The owners of SQLite files (the inbound and the outbound ledger) treat a full disk, a read-only
file system or an I/O error (persistence.storage_faults) the same way: never die (a restart meets
the same disk, and the restart budget would end the daemon), keep what they were doing, and try
again on a backoff on the injected clock. What they keep differs (the inbound ledger its packets,
the outbound ledger its statements); the episode itself is this class: what failed and since
when, one ERROR line when it starts and one INFO line when it ends, and the retry timer, whose
message the owner handles on its own thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from actors.backoff import Backoff
from actors.clock import Clock, TimerHandle
from persistence.storage_faults import describe

log = logging.getLogger(__name__)


class StorageRetry:
    def __init__(
        self,
        owner: str,
        path: Path,
        clock: Clock,
        retry: Callable[[], None],
        backoff: Backoff | None = None,
    ) -> None:
        """`owner` names it in the log ("inbound ledger"); `retry` runs on the clock's thread
        when a backoff delay is over: it should only tell the owner (which then calls
        `retry_due` and tries again)."""
        self._owner = owner
        self._path = path
        self._clock = clock
        self._retry = retry
        self._backoff = backoff or Backoff(0.5, 30.0, 0.25)
        self._timer: TimerHandle | None = None
        self.error: str | None = None  # what fails, while it does
        self._since: float | None = None
        self.failures = 0  # every failed attempt
        self.recoveries = 0

    @property
    def failing(self) -> bool:
        return self.error is not None

    @property
    def waiting(self) -> bool:
        """A retry is scheduled and has not come due yet."""
        return self._timer is not None

    def seconds(self) -> float | None:
        """How long the current episode has lasted (None when nothing fails)."""
        return None if self._since is None else self._clock.monotonic() - self._since

    def failed(self, error: BaseException, consequence: str) -> None:
        """A write failed for a storage fault: log the episode's first failure (with what it
        means for the owner's work, `consequence`) and schedule the next attempt."""
        self.failures += 1
        what = describe(error)
        if self.error is None:
            self._since = self._clock.monotonic()
            log.error(
                "%s cannot write %s: %s; %s, retrying with backoff",
                self._owner,
                self._path,
                what,
                consequence,
            )
        self.error = what
        if self._timer is None:
            self._timer = self._clock.call_later(self._backoff.next_delay(), self._retry)

    def retry_due(self) -> None:
        """The owner got the retry's message: the next failure schedules a new one."""
        self._timer = None

    def succeeded(self, more: str = "") -> None:
        """A write went through: the episode (if any) is over; `more` ends its INFO line."""
        if self.error is None:
            return
        log.info(
            "%s writes again after %.1f s (it failed with: %s)%s",
            self._owner,
            self.seconds() or 0.0,
            self.error,
            more,
        )
        self.error = None
        self._since = None
        self.recoveries += 1
        self._backoff.reset()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
