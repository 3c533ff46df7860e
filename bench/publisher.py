"""The latency benchmark's load generator: FX9600 tag events as QoS 1 PUBLISHes at a steady rate,
written straight onto the socket. Only `bench.latency` uses it.

    python -m bench.publisher HOST PORT OUT --readers fx9600-01,fx9600-02 --rate R --count N
                              [--seed S] [--client-id-prefix P] [--window W]

Why not the project's simulator (`actors.devtools.simulate`, paho): it topped out at 5-8k msg/s on
this 2-vCPU machine while fxgate ingests ~20k msg/s, and every core the load generator burns is
taken from the gateway being measured. paho spends tens of microseconds of Python per QoS 1 message
(packet objects, its in-flight scan, a lock per call); here a message costs a template fill, a
sha256 and a slice of one `sendall` per connection per tick, so the bench can offer 90 % of the
ceiling and still leave the CPU to fxgate, mosquitto and the JVM.

What is kept from the simulator: the payloads are `TagEventGenerator` events (same fields, same
JSON form, one read per message); per reader only `eventNum` counts up and `timestamp` is the
send time, while tag, antenna, RSSI, channel and phase cycle through a pool the generator made.
A message counts as published only once its PUBACK came back, as in the simulator.

Protocol: MQTT 3.1.1, one connection per reader (`<prefix>-<reader>`), clean session, keep-alive
0 (off: a sample lasts under a minute, so no PINGREQ timer is needed), QoS 1. At most `window`
messages unacknowledged per connection; past that the pacer waits for PUBACKs and counts a stall.

The bench drives it over stdin/stdout, one JSON line per step (`PUB ` prefix):

    -> {"ready": ...}                connected (CONNACK accepted) on every connection
    <- go
    -> {"done": ..., summary}        every message sent and acknowledged, or {"error": ...}
    <- dump
    -> {"written": OUT}

`dump` comes once fxgate has landed every row: writing the file (one `<message_key> <time>`
line per message) then takes no CPU from the sample. The publish time is the wall clock right
after the `sendall` that carried the message returned: the moment the kernel had it, as the
simulator's was the moment paho took it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from actors.devtools.simulate import (
    DEFAULT_TOPIC_TEMPLATE,
    TagEventGenerator,
    format_reader_timestamp,
)
from persistence.keys import message_key

PREFIX = "PUB "
# Messages due are sent at most this often: at 18k msg/s a tick carries ~36 of them, and the
# process wakes 500 times a second instead of once per message.
TICK_SECONDS = 0.002
# Distinct (tag, antenna, RSSI, channel, phase) combinations per reader.
POOL = 512
# Unacknowledged messages per connection. MQTT 3.1.1 has no Receive Maximum and mosquitto takes
# a 3.1.1 client's QoS 1 PUBLISHes as fast as it reads them, so the window only bounds how far
# the publisher runs ahead of a broker that falls behind (~2 s at 4.5k msg/s per reader): a
# real reader keeps publishing on its own schedule then too, and the wait shows in the latency
# and in the PUBACK times reported. Far below 65535, so a packet id is never reused in flight.
DEFAULT_WINDOW = 8000
# Packet ids are 16-bit and never 0 (MQTT 3.1.1 §2.3.1).
MAX_PACKET_ID = 65535
ACK_TIMEOUT = 60.0


def _remaining_length(n: int) -> bytes:
    """MQTT's variable-length integer (MQTT 3.1.1 §2.2.3)."""
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("!H", len(raw)) + raw


def connect_packet(client_id: str) -> bytes:
    # Protocol name, level 4 (3.1.1), flags 0x02 (clean session), keep-alive 0 (off).
    body = _string("MQTT") + bytes((4, 0x02, 0, 0)) + _string(client_id)
    return b"\x10" + _remaining_length(len(body)) + body


