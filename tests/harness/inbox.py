"""A stand-in for an actor ref in tests: records what it is told, and lets a test wait for it."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Inbox:
    def __init__(self) -> None:
        self.messages: list[object] = []
        self.cond = threading.Condition()

    def tell(self, message: object) -> None:
        with self.cond:
            self.messages.append(message)
            self.cond.notify_all()

    def wait_for(self, until: int | Callable[[list], bool], timeout: float = 10.0) -> list:
        """Wait until `until` messages arrived (an int) or `until(messages)` holds."""
        predicate = until if callable(until) else (lambda m: len(m) >= until)
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.messages), timeout), self.messages
            return list(self.messages)
