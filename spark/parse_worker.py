"""ParseWorker: a batch prepared in a process of its own, so that parsing leaves the daemon's GIL.

The daemon is one Python process. Its intake (paho, the inbound ledger's commits, the acks) and
the Spark writer's parsing shared one interpreter lock: py-spy put the writer's parsing at 23-28 %
of the GIL's samples at the ingest ceiling, and at 88 % with batched payloads, while the second
core sat with the JVM waiting for its next job. Here the parsing runs in a child process on the
other core: the writer hands a batch's ledger records over (`submit`), writes the batch before
it to Spark meanwhile (actors/writer.py, the pipeline), and takes back a `PreparedBatch`: the
tables, and the per-read accounting that is pure work on them too (the readers' event-number
counters, spark.gaps, and their health, spark.reader_health), counted on from the states
committed with the batch before, or from those after the batch the child prepared before it.

`prepare_batch` is that work; the writer calls it itself when it has no worker, so rows,
dead-letter reasons and counters cannot differ between the two: tests/spark/test_parse_worker.py
runs the fuzz corpus and the real-shape payloads through both and compares.

A batch of 1 MiB of payloads or more (batched FX9600 arrays, a backlog after an outage) is built
in parts at once: the child starts `helpers` processes of its own (`python -m spark.parse_worker
--part`), sends each a run of the records, builds the first run itself and joins the parts
(spark.schema.join_parts: the rows and observations of one build, tested at every split). On a
2-core box the helper, with orjson, took batched-100 from 80,032 to 97,750 reads/s
(docs/pages/benchmarks.md).
A helper that dies is not asked again: the child builds its runs itself and logs an ERROR.

The protocol is a length-prefixed pickle each way between two processes of this program (never
across a trust boundary): a request (the records as columns of plain values, which pickle
several times faster than record objects; the batch id; the options; the states to start
from), a reply (the prepared batch, or the exception raised making it). The child exits when
its stdin closes: when the daemon stops it, and also when the daemon is killed, so no SIGKILL
leaves a parser behind.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, BinaryIO

from persistence.records import LedgerRecord, ReaderCount

if TYPE_CHECKING:
    import pyarrow as pa

    from spark.schema import BatchTables

# spark.schema (pyarrow) is imported where a batch is built: the writer imports this module
# before it starts, and pyarrow takes about a second to import (actors/writer.py).

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!Q")

# A batch of this much or more (payload bytes, plus RECORD_OVERHEAD_BYTES a record) is built in
# parts by the worker and its helpers at once; a smaller one costs more to hand over than the
# parts save (the latency run's batches are far below it, batched payloads' far above).
SPLIT_MIN_BYTES = 1024 * 1024
RECORD_OVERHEAD_BYTES = 200
# How much the helper yields to the daemon's own threads (os.nice: +10 of a possible 19).
HELPER_NICENESS = 10


class ParseWorkerDied(RuntimeError):
    """The child is gone (killed, or out of memory); the batch was not parsed."""


@dataclass(frozen=True)
class BuildOptions:
    """`build_batch`'s keyword arguments other than the records, the batch and the known
    readers: fixed for a writer's life. `idempotency_key` names the read key
    (persistence.keys.READ_KEYS) so that the child looks the function up itself."""

    idempotency_key: str = "payload_hash"
    events_filter: str | None = None
    max_payload_bytes: int = 1024 * 1024
    max_reads: int = 10_000
    management_filters: tuple[str, ...] = ()

    def build(
        self,
        records: Sequence[LedgerRecord],
        batch_id: int,
        known_readers: Collection[str],
        part: bool = False,
    ) -> BatchTables:
        from persistence.keys import READ_KEYS
        from spark.schema import build_batch

        return build_batch(
            records,
            batch_id,
            read_key=READ_KEYS[self.idempotency_key],
            events_filter=self.events_filter,
            max_payload_bytes=self.max_payload_bytes,
            max_reads=self.max_reads,
            management_filters=self.management_filters,
            known_readers=known_readers,
            part=part,
        )


@dataclass(frozen=True)
class PreparedBatch:
    """A batch ready to write: its tables (`observations` emptied: they are in `health`), the
    readers' event-number counters after its reads (None when not asked for) and the health
    of the readers it observed (spark.reader_health.observe_all)."""

    tables: BatchTables
    readers: dict[str, ReaderCount] | None
    health: dict[str, dict]


def prepare_batch(
    records: Sequence[LedgerRecord],
    batch_id: int,
    options: BuildOptions,
    readers: Mapping[str, ReaderCount] | None,
    reader_health: Mapping[str, Mapping[str, object]],
    helpers: Sequence[_Helper] = (),
) -> PreparedBatch:
    """Build the batch's tables (known readers: those of `reader_health`); count its reads on
    `readers` (the counters committed with the last batch), unless that is None; observe its
    messages on `reader_health`. Neither mapping is changed. With `helpers` (in the worker), a
    large batch is built in parts, one here and one in each helper, at the same time."""
    from spark.reader_health import observe_all

    tables = _build(records, batch_id, options, reader_health.keys(), helpers)
    health = observe_all(reader_health, list(tables.observations))
    counted = (
        None if readers is None else count_readers(readers, tables.reads, tables.reader_events)
    )
    return PreparedBatch(replace(tables, observations=()), counted, health)


def _build(
    records: Sequence[LedgerRecord],
    batch_id: int,
    options: BuildOptions,
    known: Collection[str],
    helpers: Sequence[_Helper],
) -> BatchTables:
    """`options.build(records, batch_id, known)`, in parts when helpers can take some: the
    parts (runs of about equal payload bytes) are built at once, here and in the helpers, and
    joined (spark.schema.join_parts: the same tables and observations as one build)."""
    from spark.schema import join_parts

    live = [helper for helper in helpers if helper.alive]
    size = sum(len(r.payload) + RECORD_OVERHEAD_BYTES for r in records)
    if not live or size < SPLIT_MIN_BYTES or len(records) < 2:
        return options.build(records, batch_id, known)
    runs = _runs(records, len(live) + 1, size)
    sent = [(helper, run) for helper, run in zip(live, runs[1:], strict=False)]
    for helper, run in sent:
        helper.send(run, batch_id, options, known)
    try:
        parts: list[BatchTables | Exception | None] = [
            options.build(runs[0], batch_id, known, part=True)
        ]
    except Exception as error:  # raised below, once every helper's reply is read
        parts = [error]
    parts += [helper.receive() for helper, _ in sent]
    for index, built in enumerate(parts):
        if isinstance(built, Exception):
            raise built
        if built is None:  # the helper died: its run is built here
            parts[index] = options.build(runs[index], batch_id, known, part=True)
    return join_parts(parts)


def _runs(records: Sequence[LedgerRecord], count: int, size: int) -> list[Sequence]:
    """`records` cut into `count` consecutive runs of about equal weight (none empty)."""
    cuts, weight, share = [], 0, size / count
    for index, record in enumerate(records):
        weight += len(record.payload) + RECORD_OVERHEAD_BYTES
        if len(cuts) < count - 1 and weight >= share * (len(cuts) + 1) and index + 1 < len(records):
            cuts.append(index + 1)
    bounds = [0, *cuts, len(records)]
    return [records[a:b] for a, b in itertools.pairwise(bounds)]


class _Helper:
    """A child of the worker that builds runs of its batches (`serve_parts`): the worker's
    second core. It ends when its stdin closes, as the worker does when the daemon's closes:
    a killed daemon leaves neither behind. One that died is not asked again; the worker builds
    its runs itself and says so."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-m", __name__, "--part"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        log.info("parse helper started (pid %d)", self._proc.pid)

    @property
    def alive(self) -> bool:
        return self._proc is not None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def send(
        self, records: Sequence[LedgerRecord], batch_id: int, options: BuildOptions, known
    ) -> None:
        if self._proc is not None:
            try:
                _send(self._proc.stdin, (_columns(records), batch_id, options, tuple(known)))
            except OSError as error:
                self._lost(error)

    def receive(self) -> BatchTables | Exception | None:
        """The run's part, or what its build raised; None if the helper died."""
        if self._proc is None:
            return None
        try:
            _, value = _receive(self._proc.stdout)
        except (EOFError, OSError) as error:
            self._lost(error)
            return None
        return value

    def _lost(self, error: Exception) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            code = proc.poll()
            log.error(
                "parse helper (pid %d) is gone (%s, exit status %s): this worker builds its "
                "batches alone from now on",
                proc.pid,
                type(error).__name__,
                code,
            )
            self._end(proc)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self._end(proc)

    @staticmethod
    def _end(proc: subprocess.Popen) -> None:
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def count_readers(
    known: Mapping[str, ReaderCount], reads: pa.Table, reader_events: pa.Table
) -> dict[str, ReaderCount]:
    """The counters of the readers in `reads` after its events, in arrival order (the
    table's row order is the ledger's seq order, then each message's order), with the
    numbered management events of `reader_events` in their places: DESIGN §7.9 takes one
    counter for both kinds, so a heartbeat's number is no gap in the tag events'. Starts from
    `known` (reader -> its counters), which is not changed."""
    from spark.gaps import ReaderCounter

    counters: dict[str, ReaderCounter] = {}
    events = [
        (seq, 0, reader_id, event_num)
        for seq, reader_id, event_num in zip(
            reader_events.column("seq").to_pylist(),
            reader_events.column("reader_id").to_pylist(),
            reader_events.column("event_num").to_pylist(),
            strict=True,
        )
        if event_num is not None
    ]
    if events:
        tags = [
            (seq, 1 + index, reader_id, event_num)
            for index, (seq, reader_id, event_num) in enumerate(
                zip(
                    reads.column("seq").to_pylist(),
                    reads.column("reader_id").to_pylist(),
                    reads.column("event_num").to_pylist(),
                    strict=True,
                )
            )
        ]
        merged = sorted(tags + events, key=lambda row: (row[0], row[1]))
        reader_ids = [row[2] for row in merged]
        event_nums = [row[3] for row in merged]
    else:  # the common case: no management event, the reads as they are
        reader_ids = reads.column("reader_id").to_pylist()
        event_nums = reads.column("event_num").to_pylist()
    for reader_id, event_num in zip(reader_ids, event_nums, strict=True):
        counter = counters.get(reader_id)
        if counter is None:
            before = known.get(reader_id)
            counter = counters[reader_id] = (
                ReaderCounter()
                if before is None
                else ReaderCounter(
                    before.received,
                    before.without_event_num,
                    before.missing,
                    before.resets,
                    before.last_event_num,
                )
            )
        counter.observe(event_num)
    return {
        reader_id: ReaderCount(
            reader_id,
            c.last_event_num,
            c.received,
            c.missing,
            c.resets,
            c.without_event_num,
        )
        for reader_id, c in counters.items()
    }


