import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.clock import SimulatedClock
from actors.lifecycle_order import (
    ClientState,
    DisconnectDebouncer,
    LastStateTracker,
    Status,
    last_states,
)
from actors.lifecycle_reasons import EVENT_GRID_REASONS

_ids = itertools.count()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _event(kind, client, *, seq=None, reason=None, at=0.0, session="s1", prefix="fxgate."):
    session_event = kind.startswith("MQTTClientSession")
    data = {"clientAuthenticationName": client}
    if session_event:
        data |= {"clientSessionName": session, "sequenceNumber": seq}
    if reason is not None:
        data["disconnectionReason"] = reason
    return {
        "specversion": "1.0",
        "id": f"ev-{next(_ids)}",
        "type": prefix + kind,
        "source": "fxgate/test",
        "subject": f"clients/{client}/sessions/{session}" if session_event else f"clients/{client}",
        "time": (T0 + timedelta(seconds=at)).isoformat().replace("+00:00", "Z"),
        "data": data,
    }


def connected(client, seq, at=0.0, **kw):
    return _event("MQTTClientSessionConnected", client, seq=seq, at=at, **kw)


def disconnected(client, seq, reason="ConnectionLost", at=0.0, **kw):
    return _event("MQTTClientSessionDisconnected", client, seq=seq, reason=reason, at=at, **kw)


def created(client, at=0.0, **kw):
    return _event("MQTTClientCreatedOrUpdated", client, at=at, **kw)


def deleted(client, at=0.0, **kw):
    return _event("MQTTClientDeleted", client, at=at, **kw)


# --- Event Grid's ordering rule -------------------------------------------------------------


def test_with_equal_sequence_numbers_the_disconnect_is_the_later_event_in_either_order():
    on, off = connected("r1", 1), disconnected("r1", 1, "SessionTakenOver")
    for stream in ([on, off], [off, on]):
        state = last_states(stream)["r1"]
        assert state.status is Status.DISCONNECTED
        assert state.disconnection_reason == "SessionTakenOver"


def test_a_connect_with_a_higher_number_beats_an_earlier_disconnect_that_arrives_late():
    stream = [connected("r1", 1), connected("r1", 2), disconnected("r1", 1)]
    assert last_states(stream)["r1"] == ClientState("r1", Status.CONNECTED, "s1", 2, None)


def test_a_stale_connect_does_not_undo_a_newer_disconnect():
    stream = [disconnected("r1", 3, "ServerInitiatedDisconnect"), connected("r1", 2)]
    state = last_states(stream)["r1"]
    assert (state.status, state.sequence_number) == (Status.DISCONNECTED, 3)


def test_a_connect_with_an_equal_number_does_not_replace_the_stored_connect():
    tracker = LastStateTracker()
    assert tracker.apply(connected("r1", 4)) is not None
    assert tracker.apply(connected("r1", 4)) is None  # a duplicate changes nothing


def test_sequence_numbers_are_compared_as_numbers_even_when_sent_as_strings():
    stream = [connected("r1", "10"), disconnected("r1", "9")]
    state = last_states(stream)["r1"]
    assert (state.status, state.sequence_number) == (Status.CONNECTED, 10)


def test_clients_are_tracked_apart():
    stream = [connected("a", 1), connected("b", 7), disconnected("a", 1, "QuotaExceeded")]
    states = last_states(stream)
    assert states["a"].status is Status.DISCONNECTED
    assert states["b"].status is Status.CONNECTED


def test_two_clients_sharing_one_authentication_name_keep_their_own_states():
    # A gateway's source and upstream connections may log in as the same user.
    source = connected("fxgate-site-gw1", 1)
    upstream = disconnected("fxgate-upstream-site-gw1", 4, reason="ConnectionLost")
    for event in (source, upstream):
        event["data"]["clientAuthenticationName"] = "gateway"
    states = last_states([source, upstream])
    assert states["fxgate-site-gw1"].status is Status.CONNECTED
    assert states["fxgate-upstream-site-gw1"].status is Status.DISCONNECTED


