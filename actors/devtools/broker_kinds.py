"""The brokers fxgate is shown on, by name: what `--broker` takes in `fxgate simulate`, the demo,
the benchmarks and the test fixtures.

Each starts on a free loopback port with its own data folder (actors.devtools.broker_process);
`shipped` gives the settings that decide flow and loss as each broker ships them, with the
queue made long enough to hold what the caller is about to queue (a benchmark pre-queues more
than 1,000 messages: at the shipped queue length the broker would drop the rest).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

from actors.devtools.broker_process import BrokerProcess
from actors.devtools.hivemq import HiveMQProcess
from actors.devtools.mochi import MochiProcess
from actors.devtools.mosquitto import SHIPPED_LIMITS, MosquittoProcess

BROKERS: dict[str, type[BrokerProcess]] = {
    "mosquitto": MosquittoProcess,
    "hivemq": HiveMQProcess,
    "mochi": MochiProcess,
}
DEFAULT_BROKER = "mosquitto"
MOCHI_MAXIMUM_INFLIGHT = 8192


def shipped(kind: str, queue: int | None = None) -> dict:
    """Options for `make_broker` that keep `kind`'s shipped in-flight window and queue policy,
    and its shipped queue length unless `queue` asks for a longer one."""
    if kind == "mosquitto":
        options = dict(SHIPPED_LIMITS)
        if queue is not None:
            options["max_queued_messages"] = max(queue, options["max_queued_messages"])
        return options
    if kind == "hivemq":
        return {} if queue is None else {"max_queue_size": max(queue, 1000)}
    if kind == "mochi":
        # Mochi keeps what waits for a client among its in-flight messages, 8,192 at most
        # (Capabilities.MaximumInflight; past it "client store quota reached" and a drop).
        if queue is not None and queue > MOCHI_MAXIMUM_INFLIGHT:
            raise ValueError(
                f"Mochi holds at most {MOCHI_MAXIMUM_INFLIGHT} messages for a client as shipped; "
                f"{queue} would be dropped past it"
            )
        return {}
    raise ValueError(f"unknown broker {kind!r}; known: {', '.join(BROKERS)}")


def make_broker(kind: str, data_dir: Path, port: int | None = None, **options) -> BrokerProcess:
    """A broker of `kind`, not started yet."""
    try:
        cls = BROKERS[kind]
    except KeyError:
        raise ValueError(f"unknown broker {kind!r}; known: {', '.join(BROKERS)}") from None
    return cls(data_dir, port, **options)


@contextlib.contextmanager
def serve_until_stopped(
    kind: str, data_dir: Path, port: int, say: Callable[[str], None] = print
) -> Iterator[BrokerProcess]:
    """A broker of `kind` as shipped on loopback `port`, its data in `data_dir` (kept: a second
    run finds the sessions the first one saved). The body runs with it; then it keeps running
    until SIGINT or SIGTERM, and stops gracefully (it saves its sessions)."""
    broker = make_broker(kind, Path(data_dir), port, **shipped(kind))
    stop_signals = {signal.SIGINT, signal.SIGTERM}

    def stopped(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)  # unwinds to the broker's stop below

    # While the body runs, SIGINT is a KeyboardInterrupt and SIGTERM this SystemExit: either
    # way the broker is stopped, never left running without its parent.
    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        broker.start()
        say(f"{kind} on {broker.host}:{broker.port} (pid {broker.pid}, data {broker.data_dir})")
        yield broker
        say(f"{kind} keeps running on {broker.host}:{broker.port}: Ctrl-C or SIGTERM stops it")
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        received = signal.sigwait(stop_signals)
        say(f"{signal.Signals(received).name}: stopping {kind} (it saves its sessions)")
    finally:
        broker.stop()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
        signal.signal(signal.SIGTERM, previous)
