"""The configuration reference page, generated from the configuration schema.

`render_reference()` walks `actors.config.schema` (its sections, arrays of tables and fields)
and returns the Markdown of `docs/pages/reference/configuration.md`: per key its type, its
default, its environment variable and its meaning. The meaning is the field's docstring and a
section's introduction its model's docstring, so the page is never kept by hand; only the
general rules at the top (files, precedence, variables, secrets, identity) are written here.

    python -m actors.config.reference --write docs/pages/reference/configuration.md
    python -m actors.config.reference --check docs/pages/reference/configuration.md

`--check` exits 1 with a one-line summary when the page differs from what the schema makes now;
tests/actors/config/test_reference.py checks the same, so a key cannot be added, renamed or
given a new default without the reference following.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import AfterValidator
from pydantic.fields import FieldInfo

from actors.config import identity
from actors.config.routes import check_lifecycle_topic, check_target
from actors.config.schema import (
    _LOG_LEVELS,
    ARRAYS,
    ENV_PREFIX,
    SECTIONS,
    _client_id_part,
    _env_var_name,
    _group_name,
    _log_level,
    _memory_size,
    _namespace_name,
    _non_empty_key,
    _route_filter,
    _Section,
    _spark_conf_value,
    _topic_filter,
)

PAGE = Path("docs/pages/reference/configuration.md")
WRITE_COMMAND = f"python -m actors.config.reference --write {PAGE}"

# The order of configs/gateway.toml; a section not named here follows, in the schema's order.
_ORDER = (
    "gateway",
    "source",
    "ledger",
    "packs",
    "upstream",
    "routes",
    "buffer",
    "lifecycle",
    "spark",
    "compaction",
)


# What a value must look like, for the checks the schema attaches as validators; a validator
# not named here leaves the base type's text ("string").
_VALIDATED: Mapping[Callable[..., Any], str] = {
    _log_level: "one of " + ", ".join(f"`{level}`" for level in _LOG_LEVELS),
    _client_id_part: "name (letters, digits, `.`, `_`, `-`)",
    _group_name: "name (letters, digits, `.`, `_`, `-`) or empty",
    _env_var_name: "environment variable name",
    _topic_filter: "MQTT topic filter",
    _route_filter: "MQTT topic filter",
    check_target: "topic template: `{topic}`, `{reader}`, `{environment}`",
    check_lifecycle_topic: "topic template: `{environment}`, `{client}`",
    _namespace_name: "name, 1 to 128 characters (letters, digits, `.`, `_`, `-`)",
    _memory_size: "JVM memory size (`512m`, `2g`)",
    _spark_conf_value: "string, number or boolean",
    _non_empty_key: "table of Spark settings (string, number or boolean values)",
}
# Strings whose form the annotation does not say (checked elsewhere, or free-form), by key.
_TYPE_OF_KEY: Mapping[str, str] = {
    "source.environment_id": "environment id: 1 to 63 characters of `a-z`, `0-9`, `-`",
    "gateway.data_dir": "directory path",
    "spark.tables_dir": "directory path or URI",
    "spark.master": "Spark master URL",
    "spark.class_data_archive": '`auto`, a file path or `""`',
}
# ... and by the end of a key's name.
_TYPE_OF_SUFFIX = {"host": "host name or address", "_file": "file path"}
# Every constraint the schema uses is one of these (a new kind must be taught to `_bounds`).
_KNOWN_CONSTRAINTS = (
    annotated_types.Ge,
    annotated_types.Gt,
    annotated_types.Le,
    annotated_types.Lt,
    annotated_types.MinLen,
)
# The unit a number's key ends with.
_UNITS = {"_seconds": "seconds", "_hours": "hours", "_bytes": "bytes", "_mb": "MiB"}
# Variables that set a key besides its own FXGATE__ one: (variable, when it applies).
_ALSO_FROM: Mapping[str, tuple[str, str]] = {
    identity.ENVIRONMENT_KEY: (identity.ENVIRONMENT_VARIABLE, "when the key is not set"),
}
# Where the operating pages say more about a section (whole pages only: their anchors are not
# generated here).
_SEE_ALSO: Mapping[str, tuple[tuple[str, str], ...]] = {
    "gateway": (
        ("Running under systemd", "../operating/systemd.md"),
        ("What to watch", "../operating/monitoring.md"),
    ),
    "source": (
        ("Brokers", "../operating/brokers.md"),
        ("Several gateways", "../operating/several-gateways.md"),
        ("Security", "../operating/security.md"),
    ),
    "upstream": (
        ("Forwarding upstream", "../operating/forwarding.md"),
        ("Security", "../operating/security.md"),
    ),
    "routes": (("Forwarding upstream", "../operating/forwarding.md"),),
    "ledger": (("Disk budget and the ledger", "../operating/disk-budget.md"),),
    "packs": (("Dead letters and replay", "../operating/dead-letters.md"),),
    "buffer": (("Forwarding upstream", "../operating/forwarding.md"),),
    "lifecycle": (("Life-cycle events", "events.md"),),
    "spark": (("Spark, clusters and the JVM", "../tables/spark.md"),),
    "compaction": (("Compaction and retention", "../tables/compaction.md"),),
}
# Examples shown under a section's table; tests/actors/config/test_reference.py loads each.
_EXAMPLES: Mapping[str, str] = {
    "routes": """\