class Templates:
    """One reader's payloads: generator events with `eventNum` and `timestamp` left open."""

    def __init__(self, reader: str, seed: int) -> None:
        generator = TagEventGenerator(reader, seed=seed)
        self.forms: list[bytes] = []
        for _ in range(POOL):
            event = generator.next_event()
            data = dict(event["data"])
            del data["eventNum"]
            # The generator's key order, eventNum first: the bytes match what it would send.
            rest = json.dumps(data, separators=(",", ":"))[1:-1].replace("%", "%%")
            self.forms.append(
                b'{"data":{"eventNum":%%d,%s},"timestamp":"%%s","type":"%s"}'
                % (rest.encode(), event["type"].encode())
            )
        self.event_num = 0

    def next(self, stamp: bytes) -> bytes:
        self.event_num += 1
        return self.forms[self.event_num % POOL] % (self.event_num, stamp)


class Connection:
    """One reader's socket: the PUBLISH packets it is owed and the PUBACKs it got back."""

    def __init__(self, host: str, port: int, reader: str, client_id: str, seed: int) -> None:
        self.reader = reader
        self.topic = DEFAULT_TOPIC_TEMPLATE.format(reader=reader)
        self._topic_field = _string(self.topic)
        self.templates = Templates(reader, seed)
        self.sock = socket.create_connection((host, port), timeout=10)
        # Ticks are already batched; Nagle would only hold the last packet of each back.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(connect_packet(client_id))
        connack = self._read_exactly(4)
        if connack[0] != 0x20 or connack[3] != 0:
            raise ConnectionError(f"{reader}: CONNACK refused: {connack.hex()}")
        self.sock.settimeout(None)
        self.pending: dict[int, int] = {}  # packet id -> message index
        self._next_id = 0
        self._buffer = b""
        self.chunk: list[bytes] = []
        self.chunk_indexes: list[int] = []

    def _read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            part = self.sock.recv(n - len(data))
            if not part:
                raise ConnectionError(f"{self.reader}: broker closed the connection")
            data += part
        return data

    def room(self, window: int) -> int:
        # `pending` already holds the packets queued in `chunk`.
        return window - len(self.pending)

    def add(self, index: int, stamp: bytes) -> str:
        """Queue message `index` for this tick's write; returns its idempotency key."""
        payload = self.templates.next(stamp)
        self._next_id = self._next_id % MAX_PACKET_ID + 1
        if self._next_id in self.pending:
            raise RuntimeError(f"{self.reader}: packet id {self._next_id} still unacknowledged")
        body = self._topic_field + struct.pack("!H", self._next_id) + payload
        # 0x32: PUBLISH, QoS 1, no DUP, no retain.
        self.chunk.append(b"\x32" + _remaining_length(len(body)) + body)
        self.chunk_indexes.append(index)
        self.pending[self._next_id] = index
        return message_key(self.topic, payload)

    def flush(self) -> list[int]:
        """Write this tick's packets; returns the indexes of the messages written."""
        if not self.chunk:
            return []
        self.sock.sendall(b"".join(self.chunk))
        written = self.chunk_indexes
        self.chunk, self.chunk_indexes = [], []
        return written

    def read_acks(
        self, acked: bytearray, sent_at: list[float], lags: list[float], block: float | None = None
    ) -> int:
        """Take every PUBACK the kernel holds (waiting up to `block` s for the first); note each
        settled message's send -> PUBACK time in `lags`; returns how many were settled."""
        if block is not None:
            ready, _, _ = select.select([self.sock], [], [], block)
            if not ready:
                return 0
        try:
            data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return 0
        if not data:
            raise ConnectionError(f"{self.reader}: broker closed the connection")
        now = time.time()
        buffer = self._buffer + data
        settled = 0
        at = 0
        # PUBACK is 0x40 0x02 <id>: the only packet a 3.1.1 broker sends a keep-alive-0
        # publisher after CONNACK; anything else is a protocol surprise worth stopping on.
        while len(buffer) - at >= 4:
            if buffer[at] != 0x40 or buffer[at + 1] != 0x02:
                raise ConnectionError(f"{self.reader}: unexpected packet {buffer[at:].hex()[:16]}")
            (packet_id,) = struct.unpack_from("!H", buffer, at + 2)
            index = self.pending.pop(packet_id, None)
            if index is not None:
                acked[index] = 1
                lags.append(now - sent_at[index])
                settled += 1
            at += 4
        self._buffer = buffer[at:]
        return settled

    def close(self) -> None:
        try:
            self.sock.sendall(b"\xe0\x00")  # DISCONNECT: a clean end, no will
        except OSError:
            pass
        self.sock.close()


