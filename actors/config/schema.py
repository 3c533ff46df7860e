"""The configuration schema and its loader (DESIGN §5).

The schema is declarative: one frozen pydantic model per TOML section, `extra="forbid"` and strict
types, because a TOML file already says what type each value is and a silently coerced `port =
true` would be worse than an error. Validation has no side effects; `load_config` gathers every
problem — file, environment overrides, each section, identity — and raises one `ConfigError`
that lists them all, each naming its dotted key, so an operator fixes a file in one pass.

Sources, lowest precedence first: schema defaults (which `configs/gateway.toml` spells out), the
TOML file, then `FXGATE__SECTION__KEY` variables. `MQTT_ENVIRONMENT_ID` only feeds the
environment-id rule in `actors.config.identity`.

Forwarding is optional: an `[upstream]` section and at least one `[[routes]]` entry turn it on
together (either one alone is an error). `Config.routes` holds the routes in effect as
`actors.config.routes.Route` values; `Config.warnings()` lists what loads but deserves an
operator's eye, such as a route whose `persist = false` lowers its QoS to 0 (the caller logs
them).

Secrets never live in the model: `source.password_env` and `upstream.password_env` hold the *name*
of a variable, read by `password()` at connect time; `password_file` the path of a file the
connection reads at each connect. The files that TLS and `password_file` name are the one thing
`load_config` reads besides the TOML: each must be readable (and the TLS material loadable) at
start, or the error names its key.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
import socket
import ssl
import stat
import tomllib
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails

from actors.config.identity import Identity, IdentityError, resolve_identity
from actors.config.routes import (
    DEFAULT_LIFECYCLE_TOPIC,
    DEFAULT_TARGET,
    Route,
    check_lifecycle_topic,
    check_target,
    render_target,
)
from spark.location import is_local_master, local_path, parse_location
from spark.topics import check_topic_filter, topic_matches

logger = logging.getLogger(__name__)

ENV_PREFIX = "FXGATE__"
LEDGER_FILE_NAME = "ledger.sqlite"
TABLES_DIR_NAME = "tables"

# Shown to operators as "(did you mean ...)" only when close enough to be a plausible typo.
_DID_YOU_MEAN_CUTOFF = 0.6
_MAX_SHOWN_INPUT = 60


class ConfigError(Exception):
    """The configuration is unusable. `errors` holds every problem found, one line each."""

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors: tuple[str, ...] = tuple(errors)
        super().__init__("\n".join(self.errors))


# --- value checks: each raises ValueError with a message an operator can act on -------------

_NAME_PART = re.compile(r"^[A-Za-z0-9._-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEMORY = re.compile(r"^[0-9]+[kKmMgGtT]?$")
_LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
# Masked in repr(): Spark conf may carry object-store credentials.
_SECRET_LOOKING = re.compile(
    r"secret|password|passwd|token|credential|private|(^|[._-])key$", re.IGNORECASE
)


def _log_level(value: str) -> str:
    level = value.upper()
    if level not in _LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(_LOG_LEVELS)}, got {value!r}")
    return level


def _client_id_part(value: str) -> str:
    # It becomes part of the MQTT client id; keeping to this set works on every broker we know.
    if not _NAME_PART.fullmatch(value):
        raise ValueError(f"{value!r} may hold only letters, digits, '.', '_' and '-'")
    return value


def _group_name(value: str) -> str:
    # '/', '+' and '#' would change the meaning of `$share/{group}-{env}/{filter}`.
    if value and not _NAME_PART.fullmatch(value):
        raise ValueError(f"{value!r} may hold only letters, digits, '.', '_' and '-'")
    return value


def _env_var_name(value: str) -> str:
    # Never echo the value: someone may have put the password itself here.
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(
            "must be the NAME of an environment variable that holds the password "
            "(letters, digits and '_'), not the password itself"
        )
    return value


_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _namespace_name(value: str) -> str:
    # It names a scope in consumers' dashboards and queries: no spaces, slashes or wildcards.
    if not _NAMESPACE.fullmatch(value):
        raise ValueError(
            f"{value[:_MAX_SHOWN_INPUT]!r}: 1 to 128 characters of letters, digits, '.', '_' "
            "and '-', starting with a letter or digit"
        )
    return value


def _memory_size(value: str) -> str:
    if not _MEMORY.fullmatch(value):
        raise ValueError(f"expected a JVM memory size such as '512m' or '2g', got {value!r}")
    return value


def _topic_filter(value: str) -> str:
    if value.startswith("$share/"):
        raise ValueError(
            f"{value!r}: give the plain filter; shared_subscription_group adds the $share prefix"
        )
    return check_topic_filter(value)


def _route_filter(value: str) -> str:
    if value.startswith("$share/"):
        # A route is matched against the topic a message arrived on, which never has the prefix.
        raise ValueError(f"{value!r}: give the plain filter; message topics never start $share/")
    return check_topic_filter(value)


def _spark_conf_value(value: Any) -> Any:
    if isinstance(value, str | bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise ValueError(f"expected a string, number or boolean, got {_show(value)}")


def _non_empty_key(conf: dict[str, Any]) -> dict[str, Any]:
    if "" in conf:
        raise ValueError("an empty key is not a Spark setting")
    return conf


NonEmptyStr = Annotated[str, Field(min_length=1)]
TopicFilter = Annotated[str, AfterValidator(_topic_filter)]
RouteFilter = Annotated[str, AfterValidator(_route_filter)]
ClientIdPart = Annotated[str, AfterValidator(_client_id_part)]
EnvVarName = Annotated[str, AfterValidator(_env_var_name)]


def _list_as_tuple(value: Any) -> Any:
    # TOML has arrays, not tuples; a tuple keeps the frozen model immutable all the way down.
    return tuple(value) if isinstance(value, list) else value


SparkConfValue = Annotated[Any, AfterValidator(_spark_conf_value)]


# --- the schema -----------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class GatewayConfig(_Section):
    data_dir: NonEmptyStr = "data"
    mode: Literal["development", "production"] = "development"
    # process: SQLite WAL + synchronous=NORMAL survives kill -9; power: synchronous=FULL (§3.7).
    durability: Literal["process", "power"] = "process"
    log_level: Annotated[str, AfterValidator(_log_level)] = "INFO"
    # A crashed actor restarts the actor set (the ledger's recovery makes that safe), at most
    # max_restarts times within restart_window_seconds; past that the daemon exits 1.
    max_restarts: int = Field(3, ge=0)
    restart_window_seconds: float = Field(300.0, gt=0)
    # The orderly stop (flush packs, commit batches, DISCONNECT keeping the session) gets this
    # long; past it the daemon dumps every thread's stack, names what still runs and exits 3
    # rather than hang until a service manager's SIGKILL hides why.
    stop_timeout_seconds: float = Field(60.0, gt=0)
    # Prometheus /metrics and /healthz over HTTP; 0 = off. Loopback by default: the endpoint
    # has no authentication, so exposing it is a deliberate choice.
    metrics_port: int = Field(0, ge=0, le=65535)
    metrics_host: NonEmptyStr = "127.0.0.1"
    # /healthz answers 503 when a connection has been down this long, when the status snapshot
    # is this old (an actor not answering), or when rows wait and no batch landed this long.
    health_connection_down_seconds: float = Field(120.0, gt=0)
    health_status_stale_seconds: float = Field(30.0, gt=0)
    health_writer_stalled_seconds: float = Field(300.0, gt=0)
    # Failed Spark attempts in a row (each retried, 1 s -> 60 s backoff) before /healthz says so.
    health_spark_failures: int = Field(3, ge=1)
    # A reader heard from before and silent (no tag event, no management event) this long is
    # flagged: a metric and a degraded /healthz detail (still 200: the gateway is fine, the reader
    # or its path is not). 0 = off. Five heartbeats of a reader heartbeating every 60 s.
    health_reader_silent_seconds: float = Field(300.0, ge=0)

    @property
    def data_path(self) -> Path:
        """`data_dir` as an absolute path; a relative one is taken from the working directory."""
        return Path(os.path.abspath(os.path.expanduser(self.data_dir)))

    @property
    def ledger_path(self) -> Path:
        return self.data_path / LEDGER_FILE_NAME


class _BrokerSection(_Section):
    """What every broker connection section shares beyond its fields, which each section
    declares itself so that its keys read top to bottom in one place."""

    @field_validator("reconnect_max_delay_seconds", check_fields=False)
    @classmethod
    def _max_not_below_min(cls, value: float, info: ValidationInfo) -> float:
        minimum = info.data.get("reconnect_min_delay_seconds")
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= reconnect_min_delay_seconds ({minimum}), got {value}")
        return value

    def password(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The password, read from the named variable at connect time; None when there is none."""
        password_env: str | None = getattr(self, "password_env", None)
        if password_env is None:
            return None
        return (os.environ if environ is None else environ).get(password_env)

    def file_path(self, key: str) -> str | None:
        """The file named by `key` (tls_ca_file, password_file...) as an absolute path."""
        value: str | None = getattr(self, key)
        return None if value is None else os.path.abspath(os.path.expanduser(value))