```toml
[upstream]
host = "mqtt.plant-7.example.com"
username = "fxgate-plant-7"
password_env = "FXGATE_UPSTREAM_PASSWORD"

[[routes]]
source = "zebra/fx/+/reads"
# zebra/fx/fx-dock-1/reads -> plants/plant-7/readers/fx-dock-1/reads
target = "plants/{environment}/readers/{reader}/reads"
qos = 2
```
""",
}

_IDENTITY_RULES = (
    (
        "environment id",
        "`source.environment_id`, else `MQTT_ENVIRONMENT_ID`, else `local-<hostname>` in "
        "development mode; in production mode a start-up error naming `source.environment_id`",
    ),
    (
        "client id",
        "`{client_id}-{environment}-{instance}`; the instance is `source.instance_id`, else the "
        "host name; `append_unique_id = true` adds `-<8 hex digits>`",
    ),
    (
        "upstream client id",
        "the same rule with `[upstream]`'s `client_id` and `instance_id` (unset: the source's "
        "instance)",
    ),
    (
        "subscription",
        "each filter as written, or `$share/{group}-{environment}/{filter}` with "
        "`source.shared_subscription_group`",
    ),
)


_INTRODUCTION = f"""\
# Configuration

<!-- Generated from the configuration schema (actors/config/schema.py) by
`{WRITE_COMMAND}` (`make docs`).
Edit the schema's docstrings, not this page: a test fails when the two differ. -->

fxgate reads one TOML file. Every key has a type, a default and an environment variable that
overrides it; this page lists them all, section by section, as the configuration schema defines
them.

## Files

- `fxgate run --config FILE` (and every command that takes `--config`) reads `FILE`. Without
  `--config` the embedded defaults apply; `configs/gateway.toml` writes every one of them out,
  with comments: copy it and change what you need.
- `configs/production.example.toml` holds only what a production gateway changes; the systemd
  unit reads `/etc/fxgate/gateway.toml` (see [Running under systemd](../operating/systemd.md)).
- A section or key left out takes its default. `[upstream]` and `[[routes]]` are the exception:
  they have no defaults and turn forwarding on together.
- A bad file fails at start with every problem listed, each naming its key (and the variable,
  when one set it), and exit status 2, e.g. `packs.max_mesages: unknown key (did you mean
  'max_messages'?)`. Types are strict: `port = "1884"` is an error, not a number.
- The start-up log lists the settings in effect, and warns about what loads but deserves a look
  (a route lowered to QoS 0, `tls_insecure`, a clean session, a short session expiry).

## Precedence

Lowest first; each source overrides the ones before it:

1. the defaults (this page, `configs/gateway.toml`);
2. the file given with `--config`;
3. `FXGATE__` environment variables.

