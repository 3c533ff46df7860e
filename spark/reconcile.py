"""Heartbeat reconciliation over the tables: what each reader says it sent between two of its
heartbeats against the data messages the `reads` table holds from it between them.

The daemon keeps the same figure live (spark/reader_health.py), but per gateway: a member of a
shared group receives only its share of a reader's messages. A group's one table (DESIGN §7.12)
holds every member's share, so here the figure is the reader's whole stream.

The rules are reader_health's, on the table's rows:
- **order**: the reader's own clock. A heartbeat (a `reader_events` row of type heartbeat) and a
  data message are both stamped by the reader, so its clock orders them the same whichever member
  received them; each member's ledger `seq` orders only its own share. A data message's time is
  the earliest `event_time` of its reads (a batched message carries several events).
- **interval**: two consecutive heartbeats whose `sent` counter is usable (present, one data
  path); its change of `sent` against the data messages stamped after the first and up to the
  second. A heartbeat without a usable counter changes nothing.
- **reset**: `sent` below the previous usable heartbeat's (a reboot): not compared, the new
  value is the next baseline.
- **unaccounted**: the sum over the intervals of (change of `sent`) - (messages in the table).
  It telescopes: a message stamped before a heartbeat and published after it counts in the
  interval before, which the reader's counter then shows in the next, so the sum over a run
  of intervals is exact but at its two ends.

A data message is a read message in `reads`: its `message_id` is `<message key>:<index>` (the
default `payload_hash` key); with `read_fields` ids each read counts as a message. A bad payload
on a reader's data topic is a `dead_letters` row without the reader's time: not counted here,
it shows as unaccounted (`fxgate dead-letters list` names it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.location import Location, spark_uri
from spark.tables import READER_EVENTS, READS, read_delta_frame, table_path
from spark.zebra import HEARTBEAT, data_path_counters

log = logging.getLogger(__name__)

# The message key of a `payload_hash` read id: 32 hex digits before the read's index.
_MESSAGE_KEY = r"^([0-9a-f]{32}):\d+$"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One heartbeat of a reader: its time (microseconds, the reader's clock) and `sent`."""

    micros: int
    sent: int | None
    paths: int = 1


@dataclass(frozen=True, slots=True)
class Interval:
    start: int  # microseconds, exclusive
    end: int  # inclusive
    sent: int  # the change of the reader's `sent` counter over it


def intervals(heartbeats: Iterable[Heartbeat]) -> tuple[list[Interval], int]:
    """The compared intervals of one reader's heartbeats (in the reader's time order), and the
    counter resets between them (see the module)."""
    found: list[Interval] = []
    resets = 0
    baseline: Heartbeat | None = None
    for beat in sorted(heartbeats, key=lambda b: b.micros):
        if beat.sent is None or beat.paths != 1:
            continue
        if baseline is not None and beat.sent >= baseline.sent:
            found.append(Interval(baseline.micros, beat.micros, beat.sent - baseline.sent))
        elif baseline is not None:
            resets += 1
        baseline = beat
    return found, resets


@dataclass(frozen=True)
class Reconciliation:
    reader_id: str
    heartbeats: int  # heartbeats in the table, usable or not
    intervals: int
    resets: int
    sent: int  # the reader's `sent` counter's change over the intervals
    received: int  # the data messages the table holds within them

    @property
    def unaccounted(self) -> int:
        return self.sent - self.received

    def to_json(self) -> dict:
        return {
            "heartbeats": self.heartbeats,
            "intervals": self.intervals,
            "counter_resets": self.resets,
            "sent": self.sent,
            "received": self.received,
            "unaccounted": self.unaccounted,
        }

    def line(self) -> str:
        if not self.intervals:
            return (
                f"{self.reader_id}: {self.heartbeats} heartbeat(s), no interval with a usable "
                "`sent` counter: not reconciled"
            )
        return (
            f"{self.reader_id}: the reader sent {self.sent} data message(s) over "
            f"{self.intervals} heartbeat interval(s), the table holds {self.received}: "
            f"{self.unaccounted} unaccounted, {self.resets} counter reset(s)"
        )


def reconcile_tables(
    session: SparkSession, tables_dirs: Sequence[Location]
) -> dict[str, Reconciliation]:
    """Each reader's reconciliation over the union of `tables_dirs` (a shared group's one
    table, or one gateway's): only readers with heartbeats in `reader_events`."""
    beats: dict[str, list[Heartbeat]] = {}
    reads: list[DataFrame] = []
    for tables_dir in tables_dirs:
        base = spark_uri(tables_dir)
        events = _read(session, table_path(base, READER_EVENTS))
        if events is not None and {"type", "data", "event_time"} <= set(events.columns):
            rows = (
                events.where(F.lower(F.col("type")) == HEARTBEAT)
                .select("reader_id", F.unix_micros("event_time").alias("micros"), "data")
                .collect()
            )
            for row in rows:
                beats.setdefault(row["reader_id"] or "", []).append(_heartbeat(row))
        table = _read(session, table_path(base, READS))
        if table is not None and {"message_id", "event_time", "reader_id"} <= set(table.columns):
            reads.append(table.select("reader_id", "message_id", "event_time"))
    compared = {reader: intervals(found) for reader, found in beats.items()}
    counts = _messages_within(session, reads, compared)
    return {
        reader: Reconciliation(
            reader,
            len(beats[reader]),
            len(found),
            resets,
            sum(interval.sent for interval in found),
            sum(counts.get((reader, interval.start), 0) for interval in found),
        )
        for reader, (found, resets) in compared.items()
    }


def _heartbeat(row) -> Heartbeat:
    try:
        data = json.loads(row["data"]) if row["data"] else {}
    except ValueError:
        data = {}
    counters = data_path_counters(data) if isinstance(data, dict) else None
    if counters is None or row["micros"] is None:
        return Heartbeat(row["micros"] or 0, None)
    return Heartbeat(row["micros"], counters.sent, counters.paths)


def _messages_within(
    session: SparkSession,
    reads: list[DataFrame],
    compared: dict[str, tuple[list[Interval], int]],
) -> dict[tuple[str, int], int]:
    """The data messages of each reader stamped within each of its intervals, by (reader,
    interval start): one Spark job, the intervals broadcast."""
    rows = [
        (reader, interval.start, interval.end)
        for reader, (found, _) in compared.items()
        for interval in found
    ]
    if not rows or not reads:
        return {}
    union = reads[0]
    for more in reads[1:]:
        union = union.unionByName(more)
    key = F.regexp_extract("message_id", _MESSAGE_KEY, 1)
    messages = (
        union.withColumn("_key", F.when(key != "", key).otherwise(F.col("message_id")))
        .groupBy("reader_id", "_key")
        .agg(F.unix_micros(F.min("event_time")).alias("_micros"))
    )
    spans = session.createDataFrame(rows, "reader_id string, _start long, _end long")
    within = messages.join(
        F.broadcast(spans),
        (messages["reader_id"] == spans["reader_id"])
        & (messages["_micros"] > spans["_start"])
        & (messages["_micros"] <= spans["_end"]),
    )
    counted = within.groupBy(spans["reader_id"], spans["_start"]).count().collect()
    return {(row["reader_id"], row["_start"]): row["count"] for row in counted}


def _read(session: SparkSession, path: str) -> DataFrame | None:
    return read_delta_frame(session, path)