def test_the_client_comes_from_the_subject_when_data_does_not_name_it():
    event = connected("r9", 1)
    del event["data"]["clientAuthenticationName"]
    assert last_states([event])["r9"].status is Status.CONNECTED


def test_an_event_that_names_no_client_is_rejected():
    event = connected("r9", 1)
    del event["data"]["clientAuthenticationName"]
    event["subject"] = "elsewhere"
    with pytest.raises(ValueError, match="names no client"):
        LastStateTracker().apply(event)


def test_events_of_another_producer_or_unknown_types_are_ignored():
    tracker = LastStateTracker()
    assert tracker.apply(connected("r1", 1, prefix="Microsoft.EventGrid.")) is None
    assert tracker.apply({"type": "fxgate.SomethingElse", "data": {}}) is None
    assert tracker.states() == {}


def test_event_grids_own_events_are_read_with_its_type_prefix():
    stream = [
        connected("client1", 1, prefix="Microsoft.EventGrid."),
        disconnected("client1", 1, "ClientInitiatedDisconnect", prefix="Microsoft.EventGrid."),
    ]
    states = last_states(stream, type_prefix="Microsoft.EventGrid.")
    assert states["client1"].disconnection_reason == "ClientInitiatedDisconnect"


def test_a_delete_after_the_last_session_event_reports_the_client_deleted():
    stream = [deleted("r1", at=10), connected("r1", 1, at=1), disconnected("r1", 1, at=5)]
    assert last_states(stream)["r1"].status is Status.DELETED


def test_a_client_created_again_after_a_delete_is_no_longer_deleted():
    stream = [created("r1", at=0), deleted("r1", at=10), created("r1", at=20)]
    assert last_states(reversed(stream))["r1"].status is Status.CREATED
    stream.append(connected("r1", 5, at=21))
    assert last_states(reversed(stream))["r1"].status is Status.CONNECTED


def test_a_created_client_without_sessions_is_reported_created():
    assert last_states([created("r1")])["r1"] == ClientState("r1", Status.CREATED)


# --- property: any order gives the state of the ordered stream -----------------------------

_reasons = st.sampled_from(sorted(EVENT_GRID_REASONS))


@st.composite
def client_histories(draw):
    """Per client: connections with growing (gappy) sequence numbers; each may end with a
    disconnect, or not (a daemon killed before it could say so); maybe a trailing delete."""
    stream, expected = [], {}
    clients = draw(
        st.lists(st.sampled_from(["r1", "r2", "r3"]), min_size=1, max_size=3, unique=True)
    )
    at = 0.0
    for client in clients:
        seq = draw(st.integers(0, 5))
        last = None
        for _ in range(draw(st.integers(1, 6))):
            seq += draw(st.integers(1, 3))
            at += 1
            stream.append(connected(client, seq, at=at))
            last = ClientState(client, Status.CONNECTED, "s1", seq, None)
            if draw(st.booleans()):
                reason = draw(_reasons)
                at += 1
                stream.append(disconnected(client, seq, reason, at=at))
                last = ClientState(client, Status.DISCONNECTED, "s1", seq, reason)
        if draw(st.booleans()):
            at += 1
            stream.append(deleted(client, at=at))
            last = ClientState(client, Status.DELETED)
        expected[client] = last
    # Event Grid may publish an event twice.
    duplicates = draw(st.lists(st.sampled_from(stream), max_size=4))
    return stream + [dict(d) for d in duplicates], expected


@settings(max_examples=300, deadline=None)
@given(history=client_histories(), data=st.data())
def test_a_shuffled_stream_yields_the_same_last_state_as_the_ordered_one(history, data):
    stream, expected = history
    shuffled = data.draw(st.permutations(stream))
    assert last_states(stream) == expected
    assert last_states(shuffled) == expected