`MQTT_ENVIRONMENT_ID` sets the environment id only when `source.environment_id` is set neither
in the file nor by `FXGATE__SOURCE__ENVIRONMENT_ID`.

## Environment variables

- `{ENV_PREFIX}<SECTION>__<KEY>` sets one key, e.g. `FXGATE__SOURCE__PORT=1884`. The prefix,
  section and key are matched in any case.
- The value is read as a TOML literal when it is one (`1884`, `true`, `0.5`,
  `["a/#", "b/#"]`), else as text. A key whose type is a string takes the text as it is:
  `FXGATE__SOURCE__CLIENT_ID=123` is the client id `"123"`.
- `FXGATE__ROUTES__<i>__<KEY>` sets a key of `routes[i]`, the file's entries numbered from 0;
  an index one past the last entry adds a route (number new routes without gaps).
- `FXGATE__SPARK__CONF__<setting>` sets one `[spark.conf]` entry; the setting keeps its case.
  A shell cannot `export` a name with dots: use `env`, or the service manager's environment.
- A variable that names no key, or a key set by two variables, is an error like a bad file's.

```bash
env FXGATE__SOURCE__HOST=broker.plant-7.lan \\
    FXGATE__SOURCE__MANAGEMENT_TOPICS='["zebra/fx/+/mgmt"]' \\
    FXGATE__SPARK__CONF__spark.sql.shuffle.partitions=4 \\
    MQTT_ENVIRONMENT_ID=plant-7 \\
    fxgate run --config /etc/fxgate/gateway.toml
```

## Secrets

- No key holds a password: `source.password` is an unknown key, and the error does not show the
  value. `password_env` names the variable that holds it (under systemd, from an
  `EnvironmentFile` readable by root only); `password_file` names a file that holds only the
  password, read at every connect so that a rotated password is used from the next reconnect.
- In production mode each variable named by `password_env` must be set for `fxgate run` (the
  commands that connect to no broker do not ask for it), and a `password_file` or
  `tls_key_file` must be private to the daemon's user (chmod 600).
- Passwords never appear in logs, in the start-up summary, in errors or in `fxgate status`.
  `[spark.conf]` is logged by key only, and values of keys that look secret (`secret`,
  `password`, `token`, `credential`, `private`, `key`) are masked.
- Object-store credentials go in `[spark.conf]` (e.g. `spark.hadoop.fs.s3a.access.key`,
  preferably from the environment) or the Hadoop environment, never in `spark.tables_dir`: a
  URI with credentials is refused at start.

## Identity
"""

_KEYS = """\
## Keys

