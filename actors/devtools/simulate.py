"""An FX9600 simulator: realistic tag data events published to a real broker.

Used by `fxgate simulate`, the demo and the end-to-end tests. What it records is the test oracle:
a message counts as published only once the broker acknowledged it (PUBACK, or PUBCOMP for QoS 2,
with a reason code below 0x80), and the manifest it writes lists exactly those messages with their
idempotency keys, so a checker in another process can demand every one of their reads in the
`reads` table, once.

A simulated reader can also publish management events (heartbeats and GPI pin changes) on its
management topic, as the IoT Connector's management-events interface does. Its heartbeat's
reader-gateway counters are honest: `numDataMessagesTxed` is the number of data messages the
broker acknowledged to it so far (the heartbeat waits for the outstanding acks first), so a
gateway that received everything reconciles to exactly 0, and one behind a broker that dropped
messages is short by exactly what was dropped.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from actors.clock import RealClock
from persistence.keys import message_key, read_id

log = logging.getLogger(__name__)

DEFAULT_TOPIC_TEMPLATE = "zebra/fx/{reader}/reads"
DEFAULT_MANAGEMENT_TOPIC_TEMPLATE = "zebra/fx/{reader}/mgmt"

# FCC Part 15.247 hop table of the FX9600 in the US: 50 channels, 902.75-927.25 MHz, 500 kHz apart.
FCC_CHANNELS_MHZ: tuple[float, ...] = tuple(902.75 + 0.5 * i for i in range(50))
ANTENNAS = (1, 2, 3, 4)
PEAK_RSSI_RANGE = (-75, -35)
EPC_PREFIX = "e280"
EPC_HEX_DIGITS = 24

# paho's own limit: its in-flight scan is quadratic, so raising this makes it slower (DESIGN §4).
MAX_INFLIGHT = 20


class PacingClock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


def reader_names(n: int) -> list[str]:
    """`fx9600-01`, `fx9600-02`, ... (two digits at least: names sort in reader order to 99)."""
    return [f"fx9600-{i:02d}" for i in range(1, n + 1)]


class TagEventGenerator:
    """Tag data events of one reader, as the Zebra IoT Connector formats them.

    Deterministic for a seed and a wall clock: the same (reader, seed, wall) give the same bytes.
    """

    def __init__(
        self,
        reader: str,
        seed: int = 0,
        wall: Callable[[], float] | None = None,
        population: int = 500,
    ) -> None:
        self.reader = reader
        # A str seed is hashed with SHA-512 by `random`: stable across processes, unlike hash().
        self._rng = random.Random(f"{seed}:{reader}")
        # Looked up at each call, not bound here, so that freezegun can freeze it in tests.
        self._wall = wall if wall is not None else (lambda: time.time())  # noqa: PLW0108
        pad = EPC_HEX_DIGITS - len(EPC_PREFIX)
        self.epcs: tuple[str, ...] = tuple(
            EPC_PREFIX + format(self._rng.getrandbits(4 * pad), f"0{pad}x")
            for _ in range(population)
        )
        self._event_num = 0

    @property
    def event_num(self) -> int:
        """The eventNum of the last event made (0 before the first)."""
        return self._event_num

    def take_event_num(self) -> int:
        """The next eventNum, for an event of another kind that shares the reader's counter."""
        self._event_num += 1
        return self._event_num

    def next_event(self) -> dict:
        rng = self._rng
        event_num = self.take_event_num()
        return {
            "data": {
                "eventNum": event_num,
                "format": "epc",
                "idHex": rng.choice(self.epcs),
                "antenna": rng.choice(ANTENNAS),
                "peakRssi": rng.randint(*PEAK_RSSI_RANGE),
                "channel": rng.choice(FCC_CHANNELS_MHZ),
                "phase": round(rng.uniform(0.0, 180.0), 1),
                "reads": 1,
            },
            "timestamp": format_reader_timestamp(self._wall()),
            "type": "SIMPLE",
        }

    def next_payload(self, batch: int = 1) -> bytes:
        """One event as a JSON object, or `batch` > 1 events as a JSON array (batched mode)."""
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        doc = self.next_event() if batch == 1 else [self.next_event() for _ in range(batch)]
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")


