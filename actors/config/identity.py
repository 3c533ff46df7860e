"""Who this daemon is on its brokers: environment id, client ids, shared subscriptions.

The rules follow the MQTT processor design record for RFID readers (DESIGN §5). Everything here is
a pure function of its arguments: the environment, the host name and the unique-suffix source are
passed in, so tests never touch the real machine.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

ENVIRONMENT_VARIABLE = "MQTT_ENVIRONMENT_ID"
ENVIRONMENT_KEY = "source.environment_id"

# The environment id goes into client ids and into `$share/{group}-{env}/...`, where '/', '+' and
# '#' would change the meaning of the filter; 63 characters keeps it a valid DNS label as well.
ENVIRONMENT_ID_RULE = "1 to 63 characters of a-z, 0-9 and '-', starting with a letter or digit"
_ENVIRONMENT_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_NOT_LABEL_CHARS = re.compile(r"[^a-z0-9-]+")
_DEVELOPMENT_PREFIX = "local-"

SOURCE_CONFIG = "config"
SOURCE_VARIABLE = ENVIRONMENT_VARIABLE
SOURCE_DEVELOPMENT = "development-default"


class IdentityError(ValueError):
    """An identity rule was broken; `key` names the config key or variable at fault."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


@dataclass(frozen=True)
class Identity:
    environment_id: str
    environment_source: str  # "config" | "MQTT_ENVIRONMENT_ID" | "development-default"
    client_id: str
    subscriptions: tuple[str, ...]
    # None when nothing is forwarded (no [upstream] section, or it is disabled).
    upstream_client_id: str | None = None


class SourceIdentitySettings(Protocol):
    """The part of the `[source]` section that identity depends on."""

    @property
    def environment_id(self) -> str | None: ...
    @property
    def client_id(self) -> str: ...
    @property
    def instance_id(self) -> str | None: ...
    @property
    def append_unique_id(self) -> bool: ...
    @property
    def shared_subscription_group(self) -> str: ...
    @property
    def subscribe_topics(self) -> Sequence[str]: ...
    @property
    def management_topics(self) -> Sequence[str]: ...


class UpstreamIdentitySettings(Protocol):
    """The part of the `[upstream]` section that identity depends on."""

    @property
    def client_id(self) -> str: ...
    @property
    def instance_id(self) -> str | None: ...
    @property
    def append_unique_id(self) -> bool: ...


def random_suffix() -> str:
    """Eight hex characters, fresh for every call."""
    return uuid.uuid4().hex[:8]


def sanitize_hostname(hostname: str) -> str:
    """Lower-case; every run of characters outside [a-z0-9-] becomes one '-'; '-' trimmed.

    An empty result becomes "localhost" so that an unnamed machine still gets a usable id.
    """
    label = _NOT_LABEL_CHARS.sub("-", hostname.lower()).strip("-")
    return label or "localhost"


def validate_environment_id(value: str, key: str) -> str:
    if not _ENVIRONMENT_ID.fullmatch(value):
        raise IdentityError(key, f"{value!r} is not a valid environment id: {ENVIRONMENT_ID_RULE}")
    return value


def resolve_environment_id(
    configured: str | None, environ: Mapping[str, str], mode: str, hostname: str
) -> tuple[str, str]:
    """(environment id, where it came from): config, then the variable, then the mode's default."""
    if configured is not None:
        return validate_environment_id(configured, ENVIRONMENT_KEY), SOURCE_CONFIG
    from_variable = environ.get(ENVIRONMENT_VARIABLE, "")
    if from_variable:
        return validate_environment_id(from_variable, ENVIRONMENT_VARIABLE), SOURCE_VARIABLE
    if mode == "development":
        # Truncate so that the prefixed id still fits the 63-character rule.
        label = sanitize_hostname(hostname)[: 63 - len(_DEVELOPMENT_PREFIX)].rstrip("-")
        return f"{_DEVELOPMENT_PREFIX}{label}", SOURCE_DEVELOPMENT
    if mode == "production":
        # A guessed id in production would silently join (or split) a shared group.
        raise IdentityError(
            ENVIRONMENT_KEY,
            f"required in production mode (set it in the file or {ENVIRONMENT_VARIABLE})",
        )
    raise ValueError(f"unknown mode {mode!r}")


def resolve_instance_id(configured: str | None, hostname: str) -> str:
    return configured if configured is not None else sanitize_hostname(hostname)


def build_client_id(
    client_id: str,
    environment_id: str,
    instance_id: str,
    append_unique_id: bool,
    unique: Callable[[], str] = random_suffix,
) -> str:
    """`{client_id}-{environment}-{instance}`, plus `-{unique}` when asked.

    Without the suffix the id is stable across restarts, which is what lets the broker resume
    the persistent session (clean_start = false) and its queued QoS 1/2 messages.
    """
    base = f"{client_id}-{environment_id}-{instance_id}"
    return f"{base}-{unique()}" if append_unique_id else base


def shared_subscription(topic_filter: str, group: str, environment_id: str) -> str:
    """Scope the shared group by environment so that two environments on one broker never split
    each other's reads. An empty group means a plain subscription."""
    if not group:
        return topic_filter
    return f"$share/{group}-{environment_id}/{topic_filter}"


def resolve_identity(
    source_cfg: SourceIdentitySettings,
    mode: str,
    environ: Mapping[str, str],
    hostname: str,
    unique: Callable[[], str] = random_suffix,
    upstream_cfg: UpstreamIdentitySettings | None = None,
) -> Identity:
    """The identity on the source broker, and on the upstream one when `upstream_cfg` is given.

    Both client ids follow one rule with the same environment id. The upstream instance falls
    back to the source's `instance_id`, then to the host name, so that one machine shows up
    under one instance name on both brokers.
    """
    environment_id, environment_source = resolve_environment_id(
        source_cfg.environment_id, environ, mode, hostname
    )
    source_instance = resolve_instance_id(source_cfg.instance_id, hostname)
    client_id = build_client_id(
        source_cfg.client_id,
        environment_id,
        source_instance,
        source_cfg.append_unique_id,
        unique,
    )
    subscriptions = tuple(
        shared_subscription(topic, source_cfg.shared_subscription_group, environment_id)
        for topic in (*source_cfg.subscribe_topics, *source_cfg.management_topics)
    )
    upstream_client_id = None
    if upstream_cfg is not None:
        upstream_instance = upstream_cfg.instance_id
        upstream_client_id = build_client_id(
            upstream_cfg.client_id,
            environment_id,
            source_instance if upstream_instance is None else upstream_instance,
            upstream_cfg.append_unique_id,
            unique,
        )
    return Identity(
        environment_id, environment_source, client_id, subscriptions, upstream_client_id
    )
