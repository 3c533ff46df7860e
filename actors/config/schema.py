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
`load_config` reads besides the TOML, with `spark.store_credentials_file`: each must be readable
(and the TLS material loadable) at start, or the error names its key.
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
from spark.location import (
    is_local_master,
    local_path,
    object_store,
    parse_location,
    read_store_credentials,
)
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
    # Each field's docstring is its description: the configuration reference
    # (actors/config/reference.py) is generated from them, with the sections' class docstrings.
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,
    )


class GatewayConfig(_Section):
    """The daemon itself: where it keeps its data, how durable its commits are, how it restarts
    and stops, and its metrics and health endpoint."""

    data_dir: NonEmptyStr = "data"
    """Where the ledgers, the daemon's other SQLite files and (unless `spark.tables_dir` says
    otherwise) the tables live. A relative path is taken from the working directory the daemon
    starts in. The daemon makes a directory of its own private to its user (0700)."""
    mode: Literal["development", "production"] = "development"
    """`production` refuses to guess the environment id, requires the variable named by each
    `password_env` to be set, refuses `append_unique_id = true`, and refuses a `password_file`
    or `tls_key_file` that group or others can access (development mode only warns)."""
    durability: Literal["process", "power"] = "process"
    """`process`: SQLite in WAL mode with synchronous=NORMAL, which survives a `kill -9` of the
    daemon. `power`: synchronous=FULL, which also survives a power cut, at one disk sync per
    group commit: within run-to-run noise on a fast disk (2 vCPUs), the commits times the sync
    latency on a slow one."""
    log_level: Annotated[str, AfterValidator(_log_level)] = "INFO"
    """The daemon's log level, in any case."""
    # A crashed actor restarts the actor set (the ledger's recovery makes that safe).
    max_restarts: int = Field(3, ge=0)
    """When an actor crashes, every actor is stopped and started again (the ledger recovers what
    it stored), at most this many times within `restart_window_seconds`; one more crash in that
    window and the daemon exits with status 1."""
    restart_window_seconds: float = Field(300.0, gt=0)
    """The window in which `max_restarts` counts restarts."""
    # Past it, exiting beats hanging until a service manager's SIGKILL hides why.
    stop_timeout_seconds: float = Field(60.0, gt=0)
    """How long the orderly stop on SIGTERM or SIGINT may take (disconnect keeping the session,
    flush the open packs, commit the last batch). Past it the daemon logs what still runs and
    every thread's stack, then exits with status 3. Keep the service manager's stop timeout
    (systemd `TimeoutStopSec`) a little above it, and raise both on a slow machine."""
    metrics_port: int = Field(0, ge=0, le=65535)
    """TCP port of the HTTP endpoint with the Prometheus metrics (`/metrics`) and the health
    check (`/healthz`: 200, or 503 with its reasons in a JSON body). 0 turns it off."""
    metrics_host: NonEmptyStr = "127.0.0.1"
    """The address the metrics endpoint listens on. The endpoint has no authentication: keep it
    on loopback unless a firewall guards the port."""
    health_connection_down_seconds: float = Field(120.0, gt=0)
    """`/healthz` answers 503 when a broker connection has been down longer than this (at once
    when `auto_reconnect = false` ended it)."""
    health_status_stale_seconds: float = Field(30.0, gt=0)
    """`/healthz` answers 503 when the daemon's status snapshot (taken every second) is older
    than this: an actor is not answering."""
    health_writer_stalled_seconds: float = Field(300.0, gt=0)
    """`/healthz` answers 503 when rows wait for the tables, every connection is up, and no
    batch has landed for this long."""
    health_spark_failures: int = Field(3, ge=1)
    """`/healthz` answers 503 after this many failed table writes in a row. Each is retried on a
    1 s → 60 s backoff; the batch and everything behind it wait in the ledger, nothing is
    lost."""
    health_reader_silent_seconds: float = Field(300.0, ge=0)
    """A reader heard from before (a tag event or a management event) and silent this long is
    flagged: `fxgate_reader_silent{reader}` is 1, and `/healthz` lists it under `degraded` while
    still answering 200 (the gateway is fine; restarting it would not bring a reader back). 300 s
    is five heartbeats of a reader that heartbeats every 60 s; a reader without heartbeats that
    reads no tag this long is flagged too. 0 turns the check off."""

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
    """The broker the FX9600 readers publish to, and how the gateway subscribes to it. The
    gateway's identity on its brokers (environment id, instance, shared group) is set here."""

    host: NonEmptyStr = "127.0.0.1"
    """Host name or address of the source broker."""
    port: int = Field(1883, ge=1, le=65535)
    """TCP port of the source broker (its TLS port, e.g. 8883, with `tls = true`)."""
    username: str | None = None
    """User name to connect with; unset: connect without one."""
    password_env: EnvVarName | None = None
    """The NAME of the environment variable that holds the password, read at each connect (no
    key holds the password itself). In production mode `fxgate run` needs the variable set."""
    password_file: NonEmptyStr | None = None
    """Or the path of a file that holds only the password (not with `password_env`): read at
    every connect, so a rotated password is used from the next reconnect; a trailing newline is
    dropped. In production mode the file must be private to the daemon's user (chmod 600)."""
    tls: bool = False
    """Connect over TLS. The broker's certificate must chain to `tls_ca_file` and name `host`
    (an IP address must be in its IP SANs). The other `tls_*` keys need `tls = true`."""
    tls_ca_file: NonEmptyStr | None = None
    """PEM file of the CA certificate(s) the broker's certificate must chain to; unset: the
    system's trusted CAs. A relative path, here and in the other file keys, is taken from the
    working directory. Every TLS file is loaded at start: a wrong path, a file that is not PEM or
    a key that does not match its certificate fails with its key named."""
    tls_cert_file: NonEmptyStr | None = None
    """The client certificate (PEM) for mutual TLS, with `tls_key_file`: both or neither."""
    tls_key_file: NonEmptyStr | None = None
    """The client certificate's unencrypted private key (PEM). In production mode the file must
    be private to the daemon's user (chmod 600)."""
    tls_insecure: bool = False
    """Skips the check that the certificate names `host`, so anyone on the network path can pose
    as the broker; a warning at start says so. Only for a broker whose certificate names another
    host, never in production."""
    client_id: ClientIdPart = "fxgate"
    """First part of the MQTT client id `{client_id}-{environment}-{instance}`. Keep it stable:
    the broker resumes the persistent session, and every QoS 1/2 read it queued, only for the
    same client id."""
    environment_id: str | None = None  # checked by actors.config.identity, which knows the rule
    """The environment this gateway belongs to, part of its client ids and of its shared group:
    1 to 63 characters of `a-z`, `0-9` and `-`, starting with a letter or digit. Unset: the
    `MQTT_ENVIRONMENT_ID` variable; without it, `local-{hostname}` in development mode, and a
    start-up error in production mode."""
    instance_id: ClientIdPart | None = None
    """Last part of the client id, one per gateway of an environment. Unset: this machine's host
    name (lower-cased, other characters turned into `-`)."""
    append_unique_id: bool = False
    """Adds a random 8-hex-digit suffix to the client id at every start. For development only
    (several people on one broker): refused in production mode, because each restart would leave
    the previous session behind at the broker, still collecting its share of reads."""
    # mosquitto 2.0.11 does not restore a shared subscription from persistence after a restart
    # (tests/actors/test_mosquitto_facts.py), hence plain by default.
    shared_subscription_group: Annotated[str, AfterValidator(_group_name)] = ""
    """Subscribe as `$share/{group}-{environment}/{filter}`, so that the gateways of one
    environment split the reads between them. Empty: a plain subscription. The members land
    into the group's one table: give them all the same `spark.tables_dir`; each batch is an
    insert-if-absent merge, so a read the broker gives two members is there once, and a
    member refuses to start on another group's tables. mosquitto 2.0.11 forgets shared
    subscriptions when it restarts and drops the reads published before the gateways subscribe
    again; a plain subscription of a persistent session survives."""
    subscribe_topics: Annotated[
        tuple[TopicFilter, ...], BeforeValidator(_list_as_tuple), Field(min_length=1)
    ] = ("zebra/fx/+/reads",)
    """MQTT topic filters of the readers' tag data (`+` and `#` wildcards allowed). Give plain
    filters: `shared_subscription_group` adds the `$share` prefix."""
    management_topics: Annotated[tuple[TopicFilter, ...], BeforeValidator(_list_as_tuple)] = ()
    """The readers' management-event topics (heartbeats, GPI, errors, warnings, firmware
    progress), subscribed as well, e.g. `["zebra/fx/+/mgmt"]`. Every message on them must be a
    management event, else it is a dead letter; a filter also in `subscribe_topics` is refused.
    Empty: a management event that arrives on a data topic is still recognised by its envelope
    and lands in `reader_events`. The reader id is the level before the last."""
    qos: int = Field(2, ge=0, le=2)
    """Maximum QoS to subscribe with. The broker delivers each read at the lower of its publish
    QoS and this."""
    # MQTT 5 §3.1.2.11.3 Receive Maximum.
    receive_maximum: int | None = Field(None, ge=1, le=65535)
    """How many QoS 1/2 reads the broker may send before the gateway acknowledges them (MQTT 5
    Receive Maximum). Unset: one pack, `packs.max_messages`. The broker grants at most its own
    cap (as shipped: mosquitto `max_inflight_messages` 20, HiveMQ 50, EMQX `max_inflight` 32)."""
    clean_session: bool = False
    """`false` connects with clean start off: the broker keeps the session, and the reads queued
    for it, while the gateway is away (for `session_expiry_interval_seconds`). `true` discards
    them at every connect (a warning at start says so)."""
    # MQTT 5 §3.1.2.11.2: a four-byte integer; 0xFFFFFFFF means the session never expires.
    session_expiry_interval_seconds: int = Field(3600, ge=0, le=0xFFFFFFFF)
    """How long the broker keeps the session, and the reads it queues for it, after a disconnect
    (4294967295: for ever). Keep it above the longest outage of the gateway, pauses at the disk
    budget included; a warning at start flags 0 or a value not above
    `reconnect_max_delay_seconds`."""
    auto_reconnect: bool = True
    """Reconnect after a drop, on the backoff below. `false`: the first drop, or a failed first
    connect, ends the connection for good (an ERROR, and `/healthz` 503 at once); the daemon
    keeps running, and a restart reconnects."""
    reconnect_min_delay_seconds: float = Field(1.0, gt=0)
    """The first reconnect delay; it doubles at each failed attempt up to
    `reconnect_max_delay_seconds`."""
    reconnect_max_delay_seconds: float = Field(120.0, gt=0)
    """The longest reconnect delay; not below `reconnect_min_delay_seconds`."""
    reconnect_jitter: float = Field(0.25, ge=0, le=1)
    """Each reconnect delay is randomised by up to this fraction either way (0.25: ±25 %)."""
    # MQTT §3.1.2.10: a two-byte integer; 0 turns keep-alive off.
    keepalive_seconds: int = Field(30, ge=0, le=65535)
    """MQTT keep-alive interval; 0 turns keep-alive off. While the source is paused at the disk
    budget the broker hears no ping and closes the connection after 1.5 times this; the session
    stays and the gateway reconnects when the pause ends."""

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
    """The broker reads are forwarded to. Optional: this section and at least one `[[routes]]`
    entry turn forwarding on together (one without the other is an error), and every read that
    matches a route is then also published upstream. The upstream is the ledger's second sink:
    the tables never wait for it, nor it for them. Its environment id is the gateway's
    (`source.environment_id` or `MQTT_ENVIRONMENT_ID`)."""

    enabled: bool = True
    """`false` stops forwarding for a while without deleting the section and its routes (the
    routes are still checked)."""
    # No default: a forgotten host must not quietly forward into the local (source) broker.
    host: NonEmptyStr
    """Host name or address of the upstream broker; no default, so that a forgotten host never
    forwards into the source broker. Reach a broker outside this network with `tls = true`."""
    port: int = Field(1883, ge=1, le=65535)
    """TCP port of the upstream broker (its TLS port, e.g. 8883, with `tls = true`)."""
    username: str | None = None
    """User name to connect with; unset: connect without one."""
    password_env: EnvVarName | None = None
    """The NAME of the environment variable that holds the password, read at each connect (no
    key holds the password itself). In production mode `fxgate run` needs the variable set."""
    password_file: NonEmptyStr | None = None
    """Or the path of a file that holds only the password (not with `password_env`): read at
    every connect, a trailing newline dropped. In production mode the file must be private to
    the daemon's user (chmod 600)."""
    tls: bool = False
    """Connect over TLS. The broker's certificate must chain to `tls_ca_file` and name `host`.
    The other `tls_*` keys need `tls = true`."""
    tls_ca_file: NonEmptyStr | None = None
    """PEM file of the CA certificate(s) the broker's certificate must chain to; unset: the
    system's trusted CAs. Loaded at start, like every TLS file; a relative path is taken from
    the working directory."""
    tls_cert_file: NonEmptyStr | None = None
    """The client certificate (PEM) for mutual TLS, with `tls_key_file`: both or neither."""
    tls_key_file: NonEmptyStr | None = None
    """The client certificate's unencrypted private key (PEM). In production mode the file must
    be private to the daemon's user (chmod 600)."""
    tls_insecure: bool = False
    """Skips the check that the certificate names `host`, so anyone on the network path can pose
    as the broker; a warning at start says so. Never in production."""
    client_id: ClientIdPart = "fxgate-upstream"
    """First part of the upstream client id `{client_id}-{environment}-{instance}`, with the
    gateway's environment id. Keep it stable: the upstream session holds the packet ids of the
    QoS 2 messages in flight."""
    instance_id: ClientIdPart | None = None
    """Last part of the upstream client id. Unset: `source.instance_id`, else this machine's host
    name."""
    append_unique_id: bool = False
    """Adds a random suffix to the client id at every start. For development only: refused in
    production mode, since a new client id abandons the session that holds the packet ids of
    the QoS 2 messages in flight."""
    # false keeps the session, and with it the packet ids of QoS 2 messages in flight (§3.2).
    clean_session: bool = False
    """Keep `false`: the session, and with it the packet ids of the messages in flight, outlives
    a disconnect or a restart, so they are sent again under the same ids. With `true`, QoS 1/2
    messages in flight at a disconnect are sent again under new packet ids and may arrive twice
    (a warning at start says so)."""
    session_expiry_interval_seconds: int = Field(3600, ge=0, le=0xFFFFFFFF)
    """How long the upstream broker keeps the session after a disconnect (4294967295: for
    ever)."""
    keepalive_seconds: int = Field(30, ge=0, le=65535)
    """MQTT keep-alive interval; 0 turns keep-alive off."""
    auto_reconnect: bool = True
    """Reconnect after a drop, on the backoff below. `false`: the first drop, or a failed first
    connect, ends the connection for good (an ERROR, and `/healthz` 503 at once); what waits for
    the upstream stays in the ledger until a restart."""
    reconnect_min_delay_seconds: float = Field(1.0, gt=0)
    """The first reconnect delay; it doubles at each failed attempt up to
    `reconnect_max_delay_seconds`."""
    reconnect_max_delay_seconds: float = Field(120.0, gt=0)
    """The longest reconnect delay; not below `reconnect_min_delay_seconds`."""
    reconnect_jitter: float = Field(0.25, ge=0, le=1)
    """Each reconnect delay is randomised by up to this fraction either way (0.25: ±25 %)."""
    # paho's in-flight scan is quadratic: 1000 was slower than 20 (§4).
    window: int = Field(20, ge=1, le=65535)
    """Messages in flight upstream at most; the broker's Receive Maximum caps it further, after a
    reconnect too. Raising it far does not help: paho slows down with many messages in flight
    (1000 was slower than 20)."""
    # actors/forward_process.py runs the leg in its own process.
    process: Literal["own", "shared"] = "own"
    """Where the forward leg (tier-2 buffer, outbound ledger, upstream connection) runs: `own`, a
    child process of the daemon with an interpreter of its own, so that forwarding and ingest
    use both cores; `shared`, threads of the daemon's process."""


# `Config.routes` holds the entries as `actors.config.routes.Route` values.
class RouteConfig(_Section):
    """One `[[routes]]` entry: the reads whose topic matches `source` are forwarded upstream to
    `target`. The first entry, in file order, that matches a read's topic wins; a read that
    matches none is not forwarded (it lands in the tables all the same). Entries are numbered
    from 0 in file order, as errors (`routes[0].qos`) and environment variables name them.
    Life-cycle events go upstream on their own topic, ahead of every route."""

    source: RouteFilter
    """An MQTT topic filter (`+` and `#` wildcards) matched against the topic a read arrived on,
    which never starts with `$share/`."""
    target: Annotated[str, AfterValidator(check_target)] = DEFAULT_TARGET
    """The upstream topic: `{topic}` is the whole source topic, `{reader}` the reader id (the
    level before the last, as in `zebra/fx/<reader>/reads`), `{environment}` the environment id.
    No wildcards and no leading `$`; `{{` and `}}` stand for literal braces."""
    qos: int = Field(1, ge=0, le=2)
    """The QoS asked of the upstream, whatever QoS a read arrived with (the ledger made it
    durable). 2 is exactly once upstream, through restarts of the gateway; 0 is sent once and
    never again."""
    # As HiveMQ Edge does: a route that does not persist cannot promise QoS 1/2 upstream.
    persist: bool = True
    """`false`: live only. Forwarded at QoS 0 (a QoS 1/2 `qos` is lowered, with a warning at
    start), never sent again, and not forwarded by the next run if the gateway stops first (an
    upstream dead letter, `restart_dropped`). The read is in the ledger and lands in the tables
    all the same."""