@dataclass
class ReaderGatewayCounters:
    """A simulated reader gateway's data-message counters, as its heartbeat reports them:
    `received` data messages made by its radio, `sent` acknowledged by the broker, and
    `dropped` refused or never acknowledged. Keep one per reader across `simulate` calls to
    go on counting (a new one starts at 0, as after a reboot)."""

    received: int = 0
    sent: int = 0
    dropped: int = 0


class ManagementEventGenerator:
    """Management events of one reader in the IoT Connector's envelope.

    Whether a real FX9600 numbers its management events on its tag events' counter is not known
    here; DESIGN §7.9 counts an eventNum as present in `reads` or `reader_events`, which assumes
    one counter, and so does the simulator when given `event_numbers` (the tag generator's
    `take_event_num`); without it they have a counter of their own."""

    def __init__(
        self,
        reader: str,
        wall: Callable[[], float] | None = None,
        event_numbers: Callable[[], int] | None = None,
    ) -> None:
        self.reader = reader
        self._wall = wall if wall is not None else (lambda: time.time())  # noqa: PLW0108
        self._own_count = 0
        self._event_numbers = event_numbers or self._own_number
        self._gpi_state = "LOW"

    def _own_number(self) -> int:
        self._own_count += 1
        return self._own_count

    def _envelope(self, kind: str, data: dict) -> bytes:
        doc = {
            "component": "RG",
            "data": data,
            "eventNum": self._event_numbers(),
            "timestamp": format_reader_timestamp(self._wall()),
            "type": kind,
        }
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    def heartbeat(self, counters: ReaderGatewayCounters) -> bytes:
        """A heartbeat whose reader_gateway section carries `counters` the way live readers
        were seen to send them (`dataPathStatistics`, one data path)."""
        return self._envelope(
            "heartbeat",
            {
                "radio_control": {
                    "numDataMessagesTxed": counters.received,
                    "radioActivity": "active",
                    "radioConnection": "connected",
                },
                "reader_gateway": {
                    "dataPathStatistics": [
                        {
                            "numDataMessagesDropped": counters.dropped,
                            "numDataMessagesRetained": 0,
                            "numDataMessagesRxed": counters.received,
                            "numDataMessagesTxed": counters.sent,
                        }
                    ],
                    "numErrors": 0,
                    "numWarnings": 0,
                },
                "system": {"hostName": self.reader},
                "userapps": [],
            },
        )

    def gpi(self, pin: int = 1) -> bytes:
        """A GPI pin change (the pin toggles at each call)."""
        self._gpi_state = "HIGH" if self._gpi_state == "LOW" else "LOW"
        return self._envelope("gpi", {"pin": pin, "state": self._gpi_state})


def format_reader_timestamp(epoch_seconds: float) -> str:
    """The FX9600's own timestamp form: milliseconds and a `+0000` offset."""
    moment = datetime.fromtimestamp(epoch_seconds, tz=UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}+0000"


@dataclass
class PublishedRecord:
    topic: str
    message_key: str
    reads: int
    management: bool = False  # a management event (0 reads), not in `published`


@dataclass
class SimulationResult:
    published: list[PublishedRecord]
    """Acknowledged messages, in publish order (so per reader in order)."""
    failed: int
    seconds: float
    failed_records: list[PublishedRecord] = field(default_factory=list)
    """Messages refused or never acknowledged: they may or may not have reached the broker, so a
    checker must neither require their reads nor count them as foreign rows."""
    management: list[PublishedRecord] = field(default_factory=list)
    """Management events acknowledged (heartbeats, GPI), in publish order."""


