"""The ledger's disk budget: how much of the gateway's disk the backlog of either sink may take.

The ledger is the buffer for an outage of the table or of the upstream (DESIGN §2): it keeps
acknowledging the source as long as it can store. The budget is the one place where it stops:
when the ledger's file uses `max_bytes`, or its file system has less than `min_free_bytes`
left, the source is paused (its socket is no longer read), and the broker's queue limits decide
from then on what is lost. Use is measured in SQLite's *used* pages (page_count -
freelist_count), so it falls again as the sinks catch up and payloads are deleted, without a
VACUUM (DESIGN §7.4); the write-ahead log is bounded apart (database.WAL_SIZE_LIMIT).

The decision is a pure function of the two numbers, with some hysteresis: paused at the budget,
resumed once use is `resume_fraction` of it (and free space is back above the minimum), so a
gateway at the edge of its budget does not flap between the two with every batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from persistence.records import DiskUsage

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class DiskBudget:
    """At most `max_bytes` used by the ledger's files, at least `min_free_bytes` left free."""

    max_bytes: int
    min_free_bytes: int
    resume_fraction: float = 0.9

    def over(self, usage: DiskUsage, paused: bool) -> bool:
        """Whether the source should be paused now, given whether it is paused already."""
        if not paused:
            return usage.used_bytes >= self.max_bytes or usage.free_bytes < self.min_free_bytes
        return (
            usage.used_bytes > self.max_bytes * self.resume_fraction
            or usage.free_bytes < self.min_free_bytes
        )

    def describe(self, usage: DiskUsage) -> str:
        """The budget and where the ledger stands against it, for the WARNING and /healthz."""
        return (
            f"[ledger] max_bytes = {human(self.max_bytes)}: {human(usage.used_bytes)} used; "
            f"min_free_bytes = {human(self.min_free_bytes)}: {human(usage.free_bytes)} free"
        )


def human(count: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(count) >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path`."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize
