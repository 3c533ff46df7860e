"""Why a connection ended, in Azure Event Grid's words (issue 6).

Event Grid's MQTT namespaces put one of eleven `disconnectionReason` values into every
`MQTTClientSessionDisconnected` event. fxgate emits the same values, so a consumer written for Event
Grid understands ours. This module is the one table that turns what we observe — an MQTT 5 reason
code from the broker (DISCONNECT or CONNACK) or a cause only we can see (a dead socket, our own
DISCONNECT) — into one of those eleven names.

Sources: Event Grid's "MQTT Clients Life Cycle Events" page (disconnection reasons table) and the
`KnownEventGridMqttClientDisconnectionReason` enum of the Azure SDK; MQTT 5.0 §2.4 (reason codes),
§3.2.2.2 (CONNACK) and §3.14.2.1 (DISCONNECT). MQTT 5 gives each reason code one meaning whatever
packet carries it, so the table is keyed by the number alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from paho.mqtt.client import DisconnectFlags

# Event Grid's eleven values, spelled as Event Grid spells them, with Event Grid's own description
# (paraphrased): the description is the argument for every mapping below.
EVENT_GRID_REASONS: dict[str, str] = {
    "ClientAuthenticationError": "disconnected for an authentication reason (certificate expired, "
    "client disabled, client configuration changed)",
    "ClientAuthorizationError": "disconnected for an authorization reason (topic spaces, "
    "permission bindings or client groups changed)",
    "ClientError": "the client sent a bad request or used an unsupported feature, and the service "
    "ended the connection",
    "ClientInitiatedDisconnect": "the client disconnected gracefully with a DISCONNECT packet (or "
    "a WebSocket close frame)",
    "ConnectionLost": "the client-server connection was lost",
    "IpForbidden": "the client's IP address is blocked by an IP filter or private-link settings",
    "QuotaExceeded": "the client went past a throttling limit, and the service ended the "
    "connection",
    "ServerError": "the connection ended because of an unexpected server error",
    "ServerInitiatedDisconnect": "the server disconnected gracefully for an operational reason",
    "SessionOverflow": "the client's queue of unacknowledged QoS 1 messages reached its limit",
    "SessionTakenOver": "the client reconnected with the same authentication name, which ended "
    "the previous connection",
}

# What a reason code the table does not know becomes. ServerError is Event Grid's catch-all for
# "unexpected": the broker ended the session for a reason we cannot classify, which is the same
# bucket as 0x80 Unspecified error.
DEFAULT_REASON = "ServerError"
# What a disconnect with neither a reason code nor a known local cause becomes: all we know is that
# the connection is gone.
NO_CODE_REASON = "ConnectionLost"


class LocalCause(StrEnum):
    """Ends of a connection that no broker packet reports: only the client sees them."""

    SOCKET_LOST = "socket_lost"
    CONNECT_REFUSED = "connect_refused"
    CONNECT_TIMEOUT = "connect_timeout"
    TLS_FAILED = "tls_failed"
    KEEPALIVE_TIMEOUT = "keepalive_timeout"
    BROKER_PROTOCOL_ERROR = "broker_protocol_error"
    CLIENT_DISCONNECT = "client_disconnect"
    PROCESS_ENDED = "process_ended"


@dataclass(frozen=True)
class ReasonRow:
    """One line of the mapping: what we observed, and the Event Grid reason it becomes."""

    source: str  # "MQTT 5" (a reason code the broker sent) or "local" (seen only by us)
    cause: str  # "0x8E Session taken over" or a LocalCause value
    reason: str
    why: str


def _row(code: int, name: str, reason: str, why: str) -> tuple[int, ReasonRow]:
    return code, ReasonRow("MQTT 5", f"0x{code:02X} {name}", reason, why)


# Reason codes a broker sends in CONNACK (a refused connect) or DISCONNECT (an ended session).
_CODE_ROWS: dict[int, ReasonRow] = dict(
    [
        _row(0x00, "Normal disconnection", "ServerInitiatedDisconnect",
             "a DISCONNECT 0x00 from the broker is a graceful end the server chose"),
        _row(0x04, "Disconnect with Will Message", "ClientInitiatedDisconnect",
             "only a client sends it: a graceful DISCONNECT of our own"),
        _row(0x80, "Unspecified error", "ServerError",
             "the broker gave no reason: Event Grid's unexpected server error"),
        _row(0x81, "Malformed Packet", "ClientError",
             "the broker could not parse what we sent: a bad request from the client"),
        _row(0x82, "Protocol Error", "ClientError",
             "we broke the protocol: a bad request from the client"),
        _row(0x83, "Implementation specific error", "ServerError",
             "a valid packet the broker could not process: a server-side failure"),
        _row(0x84, "Unsupported Protocol Version", "ClientError",
             "we asked for a protocol the broker does not support: an unsupported feature"),
        _row(0x85, "Client Identifier not valid", "ClientError",
             "the broker rejects our client id as malformed: a bad request"),
        _row(0x86, "Bad User Name or Password", "ClientAuthenticationError",
             "our credentials were rejected: authentication"),
        _row(0x87, "Not authorized", "ClientAuthorizationError",
             "authenticated but not allowed: authorization"),
        _row(0x88, "Server unavailable", "ServerError",
             "the broker cannot serve anyone: an unexpected server condition"),
        _row(0x89, "Server busy", "ServerInitiatedDisconnect",
             "the broker sheds load and asks us to retry later: an operational decision"),
        _row(0x8A, "Banned", "IpForbidden",
             "the broker refuses this client by policy before any credential check, as Event "
             "Grid's IP filter does"),
        _row(0x8B, "Server shutting down", "ServerInitiatedDisconnect",
             "a graceful end the server chose for an operational reason"),
        _row(0x8C, "Bad authentication method", "ClientAuthenticationError",
             "the enhanced-authentication method was rejected: authentication"),
        _row(0x8D, "Keep Alive timeout", "ConnectionLost",
             "the broker heard nothing for 1.5 keep-alive periods: the link is dead"),
        _row(0x8E, "Session taken over", "SessionTakenOver",
             "another connection with our client id took the session"),
        _row(0x8F, "Topic Filter invalid", "ClientError",
             "we subscribed with a filter the broker rejects: a bad request"),
        _row(0x90, "Topic Name invalid", "ClientError",
             "we published to a topic the broker rejects: a bad request"),
        _row(0x93, "Receive Maximum exceeded", "SessionOverflow",
             "too many unacknowledged QoS 1/2 messages in flight; paho re-sends everything at "
             "once after a reconnect, ignoring Receive Maximum (DESIGN §4)"),
        _row(0x94, "Topic Alias invalid", "ClientError",
             "we sent a topic alias out of range: a bad request"),
        _row(0x95, "Packet too large", "ClientError",
             "we sent a packet above the broker's Maximum Packet Size: a bad request"),
        _row(0x96, "Message rate too high", "QuotaExceeded",
             "we went past the broker's publish rate limit: throttling"),
        _row(0x97, "Quota exceeded", "QuotaExceeded",
             "we went past a broker quota: throttling"),
        _row(0x98, "Administrative action", "ServerInitiatedDisconnect",
             "an operator disconnected us: an operational decision of the server"),
        _row(0x99, "Payload format invalid", "ClientError",
             "our payload contradicts its format indicator: a bad request"),
        _row(0x9A, "Retain not supported", "ClientError",
             "we used retain where the broker does not support it: an unsupported feature"),
        _row(0x9B, "QoS not supported", "ClientError",
             "we used a QoS above the broker's maximum: an unsupported feature"),
        _row(0x9C, "Use another server", "ServerInitiatedDisconnect",
             "the broker redirects us elsewhere: an operational decision"),
        _row(0x9D, "Server moved", "ServerInitiatedDisconnect",
             "the broker moved permanently: an operational decision"),
        _row(0x9E, "Shared Subscriptions not supported", "ClientError",
             "we used $share where the broker does not support it: an unsupported feature"),
        _row(0x9F, "Connection rate exceeded", "QuotaExceeded",
             "we reconnected faster than the broker allows: a throttling limit"),
        _row(0xA0, "Maximum connect time", "ServerInitiatedDisconnect",
             "the broker limits session length by policy: an operational decision"),
        _row(0xA1, "Subscription Identifiers not supported", "ClientError",
             "we used a feature the broker does not support"),
        _row(0xA2, "Wildcard Subscriptions not supported", "ClientError",
             "we used a feature the broker does not support"),
    ]
)  # fmt: skip

# Causes no broker reports. Transient network failures are ConnectionLost, because a retry can
# succeed; failures that only a configuration change can fix are ClientError, so an operator's
# alert can tell "wait" from "go and fix it".
_LOCAL_ROWS: dict[LocalCause, ReasonRow] = {
    cause: ReasonRow("local", cause.value, reason, why)
    for cause, reason, why in (
        (LocalCause.SOCKET_LOST, "ConnectionLost",
         "the TCP connection broke (reset, EOF, network cut) without a DISCONNECT"),
        (LocalCause.CONNECT_REFUSED, "ConnectionLost",
         "nothing listens at the broker's address (broker down or restarting): transient"),
        (LocalCause.CONNECT_TIMEOUT, "ConnectionLost",
         "no TCP or CONNACK answer in time: the network path is down"),
        (LocalCause.TLS_FAILED, "ClientError",
         "the TLS handshake failed (certificate, CA, protocol version): our configuration must "
         "change before a retry can succeed"),
        (LocalCause.KEEPALIVE_TIMEOUT, "ConnectionLost",
         "paho heard no PINGRESP in time: the link is dead"),
        (LocalCause.BROKER_PROTOCOL_ERROR, "ServerError",
         "paho received a packet from the broker that breaks the protocol: the server misbehaved"),
        (LocalCause.CLIENT_DISCONNECT, "ClientInitiatedDisconnect",
         "we sent DISCONNECT (shutdown, config change): a graceful end of our own"),
        (LocalCause.PROCESS_ENDED, "ConnectionLost",
         "the gateway ended while connected (killed, power loss) and sent no DISCONNECT: announced "
         "at its next start"),
    )
}  # fmt: skip

# The whole mapping in one place, in the order docs/pages/reference/events.md renders it.
REASON_TABLE: tuple[ReasonRow, ...] = (
    *(_CODE_ROWS[code] for code in sorted(_CODE_ROWS)),
    *_LOCAL_ROWS.values(),
)


class _HasValue(Protocol):
    @property
    def value(self) -> int: ...


def _code_value(code: int | _HasValue) -> int:
    # paho's ReasonCode compares equal to ints but has no __int__; its number is `.value`.
    value = code if isinstance(code, int) else code.value
    if not 0 <= value <= 0xFF:
        raise ValueError(f"an MQTT reason code is one byte, got {value!r}")
    return value


def disconnection_reason(
    code: int | _HasValue | None, *, local: LocalCause | str | None = None
) -> str:
    """The Event Grid `disconnectionReason` for a reason code the broker sent (a paho
    `ReasonCode` or its number) or for a local cause. A local cause wins over the code, because
    paho reports a code even for ends the broker never announced (0x80 for a dead socket).
    A code the table does not know gives `DEFAULT_REASON`; no code and no cause give
    `NO_CODE_REASON`."""
    if local is not None:
        return _LOCAL_ROWS[LocalCause(local)].reason
    if code is None:
        return NO_CODE_REASON
    row = _CODE_ROWS.get(_code_value(code))
    return DEFAULT_REASON if row is None else row.reason


# Codes paho makes up itself when the broker sent no DISCONNECT (paho 2.2,
# `convert_disconnect_error_code_to_reason_code`): 0x00 after our own disconnect(), 0x8D when its
# keep-alive check fails, 0x82 when the broker's bytes break the protocol, 0x80 for everything
# else — mostly a lost socket.
_PAHO_LOCAL_CODES: dict[int, LocalCause] = {
    0x00: LocalCause.CLIENT_DISCONNECT,
    0x8D: LocalCause.KEEPALIVE_TIMEOUT,
    0x82: LocalCause.BROKER_PROTOCOL_ERROR,
}


def connack_refusal_reason(code: int | _HasValue) -> str:
    """The reason for a CONNACK that refused us. Refused at CONNECT, the client was never
    admitted: Event Grid calls that an authentication error, whichever of the two "not allowed"
    codes the broker chose — and mosquitto 2.0.11 answers a wrong password with 0x87 Not
    authorized, not 0x86 (tests/actors/test_lifecycle_wiring.py). 0x87 in a DISCONNECT, later,
    is an authorization change and keeps its own reason."""
    if _code_value(code) == 0x87:
        return "ClientAuthenticationError"
    return disconnection_reason(code)


def reason_from_paho_disconnect(flags: DisconnectFlags, reason_code: int | _HasValue) -> str:
    """The reason for paho 2.x's `on_disconnect(client, userdata, flags, reason_code, props)`.

    Only `flags.is_disconnect_packet_from_server` tells a broker's DISCONNECT 0x80 from paho's
    made-up 0x80 for a dead socket, so a callback must not map the bare code."""
    if flags.is_disconnect_packet_from_server:
        return disconnection_reason(reason_code)
    cause = _PAHO_LOCAL_CODES.get(_code_value(reason_code), LocalCause.SOCKET_LOST)
    return disconnection_reason(None, local=cause)
