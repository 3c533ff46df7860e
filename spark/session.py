"""Build and stop the one SparkSession the daemon owns (the SparkWriterActor is its only user).

Settings come from DESIGN §4: loopback-only networking, no UI, two shuffle partitions (and few
tasks for Delta's log replay and file listing), a small driver, UTC, Arrow, and every scratch
file of the JVM under the caller's `work_dir`, because killed runs leave their files behind in
whatever temp dir they used.

With a cluster master (`spark://host:7077`) the same settings apply to the driver, which runs in
this process; the executors run on the cluster's workers and connect back to the driver, so the
driver must be reachable from them. For a master on loopback (tests, a one-box cluster) the
driver binds and advertises 127.0.0.1; for any other master nothing is pinned to loopback and
the operator names the address the executors should use (`spark.driver.host`, and fixed
`spark.driver.port` / `spark.blockManager.port` through a firewall) in `[spark.conf]`. The
address the driver advertised is logged at start.

Tables are Delta Lake tables (DESIGN §7.7): the session loads Delta's jars from a directory on
this machine (`delta_jars`; `make` fetches them into the virtualenv) through `spark.jars`, which
also ships them to a cluster's executors, and registers Delta's SQL extension and catalog. A
missing jar stops the start before any JVM is launched (`DeltaJarsMissing`); nothing is ever
downloaded at run time.

Spark is an extra of the install (`pip install 'fxgate[spark]'`, `make spark`): the daemon lands
with delta-rs and never needs it unless it lands through Spark (a cluster, `landing = "spark"`),
and only `fxgate sql`, `audit` and the commands on tables that only Spark reaches start a session.
So this module imports pyspark only when a session starts or stops (0.15 s and 9 MiB that the
daemon paid at every start when its supervisor imported this module), and `check_spark` says,
before any import of it, what is missing and how to install it (`SparkNotInstalled`).

`stop_session` stops the SparkContext *and* the JVM: `SparkSession.stop()` alone leaves the py4j
gateway JVM running for the life of the Python process, and a daemon that restarts its Spark
writer would otherwise pile up JVMs.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from subprocess import TimeoutExpired
from types import MappingProxyType
from typing import TYPE_CHECKING

from spark import cds
from spark.location import is_local_master

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

# Seconds to wait for the JVM to exit once its stdin is closed before killing it.
_JVM_EXIT_TIMEOUT = 10.0

# The Delta Lake release whose jars `make` fetches (the Makefile's DELTA_VERSION and
# DELTA_*_ARTIFACT say the same); the delta-spark wheel must be the same release, since its
# Python API calls into these classes. delta-spark is built per Spark minor version.
DELTA_VERSION = "4.4.0"
DELTA_JAR_NAMES = (
    f"delta-spark_4.2_2.13-{DELTA_VERSION}.jar",
    f"delta-storage-{DELTA_VERSION}.jar",
)
# Where `make` puts them: in the virtualenv, as the class data archive (spark/cds.py).
DEFAULT_JARS_DIR = Path(sys.prefix) / "share" / "fxgate" / "jars"
JARS_DIR_VARIABLE = "FXGATE_DELTA_JARS"

# Root at WARN; loggers that print warnings nobody can act on go to ERROR.
_LOG4J2_PROPERTIES = """\
status = error
name = fxgate
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
logger.spark.name = org.apache.spark
logger.spark.level = warn
# Printed on every start because we set spark.local.dir; nothing to act on in local mode.
logger.sparkconf.name = org.apache.spark.SparkConf
logger.sparkconf.level = warn
logger.sparkconf.filter.localdir.type = RegexFilter
logger.sparkconf.filter.localdir.regex = .*spark.local.dir will be overridden.*
logger.sparkconf.filter.localdir.onMatch = DENY
logger.sparkconf.filter.localdir.onMismatch = NEUTRAL
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
# Every write of more than ~4k rows ships its rows inside the task and says so; by design.
logger.tasksetmanager.name = org.apache.spark.scheduler.TaskSetManager
logger.tasksetmanager.level = warn
logger.tasksetmanager.filter.tasksize.type = RegexFilter
logger.tasksetmanager.filter.tasksize.regex = .*contains a task of very large size.*
logger.tasksetmanager.filter.tasksize.onMatch = DENY
logger.tasksetmanager.filter.tasksize.onMismatch = NEUTRAL
# Delta's log replay plans have more columns than spark.sql.debug.maxToStringFields, and the first
# Delta read or write of every JVM says it truncated their text; nothing to act on.
logger.stringutils.name = org.apache.spark.util.SparkStringUtils
logger.stringutils.level = warn
logger.stringutils.filter.truncated.type = RegexFilter
logger.stringutils.filter.truncated.regex = .*Truncated the string representation of a plan.*
logger.stringutils.filter.truncated.onMatch = DENY
logger.stringutils.filter.truncated.onMismatch = NEUTRAL
logger.sparkutils.name = org.apache.spark.util.Utils
logger.sparkutils.level = error
logger.sparkenv.name = org.apache.spark.SparkEnv
logger.sparkenv.level = error
# Warns with a full stack trace when reading a path that does not exist yet.
logger.filestreamsink.name = org.apache.spark.sql.execution.streaming.sinks.FileStreamSink
logger.filestreamsink.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = error
logger.netty.name = io.netty
logger.netty.level = error
logger.zookeeper.name = org.apache.zookeeper
logger.zookeeper.level = error
logger.hive.name = org.apache.hadoop.hive
logger.hive.level = error
logger.codegen.name = org.apache.spark.sql.catalyst.expressions.codegen
logger.codegen.level = error
logger.memory.name = org.apache.spark.memory
logger.memory.level = error
logger.blockmanager.name = org.apache.spark.storage
logger.blockmanager.level = error
logger.arrow.name = org.apache.arrow
logger.arrow.level = error
"""


def master_on_loopback(master: str) -> bool:
    """Whether every host of a `spark://h1:p1,h2:p2` master URL is a loopback address."""
    if not master.startswith("spark://"):
        return False
    hosts = [entry.rsplit(":", 1)[0] for entry in master.removeprefix("spark://").split(",")]
    return bool(hosts) and all(_is_loopback(host.strip("[]")) for host in hosts)


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# What to do when a piece is missing, said by every command that needs a Spark session.
INSTALL_SPARK = (
    "install Spark beside fxgate: `make spark` in fxgate's checkout (pyspark and delta-spark "
    "into its virtualenv, a Java runtime with apt, Delta Lake's jars from Maven Central), or "
    "by hand `pip install 'fxgate[spark]'`, a Java 17 runtime (Debian: openjdk-17-jre-headless) "
    f"and Delta Lake's jars in the directory {JARS_DIR_VARIABLE} names (docs: tables/spark)"
)


class SparkNotInstalled(RuntimeError):
    """Something a Spark session needs is not installed: `missing` names each piece."""

    def __init__(self, missing: Sequence[str]) -> None:
        self.missing = tuple(missing)
        super().__init__(
            f"Spark is not installed here (missing: {'; '.join(self.missing)}); {INSTALL_SPARK}"
        )


class DeltaJarsMissing(SparkNotInstalled):
    """Delta Lake's jars are not where the session looks for them (the rest of Spark is there);
    `missing` names the jars."""

    def __init__(self, missing: Sequence[str], directory: Path) -> None:
        RuntimeError.__init__(
            self,
            f"Delta Lake jar(s) missing from {directory}: {', '.join(missing)}; run "
            f"`make spark` (or `make deps`) in fxgate's checkout to fetch them there, or set "
            f"{JARS_DIR_VARIABLE} to a directory that holds them",
        )
        self.missing = tuple(missing)
        self.directory = directory


def java_runtime() -> str | None:
    """The `java` a Spark session would launch, as pyspark finds it: `$JAVA_HOME/bin/java`
    when JAVA_HOME is set, else the first on the PATH; None when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home, "bin", "java")
        return str(java) if os.access(java, os.X_OK) else None
    return shutil.which("java")