# LedgerRecord's fields that build_batch reads, in the order of its constructor.
_RECORD_FIELDS = (
    "seq",
    "message_key",
    "topic",
    "payload",
    "qos",
    "received_time",
    "pack_id",
    "dead_reason",
    "expires_at",
    "dead_sink",
)


def _columns(records: Sequence[object]) -> tuple[list, ...]:
    """The records as one list per field (`dead_reason` and the fields after it are optional
    on a record: see spark.schema.LedgerRecord; a payload may be any bytes-like object)."""
    columns = tuple(
        [getattr(r, name, None) for r in records] if i >= 7 else [getattr(r, name) for r in records]
        for i, name in enumerate(_RECORD_FIELDS)
    )
    payloads = columns[3]
    if not all(type(p) is bytes for p in payloads):
        columns[3][:] = [bytes(p) for p in payloads]
    return columns


class ChainBroken(RuntimeError):
    """The worker does not hold the states after the batch a request follows (it restarted
    since): the request must be made again from the committed states."""


@dataclass(frozen=True)
class After:
    """A request's starting states: those after batch `batch_id`, prepared by this worker and
    not yet committed by the writer (a pipelined batch)."""

    batch_id: int


@dataclass(frozen=True)
class Committed:
    """A request's starting states: the ones the writer committed with its last batch.
    `readers` None: the reads are not counted (the writer counts them after its claims)."""

    readers: Mapping[str, ReaderCount] | None
    reader_health: Mapping[str, Mapping[str, object]]


