"""The forward leg in a process of its own (`[upstream] process = "own"`).

One interpreter runs one thread at a time. With the forward leg beside the intake, forwarding
while the source drains shared that one interpreter with the ledger's commits and acks, and
reached 0.6-0.77x the bare paho publisher; the same forwarding beside a drain in another process
kept its pace (bench/forward.py). So the leg's three actors (actors.forward_leg: tier-2 buffer,
outbound ledger, upstream connection) can run, unchanged, in a child: `python -m
actors.forward_process`, its own pykka actors, clock and SQLite connection to `outbound.sqlite`.

The two processes talk by `tell` only, as the actors did: length-prefixed pickles on the child's
stdin (to it) and stdout (from it), each addressed to an actor by name.
- To the child: "buffer" gets the ledger's upstream feed (`Committed`); "outbound" gets the
  ledger's `ForwardRecorded`.
- To the daemon: "ledger" gets the buffer's `Grant`s and the leg's `Forwarded` reports;
  "lifecycle" gets the upstream connection's events. A status snapshot of the three actors
  comes whenever the daemon asks (each second, for `fxgate status`, /healthz and /metrics).
An actor ref inside a message (`Forwarded.reply_to`) crosses as its name and arrives as the
other side's ref of that name. `Committed` rows cross as plain tuples: one pickle call for a
chunk, not one per field.

Life: the daemon starts the child after the inbound ledger and before the source, as it would
start the leg's actors, and waits for its "ready". A stop request stops the three actors in the
usual order (connection, buffer, outbound ledger); their last reports reach the ledger before the
child exits. The child ends with the daemon: the end of its stdin (the daemon is gone, killed or
not) ends it at once, as a SIGKILL of a one-process daemon ends the leg. A crash point in the
child kills the daemon with it. The daemon sees a child that exited as a crashed actor
(`is_alive` false): the supervisor's restart applies.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

import pykka

from actors import crashpoints
from actors.messages import Committed
from actors.tell import stop_actor
from persistence.records import LedgerRecord

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<I")
# Frame kinds: a message for a named actor; rows for the buffer; a status snapshot; ready; stop;
# a request for a status snapshot now.
_TELL, _ROWS, _STATUS, _READY, _STOP, _ASK = range(6)
# How often the child looks at its actors (one that died ends it).
CHECK_INTERVAL = 1.0
READY_TIMEOUT = 60.0


class ForwardProcessDied(RuntimeError):
    pass


def _rows(records: tuple[LedgerRecord, ...]) -> list[tuple]:
    return [
        (
            r.seq,
            r.message_key,
            r.topic,
            r.payload,
            r.qos,
            r.received_time,
            r.pack_id,
            r.dead_reason,
            r.expires_at,
            r.dead_sink,
            r.to_table,
            r.to_upstream,
        )
        for r in records
    ]


class RemoteRef:
    """An actor of the other process, by name: what `tell` needs of a pykka.ActorRef."""

    def __init__(self, name: str, link: Link) -> None:
        self.name = name
        self._link = link

    def tell(self, message: object) -> None:
        self._link.tell(self.name, message)

    def is_alive(self) -> bool:
        return self._link.open

    def __repr__(self) -> str:
        return f"RemoteRef({self.name!r})"


class _Pickler(pickle.Pickler):
    def __init__(self, file, link: Link) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._link = link

    def persistent_id(self, obj: object) -> str | None:
        if isinstance(obj, RemoteRef):
            return obj.name
        if isinstance(obj, pykka.ActorRef):
            return self._link.name_of(obj)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, link: Link) -> None:
        super().__init__(file)
        self._link = link

    def persistent_load(self, pid: str) -> object:
        return self._link.ref(pid)


class Link:
    """One end of the pipe pair: sends frames, and delivers what arrives to this side's actors
    (`local`, by name) on a reader thread."""

    def __init__(
        self,
        incoming: BinaryIO,
        outgoing: BinaryIO,
        local: dict[str, pykka.ActorRef],
        *,
        on_status: Callable[[dict], None] = lambda status: None,
        on_stop: Callable[[], None] = lambda: None,
        on_ask: Callable[[], None] = lambda: None,
        on_closed: Callable[[], None] = lambda: None,
        hosted: dict[type, str] | None = None,
    ) -> None:
        """`hosted`: the names of the actor classes this side starts, for a ref that crosses
        before its actor is in `local` (an actor's `on_start` may tell before `start` returns)."""
        self._in = incoming
        self._out = outgoing
        self.local = local
        self._on_status = on_status
        self._on_stop = on_stop
        self._on_ask = on_ask
        self._on_closed = on_closed
        self._hosted = hosted or {}
        self._send_lock = threading.Lock()
        self.open = True
        # Set when the other side says it is ready, or when the link closes (then `open` is
        # false): one event to wait on.
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="forward-link-read", daemon=True)

    def start(self) -> None:
        self._reader.start()

    # -- names ------------------------------------------------------------------------------

    def name_of(self, ref: pykka.ActorRef) -> str:
        for name, local in self.local.items():
            if local is ref:
                return name
        name = self._hosted.get(ref.actor_class)
        if name is not None:
            return name
        raise pickle.PicklingError(f"{ref!r} is not an actor the other process can address")

    def ref(self, name: str) -> object:
        """This side's actor called `name`, or the other side's (a RemoteRef)."""
        local = self.local.get(name)
        return local if local is not None else RemoteRef(name, self)

    # -- sending ----------------------------------------------------------------------------

    def tell(self, name: str, message: object) -> None:
        if isinstance(message, Committed):
            data = pickle.dumps((_ROWS, name, _rows(message.records)), pickle.HIGHEST_PROTOCOL)
        else:
            buffer = io.BytesIO()
            _Pickler(buffer, self).dump((_TELL, name, message))
            data = buffer.getvalue()
        self._send(data)

    def send_status(self, status: dict) -> None:
        self._send(pickle.dumps((_STATUS, status), pickle.HIGHEST_PROTOCOL))

    def send_ready(self) -> None:
        self._send(pickle.dumps((_READY,), pickle.HIGHEST_PROTOCOL))

    def send_stop(self) -> None:
        self._send(pickle.dumps((_STOP,), pickle.HIGHEST_PROTOCOL))

    def send_ask(self) -> None:
        self._send(pickle.dumps((_ASK,), pickle.HIGHEST_PROTOCOL))

    def send_object(self, obj: object) -> None:
        self._send(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            if not self.open:
                raise pykka.ActorDeadError("the forward process is gone")
            try:
                self._out.write(_LENGTH.pack(len(data)) + data)
                self._out.flush()
            except (OSError, ValueError) as error:
                self.open = False
                raise pykka.ActorDeadError(f"the forward process is gone ({error})") from error

    # -- receiving --------------------------------------------------------------------------

    def _read(self) -> None:
        try:
            while True:
                frame = _read_frame(self._in)
                if frame is None:
                    break
                self._deliver(frame)
        except Exception:
            log.exception("forward link: reading failed")
        finally:
            self.open = False
            self.ready.set()
            self._on_closed()

    def _deliver(self, data: bytes) -> None:
        frame = _Unpickler(io.BytesIO(data), self).load()
        kind = frame[0]
        if kind in (_ROWS, _TELL):
            _, name, message = frame
            if kind == _ROWS:
                message = Committed(tuple(LedgerRecord(*row) for row in message))
            target = self.local.get(name)
            if target is None:
                log.warning("forward link: no actor %r here for %r", name, message)
            else:
                _tell_local(target, message)
        elif kind == _STATUS:
            self._on_status(frame[1])
        elif kind == _READY:
            self.ready.set()
        elif kind == _STOP:
            self._on_stop()
        elif kind == _ASK:
            self._on_ask()


def _tell_local(ref: pykka.ActorRef, message: object) -> None:
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        log.info("forward link: %r arrived for an actor that has stopped", message)


def _read_frame(pipe: BinaryIO) -> bytes | None:
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(head)
    data = pipe.read(size)
    if len(data) < size:
        return None
    return data


# -- the daemon's side ----------------------------------------------------------------------


class ForwardProcess:
    """The daemon's handle on the child, in the supervisor's list of actors as "forward": it
    answers what the supervisor asks of an actor ref (`is_alive`, `stop`), and `buffer` is the
    ref the inbound ledger's upstream feed is pointed at."""

    def __init__(
        self,
        init: dict,
        ledger: pykka.ActorRef,
        lifecycle: pykka.ActorRef | None,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        self._status: dict = {}
        self._reports = 0  # status snapshots received so far
        self._reported = threading.Condition()
        began = time.monotonic()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        local = {"ledger": ledger}
        if lifecycle is not None:
            local["lifecycle"] = lifecycle
        self._link = Link(self._proc.stdout, self._proc.stdin, local, on_status=self._take_status)
        try:
            self._link.send_object({**init, "lifecycle": lifecycle is not None})
        except pykka.ActorDeadError:
            pass  # it died at once: said below
        self._link.start()
        if not self._link.ready.wait(ready_timeout) or not self._link.open:
            self._end()
            raise ForwardProcessDied(
                f"the forward process (pid {self._proc.pid}) did not start: "
                f"exit status {self._proc.poll()}; its log lines are above"
            )
        self.buffer = RemoteRef("buffer", self._link)
        log.info(
            "forward process started (pid %d) in %.2f s",
            self._proc.pid,
            time.monotonic() - began,
        )

    def _take_status(self, status: dict) -> None:
        with self._reported:
            self._status = status
            self._reports += 1
            self._reported.notify_all()

    def status(self, timeout: float = 5.0) -> dict:
        """The leg's actors as the child reports them when asked: "outbound", "buffer",
        "upstream". A child that does not answer within `timeout` gives its last report,
        marked "stale"."""
        with self._reported:
            seen = self._reports
        try:
            self._link.send_ask()
        except pykka.ActorDeadError:
            return {**self._status, "stale": True}
        with self._reported:
            if not self._reported.wait_for(lambda: self._reports > seen, timeout):
                return {**self._status, "stale": True}
            return dict(self._status)

    def is_alive(self) -> bool:
        return self._link.open and self._proc.poll() is None

    def stop(self, block: bool = True, timeout: float | None = None) -> bool:
        """Ask the child to stop its actors and exit; True if it did, False if it had died.
        Past `timeout` it is killed and pykka.Timeout raised, as for an actor."""
        if not self.is_alive():
            code = self._proc.poll()
            self._end()
            if code is None:
                log.error("the forward process (pid %d) had closed its pipe: ended", self._proc.pid)
            else:
                log.error(
                    "the forward process (pid %d) had ended: exit status %d", self._proc.pid, code
                )
            return False
        try:
            self._link.send_stop()
        except pykka.ActorDeadError:
            self._end()
            return False
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._end()
            raise pykka.Timeout(f"the forward process did not stop within {timeout} s") from None
        self._end()
        if code != 0:
            log.error("the forward process exited with status %d", code)
        return code == 0

    def _end(self) -> None:
        """Kill the child if it still runs, reap it, close the pipes."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


# -- the child --------------------------------------------------------------------------------


def _serve(requests: BinaryIO, replies: BinaryIO) -> int:
    from dataclasses import asdict

    from actors.buffer import TierTwoBuffer
    from actors.clock import RealClock
    from actors.connection import ConnectionActor
    from actors.forward_leg import start_forward_leg
    from actors.outbound import OutboundLedger

    data = _read_frame(requests)
    if data is None:
        return 1
    init = pickle.loads(data)
    config = init["config"]
    logging.basicConfig(
        level=config.gateway.log_level,
        format="%(asctime)s %(levelname)s forward %(name)s: %(message)s",
    )
    crashpoints.arm_from_environ()
    crashpoints.take_parent_along()
    clock = RealClock()
    wake = threading.Event()
    stopping = threading.Event()

    asked = threading.Event()

    def stop_asked() -> None:
        stopping.set()
        wake.set()

    def status_asked() -> None:
        asked.set()
        wake.set()

    def closed() -> None:
        if not stopping.is_set():
            # The daemon is gone without a word (killed): the leg goes with it, at once.
            log.critical("the daemon is gone: the forward process ends")
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(1)

    local: dict[str, pykka.ActorRef] = {}
    link = Link(
        requests,
        replies,
        local,
        on_stop=stop_asked,
        on_ask=status_asked,
        on_closed=closed,
        hosted={OutboundLedger: "outbound", TierTwoBuffer: "buffer", ConnectionActor: "upstream"},
    )
    started: list[tuple[str, pykka.ActorRef]] = []

    def start(name: str, actor_class, *args, **kwargs) -> pykka.ActorRef:
        ref = actor_class.start(*args, **kwargs)
        started.append((name, ref))
        local[name] = ref
        log.info("started %s", name)
        return ref

    lifecycle = RemoteRef("lifecycle", link) if init["lifecycle"] else None
    try:
        start_forward_leg(
            start,
            config,
            clock,
            init["settings"],
            init["routes"],
            ledger=RemoteRef("ledger", link),
            lifecycle=lifecycle,
            live_from_seq=init["live_from_seq"],
            ask_timeout=init["ask_timeout"],
        )
    except Exception:
        log.exception("the forward leg did not start")
        _stop_all(started, init["stop_timeout"])
        clock.close()
        return 1
    # What the daemon sent meanwhile waits in the pipe: read only now that every actor is here.
    link.start()
    link.send_ready()
    proxies = {name: ref.proxy() for name, ref in started}
    asks = {
        "outbound": lambda: proxies["outbound"].status().get(timeout=5),
        "buffer": lambda: proxies["buffer"].status().get(timeout=5),
        "upstream": lambda: asdict(proxies["upstream"].state().get(timeout=5)),
    }

    def report() -> None:
        status = {}
        for name, ask in asks.items():
            try:
                status[name] = ask()
            except (pykka.Timeout, pykka.ActorDeadError):
                status["stale"] = True
        try:
            link.send_status(status)
        except pykka.ActorDeadError:
            pass

    # Each turn: a status report if the daemon asked for one, and a look at the actors: one
    # that died ends the process.
    while not stopping.is_set():
        if asked.is_set():
            asked.clear()
            report()
        if not all(ref.is_alive() for _, ref in started):
            dead = [name for name, ref in started if not ref.is_alive()]
            log.error("forward process: actor(s) %s died; ending (the daemon restarts)", dead)
            _stop_all(started, init["stop_timeout"])
            clock.close()
            return 1
        timer = clock.call_later(CHECK_INTERVAL, wake.set)
        wake.wait()
        wake.clear()
        timer.cancel()
    log.info("forward process stopping")
    _stop_all(started, init["stop_timeout"])
    report()
    clock.close()
    log.info("forward process stopped")
    return 0


def _stop_all(started: list[tuple[str, pykka.ActorRef]], timeout: float) -> None:
    """Stop the leg's actors in the reverse of their start, as the supervisor does."""
    while started:
        stop_actor(*started.pop(), timeout)


def main() -> None:
    # The frames own stdout: a stray print would corrupt them, so stdout goes to stderr (the
    # daemon's log, which the child shares).
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when the leg stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = _serve(sys.stdin.buffer, replies)
    # Every actor has stopped. os._exit, not sys.exit: the link's reader thread is blocked in a
    # read of stdin, and the interpreter's shutdown would abort on that stream's lock.
    for handler in logging.getLogger().handlers:
        handler.flush()
    replies.flush()
    os._exit(code)


if __name__ == "__main__":
    # Run as `python -m actors.forward_process`, this file is `__main__`: what it pickles must
    # name the classes of the module the daemon imports, so the loop runs from there.
    from actors.forward_process import main as imported_main

    imported_main()
