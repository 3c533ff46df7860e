"""Idempotency keys: the names under which a message and each of its reads are stored exactly once.

Exactly-once in the tables is at-least-once delivery plus an idempotent receiver (DESIGN §1): a
message redelivered after a crash or a reconnect must get the same key every time, so the key is a
pure function of what the broker delivers (topic and payload), never of when or how it arrived.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

# 32 hex digits = 128 bits: collisions are out of reach for any volume a gateway will ever see,
# and the key stays short enough to index cheaply in SQLite and to read in a log line.
_KEY_HEX_DIGITS = 32


def message_key(topic: str, payload: bytes) -> str:
    """The default idempotency key of one MQTT message: sha256(topic + NUL + payload), 32 hex.

    The NUL separator keeps ("a/b", b"c") and ("a/bc", b"") apart: a topic can never contain NUL
    (MQTT 5 §1.5.4 forbids U+0000 in UTF-8 strings).
    """
    return hashlib.sha256(b"%s\0%s" % (topic.encode("utf-8"), payload)).hexdigest()[
        :_KEY_HEX_DIGITS
    ]


def read_id(message_key: str, index: int) -> str:
    """The `message_id` of the `index`-th read in a message; a single-event message has index 0."""
    return f"{message_key}:{index}"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class TagReadLike(Protocol):
    event_num: int | None
    event_time: datetime


def payload_hash_read_id(message_key: str, reader_id: str, index: int, read: TagReadLike) -> str:
    """Default: a read is its message's key plus its place in the message."""
    return read_id(message_key, index)


def read_fields_read_id(message_key: str, reader_id: str, index: int, read: TagReadLike) -> str:
    """A read is who saw it, the reader's event number and its time: the same read carried by
    two different messages (a reader re-sending in another batch) gets one key. Without an
    eventNum there is nothing to recognise it by, so it falls back to the payload-hash id."""
    if read.event_num is None:
        return read_id(message_key, index)
    micros = (read.event_time - _EPOCH) // _MICROSECOND
    return f"{reader_id}/{read.event_num}/{micros}"


ReadKey = Callable[[str, str, int, TagReadLike], str]

READ_KEYS: dict[str, ReadKey] = {
    "payload_hash": payload_hash_read_id,
    "read_fields": read_fields_read_id,
}
