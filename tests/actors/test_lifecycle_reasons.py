import pytest
from paho.mqtt.client import DisconnectFlags
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from actors.lifecycle_reasons import (
    DEFAULT_REASON,
    EVENT_GRID_REASONS,
    NO_CODE_REASON,
    REASON_TABLE,
    LocalCause,
    connack_refusal_reason,
    disconnection_reason,
    reason_from_paho_disconnect,
)

# The expected mapping written out independently of the module's table, so a changed row fails.
EXPECTED_CODES = {
    0x00: "ServerInitiatedDisconnect",
    0x04: "ClientInitiatedDisconnect",
    0x80: "ServerError",
    0x81: "ClientError",
    0x82: "ClientError",
    0x83: "ServerError",
    0x84: "ClientError",
    0x85: "ClientError",
    0x86: "ClientAuthenticationError",
    0x87: "ClientAuthorizationError",
    0x88: "ServerError",
    0x89: "ServerInitiatedDisconnect",
    0x8A: "IpForbidden",
    0x8B: "ServerInitiatedDisconnect",
    0x8C: "ClientAuthenticationError",
    0x8D: "ConnectionLost",
    0x8E: "SessionTakenOver",
    0x8F: "ClientError",
    0x90: "ClientError",
    0x93: "SessionOverflow",
    0x94: "ClientError",
    0x95: "ClientError",
    0x96: "QuotaExceeded",
    0x97: "QuotaExceeded",
    0x98: "ServerInitiatedDisconnect",
    0x99: "ClientError",
    0x9A: "ClientError",
    0x9B: "ClientError",
    0x9C: "ServerInitiatedDisconnect",
    0x9D: "ServerInitiatedDisconnect",
    0x9E: "ClientError",
    0x9F: "QuotaExceeded",
    0xA0: "ServerInitiatedDisconnect",
    0xA1: "ClientError",
    0xA2: "ClientError",
}
EXPECTED_LOCAL = {
    LocalCause.SOCKET_LOST: "ConnectionLost",
    LocalCause.CONNECT_REFUSED: "ConnectionLost",
    LocalCause.CONNECT_TIMEOUT: "ConnectionLost",
    LocalCause.TLS_FAILED: "ClientError",
    LocalCause.KEEPALIVE_TIMEOUT: "ConnectionLost",
    LocalCause.BROKER_PROTOCOL_ERROR: "ServerError",
    LocalCause.CLIENT_DISCONNECT: "ClientInitiatedDisconnect",
    LocalCause.PROCESS_ENDED: "ConnectionLost",
}


def test_event_grid_lists_exactly_eleven_reasons_spelled_as_event_grid_spells_them():
    assert sorted(EVENT_GRID_REASONS) == [
        "ClientAuthenticationError",
        "ClientAuthorizationError",
        "ClientError",
        "ClientInitiatedDisconnect",
        "ConnectionLost",
        "IpForbidden",
        "QuotaExceeded",
        "ServerError",
        "ServerInitiatedDisconnect",
        "SessionOverflow",
        "SessionTakenOver",
    ]


@pytest.mark.parametrize(("code", "reason"), sorted(EXPECTED_CODES.items()))
def test_each_mqtt5_reason_code_maps_to_its_event_grid_reason(code, reason):
    assert disconnection_reason(code) == reason


@pytest.mark.parametrize(("cause", "reason"), sorted(EXPECTED_LOCAL.items()))
def test_each_local_cause_maps_to_its_event_grid_reason(cause, reason):
    assert disconnection_reason(None, local=cause) == reason
    assert disconnection_reason(None, local=cause.value) == reason


