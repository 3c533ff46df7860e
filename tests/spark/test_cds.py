"""The Spark JVM's class data archive (spark/cds.py): the one `make` writes is mapped by a new
session and said so in its start line; an archive the JVM cannot use leaves the session working,
with a WARNING; the rules that pick the archive and read the JVM's account of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spark import cds

REPO = Path(__file__).resolve().parents[2]

# Its own process: a second session in the suite's process would be the suite's session.
START = """
import logging, sys
from pathlib import Path

from spark.session import build_session, stop_session

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(levelname)s %(message)s")
logging.getLogger("py4j").setLevel(logging.WARNING)
session = build_session("local[1]", Path(sys.argv[1]), class_data_archive=sys.argv[2])
print("COUNT", session.range(5).count())
stop_session(session)
"""


def start_session(work_dir: Path, archive: str) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-c", START, str(work_dir), archive],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:  # its JVM goes with it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, out
    return out


@pytest.mark.spark
def test_a_session_maps_the_archive_make_wrote_and_says_so(tmp_path):
    assert cds.DEFAULT_ARCHIVE.is_file(), "make (deps) writes it before the tests run"
    out = start_session(tmp_path, "auto")
    assert "COUNT 5" in out
    assert f"(class data archive {cds.DEFAULT_ARCHIVE})" in out
    assert "LOG WARNING" not in out
    # The JVM's account went to the work directory, not the console.
    assert "[cds]" not in out
    assert f"Opened archive {cds.DEFAULT_ARCHIVE}." in (tmp_path / cds.LOG_FILE).read_text()


@pytest.mark.spark
def test_an_archive_the_jvm_cannot_use_leaves_the_session_working_and_says_why(tmp_path):
    damaged = tmp_path / "damaged.jsa"
    damaged.write_bytes(b"\x00" * 4096)
    out = start_session(tmp_path / "work", str(damaged))
    assert "COUNT 5" in out
    assert f"WARNING Spark JVM started without its class data archive {damaged}: " in out
    assert "bad magic number" in out
    assert "(class data archive" not in out


def test_auto_is_the_installs_archive_when_there_is_one_and_empty_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(cds, "DEFAULT_ARCHIVE", tmp_path / "spark-classes.jsa")
    assert cds.resolve("auto") is None
    (tmp_path / "spark-classes.jsa").write_bytes(b"x")
    assert cds.resolve("auto") == tmp_path / "spark-classes.jsa"
    assert cds.resolve("") is None and cds.resolve(None) is None
    assert cds.resolve("/elsewhere/a.jsa") == Path("/elsewhere/a.jsa")


def test_the_jvms_account_says_whether_the_archive_was_mapped(tmp_path):
    archive = Path("/x/a.jsa")
    log = tmp_path / "cds.log"
    log.write_text(
        "[0.008s][info][cds] trying to map /x/a.jsa\n"
        "[0.008s][info][cds] Opened archive /x/a.jsa.\n"
        "[0.008s][info][cds] full module graph: disabled\n"
    )
    assert cds.archive_status(archive, log) is None
    log.write_text(
        "[0.008s][info][cds] Opened archive /x/a.jsa.\n"
        "[0.008s][info][cds] UseSharedSpaces: A jar file is not the one used while building "
        "the shared archive file: /venv/pyspark/jars/x.jar\n"
        "[0.008s][info][cds] UseSharedSpaces: Unable to map shared spaces\n"
    )
    assert cds.archive_status(archive, log) == (
        "A jar file is not the one used while building the shared archive file: "
        "/venv/pyspark/jars/x.jar; Unable to map shared spaces"
    )
    log.write_text("[0.008s][info][cds] trying to map /x/other.jsa\n")
    assert cds.archive_status(archive, log) == "the JVM did not open it"
    assert cds.archive_status(archive, tmp_path / "missing.log").startswith("no account of it")
