"""/metrics and /healthz: the collector and the health rules on fabricated status snapshots and
a simulated clock, the HTTP endpoint in-process, and one real scrape of the daemon after a
workload."""

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.exposition import generate_latest

from actors.app.metrics import HealthThresholds, MetricsServer, StatusBoard, build_registry
from actors.clock import SimulatedClock
from actors.devtools.broker_process import free_port
from actors.devtools.simulate import simulate
from spark.reader_health import ReaderHealth
from tests.harness.checks import wait_until

THRESHOLDS = HealthThresholds(
    connection_down_seconds=120.0, status_stale_seconds=30.0, writer_stalled_seconds=300.0
)


def snapshot(
    source_state="connected",
    *,
    pending=0,
    batches=0,
    stale=False,
    forwarding=False,
    actors_alive=True,
    **extra,
) -> dict:
    """A status snapshot shaped as `Supervisor.status()` plus what the daemon adds."""
    names = ["ledger", "spark-writer", "packs", "source"]
    out = {
        "actors": dict.fromkeys(names, actors_alive),
        "source": {
            "name": "source",
            "state": source_state,
            "client_id": "fxgate-local-gw-gw",
            "last_reason": None if source_state == "connected" else "ConnectionLost",
            "connects": 3,
            "disconnects": 2,
            "next_attempt_in": None,
        },
        "ledger": {
            "accepted": 500,
            "duplicates": 7,
            "unknown_pubrel": 0,
            "commits": 12,
            "pending": pending,
            "awaiting_pubrel": 4,
            "paused_by": [],
            "lag": {
                "table": {"messages": pending, "oldest_age_seconds": 1.5},
            },
            "budget": {
                "paused": False,
                "pauses": 0,
                "max_bytes": 4 * 1024**3,
                "min_free_bytes": 1024**3,
                "used_bytes": 123456,
                "free_bytes": 50 * 1024**3,
                "describe": "…",
            },
        },
        "intake": {
            "waiting_messages": 11,
            "waiting_bytes": 2750,
            "peak_messages": 40,
            "peak_bytes": 10000,
            "holds": 0,
            "held_seconds": 0.0,
        },
        "batches_written": batches,
        "last_batch": {
            "batch_id": 5,
            "messages": 200,
            "rows": 200,
            "dead_letters": 1,
            "seconds": 0.25,
        },
        "rows_written": 480,
        "dead_letters_written": 2,
        "restarts": 1,
        "wall_time": 1_800_000_000.0,
        "pid": 4242,
    }
    if stale:
        out["stale"] = True
    if forwarding:
        out["actors"].update({"outbound": True, "buffer": True, "upstream": True})
        out["upstream"] = {**out["source"], "name": "upstream", "state": "connected"}
        out["upstream"]["last_reason"] = None
        out["outbound"] = {
            "connected": True,
            "window": 20,
            "in_flight": 6,
            "forwarded": 300,
            "failed_acks": 0,
            "retries": 2,
            "dead": 3,
            "resent": 0,
            "possible_duplicates": 0,
        }
        out["buffer"] = {
            "tier2_messages": 40,
            "tier2_bytes": 10000,
            "dropped_qos0": 8,
        }
        out["ledger"]["lag"]["upstream"] = {"messages": 900, "oldest_age_seconds": 42.0}
    out.update(extra)
    return out


@pytest.fixture
def clock():
    return SimulatedClock(start_monotonic=0.0)


@pytest.fixture
def board(clock):
    return StatusBoard(clock, THRESHOLDS)


