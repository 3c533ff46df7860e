"""Ingest on each broker and at each in-flight window: fxgate against the bare paho subscriber on
the same broker (issue 25).

A broker may grant any window of unacknowledged QoS 1/2 messages (MQTT 5 Receive Maximum, capped
by the broker's own setting), and at a window of W a subscriber can go no faster than W ÷ (the
time from a PUBLISH arriving to its acknowledgement leaving). The ingest benchmarks run mosquitto
with `max_inflight_messages 1000`; this one runs each broker as shipped (queue long enough to
hold the sample: actors.devtools.broker_kinds.shipped) and each contestant at three windows:

- `shipped`: what each client asks by default (fxgate one pack, `[packs] max_messages`; paho no
  Receive Maximum), so the broker's cap decides (mosquitto 20, HiveMQ 50, Mochi none below the
  client's);
- 20 and 1: both clients send Receive Maximum 20 / 1 (fxgate `source.receive_maximum`).

At the shipped window the bare subscriber also runs asking fxgate's window (one pack), report
only: a broker may pay for a stated Receive Maximum itself. Mochi 2.7 does: with one, it looks
through the client's whole in-flight map (and sorts part of it) after every packet the client
sends, so draining a queue of N costs it O(N) a packet (`Inflight.NextImmediate`); paho, sending
none, never takes that path. The target stays against the bare subscriber as shipped.

A round, as in bench.harness: a persistent session for the drainer, the sample published by the
FX9600 simulator and acknowledged, then the drainer timed from its first PUBLISH to its N-th
final ack. One broker of each kind serves all its rounds (HiveMQ takes seconds to start); each
fxgate sample has a fresh Gateway, ledger and tables (landing with delta-rs, no JVM).
Targets: fxgate ≥ 0.9 times the bare subscriber at each broker's shipped window, ≥ 0.5 times at
a window of 1, at QoS 1 and QoS 2.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

from actors.config.schema import PacksConfig
from actors.devtools.broker_kinds import BROKERS, shipped
from bench.benchmarks import Benchmark, Context, alternate
from bench.harness import (
    BARE_CLIENT_ID,
    FXGATE_CLIENT_ID,
    fresh_broker,
    fxgate_env,
    prequeue,
    run_bare_subscriber,
)

log = logging.getLogger(__name__)

NAME = "ingest-windows"
WINDOWS: tuple[int | None, ...] = (None, 20, 1)  # None: the broker's shipped window
TARGET = {None: 0.9, 1: 0.5}
MESSAGES = {None: 4000, 20: 4000, 1: 2000}
QUICK_MESSAGES = {None: 2000, 20: 2000, 1: 1000}
ROUNDS = {False: 2, True: 1}
# What fxgate asks at the shipped window: one pack (source.receive_maximum unset).
FXGATE_WINDOW = PacksConfig().max_messages


def window_name(window: int | None) -> str:
    return "shipped" if window is None else str(window)


def _fxgate(ctx: Context, broker, qos: int, window: int | None, messages: int):
    def take() -> dict:
        directory = ctx.next_dir(f"fx-{broker.kind}")
        queued = prequeue(broker, FXGATE_CLIENT_ID, messages, qos, 1, ctx.seed())
        overrides = {} if window is None else {"FXGATE__SOURCE__RECEIVE_MAXIMUM": str(window)}
        env = fxgate_env(broker, directory / "data", qos, **overrides)
        result = ctx.worker({}).ingest(env, qos, messages, messages, broker.pid, timeout=300)
        return {
            "messages_per_second": messages / result["ack_seconds"],
            "table_seconds": round(result["table_seconds"], 3),
            "ack_seconds": round(result["ack_seconds"], 3),
            "ledger_commits": result["ledger"].get("commits"),
            "queued": queued,
        }

    return take


def _bare(ctx: Context, broker, qos: int, window: int | None, messages: int):
    def take() -> dict:
        queued = prequeue(broker, BARE_CLIENT_ID, messages, qos, 1, ctx.seed())
        result = run_bare_subscriber(broker, qos, messages, parse=False, receive_maximum=window)
        return {
            "messages_per_second": messages / result["seconds"],
            "seconds": round(result["seconds"], 3),
            "queued": queued,
        }

    return take


def one_broker(ctx: Context, kind: str, directory: Path) -> list[dict]:
    sizes = QUICK_MESSAGES if ctx.settings.quick else MESSAGES
    cells = []
    with fresh_broker(directory, kind, **shipped(kind, queue=max(sizes.values()))) as broker:
        for qos in (1, 2):
            for window in WINDOWS:
                messages = sizes[window]
                print(f"   {kind} QoS {qos} window {window_name(window)}:", flush=True)
                contestants = [
                    ("baseline", _bare(ctx, broker, qos, window, messages)),
                    ("fxgate", _fxgate(ctx, broker, qos, window, messages)),
                ]
                if window is None:
                    contestants.append(
                        ("bare-fxgate-window", _bare(ctx, broker, qos, FXGATE_WINDOW, messages))
                    )
                raw = alternate(
                    ctx,
                    contestants,
                    lambda s: s["messages_per_second"],
                    rounds=ROUNDS[ctx.settings.quick],
                )
                base = statistics.median(
                    s["messages_per_second"] for s in raw if s["role"] == "baseline"
                )
                fx = statistics.median(
                    s["messages_per_second"] for s in raw if s["role"] == "fxgate"
                )
                target = TARGET.get(window)
                ratio = fx / base
                same = [s["messages_per_second"] for s in raw if s["role"] == "bare-fxgate-window"]
                same_window = {}
                if same:
                    bare_same = statistics.median(same)
                    same_window = {
                        "bare_at_fxgate_window": round(bare_same, 1),
                        "ratio_at_fxgate_window": round(fx / bare_same, 3),
                    }
                cells.append(
                    {
                        "broker": kind,
                        "qos": qos,
                        "window": window_name(window),
                        "messages": messages,
                        "baseline": round(base, 1),
                        "fxgate": round(fx, 1),
                        "ratio": round(ratio, 3),
                        "target": target,
                        "met": None if target is None else ratio >= target,
                        **same_window,
                        "samples": raw,
                    }
                )
    return cells


def ingest_windows(ctx: Context) -> dict:
    directory = ctx.next_dir(NAME)
    cells: list[dict] = []
    for kind in BROKERS:
        cells.extend(one_broker(ctx, kind, directory / kind))
    judged = [c for c in cells if c["met"] is not None]
    missed = [c for c in judged if not c["met"]]
    return {
        "kind": "fxgate-bench",
        "module": "bench.windows",
        "name": NAME,
        "title": "ingest on each broker and window: fxgate against the bare paho subscriber",
        "unit": "messages/s",
        "setup": {
            "brokers": {kind: shipped(kind, queue=max(MESSAGES.values())) for kind in BROKERS},
            "windows": [window_name(w) for w in WINDOWS],
            "messages": {window_name(w): n for w, n in MESSAGES.items()},
            "rounds": ROUNDS[ctx.settings.quick],
            "fxgate": "the daemon's Gateway in bench.gateway_worker, default configuration "
            "(landing with delta-rs), source.receive_maximum = the window",
            "baseline": "bench.bare_subscriber: paho 2.2, manual acks from on_message, Receive "
            "Maximum = the window (none sent at the shipped window)",
            "bare_at_fxgate_window": f"report only, at the shipped window: the bare subscriber "
            f"asking Receive Maximum {FXGATE_WINDOW}, as fxgate does",
        },
        "cells": cells,
        "target": {"kind": "ratio_at_least", "value": TARGET[None], "window_1": TARGET[1]},
        "met": not missed,
        "headline": "; ".join(
            f"{c['broker']} QoS {c['qos']} w{c['window']} {c['ratio']:.2f}\u00d7" for c in cells
        ),
    }


def rows(result: dict) -> list[list[str]]:
    out = []
    for cell in result["cells"]:
        target = cell["target"]
        out.append(
            [
                f"`{NAME}`",
                f"{cell['broker']}, QoS {cell['qos']}, window {cell['window']}: "
                f"{cell['messages']:,} queued messages drained, first PUBLISH -> last final ack; "
                "baseline: bare paho on the same broker and window",
                f"{cell['baseline']:,.0f} msg/s",
                f"{cell['fxgate']:,.0f} msg/s",
                f"{cell['ratio']:.2f}\u00d7",
                "—" if target is None else f"≥ {target:g}\u00d7",
                "—" if cell["met"] is None else ("yes" if cell["met"] else "**no**"),
                str(len(cell["samples"])),
            ]
        )
        if "bare_at_fxgate_window" in cell:
            out.append(
                [
                    f"`{NAME}`",
                    f"{cell['broker']}, QoS {cell['qos']}, shipped window, report only: the "
                    f"baseline asking fxgate's Receive Maximum ({FXGATE_WINDOW})",
                    f"{cell['bare_at_fxgate_window']:,.0f} msg/s",
                    f"{cell['fxgate']:,.0f} msg/s",
                    f"{cell['ratio_at_fxgate_window']:.2f}\u00d7",
                    "—",
                    "—",
                    str(len(cell["samples"])),
                ]
            )
    return out


def plot(results_dir: Path, result: dict) -> Path:
    import matplotlib.pyplot as plt

    path = results_dir / f"{NAME}.png"
    cells = result["cells"]
    labels = [f"{c['broker']}\nQoS {c['qos']} w{c['window']}" for c in cells]
    colors = [
        "tab:gray" if c["met"] is None else ("tab:green" if c["met"] else "tab:red") for c in cells
    ]
    fig, ax = plt.subplots(figsize=(11, 4.6), dpi=110)
    ax.bar(range(len(cells)), [c["ratio"] for c in cells], color=colors)
    for value, style in ((TARGET[None], "--"), (TARGET[1], ":")):
        ax.axhline(value, color="black", linewidth=0.8, linestyle=style)
    ax.set_xticks(range(len(cells)), labels, fontsize=6)
    ax.set_ylabel("fxgate ÷ bare paho (messages/s)")
    ax.set_title(
        f"{result['title']}\ntargets: ≥ {TARGET[None]:g}\u00d7 at the shipped window (dashed), "
        f"≥ {TARGET[1]:g}\u00d7 at window 1 (dotted)",
        fontsize=9,
    )
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, ingest_windows, False),)