def check_spark(jars_dir: str | Path | None = None) -> list[Path]:
    """Delta Lake's jars (as `delta_jars`) once everything a Spark session needs is here:
    pyspark, delta-spark, a Java runtime and the jars. Looks, imports nothing: raises
    SparkNotInstalled naming every missing piece, or DeltaJarsMissing when only the jars are."""
    missing = [
        f"{package} (Python package)"
        for package, module in (("pyspark", "pyspark"), ("delta-spark", "delta"))
        if importlib.util.find_spec(module) is None
    ]
    if java_runtime() is None:
        missing.append(
            "a Java runtime (no $JAVA_HOME/bin/java)"
            if os.environ.get("JAVA_HOME")
            else "a Java runtime (no `java` on the PATH)"
        )
    try:
        jars = delta_jars(jars_dir)
    except DeltaJarsMissing as error:
        if not missing:
            raise
        missing.append(f"Delta Lake's jars {', '.join(error.missing)} in {error.directory}")
    if missing:
        raise SparkNotInstalled(missing)
    return jars


def delta_jars(jars_dir: str | Path | None = None) -> list[Path]:
    """The Delta Lake jars a session loads, as absolute paths, found in `jars_dir`; None means
    the directory ${FXGATE_DELTA_JARS} names, else `DEFAULT_JARS_DIR` (where `make` puts them).
    Raises DeltaJarsMissing when any of them is not there."""
    if jars_dir is None or str(jars_dir) == "":
        jars_dir = os.environ.get(JARS_DIR_VARIABLE) or DEFAULT_JARS_DIR
    directory = Path(jars_dir).absolute()
    missing = [name for name in DELTA_JAR_NAMES if not (directory / name).is_file()]
    if missing:
        raise DeltaJarsMissing(missing, directory)
    return [directory / name for name in DELTA_JAR_NAMES]