class BufferConfig(_Section):
    """Tier 2: the bounded in-memory queue of messages on their way upstream, used only when
    forwarding. Behind it tier 1, the ledger, keeps the upstream's backlog on disk, in order: at
    either cap tier 2 takes no more from it, and a full tier 2 never pauses the source (only the
    ledger's disk budget does)."""

    max_messages: int = Field(10000, ge=1)
    """Messages tier 2 holds at most."""
    max_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    """Payload bytes tier 2 holds at most."""
    high_watermark: float | None = Field(None, gt=0, le=1)
    """No longer used (a full tier 2 paused the source before the ledger became the buffer of
    both sinks): still accepted, so that older files load, with a warning at start. Remove
    it."""
    low_watermark: float = Field(0.5, gt=0, lt=1)
    """Once at a cap, tier 2 takes from the ledger again when what it holds, and has asked for,
    is down to this fraction of the caps."""
    overflow: Literal["drop_oldest", "drop_new"] = "drop_oldest"
    """Which message goes at a full cap. Only the live-only forwards (a `persist = false` route,
    or a `qos = 0` route without `persist_qos0`) are ever dropped, each drop counted and
    recorded as an upstream dead letter (`overflow_dropped`); every other message waits in the
    ledger."""
    persist_qos0: bool = False
    """The forward leg of a `qos = 0` route (every read is in the ledger and lands in the tables
    anyway). `false`: live only, as with `persist = false` (dropped at a full tier 2 or at a
    restart, each drop an upstream dead letter). `true`: such messages wait in the ledger and
    are forwarded after an outage or a restart. A `persist = false` route stays live only."""

    @field_validator("low_watermark")
    @classmethod
    def _low_below_high(cls, value: float, info: ValidationInfo) -> float:
        high = info.data.get("high_watermark")
        if high is not None and value >= high:
            raise ValueError(f"must be below high_watermark ({high}), got {value}")
        return value


