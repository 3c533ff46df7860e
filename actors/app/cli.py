"""The `fxgate` command: run the gateway, simulate readers, show status, check or audit a table."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import click

from actors.app.command_session import command_session
from actors.config.schema import Config, ConfigError, load_config
from spark.location import apply_store_credentials

log = logging.getLogger(__name__)


def _load(config_path: Path | None, connecting: bool = False) -> Config:
    """The configuration, or exit 2 listing every error, with the store credentials file (if
    any) set in the environment. Only `run` connects to the brokers (`connecting`): the other
    commands read the data directory, and production mode does not ask them for the password
    variables."""
    config = _validated(config_path, connecting)
    _apply_store_credentials(config)
    return config


def _validated(config_path: Path | None, connecting: bool) -> Config:
    try:
        return load_config(config_path, connecting=connecting)
    except ConfigError as error:
        click.echo(f"fxgate: invalid configuration ({len(error.errors)} error(s)):", err=True)
        for line in error.errors:
            click.echo(f"  {line}", err=True)
        sys.exit(2)


def _apply_store_credentials(config: Config) -> None:
    """Set `spark.store_credentials_file`'s variables in this process's environment. Call it
    before the command starts a thread, a JVM or a worker: they all read the environment."""
    credentials = config.spark.store_credentials_file
    if credentials is None:
        return
    path = os.path.abspath(os.path.expanduser(credentials))
    try:
        names = apply_store_credentials(path)
    except (OSError, ValueError) as error:  # changed since load_config read it
        click.echo(f"fxgate: spark.store_credentials_file: {path}: {error}", err=True)
        sys.exit(2)
    log.info("store credentials: %s from %s", ", ".join(names), path)


def _require_spark(command: str, why: str, instead: str | None = None) -> None:
    """Exit 2 saying what to install when something a Spark session needs (pyspark,
    delta-spark, a Java runtime, Delta Lake's jars: the `spark` extra, `make spark`) is not
    installed; `instead`, a line on what does without. Looked up without importing pyspark,
    before the command imports anything of it: a light install (`make install`) has none."""
    from spark.session import SparkNotInstalled, check_spark

    try:
        check_spark()
    except SparkNotInstalled as error:
        click.echo(f"fxgate {command}: {why}: {error}", err=True)
        if instead:
            click.echo(f"fxgate {command}: {instead}", err=True)
        sys.exit(2)


class _SparkFailed(Exception):
    """A Spark failure, its message already read (the JVM may be gone by the time it is shown)."""


def _first_line(error: BaseException) -> str:
    """`Type: first line of the message` (py4j appends the Java stack below it)."""
    try:
        first = (str(error).strip().splitlines() or [""])[0]
    except Exception:  # py4j could not reach the JVM to ask
        first = "(no message)"
    return f"{type(error).__name__}: {first}"


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="TOML file; without it the embedded defaults (configs/gateway.toml).",
)


no_progress_option = click.option(
    "--no-progress",
    is_flag=True,
    help="no progress on stderr (by default a bar on a terminal, else a line every 5 s)",
)


def _progress(no_progress: bool):
    """The command's progress reporter, on stderr (stdout carries the result)."""
    from actors.app.progress import ProgressReporter

    return ProgressReporter(sys.stderr, enabled=not no_progress)


# The brokers `make` installs (actors.devtools.broker_kinds); spelled out here so that the
# command's help needs no import of the broker modules.
BROKER_KINDS = ("mosquitto", "hivemq", "mochi")

broker_option = click.option(
    "--broker",
    type=click.Choice(BROKER_KINDS),
    default="mosquitto",
    show_default=True,
    help="the local broker to start (installed by `make`)",
)


@click.group()
def main() -> None:
    """fxgate: Zebra FX9600 reads from MQTT into Spark tables, exactly once."""


@main.command()
@config_option
def run(config_path: Path | None) -> None:
    """Run the gateway until SIGTERM or SIGINT."""
    from actors.app.daemon import configure_logging
    from actors.app.daemon import run as run_daemon
    from actors.crashpoints import CrashPointError, arm_from_environ

    config = _validated(config_path, connecting=True)
    configure_logging(config.gateway.log_level)
    _apply_store_credentials(config)
    try:
        arm_from_environ()
    except CrashPointError as error:
        click.echo(f"fxgate: {error}", err=True)
        sys.exit(2)
    sys.exit(run_daemon(config))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=1883, show_default=True, type=int)