def read_password_file(path: str) -> str:
    """The password in the file at `path` (a `password_file` key), without its trailing
    newline; the connection reads it at each connect, `load_config` once to check it. Raises
    OSError, or ValueError saying what is wrong with the content without showing it."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the file is not UTF-8 text") from None
    password = text.rstrip("\r\n")
    if not password:
        raise ValueError("the file is empty (it must hold the password)")
    return password


class SourceConfig(_BrokerSection):
    host: NonEmptyStr = "127.0.0.1"
    port: int = Field(1883, ge=1, le=65535)
    username: str | None = None
    password_env: EnvVarName | None = None
    # Or a file holding the password, read at each connect (a trailing newline is dropped); in
    # production mode it must be readable by its owner only.
    password_file: NonEmptyStr | None = None
    # TLS to the broker. The tls_* keys need tls = true; relative paths are taken from the
    # working directory.
    tls: bool = False
    tls_ca_file: NonEmptyStr | None = None  # unset: the system's trusted CAs
    tls_cert_file: NonEmptyStr | None = None  # with tls_key_file: mutual TLS
    tls_key_file: NonEmptyStr | None = None
    # Skips the broker's host name check (anyone on the path can pose as it): logged as a warning.
    tls_insecure: bool = False
    client_id: ClientIdPart = "fxgate"
    environment_id: str | None = None  # checked by actors.config.identity, which knows the rule
    instance_id: ClientIdPart | None = None
    append_unique_id: bool = False
    # Plain subscription by default: mosquitto 2.0.11 does not restore a shared subscription
    # from persistence after a restart, so reads published before we re-subscribe are dropped
    # (tests/actors/test_mosquitto_facts.py). Set a group to scale out over several gateways.
    shared_subscription_group: Annotated[str, AfterValidator(_group_name)] = ""
    subscribe_topics: Annotated[
        tuple[TopicFilter, ...], BeforeValidator(_list_as_tuple), Field(min_length=1)
    ] = ("zebra/fx/+/reads",)
    # The readers' management-event topics (heartbeats, GPI, errors...), subscribed too; every
    # message on them must be a management event. Empty: management events are still told from
    # tag data by their envelope on the topics above.
    management_topics: Annotated[tuple[TopicFilter, ...], BeforeValidator(_list_as_tuple)] = ()
    qos: int = Field(2, ge=0, le=2)
    # MQTT 5 §3.1.2.11.3 Receive Maximum: how many QoS 1/2 reads the broker may send before we
    # acknowledge. None: one pack (packs.max_messages). The broker grants at most its own cap.
    receive_maximum: int | None = Field(None, ge=1, le=65535)
    clean_session: bool = False
    # MQTT 5 §3.1.2.11.2: a four-byte integer; 0xFFFFFFFF means the session never expires.
    session_expiry_interval_seconds: int = Field(3600, ge=0, le=0xFFFFFFFF)
    auto_reconnect: bool = True
    reconnect_min_delay_seconds: float = Field(1.0, gt=0)
    reconnect_max_delay_seconds: float = Field(120.0, gt=0)
    reconnect_jitter: float = Field(0.25, ge=0, le=1)
    # MQTT §3.1.2.10: a two-byte integer; 0 turns keep-alive off.
    keepalive_seconds: int = Field(30, ge=0, le=65535)

    @field_validator("management_topics")
    @classmethod
    def _not_a_data_topic(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        data = set(info.data.get("subscribe_topics") or ())
        both = [topic for topic in value if topic in data]
        if both:
            raise ValueError(
                f"{both[0]!r} is also in source.subscribe_topics: every tag event on it would "
                "be dead-lettered as not a management event; name the readers' management "
                "topic only here"
            )
        return value


class UpstreamConfig(_BrokerSection):
    """The broker reads are forwarded to. The section is optional: without it nothing is
    forwarded. Its environment id is the gateway's (`source.environment_id` or the variable)."""

    enabled: bool = True
    # No default: a forgotten host must not quietly forward into the local (source) broker.
    host: NonEmptyStr
    port: int = Field(1883, ge=1, le=65535)
    username: str | None = None
    password_env: EnvVarName | None = None
    # Or a file holding the password, read at each connect (a trailing newline is dropped); in
    # production mode it must be readable by its owner only.
    password_file: NonEmptyStr | None = None
    # TLS to the broker. The tls_* keys need tls = true; relative paths are taken from the
    # working directory.
    tls: bool = False
    tls_ca_file: NonEmptyStr | None = None  # unset: the system's trusted CAs
    tls_cert_file: NonEmptyStr | None = None  # with tls_key_file: mutual TLS
    tls_key_file: NonEmptyStr | None = None
    # Skips the broker's host name check (anyone on the path can pose as it): logged as a warning.
    tls_insecure: bool = False
    client_id: ClientIdPart = "fxgate-upstream"
    instance_id: ClientIdPart | None = None  # unset: source.instance_id, then the host name
    append_unique_id: bool = False
    # false keeps the session, and with it the packet ids of QoS 2 messages in flight (§3.2).
    clean_session: bool = False
    session_expiry_interval_seconds: int = Field(3600, ge=0, le=0xFFFFFFFF)
    keepalive_seconds: int = Field(30, ge=0, le=65535)
    auto_reconnect: bool = True
    reconnect_min_delay_seconds: float = Field(1.0, gt=0)
    reconnect_max_delay_seconds: float = Field(120.0, gt=0)
    reconnect_jitter: float = Field(0.25, ge=0, le=1)
    # Messages handed to paho at once; the broker's Receive Maximum caps it further. paho's
    # in-flight scan is quadratic: 1000 was slower than 20 (§4).
    window: int = Field(20, ge=1, le=65535)
    # Where the forward leg (tier-2 buffer, outbound ledger, this connection) runs: "own", in a
    # child process with an interpreter of its own (actors/forward_process.py), so forwarding
    # and ingest use both cores; "shared", in the daemon's process beside the intake.
    process: Literal["own", "shared"] = "own"