def test_the_table_has_one_row_per_mapped_code_and_local_cause_and_nothing_else():
    code_rows = [row for row in REASON_TABLE if row.source == "MQTT 5"]
    local_rows = [row for row in REASON_TABLE if row.source == "local"]
    assert [int(row.cause.split()[0], 16) for row in code_rows] == sorted(EXPECTED_CODES)
    assert {row.cause: row.reason for row in local_rows} == {
        cause.value: reason for cause, reason in EXPECTED_LOCAL.items()
    }
    assert len(REASON_TABLE) == len(EXPECTED_CODES) + len(EXPECTED_LOCAL)


def test_every_table_row_names_an_event_grid_reason_and_says_why():
    for row in REASON_TABLE:
        assert row.reason in EVENT_GRID_REASONS, row
        assert row.why.strip(), row


def test_every_one_of_the_eleven_reasons_can_be_produced():
    assert {row.reason for row in REASON_TABLE} == set(EVENT_GRID_REASONS)


def test_a_paho_reason_code_object_maps_like_its_number():
    taken_over = ReasonCode(PacketTypes.DISCONNECT, "Session taken over")
    bad_password = ReasonCode(PacketTypes.CONNACK, "Bad user name or password")
    assert disconnection_reason(taken_over) == "SessionTakenOver"
    assert disconnection_reason(bad_password) == "ClientAuthenticationError"
    assert disconnection_reason(ReasonCode(PacketTypes.DISCONNECT, "Quota exceeded")) == (
        "QuotaExceeded"
    )


@pytest.mark.parametrize("code", [0x01, 0x02, 0x10, 0x91, 0xA3, 0xFF])
def test_a_code_the_table_does_not_know_maps_to_the_documented_default(code):
    assert DEFAULT_REASON == "ServerError"
    assert disconnection_reason(code) == DEFAULT_REASON


def test_no_code_and_no_local_cause_means_the_connection_was_lost():
    assert NO_CODE_REASON == "ConnectionLost"
    assert disconnection_reason(None) == "ConnectionLost"


def test_a_local_cause_wins_over_the_code_paho_made_up_for_it():
    # paho reports 0x80 Unspecified error for a dead socket; the broker said nothing.
    assert disconnection_reason(0x80, local=LocalCause.SOCKET_LOST) == "ConnectionLost"
    assert disconnection_reason(0x00, local=LocalCause.CLIENT_DISCONNECT) == (
        "ClientInitiatedDisconnect"
    )


def test_an_unknown_local_cause_is_a_programming_error():
    with pytest.raises(ValueError):
        disconnection_reason(None, local="cosmic_ray")


@pytest.mark.parametrize("code", [-1, 0x100])
def test_a_number_that_is_not_one_byte_is_rejected(code):
    with pytest.raises(ValueError, match="one byte"):
        disconnection_reason(code)


@pytest.mark.parametrize(
    ("from_server", "name", "reason"),
    [
        (True, "Session taken over", "SessionTakenOver"),
        (True, "Server shutting down", "ServerInitiatedDisconnect"),
        (True, "Unspecified error", "ServerError"),
        (True, "Success", "ServerInitiatedDisconnect"),
        (False, "Success", "ClientInitiatedDisconnect"),
        (False, "Unspecified error", "ConnectionLost"),
        (False, "Keep alive timeout", "ConnectionLost"),
        (False, "Protocol error", "ServerError"),
    ],
)
def test_paho_disconnects_are_told_apart_by_who_sent_the_disconnect(from_server, name, reason):
    code = ReasonCode(PacketTypes.DISCONNECT, name)
    assert reason_from_paho_disconnect(DisconnectFlags(from_server), code) == reason


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (0x86, "ClientAuthenticationError"),
        (0x87, "ClientAuthenticationError"),  # refused at CONNECT: never admitted
        (0x8A, "IpForbidden"),
        (0x97, "QuotaExceeded"),
    ],
)
def test_a_refused_connack_is_judged_as_an_admission_failure(code, reason):
    assert connack_refusal_reason(code) == reason
    # The same 0x87 in a DISCONNECT, mid-session, is an authorization change.
    assert disconnection_reason(0x87) == "ClientAuthorizationError"