# How many batches' states the child keeps for requests that follow them (After).
_CHAIN_KEPT = 8


class ParseWorker:
    """One child process that prepares batches, in the order they are submitted.

    `submit` hands a batch over and returns at once with a Future (a sender thread writes the
    request, a receiver thread resolves the futures in order), so the caller can write one batch
    to Spark while the child parses the next; `prepare` is submit-and-wait."""

    def __init__(self, options: BuildOptions, helpers: int = 0) -> None:
        self.options = options
        # Processes the child starts to build parts of large batches beside it (`_Helper`).
        self.helpers = helpers
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._waiting: deque[Future] = deque()  # submitted, reply not yet read; in order
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._dead: str | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        """Spawn the child (it imports pyarrow while the caller goes on: about 0.3 s)."""
        self._proc = proc = subprocess.Popen(
            [sys.executable, "-m", __name__, "--helpers", str(self.helpers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._dead = None
        self._threads = [
            threading.Thread(
                target=self._send_requests, args=(proc,), name="parse-worker-send", daemon=True
            ),
            threading.Thread(
                target=self._read_replies, args=(proc,), name="parse-worker-read", daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()
        log.info("parse worker started (pid %d)", proc.pid)

    def submit(
        self, records: Sequence[LedgerRecord], batch_id: int, base: After | Committed
    ) -> Future:
        """A Future of the batch's PreparedBatch, made in the child from `base`; it fails with
        `ParseWorkerDied` if the child goes first, `ChainBroken` if `base` is an After the
        child does not hold, or with what prepare_batch raised in the child."""
        # Pickled here, in the caller's thread: the request holds the states as they are now.
        data = pickle.dumps(
            (_columns(records), batch_id, self.options, base), protocol=pickle.HIGHEST_PROTOCOL
        )
        future: Future = Future()
        with self._lock:
            if self._proc is None or self._dead is not None:
                future.set_exception(ParseWorkerDied(self._dead or self._gone()))
                return future
            self._waiting.append(future)
            self._requests.put(data)
        return future

    def prepare(
        self,
        records: Sequence[LedgerRecord],
        batch_id: int,
        readers: Mapping[str, ReaderCount] | None,
        reader_health: Mapping[str, Mapping[str, object]],
        timeout: float | None = None,
    ) -> PreparedBatch:
        """`prepare_batch(records, batch_id, self.options, readers, reader_health)`, made in the
        child and waited for (TimeoutError past `timeout` seconds); raises as `submit`'s Future
        does."""
        future = self.submit(records, batch_id, Committed(readers, reader_health))
        return future.result(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Close its stdin (it exits), wait, and kill it if it does not. Futures not yet
        resolved fail with ParseWorkerDied."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._requests.put(None)  # the sender closes the child's stdin
        for thread in self._threads:
            thread.join(timeout)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self._fail_waiting(f"the parse worker (pid {proc.pid}) was stopped")
        log.info("parse worker stopped (pid %d, exit status %s)", proc.pid, code)

    def _send_requests(self, proc: subprocess.Popen) -> None:
        while (data := self._requests.get()) is not None:
            try:
                proc.stdin.write(_LENGTH.pack(len(data)))
                proc.stdin.write(data)
                proc.stdin.flush()
            except OSError as error:
                # The child is gone; the receiver fails what waits. Drain the queue until stop.
                log.debug("parse worker request not sent: %r", error)
        try:
            proc.stdin.close()
        except OSError:
            pass

    def _read_replies(self, proc: subprocess.Popen) -> None:
        while True:
            try:
                ok, result = _receive(proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError, ValueError) as error:
                if self._proc is proc:  # not a stop: the child died
                    self._fail_waiting(f"{self._gone(proc)}: {type(error).__name__}: {error}")
                return
            with self._lock:
                future = self._waiting.popleft()
            if ok:
                future.set_result(result)
            else:
                future.set_exception(result)

    def _fail_waiting(self, why: str) -> None:
        with self._lock:
            self._dead = why
            waiting, self._waiting = list(self._waiting), deque()
        for future in waiting:
            future.set_exception(ParseWorkerDied(why))

    def _gone(self, proc: subprocess.Popen | None = None) -> str:
        proc = proc or self._proc
        if proc is None:
            return "the parse worker is not running"
        code = proc.poll()
        if code is None:
            try:
                code = proc.wait(1.0)
            except subprocess.TimeoutExpired:
                return f"the parse worker (pid {proc.pid}) stopped answering"
        return f"the parse worker (pid {proc.pid}) exited with status {code}"


def _send(pipe: BinaryIO, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_LENGTH.pack(len(data)))
    pipe.write(data)
    pipe.flush()


def _receive(pipe: BinaryIO) -> object:
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the pipe closed")
    (size,) = _LENGTH.unpack(head)
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("the pipe closed mid-message")
    return pickle.loads(data)


def serve(requests: BinaryIO, replies: BinaryIO, helpers: Sequence[_Helper] = ()) -> None:
    """The child's loop: a reply per request, until the requests end. It keeps the states after
    each of the last batches it prepared, for the requests that follow them (After)."""
    after: dict[int, tuple[dict | None, dict]] = {}
    while True:
        try:
            columns, batch_id, options, base = _receive(requests)
        except EOFError:
            for helper in helpers:
                helper.close()
            return
        try:
            if isinstance(base, After):
                if base.batch_id not in after:
                    raise ChainBroken(f"no states after batch {base.batch_id} here")
                readers, health = after[base.batch_id]
            else:
                readers, health = base.readers, base.reader_health
            records = [LedgerRecord(*values) for values in zip(*columns, strict=True)]
            prepared = prepare_batch(records, batch_id, options, readers, health, helpers)
            after[batch_id] = (
                None if readers is None else {**readers, **prepared.readers},
                {**health, **prepared.health},
            )
            while len(after) > _CHAIN_KEPT:
                del after[next(iter(after))]
            reply = (True, prepared)
        except Exception as error:  # the parent raises it: the writer decides, as in-process
            reply = (False, _portable(error))
        _send(replies, reply)


def serve_parts(requests: BinaryIO, replies: BinaryIO) -> None:
    """A helper's loop: the part of each run asked for (`_build`), until the requests end."""
    while True:
        try:
            columns, batch_id, options, known = _receive(requests)
        except EOFError:
            return
        try:
            records = [LedgerRecord(*values) for values in zip(*columns, strict=True)]
            reply = (True, options.build(records, batch_id, known, part=True))
        except Exception as error:
            reply = (False, _portable(error))
        _send(replies, reply)


def _portable(error: Exception) -> Exception:
    """`error` if it survives a pickle round trip (an exception whose __init__ takes other
    arguments than its message does not), else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("FXGATE_PARSE_WORKER_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s parse-worker %(name)s: %(message)s",
    )
    # The replies own stdout: a stray print would corrupt the stream, so stdout goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # Imported now, not at the first batch: pyarrow and the parser take about 0.4 s of CPU to
    # import, which the first batch after a start (a backlog, often) would otherwise wait for.
    # The writer starts the worker before its Spark session: this runs while the JVM starts.
    import spark.reader_health
    import spark.schema  # noqa: F401

    arguments = sys.argv[1:]
    if arguments == ["--part"]:
        # The helper runs on what the daemon leaves: its intake (paho, the ledger, the acks)
        # comes first whenever both want the second core.
        os.nice(HELPER_NICENESS)
        serve_parts(sys.stdin.buffer, replies)
        return
    count = int(arguments[1]) if arguments[:1] == ["--helpers"] else 0
    serve(sys.stdin.buffer, replies, [_Helper() for _ in range(count)])


if __name__ == "__main__":
    # Run as `python -m spark.parse_worker`, this file is `__main__`: what it pickles must name
    # the classes of the module the daemon imports, so the loop runs from there.
    from spark.parse_worker import main as imported_main

    imported_main()