class RouteConfig(_Section):
    """One `[[routes]]` entry, as written; `Config.routes` holds them as `Route` values."""

    source: RouteFilter
    target: Annotated[str, AfterValidator(check_target)] = DEFAULT_TARGET
    qos: int = Field(1, ge=0, le=2)
    # false: the message is not kept across restarts, so QoS 1/2 cannot be honoured upstream
    # and the route forwards at QoS 0 (a warning says so, as HiveMQ Edge does).
    persist: bool = True


class BufferConfig(_Section):
    """Tier 2: the bounded in-memory buffer between the durable tier-1 ledger and the upstream
    connection (§3.4). At either cap it takes no more from tier 1, and the upstream's backlog
    waits there, on disk; it takes again once what it holds and has asked for is down to the low
    watermark. A full tier 2 never pauses the source (only the ledger's disk budget does)."""

    max_messages: int = Field(10000, ge=1)
    max_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    # No longer used: a full tier 2 paused the source until the ledger became the buffer of
    # both sinks. Accepted, so that older configuration files still load, with a warning.
    high_watermark: float | None = Field(None, gt=0, le=1)
    low_watermark: float = Field(0.5, gt=0, lt=1)
    # What happens to a QoS 0 message at a full cap; QoS 1/2 are never dropped, they wait in tier 1.
    overflow: Literal["drop_oldest", "drop_new"] = "drop_oldest"
    # true: QoS 0 messages also go through the durable tier 1 (slower, survives restarts).
    persist_qos0: bool = False

    @field_validator("low_watermark")
    @classmethod
    def _low_below_high(cls, value: float, info: ValidationInfo) -> float:
        high = info.data.get("high_watermark")
        if high is not None and value >= high:
            raise ValueError(f"must be below high_watermark ({high}), got {value}")
        return value


class LedgerConfig(_Section):
    group_commit_max_messages: int = Field(200, ge=1)
    group_commit_max_delay_seconds: float = Field(0.005, ge=0)
    # What the source connection may hand the ledger before the ledger has taken it; past either
    # limit paho's thread stops reading the socket (actors/mqtt/intake.py says why).
    intake_max_messages: int = Field(2000, ge=2)
    intake_max_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    # How each row's message_id is formed (persistence.keys.READ_KEYS).
    idempotency_key: Literal["payload_hash", "read_fields"] = "payload_hash"
    # The disk budget (persistence/disk_budget.py): the ledger's files may use max_bytes, and
    # their file system must keep min_free_bytes free; past either, the source is paused (its
    # socket not read) until the sinks catch up. The README, "Disk budget", has the arithmetic.
    max_bytes: int = Field(4 * 1024**3, ge=64 * 1024)
    min_free_bytes: int = Field(1024**3, ge=0)


class PacksConfig(_Section):
    # TBMQ's defaults: packs of <= 200 messages, 20 s to process one, RETRY_ALL with 3 retries.
    max_messages: int = Field(200, ge=1, le=65535)
    linger_seconds: float = Field(1.0, gt=0)
    processing_timeout_seconds: float = Field(20.0, gt=0)
    ack_strategy: Literal["RETRY_ALL", "SKIP_ALL"] = "RETRY_ALL"
    retries: int = Field(3, ge=0)  # 0 = unlimited


class LifecycleConfig(_Section):
    # The MQTT topic of the life-cycle events; {environment} = the environment id, {client} =
    # the connection's client id (a whole level, so consumers can subscribe with '+').
    topic: Annotated[str, AfterValidator(check_lifecycle_topic)] = DEFAULT_LIFECYCLE_TOPIC
    # The events' `data.namespaceName` (Event Grid names the namespace in every client event);
    # unset: the environment id (`Config.lifecycle_namespace`).
    namespace: Annotated[str, AfterValidator(_namespace_name)] | None = None


