"""What a gateway installs and what `fxgate run` loads: only what landing reads needs.

A light install (`make install`, or the wheel `make dist` builds) has no Spark, no JDK, no test
brokers and no test tools; the daemon lands with delta-rs and imports none of them, and each
command that does need Spark says, when it is missing, what to install. What a light install
lacks is hidden from a process here the way it is missing there: a `sitecustomize` on its
PYTHONPATH makes those modules unimportable, in the process and in every child it starts.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.devtools.simulate import expected_read_ids, simulate
from spark.report import landed_ids_arrow
from spark.session import DeltaJarsMissing, SparkNotInstalled, check_spark

REPO = Path(__file__).resolve().parents[3]

SPARK_MODULES = ("pyspark", "py4j", "delta")
# What a light install does not have (measured: `make install` put none of them in its
# virtualenv): Spark, the engines the tests read the tables with, the benchmarks' tools. pyarrow
# imports pandas and numpy on its own when they are there, so a daemon in the suite's virtualenv
# would load them where a gateway could not.
NOT_ON_A_GATEWAY = (*SPARK_MODULES, "duckdb", "polars", "pandas", "numpy", "matplotlib")
# What a gateway has, for the commands, and `fxgate run` must not load: progress bars.
COMMANDS_ONLY = ("tqdm",)


def hiding(directory: Path, modules: tuple[str, ...]) -> dict[str, str]:
    """The environment of a process (and its children) in which `modules` are not installed."""
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(
        "import sys\n"
        "# Not installed: find_spec says None, an import fails.\n"
        f"sys.modules.update(dict.fromkeys({modules!r}))\n"
    )
    path = os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture
def without_spark(tmp_path) -> dict[str, str]:
    return hiding(tmp_path / "no-spark", SPARK_MODULES)


def fxgate(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actors.app.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def requirements(section: str, key: str) -> dict[str, str]:
    """setup.cfg's `key` of `section` as {project name: pinned version}."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    found = {}
    for line in config[section][key].splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{line!r} in setup.cfg [{section}] {key} is not pinned"
            found[name.strip().lower()] = version.strip()
    return found


def test_a_gateway_installs_no_spark_and_no_test_tool_and_spark_is_an_extra_of_its_own():
    needed = requirements("options", "install_requires")
    for name in ("pyspark", "delta-spark", "py4j", "duckdb", "polars", "pandas", "pytest"):
        assert name not in needed, f"{name} in install_requires: every gateway would install it"
    for name in ("matplotlib", "mkdocs", "ruff", "hypothesis", "py-spy"):
        assert name not in needed
    assert {"deltalake", "pyarrow", "paho-mqtt", "pykka"} <= needed.keys()
    spark = requirements("options.extras_require", "spark")
    assert set(spark) == {"pyspark", "delta-spark"}


def make_dry_run(*args: str, venv: Path) -> str:
    """What `make` would run for `args` with the virtualenv at `venv` (not there: every step)."""
    result = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"VENV={venv}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_make_install_and_make_demo_install_no_jdk_maven_go_node_or_test_broker(tmp_path):
    venv = tmp_path / "venv"
    install = make_dry_run("install", venv=venv)
    assert "pip install -q -e .\n" in install.replace(f"{venv}/bin/", "")
    demo = make_dry_run("demo", venv=venv)
    for steps in (install, demo):
        for tool in ("mvn", "javac", "go build", "npm", "openjdk", "maven", "[spark", "[test"):
            assert tool not in steps, f"{tool!r} in:\n{steps}"
    assert "mosquitto" in demo
    # The test brokers, when asked for: HiveMQ through Maven and a JDK, Mochi with Go.
    assert "mvn" in make_dry_run("demo", "BROKER=hivemq", venv=venv)
    assert "go build" in make_dry_run("demo", "BROKER=mochi", venv=venv)
    spark = make_dry_run("spark", venv=venv)
    assert "pip install -q -e '.[spark]'" in spark and "dependency:copy" in spark


