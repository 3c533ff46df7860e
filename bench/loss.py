"""Issue 5 item 8, loss under kill: the same SIGKILL schedule against fxgate and a mosquitto bridge.

For each QoS, two runs on fresh brokers, one per contestant, each forwarding from a source
broker to an upstream broker while the project's FX9600 simulator publishes M messages to the
source at a steady rate:

- fxgate: `python -m actors.app.cli run` (tests.harness.daemon.DaemonProcess) with [upstream] and
  one route at the run's QoS; each kill is SIGKILL of the daemon (then of the Spark JVM it left),
  and a new daemon is spawned at once on the same data directory;
- bridge: the bridging mosquitto of bench.bridge (persistence on, autosave every second,
  cleansession false), SIGKILLed and started again on the same persistence file.

The kill moments are drawn once per QoS from a seeded generator (one in each of K equal slots
of the publishing window) and used for both contestants, relative to the first publish. A kill
is never aimed at a forwarder that has not forwarded anything since its last start: if a moment
comes while it is still starting, the kill waits for its first upstream arrival (kill times as
they happened are in the JSON). A persistent-session subscriber on the upstream broker at the
run's QoS keeps the idempotency key of everything it receives; missing and duplicated messages
are counted against what the source acknowledged to the simulator. For fxgate (full runs) the
`reads` table is checked too, with plain pyarrow, after a graceful stop.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from actors.devtools.simulate import expected_read_ids, simulate
from bench.benchmarks import Benchmark, Context
from bench.bridge import READERS_TOPIC, BridgeBroker, UpstreamCollector
from bench.harness import PUBLISHING_READERS, BenchError, fresh_broker, fxgate_env
from spark.report import compare, landed_ids_arrow
from tests.harness.daemon import DaemonProcess

MODULE = "bench.loss"
NAME = "loss-under-kill"

# fxgate re-sends what is unacknowledged at each reconnect and, within a connection, after
# packs.processing_timeout_seconds (20 s by default): give it that long with nothing arriving
# before anything counts as missing. mosquitto re-sends only on a reconnect (MQTT forbids it
# otherwise), so the bridge's settle time only has to cover its queue draining.
FXGATE_QUIET_SECONDS = 22.0
BRIDGE_QUIET_SECONDS = 5.0


def plan(quick: bool) -> dict:
    if quick:
        return {"qos": (1, 2), "rate": 400, "seconds": 8.0, "kills": 2, "table_check": False}
    return {"qos": (1, 2), "rate": 500, "seconds": 30.0, "kills": 4, "table_check": True}


def kill_schedule(seed: int, kills: int, seconds: float) -> list[float]:
    """One moment in each of `kills` equal slots of the middle 80 % of the publishing window."""
    rng = random.Random(seed)
    start, span = 0.1 * seconds, 0.8 * seconds / kills
    return [round(start + i * span + rng.uniform(0.0, span), 3) for i in range(kills)]


# -- the two contestants ---------------------------------------------------------------------


class FxgateContestant:
    role = "fxgate"
    quiet_seconds = FXGATE_QUIET_SECONDS

    def __init__(self, directory: Path, source, upstream, qos: int) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.env = fxgate_env(
            source,
            self.data,
            qos,
            FXGATE__UPSTREAM__HOST=upstream.host,
            FXGATE__UPSTREAM__PORT=str(upstream.port),
            FXGATE__ROUTES__0__SOURCE=READERS_TOPIC,
            FXGATE__ROUTES__0__QOS=str(qos),
        )
        self.daemons: list[DaemonProcess] = []

    @property
    def daemon(self) -> DaemonProcess:
        return self.daemons[-1]

    def start(self) -> float:
        """Spawn `fxgate run`; return once it is connected upstream and to the source."""
        began = time.monotonic()
        daemon = DaemonProcess(self.directory, self.env)
        self.daemons.append(daemon)
        daemon.start()
        daemon.wait_for_log(r"upstream: connected to", timeout=120)
        daemon.wait_for_log(r"source: connected to", timeout=120)
        return time.monotonic() - began

    def kill(self) -> None:
        # The daemon first (the crash), then the Spark JVM it leaves behind, by PID.
        self.daemon.reap()

    def finish(self, table_check: bool, published) -> dict:
        if not table_check:
            self.daemon.reap()
            return {}
        code = self.daemon.terminate()
        ids, readers = landed_ids_arrow(self.data / "tables")
        table = compare(expected_read_ids(published), ids, readers)
        return {
            "exit_code_after_sigterm": code,
            "table": {
                "rows": table.landed,
                "expected": table.published,
                "missing": len(table.missing),
                "duplicates": len(table.duplicates),
                "unexpected": len(table.unexpected),
            },
        }

    def cleanup(self) -> None:
        for daemon in self.daemons:
            daemon.reap()


class BridgeContestant:
    role = "bridge"
    quiet_seconds = BRIDGE_QUIET_SECONDS

    def __init__(self, directory: Path, source, upstream, qos: int) -> None:
        self.bridge = BridgeBroker(directory / "bridge", source, upstream, qos)

    def start(self) -> float:
        return self.bridge.start()

    def kill(self) -> None:
        self.bridge.kill()

    def finish(self, table_check: bool, published) -> dict:
        self.bridge.stop()
        return {}

    def cleanup(self) -> None:
        self.bridge.stop()


# -- one run ---------------------------------------------------------------------------------


def run_once(ctx: Context, make, qos: int, schedule: list[float], setup: dict) -> dict:
    directory = ctx.next_dir(f"loss-qos{qos}-{make.role}")
    messages = int(setup["rate"] * setup["seconds"])
    messages -= messages % PUBLISHING_READERS
    with (
        fresh_broker(directory / "source") as source,
        fresh_broker(directory / "upstream") as upstream,
    ):
        collector = UpstreamCollector(upstream, qos, f"bench-loss-{make.role}")
        contestant = make(directory, source, upstream, qos)
        try:
            first_start = contestant.start()
            outcome: dict = {}
            publisher = threading.Thread(
                target=lambda: outcome.update(
                    result=simulate(
                        source.host,
                        source.port,
                        readers=PUBLISHING_READERS,
                        rate=setup["rate"],
                        count=messages // PUBLISHING_READERS,
                        qos=qos,
                        seed=setup["seed"],
                        client_id_prefix=f"bench-loss-{qos}",
                        ack_timeout=60.0,
                    )
                ),
                name="bench-loss-publisher",
                daemon=True,
            )
            began = time.monotonic()
            publisher.start()
            kills = []
            since_start = collector.count()
            pause = threading.Event()
            for moment in schedule:
                pause.wait(max(0.0, began + moment - time.monotonic()))
                # Forwarding since its last start, so that the kill can catch messages on the
                # way (it waits only if the moment came while the forwarder was starting).
                forwarding = collector.wait_for_more_than(since_start, timeout=60)
                killed_at = time.monotonic() - began
                contestant.kill()
                up = contestant.start()
                since_start = collector.count()
                kills.append(
                    {
                        "scheduled": moment,
                        "killed_at": round(killed_at, 3),
                        "forwarding_before_kill": forwarding,
                        "restart_to_connected_seconds": round(up, 3),
                    }
                )
            publisher.join(setup["seconds"] * 4 + 120)
            if "result" not in outcome:
                raise BenchError(f"{make.role} run: the publisher did not finish")
            published = outcome["result"].published
            expected = {r.message_key for r in published}
            settled_began = time.monotonic()
            complete = collector.wait_settled(expected, quiet=contestant.quiet_seconds, timeout=240)
            settle_seconds = time.monotonic() - settled_began
            counts, times = collector.snapshot()
            extra = contestant.finish(setup["table_check"], published)
        finally:
            contestant.cleanup()
            collector.close()
    shutil.rmtree(directory, ignore_errors=True)
    offsets = sorted(t - began for t in times)
    for kill in kills:
        # The killed process sends nothing more: the next arrival is the new one's first.
        after = next((t for t in offsets if t > kill["killed_at"]), None)
        kill["first_arrival_after_kill_seconds"] = (
            None if after is None else round(after - kill["killed_at"], 3)
        )
    duplicated = {k: n for k, n in counts.items() if n > 1 and k in expected}
    return {
        "role": make.role,
        "qos": qos,
        "published": len(published),
        "publish_seconds": round(outcome["result"].seconds, 2),
        "failed_publishes": outcome["result"].failed,
        "first_start_seconds": round(first_start, 3),
        "kills": kills,
        "received": sum(counts.values()),
        "missing": len(expected - counts.keys()),
        "duplicated_messages": len(duplicated),
        "extra_copies": sum(n - 1 for n in duplicated.values()),
        "unexpected": len(counts.keys() - expected),
        "all_arrived": complete,
        "settle_seconds": round(settle_seconds, 2),
        "quiet_seconds": contestant.quiet_seconds,
        # Arrivals per 0.5 s since the first publish, for the plot.
        "arrivals_per_half_second": _histogram([t - began for t in times], 0.5),
        **extra,
    }


def _histogram(offsets: list[float], width: float) -> list[int]:
    if not offsets:
        return []
    bins = [0] * (int(max(offsets) / width) + 1)
    for offset in offsets:
        bins[max(0, int(offset / width))] += 1
    return bins


# -- the benchmark ---------------------------------------------------------------------------


def loss(ctx: Context) -> dict:
    setup = plan(ctx.settings.quick)
    runs = []
    for qos in setup["qos"]:
        seed = ctx.seed()
        schedule = kill_schedule(seed, setup["kills"], setup["seconds"])
        print(f"    QoS {qos}: SIGKILL at {', '.join(f'{s:.1f}' for s in schedule)} s", flush=True)
        for make in (FxgateContestant, BridgeContestant):
            run = run_once(ctx, make, qos, schedule, {**setup, "seed": seed})
            run["schedule"] = schedule
            runs.append(run)
            print(
                f"    QoS {qos} {run['role']:>6}: {run['published']:,} published, "
                f"{run['missing']} missing, {run['duplicated_messages']} duplicated "
                f"({run['extra_copies']} extra copies)"
                + (
                    f"; table {run['table']['missing']} missing / {run['table']['duplicates']} dup"
                    if "table" in run
                    else ""
                ),
                flush=True,
            )
    fx = [r for r in runs if r["role"] == "fxgate"]
    met = all(
        r["missing"] == 0
        and r["unexpected"] == 0
        and (r["qos"] < 2 or r["duplicated_messages"] == 0)
        and ("table" not in r or (r["table"]["missing"] == 0 and r["table"]["duplicates"] == 0))
        for r in fx
    )
    messages = runs[0]["published"]
    result = {
        "kind": "fxgate-bench",
        "name": NAME,
        "module": MODULE,
        "title": "Loss under kill: the same SIGKILL schedule against fxgate and a mosquitto bridge",
        "unit": "messages",
        "setup": {
            **{k: v for k, v in setup.items() if k != "qos"},
            "qos_levels": list(setup["qos"]),
            "messages_per_run": messages,
            "readers": PUBLISHING_READERS,
            "fxgate": "python -m actors.app.cli run, defaults + [upstream] + one route at the "
            "run's QoS; SIGKILL of the daemon, then of its Spark JVM; respawned at once",
            "bridge": "mosquitto 2.0.11, deliberate config (persistence, autosave 1 s), bridge "
            "`in` from the source and `out` to the upstream, mqttv311, cleansession false "
            "(bench/bridge.py); SIGKILL, restarted at once on its persistence file",
            "counted_at": "a paho subscriber on the upstream broker, persistent session, "
            "subscribed at the run's QoS, keyed by sha256(topic, payload)",
            "settle": f"after the last publish, until every message arrived or nothing arrived "
            f"for {FXGATE_QUIET_SECONDS:.0f} s (fxgate: its pack processing timeout + 2 s) / "
            f"{BRIDGE_QUIET_SECONDS:.0f} s (bridge)",
        },
        "target": {
            "kind": "report",
            "description": "fxgate: 0 missing at QoS 1 and 2, 0 duplicated at QoS 2",
        },
        "met": met,
        "runs": runs,
    }
    result["headline"] = "; ".join(
        f"QoS {r['qos']} {r['role']}: {r['missing']} missing, {r['duplicated_messages']} dup"
        for r in runs
    )
    result["bound"] = bound_sentence(runs)
    return result


def bound_sentence(runs: list[dict]) -> str:
    parts = []
    for r in runs:
        restarts = [k["restart_to_connected_seconds"] for k in r["kills"]]
        resumed = [
            k["first_arrival_after_kill_seconds"]
            for k in r["kills"]
            if k["first_arrival_after_kill_seconds"] is not None
        ]
        late = [k for k in r["kills"] if k["killed_at"] - k["scheduled"] > 0.5]
        parts.append(
            f"QoS {r['qos']} {r['role']}: {len(r['kills'])} kills, restart to connected "
            f"{min(restarts):.1f}-{max(restarts):.1f} s"
            + (
                f", first upstream arrival {min(resumed):.1f}-{max(resumed):.1f} s after the kill"
                if resumed
                else ""
            )
            + (
                f" ({len(late)} kill(s) waited for forwarding to resume after the previous restart)"
                if late
                else ""
            )
            + f", {r['received']:,} received for {r['published']:,} published: "
            f"{r['missing']} missing, {r['duplicated_messages']} duplicated"
            + (
                ""
                if r["all_arrived"]
                else f" (nothing more arrived for {r['quiet_seconds']:.0f} s)"
            )
        )
    return "; ".join(parts) + "."


# -- table rows and plot --------------------------------------------------------------------


def _cell(run: dict | None) -> str:
    if run is None:
        return "—"
    text = f"{run['missing']:,} missing / {run['duplicated_messages']:,} dup"
    if "table" in run:
        text += f"; table {run['table']['missing']} missing / {run['table']['duplicates']} dup"
    return text


def rows(result: dict) -> list[list[str]]:
    setup = result["setup"]
    out = []
    for qos in setup["qos_levels"]:
        by_role = {r["role"]: r for r in result["runs"] if r["qos"] == qos}
        fx = by_role.get("fxgate")
        met = (
            fx is not None
            and fx["missing"] == 0
            and (qos < 2 or fx["duplicated_messages"] == 0)
            and ("table" not in fx or fx["table"]["missing"] == fx["table"]["duplicates"] == 0)
        )
        out.append(
            [
                f"`{NAME}` QoS {qos}",
                f"{setup['messages_per_run']:,} messages at {setup['rate']} msg/s QoS {qos} to "
                f"the source; the forwarder SIGKILLed {setup['kills']} times at the same seeded "
                "moments and restarted at once; counted at a persistent upstream subscriber",
                f"{_cell(by_role.get('bridge'))} (mosquitto bridge)",
                f"{_cell(fx)} (fxgate)",
                "—",
                "0 missing" + (", 0 dup" if qos == 2 else ""),
                "yes" if met else "**no**",
                f"1+1 runs, {setup['kills']} kills each",
            ]
        )
    return out


def plot(results_dir: Path, result: dict) -> Path:
    path = results_dir / f"{result['name']}.png"
    levels = result["setup"]["qos_levels"]
    fig, axes = plt.subplots(len(levels), 1, figsize=(8, 2.8 * len(levels)), dpi=110, squeeze=False)
    colors = {"fxgate": "tab:orange", "bridge": "tab:green"}
    for ax, qos in zip(axes[:, 0], levels, strict=True):
        for run in (r for r in result["runs"] if r["qos"] == qos):
            bins = run["arrivals_per_half_second"]
            ax.step(
                [0.5 * i for i in range(len(bins))],
                [2 * b for b in bins],
                where="post",
                color=colors[run["role"]],
                label=f"{run['role']}: {run['missing']} missing, {run['duplicated_messages']} dup",
            )
            for kill in run["kills"]:
                ax.axvline(kill["killed_at"], color=colors[run["role"]], linestyle=":", lw=0.9)
        ax.set_title(f"QoS {qos}: upstream arrivals (msg/s); dotted lines: SIGKILLs", fontsize=8)
        ax.set_xlabel("seconds since the first publish")
        ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(result["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, loss, True),)