class LedgerConfig(_Section):
    """The inbound ledger (`<data_dir>/ledger.sqlite`): every read is committed here before the
    broker gets its acknowledgement, and waits here, on disk, until both sinks (the tables and,
    when forwarding, the upstream) have it. Its disk budget decides when the source is
    paused."""

    group_commit_max_messages: int = Field(200, ge=1)
    """Reads are committed in groups: a commit happens when this many wait or the oldest has
    waited `group_commit_max_delay_seconds`, whichever comes first. Nothing is acknowledged to
    the broker before its commit."""
    group_commit_max_delay_seconds: float = Field(0.005, ge=0)
    """The longest a read waits for its group commit."""
    # actors/mqtt/intake.py says why paho's thread must stop reading the socket.
    intake_max_messages: int = Field(2000, ge=2)
    """Reads the source connection may hand the ledger before the ledger has stored them. Past
    this or `intake_max_bytes` the connection stops reading from the broker until the ledger is
    down to half, so memory stays bounded even when the broker sends more than the Receive
    Maximum (mosquitto 2.0.11 does while it drains a queued session)."""
    intake_max_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    """The same limit in payload bytes."""
    # persistence.keys.READ_KEYS forms the keys.
    idempotency_key: Literal["payload_hash", "read_fields"] = "payload_hash"
    """How each row's key (`message_id`) is formed; a table never holds two rows with one key.
    `payload_hash`: a SHA-256 of topic and payload, then `:<index of the read in the message>`.
    `read_fields`: `<reader>/<eventNum>/<event time in µs>`, so that one read sent again in
    another message is still stored once (a read without `eventNum` falls back to
    `payload_hash`)."""
    # The disk budget: persistence/disk_budget.py.
    max_bytes: int = Field(4 * 1024**3, ge=64 * 1024)
    """The disk budget: what the ledger's files may use. The ledger is the buffer for an outage
    of either sink and acknowledges the source until its files reach this, or their file system
    gets below `min_free_bytes`; then the source is paused (its socket not read) with a WARNING,
    `fxgate_source_paused` 1 and `/healthz` 503, and the broker's queue limit decides what is
    lost. It resumes at 90 % of this. A read takes about 375 bytes while a sink owes it (4 GiB:
    about 16 hours of one reader at 200 tags/s), and its key 163 bytes for the source session's
    expiry plus 10 minutes after both sinks have it: keep this well above 163 bytes times the
    reads per second times (`source.session_expiry_interval_seconds` + 600) (270 MB at 400
    reads/s and the default expiry)."""
    min_free_bytes: int = Field(1024**3, ge=0)
    """Free space the ledger's file system must keep; below it the source is paused as at
    `max_bytes`. 1 GiB leaves room for the system, its logs, the broker's persistence and the
    tables' writes on the same disk."""


class PacksConfig(_Section):
    """Stored reads are handed on in packs, with TBMQ's semantics and defaults: at most 200
    reads, 20 s to process one, RETRY_ALL with 3 retries. What the forward leg gives up on lands
    in the `dead_letters` table (`forward_failed`), never dropped silently."""

    max_messages: int = Field(200, ge=1, le=65535)
    """Most reads in a pack. Also the Receive Maximum asked of the source broker when
    `source.receive_maximum` is unset."""
    linger_seconds: float = Field(1.0, gt=0)
    """A pack that is not full is closed after this long. A read reaches its table within about
    this plus 2 s (p99) at the defaults."""
    processing_timeout_seconds: float = Field(20.0, gt=0)
    """How long a pack may take before it counts as failed. Upstream, the clock runs only while
    the upstream is connected, so an outage costs a pack none of its retries; a table write
    still running after this long is cancelled and retried."""
    ack_strategy: Literal["RETRY_ALL", "SKIP_ALL"] = "RETRY_ALL"
    """What the forward leg does with a failed pack: `RETRY_ALL` tries its unacknowledged
    messages again, up to `retries` times, then dead-letters them; `SKIP_ALL` dead-letters them
    at once. A failed table write is always retried (1 s → 60 s backoff)."""
    retries: int = Field(3, ge=0)
    """Retries of a failed pack under `RETRY_ALL`; 0: without limit."""