Each table gives a key, the variable that overrides it, its type, its default ("unset": no value
unless written; "required": no default) and what it does.
"""


def render_reference() -> str:
    """The whole page, from the schema as it is now."""
    _check_hand_kept_keys()
    identity_table = "\n".join(
        [
            "| Name | Rule |",
            "| --- | --- |",
            *(f"| {name} | {rule} |" for name, rule in _IDENTITY_RULES),
        ]
    )
    parts = [_INTRODUCTION, identity_table + "\n", _KEYS]
    for name, model, array in _sections():
        parts.append(_render_section(name, model, array))
    return "\n".join(parts)


def _sections() -> list[tuple[str, type[_Section], bool]]:
    """(name, model, is an array of tables) for every section of the schema."""
    found = [(name, model, False) for name, model in SECTIONS.items()]
    found += [(name, model, True) for name, model in ARRAYS.items()]
    rank = {name: index for index, name in enumerate(_ORDER)}
    return sorted(found, key=lambda section: rank.get(section[0], len(rank)))


def _check_hand_kept_keys() -> None:
    """The few things this module says about particular keys and sections must name ones that
    exist: a key renamed in the schema must not leave them behind, silently unused."""
    dotted = {f"{name}.{key}" for name, model, _ in _sections() for key in model.model_fields}
    sections = {name for name, _, _ in _sections()}
    stale = sorted(
        {key for key in [*_TYPE_OF_KEY, *_ALSO_FROM] if key not in dotted}
        | {name for name in [*_SEE_ALSO, *_EXAMPLES, *_ORDER] if name not in sections}
    )
    if stale:
        raise ValueError(f"actors/config/reference.py names what the schema has not: {stale}")


def _render_section(name: str, model: type[_Section], array: bool) -> str:
    heading = f"[[{name}]]" if array else f"[{name}]"
    lines = [f"### `{heading}`", "", _text(model.__doc__ or "", heading), ""]
    see_also = _SEE_ALSO.get(name, ())
    if see_also:
        links = ", ".join(f"[{title}]({link})" for title, link in see_also)
        lines += [f"See also: {links}.", ""]
    lines += ["| Key and variable | Type | Default | Meaning |", "| --- | --- | --- | --- |"]
    for key, field in model.model_fields.items():
        dotted = f"{name}.{key}"
        names = "<br>".join(f"`{text}`" for text in [key, *environment_variables(name, key)])
        if dotted in _ALSO_FROM:
            variable, when = _ALSO_FROM[dotted]
            names += f"<br>or `{variable}` {when}"
        cells = [
            names,
            _TYPE_OF_KEY.get(dotted) or _type_text(field, key),
            _default_text(field, key),
            _text(field.description or "", dotted),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    example = _EXAMPLES.get(name)
    if example is not None:
        lines += ["", example.rstrip("\n")]
    return "\n".join(lines) + "\n"


def environment_variables(section: str, key: str) -> list[str]:
    """The FXGATE__ variables that set `section.key` (actors.config.schema._apply_overrides has
    the rule): one per key, `<i>` for an entry of an array of tables, and one per entry of a
    table-valued key besides the whole table's."""
    if section in ARRAYS:
        return [f"{ENV_PREFIX}{section.upper()}__<i>__{key.upper()}"]
    variable = f"{ENV_PREFIX}{section.upper()}__{key.upper()}"
    field = SECTIONS[section].model_fields[key]
    if typing.get_origin(_unwrap(field.annotation, [])[0]) is dict:
        return [variable, f"{variable}__<setting>"]
    return [variable]


# --- types --------------------------------------------------------------------------------


def _unwrap(annotation: Any, metadata: list[Any]) -> tuple[Any, list[Any]]:
    """The annotation without `| None` and `Annotated`, with every constraint found on the way."""
    metadata = list(metadata)
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation, *extra = typing.get_args(annotation)
            for item in extra:
                metadata += item.metadata if isinstance(item, FieldInfo) else [item]
        elif origin in (typing.Union, types.UnionType):
            args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            if len(args) != 1:
                raise TypeError(f"cannot describe {annotation!r}")
            annotation = args[0]
        else:
            return annotation, metadata


def _type_text(field: FieldInfo, key: str) -> str:
    annotation, _ = _unwrap(field.annotation, [])
    if annotation is str:
        for suffix, text in _TYPE_OF_SUFFIX.items():
            if key.endswith(suffix):
                return text
    unit = next((unit for suffix, unit in _UNITS.items() if key.endswith(suffix)), None)
    return _describe_type(field.annotation, field.metadata, unit)


def _describe_type(annotation: Any, metadata: list[Any], unit: str | None) -> str:
    annotation, metadata = _unwrap(annotation, metadata)
    unknown = [
        item
        for item in metadata
        if isinstance(item, annotated_types.BaseMetadata)
        and not isinstance(item, _KNOWN_CONSTRAINTS)
    ]
    if unknown:
        raise TypeError(f"teach _bounds the constraint {unknown[0]!r}")
    for item in metadata:
        if isinstance(item, AfterValidator) and item.func in _VALIDATED:
            return _VALIDATED[item.func]
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin is tuple:
        item_type = _describe_type(typing.get_args(annotation)[0], [], None)
        text = f"list of {item_type}s"
        return text + (" (at least one)" if _bound(metadata, "min_length") else "")
    if origin is dict:
        return f"table of {_describe_type(typing.get_args(annotation)[1], [], None)} values"
    if annotation is bool:
        return "`true` or `false`"
    if annotation in (int, float):
        kind = "integer" if annotation is int else "number"
        text = f"{kind} {_bounds(metadata)}".rstrip()
        return f"{text} ({unit})" if unit else text
    if annotation is str:
        return "non-empty string" if _bound(metadata, "min_length") else "string"
    raise TypeError(f"no description for the type {annotation!r}")