class Pacer:
    """Message `i` may go at `start + i / rate` on the injected clock; rate <= 0 never waits.

    Waits on an Event with a timeout rather than sleeping, and also asks the clock (when it has
    `call_later`) to wake it at the due time: with a `SimulatedClock` that is the only way time
    moves, so a test advances the clock and the pacer goes on at once.
    """

    def __init__(self, clock: PacingClock, rate: float) -> None:
        self._clock = clock
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._start = clock.monotonic()
        self._wake = threading.Event()

    def due(self, index: int) -> float:
        return self._start + index * self._interval

    def wait_turn(self, index: int) -> None:
        if not self._interval:
            return
        due = self.due(index)
        call_later = getattr(self._clock, "call_later", None)
        while (delay := due - self._clock.monotonic()) > 0:
            handle = call_later(delay, self._wake.set) if call_later is not None else None
            self._wake.wait(delay)
            if handle is not None:
                handle.cancel()
            self._wake.clear()


class _ReaderPublisher:
    """One reader's paho client and the window of its unacknowledged messages.

    We own the flow control rather than letting paho queue: paho's queue scan is quadratic and it
    ignores the broker's Receive Maximum (DESIGN §4), so at most `window` messages are handed to it.
    Callbacks only settle bookkeeping under `_lock`; paho is never called while `_lock` is held.
    """

    def __init__(self, reader: str, client_id: str, qos: int) -> None:
        self.reader = reader
        self.qos = qos
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self.client.max_inflight_messages_set(MAX_INFLIGHT)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connect_reason: ReasonCode | None = None
        self.receive_maximum = 65535
        self._window: threading.BoundedSemaphore | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[int, PublishedRecord]] = {}
        self._early: dict[int, bool] = {}
        self._outstanding = 0
        self._idle = threading.Condition(self._lock)
        self.acked: list[tuple[int, PublishedRecord]] = []
        self.failed: list[tuple[int, PublishedRecord]] = []

    # -- paho callbacks (network thread): translate and settle, nothing else ---------------------

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connect_reason = reason_code
        if properties is not None and hasattr(properties, "ReceiveMaximum"):
            self.receive_maximum = properties.ReceiveMaximum
        self.disconnected.clear()
        self.connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connected.clear()
        self.disconnected.set()

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        ok = not reason_code.is_failure
        with self._lock:
            entry = self._pending.pop(mid, None)
            if entry is None:
                # The ack overtook publish()'s return to our thread: settle it when it registers.
                self._early[mid] = ok
                return
            self._settle(entry, ok)

    # -- publishing thread ----------------------------------------------------------------------

    def start(self, host: str, port: int, timeout: float) -> None:
        self.client.connect(host, port, keepalive=60, clean_start=True)
        self.client.loop_start()
        if not self.connected.wait(timeout):
            raise TimeoutError(f"{self.reader}: no CONNACK from {host}:{port} within {timeout} s")
        assert self.connect_reason is not None
        if self.connect_reason.is_failure:
            raise ConnectionError(
                f"{self.reader}: broker refused connection: {self.connect_reason}"
            )
        window = max(1, min(MAX_INFLIGHT, self.receive_maximum))
        self._window = threading.BoundedSemaphore(window)
        log.info(
            "simulated reader %s connected to %s:%d (window %d)", self.reader, host, port, window
        )

    def publish(self, seq: int, record: PublishedRecord, payload: bytes, timeout: float) -> None:
        assert self._window is not None
        if not self._window.acquire(timeout=timeout):
            raise TimeoutError(
                f"{self.reader}: no ack freed the in-flight window within {timeout} s "
                f"({self._outstanding} unacknowledged)"
            )
        with self._lock:
            self._outstanding += 1
        try:
            info = self.client.publish(record.topic, payload, qos=self.qos)
        except Exception:
            log.exception("%s: publish of %s raised", self.reader, record.message_key)
            with self._lock:
                self._settle((seq, record), ok=False)
            return
        with self._lock:
            if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE or (
                self.qos == 0 and info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS
            ):
                # Refused by paho before it took the message, or QoS 0 with no connection (paho
                # keeps no QoS 0 session): it will never be sent.
                self._settle((seq, record), ok=False)
            elif info.mid in self._early:
                self._settle((seq, record), self._early.pop(info.mid))
            else:
                # Any other rc (e.g. NO_CONN) leaves the message in paho's session: it goes out,
                # DUP-flagged, after the automatic reconnect, and its ack settles it then.
                self._pending[info.mid] = (seq, record)

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout)

    def outstanding(self) -> int:
        with self._lock:
            return self._outstanding

    def stop(self, timeout: float = 5.0) -> None:
        try:
            if self.client.is_connected():
                self.client.disconnect()
                self.disconnected.wait(timeout)
        finally:
            self.client.loop_stop()

    def _settle(self, entry: tuple[int, PublishedRecord], ok: bool) -> None:
        # Caller holds self._lock.
        (self.acked if ok else self.failed).append(entry)
        self._outstanding -= 1
        if self._window is not None:
            self._window.release()
        if self._outstanding == 0:
            self._idle.notify_all()


