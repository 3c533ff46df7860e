"""`fxgate status`: what the gateway is doing, read from its data directory without disturbing it.

The running daemon writes `status.json` every second (connection state, live counters); the
ledger is read through a read-only SQLite connection (WAL lets it read while the daemon writes);
the tables are counted with plain pyarrow, so no JVM is started.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from actors.app.daemon import status_path
from actors.config.schema import Config
from persistence.disk_budget import human
from persistence.storage_faults import corrupt_files
from spark.reader_health import summary


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ledger(path: Path) -> dict:
    from persistence.database import ledger_version, open_engine
    from persistence.ledger_store import PACK_COUNTER, LedgerStore
    from persistence.records import TABLE, UPSTREAM

    if ledger_version(path) == 0:
        return {"exists": False}  # no ledger yet, or the daemon is creating it right now
    engine = open_engine(path, readonly=True)
    store = LedgerStore(engine, path)
    try:
        last = store.last_batch()
        committed, open_batches = store.batch_counts()
        table, upstream = store.lag(TABLE), store.lag(UPSTREAM)
        usage = store.usage()
        return {
            "exists": True,
            "pending_messages": table.messages,
            # When the oldest read not yet in the table arrived: the table's lag.
            "oldest_pending_received_time": table.oldest_received_time,
            # The same for the upstream: messages not yet acknowledged there (nor given up on).
            "upstream_pending_messages": upstream.messages,
            "oldest_upstream_received_time": upstream.oldest_received_time,
            "used_bytes": usage.used_bytes,
            "free_bytes": usage.free_bytes,
            "last_pack_id": store.counter(PACK_COUNTER) or None,
            "awaiting_pubrel": len(store.awaiting_pubrel()),
            # Each reader's health as of the last committed batch (spark.reader_health).
            "reader_health": store.reader_health(),
            "batches_committed": committed,
            "batches_open": open_batches,
            "last_batch": None
            if last is None
            else {
                "batch_id": last[0],
                "committed_time": last[1],
                "rows": last[2],
                "dead_letters": last[3],
            },
        }
    finally:
        store.close()


def _tables(tables_dir: Path | str) -> dict:
    from spark.tables import DEAD_LETTERS, READS, TablesNotReadable, count_rows

    try:
        return {name: count_rows(tables_dir, name) for name in (READS, DEAD_LETTERS)}
    except TablesNotReadable as error:
        # Tables on a cluster file system pyarrow cannot open: status starts no JVM to count them.
        return {READS: None, DEAD_LETTERS: None, "unreadable": str(error)}
    except OSError as error:
        # An object store that is down or refuses (delta-rs raises OSError): said, not a crash.
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return {READS: None, DEAD_LETTERS: None, "unreadable": f"{tables_dir}: {first}"}


def collect_status(config: Config, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    daemon: dict = {"running": False}
    path = status_path(config)
    if path.exists():
        snapshot = json.loads(path.read_text())
        daemon = {**snapshot, "running": _pid_alive(snapshot.get("pid"))}
    ledger = _ledger(config.gateway.ledger_path)
    corrupt = [str(p) for p in corrupt_files(config.gateway.data_path)]
    silent_limit = config.gateway.health_reader_silent_seconds
    readers = {
        reader: summary(state, now, silent_limit)
        for reader, state in sorted((ledger.get("reader_health") or {}).items())
    }
    oldest = ledger.get("oldest_pending_received_time")
    oldest_upstream = ledger.get("oldest_upstream_received_time")
    return {
        "now": now,
        "table_lag_seconds": None if oldest is None else max(0.0, now - oldest),
        "upstream_lag_seconds": None
        if oldest_upstream is None
        else max(0.0, now - oldest_upstream),
        "budget": {
            "max_bytes": config.ledger.max_bytes,
            "min_free_bytes": config.ledger.min_free_bytes,
        },
        "daemon": daemon,
        "ledger": ledger,
        "tables": _tables(config.spark.tables_path(config.gateway.data_path)),
        "group_tables": config.group_tables,
        "member": config.identity.client_id,
        "data_dir": str(config.gateway.data_path),
        "corrupt_files": corrupt,
        "readers": readers,
        "reader_silent_seconds": silent_limit,
    }


def format_status(report: dict) -> str:
    daemon = report["daemon"]
    lines = [f"data dir:   {report['data_dir']}"]
    if daemon.get("running"):
        written = daemon.get("wall_time")
        age = "" if written is None else f", status written {report['now'] - written:.0f} s ago"
        lines.append(f"daemon:     running (pid {daemon.get('pid')}{age})")
    else:
        lines.append("daemon:     not running")
    source = daemon.get("source")
    if source:
        reason = source.get("last_reason") or "-"
        lines.append(
            f"source:     {source['state']} as {source['client_id']} "
            f"(connects {source['connects']}, disconnects {source['disconnects']}, "
            f"last reason: {reason})"
        )
    upstream = daemon.get("upstream")
    if upstream:
        lines.append(
            f"upstream:   {upstream['state']} as {upstream['client_id']} "
            f"(connects {upstream['connects']}, disconnects {upstream['disconnects']}, "
            f"last reason: {upstream.get('last_reason') or '-'})"
        )
    for name in ("source", "upstream") if daemon.get("running") else ():
        refused = (daemon.get(name) or {}).get("refused_subscriptions") or {}
        for topic, why in sorted(refused.items()):
            lines.append(
                f"REFUSED:    the {name} broker refused the subscription to {topic} ({why}): "
                "nothing arrives on it until a SUBACK grants it (check the broker's ACL)"
            )
    outbound = daemon.get("outbound")
    if outbound:
        outbound = {**outbound, **daemon.get("buffer", {})}
        lines.append(
            f"forwarding: {outbound['in_flight']} in flight (window {outbound['window']}), "
            f"tier 2 {outbound['tier2_messages']} messages / {outbound['tier2_bytes']} bytes, "
            f"{outbound['forwarded']} forwarded, {outbound['dead']} dead-lettered, "
            f"{outbound['dropped_qos0']} QoS 0 dropped, "
            f"{outbound.get('dropped_at_restart', 0)} live-only not forwarded after the restart"
        )
    clients = (daemon.get("lifecycle") or []) if daemon.get("running") else []
    for client in clients:
        lines.append(
            f"events:     {client['name']} {client['client_id']}: {client['state']}, sequence "
            f"{client.get('sequence_number') or 0}, last reason "
            f"{client.get('last_reason') or '-'}"
        )
    live = daemon.get("ledger") if daemon.get("running") else None
    if live:
        paused = ", ".join(live.get("paused_by") or []) or "no"
        intake = daemon.get("intake") or {}
        lines.append(
            f"intake:     {intake.get('waiting_messages', 0)} message(s) handed to the ledger "
            f"and not yet stored; source paused: {paused}"
        )
        budget = live.get("budget") or {}
        if budget.get("paused"):
            lines.append(
                f"PAUSED:     the ledger is at its disk budget ({budget.get('describe')}): the "
                "source's socket is not read; the broker's queue limits decide what is lost "
                "until the sinks catch up"
            )
        if live.get("storage_error"):
            lines.append(
                f"STORAGE:    the ledger cannot write for "
                f"{live.get('storage_failing_seconds') or 0:.0f} s ({live['storage_error']}): "
                f"nothing is acknowledged, {live.get('storage_backlog', 0)} message(s) wait in "
                f"memory, retrying"
            )
    outbound_live = daemon.get("outbound") if daemon.get("running") else None
    if outbound_live and outbound_live.get("storage_error"):
        lines.append(
            f"STORAGE:    the outbound ledger cannot write ({outbound_live['storage_error']}): "
            "forwarding waits, retrying"
        )
    compaction = daemon.get("compaction") if daemon.get("running") else None
    if compaction:
        lines.append(compaction_line(compaction, report["now"]))
    spark = daemon.get("spark") if daemon.get("running") else None
    if spark and spark.get("failures"):
        retry = spark.get("next_retry_time")
        due = "" if retry is None else f", next retry in {max(retry - report['now'], 0):.0f} s"
        lines.append(
            f"SPARK:      {spark['failures']} failed attempt(s) in a row "
            f"({spark.get('total_failures', 0)} in all), last error: "
            f"{spark.get('last_error') or '-'}{due}; the rows wait in the ledger"
        )
    for moved in report.get("corrupt_files") or []:
        lines.append(
            f"CORRUPT:    {moved} was moved aside at start; fxgate refuses to start until it "
            "is salvaged or removed (docs: operating/faults)"
        )
    ledger = report["ledger"]
    if ledger.get("exists"):
        lines.append(
            f"ledger:     {ledger['pending_messages']} message(s) not yet in the table, "
            f"{ledger['awaiting_pubrel']} QoS 2 awaiting PUBREL, "
            f"{ledger['batches_open']} batch(es) open, "
            f"last pack {ledger.get('last_pack_id') or '-'}"
        )
        lag = report.get("table_lag_seconds")
        lines.append(
            "table lag:  none (every stored read is in the table)"
            if lag is None
            else f"table lag:  {lag:.1f} s, {ledger['pending_messages']} message(s) "
            "(the oldest read not yet in the table arrived then)"
        )
        upstream_lag = report.get("upstream_lag_seconds")
        if upstream_lag is not None or daemon.get("outbound"):
            lines.append(
                "upstream lag: none (every stored read that goes upstream is there)"
                if upstream_lag is None
                else f"upstream lag: {upstream_lag:.1f} s, "
                f"{ledger.get('upstream_pending_messages', 0)} message(s) not yet acknowledged "
                "upstream"
            )
        budget = report.get("budget")
        if budget and ledger.get("used_bytes") is not None:
            lines.append(
                f"disk:       ledger uses {human(ledger['used_bytes'])} of its "
                f"{human(budget['max_bytes'])} budget; {human(ledger['free_bytes'])} free "
                f"(at least {human(budget['min_free_bytes'])} must stay free)"
            )
        last = ledger.get("last_batch")
        if last:
            lines.append(
                f"last batch: {last['batch_id']} ({last['rows']} rows, "
                f"{last['dead_letters']} dead letters)"
            )
    else:
        lines.append("ledger:     none yet")
    lines.extend(_reader_lines(report))
    tables = report["tables"]
    group = report.get("group_tables")
    whose = f"group {group}'s, shared by its members: " if group else ""
    lines.append(
        f"tables:     {whose}not counted: {tables['unreadable']}"
        if tables.get("unreadable")
        else f"tables:     {whose}reads {tables['reads']} rows, "
        f"dead_letters {tables['dead_letters']} rows"
    )
    share = daemon.get("group") if daemon.get("running") else None
    if share:
        lines.append(
            f"this member: {share['member']} landed {share['rows_landed']} row(s) since its "
            f"start; {share['already_landed']} more of its reads were in the table already "
            f"(another member landed them); {share['merges_retried']} merge(s) lost a commit "
            "race and were merged again"
        )
    return "\n".join(lines)


def _reader_lines(report: dict) -> list[str]:
    """One line per reader: its heartbeats, its own counters and the reconciliation (this
    gateway's share only), and a SILENT line for a reader gone quiet."""
    lines = []
    for reader, r in (report.get("readers") or {}).items():
        age = r["heartbeat_age_seconds"]
        heard = "no heartbeat yet" if age is None else f"last heartbeat {age:.0f} s ago"
        events = ", ".join(f"{n} {kind}" for kind, n in sorted(r["events"].items()))
        reported = r["reported"]
        own = (
            "its counters: -"
            if reported["sent"] is None
            else f"its counters: sent {reported['sent']}, received {reported['received']}, "
            f"retained {reported['retained']}, dropped {reported['dropped']}"
        )
        rec = r["reconciliation"]
        if rec["intervals"]:
            balance = (
                f"reconciliation (per gateway): {rec['unaccounted']} sent and not received "
                f"here over {rec['intervals']} heartbeat interval(s), last "
                f"{rec['last_interval_sent']} sent / {rec['last_interval_received']} received"
            )
        else:
            balance = "reconciliation (per gateway): needs two heartbeats"
        if rec["counter_resets"]:
            balance += f", {rec['counter_resets']} counter reset(s) not counted"
        lines.append(
            f"reader:     {reader}: {heard} ({r['heartbeats']} heartbeat(s)"
            f"{', ' + events if events else ''}), {r['data_messages']} data message(s) "
            f"received; {own}; {balance}"
        )
        if r["silent"]:
            lines.append(
                f"SILENT:     {reader} has sent nothing for {r['silent_seconds']:.0f} s "
                f"(limit {report.get('reader_silent_seconds', 0):g} s)"
            )
    return lines


def compaction_line(compaction: dict, now: float) -> str:
    """What compaction did last and when it runs next."""
    upcoming = compaction.get("next_pass_time")
    due = "" if upcoming is None else f"; next pass in {max(upcoming - now, 0):.0f} s"
    outcome = compaction.get("last_outcome")
    if outcome is None:
        return f"compaction: no pass yet{due}"
    ago = max(now - (compaction.get("last_time") or now), 0)
    return (
        f"compaction: {compaction.get('passes', 0)} pass(es), "
        f"{compaction.get('files_compacted', 0)} file(s) compacted, "
        f"{compaction.get('files_vacuumed', 0)} vacuumed, "
        f"{compaction.get('failed_passes', 0)} failed; last {ago:.0f} s ago "
        f"({compaction.get('last_reason')}): {outcome}: {compaction.get('last_summary')}{due}"
    )
