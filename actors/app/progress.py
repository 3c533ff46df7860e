"""The progress of a long command, on stderr: a bar on a terminal, plain lines anywhere else.

`fxgate compact`, `audit`, `report` and `dead-letters replay` take seconds to minutes (a Spark
start alone is 3-8 s). On a terminal (stderr is a tty) the reporter draws a tqdm bar with the
counts and the rate, redrawn in place. Anywhere else (a pipe, a file, cron, CI, the journal) it
writes a plain line when the work starts, one at most every `interval` seconds while it goes on
(also while one long step holds the counts still), and one when it ends, each with what is done
of the total, the running tallies, a rate and the time so far:

    audit: 3/6 steps, 1,234,567 rows, 41,152 rows/s, 30.0 s; finding the gaps per reader

The rate is of the first tally when there are tallies (the fine-grained work: rows, files),
else of the unit. Nothing of it goes to stdout, which carries the command's result (`--json`);
`--no-progress` turns it off. In the daemon the same plain lines go to its log instead
(`ProgressReporter.to_log`). The work itself, in spark/, sees only `spark.progress.Progress`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm

# Seconds between plain lines: often enough to show a command is alive, rarely enough to read.
DEFAULT_INTERVAL = 5.0
# Seconds between redraws of a terminal bar while no count moves (its elapsed time runs on).
_BAR_REFRESH = 1.0
# The bar's size where the terminal does not say (a single bar needs one row).
_COLUMNS = 80
_ROWS = 24


class ProgressReporter:
    """One command's progress: `start`, then `expect` and `advance` (by the work, through
    `spark.progress.Progress`), then `finish`. Used as a context manager, `start(...)` returns
    it and leaving the block finishes it ("stopped" when an exception left it).

    `clock` and `interval` decide when a plain line is due; `heartbeat` runs a thread that
    writes a due line (or redraws the bar) while the work holds the counts still. `terminal`:
    None asks `stream.isatty()`.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
        heartbeat: bool = True,
        terminal: bool | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._stream = stream
        self._interval = interval
        self._clock = clock
        self._enabled = enabled
        self._heartbeat = heartbeat
        self._terminal = terminal
        self._logger = logger
        self._lock = threading.Lock()
        self._active = False
        self._broken = False  # stderr went away: the work goes on, silently
        self._bar: tqdm | None = None
        self._redirect = contextlib.ExitStack()
        self._ticker: threading.Thread | None = None
        self._stopped = threading.Event()

    @classmethod
    def to_log(
        cls,
        logger: logging.Logger,
        interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> ProgressReporter:
        """Plain lines as INFO records of `logger` (the daemon's log has no terminal to draw
        on), on the daemon's clock."""
        return cls(logger=logger, interval=interval, clock=clock)

    # -- the command's side ------------------------------------------------------------------

    def start(
        self,
        what: str,
        total: int | None = None,
        unit: str = "steps",
        counts: tuple[str, ...] = (),
        note: str | None = None,
    ) -> ProgressReporter:
        """Begin reporting `what` (the command's name): `total` units of `unit` (None: not known
        yet), and the tallies `counts` from 0, in this order."""
        if not self._enabled:
            return self
        if self._active:
            self.finish()
        self._what = what
        self._unit = unit
        self._total = total
        self._done = 0
        self._counts = dict.fromkeys(counts, 0)
        self._note = note
        self._started = self._last_line = self._clock()
        self._active = True
        if self._on_terminal():
            # Only here: the daemon's writer makes a reporter at every start (to the log, never
            # a bar), and `fxgate run` need not import tqdm for that.
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            # Log records (compact logs each table) are written above the bar, not through it.
            self._redirect.enter_context(logging_redirect_tqdm())
            self._bar = tqdm(
                total=total,
                desc=what,
                unit=f" {unit}",
                file=self._output(),
                leave=True,
                # Fixed, and from the stream itself: tqdm's own reading of a terminal that has
                # no size (a pty never sized) gave -1 rows, and it then hid the bar.
                ncols=_width(self._output()),
                nrows=_ROWS,
                disable=False,
                postfix=self._postfix(),
            )
        else:
            self._write(self._line())
        if self._heartbeat:
            self._stopped.clear()
            self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._ticker.start()
        return self

    def finish(self, ok: bool = True) -> None:
        """The last line (plain) or the bar left at its last state (terminal)."""
        if not self._active:
            return
        self._stopped.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            self._active = False
            if self._bar is not None:
                self._bar.set_postfix_str(self._postfix(ok), refresh=False)
                self._bar.close()
                self._bar = None
                self._redirect.close()
            else:
                self._write(self._line("done" if ok else "stopped"))

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.finish(ok=kind is None)

    # -- the work's side (spark.progress.Progress) -------------------------------------------

    def expect(self, total: int | None) -> None:
        with self._lock:
            if not self._active:
                return
            self._total = total
            if self._bar is not None:
                self._bar.total = total
                self._bar.refresh()

    def advance(self, n: int = 1, *, note: str | None = None, **counts: int) -> None:
        with self._lock:
            if not self._active:
                return
            self._done += n
            for name, value in counts.items():
                self._counts[name] = self._counts.get(name, 0) + value
            if note is not None:
                self._note = note
            if self._bar is not None:
                self._bar.set_postfix_str(self._postfix(), refresh=False)
                self._bar.update(n)
                if n == 0:
                    self._bar.refresh()
            else:
                self._line_if_due()

    # -- inside --------------------------------------------------------------------------------

    def _on_terminal(self) -> bool:
        if self._logger is not None:
            return False
        if self._terminal is not None:
            return self._terminal
        try:
            return self._output().isatty()
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            return False

    def _output(self) -> TextIO:
        # Looked up at each use: click's test runner (and a redirect) swaps sys.stderr.
        return self._stream if self._stream is not None else sys.stderr

    def _tick(self) -> None:
        period = _BAR_REFRESH if self._bar is not None else self._interval
        while not self._stopped.wait(period):
            with self._lock:
                if not self._active:
                    return
                if self._bar is not None:
                    self._bar.refresh()
                else:
                    self._line_if_due()

    def _line_if_due(self) -> None:
        if self._clock() - self._last_line >= self._interval:
            self._write(self._line())

    def _line(self, state: str | None = None) -> str:
        self._last_line = now = self._clock()
        elapsed = max(now - self._started, 0.0)
        amount = f"{self._done:,} {self._unit}"
        if self._total is not None:
            amount = f"{self._done:,}/{self._total:,} {self._unit}"
        parts = [amount, *(f"{value:,} {_label(name)}" for name, value in self._counts.items())]
        rate = self._rate(elapsed)
        if rate:
            parts.append(rate)
        parts.append(f"{elapsed:.1f} s")
        head = f"{self._what}: " if state is None else f"{self._what}: {state}, "
        line = head + ", ".join(parts)
        if state is None and self._note:
            line += f"; {self._note}"
        return line

    def _postfix(self, ok: bool = True) -> str:
        elapsed = max(self._clock() - self._started, 0.0)
        parts = [f"{value:,} {_label(name)}" for name, value in self._counts.items()]
        rate = self._rate(elapsed) if self._counts else ""
        if rate:
            parts.append(rate)
        if not ok:
            parts.append("stopped")
        elif self._note and self._active:
            parts.append(self._note)
        return ", ".join(parts)

    def _rate(self, elapsed: float) -> str:
        """The rate of the first tally (else of the unit); "" while there is none to tell."""
        if self._counts:
            name, value = next(iter(self._counts.items()))
        else:
            name, value = self._unit, self._done
        if value <= 0 or elapsed <= 0:
            return ""
        rate = value / elapsed
        shown = f"{rate:,.0f}" if rate >= 10 else f"{rate:.1f}"
        return f"{shown} {_label(name)}/s"

    def _write(self, line: str) -> None:
        if self._logger is not None:
            self._logger.info("%s", line)
            return
        if self._broken:
            return
        try:
            stream = self._output()
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream
            self._broken = True


def _width(stream: TextIO) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # not a real terminal (io.UnsupportedOperation)
        columns = 0
    return columns or _COLUMNS


def _label(name: str) -> str:
    return name.replace("_", " ")