class SparkConfig(_Section):
    master: NonEmptyStr = "local[2]"
    # A local path or a Hadoop URI the whole cluster reaches (spark/location.py has the rules).
    tables_dir: NonEmptyStr | None = None
    # One Delta commit per table per batch (a Spark job costs ~0.1 s fixed with landing =
    # "spark"), so rows are flushed tens of packs at a time (§4).
    batch_max_rows: int = Field(20000, ge=1)
    # 1 s, not 2: the latency target (publish -> row, p99 <= packs.linger + 2 s) at the defaults;
    # the cost is about twice the commits and small files a day, which maintenance packs
    # (README, "Tables: Delta Lake").
    batch_max_seconds: float = Field(1.0, gt=0)
    # Also bound a batch by payload bytes: FX9600 batch mode puts 50-100 reads in one message,
    # and 20,000 such messages (2M rows) ran a 512m driver out of memory (bench/results).
    batch_max_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    # Hostile input (spark.zebra): a bigger payload, or more events in one message, lands in
    # dead_letters (`oversized`, `too_many_reads`) with its payload cut to max_payload_bytes.
    max_payload_bytes: int = Field(1024 * 1024, ge=1024)
    max_reads_per_message: int = Field(10000, ge=1)
    # The writer's credit with the ledger: at most backlog_high_messages (and
    # backlog_high_bytes of payload) handed to the packs and the writer and not yet written; more
    # is asked for once no more than backlog_low_messages wait. The rest waits in the ledger.
    backlog_high_messages: int = Field(100000, ge=1)
    backlog_low_messages: int = Field(50000, ge=0)
    backlog_high_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    driver_memory: Annotated[str, AfterValidator(_memory_size)] = "512m"
    # The Spark JVM's class data archive (spark/cds.py): "auto" maps the one `make` wrote into
    # the virtualenv when there is one; a path names another; "" starts without.
    class_data_archive: str = "auto"
    # Batches are parsed in a child process (spark/parse_worker.py), off the daemon's GIL, on
    # the core the intake does not use; false parses them in the writer's thread.
    parse_worker: bool = True
    # Processes the parse worker starts beside it: a batch of 1 MiB of payloads or more is built
    # in parts, one in each, at once (spark/parse_worker.py). 0: the worker builds alone.
    parse_helpers: int = Field(1, ge=0, le=7)
    # "auto": batches written by pyarrow when the master is local and the tables are on this
    # disk (spark.tables.ArrowTableWriter), else by Spark jobs; "spark": always by Spark jobs.
    landing: Literal["auto", "spark"] = "auto"
    conf: Annotated[dict[str, SparkConfValue], AfterValidator(_non_empty_key)] = Field(
        default_factory=dict
    )

    @field_validator("backlog_low_messages")
    @classmethod
    def _low_below_high(cls, value: int, info: ValidationInfo) -> int:
        high = info.data.get("backlog_high_messages")
        if high is not None and value >= high:
            raise ValueError(f"must be below backlog_high_messages ({high}), got {value}")
        return value

    @field_validator("tables_dir")
    @classmethod
    def _tables_location(cls, value: str | None) -> str | None:
        if value is not None:
            parse_location(value)
        return value

    @property
    def lands_with_arrow(self) -> bool:
        """Whether the writer writes batches with pyarrow: see `landing`."""
        return (
            self.landing == "auto"
            and is_local_master(self.master)
            and local_path(self.tables_path(Path())) is not None
        )

    def tables_path(self, data_path: Path) -> Path | str:
        """Where the tables live: `tables_dir` (a path relative to the working directory, a
        `file:` URI, both as a `Path`; any other URI as its text) or `<data_path>/tables`."""
        if self.tables_dir is None:
            return data_path / TABLES_DIR_NAME
        return parse_location(self.tables_dir)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            if name == "conf":
                value = {k: "***" if _SECRET_LOOKING.search(k) else v for k, v in value.items()}
            yield name, value


class CompactionConfig(_Section):
    # Table maintenance through Delta (spark/maintenance.py): OPTIMIZE (bin-packing the small
    # files each batch adds), VACUUM and log clean-up, on the Spark writer's thread between its
    # writes: the first pass start_delay_seconds after the start, then one every
    # interval_seconds. Appends slow down as the live file count grows (DESIGN §7: 31-55 ms per
    # append after 300-600 commits, 10-13 ms with a compaction every 100), so compact often.
    enabled: bool = True
    start_delay_seconds: float = Field(60.0, ge=0)
    interval_seconds: float = Field(300.0, gt=0)
    # One file per this many MiB of a closed date: 128 MiB is Spark's read split, Parquet's row
    # group and an HDFS block.
    target_file_mb: int = Field(128, ge=1)
    # The open date (still landing) is packed into files of up to this size, so a pass every
    # few minutes does not rewrite the whole day; the first pass after the date closes packs it
    # into target_file_mb files.
    open_file_mb: int = Field(16, ge=1)
    # Files a compaction replaced (and files of a write killed before its commit) are deleted
    # by VACUUM once this old: a reader that opened the table before the pass has this long to
    # finish (a read whose files went fails with a missing file, never with a short answer).
    # Also the tables' `delta.deletedFileRetentionDuration`: every checkpoint carries the
    # removed files this long (a day of them is about 54,000 entries in each checkpoint).
    vacuum_retention_hours: int = Field(1, ge=0)
    # A Delta checkpoint every this many commits: opening a table reads the last checkpoint
    # and at most this many JSON commits (`delta.checkpointInterval`; delta-spark's default).
    # It also bounds the writer's memory: its open table keeps every commit since the last
    # checkpoint, and the daemon's heap rose 15-20 MiB per 100 commits (README "Benchmarks").
    checkpoint_interval: int = Field(10, ge=1)
    # Log entries older than this go at a checkpoint (`delta.logRetentionDuration`): a table
    # committing every second keeps a log of bounded size. delta-rs lists the whole log
    # directory to open or update a table, before every append (2-4 us an entry measured here:
    # a 48 h log at one commit a second, 108,000 entries, would cost about 0.2-0.3 s per
    # append), so keep it short. Also how far back time travel goes.
    log_retention_hours: float = Field(1.0, gt=0)

    def table_properties(self) -> dict[str, str]:
        """The Delta table properties these settings give (spark.tables.table_properties)."""
        from spark.tables import table_properties

        return table_properties(
            checkpoint_interval=self.checkpoint_interval,
            log_retention_hours=self.log_retention_hours,
            deleted_file_retention_hours=self.vacuum_retention_hours,
        )


SECTIONS: dict[str, type[_Section]] = {
    "gateway": GatewayConfig,
    "source": SourceConfig,
    "upstream": UpstreamConfig,
    "ledger": LedgerConfig,
    "packs": PacksConfig,
    "buffer": BufferConfig,
    "spark": SparkConfig,
    "lifecycle": LifecycleConfig,
    "compaction": CompactionConfig,
}
# Sections that are absent unless written (no defaults are filled in for them).
OPTIONAL_SECTIONS = frozenset({"upstream"})
# Arrays of tables ([[name]]), each entry validated by its model.
ARRAYS: dict[str, type[_Section]] = {"routes": RouteConfig}


