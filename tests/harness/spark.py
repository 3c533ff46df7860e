"""One SparkSession for the whole test run: a JVM start costs about 5 s on the CI machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark.session import build_session, stop_session


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory) -> Iterator[SparkSession]:
    """A local[2] session with the daemon's settings; stopped, JVM and all, after the run.

    Tests share it, so a test that changes a runtime conf must restore it. Give every test its
    own tables directory (`tmp_path`), never a shared one.
    """
    session = build_session("local[2]", tmp_path_factory.mktemp("spark-work"))
    try:
        yield session
    finally:
        stop_session(session)
