from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]

# Runs in its own process so that stopping its JVM cannot touch the suite-wide session.
OWN_SESSION = """
import json, logging, sys
from pathlib import Path

import psutil
from pyspark import SparkFiles

from spark.session import build_session, stop_session

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(name)s %(message)s")
logging.getLogger("py4j").setLevel(logging.WARNING)


def java_children():
    return [p.pid for p in psutil.Process().children(recursive=True) if p.name() == "java"]


# First a session whose JVM dies under it (as -XX:+ExitOnOutOfMemoryError makes it do): the
# owner must be able to clean up and build a working session again in the same process.
doomed = build_session("local[1]", Path(sys.argv[1]))
for pid in java_children():
    psutil.Process(pid).kill()
stop_session(doomed)

session = build_session("local[1]", Path(sys.argv[1]), conf={"spark.sql.shuffle.partitions": 3})
facts = {
    "count_after_rebuild": session.range(3).count(),
    "java_before": java_children(),
    "local_dir": session.conf.get("spark.local.dir"),
    "jvm_tmpdir": session._jvm.System.getProperty("java.io.tmpdir"),
    "user_files": SparkFiles.getRootDirectory(),
    "shuffle_partitions": session.conf.get("spark.sql.shuffle.partitions"),
}
stop_session(session)
stop_session(session)
facts["java_after"] = java_children()
print("FACTS " + json.dumps(facts))
"""


@pytest.fixture(scope="module")
def own_session(tmp_path_factory):
    """Build and stop a session in a child Python; return its facts, stdout and stderr."""
    work_dir = tmp_path_factory.mktemp("own-session")
    done = subprocess.run(
        [sys.executable, "-c", OWN_SESSION, str(work_dir)],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    facts_line = next(line for line in done.stdout.splitlines() if line.startswith("FACTS "))
    return {
        "work_dir": work_dir,
        "facts": json.loads(facts_line.removeprefix("FACTS ")),
        "stdout": done.stdout,
        "stderr": done.stderr,
    }


def test_the_shared_session_has_no_ui_delta_few_log_tasks_utc_and_arrow(spark_session):
    conf = spark_session.conf
    assert spark_session.sparkContext.uiWebUrl is None
    assert conf.get("spark.ui.enabled") == "false"
    # Spark's console progress bars would break into the commands' own progress on stderr.
    assert conf.get("spark.ui.showConsoleProgress") == "false"
    assert conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf.get("spark.databricks.delta.snapshotPartitions") == "2"
    assert conf.get("spark.sql.sources.parallelPartitionDiscovery.parallelism") == "8"
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert conf.get("spark.sql.shuffle.partitions") == "2"
    assert conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert conf.get("spark.driver.memory") == "512m"


def test_local_dir_and_jvm_tmpdir_are_under_the_work_dir(own_session):
    work_dir = own_session["work_dir"]
    facts = own_session["facts"]
    assert Path(facts["local_dir"]).is_relative_to(work_dir)
    assert Path(facts["jvm_tmpdir"]).is_relative_to(work_dir)
    # Spark really used it: its per-session scratch directory was created there.
    assert Path(facts["user_files"]).is_relative_to(facts["local_dir"])


def test_the_callers_conf_overrides_the_defaults(own_session):
    assert own_session["facts"]["shuffle_partitions"] == "3"


def test_stop_session_leaves_no_jvm_child_even_when_called_twice(own_session):
    facts = own_session["facts"]
    assert len(facts["java_before"]) == 1
    assert facts["java_after"] == []
    assert not psutil.pid_exists(facts["java_before"][0])


def test_a_session_is_rebuilt_in_the_same_process_after_its_jvm_died(own_session):
    assert own_session["facts"]["count_after_rebuild"] == 3


def test_starting_spark_logs_one_info_line_and_prints_only_warnings_on_stderr(own_session):
    started = re.findall(
        r"^LOG spark\.session Spark session started: master local\[1\] in \d+\.\d s, "
        r"Delta Lake \d+\.\d+\.\d+( \(class data archive [^)]+\))?$",
        own_session["stdout"],
        flags=re.MULTILINE,
    )
    assert len(started) == 2  # the doomed session and the rebuilt one
    not_warnings = [
        line
        for line in own_session["stderr"].splitlines()
        if line.strip() and not re.search(r"\bWARN(ING)?\b", line)
    ]
    assert not_warnings == []
