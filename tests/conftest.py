"""Fixtures shared by the whole suite: a real mosquitto per test, one Spark session per run."""

from tests.harness.broker import mosquitto, mosquitto_factory  # noqa: F401
from tests.harness.spark import spark_session  # noqa: F401