@click.option("--readers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--rate", default=100.0, show_default=True, help="messages/s in total; 0 = flat out")
@click.option(
    "--count",
    default=1000,
    show_default=True,
    type=click.IntRange(min=0),
    help="messages per reader",
)
@click.option("--qos", default=1, show_default=True, type=click.IntRange(0, 2))
@click.option(
    "--batch",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="tag events per message (FX9600 batched arrays when > 1)",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--manifest",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="write every acknowledged message (topic, key, reads) as JSON lines",
)
@click.option(
    "--heartbeat-every",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="a heartbeat (with the reader's counters) per this many messages, and at the start and "
    "end; 0 = none",
)
@click.option(
    "--gpi-every",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="a GPI pin change per this many messages; 0 = none",
)
@click.option(
    "--management-topic",
    default="zebra/fx/{reader}/mgmt",
    show_default=True,
    help="where the management events go ({reader} = the reader's name)",
)
@click.option(
    "--broker",
    type=click.Choice(BROKER_KINDS),
    default=None,
    help="start this local broker (installed by `make`) on --port first, and keep it running "
    "after the readers are done until Ctrl-C or SIGTERM; without it, publish to the broker "
    "at --host:--port",
)
@click.option(
    "--broker-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="the started broker's data folder, kept across runs (default .simulate/BROKER)",
)
def simulate(
    host,
    port,
    readers,
    rate,
    count,
    qos,
    batch,
    seed,
    manifest,
    heartbeat_every,
    gpi_every,
    management_topic,
    broker,
    broker_dir,
) -> None:
    """Publish realistic FX9600 tag events to zebra/fx/<reader>/reads, and optionally
    heartbeats and GPI events to the management topic."""
    from actors.devtools.broker_kinds import serve_until_stopped

    logging.basicConfig(level=logging.WARNING)
    extra = {
        "heartbeat_every": heartbeat_every,
        "gpi_every": gpi_every,
        "management_topic": management_topic,
    }
    if broker is None:
        sys.exit(_simulate(host, port, readers, rate, count, qos, batch, seed, manifest, **extra))
    if host not in ("127.0.0.1", "localhost"):
        raise click.UsageError("--broker starts a broker on loopback: leave --host out")
    directory = broker_dir or Path(".simulate") / broker
    with serve_until_stopped(broker, directory, port, say=click.echo) as started:
        code = _simulate(
            started.host, started.port, readers, rate, count, qos, batch, seed, manifest, **extra
        )
    sys.exit(code)


def _simulate(host, port, readers, rate, count, qos, batch, seed, manifest, **management) -> int:
    from actors.devtools.simulate import simulate as run_simulation
    from actors.devtools.simulate import write_manifest

    heartbeat_every = management["heartbeat_every"]
    gpi_every = management["gpi_every"]
    management_topic = management["management_topic"]
    result = run_simulation(
        host,
        port,
        readers=readers,
        rate=rate,
        count=count,
        qos=qos,
        batch=batch,
        seed=seed,
        heartbeat_every=heartbeat_every,
        gpi_every=gpi_every,
        management_topic_template=management_topic,
    )
    if manifest is not None:
        write_manifest(manifest, result)
    reads = sum(r.reads for r in result.published)
    extra = f", {len(result.management)} management events" if result.management else ""
    click.echo(
        f"published {len(result.published)} messages ({reads} reads{extra}) from {readers} "
        f"reader(s) at QoS {qos} in {result.seconds:.1f} s; {result.failed} failed"
    )
    return 1 if result.failed else 0


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def status(config_path: Path | None, as_json: bool) -> None:
    """Connection state, ledger depth and rows in the table, read from the data directory."""
    from actors.app.status import collect_status, format_status
    from persistence.database import SchemaTooNew, SchemaTooOld

    config = _load(config_path)
    try:
        report = collect_status(config)
    except (SchemaTooOld, SchemaTooNew) as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        click.echo(format_status(report))


