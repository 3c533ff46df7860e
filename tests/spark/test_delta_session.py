"""Delta Lake in the session (spark/session.py): `build_session` loads the jars `make` fetched,
so a Delta append with a transaction identifier lands once; without the jars it refuses to start,
before any JVM, and says to run `make`."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pyspark
import pytest

from spark import session as spark_session_module
from spark.session import (
    DEFAULT_JARS_DIR,
    DELTA_JAR_NAMES,
    DELTA_VERSION,
    JARS_DIR_VARIABLE,
    DeltaJarsMissing,
    build_session,
    delta_jars,
)

REPO = Path(__file__).resolve().parents[2]


def make_variables() -> dict[str, str]:
    text = (REPO / "Makefile").read_text()
    return dict(re.findall(r"^(DELTA_\w+)\s*:=\s*(\S+)\s*$", text, flags=re.MULTILINE))


def append(session, rows: list[tuple[int, str]], path: Path, version: int) -> None:
    (
        session.createDataFrame(rows, "n int, date string")
        .write.format("delta")
        .mode("append")
        .option("txnAppId", "app")
        .option("txnVersion", version)
        .partitionBy("date")
        .save(str(path))
    )


@pytest.mark.spark
def test_an_append_with_a_transaction_version_already_in_the_table_adds_no_rows(
    spark_session, tmp_path
):
    table = tmp_path / "reads"
    rows = [(1, "2026-11-27"), (2, "2026-11-28")]

    append(spark_session, rows, table, version=1)
    first = spark_session.read.format("delta").load(str(table))
    assert sorted(tuple(row) for row in first.collect()) == rows
    assert (table / "_delta_log").is_dir() and (table / "date=2026-11-27").is_dir()

    append(spark_session, rows, table, version=1)
    assert spark_session.read.format("delta").load(str(table)).count() == 2

    append(spark_session, [(3, "2026-11-28")], table, version=2)
    assert spark_session.read.format("delta").load(str(table)).count() == 3


@pytest.mark.spark
def test_the_session_loads_the_installed_delta_jars_with_the_delta_catalog(spark_session):
    conf = spark_session.sparkContext.getConf()
    assert conf.get("spark.jars").split(",") == [str(jar) for jar in delta_jars()]
    assert conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    assert (
        conf.get("spark.sql.catalog.spark_catalog")
        == "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    )


def test_missing_jars_stop_the_start_before_any_jvm_and_say_to_run_make(tmp_path, monkeypatch):
    class NoJvm:
        @property
        def builder(self):
            raise AssertionError("build_session reached the SparkSession builder")

    monkeypatch.setattr(spark_session_module, "SparkSession", NoJvm())
    jars_dir = tmp_path / "jars"
    jars_dir.mkdir()
    (jars_dir / DELTA_JAR_NAMES[1]).write_bytes(b"PK")

    with pytest.raises(DeltaJarsMissing) as raised:
        build_session("local[1]", tmp_path / "work", jars_dir=jars_dir)

    message = str(raised.value)
    assert DELTA_JAR_NAMES[0] in message
    assert DELTA_JAR_NAMES[1] not in message
    assert str(jars_dir) in message
    assert "`make deps`" in message
    assert raised.value.missing == (DELTA_JAR_NAMES[0],)
    assert not (tmp_path / "work").exists()


def test_the_jars_are_looked_for_in_the_argument_then_the_variable_then_the_virtualenv(
    tmp_path, monkeypatch
):
    for name in ("argument", "variable"):
        (tmp_path / name).mkdir()
        for jar in DELTA_JAR_NAMES:
            (tmp_path / name / jar).write_bytes(b"PK")
    monkeypatch.setenv(JARS_DIR_VARIABLE, str(tmp_path / "variable"))

    assert delta_jars(tmp_path / "argument") == [tmp_path / "argument" / j for j in DELTA_JAR_NAMES]
    assert delta_jars() == [tmp_path / "variable" / jar for jar in DELTA_JAR_NAMES]

    monkeypatch.delenv(JARS_DIR_VARIABLE)
    assert Path(sys.prefix) / "share" / "fxgate" / "jars" == DEFAULT_JARS_DIR
    monkeypatch.setattr(spark_session_module, "DEFAULT_JARS_DIR", tmp_path / "none-here")
    with pytest.raises(DeltaJarsMissing, match="none-here"):
        delta_jars()


def test_make_fetches_the_release_the_session_loads_and_the_wheel_is():
    variables = make_variables()
    assert variables["DELTA_VERSION"] == DELTA_VERSION
    fetched = [
        f"{variables[name].split(':')[1]}-{DELTA_VERSION}.jar"
        for name in ("DELTA_SPARK_ARTIFACT", "DELTA_STORAGE_ARTIFACT")
    ]
    assert tuple(fetched) == DELTA_JAR_NAMES
    # The Python API (delta.tables) calls into these classes, and delta-spark is built per
    # Spark minor version.
    assert metadata.version("delta-spark") == DELTA_VERSION
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    assert DELTA_JAR_NAMES[0].startswith(f"delta-spark_{spark_minor}_2.13-")