def _bound(metadata: Sequence[Any], name: str) -> Any:
    return next((getattr(item, name) for item in metadata if hasattr(item, name)), None)


def _bounds(metadata: Sequence[Any]) -> str:
    low_inclusive, low = _bound(metadata, "ge"), _bound(metadata, "gt")
    high_inclusive, high = _bound(metadata, "le"), _bound(metadata, "lt")
    if low_inclusive is not None and high_inclusive is not None:
        return f"{_number(low_inclusive)} to {_number(high_inclusive)}"
    parts = []
    if low_inclusive is not None:
        parts.append(f"≥ {_number(low_inclusive)}")
    if low is not None:
        parts.append(f"> {_number(low)}")
    if high_inclusive is not None:
        parts.append(f"≤ {_number(high_inclusive)}")
    if high is not None:
        parts.append(f"< {_number(high)}")
    return ", ".join(parts)


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) and value >= 10_000 else f"{value}"


# --- defaults -----------------------------------------------------------------------------


def _default_text(field: FieldInfo, key: str) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    text = f"`{_toml(value)}`"
    if key.endswith("_bytes") and isinstance(value, int) and value >= 1024:
        text += f" ({_size(value)})"
    return text


def _toml(value: Any) -> str:
    """`value` as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        entries = ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items())
        return "{ " + entries + " }" if entries else "{}"
    raise TypeError(f"no TOML literal for {value!r}")


def _size(count: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= size:
            amount = count / size
            return f"{amount:g} {unit}" if amount == int(amount) else f"{amount:.1f} {unit}"
    return f"{count} bytes"


# --- text ---------------------------------------------------------------------------------


def _text(text: str, where: str) -> str:
    """A docstring as one line of a table cell or paragraph."""
    line = " ".join(text.split())
    if not line:
        raise ValueError(f"{where}: no description (give the field a docstring)")
    if "|" in line:
        raise ValueError(f"{where}: '|' would split the table row; reword the description")
    return line


# --- the command --------------------------------------------------------------------------


def difference(committed: str, page: str) -> str | None:
    """None when the two texts are equal, else how many lines differ and where the first is."""
    if committed == page:
        return None
    old, new = committed.splitlines(), page.splitlines()
    changed = sum(
        max(old_end - old_start, new_end - new_start)
        for tag, old_start, old_end, new_start, new_end in difflib.SequenceMatcher(
            None, old, new, autojunk=False
        ).get_opcodes()
        if tag != "equal"
    )
    first = next(
        (number for number, (a, b) in enumerate(zip(old, new, strict=False), 1) if a != b),
        min(len(old), len(new)) + 1,
    )
    return f"{changed} line(s) differ, the first at line {first}"


def stale_reason(path: Path, page: str) -> str | None:
    """None when the file at `path` holds `page`, else one line saying how it differs and what
    to run."""
    fix = f"run `make docs` (or `python -m actors.config.reference --write {path}`)"
    try:
        committed = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{path} does not exist: {fix}"
    how = difference(committed, page)
    if how is None:
        return None
    return f"{path} is not what the configuration schema makes ({how}): {fix}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m actors.config.reference",
        description="Write or check the configuration reference page made from the schema.",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", metavar="PATH", type=Path, help="write the page to PATH")
    action.add_argument(
        "--check", metavar="PATH", type=Path, help="exit 1 when PATH differs from the schema"
    )
    args = parser.parse_args(argv)
    page = render_reference()
    if args.write is not None:
        args.write.write_text(page, encoding="utf-8")
        return 0
    reason = stale_reason(args.check, page)
    if reason is not None:
        print(reason, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
