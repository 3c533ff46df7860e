"""What long Spark-side work tells about its progress, to whoever shows it.

Compaction, the audit, the report's read-back and the conversion of the previous layout take
seconds to minutes. spark/ imports nothing above it, so that work takes this small interface and
the command passes its reporter in (actors/app/progress.py: a bar on a terminal, plain lines
otherwise, or log lines in the daemon). `NO_PROGRESS` tells nobody, and is every default.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def expect(self, total: int | None) -> None:
        """The work will take `total` units (None: not known), once the work knows it."""

    def advance(self, n: int = 1, *, note: str | None = None, **counts: int) -> None:
        """`n` more units done; `counts` add to running tallies (rows=..., files=...); `note`
        says what is under way now."""


class _Silent:
    def expect(self, total: int | None) -> None:
        return None

    def advance(self, n: int = 1, *, note: str | None = None, **counts: int) -> None:
        return None


NO_PROGRESS: Progress = _Silent()
