"""Recovery (issue 5, item 5): SIGKILL the daemon under steady load, restart it at once.

One run: a fresh mosquitto with a persistent session for fxgate's client id (the broker queues
while the daemon is down), `fxgate run` as a subprocess on the default configuration
(`tests.harness.daemon.DaemonProcess`, the way the crash tests run it), and the FX9600 simulator
publishing single-read QoS 1 messages at `RATE` msg/s from this process for the whole run (in
`CHUNK_SECONDS` chunks, so that it can stop between two). Once the table keeps pace with the
publisher, the daemon is killed `KILLS` times, each time at a random moment
`STEADY_SECONDS` into steady load (every read published more than `STEADY_LAG_SECONDS` ago is
visible), and started again as soon as the killed process has been reaped. Per kill:

(a) restart -> first ingest: from spawning the new process to the first inbound row committed
    after the restart, seen by polling the ledger (`SELECT max(seq) FROM inbound`, read-only,
    every `LEDGER_POLL_SECONDS`); the ledger sends the PUBACK right after that commit. The
    daemon's own log gives the moments it connected, had its Spark session ready and wrote its
    first batch (DESIGN: ingest must not wait for the JVM).
(b) restart -> table caught up: the `reads` table's Delta log is followed as in
    `bench.latency` (a batch is visible once its commit is in the log) and, after the run,
    every row is joined with its message's publish time: caught up = the moment the last read
    published before the restart became visible; and back to steady = the moment the table was
    again within `STEADY_LAG_SECONDS` of the publisher (seen live).
At the end the publisher stops, the daemon drains and is stopped with SIGTERM, and the table must
hold every acknowledged read exactly once (missing / duplicates / unexpected are counted).
"""

from __future__ import annotations

import bisect
import logging
import random
import sqlite3
import statistics
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil

from actors.devtools.simulate import PublishedRecord, simulate
from bench.benchmarks import Benchmark, Context
from bench.harness import (
    FXGATE_CLIENT_ID,
    PUBLISHING_READERS,
    READERS_TOPIC,
    LoadMeter,
    create_session,
    fresh_broker,
    fxgate_env,
    wait_for_quiet,
)
from bench.latency import PublishClock, TableWatcher, defaults, join, publish_times
from spark.tables import READS, table_path
from tests.harness.daemon import DaemonProcess

log = logging.getLogger(__name__)

RATE = 2000.0
KILLS = {True: 1, False: 3}
INGEST_TARGET_SECONDS = 2.0
# "Steady": every read published more than this long ago is visible. A cold start (JVM start,
# then JIT-slow first jobs) leaves a backlog; a kill is only taken once it is worked off.
STEADY_LAG_SECONDS = 6.0
# A kill comes at a random moment this long into steady load.
STEADY_SECONDS = (2.0, 5.0)
# The publisher runs simulate() in chunks so that it can be stopped between two of them.
CHUNK_SECONDS = 5.0
LEDGER_POLL_SECONDS = 0.005
START_TIMEOUT = 180.0
CATCH_UP_TIMEOUT = 300.0
QUIET_OTHER_CORES = 0.3


class SteadyPublisher:
    """The simulator at `rate` msg/s, chunk after chunk, until `stop`; keeps every message's
    publish time (wall clock, when paho took it) and the acknowledged records, in order."""

    def __init__(
        self,
        host: str,
        port: int,
        rate: float,
        seed: int,
        *,
        chunk_seconds: float = CHUNK_SECONDS,
        client_id_prefix: str = "bench-recovery",
    ) -> None:
        self._host, self._port, self._rate, self._seed = host, port, rate, seed
        self._chunk_seconds = chunk_seconds
        self._prefix = client_id_prefix
        self.clock = PublishClock()
        self.records: list[PublishedRecord] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-publisher", daemon=True)

    def start(self) -> SteadyPublisher:
        self._thread.start()
        return self

    def _run(self) -> None:
        per_reader = max(1, round(self._rate * self._chunk_seconds / PUBLISHING_READERS))
        chunk = 0
        try:
            while not self._stop.is_set():
                chunk += 1
                # A seed per chunk: the same seed would repeat payloads, hence message keys.
                result = simulate(
                    self._host,
                    self._port,
                    readers=PUBLISHING_READERS,
                    rate=self._rate,
                    count=per_reader,
                    qos=1,
                    seed=self._seed * 1000 + chunk,
                    client_id_prefix=f"{self._prefix}-{self._seed}-{chunk}",
                    progress=self.clock,
                    ack_timeout=60.0,
                )
                if result.failed:
                    raise RuntimeError(f"chunk {chunk}: {result.failed} messages not acknowledged")
                self.records.extend(result.published)
        except BaseException as error:  # reported by the bench thread
            self.error = error

    def published_before(self, at: float) -> int:
        return bisect.bisect_left(self.clock.times, at)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self._chunk_seconds + 90)
        if self.error is not None:
            raise RuntimeError(f"publisher failed: {self.error}") from self.error