class LifecycleConfig(_Section):
    """Life-cycle events of the gateway's own connections (connected, disconnected, created or
    updated, deleted) as CloudEvents 1.0 JSON, in the shape of Azure Event Grid's MQTT client
    events. They are stored like reads, land in the `events` table, and are published at QoS 1:
    upstream when forwarding, else on the source broker."""

    topic: Annotated[str, AfterValidator(check_lifecycle_topic)] = DEFAULT_LIFECYCLE_TOPIC
    """The MQTT topic of the events: `{environment}` is the environment id, `{client}` the
    connection's client id, a whole topic level of its own (so that consumers can subscribe with
    `+`)."""
    # Unset: the environment id (`Config.lifecycle_namespace`).
    namespace: Annotated[str, AfterValidator(_namespace_name)] | None = None
    """The events' `data.namespaceName`, as Event Grid names its namespace in every client
    event. Unset: the environment id."""


class SparkConfig(_Section):
    """How batches land in the Delta tables (`reads`, `events`, `reader_events`,
    `dead_letters`), and the Spark session of the reading commands (`fxgate sql`, `audit`,
    `report`) and of the daemon when it lands through Spark."""

    master: NonEmptyStr = "local[2]"
    """The Spark master: `local[2]` runs Spark inside the process on 2 cores; `spark://host:7077`
    (`spark://a:7077,b:7077` with standby masters) a standalone cluster, whose executors then
    write the batches."""
    # spark/location.py has the rules.
    tables_dir: NonEmptyStr | None = None
    """Where the tables live. Unset: `<data_dir>/tables`. A local path (relative to the working
    directory), a `file:` URI, an object store that delta-rs lands into from the daemon with no
    JVM (Azure Blob Storage or ADLS Gen2: `az://container/path`,
    `abfss://container@account.dfs.core.windows.net/path`; S3: `s3://bucket/path`), or a URI
    the whole cluster reaches (`hdfs://namenode:8020/fxgate`, `s3a://bucket/fxgate`).
    Credentials never go in the URI: an object store takes them from the environment (the
    store's own variables, e.g. `AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_SAS_TOKEN`; docs:
    object-store tables), Spark from `[spark.conf]` or the environment. The members of a
    `source.shared_subscription_group` share one: the group's tables, on this machine's disk or
    an object store every member reaches (landed by delta-rs in the daemon)."""
    store_credentials_file: NonEmptyStr | None = None
    """With `tables_dir` on an object store: a file of the store's variables, one `NAME=value` a
    line as in a systemd `EnvironmentFile` (e.g. `AZURE_STORAGE_ACCOUNT_NAME` and
    `AZURE_STORAGE_SAS_TOKEN`, or `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
    `AWS_REGION`), names starting with `AZURE_`, `AWS_` or `GOOGLE_` (`AZURITE_` for the
    emulator) only. Each fxgate command reads it when it starts and sets them over the
    environment's; the log names the variables, never their values. Restart the daemon after
    changing it. In production mode the file must be private to the daemon's user (chmod 600).
    Unset: the environment's variables alone."""
    # A Spark job costs ~0.1 s fixed with landing = "spark", hence tens of packs per commit (§4).
    batch_max_rows: int = Field(20000, ge=1)
    """Rows are appended in one Delta commit per table per batch, written when this many rows
    wait, when the oldest has waited `batch_max_seconds`, or when their payloads reach
    `batch_max_bytes`."""
    batch_max_seconds: float = Field(1.0, gt=0)
    """The longest a row waits for its batch. 1 s keeps a read's way from publish to row within
    `packs.linger_seconds` + 2 s; against 2 s it makes about twice the commits and small files
    a day, which compaction packs."""
    # 20,000 batched messages (2M rows) ran a 512m driver out of memory (bench/results).
    batch_max_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    """Payload bytes that close a batch: a batched FX9600 message holds 50 to 100 reads, and
    counting messages alone would make batches of millions of rows."""
    max_payload_bytes: int = Field(1024 * 1024, ge=1024)
    """A message with a bigger payload lands in `dead_letters` (reason `oversized`), its payload
    cut to this size. It is still acknowledged, and kept whole in the ledger until its batch
    lands: nothing is dropped unrecorded."""
    max_reads_per_message: int = Field(10000, ge=1)
    """A message holding more events lands in `dead_letters` (reason `too_many_reads`), its
    payload cut to `max_payload_bytes`."""
    backlog_high_messages: int = Field(100000, ge=1)
    """The writer's credit with the ledger: it takes at most this many messages (and
    `backlog_high_bytes` of payload) that it has not yet written, and asks for more once no more
    than `backlog_low_messages` wait. A slow or failing write leaves the rest in the ledger, on
    disk; the source goes on."""
    backlog_low_messages: int = Field(50000, ge=0)
    """The writer asks the ledger for more once no more than this many messages wait; below
    `backlog_high_messages`."""
    backlog_high_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """The writer's credit in payload bytes, beside `backlog_high_messages`."""
    driver_memory: Annotated[str, AfterValidator(_memory_size)] = "512m"
    """Memory of the Spark driver's JVM."""
    # spark/cds.py.
    class_data_archive: str = "auto"
    """The class data archive a Spark JVM maps, written by `make spark` with Spark, so that Spark
    is ready in about 3 s instead of 4 to 6: `auto`, the install's archive when there is one; a
    path, another archive; `""`, none. A JVM that cannot use it starts without it and logs a
    WARNING."""
    parse_worker: bool | None = None
    """No longer used (batches were parsed in a child process; the writer's thread now parses
    them in C++ with the GIL released, in the daemon's one interpreter): still accepted, so
    that older files load, with a warning at start. Remove it."""
    parse_helpers: int | None = Field(None, ge=0, le=7)
    """No longer used (processes beside the parse worker): still accepted, so that older files
    load, with a warning at start. Remove it."""
    # spark.tables.ArrowTableWriter for "auto".
    landing: Literal["auto", "spark"] = "auto"
    """How a batch lands. `auto`: with the tables on an object store, or on this machine's disk
    with a local master, pyarrow writes the files and delta-rs commits them in the daemon's
    process, with no JVM (its maintenance too); otherwise (a cluster, `hdfs://`, `s3a://`) a
    Spark job through delta-spark. `spark`: always a Spark job, and the daemon keeps a Spark
    session. Both land each batch exactly once, with the same Delta application ids."""
    conf: Annotated[dict[str, SparkConfValue], AfterValidator(_non_empty_key)] = Field(
        default_factory=dict
    )
    """Extra Spark settings, handed to the session as given, in a `[spark.conf]` table, e.g.
    `"spark.sql.shuffle.partitions" = 2` or a cluster's `spark.driver.host`. Keys that look
    secret are masked in the log. `spark.driver.extraJavaOptions` replaces the options that map
    the class data archive."""

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
        if self.landing != "auto":
            return False
        location = self.tables_path(Path())
        if object_store(location) is not None:
            return True
        return is_local_master(self.master) and local_path(location) is not None

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