class Config(BaseModel):
    """A validated configuration with its identity resolved. Build it with `load_config`."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    gateway: GatewayConfig
    source: SourceConfig
    ledger: LedgerConfig
    packs: PacksConfig
    buffer: BufferConfig
    spark: SparkConfig
    lifecycle: LifecycleConfig
    compaction: CompactionConfig
    # The section as written; None when the file has none. `forwarding` says whether it is used.
    upstream: UpstreamConfig | None
    # The routes in effect, in config order: empty unless `forwarding`, so that `route_for`
    # never sends a read towards an upstream connection that does not exist.
    routes: tuple[Route, ...]
    identity: Identity

    @property
    def forwarding(self) -> bool:
        return self.upstream is not None and self.upstream.enabled

    @property
    def ledger_path(self) -> Path:
        return self.gateway.ledger_path

    @property
    def lifecycle_namespace(self) -> str:
        """The life-cycle events' namespaceName: `[lifecycle] namespace`, else the environment."""
        return self.lifecycle.namespace or self.identity.environment_id

    @property
    def tables_path(self) -> Path | str:
        return self.spark.tables_path(self.gateway.data_path)

    def warnings(self) -> list[str]:
        """What loads but changes what an operator may expect, one line each, for the log."""
        warnings = []
        if self.upstream is not None and not self.upstream.enabled:
            warnings.append(
                "upstream.enabled = false: nothing is forwarded; "
                "the [[routes]] entries are checked but not used"
            )
        for route in self.routes:
            if route.effective_qos != route.qos:
                warnings.append(
                    f"routes[{route.index}]: persist = false downgrades QoS {route.qos} to "
                    f"{route.effective_qos} (messages are not kept across restarts)"
                )
        for name, section in self._brokers():
            if section.tls and section.tls_insecure:
                warnings.append(
                    f"{name}.tls_insecure = true: the broker's host name is NOT verified, so "
                    f"anyone on the network path to {section.host}:{section.port} can pose as "
                    "the broker; never use this in production"
                )
            for key in _SECRET_FILES:
                path = section.file_path(key)
                mode = None if path is None else _group_or_world_mode(path)
                if mode is not None and self.gateway.mode != "production":
                    shown = "the file" if key == "password_file" else path
                    warnings.append(
                        f"{name}.{key}: {shown} is accessible by group or others (mode "
                        f"{mode:04o}); production mode refuses this (chmod 600)"
                    )
        if self.forwarding and self.upstream is not None and self.upstream.clean_session:
            warnings.append(
                "upstream.clean_session = true: the upstream session is dropped on every "
                "connect, so QoS 1/2 messages in flight at a disconnect are sent again under new "
                "packet ids and may arrive twice"
            )
        if self.buffer.high_watermark is not None:
            warnings.append(
                "buffer.high_watermark is no longer used: a full tier 2 leaves the upstream's "
                "backlog in the ledger and never pauses the source (remove the key)"
            )
        warnings.extend(_source_session_warnings(self.source))
        return warnings

    def _brokers(self) -> list[tuple[str, SourceConfig | UpstreamConfig]]:
        """The broker sections in use."""
        brokers: list[tuple[str, SourceConfig | UpstreamConfig]] = [("source", self.source)]
        if self.forwarding and self.upstream is not None:
            brokers.append(("upstream", self.upstream))
        return brokers

    def summary_lines(self) -> list[str]:
        """Start-up facts for the log, one per line. Holds no secret by construction: passwords
        are never read here and Spark conf is listed by key only."""
        gateway, source, spark, identity = self.gateway, self.source, self.spark, self.identity
        conf_keys = ", ".join(sorted(spark.conf)) or "none"
        lines = [
            f"mode {gateway.mode}, durability {gateway.durability}, log level {gateway.log_level}",
            f"stop timeout {gateway.stop_timeout_seconds:g} s, {_metrics(gateway)}",
            f"source broker {_broker(source)}",
            f"client id {identity.client_id} ({_session(source)})",
            f"environment {identity.environment_id} (from {identity.environment_source})",
            f"subscriptions at QoS {source.qos}: {', '.join(identity.subscriptions)}",
        ]
        upstream = self.upstream
        if upstream is None:
            lines.append("upstream none: nothing is forwarded")
        elif not upstream.enabled:
            lines.append(f"upstream broker {_broker(upstream)} disabled: nothing is forwarded")
        else:
            buffer = self.buffer
            lines += [
                f"upstream broker {_broker(upstream)}, window {upstream.window}, forward leg in "
                + ("its own process" if upstream.process == "own" else "the daemon's process"),
                f"upstream client id {identity.upstream_client_id} ({_session(upstream)})",
                *(
                    f"routes[{route.index}] {route.source} -> {route.target} at QoS "
                    + (
                        f"{route.qos}"
                        if route.persist
                        else f"{route.effective_qos} (persist = false, asked {route.qos})"
                    )
                    for route in self.routes
                ),
                (
                    f"tier-2 buffer {buffer.max_messages} messages / {buffer.max_bytes} bytes, "
                    f"low watermark {buffer.low_watermark:g}, "
                    f"overflow {buffer.overflow} (QoS 0 only), "
                    f"persist_qos0 {'true' if buffer.persist_qos0 else 'false'}"
                ),
            ]
        lines += [
            f"data dir {gateway.data_path} (ledger {self.ledger_path})",
            (
                f"spark master {spark.master}, driver memory {spark.driver_memory}, batches "
                f"written by {'pyarrow' if spark.lands_with_arrow else 'Spark jobs'}, "
                f"tables {self.tables_path}, writer credit "
                f"{spark.backlog_high_messages}/{spark.backlog_low_messages} rows, "
                f"extra conf keys: {conf_keys}"
            ),
        ]
        return lines


def _source_session_warnings(source: SourceConfig) -> list[str]:
    """The broker keeps what it queues for this gateway only while the session lives, and never
    gives a shared group member's share to the other members: mosquitto 2.0.11 discards it when
    the session expires or a clean start replaces it (tests/actors/test_several_gateways.py).
    So the session must outlive the longest outage of the gateway."""
    group = source.shared_subscription_group
    queued = (
        f"the reads the broker queued for this gateway's share of group {group!r}"
        if group
        else "the reads the broker queued for this gateway"
    )
    expiry = source.session_expiry_interval_seconds
    if source.clean_session:
        return [
            f"source.clean_session = true: every connect discards {queued} while it was away "
            "(lost at the broker, never given to another gateway)"
        ]
    if expiry == 0:
        away = (
            "the reads in flight to it are lost (the other members get the rest)"
            if group
            else "the reads published while it is away are not kept for it"
        )
        return [
            "source.session_expiry_interval_seconds = 0: the broker ends the session at every "
            f"disconnect, so {away}"
        ]
    if expiry <= source.reconnect_max_delay_seconds:
        return [
            f"source.session_expiry_interval_seconds = {expiry} is not above "
            f"source.reconnect_max_delay_seconds ({source.reconnect_max_delay_seconds:g}): one "
            f"reconnect wait can outlast the session, and {queued} are then discarded; keep the "
            "expiry above the longest outage of a gateway"
        ]
    return []


def _metrics(gateway: GatewayConfig) -> str:
    if not gateway.metrics_port:
        return "metrics off"
    host = f"[{gateway.metrics_host}]" if ":" in gateway.metrics_host else gateway.metrics_host
    return (
        f"metrics on http://{host}:{gateway.metrics_port}/metrics (healthz: connection down > "
        f"{gateway.health_connection_down_seconds:g} s, status older than "
        f"{gateway.health_status_stale_seconds:g} s, writer stalled > "
        f"{gateway.health_writer_stalled_seconds:g} s, {gateway.health_spark_failures} failed "
        "Spark attempts in a row)"
    )


def _broker(section: SourceConfig | UpstreamConfig) -> str:
    host = f"[{section.host}]" if ":" in section.host else section.host
    if section.username is None:
        auth = "anonymous"
    elif section.password_env is not None:
        auth = f"user {section.username!r}, password from ${section.password_env}"
    elif section.password_file is not None:
        auth = f"user {section.username!r}, password from file {section.file_path('password_file')}"
    else:
        auth = f"user {section.username!r}, no password"
    return f"{host}:{section.port} ({auth}{_tls(section)})"


