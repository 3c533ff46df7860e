"""`[spark] tables_dir` as a plain path or a Hadoop URI: what the config accepts, what Spark is
handed, and what the readers that start no JVM can open."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from actors.app.status import collect_status, format_status
from actors.config.schema import ConfigError, load_config
from spark.location import local_path, parse_location, spark_uri
from spark.tables import READS, TablesNotReadable, TableWriter, read_table, read_table_arrow

ENV = {"MQTT_ENVIRONMENT_ID": "test"}
APP = "fxgate-ledger-test"


def config_with(tables_dir: str, data: Path):
    return load_config(
        None,
        environ={
            **ENV,
            "FXGATE__GATEWAY__DATA_DIR": str(data),
            "FXGATE__SPARK__TABLES_DIR": tables_dir,
        },
    )


def test_a_file_uri_is_the_same_local_directory_as_its_path(tmp_path):
    assert parse_location(f"file://{tmp_path}/tables") == tmp_path / "tables"
    assert parse_location(f"file:{tmp_path}/tables/") == tmp_path / "tables"
    assert parse_location(f"file://localhost{tmp_path}/t") == tmp_path / "t"
    assert local_path(f"file://{tmp_path}/t") == tmp_path / "t"


def test_a_plain_relative_path_is_taken_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_location("tables") == tmp_path / "tables"


def test_a_cluster_uri_is_kept_as_written_and_is_not_local():
    assert (
        parse_location("hdfs://namenode:8020/fxgate/tables/")
        == "hdfs://namenode:8020/fxgate/tables"
    )
    assert parse_location("s3a://bucket/fxgate") == "s3a://bucket/fxgate"
    assert parse_location("hdfs:///fxgate") == "hdfs:///fxgate"
    assert local_path("s3a://bucket/fxgate") is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("file://gateway2/srv/tables", "on this machine"),
        ("file:tables", "absolute path"),
        ("s3a:bucket/fxgate", "s3a://<authority>/<path>"),
        ("hdfs:///", "names no directory"),
        ("s3a://bucket/fxgate?versionId=3", "query or a fragment"),
        ("s3a://AKIA:hunter2@bucket/fxgate", "credentials may not be written"),
    ],
)
def test_a_location_spark_could_not_use_as_meant_is_refused_with_what_to_write(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_location(text)


def test_the_config_names_the_key_and_never_repeats_a_password_in_the_uri(tmp_path):
    with pytest.raises(ConfigError) as refused:
        config_with("s3a://AKIA:hunter2@bucket/fxgate", tmp_path)
    assert "spark.tables_dir" in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_the_config_gives_a_path_for_file_uris_and_the_text_for_cluster_uris(tmp_path):
    assert config_with(f"file://{tmp_path}/t", tmp_path / "data").tables_path == tmp_path / "t"
    assert config_with("hdfs://nn/fx", tmp_path / "data").tables_path == "hdfs://nn/fx"
    default = load_config(None, environ={**ENV, "FXGATE__GATEWAY__DATA_DIR": str(tmp_path)})
    assert default.tables_path == tmp_path / "tables"


def test_spark_is_always_handed_a_uri_and_never_a_bare_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert spark_uri(tmp_path / "t") == f"file://{tmp_path}/t"
    assert spark_uri("rel") == f"file://{tmp_path}/rel"
    # Not percent-encoded: Hadoop's Path would take '%20' as three characters of the name.
    assert spark_uri(tmp_path / "a b") == f"file://{tmp_path}/a b"
    assert spark_uri("s3a://bucket/fx/") == "s3a://bucket/fx"


def day_rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "date": ["2026-11-21"] * len(ids)})


@pytest.mark.spark
def test_a_local_path_is_written_locally_even_when_the_default_file_system_is_elsewhere(
    spark_session, tmp_path
):
    # A cluster's Hadoop configuration usually makes HDFS the default file system; a bare path
    # would then be written there (here: refused, nothing listens) instead of on this disk.
    hadoop = spark_session.sparkContext._jsc.hadoopConfiguration()
    before = hadoop.get("fs.defaultFS")
    hadoop.set("fs.defaultFS", "hdfs://127.0.0.1:9/")
    try:
        TableWriter(spark_session, tmp_path / "tables", APP).write_batch(
            1, {READS: day_rows([1, 2])}
        )
        through_spark = read_table(spark_session, tmp_path / "tables", READS).count()
    finally:
        hadoop.set("fs.defaultFS", before)
    assert sorted(read_table_arrow(tmp_path / "tables", READS).column("id").to_pylist()) == [1, 2]
    assert through_spark == 2


@pytest.mark.spark
def test_a_table_written_through_a_file_uri_reads_the_same_by_uri_and_by_path(
    spark_session, tmp_path
):
    uri = f"file://{tmp_path}/lake"
    TableWriter(spark_session, uri, APP).write_batch(4, {READS: day_rows([7, 8, 9])})
    by_path = read_table_arrow(tmp_path / "lake", READS)
    by_uri = read_table_arrow(uri, READS)
    assert by_uri.equals(by_path)
    assert sorted(by_uri.column("id").to_pylist()) == [7, 8, 9]
    assert read_table(spark_session, uri, READS).count() == 3


def test_a_table_on_a_cluster_file_system_is_refused_by_the_pyarrow_reader_with_a_reason():
    with pytest.raises(TablesNotReadable, match=r"s3a://bucket/fx/reads .*fxgate report"):
        read_table_arrow("s3a://bucket/fx", READS)


def test_status_says_the_tables_are_not_counted_when_they_live_on_a_cluster(tmp_path):
    report = collect_status(config_with("hdfs://namenode/fxgate", tmp_path))
    assert report["tables"]["reads"] is None
    assert "tables:     not counted: table reads at hdfs://namenode/fxgate/reads" in (
        format_status(report)
    )


@pytest.mark.spark
def test_status_counts_tables_given_by_a_file_uri(spark_session, tmp_path):
    TableWriter(spark_session, tmp_path / "t", APP).write_batch(1, {READS: day_rows([1, 2, 3])})
    report = collect_status(config_with(f"file://{tmp_path}/t", tmp_path / "data"))
    assert report["tables"] == {"reads": 3, "dead_letters": 0}