def _java_option(name: str, value: Path) -> str:
    # Spark's launcher splits extraJavaOptions like a shell and strips double quotes.
    return f'-D{name}="{value}"'


def build_session(
    master: str,
    work_dir: Path,
    app_name: str = "fxgate",
    driver_memory: str = "512m",
    conf: Mapping[str, object] = MappingProxyType({}),
    class_data_archive: str | Path | None = cds.AUTO,
    java_options: Sequence[str] = (),
    jars_dir: str | Path | None = None,
) -> SparkSession:
    """Start a SparkSession with Delta Lake whose scratch files and logs stay under `work_dir`.

    `class_data_archive`: the JVM maps that class data archive (spark/cds.py; "auto": the one
    `make` wrote, if any; None or "": none). `java_options` are added to the driver JVM's.
    `jars_dir`: where Delta's jars are (`delta_jars`; None: ${FXGATE_DELTA_JARS}, else the
    install's). Raises SparkNotInstalled (DeltaJarsMissing when only jars are missing) before
    any JVM starts and before pyspark is imported, when something Spark needs is not here.
    Entries of `conf` are applied last, so they override every default set here (overriding
    `spark.driver.extraJavaOptions` drops the quiet log4j config, the private tmpdir and the
    class data archive; overriding `spark.jars` or `spark.sql.extensions` drops Delta).
    Only one session per process: a second call returns the running session with
    `conf` applied only where Spark allows changing it at run time.
    """
    jars = check_spark(jars_dir)
    from pyspark.sql import SparkSession  # only now: see the module's docstring

    local = is_local_master(master)
    loopback = master_on_loopback(master)
    if local or loopback:
        # Read when the JVM starts: Spark then binds to and advertises loopback instead of the
        # address the host name resolves to (it warns when that is a loopback address, and
        # fails on a gateway whose name does not resolve at all). Not for a remote cluster:
        # its executors could not reach a driver that advertises 127.0.0.1.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Read when the JVM starts too: its Python workers (a Python data source's planner and
        # reader, spark/delta_rs_source.py) run this interpreter, with fxgate's packages, not
        # whatever `python3` the PATH finds first.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    work_dir = Path(work_dir).absolute()
    local_dir = work_dir / "local"
    tmp_dir = work_dir / "tmp"
    for directory in (local_dir, tmp_dir):
        directory.mkdir(parents=True, exist_ok=True)
    log4j_file = work_dir / "log4j2.properties"
    log4j_file.write_text(_LOG4J2_PROPERTIES)
    archive = cds.resolve(class_data_archive)
    cds_log = work_dir / cds.LOG_FILE
    cds_log.unlink(missing_ok=True)
    archive_options = [] if archive is None else cds.java_options(archive, cds_log)

    settings: dict[str, object] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        # Delta rebuilds a table's state from its log in this many tasks (50 by default): on
        # local[2] each is a scheduled task for a few KiB of log, and a first read of a table
        # took about four times as long with the default here.
        "spark.databricks.delta.snapshotPartitions": "2",
        # Delta's VACUUM lists the table's files in up to this many tasks (10,000 by default):
        # on local[2] a 3-file table's VACUUM took 110-135 s with the default, 30-35 s with 8.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
        "spark.driver.memory": driver_memory,
        "spark.local.dir": str(local_dir),
        # Left at its default, it creates ./spark-warehouse in whatever directory we run from.
        "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
        "spark.driver.extraJavaOptions": " ".join(
            [
                # A heap OOM in local mode left the JVM alive but deaf, and the Python call
                # waiting on it hung forever (seen with 200k 250-byte rows at 512m). Dying
                # makes the call fail, so the writer's owner can restart and replay.
                "-XX:+ExitOnOutOfMemoryError",
                _java_option("java.io.tmpdir", tmp_dir),
                _java_option("log4j2.configurationFile", log4j_file),
                *archive_options,
                *java_options,
            ]
        ),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Spark's default INT96 timestamps come back from pyarrow as naive nanoseconds; the
        # non-Spark readers must see the same timestamp[us, UTC] that was written.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Local files: the driver loads them, and serves them to a cluster's executors. Not
        # spark.driver.extraClassPath: that changes the JVM's class path, and the JVM refused
        # the class data archive ("shared class paths mismatch"); through spark.jars the
        # archive maps and holds the Delta classes its making loaded.
        "spark.jars": ",".join(str(jar) for jar in jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
    if loopback:
        # Executors on a loopback cluster connect back to the driver; left to itself the driver
        # advertises the name 127.0.0.1 resolves to ("localhost" here), which only works where
        # /etc/hosts says so.
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf)

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, str(value))

    # Measured on this machine (2 vCPU, pyspark 4.3.0, Java 17): 4.3-5.2 s over ten starts,
    # local[1] and local[2] alike. The first write after it costs another 3-5 s (JIT warm-up).
    started = time.perf_counter()
    session = builder.getOrCreate()
    seconds = time.perf_counter() - started
    sharing = ""
    if archive is not None:
        refused = cds.archive_status(archive, cds_log)
        if refused is None:
            sharing = f" (class data archive {archive})"
        else:
            logger.warning(
                "Spark JVM started without its class data archive %s: %s; `make` writes it "
                "again (the JVM's account: %s)",
                archive,
                refused,
                cds_log,
            )
    if local:
        logger.info(
            "Spark session started: master %s in %.1f s, Delta Lake %s%s",
            master,
            seconds,
            DELTA_VERSION,
            sharing,
        )
    else:
        spark_conf = session.sparkContext.getConf()
        logger.info(
            "Spark session started: master %s, application %s, driver reachable by the "
            "executors at %s:%s, in %.1f s, Delta Lake %s%s",
            master,
            session.sparkContext.applicationId,
            spark_conf.get("spark.driver.host"),
            spark_conf.get("spark.driver.port"),
            seconds,
            DELTA_VERSION,
            sharing,
        )
    return session