def _tls(section: SourceConfig | UpstreamConfig) -> str:
    if not section.tls:
        return ""
    ca = section.file_path("tls_ca_file") or "the system's CAs"
    client = section.file_path("tls_cert_file")
    return (
        f", TLS: broker verified against {ca}, host name "
        + ("NOT verified (tls_insecure)" if section.tls_insecure else "verified")
        + (f", client certificate {client}" if client else "")
    )


def _session(section: SourceConfig | UpstreamConfig) -> str:
    return (
        f"clean_start={'true' if section.clean_session else 'false'}, "
        f"session expiry {section.session_expiry_interval_seconds} s, "
        f"keep-alive {section.keepalive_seconds} s"
    )


# --- loading --------------------------------------------------------------------------------


def load_config(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    hostname: str | None = None,
) -> Config:
    """Defaults, then the TOML file at `path` (if any), then FXGATE__ overrides; validated,
    identity resolved. Raises ConfigError listing every problem."""
    environ = os.environ if environ is None else environ
    hostname = socket.gethostname() if hostname is None else hostname
    errors: list[str] = []

    raw: dict[str, Any] = {}
    file_ok = True
    if path is not None:
        try:
            raw = _read_toml(Path(path))
        except ConfigError as error:
            errors.extend(error.errors)
            file_ok = False

    origins, override_errors = _apply_overrides(raw, environ)
    errors.extend(override_errors)
    if not file_ok:
        raise ConfigError(errors)

    for name in raw:
        if name not in SECTIONS and name not in ARRAYS:
            errors.append(_unknown_section(name))

    sections: dict[str, _Section | None] = {}
    for name, model in SECTIONS.items():
        if name in OPTIONAL_SECTIONS and name not in raw:
            continue
        try:
            sections[name] = model.model_validate(raw.get(name, {}))
        except ValidationError as error:
            errors.extend(_describe((name,), detail, origins) for detail in error.errors())
    route_configs, route_errors = _validate_routes(raw.get("routes", []), origins)
    errors.extend(route_errors)
    errors.extend(_pairing_errors(raw))

    gateway, source = sections.get("gateway"), sections.get("source")
    upstream = sections.get("upstream")
    forwarding = isinstance(upstream, UpstreamConfig) and upstream.enabled
    identity = None
    if isinstance(gateway, GatewayConfig) and isinstance(source, SourceConfig):
        try:
            identity = resolve_identity(
                source,
                gateway.mode,
                environ,
                hostname,
                upstream_cfg=upstream if forwarding else None,
            )
        except IdentityError as error:
            origin = origins.get(tuple(error.key.split(".")))
            errors.append(f"{error} (from {origin})" if origin else str(error))
        if gateway.mode == "production":
            errors.extend(_production_errors("source", source, environ))
            if forwarding:
                errors.extend(_production_errors("upstream", upstream, environ))
        production = gateway.mode == "production"
        errors.extend(_security_errors("source", source, production))
        if forwarding:
            errors.extend(_security_errors("upstream", upstream, production))

    routes: tuple[Route, ...] = ()
    if forwarding and route_configs is not None:
        routes = tuple(
            Route(index, entry.source, entry.target, entry.qos, entry.persist)
            for index, entry in enumerate(route_configs)
        )
        if (
            isinstance(source, SourceConfig)
            and isinstance(upstream, UpstreamConfig)
            and identity is not None
        ):
            errors.extend(_loop_errors(source, upstream, routes, identity.environment_id))

    if errors or identity is None:
        raise ConfigError(errors)
    sections.setdefault("upstream", None)
    return Config(**sections, routes=routes, identity=identity)


def _validate_routes(
    raw_routes: Any, origins: Mapping[tuple[Any, ...], str]
) -> tuple[list[RouteConfig] | None, list[str]]:
    """Each `[[routes]]` entry on its own, so that an error names `routes[i].key`."""
    if not isinstance(raw_routes, list):
        shown = "a table" if isinstance(raw_routes, dict) else _show(raw_routes)
        return None, [f"routes: expected an array of tables ([[routes]] entries), got {shown}"]
    entries: list[RouteConfig] = []
    errors: list[str] = []
    for index, entry in enumerate(raw_routes):
        try:
            entries.append(RouteConfig.model_validate(entry))
        except ValidationError as error:
            where = ("routes", index)
            errors.extend(_describe(where, detail, origins) for detail in error.errors())
    return (None if errors else entries), errors


def _pairing_errors(raw: Mapping[str, Any]) -> list[str]:
    """Forwarding needs both halves; one without the other is a mistake, not a way to turn it
    off (that is `upstream.enabled = false`)."""
    raw_routes = raw.get("routes")
    has_routes = isinstance(raw_routes, list) and len(raw_routes) > 0
    if has_routes and "upstream" not in raw:
        count = len(raw_routes)
        return [
            f"routes: {count} route{'s' if count != 1 else ''} but no [upstream] section to "
            "forward to (add [upstream] with its host, or remove the [[routes]] entries)"
        ]
    if "upstream" in raw and not has_routes and not isinstance(raw_routes, dict):
        return [
            "upstream: no [[routes]] entries, so nothing would be forwarded (add a [[routes]] "
            "entry with its source filter, or remove [upstream])"
        ]
    return []


_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
_SAMPLE_LEVEL = "fxgate-sample"


def _same_broker(source: SourceConfig, upstream: UpstreamConfig) -> bool:
    # By name only (loading does no I/O): catches the likely mistake, not every alias of a host.
    def name(host: str) -> str:
        host = host.lower().rstrip(".")
        return "loopback" if host in _LOOPBACK else host

    return name(source.host) == name(upstream.host) and source.port == upstream.port


def _loop_errors(
    source: SourceConfig, upstream: UpstreamConfig, routes: Iterable[Route], environment_id: str
) -> list[str]:
    """A route that republishes, on the source broker itself, to a topic we subscribe to would
    receive its own output again: forwarded without end. Checked on one sample topic per filter
    (wildcards filled in), so it finds the likely mistakes ("{topic}"), not every possible one."""
    if not _same_broker(source, upstream):
        return []
    errors = []
    for route in routes:
        for topic_filter in (route.source, *source.subscribe_topics):
            sample = "/".join(
                _SAMPLE_LEVEL if level in ("+", "#") else level for level in topic_filter.split("/")
            )
            if not topic_matches(route.source, sample) or not any(
                topic_matches(sub, sample) for sub in source.subscribe_topics
            ):
                continue
            target = render_target(route, sample, environment_id)
            if any(topic_matches(sub, target) for sub in source.subscribe_topics):
                errors.append(
                    f"routes[{route.index}].target: upstream is the source broker "
                    f"({upstream.host}:{upstream.port}) and {route.target!r} republishes "
                    f"{sample!r} to {target!r}, which source.subscribe_topics receives again "
                    "(a forwarding loop)"
                )
                break
    return errors


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError([f"{path}: config file not found"]) from None
    except OSError as error:
        raise ConfigError([f"{path}: cannot read config file: {error.strerror}"]) from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not UTF-8 text"]) from None
    except tomllib.TOMLDecodeError as error:
        # The message ends with "(at line N, column M)".
        raise ConfigError([f"{path}: invalid TOML: {error}"]) from None