# --- debounce on the simulated clock --------------------------------------------------------


@pytest.fixture
def debounce():
    clock = SimulatedClock()
    offline: list[ClientState] = []
    debouncer = DisconnectDebouncer(clock, 30.0, offline.append)
    yield clock, debouncer, offline
    debouncer.cancel_all()


def test_a_disconnect_fires_when_the_client_stays_offline_for_the_whole_delay(debounce):
    clock, debouncer, offline = debounce
    debouncer.observe(connected("r1", 1))
    debouncer.observe(disconnected("r1", 1, "ConnectionLost"))
    clock.advance(29.999)
    assert offline == []
    clock.advance(0.001)
    assert offline == [ClientState("r1", Status.DISCONNECTED, "s1", 1, "ConnectionLost")]
    assert debouncer.waiting() == frozenset()


def test_a_reconnect_within_the_delay_cancels_the_action(debounce):
    clock, debouncer, offline = debounce
    debouncer.observe(disconnected("r1", 1))
    clock.advance(10)
    debouncer.observe(connected("r1", 2))
    assert clock.pending() == 0
    clock.advance(100)
    assert offline == []


def test_a_stale_connect_arriving_late_does_not_cancel_the_wait(debounce):
    clock, debouncer, offline = debounce
    debouncer.observe(disconnected("r1", 2, "SessionTakenOver"))
    debouncer.observe(connected("r1", 2))  # the connect this disconnect ended
    debouncer.observe(connected("r1", 1))
    clock.advance(30)
    assert [s.disconnection_reason for s in offline] == ["SessionTakenOver"]


def test_a_duplicate_disconnect_neither_restarts_the_wait_nor_fires_twice(debounce):
    clock, debouncer, offline = debounce
    first = disconnected("r1", 1)
    debouncer.observe(first)
    clock.advance(20)
    debouncer.observe(dict(first))
    clock.advance(10)
    assert len(offline) == 1
    debouncer.observe(dict(first))
    clock.advance(100)
    assert len(offline) == 1


def test_repeated_flaps_fire_only_after_the_last_disconnect_has_lasted_the_delay(debounce):
    clock, debouncer, offline = debounce
    for seq in range(1, 6):  # up 5 s, down 5 s, five times
        debouncer.observe(connected("r1", seq))
        clock.advance(5)
        debouncer.observe(disconnected("r1", seq, "ConnectionLost"))
        clock.advance(5)
    assert offline == []
    clock.advance(24.999)
    assert offline == []
    clock.advance(0.001)
    assert [s.sequence_number for s in offline] == [5]


def test_a_newer_disconnect_restarts_the_wait_even_if_the_connect_between_is_missing(debounce):
    clock, debouncer, offline = debounce
    debouncer.observe(disconnected("r1", 1))
    clock.advance(20)
    debouncer.observe(disconnected("r1", 2))  # connect 2 not arrived yet: it was online again
    clock.advance(20)
    assert offline == []
    clock.advance(10)
    assert [s.sequence_number for s in offline] == [2]


def test_a_deleted_client_is_not_reported_offline(debounce):
    clock, debouncer, offline = debounce
    debouncer.observe(disconnected("r1", 1, at=1))
    debouncer.observe(deleted("r1", at=2))
    clock.advance(60)
    assert offline == []


def test_clients_are_debounced_independently(debounce):
    clock, debouncer, offline = debounce
    debouncer.observe(disconnected("a", 1))
    clock.advance(15)
    debouncer.observe(disconnected("b", 1))
    assert debouncer.waiting() == {"a", "b"}
    clock.advance(15)
    assert [s.client for s in offline] == ["a"]
    debouncer.observe(connected("b", 2))
    clock.advance(60)
    assert [s.client for s in offline] == ["a"]


def test_a_negative_delay_is_rejected():
    with pytest.raises(ValueError, match="delay"):
        DisconnectDebouncer(SimulatedClock(), -1, lambda _state: None)
