"""The getting-started page's shell blocks, run as written against the test brokers.

Each ```bash block of docs/pages/getting-started.md runs in order, in bash with `-euo pipefail`,
with the virtualenv first on the PATH, HOME in a temporary folder, and the BROKER_* variables the
page asks the reader to set pointing at two mosquitto brokers started here: a plain one and one
with a TLS listener and a password file. An HTML comment just before a block says how to run it:
- `<!-- test: skip (why) -->`: not run (the install, or the variables the test sets itself);
- `<!-- test: in the background until "text" -->`: started and left running once its output
  holds the text (the daemon), stopped with SIGTERM at the end;
- `<!-- test: until "text" -->`: run again until its output holds the text (a query of what
  lands within seconds).
Any other block must exit 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.actors.test_tls import SECRET, mosquitto_passwords, server_tls
from tests.harness.certs import make_certificates

pytestmark = [pytest.mark.broker, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "pages" / "getting-started.md"
BLOCK = re.compile(r"(?:<!-- test: (?P<how>[^\n]*?) -->\n)?```bash\n(?P<code>.*?)```", re.DOTALL)
QUOTED = re.compile(r'"([^"]+)"')
BLOCK_TIMEOUT = 180.0
UNTIL_TIMEOUT = 300.0
BACKGROUND_TIMEOUT = 120.0


@dataclass(frozen=True)
class Block:
    how: str  # "run", "skip", "background" or "until"
    code: str
    text: str | None = None  # what "background" and "until" wait for


def blocks(page: str) -> list[Block]:
    found = []
    for match in BLOCK.finditer(page):
        how, code = match.group("how"), match.group("code")
        if how is None:
            found.append(Block("run", code))
        elif how.startswith("skip"):
            assert re.match(r"skip \(.+\)$", how), f"a skipped block says why: {how!r}"
            found.append(Block("skip", code))
        elif how.startswith("in the background until"):
            found.append(Block("background", code, QUOTED.search(how).group(1)))
        elif how.startswith("until"):
            found.append(Block("until", code, QUOTED.search(how).group(1)))
        else:
            raise AssertionError(f"unknown test instruction before a block: {how!r}")
    return found


class Background:
    """A block left running: its output collected by a thread, an event once it holds `text`."""

    def __init__(self, code: str, env: dict, cwd: Path, text: str) -> None:
        self.text = text
        self.lines: list[str] = []
        self.seen = threading.Event()
        self.proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", code],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if self.text in line:
                self.seen.set()

    def stop(self) -> int:
        """SIGTERM to its process group (the daemon stops gracefully), SIGKILL if it will not."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self._reader.join(10)
        return self.proc.returncode


def run(code: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )


def test_the_page_marks_what_it_cannot_run_and_runs_the_rest():
    found = blocks(PAGE.read_text())
    kinds = [b.how for b in found]
    # The walk must keep its shape: a daemon started, reads published, a query that sees them,
    # and the same over TLS. A page that skipped everything would pass the test below vacuously.
    assert kinds.count("background") == 2, kinds
    assert kinds.count("until") == 3, kinds
    assert kinds.count("run") >= 5, kinds
    assert any("fxgate simulate" in b.code for b in found if b.how == "run")
    assert any("mosquitto_pub" in b.code for b in found if b.how == "run")


@pytest.mark.timeout(900)
def test_every_command_block_of_the_getting_started_page_works_against_the_test_brokers(
    mosquitto_factory, tmp_path
):
    certs = make_certificates(tmp_path / "certs")
    plain = mosquitto_factory()
    secured = mosquitto_factory(
        password_file=mosquitto_passwords(tmp_path / "passwd", "gateway", SECRET),
        tls=server_tls(certs),
    )
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "BROKER_HOST": plain.host,
        "BROKER_PORT": str(plain.port),
        "BROKER_TLS_PORT": str(secured.port),
        "BROKER_CA": str(certs.ca),
        "BROKER_USER": "gateway",
        "BROKER_PASSWORD": SECRET,
    }
    env.pop("FXGATE_CONFIG", None)
    env = {k: v for k, v in env.items() if not k.startswith("FXGATE__")}

    started: list[Background] = []
    try:
        for number, block in enumerate(blocks(PAGE.read_text()), start=1):
            where = f"block {number}:\n{block.code}"
            if block.how == "skip":
                continue
            if block.how == "background":
                background = Background(block.code, env, home, block.text)
                started.append(background)
                assert background.seen.wait(BACKGROUND_TIMEOUT), (
                    f"{where}\nnever said {block.text!r}:\n{''.join(background.lines[-40:])}"
                )
                assert background.proc.poll() is None, f"{where}\nexited"
                continue
            if block.how == "until":
                deadline = time.monotonic() + UNTIL_TIMEOUT
                while True:
                    done = run(block.code, env, home)
                    assert done.returncode == 0, f"{where}\n{done.stdout}\n{done.stderr}"
                    if block.text in done.stdout:
                        break
                    assert time.monotonic() < deadline, (
                        f"{where}\n{block.text!r} not in the output within "
                        f"{UNTIL_TIMEOUT} s:\n{done.stdout}"
                    )
                continue
            done = run(block.code, env, home)
            said = f"{where}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
            assert done.returncode == 0, said
    finally:
        codes = [background.stop() for background in started]
    # The daemons stopped gracefully on SIGTERM, as systemd stops them.
    assert codes == [0] * len(started), [(b.proc.args, b.lines[-20:]) for b in started]
    # Nothing of the secret in what the daemons logged.
    assert not any(SECRET in line for b in started for line in b.lines)