def run(
    connections: Sequence[Connection], rate: float, count: int, window: int, deadline: float
) -> dict:
    """Publish `count` messages per connection, connections interleaved, `rate` msg/s in all."""
    total = count * len(connections)
    keys: list[str] = [""] * total
    times: list[float] = [0.0] * total
    acked = bytearray(total)
    n = len(connections)
    stalls = 0
    lags: list[float] = []
    puback: list[float] = []
    ticks = 0
    start = time.monotonic()
    sent = 0
    while sent < total:
        now = time.monotonic()
        due = min(total, int((now - start) * rate) + 1)
        # How late the pacer is for the first message of this tick: the publisher keeping up.
        lags.append(now - (start + sent / rate))
        ticks += 1
        stamp = format_reader_timestamp(time.time()).encode()
        while sent < due:
            connection = connections[sent % n]
            if connection.room(window) <= 0:
                # The window is full: write what is queued, then wait for PUBACKs.
                _flush(connections, times)
                stalls += 1
                while connection.room(window) <= 0:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{connection.reader}: no PUBACK within the deadline")
                    connection.read_acks(acked, times, puback, block=0.05)
            keys[sent] = connection.add(sent, stamp)
            sent += 1
        _flush(connections, times)
        for connection in connections:
            connection.read_acks(acked, times, puback)
        if sent < total:
            # Pacing: wait for the next message's due time, but at least a tick.
            wake = max(start + sent / rate, now + TICK_SECONDS)
            pause = wake - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    publish_seconds = time.monotonic() - start
    for connection in connections:
        while connection.pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{connection.reader}: {len(connection.pending)} PUBACKs missing"
                )
            connection.read_acks(acked, times, puback, block=0.1)
    lags.sort()
    puback.sort()
    return {
        "keys": keys,
        "times": times,
        "summary": {
            "messages": total,
            "acked": sum(acked),
            "first_send": times[0] if total else None,
            "last_send": times[-1] if total else None,
            "publish_seconds": round(publish_seconds, 4),
            "rate_requested": rate,
            "rate_achieved": (total - 1) / (times[-1] - times[0])
            if total > 1 and times[-1] > times[0]
            else None,
            "pacer_lag_p99_seconds": round(lags[int(0.99 * (len(lags) - 1))], 4) if lags else 0,
            "pacer_lag_max_seconds": round(lags[-1], 4) if lags else 0,
            "window_stalls": stalls,
            # Send -> PUBACK: how far mosquitto was behind the publisher.
            "puback_p50_seconds": round(puback[len(puback) // 2], 4) if puback else None,
            "puback_p99_seconds": round(puback[int(0.99 * (len(puback) - 1))], 4)
            if puback
            else None,
            "ticks": ticks,
        },
    }


def _flush(connections: Sequence[Connection], times: list[float]) -> None:
    for connection in connections:
        written = connection.flush()
        if written:
            at = time.time()
            for index in written:
                times[index] = at


def _say(doc: dict) -> None:
    print(PREFIX + json.dumps(doc), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.publisher")
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--readers", required=True, help="comma-separated reader names")
    parser.add_argument("--rate", type=float, required=True, help="msg/s over all its readers")
    parser.add_argument("--count", type=int, required=True, help="messages per reader")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--client-id-prefix", default="bench-publisher")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    args = parser.parse_args(argv)
    if not 0 < args.window < MAX_PACKET_ID:
        parser.error(f"--window must be in 1..{MAX_PACKET_ID - 1}")
    connections: list[Connection] = []
    try:
        for reader in args.readers.split(","):
            connections.append(
                Connection(
                    args.host, args.port, reader, f"{args.client_id_prefix}-{reader}", args.seed
                )
            )
        _say({"ready": True, "pid": os.getpid(), "readers": len(connections)})
        if sys.stdin.readline().strip() != "go":
            return 2
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        outcome = run(
            connections, args.rate, args.count, args.window, time.monotonic() + ACK_TIMEOUT * 5
        )
        after = resource.getrusage(resource.RUSAGE_SELF)
        summary = outcome["summary"]
        summary["cpu_seconds"] = round(
            after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime, 3
        )
        _say({"done": True, **summary})
    except (OSError, RuntimeError, TimeoutError) as error:
        _say({"error": f"{type(error).__name__}: {error}"})
        return 1
    finally:
        for connection in connections:
            connection.close()
    if sys.stdin.readline().strip() != "dump":
        return 2
    with args.out.open("w") as out:
        out.writelines(
            f"{key} {at:.6f}\n" for key, at in zip(outcome["keys"], outcome["times"], strict=True)
        )
    _say({"written": str(args.out)})
    return 0


# -- the bench's side -------------------------------------------------------------------------


class PublisherProcesses:
    """Several `bench.publisher` processes, each with its share of the readers and of the rate.

    Several, not one: a single process is one GIL on one core, and on a busy 2-vCPU machine a
    process that is descheduled falls behind its schedule; two processes can run on both cores.
    Every process is ended by its PID in `close` (use it in a `finally`)."""

    def __init__(
        self,
        host: str,
        port: int,
        directory: Path,
        readers: Sequence[str],
        processes: int,
        rate: float,
        count: int,
        seed: int,
        client_id_prefix: str,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        shares = [list(readers[i::processes]) for i in range(processes)]
        shares = [share for share in shares if share]
        repo = Path(__file__).resolve().parent.parent
        self.files: list[Path] = []
        self.procs: list[subprocess.Popen[str]] = []
        self.summaries: list[dict] = []
        for i, share in enumerate(shares):
            out = directory / f"publisher-{i}.txt"
            self.files.append(out)
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.publisher",
                        host,
                        str(port),
                        str(out),
                        "--readers",
                        ",".join(share),
                        "--rate",
                        repr(rate * len(share) / len(readers)),
                        "--count",
                        str(count),
                        "--seed",
                        str(seed),
                        "--client-id-prefix",
                        client_id_prefix,
                    ],
                    cwd=repo,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )

    def _tell(self, word: str) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(word + "\n")
            proc.stdin.flush()

    def _hear(self, proc: subprocess.Popen[str], key: str) -> dict:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(PREFIX):
                doc = json.loads(line[len(PREFIX) :])
                if key in doc:
                    return doc
                raise RuntimeError(f"publisher {proc.pid}: {doc.get('error', doc)}")
        raise RuntimeError(f"publisher {proc.pid} exited ({proc.wait()}) before saying {key!r}")

    def wait_ready(self) -> None:
        for proc in self.procs:
            self._hear(proc, "ready")

    def go(self) -> None:
        self._tell("go")

    def wait_done(self) -> list[dict]:
        self.summaries = [self._hear(proc, "done") for proc in self.procs]
        return self.summaries

    def collect(self) -> tuple[list[str], list[float]]:
        """Every message's key and publish time (the files are written only now, see `dump`)."""
        self._tell("dump")
        keys: list[str] = []
        times: list[float] = []
        for proc, path in zip(self.procs, self.files, strict=True):
            self._hear(proc, "written")
            proc.wait(30)
            with path.open() as lines:
                for line in lines:
                    key, at = line.split()
                    keys.append(key)
                    times.append(float(at))
        return keys, times

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass


if __name__ == "__main__":
    sys.exit(main())