def ledger_max_seq(connection: sqlite3.Connection) -> int:
    return connection.execute("SELECT coalesce(max(seq), 0) FROM inbound").fetchone()[0]


def wait_for_new_row(ledger: Path, after_seq: int, daemon: DaemonProcess, timeout: float):
    """Poll the ledger until a row with seq > `after_seq` is committed; its wall time or None."""
    connection = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=5.0)
    pause = threading.Event()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and daemon.proc.poll() is None:
            if ledger_max_seq(connection) > after_seq:
                return time.time()
            pause.wait(LEDGER_POLL_SECONDS)
    finally:
        connection.close()
    return None


def log_time(line: str) -> float | None:
    """The wall time of a daemon log line ('2026-11-21 13:05:06,251 INFO ...'), local time."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def watch_exit(processes: list[psutil.Process], since: float, into: dict) -> threading.Thread:
    """Record when the killed daemon's JVM(s) exited (they notice the closed pipe on their own)."""

    def run() -> None:
        _gone, alive = psutil.wait_procs(processes, timeout=120)
        into["old_jvm_exit_seconds"] = round(time.time() - since, 3) if not alive else None
        into["old_jvms"] = len(processes)

    thread = threading.Thread(target=run, name="bench-jvm-exit", daemon=True)
    thread.start()
    return thread


