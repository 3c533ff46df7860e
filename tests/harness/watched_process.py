"""A subprocess watched through its output lines: a reader thread keeps every line (and, given a
log file, writes it there too) and wakes a condition, so tests wait on lines, never on sleeps.

The gateway daemon (tests/harness/daemon.py) and the Spark cluster's JVMs
(tests/harness/spark_cluster.py) are both watched this way.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path


class WatchedProcess:
    def __init__(self, log: Path | None = None) -> None:
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    def _launch(
        self,
        argv: list[str],
        env: Mapping[str, str],
        cwd: Path | None = None,
        reader_name: str | None = None,
    ) -> None:
        """Start `argv` with stdout and stderr in one pipe, and the thread that reads it."""
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(
            target=self._read, args=(self.proc,), name=reader_name, daemon=True
        )
        self._reader.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        log = self.log.open("a", encoding="utf-8") if self.log else contextlib.nullcontext()
        with log as out:
            for line in proc.stdout:
                if out is not None:
                    out.write(line)
                    out.flush()
                with self._cond:
                    self.lines.append(line.rstrip("\n"))
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def output(self, last: int | None = None) -> str:
        """The lines so far, or only the `last` of them, as one text."""
        with self._cond:
            return "\n".join(self.lines if last is None else self.lines[-last:])

    def mark(self) -> int:
        """An index into the output: a wait with after=mark sees only lines written since."""
        with self._cond:
            return len(self.lines)

    def count_logs(self, pattern: str) -> int:
        regex = re.compile(pattern)
        with self._cond:
            return sum(1 for line in self.lines if regex.search(line))

    def _first_match(self, pattern: str, timeout: float, after: int = 0) -> re.Match | None:
        """The first line from index `after` on matching `pattern`, waiting up to `timeout`;
        None at once when the process has exited without one."""
        regex = re.compile(pattern)
        found: list[re.Match] = []

        def seen() -> bool:
            for line in self.lines[after:]:
                match = regex.search(line)
                if match:
                    found.append(match)
                    return True
            return self.proc is not None and self.proc.poll() is not None

        with self._cond:
            self._cond.wait_for(seen, timeout)
        return found[0] if found else None

    def exit_status(self) -> int | None:
        return self.proc.poll() if self.proc else None