# spark/maintenance.py runs the passes.
class CompactionConfig(_Section):
    """Table maintenance, Delta's own: OPTIMIZE packs the small files each batch adds, VACUUM
    deletes the files it replaced, and checkpoints with log clean-up keep each table quick to
    open. Passes run on the writer's thread between its writes, with no JVM for
    tables on this disk. `fxgate compact` runs one pass at once (or has the running daemon run
    it)."""

    enabled: bool = True
    """Run maintenance passes. Appends slow down as a table's live file count grows (31 to 55 ms
    per append after 300 to 600 commits, 10 to 13 ms with a compaction every 100 commits), so
    compact often."""
    start_delay_seconds: float = Field(60.0, ge=0)
    """The first pass runs this long after the start."""
    interval_seconds: float = Field(300.0, gt=0)
    """Then a pass every this long."""
    target_file_mb: int = Field(128, ge=1)
    """A closed date (no longer landing) is packed into files of this many MiB: 128 MiB is
    Spark's read split, Parquet's row group and an HDFS block."""
    open_file_mb: int = Field(16, ge=1)
    """The open date (still landing) is packed into files of up to this many MiB, so that a pass
    every few minutes does not rewrite the whole day; the first pass after the date closes packs
    it into `target_file_mb` files."""
    vacuum_retention_hours: int = Field(1, ge=0)
    """Files a compaction replaced (and files of a write killed before its commit) are deleted
    by VACUUM once this old: a reader that opened the table before has this long to finish (a
    read whose files went fails with a missing file, never with a short answer). Also the
    tables' `delta.deletedFileRetentionDuration`: every checkpoint lists the removed files this
    long (a day of them is about 54,000 entries)."""
    checkpoint_interval: int = Field(10, ge=1)
    """A Delta checkpoint every this many commits (`delta.checkpointInterval`, delta-spark's
    default): opening a table reads the last checkpoint and at most this many commits. It also
    bounds the writer's memory, which holds every commit since the last checkpoint (15 to 20 MiB
    per 100 commits)."""
    log_retention_hours: float = Field(1.0, gt=0)
    """Log entries older than this go at a checkpoint (`delta.logRetentionDuration`); also how far
    back time travel goes. Keep it short: delta-rs lists the whole log before every append, and a
    48-hour log at a commit a second would add about 0.2 to 0.3 s to each."""

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

    @property
    def group_tables(self) -> str | None:
        """The shared group whose tables this gateway lands into with the group's other members
        (`{group}-{environment}`, DESIGN §7.12), or None for a gateway alone."""
        group = self.source.shared_subscription_group
        return f"{group}-{self.identity.environment_id}" if group else None

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
        retired = [
            f"spark.{key}"
            for key in ("parse_worker", "parse_helpers")
            if getattr(self.spark, key) is not None
        ]
        if retired:
            warnings.append(
                f"{' and '.join(retired)} no longer used: batches are parsed in the daemon's "
                "own process, natively, and there is no parse worker to configure (remove "
                f"{'the key' if len(retired) == 1 else 'the keys'})"
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
            f"tables {self.tables_path} shared by the members of group {self.group_tables}: each "
            "batch an insert-if-absent merge, maintenance claimed, no writer lock"
            if self.group_tables
            else f"tables {self.tables_path} this gateway's alone: plain appends, "
            + ("writer lock" if local_path(self.tables_path) is not None else "no writer lock"),
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
        "table write attempts in a row)"
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
    *,
    connecting: bool = True,
) -> Config:
    """Defaults, then the TOML file at `path` (if any), then FXGATE__ overrides; validated,
    identity resolved. Raises ConfigError listing every problem.

    `connecting=False` is for the commands that read the data directory and connect to no
    broker (status, sql, audit, ...): production mode does not ask them for the password
    variables, which the service user's shell does not have."""
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
            errors.extend(_production_errors("source", source, environ, connecting))
            if forwarding:
                errors.extend(_production_errors("upstream", upstream, environ, connecting))
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

    spark = sections.get("spark")
    if isinstance(source, SourceConfig) and isinstance(spark, SparkConfig):
        errors.extend(_group_errors(source, spark))
    if isinstance(spark, SparkConfig) and isinstance(gateway, GatewayConfig):
        errors.extend(_store_credentials_errors(spark, gateway.mode == "production"))

    if errors or identity is None:
        raise ConfigError(errors)
    sections.setdefault("upstream", None)
    return Config(**sections, routes=routes, identity=identity)


