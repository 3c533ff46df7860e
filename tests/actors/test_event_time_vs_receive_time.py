"""Reads are analysed by event time or by receive time: the design record's verification step.

Every row of `reads` carries the reader's own `event_time` (the FX9600's timestamp) and the
gateway's `received_time` (the injected clock's wall time when the ledger stored it). Reads that
waited out an outage in the broker's queue have an old event time and a late receive time, so a
query grouping by event time puts them in the hour they happened and one grouping by receive time
in the hour they arrived: both answers are right, for different questions.

The outage is the gateway's (a graceful stop: its session keeps queueing on mosquitto). It lasts
two hours on the injected clock, a real clock moved on by an offset, so nothing waits.
"""

from __future__ import annotations

import json
import math
import time

import pytest

from actors.clock import RealClock
from actors.devtools.simulate import format_reader_timestamp
from actors.supervisor import Supervisor
from spark.schema import READS_SCHEMA
from spark.tables import READS, read_table
from tests.actors.test_supervisor import quick_config
from tests.harness.mqtt import publish_all

pytestmark = [pytest.mark.broker, pytest.mark.spark]

HOUR = 3600.0
OUTAGE = 2 * HOUR
TOPIC = "zebra/fx/fx9600-01/reads"

# The tables page's example (docs/pages/tables/index.md), as the test runs it (`reads` is the
# table, read with mergeSchema).
BY_HOUR = """
    SELECT date_format(date_trunc('HOUR', {column}), 'yyyy-MM-dd HH:00') AS hour,
           count(*) AS reads,
           max(unix_micros(received_time) - unix_micros(event_time)) / 1e6 AS max_delay_s
    FROM {view} GROUP BY 1 ORDER BY 1
"""


class ShiftedClock(RealClock):
    """A real clock whose wall time runs `offset` seconds ahead: an outage of hours in none."""

    def __init__(self, offset: float) -> None:
        super().__init__()
        self.offset = offset

    def wall(self) -> float:
        return time.time() + self.offset


def read_at(event_num: int, event_time: float) -> tuple[str, bytes]:
    event = {
        "data": {"eventNum": event_num, "format": "epc", "idHex": f"e2801160{event_num:016x}"},
        "timestamp": format_reader_timestamp(event_time),
        "type": "SIMPLE",
    }
    return TOPIC, json.dumps(event).encode()


def hour_of(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:00", time.gmtime(wall))


def test_reads_delayed_by_an_outage_group_by_event_time_where_they_happened_and_by_receive_time_where_they_arrived(  # noqa: E501
    mosquitto, spark_session, tmp_path
):
    config = quick_config(mosquitto, tmp_path / "data")
    # Start one minute into the next whole hour, so the three hours below are distinct.
    now = time.time()
    offset = math.ceil(now / HOUR) * HOUR + 60.0 - now
    clocks = []

    def run(offset: float, rows: int, event_nums: tuple[int, ...]) -> None:
        """The gateway on a clock `offset` ahead: live reads of `event_nums` as they happen,
        until `rows` have landed."""
        clock = ShiftedClock(offset)
        clocks.append(clock)
        mark = mosquitto.line_count()
        gateway = Supervisor(config, clock, session_factory=lambda: spark_session)
        gateway.start()
        try:
            assert mosquitto.wait_for_output(config.identity.subscriptions[0], 15, start=mark)
            live = [read_at(n, clock.wall()) for n in event_nums]
            publish_all(mosquitto.host, mosquitto.port, live)
            assert gateway.wait_for_landed(rows, timeout=60)
        finally:
            gateway.stop()

    try:
        # Hour H: three reads arrive as they happen.
        start = time.time() + offset
        run(offset, 3, (1, 2, 3))
        # The gateway is away; at H:30 the reader reads five tags, which wait in its session.
        during = start + 29 * 60
        publish_all(mosquitto.host, mosquitto.port, [read_at(n, during) for n in range(4, 9)])
        # Two hours later (H+2) the gateway is back: the backlog arrives, then two live reads.
        run(offset + OUTAGE, 7, (9, 10))
    finally:
        for clock in clocks:
            clock.close()

    reads = read_table(spark_session, config.tables_path, READS, READS_SCHEMA)
    view = f"reads_{tmp_path.name.replace('-', '_')}"
    reads.createOrReplaceTempView(view)
    try:

        def by(column: str) -> dict[str, int]:
            rows = spark_session.sql(BY_HOUR.format(column=column, view=view)).collect()
            return {row["hour"]: row["reads"] for row in rows}

        by_event, by_receipt = by("event_time"), by("received_time")
        delays = {
            row["event_num"]: row["delay"]
            for row in reads.selectExpr(
                "event_num",
                "unix_micros(received_time) / 1e6 - unix_micros(event_time) / 1e6 AS delay",
            ).collect()
        }
    finally:
        spark_session.catalog.dropTempView(view)

    hour, back = hour_of(start), hour_of(start + OUTAGE)
    assert by_event == {hour: 8, back: 2}  # the five waited-out reads happened in hour H
    assert by_receipt == {hour: 3, back: 7}  # ... and arrived in hour H+2
    # The backlog's delay is the rest of the outage; the live reads' a moment.
    assert all(OUTAGE - 30 * 60 - 60 < delays[n] < OUTAGE for n in range(4, 9)), delays
    assert all(abs(delays[n]) < 60 for n in (1, 2, 3, 9, 10)), delays