@main.group("dead-letters")
def dead_letters() -> None:
    """Messages that could not become reads, or could not be forwarded, and why."""


def _dead_letters(config, reason: str | None, progress=None):
    from actors.app.dead_letters import load_dead_letters
    from spark.progress import NO_PROGRESS
    from spark.tables import TablesNotReadable

    try:
        return load_dead_letters(
            config.spark.tables_path(config.gateway.data_path), reason, progress or NO_PROGRESS
        )
    except TablesNotReadable as error:
        raise click.ClickException(f"cannot read the dead letters here: {error}") from None


@dead_letters.command("list")
@config_option
@click.option("--reason", default=None, help="only this reason (e.g. invalid_json, expired)")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def dead_letters_list(config_path: Path | None, reason: str | None, limit: int, as_json: bool):
    """Counts per reason, then the newest dead letters with a preview of their payload."""
    from actors.app.dead_letters import dead_letters_json, format_dead_letters

    config = _load(config_path)
    letters = _dead_letters(config, reason)
    if as_json:
        click.echo(json.dumps(dead_letters_json(letters, limit), indent=2, sort_keys=True))
    else:
        click.echo(format_dead_letters(letters, limit))


@dead_letters.command("replay")
@config_option
@click.option("--reason", default=None, help="replay the dead letters of this reason")
@click.option("--key", "keys", multiple=True, help="replay the dead letter with this message key")
@click.option("--all", "everything", is_flag=True, help="replay every dead letter")
@click.option("--dry-run", is_flag=True, help="say what would be replayed, write nothing")
@no_progress_option
def dead_letters_replay(
    config_path: Path | None,
    reason: str | None,
    keys: tuple[str, ...],
    everything: bool,
    dry_run: bool,
    no_progress: bool,
):
    """Send dead letters through the gateway again (after a fix), each under a new key.

    Writes a request into the data directory; the running daemon takes it within a second, or
    the next start does."""
    from persistence.replay import ReplayMessage, write_request

    if not (reason or keys or everything):
        raise click.UsageError("say which: --reason, --key (repeatable) or --all")
    config = _load(config_path)
    with _progress(no_progress).start(
        "dead-letters replay", unit="dead letters", note="reading the dead_letters table"
    ) as progress:
        letters = _dead_letters(config, reason, progress)
        if keys:
            letters = [d for d in letters if d.message_key in set(keys)]
        chosen = [d for d in letters if d.payload is not None]
        request = None
        if not dry_run:
            progress.advance(0, note=f"writing the request for {len(chosen):,} message(s)")
            request = write_request(
                config.gateway.data_path,
                [
                    ReplayMessage(d.message_key, d.topic, d.payload, d.qos, d.sink)
                    for d in reversed(chosen)
                ],
            )
    if dry_run:
        click.echo(f"would replay {len(chosen)} dead letter(s)")
    elif request is None:
        click.echo("nothing to replay")
    else:
        click.echo(f"replay of {len(chosen)} dead letter(s) requested: {request}")


@main.command()
@config_option
@click.option(
    "--manifest",
    required=True,
    type=click.Path(path_type=Path, exists=True),
    help="JSON lines written by `fxgate simulate --manifest`",
)
@no_progress_option
def report(config_path: Path | None, manifest: Path, no_progress: bool) -> None:
    """Compare the reads table with what a simulation published: read with delta-rs (no JVM)
    on this disk or an object store, through Spark where only Spark reaches it (`hdfs://`,
    `s3a://`)."""
    from actors.devtools.simulate import expected_read_ids, read_manifest
    from spark.location import delta_location, object_store
    from spark.report import compare, landed_ids_arrow, landed_ids_spark

    config = _load(config_path)
    progress = _progress(no_progress)
    tables = config.spark.tables_path(config.gateway.data_path)
    through_spark = delta_location(tables) is None
    if through_spark:
        _require_spark("report", f"{tables} is read through Spark")
    store = object_store(tables)
    table = "reads table" if store is None else f"reads table on {store}"
    with progress.start("report", 4, counts=("rows",), note="reading the manifest"):
        expected = expected_read_ids(read_manifest(manifest))
        if not through_spark:
            progress.advance(2, note=f"reading the {table} with delta-rs")
            ids, readers = landed_ids_arrow(tables)
        else:
            from spark.session import stop_session

            progress.advance(1, note="starting Spark")
            session = command_session(config, "report")
            progress.advance(1, note="reading the reads table through Spark")
            try:
                ids, readers = landed_ids_spark(session, tables)
            finally:
                stop_session(session)
        progress.advance(1, rows=len(ids), note="comparing")
        result = compare(expected, ids, readers)
        progress.advance(1)
    click.echo(f"{table}, read back {'through Spark' if through_spark else 'with delta-rs'}:")
    for line in result.lines():
        click.echo(line)
    click.echo("EXACT: every published read landed once" if result.exact else "MISMATCH")
    sys.exit(0 if result.exact else 1)