def wait_steady(
    watcher: TableWatcher, publisher: SteadyPublisher, give_up, timeout: float
) -> float:
    """Until every read published more than `STEADY_LAG_SECONDS` ago is visible: the table
    keeps pace with the publisher again. Returns the wall time it happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        due = publisher.published_before(time.time() - STEADY_LAG_SECONDS)
        # Short waits: `due` grows with the clock, so it is evaluated again at least twice a second.
        if due and watcher.wait_rows(due, 0.5, give_up):
            return time.time()
        if give_up():
            break
    raise RuntimeError(
        f"the table did not keep within {STEADY_LAG_SECONDS} s of the publisher "
        f"({watcher.visible_rows()} rows visible, {len(publisher.clock.times)} published)"
    )


# Start-up phases of a daemon, as its log states them: (key, text of the first such line).
PHASES = (
    ("first_log_line", " INFO "),
    ("ledger_open", "inbound ledger open"),
    ("recovery", "recovery: "),
    ("source_started", "started source"),
    ("connected", "source: connected"),
    ("spark_ready", "spark writer ready"),
    ("first_batch", " written: "),
)


def phases(daemon: DaemonProcess, spawned: float) -> dict:
    lines = daemon.output().splitlines()
    out = {}
    for key, text in PHASES:
        at = next((log_time(line) for line in lines if text in line and log_time(line)), None)
        out[f"{key}_seconds"] = round(at - spawned, 3) if at is not None else None
    return out


def jvms_of(daemon: DaemonProcess) -> list[psutil.Process]:
    found = []
    for pid in daemon.remember_children():
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return found


def run(ctx: Context) -> dict:
    kills = KILLS[ctx.settings.quick]
    directory = ctx.next_dir("recovery")
    data = directory / "data"
    ledger = data / "ledger.sqlite"
    rng = random.Random(ctx.seed())
    quiet = wait_for_quiet(QUIET_OTHER_CORES, ctx.settings.quiet_timeout)
    daemons: list[DaemonProcess] = []
    records: list[dict] = []
    exits: list[threading.Thread] = []
    jvms: list[psutil.Process] = []  # every Spark JVM of every daemon started here
    publisher: SteadyPublisher | None = None
    watcher = TableWatcher(Path(table_path(data / "tables", READS)))
    pause = threading.Event()  # paces the steady periods; never set

    with fresh_broker(directory / "broker") as broker:
        # The broker queues for fxgate from now on, also while it is down.
        create_session(broker.host, broker.port, FXGATE_CLIENT_ID, READERS_TOPIC, 1)
        env = fxgate_env(broker, data, 1)

        def start_daemon() -> DaemonProcess:
            daemon = DaemonProcess(directory, env)
            daemons.append(daemon)
            daemon.start()
            return daemon

        def give_up() -> bool:
            return daemons[-1].proc.poll() is not None or (
                publisher is not None and publisher.error is not None
            )

        load = LoadMeter()
        try:
            daemon = start_daemon()
            daemon.wait_for_log(r"source: subscribed", timeout=START_TIMEOUT)
            publisher = SteadyPublisher(broker.host, broker.port, RATE, ctx.seed()).start()
            watcher.start()
            steady_since = wait_steady(watcher, publisher, give_up, CATCH_UP_TIMEOUT)
            for number in range(1, kills + 1):
                # A random moment of steady load, as a crash would pick.
                pause.wait(rng.uniform(*STEADY_SECONDS))
                record = {"kill": number}
                old_jvms = jvms_of(daemon)
                jvms.extend(old_jvms)
                record["killed_at"] = killed = time.time()
                record["rows_visible_at_kill"] = watcher.visible_rows()
                daemon.kill()  # SIGKILL, then reaped
                connection = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
                try:
                    last_seq = ledger_max_seq(connection)
                finally:
                    connection.close()
                record["restarted_at"] = restarted = time.time()
                record["kill_to_restart_seconds"] = round(restarted - killed, 3)
                exits.append(watch_exit(old_jvms, killed, record))
                daemon = start_daemon()
                first = wait_for_new_row(ledger, last_seq, daemon, START_TIMEOUT)
                if first is None:
                    raise RuntimeError(f"no ingest after restart {number}:\n{daemon.output()}")
                record["first_ingest_seconds"] = round(first - restarted, 3)
                due = publisher.published_before(restarted)
                record["published_before_restart"] = due
                if not watcher.wait_rows(due, CATCH_UP_TIMEOUT, give_up):
                    raise RuntimeError(
                        f"kill {number}: {watcher.visible_rows()} of {due} rows visible after "
                        f"{CATCH_UP_TIMEOUT} s:\n{daemon.output()[-4000:]}"
                    )
                steady = wait_steady(watcher, publisher, give_up, CATCH_UP_TIMEOUT)
                record["steady_again_seconds"] = round(steady - restarted, 3)
                record.update(phases(daemon, restarted))
                records.append(record)
                print(
                    f"    kill {number}: first ingest {record['first_ingest_seconds']:.2f} s "
                    f"after the restart (first log line {record['first_log_line_seconds']} s, "
                    f"connected {record['connected_seconds']} s, Spark ready "
                    f"{record['spark_ready_seconds']} s, steady again "
                    f"{record['steady_again_seconds']:.1f} s)",
                    flush=True,
                )
            publisher.stop()
            total = len(publisher.records)
            if not watcher.wait_rows(total, CATCH_UP_TIMEOUT, give_up):
                raise RuntimeError(f"{watcher.visible_rows()} of {total} rows visible at the end")
            jvms.extend(jvms_of(daemon))
            exit_code = daemon.terminate()
        finally:
            machine_load = {**load.stop(), "before": quiet}
            if publisher is not None:
                try:
                    publisher.stop()
                except RuntimeError:
                    log.exception("publisher")
            for index, started in enumerate(daemons):
                if started.proc is not None and started.proc.poll() is None:
                    jvms.extend(jvms_of(started))
                    started.kill()
                (directory / f"daemon-{index}.log").write_text(started.output())
            # Each JVM we saw is ended by its psutil handle, which refuses a recycled PID.
            for process in jvms:
                try:
                    if process.is_running():
                        process.kill()
                        process.wait(30)
                except psutil.NoSuchProcess:
                    pass
            watcher.stop()
            for thread in exits:
                thread.join(130)

    sent = publish_times(publisher.records, publisher.clock.times)
    landed = join(data / "tables", watcher.first_seen, sent)
    visible = landed["visible"]
    order = list(sent.items())  # publish order
    for record in records:
        restarted, killed = record["restarted_at"], record["killed_at"]
        before = [key for key, at in order if at < restarted]
        record["caught_up_seconds"] = round(
            max(visible.get(key, float("inf")) for key in before) - restarted, 3
        )
        record["backlog_at_kill"] = sum(1 for key in before if visible.get(key, 1e300) > killed)
        record["lag_at_kill_seconds"] = round(record["backlog_at_kill"] / RATE, 2)
    result = summarize(records, landed, exit_code, machine_load, watcher, publisher)
    result["steady_since_seconds_after_first_publish"] = round(steady_since - order[0][1], 2)
    return result


def summarize(records, landed, exit_code, machine_load, watcher, publisher) -> dict:
    ingest = statistics.median(r["first_ingest_seconds"] for r in records)
    caught_up = statistics.median(r["caught_up_seconds"] for r in records)
    exact = not (landed["missing"] or landed["duplicates"] or landed["unexpected"])
    exactly_once = {k: landed[k] for k in ("rows", "missing", "duplicates", "unexpected")}
    exactly_once["published"] = len(publisher.records)
    config = defaults()
    phase = {
        key: _median([r.get(f"{key}_seconds") for r in records])
        for key in (*(k for k, _ in PHASES), "steady_again", "old_jvm_exit")
    }
    result = {
        "kind": "fxgate-bench",
        "module": "bench.recovery",
        "name": "recovery",
        "title": f"Recovery: SIGKILL of `fxgate run` under {RATE:,.0f} msg/s QoS 1, restarted at "
        "once",
        "metric": "seconds from spawning the new daemon to (a) its first committed inbound row "
        "and (b) every read published before the restart visible in `reads`",
        "unit": "s",
        "method": __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
        "target": {
            "kind": "ingest_within",
            "value": INGEST_TARGET_SECONDS,
            "description": f"first ingest within {INGEST_TARGET_SECONDS:g} s of the restart; "
            "table catch-up reported; every read exactly once",
        },
        "setup": {
            "qos": 1,
            "rate": RATE,
            "readers": PUBLISHING_READERS,
            "kills": len(records),
            "steady_lag_seconds": STEADY_LAG_SECONDS,
            "kill_after_steady_seconds": list(STEADY_SECONDS),
            "daemon": "python -m actors.app.cli run (default configuration, FXGATE__ overrides for "
            "broker, data dir and ids), cold start each time: a new Spark JVM",
            "broker": "actors.devtools.mosquitto.MosquittoProcess defaults; persistent session "
            "created before the first start",
            "ledger_poll_seconds": LEDGER_POLL_SECONDS,
            "config": config,
        },
        "kills": records,
        "first_ingest_seconds_median": ingest,
        "caught_up_seconds_median": caught_up,
        "phases_seconds_median": phase,
        "exactly_once": exactly_once,
        "unobserved_rows": landed["unobserved"],
        "final_exit_code": exit_code,
        "watcher": watcher.resolution(),
        "raw": [{"role": "fxgate", "round": 1, "machine_load": machine_load}],
        "timeline": timeline(publisher, watcher, records),
    }
    result["met"] = ingest <= INGEST_TARGET_SECONDS and exact
    result["headline"] = (
        f"{len(records)} kill(s): first ingest {ingest:.2f} s after restart (median), table "
        f"caught up {caught_up:.1f} s after restart; {exactly_once['published']:,} published, "
        f"{landed['missing']} missing, {landed['duplicates']} duplicates"
    )
    backlog = statistics.median(r["backlog_at_kill"] for r in records)
    result["bound"] = (
        f"A restart is a cold start (medians, seconds after the spawn): the first log line at "
        f"{phase['first_log_line']} (Python imports and the configuration), the ledger open at "
        f"{phase['ledger_open']}, the source connected at {phase['connected']} and the first "
        f"new row committed at {ingest:.2f}, while the new Spark session only became ready at "
        f"{phase['spark_ready']}: ingest does not wait for the JVM, and the time to it is the "
        f"process start-up before the connect. The table lags until the JVM is up and its "
        f"first (JIT-slow) job is done (first batch at {phase['first_batch']}): "
        f"{backlog:,.0f} reads (median; {backlog / RATE:.1f} s of publishing, the steady "
        f"batching lag) were not yet visible at the kill; all reads published before the "
        f"restart were visible at {caught_up:.1f}, "
        f"and the table kept within {STEADY_LAG_SECONDS:g} s of the publisher again at "
        f"{phase['steady_again']}. The killed daemon's JVM exited on its own "
        f"{phase['old_jvm_exit']} s after the kill, competing for the 2 vCPUs with the new "
        "start."
    )
    return result


def _median(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def timeline(publisher: SteadyPublisher, watcher: TableWatcher, records: list[dict]) -> dict:
    """Published and visible counts over time (seconds from the first publish), for the plot."""
    times = publisher.clock.times
    if not times:
        return {}
    origin = times[0]
    published = [[round(t - origin, 2), i + 1] for i, t in enumerate(times) if i % 500 == 0]
    published.append([round(times[-1] - origin, 2), len(times)])
    visible, total = [], 0
    for key, at in sorted(watcher.first_seen.items(), key=lambda kv: kv[1]):
        total += watcher.rows.get(key, 0)
        visible.append([round(at - origin, 2), total])
    marks = [
        {
            "kill": round(r["killed_at"] - origin, 2),
            "restart": round(r["restarted_at"] - origin, 2),
            "first_ingest": round(r["restarted_at"] + r["first_ingest_seconds"] - origin, 2),
            "caught_up": round(r["restarted_at"] + r["caught_up_seconds"] - origin, 2),
        }
        for r in records
    ]
    return {"published": published, "visible": visible, "kills": marks}


def rows(result: dict) -> list[list[str]]:
    kills = len(result["kills"])
    once = result["exactly_once"]
    phase = result["phases_seconds_median"]
    return [
        [
            "`recovery` ingest",
            f"SIGKILL of `fxgate run` under {result['setup']['rate']:,.0f} msg/s QoS 1, "
            "restarted at once: spawn → first inbound row committed in the ledger (acked "
            "right after)",
            "—",
            f"{result['first_ingest_seconds_median']:.2f} s (connected {phase['connected']} s; "
            f"Spark ready {phase['spark_ready']} s)",
            "—",
            f"≤ {result['target']['value']:g} s",
            "yes"
            if result["first_ingest_seconds_median"] <= result["target"]["value"]
            else "**no**",
            f"{kills} kill(s)",
        ],
        [
            "`recovery` → table",
            "same kills: spawn → every read published before the restart visible in the "
            "Delta `reads` table; the whole run checked for exactly once",
            "—",
            f"{result['caught_up_seconds_median']:.1f} s; {once['published']:,} published: "
            f"{once['missing']} missing / {once['duplicates']} dup",
            "—",
            "report only; each read once",
            "yes"
            if not (once["missing"] or once["duplicates"] or once["unexpected"])
            else "**no**",
            f"{kills} kill(s)",
        ],
    ]


def plot(results_dir: Path, result: dict) -> Path:
    import matplotlib.pyplot as plt

    path = results_dir / f"{result['name']}.png"
    line = result.get("timeline") or {}
    fig, ax = plt.subplots(figsize=(8, 4.6), dpi=110)
    if line.get("published"):
        ax.plot(*zip(*line["published"], strict=True), color="tab:blue", label="published")
    if line.get("visible"):
        ax.step(
            *zip(*line["visible"], strict=True),
            where="post",
            color="tab:orange",
            label="rows visible in `reads`",
        )
    for index, mark in enumerate(line.get("kills", [])):
        first = index == 0
        ax.axvline(mark["kill"], color="tab:red", linewidth=1, label="SIGKILL" if first else None)
        ax.axvline(
            mark["first_ingest"],
            color="tab:green",
            linestyle="--",
            linewidth=0.8,
            label="first ingest after restart" if first else None,
        )
        ax.axvline(
            mark["caught_up"],
            color="tab:purple",
            linestyle=":",
            linewidth=1,
            label="table caught up" if first else None,
        )
    ax.set_xlabel("seconds since the first publish")
    ax.set_ylabel("reads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{result['title']}\n{result['headline']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark("recovery", run, True),)
