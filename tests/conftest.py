"""Fixtures shared by the whole suite: real mosquitto brokers, the daemon as a subprocess, and one
Spark session per run."""

import freezegun

from tests.harness.azurite import azurite, azurite_factory  # noqa: F401
from tests.harness.broker import broker_factory, mosquitto, mosquitto_factory  # noqa: F401
from tests.harness.daemon import daemon_factory  # noqa: F401
from tests.harness.object_stores import object_store_process  # noqa: F401
from tests.harness.seaweedfs import seaweedfs, seaweedfs_factory  # noqa: F401
from tests.harness.spark import spark_session  # noqa: F401
from tests.harness.spark_cluster import spark_cluster  # noqa: F401

# freezegun patches time.monotonic in every module it does not ignore; pykka's timeouts (and paho's
# keep-alive, and py4j's sockets) hang under a frozen monotonic clock (DESIGN §6).
freezegun.configure(
    extend_ignore_list=["pykka", "paho", "py4j", "pyspark", "threading", "tests.harness.proxy"]
)