_UNIQUE_ID_REASONS = {
    # mosquitto keeps queueing a shared group's share for an offline member's live session,
    # so every restart under a new id would strand reads in the previous session.
    "source": "a new client id on each restart strands queued reads in the previous session",
    # The same ids re-sent after a restart only mean "the same message" within one session (§3.2).
    "upstream": (
        "a new client id on each restart abandons the upstream session, and with it the packet "
        "ids of QoS 2 messages in flight"
    ),
}


def _production_errors(
    name: str, section: SourceConfig | UpstreamConfig, environ: Mapping[str, str]
) -> list[str]:
    errors = []
    if section.password_env is not None and section.password_env not in environ:
        errors.append(
            f"{name}.password_env: environment variable {section.password_env} is not set "
            "(required in production mode)"
        )
    if section.append_unique_id:
        errors.append(
            f"{name}.append_unique_id: must be false in production mode "
            f"({_UNIQUE_ID_REASONS[name]})"
        )
    return errors


# The files a broker section may name; the secret ones must be private in production mode.
_TLS_FILES = ("tls_ca_file", "tls_cert_file", "tls_key_file")
_SECRET_FILES = ("tls_key_file", "password_file")


def _security_errors(
    name: str, section: SourceConfig | UpstreamConfig, production: bool
) -> list[str]:
    """The TLS and password-file keys of a broker section: consistent, every file readable and
    the TLS material loadable. It reads the files, at start, so that a wrong path or a key that
    does not match its certificate fails with its key named rather than at the first connect."""
    errors = []
    if not section.tls:
        errors += [
            f"{name}.{key}: set, but {name}.tls = false, so the connection would not use TLS "
            "(set tls = true, or remove the key)"
            for key in (*_TLS_FILES, "tls_insecure")
            if getattr(section, key) not in (None, False)
        ]
    if (section.tls_cert_file is None) != (section.tls_key_file is None):
        missing, given = (
            ("tls_key_file", "tls_cert_file")
            if section.tls_key_file is None
            else ("tls_cert_file", "tls_key_file")
        )
        errors.append(
            f"{name}.{missing}: required with {name}.{given} (mutual TLS needs the client "
            "certificate and its key)"
        )
    if section.password_file is not None and section.password_env is not None:
        errors.append(f"{name}.password_file: set password_env or password_file, not both")
    readable: dict[str, str] = {}
    for key in (*_TLS_FILES, "password_file"):
        path = section.file_path(key)
        if path is None:
            continue
        # Never echo a password_file value: it may be the password itself, in the wrong key.
        shown = "the file" if key == "password_file" else path
        problem = _password_file_problem(path) if key == "password_file" else _unreadable(path)
        if problem is not None:
            where = "" if key == "password_file" else f"{path}: "
            errors.append(f"{name}.{key}: {where}{problem}")
            continue
        readable[key] = path
        mode = _group_or_world_mode(path)
        if production and key in _SECRET_FILES and mode is not None:
            errors.append(
                f"{name}.{key}: {shown} is accessible by group or others (mode {mode:04o}); "
                f"make it private to the daemon's user (chmod 600), required in production mode"
            )
    if section.tls:
        errors += _tls_material_errors(name, readable)
    return errors


def _unreadable(path: str) -> str | None:
    try:
        with open(path, "rb"):
            return None
    except OSError as error:
        return _os_problem(error)


def _password_file_problem(path: str) -> str | None:
    # Read as the connection reads it; what is read is checked, never shown.
    try:
        read_password_file(path)
    except OSError as error:
        return _os_problem(error)
    except ValueError as error:
        return str(error)
    return None


def _os_problem(error: OSError) -> str:
    if isinstance(error, FileNotFoundError):
        return "no such file"
    if isinstance(error, IsADirectoryError):
        return "is a directory, not a file"
    if isinstance(error, PermissionError):
        return "not readable by this user (permission denied)"
    return f"cannot be read: {error.strerror}"