@pytest.mark.broker
def test_a_daemon_lands_reads_without_spark_or_test_tools_and_loads_no_progress_bar(
    mosquitto, daemon_factory, tmp_path
):
    data = tmp_path / "data"
    env = {
        **hiding(tmp_path / "gateway-site", NOT_ON_A_GATEWAY),
        "FXGATE__SOURCE__PORT": str(mosquitto.port),
        "FXGATE__GATEWAY__DATA_DIR": str(data),
        # `python -X importtime` for the daemon and every child: a line per module imported.
        "PYTHONPROFILEIMPORTTIME": "1",
    }
    daemon = daemon_factory(env)
    daemon.wait_for_log(r"source: subscribed to zebra/fx/\+/reads", timeout=60)
    result = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=20, qos=1)
    expected = expected_read_ids(result.published)
    tables = data / "tables"
    daemon.wait_for_batches(
        lambda: set(landed_ids_arrow(tables)[0]) == expected,
        lambda: f"{len(landed_ids_arrow(tables)[0])} of {len(expected)} reads landed",
    )
    assert daemon.terminate() == 0

    output = daemon.output()
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in output.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    # What landing does need was seen: the import lines are there to be read.
    assert {"deltalake", "pyarrow", "paho", "sqlite3"} <= imported, sorted(imported)
    for name in COMMANDS_ONLY:
        assert name not in imported, [line for line in output.splitlines() if name in line]


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (("sql", "SELECT 1"), "fxgate sql: cannot query: it runs Spark SQL: "),
        (("audit",), "fxgate audit: could not audit: the audit runs Spark: "),
    ],
)
def test_a_command_that_runs_spark_says_what_to_install_when_spark_is_not_there(
    without_spark, tmp_path, command, why
):
    env = {**without_spark, "FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data")}
    result = fxgate(*command, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(
        f"{why}Spark is not installed here (missing: pyspark (Python package); delta-spark "
        "(Python package)"
    ), result.stderr
    assert "`make spark` in fxgate's checkout" in result.stderr
    assert "pip install 'fxgate[spark]'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ('landing = "spark"', '[spark] landing = "spark"'),
        ('master = "spark://127.0.0.1:7077"', "[spark] master = 'spark://127.0.0.1:7077'"),
    ],
)
def test_a_daemon_that_lands_through_spark_without_spark_refuses_to_start_saying_what_to_install(
    without_spark, tmp_path, setting, named
):
    conf = tmp_path / "gateway.toml"
    conf.write_text(f'[gateway]\ndata_dir = "{tmp_path / "data"}"\n[spark]\n{setting}\n')
    result = fxgate("run", "--config", str(conf), env=without_spark, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert (
        f"not starting: {named} lands through Spark: Spark is not installed here (missing: "
        "pyspark (Python package); delta-spark (Python package)"
    ) in result.stderr
    assert "pip install 'fxgate[spark]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_report_on_tables_of_this_disk_needs_no_spark(without_spark, tmp_path):
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("")
    env = {**without_spark, "FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data")}
    result = fxgate("report", "--manifest", str(manifest), "--no-progress", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("reads table, read back with delta-rs:\n")
    assert "EXACT" in result.stdout


def test_the_check_names_a_missing_java_runtime_and_jars_alone_as_missing_jars(
    tmp_path, monkeypatch
):
    jars = tmp_path / "jars"
    jars.mkdir()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(SparkNotInstalled) as raised:
        check_spark(jars)
    assert not isinstance(raised.value, DeltaJarsMissing)
    assert "a Java runtime (no $JAVA_HOME/bin/java)" in str(raised.value)
    assert (
        f"Delta Lake's jars delta-spark_4.2_2.13-4.4.0.jar, delta-storage-4.4.0.jar in {jars}"
        in (str(raised.value))
    )

    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    # In this suite's virtualenv pyspark and delta-spark are there: only the jars are missing.
    with pytest.raises(DeltaJarsMissing) as raised:
        check_spark(jars)
    assert "`make spark`" in str(raised.value)
