"""`make demo` end to end, cut short: broker, two simulated readers with heartbeats and GPI
changes, the gateway, a broker restart; the reads land exactly once and `fxgate status` shows
both readers' heartbeats and a reconciliation of 0.

The demo runs as its own process (`fxgate demo`), as `make demo` runs it: it starts and stops a
Spark session of its own, which in this process would be the suite's shared one.
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[3]


def readme_query() -> str:
    """The README's query of what the demo landed: the shell block after "Query what it landed"."""
    text = (REPO / "README.md").read_text()
    after = text[text.index("Query what it landed") :]
    return re.search(r"```sh\n(.*?)```", after, re.DOTALL).group(1)


@pytest.mark.timeout(600)
def test_the_demo_lands_every_read_once_and_shows_both_readers_heartbeats_reconciled_to_zero(
    tmp_path,
):
    # The demo's own folder, `.demo`, in a checkout-like folder: the README's query runs there
    # as written, `.venv/bin/fxgate` included.
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    argv = [sys.executable, "-m", "actors.app.cli", "demo", "--workdir", str(tmp_path / ".demo")]
    argv += ["--count", "30", "--rate", "0", "--heartbeat-every", "10", "--gpi-every", "7"]
    demo = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = demo.communicate(timeout=540)
    finally:
        if demo.poll() is None:  # timed out: the demo, its broker, gateway and JVM go together
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(30)
    assert demo.returncode == 0, out
    readers = [line for line in out.splitlines() if line.startswith("reader:")]
    assert [line.split(":")[1].strip() for line in readers] == ["fx9600-01", "fx9600-02"], out
    for line in readers:
        # Per phase: heartbeats at 0, 10, 20 and 30 data messages; GPI changes after 7, 14, ...
        assert re.search(r"last heartbeat \d+ s ago \(8 heartbeat\(s\), 8 gpi\)", line), line
        assert "60 data message(s) received" in line, line
        assert "its counters: sent 60, received 60, retained 0, dropped 0" in line, line
        assert "reconciliation (per gateway): 0 sent and not received here over 7 " in line, line
    assert "SILENT:" not in out
    assert "0 unaccounted" in out
    assert "EXACT: every published read landed once" in out

    query = subprocess.run(
        ["sh", "-c", readme_query()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert query.returncode == 0, query.stdout + query.stderr
    rows = [line for line in query.stdout.splitlines() if "fx9600-0" in line]
    assert len(rows) == 2 and all(re.search(r"\b60\b", row) for row in rows), query.stdout