def _group_or_world_mode(path: str) -> int | None:
    """The file's mode when group or others may access it, else None."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    return mode if mode & 0o077 else None


def _no_key_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key's password,
    # hanging a daemon; an empty one makes it fail at once instead.
    return b""


def _tls_material_errors(name: str, readable: Mapping[str, str]) -> list[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    errors = []
    ca = readable.get("tls_ca_file")
    if ca is not None:
        try:
            context.load_verify_locations(cafile=ca)
        except (ssl.SSLError, ValueError) as error:
            errors.append(
                f"{name}.tls_ca_file: {ca}: no PEM CA certificate could be loaded ({error})"
            )
    cert, key = readable.get("tls_cert_file"), readable.get("tls_key_file")
    if cert is not None and key is not None:
        try:
            context.load_cert_chain(cert, key, password=_no_key_password)
        except (ssl.SSLError, ValueError) as error:
            errors.append(
                f"{name}.tls_key_file: {key} and {name}.tls_cert_file {cert} do not load as a "
                f"PEM certificate and its unencrypted private key ({error})"
            )
    return errors


# --- environment overrides ------------------------------------------------------------------


def _apply_overrides(
    raw: dict[str, Any], environ: Mapping[str, str]
) -> tuple[dict[tuple[Any, ...], str], list[str]]:
    """Merge FXGATE__SECTION__KEY[__ENTRY] and FXGATE__ROUTES__<i>__KEY variables into `raw`
    in place.

    Returns where each overridden key came from (to name the variable in later errors) and the
    problems with the variable names themselves. Whole values are applied before single
    `spark.conf` entries so that an entry is never wiped out by a whole-table override. A route
    variable changes a key of routes[i] of the file, or adds a route right after the last one.
    """
    origins: dict[tuple[Any, ...], str] = {}
    errors: list[str] = []
    keys: list[tuple[tuple[Any, ...], str, str]] = []
    entries: list[tuple[tuple[Any, ...], str, str]] = []
    route_keys: list[tuple[tuple[Any, ...], str, str]] = []
    for name, text in sorted(environ.items()):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].split("__", 2)
        if len(parts) < 2 or not parts[0] or not parts[1]:
            errors.append(f"{name}: expected {ENV_PREFIX}<SECTION>__<KEY>")
            continue
        section, key = parts[0].lower(), parts[1].lower()
        if section in ARRAYS:
            if not key.isdigit() or len(parts) < 3 or not parts[2]:
                errors.append(f"{name}: expected {ENV_PREFIX}{parts[0]}__<INDEX>__<KEY>")
                continue
            target, bucket = (section, int(key), parts[2].lower()), route_keys
            if target[2] not in ARRAYS[section].model_fields:
                errors.append(f"{_unknown_key(target)} (from {name})")
                continue
        elif section not in SECTIONS:
            errors.append(f"{_unknown_section(section)} (from {name})")
            continue
        elif key not in SECTIONS[section].model_fields:
            errors.append(f"{_unknown_key((section, key))} (from {name})")
            continue
        elif len(parts) == 2:
            target, bucket = (section, key), keys
        elif (section, key) == ("spark", "conf") and parts[2]:
            target, bucket = (section, key, parts[2]), entries  # Spark keys are case-sensitive
        else:
            errors.append(f"{section}.{key}: {name} sets a sub-key of a key that has none")
            continue
        if target in origins:
            errors.append(f"{_dotted(target)}: set by both {origins[target]} and {name}")
            continue
        origins[target] = name
        bucket.append((target, name, text))

    for target, name, text in keys + sorted(route_keys) + entries:
        container: Any = raw
        for part in target[:-1]:
            # A wrong type in the file (a section that is not a table...) stops here; the
            # validation reports it later with its key.
            if isinstance(part, int):
                if not isinstance(container, list):
                    break
                if len(container) < part:
                    count = len(container)
                    errors.append(
                        f"{_dotted(target[:-1])}: {name} sets a key of a route that does not "
                        f"exist (the config has {count} route{'' if count == 1 else 's'}; "
                        f"number new routes from {count} without gaps)"
                    )
                    break
                if len(container) == part:
                    container.append({})
                container = container[part]
            else:
                if not isinstance(container, dict):
                    break
                container = container.setdefault(part, [] if part in ARRAYS else {})
        else:
            if isinstance(container, dict):
                container[target[-1]] = _parse_override(text, _wants_text(target))
                logger.debug("%s overridden by %s", _dotted(target), name)
    return origins, errors


def _parse_override(text: str, wants_text: bool) -> Any:
    """A TOML literal when `text` is one (1884, true, ["a", "b"], 0.5), else the text itself.

    A key whose type is a string takes the text verbatim unless it is a quoted TOML string, so
    that FXGATE__SOURCE__CLIENT_ID=123 means the client id "123", not an integer.
    """
    try:
        parsed = tomllib.loads(f"value = {text}")
    except tomllib.TOMLDecodeError:
        return text
    if parsed.keys() != {"value"}:  # text that smuggles in more lines is not one literal
        return text
    value = parsed["value"]
    if wants_text and not isinstance(value, str):
        return text
    return value


def _wants_text(target: tuple[Any, ...]) -> bool:
    if target[0] in ARRAYS:
        field = ARRAYS[target[0]].model_fields[target[2]]
    elif len(target) == 2:
        field = SECTIONS[target[0]].model_fields[target[1]]
    else:
        return False  # a spark.conf entry may be a string, number or boolean
    return _is_text_type(field.annotation)


def _is_text_type(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _is_text_type(typing.get_args(annotation)[0])
    if origin is Literal:
        return all(isinstance(arg, str) for arg in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return all(_is_text_type(arg) for arg in args)
    return annotation is str


# --- error messages -------------------------------------------------------------------------

_TYPE_NAMES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}
# Keys whose values must never appear in a message.
_SECRET_KEYS = {
    ("source", "password_env"),
    ("upstream", "password_env"),
    ("source", "password_file"),
    ("upstream", "password_file"),
}


def _describe(
    where: tuple[Any, ...], detail: ErrorDetails, origins: Mapping[tuple[Any, ...], str]
) -> str:
    """One line for one pydantic error; `where` is the section, or ("routes", i)."""
    loc = (*where, *detail["loc"])
    if detail["type"] == "extra_forbidden":
        message = _unknown_key(loc)
    else:
        show_input = tuple(loc[:2]) not in _SECRET_KEYS
        message = f"{_dotted(loc)}: {_reason(detail, show_input)}"
    origin = _origin(loc, origins)
    return f"{message} (from {origin})" if origin else message


def _reason(detail: ErrorDetails, show_input: bool) -> str:
    kind, ctx = detail["type"], detail.get("ctx", {})
    got = f", got {_show(detail['input'])}" if show_input else ""
    if kind in _TYPE_NAMES:
        return f"expected {_TYPE_NAMES[kind]}{got}"
    if kind == "literal_error":
        return f"expected {ctx['expected']}{got}"
    bounds = {
        "greater_than": ("greater than", "gt"),
        "greater_than_equal": ("at least", "ge"),
        "less_than": ("less than", "lt"),
        "less_than_equal": ("at most", "le"),
    }
    if kind in bounds:
        words, name = bounds[kind]
        return f"must be {words} {ctx[name]}{got}"
    if kind == "missing":
        return "required, but not set"
    if kind == "finite_number":
        return f"must be a finite number{got}"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind == "value_error":
        return str(ctx["error"])
    return detail["msg"]


def _origin(loc: tuple[Any, ...], origins: Mapping[tuple[Any, ...], str]) -> str | None:
    for length in range(len(loc), 1, -1):
        origin = origins.get(tuple(loc[:length]))
        if origin:
            return origin
    return None


def _dotted(loc: Iterable[Any]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            # Quote keys that are not TOML bare keys: spark.conf."spark.sql.shuffle.partitions".
            part = part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f'"{part}"'
            text += f".{part}" if text else part
    return text


def _unknown_key(loc: tuple[Any, ...]) -> str:
    """`loc` is (section, key) or (array, index, key)."""
    model = ARRAYS[loc[0]] if loc[0] in ARRAYS else SECTIONS[loc[0]]
    key = str(loc[-1])
    return f"{_dotted(loc)}: unknown key{_suggest(key, model.model_fields)}"


def _unknown_section(name: str) -> str:
    hint = _suggest(name, [*SECTIONS, *ARRAYS])
    if not hint:
        # A key written above every [section] header lands at the top level.
        # `port` is a key of [source] and of the optional [upstream]; the one always there wins.
        owners = [
            section
            for section, model in SECTIONS.items()
            if name in model.model_fields and section not in OPTIONAL_SECTIONS
        ] or [section for section, model in SECTIONS.items() if name in model.model_fields]
        if len(owners) == 1:
            hint = f" (keys belong in a section: did you mean {owners[0]}.{name}?)"
    return f"{name}: unknown section{hint}"


def _suggest(name: str, candidates: Iterable[str]) -> str:
    match = difflib.get_close_matches(name.lower(), list(candidates), 1, _DID_YOU_MEAN_CUTOFF)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _show(value: Any) -> str:
    text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    return text if len(text) <= _MAX_SHOWN_INPUT else text[: _MAX_SHOWN_INPUT - 3] + "..."
