"""The Spark session an operator command starts (`report`, `audit`, `sql`, `compact` of remote
tables): the daemon's own Spark settings, its work files under `<data_dir>/spark-<command>`, so
that a command beside the running daemon never shares the daemon's folders."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.config.schema import Config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def command_session(
    config: Config, command: str, defaults: dict[str, object] | None = None
) -> SparkSession:
    """`defaults`: Spark settings of this command that the configuration's `[spark.conf]` may
    override."""
    # Imported here: pyspark takes about a second to import, and most commands need none of it.
    from spark.session import build_session

    return build_session(
        config.spark.master,
        config.gateway.data_path / f"spark-{command}",
        driver_memory=config.spark.driver_memory,
        class_data_archive=config.spark.class_data_archive,
        conf={**(defaults or {}), **config.spark.conf},
    )