def stop_session(session: SparkSession | None, exit_timeout: float = _JVM_EXIT_TIMEOUT) -> None:
    """Stop `session`, its SparkContext and the gateway JVM; a no-op when already stopped.

    After it returns the JVM process has exited (and was reaped), so a new `build_session`
    in the same process starts a fresh JVM. `exit_timeout`: seconds the JVM has to exit once
    told to, before it is killed.
    """
    if session is None and "pyspark" not in sys.modules:
        return  # no session was ever started here: nothing to stop, and no pyspark to import
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if session is not None:
        context = session.sparkContext
        if getattr(context, "_jsc", None) is not None:
            try:
                with warnings.catch_warnings():
                    # pyspark's own note about a dead JVM; we log it below with the cause.
                    warnings.filterwarnings(
                        "ignore", "Unable to cleanly shutdown", category=RuntimeWarning
                    )
                    session.stop()
            except Exception:  # a dead JVM (e.g. exited on OOM) must not stop the cleanup
                logger.warning("Spark session did not stop cleanly", exc_info=True)
        # SparkContext.stop() skips this when the JVM call before it raised.
        accumulators = getattr(context, "_accumulatorServer", None)
        if accumulators is not None:
            accumulators.shutdown()
            context._accumulatorServer = None

    with SparkContext._lock:
        gateway = SparkContext._gateway
        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:
        logger.warning("py4j gateway did not shut down cleanly", exc_info=True)
    if proc is None:  # a gateway we did not launch (PYSPARK_GATEWAY_PORT): not ours to end
        return
    # Spark's PythonGatewayServer exits when its stdin reaches EOF.
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=exit_timeout)
    except TimeoutExpired:
        logger.warning("Spark JVM pid %s did not exit in %s s; killing it", proc.pid, exit_timeout)
        proc.kill()
        proc.wait()
    logger.info("Spark session stopped")


def __getattr__(name: str) -> object:
    # `spark.session.SparkSession` and `.SparkContext` as before, imported when first asked for.
    if name == "SparkSession":
        from pyspark.sql import SparkSession

        return SparkSession
    if name == "SparkContext":
        from pyspark import SparkContext

        return SparkContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