def sample(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_the_collector_exports_every_figure_of_the_snapshot(board):
    board.publish(snapshot(forwarding=True, pending=20, batches=5))
    registry = build_registry(board)
    expected = {
        ("fxgate_connection_up", "source"): 1,
        ("fxgate_connection_connects_total", "source"): 3,
        ("fxgate_connection_reconnects_total", "source"): 2,
        ("fxgate_connection_disconnects_total", "source"): 2,
        ("fxgate_connection_up", "upstream"): 1,
        ("fxgate_messages_received_total", None): 507,
        ("fxgate_messages_accepted_total", None): 500,
        ("fxgate_messages_duplicates_total", None): 7,
        ("fxgate_ledger_pending_messages", None): 20,
        ("fxgate_ledger_awaiting_pubrel", None): 4,
        ("fxgate_intake_waiting_messages", None): 11,
        ("fxgate_tier2_messages", None): 40,
        ("fxgate_tier2_bytes", None): 10000,
        ("fxgate_source_paused", None): 0,
        ("fxgate_ledger_budget_bytes", None): 4 * 1024**3,
        ("fxgate_ledger_used_bytes", None): 123456,
        ("fxgate_ledger_free_bytes", None): 50 * 1024**3,
        ("fxgate_dropped_qos0_total", None): 8,
        ("fxgate_upstream_in_flight", None): 6,
        ("fxgate_messages_forwarded_total", None): 300,
        ("fxgate_forward_dead_letters_total", None): 3,
        ("fxgate_batches_written_total", None): 5,
        ("fxgate_landed_rows_total", None): 480,
        ("fxgate_landed_dead_letters_total", None): 2,
        ("fxgate_last_batch_duration_seconds", None): 0.25,
        ("fxgate_actor_restarts_total", None): 1,
        ("fxgate_healthy", None): 1,
    }
    for (name, connection), value in expected.items():
        labels = {} if connection is None else {"connection": connection}
        assert sample(registry, name, **labels) == value, name
    # Each sink's own lag.
    assert sample(registry, "fxgate_sink_lag_messages", sink="table") == 20
    assert sample(registry, "fxgate_sink_lag_messages", sink="upstream") == 900
    assert sample(registry, "fxgate_sink_lag_seconds", sink="upstream") == 42.0


def test_maintenance_passes_files_and_the_last_pass_are_exported(board):
    board.publish(snapshot())
    assert sample(build_registry(board), "fxgate_compaction_passes_total") is None
    report = {
        "passes": 3,
        "failed_passes": 1,
        "files_compacted": 70,
        "files_vacuumed": 65,
        "last_outcome": "compacted",
        "last_seconds": 12.5,
    }
    board.publish(snapshot(compaction=report))
    registry = build_registry(board)
    assert sample(registry, "fxgate_compaction_passes_total") == 3
    assert sample(registry, "fxgate_compaction_failed_passes_total") == 1
    assert sample(registry, "fxgate_compaction_files_compacted_total") == 70
    assert sample(registry, "fxgate_compaction_files_vacuumed_total") == 65
    assert sample(registry, "fxgate_compaction_last_pass_seconds") == 12.5


def test_a_shared_group_members_copies_skipped_merges_retried_and_optimizes_lost_are_exported(
    board,
):
    board.publish(snapshot())
    alone = build_registry(board)
    assert sample(alone, "fxgate_group_rows_already_landed_total") is None
    group = {"already_landed": 24, "merges_retried": 3, "rows_landed": 500}
    compaction = {"passes": 2, "optimizes_lost": 1}
    board.publish(snapshot(group=group, compaction=compaction))
    registry = build_registry(board)
    assert sample(registry, "fxgate_group_rows_already_landed_total") == 24
    assert sample(registry, "fxgate_group_merges_retried_total") == 3
    assert sample(registry, "fxgate_compaction_optimizes_lost_total") == 1


def test_a_connection_that_is_not_connected_exports_0_and_how_long_it_has_been_down(board, clock):
    board.publish(snapshot("waiting"))
    clock.advance(42)
    board.publish(snapshot("connecting"))
    registry = build_registry(board)
    assert sample(registry, "fxgate_connection_up", connection="source") == 0
    assert sample(registry, "fxgate_connection_down_seconds", connection="source") == 42
    # Without forwarding there is no upstream series at all, rather than a misleading 0.
    assert sample(registry, "fxgate_connection_up", connection="upstream") is None


def test_before_the_first_snapshot_only_health_is_exported(board):
    registry = build_registry(board)
    assert sample(registry, "fxgate_healthy") == 1
    assert sample(registry, "fxgate_messages_received_total") is None


def test_health_turns_bad_only_after_a_connection_stays_down_past_the_threshold(board, clock):
    board.publish(snapshot())
    assert board.health().healthy
    board.publish(snapshot("waiting"))
    clock.advance(119)
    board.publish(snapshot("waiting"))
    assert board.health().healthy
    clock.advance(2)
    board.publish(snapshot("connecting"))
    health = board.health()
    assert not health.healthy
    assert "source connection down for 121 s" in health.reasons[0]
    assert "ConnectionLost" in health.reasons[0]
    board.publish(snapshot("connected"))
    assert board.health().healthy


def test_a_flapping_connection_restarts_the_down_timer_each_time_it_comes_back(board, clock):
    for _ in range(5):
        board.publish(snapshot("waiting"))
        clock.advance(100)
        board.publish(snapshot("connected"))
        assert board.health().healthy


def test_a_status_snapshot_older_than_the_threshold_is_unhealthy(board, clock):
    board.publish(snapshot())
    clock.advance(31)
    health = board.health()
    assert not health.healthy
    assert "status snapshot for 31 s" in health.reasons[0]
    assert health.as_json()["status_age_seconds"] == 31


def test_a_snapshot_whose_asks_timed_out_does_not_count_as_fresh(board, clock):
    board.publish(snapshot())
    clock.advance(20)
    board.publish(snapshot(stale=True))
    clock.advance(20)
    assert not board.health().healthy


def test_no_snapshot_at_all_turns_unhealthy_after_the_stale_threshold(board, clock):
    assert board.health().healthy
    clock.advance(31)
    assert "no status snapshot yet" in board.health().reasons[0]


def test_rows_waiting_with_no_batch_landing_is_a_stuck_writer(board, clock):
    board.publish(snapshot(pending=50, batches=4))
    clock.advance(301)
    board.publish(snapshot(pending=50, batches=4))
    health = board.health()
    assert not health.healthy
    assert "writer stuck" in health.reasons[0]
    board.publish(snapshot(pending=50, batches=5))
    assert board.health().healthy


def test_an_idle_gateway_with_nothing_pending_stays_healthy(board, clock):
    for _ in range(10):
        clock.advance(100)
        board.publish(snapshot(pending=0, batches=4))
    assert board.health().healthy


def test_a_dead_actor_is_unhealthy(board):
    board.publish(snapshot(actors_alive=False))
    assert "actor ledger is not alive" in board.health().reasons


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_http_endpoint_serves_metrics_and_health_from_the_board(board, clock):
    server = MetricsServer("127.0.0.1", 0, board)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        board.publish(snapshot())
        status, body = get(f"{base}/metrics")
        assert status == 200
        assert 'fxgate_connection_up{connection="source"} 1.0' in body
        status, body = get(f"{base}/healthz")
        assert status == 200
        assert json.loads(body)["status"] == "ok"
        board.publish(snapshot("waiting"))
        clock.advance(121)
        board.publish(snapshot("waiting"))
        status, body = get(f"{base}/healthz")
        assert status == 503
        assert json.loads(body)["reasons"][0].startswith("source connection down for 121 s")
        assert get(f"{base}/nothing")[0] == 404
    finally:
        server.stop()


def scrape(base: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    _, body = get(f"{base}/metrics")
    values = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            key = s.name + "".join(f"[{v}]" for v in s.labels.values())
            values[key] = s.value
    return values


@pytest.mark.broker
@pytest.mark.spark
def test_a_scrape_of_the_running_daemon_shows_the_workload_and_health_follows_the_broker(
    mosquitto, daemon_factory, tmp_path
):
    port = free_port()
    env = {
        "FXGATE__SOURCE__PORT": str(mosquitto.port),
        "FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data"),
        "FXGATE__GATEWAY__METRICS_PORT": str(port),
        "FXGATE__GATEWAY__HEALTH_CONNECTION_DOWN_SECONDS": "1",
        "FXGATE__PACKS__LINGER_SECONDS": "0.2",
        "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
    }
    daemon = daemon_factory(env)
    daemon.wait_for_log(rf"metrics on http://127.0.0.1:{port}/metrics", timeout=60)
    daemon.wait_for_log(r"source: subscribed to zebra/fx/\+/reads", timeout=60)
    base = f"http://127.0.0.1:{port}"
    assert wait_until(lambda: scrape(base).get("fxgate_connection_up[source]") == 1, 30)
    # The daemon's own life-cycle events are messages it accepts too: the baseline is taken once
    # those of its start (created, then connected) are counted.
    daemon.wait_for_log(r"lifecycle MQTTClientSessionConnected", timeout=60)
    events = daemon.count_logs(r"actors\.lifecycle: lifecycle MQTTClient")
    assert wait_until(
        lambda: scrape(base).get("fxgate_messages_accepted_total", 0) >= events, 30
    ), scrape(base)
    before = scrape(base)

    sent = simulate(mosquitto.host, mosquitto.port, readers=2, rate=0, count=100, qos=1)
    assert len(sent.published) == 200
    assert wait_until(lambda: scrape(base).get("fxgate_landed_rows_total", 0) >= 200, 180), (
        daemon.output()
    )
    after = scrape(base)
    assert after["fxgate_messages_accepted_total"] - before["fxgate_messages_accepted_total"] == 200
    assert after["fxgate_messages_received_total"] >= 200
    assert after["fxgate_landed_rows_total"] == 200
    assert after["fxgate_batches_written_total"] >= 1
    assert after["fxgate_last_batch_duration_seconds"] > 0
    assert after["fxgate_connection_connects_total[source]"] >= 1
    status, body = get(f"{base}/healthz")
    assert (status, json.loads(body)["status"]) == (200, "ok")

    mosquitto.stop()
    assert wait_until(lambda: get(f"{base}/healthz")[0] == 503, 30), get(f"{base}/healthz")
    reasons = json.loads(get(f"{base}/healthz")[1])["reasons"]
    assert any("source connection down" in reason for reason in reasons)
    assert scrape(base)["fxgate_connection_up[source]"] == 0
    assert daemon.terminate() == 0


def test_each_clients_life_cycle_sequence_number_is_exported(board):
    clients = [
        {"name": "source", "client_id": "fxgate-site1-gw1", "sequence_number": 7},
        {"name": "upstream", "client_id": "fxgate-upstream-site1-gw1", "sequence_number": 2},
    ]
    board.publish(snapshot(lifecycle=clients))
    registry = build_registry(board)
    for client in clients:
        labels = {"connection": client["name"], "client_id": client["client_id"]}
        value = sample(registry, "fxgate_lifecycle_sequence_number", **labels)
        assert value == client["sequence_number"]


def test_a_ledger_that_cannot_write_is_unhealthy_at_once_and_exported(board):
    failing = snapshot()
    failing["ledger"].update(
        storage_error="database or disk is full (SQLITE_FULL)",
        storage_failing_seconds=3.0,
        storage_backlog=50,
        storage_failures=4,
    )
    board.publish(failing)
    health = board.health()
    assert not health.healthy
    (reason,) = health.reasons
    assert "inbound ledger cannot write for 3 s (database or disk is full (SQLITE_FULL))" in reason
    assert "50 message(s) wait in memory" in reason
    text = generate_latest(build_registry(board)).decode()
    assert "fxgate_ledger_storage_failing 1.0" in text
    assert "fxgate_ledger_storage_backlog 50.0" in text
    assert "fxgate_ledger_storage_failures_total 4.0" in text
    board.publish(snapshot())
    assert board.health().healthy


def test_a_ledger_at_its_disk_budget_is_unhealthy_with_the_budget_named_and_flagged(board):
    paused = snapshot()
    paused["ledger"]["budget"].update(
        paused=True, pauses=1, describe="[ledger] max_bytes = 2.00 MiB: 2.10 MiB used; …"
    )
    board.publish(paused)
    health = board.health()
    assert not health.healthy
    assert any(
        "source paused: the ledger is at its disk budget ([ledger] max_bytes = 2.00 MiB" in r
        for r in health.reasons
    )
    registry = build_registry(board)
    assert sample(registry, "fxgate_source_paused") == 1
    assert sample(registry, "fxgate_source_pauses_total") == 1


def test_each_readers_event_counters_are_exported_by_reader(board):
    board.publish(
        snapshot(
            readers={
                "fx9600-01": {
                    "received": 1000,
                    "missing": 12,
                    "resets": 1,
                    "without_event_num": 3,
                    "last_event_num": 40,
                }
            }
        )
    )
    registry = build_registry(board)
    labels = {"reader": "fx9600-01"}
    assert sample(registry, "fxgate_reader_missing_events_total", **labels) == 12
    assert sample(registry, "fxgate_reader_events_total", **labels) == 1000
    assert sample(registry, "fxgate_reader_counter_resets_total", **labels) == 1
    assert sample(registry, "fxgate_reader_events_without_event_num_total", **labels) == 3
    assert sample(registry, "fxgate_reader_last_event_num", **labels) == 40


# -- reader health ----------------------------------------------------------------------------


def reader_state(clock, heard_ago: float, heartbeat_ago: float, **overrides) -> dict:
    """A spark.reader_health state whose times lie in the simulated clock's past."""
    state = ReaderHealth(
        last_heard_time=clock.wall() - heard_ago,
        last_heartbeat_time=clock.wall() - heartbeat_ago,
        heartbeats=4,
        events={"gpi": 2, "error": 1},
        data_messages=1500,
        received=1510,
        sent=1500,
        retained=0,
        dropped=3,
        paths=1,
        baseline_sent=1500,
        intervals=3,
        unaccounted=7,
        counter_resets=1,
    ).state()
    state.update(overrides)
    return state


def test_each_readers_heartbeats_counters_and_reconciliation_are_exported_by_reader(board, clock):
    board.publish(snapshot(reader_health={"fx9600-01": reader_state(clock, 2.0, 12.0)}))
    registry = build_registry(board)
    r = {"reader": "fx9600-01"}
    assert sample(registry, "fxgate_reader_heartbeat_age_seconds", **r) == 12.0
    assert sample(registry, "fxgate_reader_silent_seconds", **r) == 2.0
    assert sample(registry, "fxgate_reader_silent", **r) == 0
    assert sample(registry, "fxgate_reader_heartbeats_total", **r) == 4
    assert sample(registry, "fxgate_reader_management_events_total", **r, type="gpi") == 2
    assert sample(registry, "fxgate_reader_management_events_total", **r, type="error") == 1
    for counter, value in {"sent": 1500, "received": 1510, "retained": 0, "dropped": 3}.items():
        assert (
            sample(registry, "fxgate_reader_reported_data_messages", **r, counter=counter) == value
        )
    assert sample(registry, "fxgate_reader_unaccounted_data_messages_per_gateway", **r) == 7
    assert sample(registry, "fxgate_reader_heartbeat_counter_resets_total", **r) == 1


def test_heartbeat_age_grows_on_the_injected_clock_and_not_on_the_wall(board, clock):
    board.publish(snapshot(reader_health={"fx9600-01": reader_state(clock, 0.0, 0.0)}))
    registry = build_registry(board)
    assert sample(registry, "fxgate_reader_heartbeat_age_seconds", reader="fx9600-01") == 0
    clock.advance(45.0)
    assert sample(registry, "fxgate_reader_heartbeat_age_seconds", reader="fx9600-01") == 45


def test_a_reader_silent_past_the_configured_time_is_flagged_and_health_is_degraded_not_failed(
    clock,
):
    board = StatusBoard(clock, HealthThresholds(reader_silent_seconds=120.0))
    states = {
        "fx9600-01": reader_state(clock, 0.0, 0.0),
        "fx9600-02": reader_state(clock, 0.0, 0.0),
    }
    board.publish(snapshot(reader_health=states))
    registry = build_registry(board)
    clock.advance(120.0)
    board.publish(snapshot(reader_health=states))  # the daemon keeps publishing; readers quiet
    assert sample(registry, "fxgate_reader_silent", reader="fx9600-01") == 0
    assert board.health().as_json()["status"] == "ok"
    clock.advance(0.5)
    board.publish(snapshot(reader_health=states))
    assert sample(registry, "fxgate_reader_silent", reader="fx9600-01") == 1
    health = board.health()
    assert health.healthy
    assert health.as_json()["status"] == "degraded"
    assert [line.split(" silent")[0] for line in health.degraded] == [
        "reader fx9600-01",
        "reader fx9600-02",
    ]
    assert "limit 120 s" in health.degraded[0]
    # One speaks again: only the other stays flagged.
    states = {**states, "fx9600-01": reader_state(clock, 0.0, 30.0)}
    board.publish(snapshot(reader_health=states))
    assert sample(registry, "fxgate_reader_silent", reader="fx9600-01") == 0
    assert [line.split(" silent")[0] for line in board.health().degraded] == ["reader fx9600-02"]


def test_the_silent_flag_is_off_at_zero_and_a_reader_never_heard_is_never_silent(clock):
    board = StatusBoard(clock, HealthThresholds(reader_silent_seconds=0.0))
    board.publish(snapshot(reader_health={"fx9600-01": reader_state(clock, 10_000.0, 10_000.0)}))
    assert board.health().degraded == ()
    board = StatusBoard(clock, HealthThresholds(reader_silent_seconds=1.0))
    board.publish(snapshot(reader_health={"fx9600-01": ReaderHealth().state()}))
    clock.advance(100.0)
    assert board.health().degraded == ()


def test_landed_dead_letters_are_counted_by_sink_and_reason(board):
    by_reason = {"table/invalid_json": 3, "table/wrong_type": 1, "upstream/forward_failed": 2}
    board.publish(snapshot(dead_letters_written=6, dead_letters_by_reason=by_reason))
    registry = build_registry(board)
    for key, count in by_reason.items():
        sink, reason = key.split("/")
        assert sample(registry, "fxgate_dead_letters_total", sink=sink, reason=reason) == count
    assert sample(registry, "fxgate_landed_dead_letters_total") == 6