@main.command()
@config_option
@click.option(
    "--tables",
    "tables_dirs",
    multiple=True,
    help="a tables directory (path or URI) to audit; repeat it to audit the gateways of one "
    "shared group together. Default: the config's tables directory",
)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@no_progress_option
def audit(
    config_path: Path | None, tables_dirs: tuple[str, ...], as_json: bool, no_progress: bool
) -> None:
    """Find every lost read: the eventNum gaps per reader in the reads table, and each reader's
    heartbeat counters reconciled with the data messages in the table.

    Exit status 0 when nothing is missing, 1 when something is, 2 when it could not audit."""
    config = _load(config_path)
    _require_spark("audit", "could not audit: the audit runs Spark")
    # Imported once Spark is known to be installed: they import pyspark.
    from spark.audit import AuditError, audit_tables, check_tables_dir
    from spark.location import parse_location
    from spark.reconcile import reconcile_tables
    from spark.session import stop_session

    try:
        locations = [parse_location(text) for text in tables_dirs] or [
            config.spark.tables_path(config.gateway.data_path)
        ]
        for location in locations:
            check_tables_dir(location)  # a wrong path fails before a JVM starts
    except (ValueError, AuditError) as error:
        click.echo(f"fxgate audit: could not audit: {error}", err=True)
        sys.exit(2)
    progress = _progress(no_progress)
    try:
        with progress.start("audit", counts=("rows", "readers"), note="starting Spark"):
            session = command_session(config, "audit")
            try:
                result = audit_tables(session, locations, progress)
                progress.advance(0, note="reconciling the readers' heartbeats")
                reconciled = reconcile_tables(session, locations)
            except AuditError:
                raise
            except Exception as error:
                # Said now: py4j asks the JVM for a Java error's message, and the JVM is
                # stopped on the way out.
                raise _SparkFailed(_first_line(error)) from None
            finally:
                stop_session(session)
    except AuditError as error:
        click.echo(f"fxgate audit: could not audit: {error}", err=True)
        sys.exit(2)
    except Exception as error:  # a Spark failure: the audit says nothing about the reads
        what = str(error) if isinstance(error, _SparkFailed) else _first_line(error)
        click.echo(f"fxgate audit: could not audit: Spark failed: {what}", err=True)
        sys.exit(2)
    if as_json:
        reconciliation = {name: reconciled[name].to_json() for name in sorted(reconciled)}
        click.echo(json.dumps({**result.to_json(), "reconciliation": reconciliation}, indent=2))
    else:
        for line in result.lines():
            click.echo(line)
        for name in sorted(reconciled):
            click.echo(f"heartbeats: {reconciled[name].line()}")
    sys.exit(0 if result.complete else 1)


