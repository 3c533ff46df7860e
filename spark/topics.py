"""MQTT topic rules, in one place: what a topic name may hold, how a filter matches it, and which
reader a topic belongs to (MQTT 5 §4.7, §1.5.4).

Topics come from whoever can publish to the broker, so they are checked before anything relies on
them: `topic_problem` says when a topic cannot be stored and forwarded as it is, `safe_reader_id`
turns a reader's topic level into a name that is safe as a file name or a partition value. The
parser and the batch builder (spark.schema) use these, and so do the routes (actors.config.routes),
which import them from here: the rules are the parser's, not the configuration's.
"""

from __future__ import annotations

import hashlib

# How much of a value a detail message quotes.
DETAIL_VALUE_CHARS = 64

# MQTT 5 §1.5.4: a UTF-8 string has a two-byte length.
MAX_TOPIC_BYTES = 65535


def reader_id_from_topic(topic: str) -> str:
    """The reader a topic belongs to: `<reader>` in `zebra/fx/<reader>/reads`.

    In general the second-to-last level (readers publish `.../<reader>/<stream>`); a one-level
    topic, or one whose second-to-last level is empty, is its own reader id.
    """
    levels = topic.split("/")
    if len(levels) < 2 or not levels[-2]:
        return topic
    return levels[-2]


def topic_problem(topic: str) -> str | None:
    """Why `topic` cannot be stored and forwarded as it is, or None when it can.

    A broker checks topics for its clients, but a broker is not the only way in (replayed files,
    a non-conforming broker), and a topic that is not a valid MQTT topic name would break what
    relies on it: NUL separates topic and payload in the idempotency key (persistence.keys), a
    lone surrogate cannot be written to a UTF-8 column, a wildcard or an over-long name cannot be
    published upstream.
    """
    if not topic:
        return "the topic is empty"
    if "\x00" in topic:
        return f"topic {show(topic)} holds NUL (U+0000), which MQTT 5 forbids"
    if "+" in topic or "#" in topic:
        return f"topic {show(topic)} holds a wildcard ('+' or '#'), not allowed in a topic name"
    try:
        size = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        return f"topic {show(topic)} is not valid UTF-8 (a lone surrogate)"
    if size > MAX_TOPIC_BYTES:
        return f"topic of {size} bytes is longer than MQTT allows ({MAX_TOPIC_BYTES})"
    return None


# Kept as they are in a safe name: what no file system, URI or Hive partition path treats
# specially. Everything else is %XX-escaped byte by byte (UTF-8), as Hive escapes partition
# values, so the name can be read back with urllib.parse.unquote.
_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._")


MAX_SAFE_NAME_BYTES = 200


_HASH_HEX_DIGITS = 32


def safe_reader_id(reader: str) -> str:
    """`reader` as a name that is safe as a file name, a path component or a partition value.

    Names made of letters, digits, '-', '.' and '_' (what FX9600 readers are called) come back
    unchanged. Otherwise every other byte of the UTF-8 form becomes %XX (reversible with
    `urllib.parse.unquote`), and so does a leading '.' or '_' (Spark and pyarrow skip such paths
    as hidden): the result is ASCII, holds no '/', '\\', NUL or control character, and is never
    '.' or '..'. A name longer than MAX_SAFE_NAME_BYTES once escaped keeps its first part and
    ends in '~' and 32 hex digits of its sha256: unique, but no longer reversible ('~' marks it,
    since an escaped name never holds one). An empty reader becomes '%', which no other name
    escapes to.
    """
    if not reader:
        return "%"
    if reader.isascii() and all(c in _SAFE_CHARS for c in reader) and reader[0] not in "._":
        escaped = reader
    else:
        raw = reader.encode("utf-8", "surrogatepass")
        escaped = "".join(
            chr(b) if chr(b) in _SAFE_CHARS and (i > 0 or chr(b) not in "._") else f"%{b:02X}"
            for i, b in enumerate(raw)
        )
    if len(escaped) <= MAX_SAFE_NAME_BYTES:
        return escaped
    digest = hashlib.sha256(reader.encode("utf-8", "surrogatepass")).hexdigest()
    keep = escaped[: MAX_SAFE_NAME_BYTES - 1 - _HASH_HEX_DIGITS]
    # Never end the kept part inside a %XX escape.
    cut = keep.rfind("%", len(keep) - 2)
    if cut != -1:
        keep = keep[:cut]
    return f"{keep}~{digest[:_HASH_HEX_DIGITS]}"


def check_topic_filter(value: str) -> str:
    """MQTT 5 §4.7: wildcards take a whole level, '#' only the last one; no NUL; ≤ 65535 bytes.

    Returns `value`; raises ValueError saying which rule it breaks.
    """
    if not value:
        raise ValueError("a topic filter must not be empty")
    if "\x00" in value or len(value.encode("utf-8")) > MAX_TOPIC_BYTES:
        raise ValueError(f"{value!r} is not a valid MQTT topic filter")
    levels = value.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            raise ValueError(f"{value!r}: '#' must be a whole level and the last one")
        if "+" in level and level != "+":
            raise ValueError(f"{value!r}: '+' must be a whole level")
    return value


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether the topic name `topic` matches the (valid) filter `topic_filter`, MQTT 5 §4.7.

    '+' matches exactly one level (an empty one too); '#' matches the rest, including none
    ("a/#" matches "a"); a topic starting with '$' is not matched by a filter that starts with a
    wildcard (§4.7.2), so "#" never catches "$SYS/...".
    """
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == len(topic_levels)


def show(value: object) -> str:
    """A value for a detail message: ASCII-only (a lone surrogate from a JSON escape must not break
    the UTF-8 column it is stored in) and short (the payload itself is kept beside it)."""
    text = ascii(value)
    if len(text) > DETAIL_VALUE_CHARS:
        text = text[: DETAIL_VALUE_CHARS - 3] + "..."
    return text
