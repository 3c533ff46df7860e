"""Events that go up the house: what an actor tells whoever watches it, as a typed listener.

Requests go down through proxies; what happened goes up through a listener the watcher passes in
when it starts the actor (no registry lookups). Each method has a no-op default, so a listener
implements only what it cares about. A listener method runs on the reporting actor's thread: it
must be quick and must not block (store the fact, notify a condition).
"""

from __future__ import annotations

from actors.messages import BatchWritten, CompactionReport, WriterHealth


class WriterListener:
    """What the Spark writer reports: each batch landed, and how it fares (failing or not)."""

    def batch_written(self, batch: BatchWritten) -> None:
        """A batch is committed in the tables and in the ledger."""

    def writer_health(self, health: WriterHealth) -> None:
        """The writer's health changed: a failed attempt, or the first success after some."""

    def compaction(self, report: CompactionReport) -> None:
        """A compaction pass ran, failed or was put off, or the next one was scheduled."""