@main.command()
@config_option
@click.argument("query")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per row (JSON Lines)")
@click.option(
    "--limit",
    default=1000,
    show_default=True,
    type=click.IntRange(min=0),
    help="at most this many rows (Spark stops early); 0 = every row",
)
def sql(config_path: Path | None, query: str, as_json: bool, limit: int) -> None:
    """Run a Spark SQL query over the tables: reads, dead_letters, events, reader_events (and
    any other table directory) are views of those names.

    It only reads: a statement that is not a query (or SHOW, DESCRIBE, EXPLAIN) is refused
    before it runs.

    Exit status 0 when the query ran, 1 when it was refused or Spark failed it, 2 when no query
    could run (no tables directory, a table unreadable, Spark not installed or did not start)."""
    if not query.strip():
        raise click.UsageError("the query is empty")
    config = _load(config_path)
    _require_spark(
        "sql",
        "cannot query: it runs Spark SQL",
        "without Spark, DuckDB, Polars and pandas read the tables (docs: tables/reading)",
    )
    # Imported once Spark is known to be installed: they import pyspark.
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from spark.session import stop_session
    from spark.sql import (
        CannotQuery,
        QueryFailed,
        QueryRefused,
        check_tables_dir,
        format_table,
        json_lines,
        register_tables,
        run_query,
    )

    tables_dir = config.spark.tables_path(config.gateway.data_path)
    # pyspark logs each failed query's whole JVM stack as an ERROR line; the error is ours to say.
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    try:
        check_tables_dir(tables_dir)  # a wrong path fails before a JVM starts
        # reads has more columns than Spark's default 25 in a plan's text (a WARN line).
        session = command_session(config, "sql", {"spark.sql.debug.maxToStringFields": 100})
        try:
            # Each view reads a Delta snapshot: no lock of ours (the daemon may be writing).
            for name, why in register_tables(session, tables_dir).items():
                click.echo(f"fxgate sql: {name} is no table, left out: {why}", err=True)
            result = run_query(session, query, limit)
            lines = list(json_lines(result)) if as_json else [format_table(result)]
        finally:
            stop_session(session)
    except QueryRefused as error:
        click.echo(f"fxgate sql: refused: {error}", err=True)
        sys.exit(1)
    except QueryFailed as error:
        click.echo(f"fxgate sql: query failed: {error}", err=True)
        sys.exit(1)
    except CannotQuery as error:
        click.echo(f"fxgate sql: cannot query: {error}", err=True)
        sys.exit(2)
    except (PySparkException, Py4JJavaError, RuntimeError, OSError) as error:
        first = (str(error).strip().splitlines() or [""])[0]  # py4j appends the Java stack
        click.echo(
            f"fxgate sql: cannot query: Spark failed: {type(error).__name__}: {first}", err=True
        )
        sys.exit(2)
    for line in lines:
        click.echo(line)
    if as_json and result.truncated:
        click.echo(f"fxgate sql: only the first {limit} rows; --limit 0 for all", err=True)


@main.command()
@config_option
@no_progress_option
def compact(config_path: Path | None, no_progress: bool) -> None:
    """Maintain the Delta tables: OPTIMIZE (small files into large ones, the open date too),
    VACUUM past the retention, checkpoint and clean the log; one pass, then exit 0.

    While the daemon runs it is the daemon that maintains its tables: this hands it a request
    (it runs the pass between two of its writes, within a second or two) and exits 0."""
    from actors.app.compact import CompactRefused, compact_tables

    config = _load(config_path)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        click.echo(compact_tables(config, _progress(no_progress)))
    except CompactRefused as error:
        click.echo(f"fxgate compact: {error}", err=True)
        sys.exit(2)


@main.command()
@click.option(
    "--workdir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".demo"),
    show_default=True,
)
@click.option("--count", default=1500, show_default=True, help="messages per reader per phase")
@click.option("--rate", default=300.0, show_default=True, help="messages/s in total")
@click.option(
    "--heartbeat-every",
    default=500,
    show_default=True,
    type=click.IntRange(min=1),
    help="a heartbeat per this many messages of a reader",
)
@click.option(
    "--gpi-every",
    default=250,
    show_default=True,
    type=click.IntRange(min=0),
    help="a GPI change per this many messages of a reader; 0 = none",
)
@broker_option
def demo(
    workdir: Path, count: int, rate: float, heartbeat_every: int, gpi_every: int, broker: str
) -> None:
    """Broker + two simulated readers + the gateway; the broker restarts midway."""
    from actors.devtools.demo import run_demo

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sys.exit(
        run_demo(
            workdir,
            count=count,
            rate=rate,
            heartbeat_every=heartbeat_every,
            gpi_every=gpi_every,
            broker_kind=broker,
        )
    )


if __name__ == "__main__":
    main()