def simulate(
    host: str,
    port: int,
    readers: int,
    rate: float,
    count: int,
    qos: int = 1,
    batch: int = 1,
    topic_template: str = DEFAULT_TOPIC_TEMPLATE,
    seed: int = 0,
    clock: PacingClock | None = None,
    client_id_prefix: str = "fx-sim",
    progress: Callable[[int], None] | None = None,
    *,
    ack_timeout: float = 30.0,
    connect_timeout: float = 10.0,
    heartbeat_every: int = 0,
    gpi_every: int = 0,
    management_topic_template: str = DEFAULT_MANAGEMENT_TOPIC_TEMPLATE,
    counters: dict[str, ReaderGatewayCounters] | None = None,
) -> SimulationResult:
    """Publish `count` messages per reader, readers interleaved, `rate` messages/s in total.

    `rate` <= 0 publishes as fast as the in-flight window allows. `progress(n)` is called on this
    thread after each message is handed to paho, with the number handed so far. Raises
    TimeoutError (with counts) when acks stop coming for `ack_timeout` real seconds.

    `heartbeat_every` > 0: each reader also publishes a heartbeat on its management topic
    before its first data message, after every `heartbeat_every` of them and after its last,
    each once its data messages are acknowledged (the counters are then exact); `gpi_every` > 0
    a GPI change after every that many. `counters` (reader -> ReaderGatewayCounters, filled in
    for readers missing from it) carries a reader's counters over several calls.
    """
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, got {qos}")
    if readers < 1 or count < 0:
        raise ValueError(f"need readers >= 1 and count >= 0, got {readers} and {count}")
    own_clock = RealClock() if clock is None else None
    pacing_clock: PacingClock = clock if clock is not None else own_clock

    names = reader_names(readers)
    generators = [TagEventGenerator(name, seed=seed, wall=pacing_clock.wall) for name in names]
    topics = [topic_template.format(reader=name) for name in names]
    counters = {} if counters is None else counters
    for name in names:
        counters.setdefault(name, ReaderGatewayCounters())
    # One eventNum counter per reader for both kinds of event (DESIGN §7.9).
    management = {
        generator.reader: (
            ManagementEventGenerator(
                generator.reader, wall=pacing_clock.wall, event_numbers=generator.take_event_num
            ),
            management_topic_template.format(reader=generator.reader),
        )
        for generator in generators
    }
    publishers = [_ReaderPublisher(name, f"{client_id_prefix}-{name}", qos) for name in names]
    started: list[_ReaderPublisher] = []
    try:
        for publisher in publishers:
            started.append(publisher)
            publisher.start(host, port, connect_timeout)

        began = pacing_clock.monotonic()
        pacer = Pacer(pacing_clock, rate)
        sent = 0
        order = 0  # publish order of every message, management events included

        def publish_management(publisher: _ReaderPublisher, payload: bytes) -> None:
            nonlocal order
            topic = management[publisher.reader][1]
            record = PublishedRecord(topic, message_key(topic, payload), 0, management=True)
            publisher.publish(order, record, payload, ack_timeout)
            order += 1

        def heartbeat(publisher: _ReaderPublisher) -> None:
            if not publisher.wait_idle(ack_timeout):
                raise TimeoutError(f"{publisher.reader}: acks missing before its heartbeat")
            mine = counters[publisher.reader]
            done = sum(1 for _, r in publisher.acked if not r.management)
            refused = sum(1 for _, r in publisher.failed if not r.management)
            # What this call's publisher settled, on top of what earlier calls counted.
            mine.sent, mine.dropped = mine_base[publisher.reader]
            mine.sent += done
            mine.dropped += refused
            publish_management(publisher, management[publisher.reader][0].heartbeat(mine))

        mine_base = {name: (c.sent, c.dropped) for name, c in counters.items()}
        if heartbeat_every > 0:
            for publisher in publishers:
                heartbeat(publisher)
        for i in range(count):
            for generator, topic, publisher in zip(generators, topics, publishers, strict=True):
                pacer.wait_turn(sent)
                payload = generator.next_payload(batch)
                record = PublishedRecord(topic, message_key(topic, payload), batch)
                counters[publisher.reader].received += 1
                publisher.publish(order, record, payload, ack_timeout)
                order += 1
                sent += 1
                if progress is not None:
                    progress(sent)
                if gpi_every > 0 and (i + 1) % gpi_every == 0:
                    publish_management(publisher, management[publisher.reader][0].gpi())
                if heartbeat_every > 0 and (i + 1) % heartbeat_every == 0 and i + 1 < count:
                    heartbeat(publisher)
        if heartbeat_every > 0:
            for publisher in publishers:
                heartbeat(publisher)

        for publisher in publishers:
            if not publisher.wait_idle(ack_timeout):
                acked = sum(len(p.acked) for p in publishers)
                failed = sum(len(p.failed) for p in publishers)
                missing = sum(p.outstanding() for p in publishers)
                raise TimeoutError(
                    f"acks missing after {ack_timeout} s: {sent} sent, {acked} acked, "
                    f"{failed} failed, {missing} unacknowledged"
                )
        seconds = pacing_clock.monotonic() - began
    finally:
        for publisher in started:
            publisher.stop()
        if own_clock is not None:
            own_clock.close()  # only the clock made here; a caller's clock stays the caller's

    acked = [record for _, record in sorted(e for p in publishers for e in p.acked)]
    published = [record for record in acked if not record.management]
    failed_records = [record for _, record in sorted(e for p in publishers for e in p.failed)]
    log.info(
        "simulated %d readers: %d messages acknowledged, %d failed, in %.2f s",
        readers,
        len(published),
        len(failed_records),
        seconds,
    )
    if heartbeat_every <= 0:
        # Without heartbeats the counters still follow what was acknowledged.
        for publisher in publishers:
            mine = counters[publisher.reader]
            mine.sent += sum(1 for _, r in publisher.acked if not r.management)
            mine.dropped += sum(1 for _, r in publisher.failed if not r.management)
    return SimulationResult(
        published,
        len(failed_records),
        seconds,
        failed_records,
        [record for record in acked if record.management],
    )


def expected_read_ids(published: Iterable[PublishedRecord]) -> set[str]:
    """Every `message_id` the `reads` table must hold for these acknowledged messages."""
    return {read_id(r.message_key, i) for r in published for i in range(r.reads)}


def write_manifest(path: str | os.PathLike[str], result: SimulationResult) -> None:
    """The acknowledged messages as JSON lines, written atomically (a checker never sees half)."""
    target = Path(path)
    temporary = target.with_name(target.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as out:
        for record in result.published:
            line = {"topic": record.topic, "message_key": record.message_key, "reads": record.reads}
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, target)


def read_manifest(path: str | os.PathLike[str]) -> list[PublishedRecord]:
    with Path(path).open(encoding="utf-8") as lines:
        return [
            PublishedRecord(doc["topic"], doc["message_key"], int(doc["reads"]))
            for doc in map(json.loads, filter(str.strip, lines))
        ]