def _store_credentials_errors(spark: SparkConfig, production: bool) -> list[str]:
    """`spark.store_credentials_file`: only for an object store's tables, readable, store
    variables only, private in production mode. It reads the file, never showing a value."""
    if spark.store_credentials_file is None:
        return []
    key = "spark.store_credentials_file"
    if object_store(spark.tables_path(Path())) is None:
        return [
            f"{key}: set, but spark.tables_dir is not on an object store (az://, abfss://, "
            "s3://), so nothing would read it (remove the key, or give the store's URI)"
        ]
    path = os.path.abspath(os.path.expanduser(spark.store_credentials_file))
    try:
        read_store_credentials(path)
    except OSError as error:
        return [f"{key}: {path}: {_os_problem(error)}"]
    except ValueError as error:
        return [f"{key}: {path}: {error}"]
    mode = _group_or_world_mode(path)
    if production and mode is not None:
        return [
            f"{key}: {path} is accessible by group or others (mode {mode:04o}); make it private "
            "to the daemon's user (chmod 600), required in production mode"
        ]
    return []


def _group_errors(source: SourceConfig, spark: SparkConfig) -> list[str]:
    """A shared group's members land into one table through delta-rs (DESIGN §7.12), which
    run in the daemon's process on tables it reaches as files."""
    group = source.shared_subscription_group
    if not group or spark.lands_with_arrow:
        return []
    why = (
        'landing = "spark"'
        if spark.landing == "spark"
        else f"master = {spark.master!r}"
        if not is_local_master(spark.master)
        else f"tables_dir = {spark.tables_dir!r} is on a file system only Spark reaches"
    )
    return [
        f"source.shared_subscription_group = {group!r}: the members of a shared group land "
        "into the group's one table through delta-rs in the daemon, which needs landing = "
        '"auto" and a tables_dir on this disk (with a local master) or on an object store '
        f"({why}); a Spark landing would append, and the group's table would hold the reads a "
        "broker gives two members twice"
    ]


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
    name: str,
    section: SourceConfig | UpstreamConfig,
    environ: Mapping[str, str],
    connecting: bool,
) -> list[str]:
    errors = []
    if connecting and section.password_env is not None and section.password_env not in environ:
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
