"""ConnectionActor: owns one broker connection, its subscriptions and its reconnect backoff.

paho runs the socket on its own thread; its callbacks only turn events into messages for this
actor (or, for PUBLISH/PUBREL, for the ledger). Reconnects are ours, not paho's: after a drop the
actor waits the next backoff delay on the injected clock and tries again, so outages of any length
are paced 1 s -> 120 s with jitter (DESIGN §5) and tests can drive the schedule.

Sessions are persistent: clean_start is sent as False explicitly (paho's default is "first connect
only"), with a session expiry interval, so the broker keeps our queue and in-flight QoS 2 state
while we are away.

TLS (`tls = true`) verifies the broker's certificate against `tls_ca_file` (or the system's CAs)
and its host name, unless `tls_insecure`; a client certificate and key make it mutual TLS. A
handshake that fails is an ERROR naming the broker and the cause, a `ClientError` life-cycle event
(only a configuration change can fix it) and the next attempt on the backoff schedule, never a
crash. A password may come from a file, read at every connect so that a rotated one is used.

A subscription the broker refuses (a SUBACK reason code >= 0x80, MQTT 5 §3.9.3) is not a passing
log line: nothing will arrive on that filter while the connection looks healthy. The filter stays
in `state().refused_subscriptions` (status, a metric and /healthz read it) until a later SUBACK
grants it. The connection asks for the refused filters again, in a SUBSCRIBE of their own, on a
backoff of RESUBSCRIBE_MIN_DELAY doubling to RESUBSCRIBE_MAX_DELAY, so a fixed ACL takes effect
without a reconnect or a restart; a new connection subscribes to every filter anyway.

`auto_reconnect = false` means the first drop (or a failed first connect) ends the connection for
good: one ERROR says so and how to recover, the state becomes `not_reconnecting` (health reports it
at once, since it will not come back by itself), and the daemon keeps serving what it holds.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

import pykka
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from actors.backoff import Backoff
from actors.clock import Clock, TimerHandle
from actors.config.schema import read_password_file
from actors.lifecycle_reasons import (
    LocalCause,
    connack_refusal_reason,
    disconnection_reason,
    reason_from_paho_disconnect,
)
from actors.messages import (
    InboundBurst,
    Publish,
    SendPublishes,
    SendPubrels,
    SessionConnected,
    SessionDisconnected,
    SessionEnded,
    SessionStarted,
)
from actors.mqtt.client import AckSender, EpochClient, LedgerClient
from actors.mqtt.intake import IntakeGate, packet_size
from actors.tell import tell_unless_dead

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionSettings:
    name: str
    host: str
    port: int
    client_id: str
    subscriptions: tuple[str, ...]
    qos: int = 2
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    clean_start: bool = False
    session_expiry_seconds: int = 3600
    keepalive_seconds: int = 30
    receive_maximum: int = 200
    auto_reconnect: bool = True
    reconnect_min_delay: float = 1.0
    reconnect_max_delay: float = 120.0
    reconnect_jitter: float = 0.25
    # Read at each connect; the file holds the password only (a trailing newline is dropped).
    password_file: str | None = None
    tls: bool = False
    tls_ca_file: str | None = None  # None: the system's trusted CAs
    tls_cert_file: str | None = None  # with tls_key_file: mutual TLS
    tls_key_file: str | None = None
    tls_insecure: bool = False  # no host name check: anyone on the path can pose as the broker


ClientFactory = Callable[[str, Callable[[], float], pykka.ActorRef], EpochClient]


def ledger_client_factory(
    listener,
    intake: IntakeGate | None = None,
    inline: Callable[[list, AckSender], bool] | None = None,
) -> ClientFactory:
    """Source connections: every inbound PUBLISH/PUBREL goes to `listener` (the InboundLedger),
    a hand-over of them per message (actors.mqtt.client), through `intake` if given (the ledger
    then reports the packets it takes to the same gate), with the client itself as the sender
    of their acknowledgements. With `inline` (actors.ledger.InlineIntake.take), a burst that
    emptied the socket is first offered to the ledger on the network thread itself, and handed
    over when it says no (the ledger busy, or the burst large).

    The ledger queues its acks on the client directly, from its own thread, rather than through
    this actor: the client's `send_acks` is safe from any thread (one queued write under paho's
    lock, refused unless the connection is still the one the message came on), and the hop
    through this actor was a quarter of the CPU a message cost at 1,000 single reads/s
    (`footprint` benchmark: 74 of 592 µs, the actor's wake-up and its queue)."""

    def make(client_id: str, monotonic: Callable[[], float], owner: pykka.ActorRef):
        def forward(packets: list, over: bool) -> None:
            if inline is not None and over and packets and inline(packets, client):
                return
            if intake is not None and packets:
                intake.admit(sum(packet_size(p) for p in packets), len(packets))
            client.bursts_told += 1
            listener.tell(InboundBurst(tuple(packets), client, over))

        client = LedgerClient(client_id, forward, monotonic)
        if intake is not None:
            client.on_stopping = intake.interrupt
        return client

    return make


@dataclass(frozen=True, slots=True)
class _Connected:
    epoch: int
    reason: str
    failed: bool
    session_present: bool
    receive_maximum: int
    event_reason: str  # Event Grid's disconnectionReason, for a refused connection


@dataclass(frozen=True, slots=True)
class _Disconnected:
    epoch: int
    reason: str
    event_reason: str  # Event Grid's disconnectionReason


@dataclass(frozen=True, slots=True)
class _Subscribed:
    mid: int
    reasons: tuple[str, ...]
    failed: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class _Resubscribe:
    epoch: int


# Asking the broker again for a refused subscription: the first time after this many seconds,
# then twice as long each time up to the maximum (randomised by +/- RESUBSCRIBE_JITTER).
RESUBSCRIBE_MIN_DELAY = 30.0
RESUBSCRIBE_MAX_DELAY = 600.0
RESUBSCRIBE_JITTER = 0.25


def describe_suback_reason(reason_code: ReasonCode) -> str:
    """A SUBACK reason code as an operator reads it: "Not authorized (0x87)"."""
    return f"{reason_code} (0x{int(reason_code.value):02X})"


@dataclass(frozen=True, slots=True)
class _Reconnect:
    pass


@dataclass(frozen=True, slots=True)
class _TlsError:
    """paho's network thread met a TLS error on the socket of `epoch` (paho reports only a
    lost connection; this keeps the cause)."""

    epoch: int
    cause: str


_SSL_SOURCE_SUFFIX = re.compile(r"\s*\(_ssl\.c:\d+\)$")


def describe_tls_error(error: ssl.SSLError) -> str:
    """What went wrong in a TLS handshake, in words an operator can act on."""
    if isinstance(error, ssl.SSLCertVerificationError):
        # e.g. "Hostname mismatch, certificate is not valid for 'localhost'."
        return f"certificate verify failed: {error.verify_message}"
    text = error.args[1] if len(error.args) > 1 and isinstance(error.args[1], str) else str(error)
    text = _SSL_SOURCE_SUFFIX.sub("", text)
    if error.reason == "WRONG_VERSION_NUMBER":
        text += " (is this port a TLS listener?)"
    elif isinstance(error, ssl.SSLEOFError) or "CERTIFICATE_REQUIRED" in (error.reason or ""):
        # TLS 1.3: the broker judges our certificate after our side of the handshake is done.
        text += " (the broker closed the TLS session: does it require a client certificate?)"
    return text


class _TlsErrorHandler(logging.Handler):
    """Receives paho's ERROR log records of one client and tells the actor about TLS errors.
    Runs on paho's network thread: translates only."""

    def __init__(self, client: EpochClient, tell: Callable[[object], None]) -> None:
        super().__init__(logging.ERROR)
        self._client = client
        self._tell = tell

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        error = next((a for a in args if isinstance(a, ssl.SSLError)), None)
        if error is not None:
            self._tell(_TlsError(self._client.epoch, describe_tls_error(error)))


@dataclass(frozen=True)
class ConnectionState:
    name: str
    state: str  # connecting | connected | waiting | not_reconnecting | stopped
    client_id: str
    last_reason: str | None
    connects: int
    disconnects: int
    next_attempt_in: float | None
    # filter -> the broker's reason, for each subscription whose last SUBACK refused it
    refused_subscriptions: dict[str, str] = field(default_factory=dict)
    subscription_refusals: int = 0  # refused filters in SUBACKs since the actor started


class ConnectionActor(pykka.ThreadingActor):
    def __init__(
        self,
        settings: ConnectionSettings,
        clock: Clock,
        listener: pykka.ActorRef,
        *,
        backoff: Backoff | None = None,
        client_factory: Callable[[str, Callable[[], float]], EpochClient] | None = None,
        lifecycle: pykka.ActorRef | None = None,
    ) -> None:
        super().__init__()
        self._s = settings
        self._lifecycle = lifecycle
        self._clock = clock
        self._listener = listener
        self._backoff = backoff or Backoff(
            settings.reconnect_min_delay, settings.reconnect_max_delay, settings.reconnect_jitter
        )
        self._client_factory = client_factory or ledger_client_factory(listener)
        self._client: LedgerClient | None = None
        self._state = "connecting"
        self._last_reason: str | None = None
        self._connects = 0
        self._disconnects = 0
        self._timer: TimerHandle | None = None
        self._next_attempt_at: float | None = None
        self._ever_connected = False
        self._stopping = False
        # The epoch whose CONNECT the broker refused: its disconnect keeps the refusal as reason.
        self._refused_epoch: int | None = None
        # A TLS error paho met on the socket of an epoch, until that epoch's disconnect.
        self._tls_errors: dict[int, str] = {}
        # Filters the broker's last SUBACK for them refused, and their reasons (module docstring).
        self._refused: dict[str, str] = {}
        self._refusals = 0
        # The filters of each SUBSCRIBE of this connection, by packet id, until its SUBACK.
        self._subscribing: dict[int, tuple[str, ...]] = {}
        self._resubscribe_backoff = Backoff(
            RESUBSCRIBE_MIN_DELAY, RESUBSCRIBE_MAX_DELAY, RESUBSCRIBE_JITTER
        )
        self._resubscribe_timer: TimerHandle | None = None

    # -- life cycle -------------------------------------------------------------------------

    def on_start(self) -> None:
        s = self._s
        client = self._client_factory(s.client_id, self._clock.monotonic, self.actor_ref)
        if s.username is not None:
            client.username_pw_set(s.username, s.password)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        if s.tls:
            self._configure_tls(client)
        self._client = client
        log.info(
            "%s: client id %s, broker %s:%d, clean_start=%s, session expiry %d s, "
            "receive maximum %d, subscriptions %s at QoS %d",
            s.name,
            s.client_id,
            s.host,
            s.port,
            s.clean_start,
            s.session_expiry_seconds,
            s.receive_maximum,
            ", ".join(s.subscriptions) or "none",
            s.qos,
        )
        self._attempt()

    def _configure_tls(self, client: EpochClient) -> None:
        s = self._s
        try:
            # CERT_REQUIRED also turns on the host name check of the SSL context.
            client.tls_set(
                ca_certs=s.tls_ca_file,
                certfile=s.tls_cert_file,
                keyfile=s.tls_key_file,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        except (OSError, ValueError) as error:
            # The config check loads the same files, so this is a file changed since then.
            log.error("%s: TLS settings for %s:%d unusable: %s", s.name, s.host, s.port, error)
            raise
        if s.tls_insecure:
            client.tls_insecure_set(True)
            log.warning(
                "%s: TLS WITHOUT HOST NAME VERIFICATION (tls_insecure = true): anyone on the "
                "network path to %s:%d can pose as the broker; never use this in production",
                s.name,
                s.host,
                s.port,
            )
        # paho reports a TLS error after the handshake (TLS 1.3: a broker that wants a client
        # certificate refuses it only then) as a plain lost connection; its log keeps the cause.
        # A logger of our own, outside the logging tree, so nothing else sees paho's records.
        paho_log = logging.Logger(f"{__name__}.paho.{s.name}", logging.ERROR)
        paho_log.addHandler(
            _TlsErrorHandler(client, lambda message: tell_unless_dead(self.actor_ref, message))
        )
        client.enable_logger(paho_log)

    def _tls_failed(self, epoch: int, cause: str) -> None:
        s = self._s
        self._last_reason = f"TLS failed: {cause}"
        log.error("%s: TLS handshake with %s:%d failed: %s", s.name, s.host, s.port, cause)
        # A certificate problem only a configuration change can fix: ClientError (see
        # actors.lifecycle_reasons), reported like a refused CONNECT.
        self._lifecycle_tell(
            SessionDisconnected(
                s.client_id,
                s.client_id,
                epoch,
                disconnection_reason(None, local=LocalCause.TLS_FAILED),
            )
        )

    def on_stop(self) -> None:
        self._stopping = True
        self._cancel_timer()
        self._cancel_resubscribe()
        client = self._client
        if client is not None:
            # paho's thread may be waiting for the ledger to take what it was handed.
            client.on_stopping()
            if client.is_connected():
                # A normal DISCONNECT keeps the session (and our queue) on the broker.
                self._lifecycle_tell(
                    SessionDisconnected(
                        self._s.client_id,
                        self._s.client_id,
                        client.epoch,
                        disconnection_reason(None, local=LocalCause.CLIENT_DISCONNECT),
                    )
                )
                client.disconnect()
            client.loop_stop()
        self._state = "stopped"
        log.info("%s: stopped", self._s.name)

    def _lifecycle_tell(self, message: object) -> None:
        if self._lifecycle is None:
            return
        if not tell_unless_dead(self._lifecycle, message):
            log.warning("%s: life-cycle actor gone, event dropped: %r", self._s.name, message)

    # -- paho callbacks: network thread, translate only -------------------------------------

    def _on_connect(self, client, _userdata, flags, reason_code, properties) -> None:
        receive_maximum = getattr(properties, "ReceiveMaximum", None) or 65535
        tell_unless_dead(
            self.actor_ref,
            _Connected(
                client.epoch,
                str(reason_code),
                reason_code.is_failure,
                flags.session_present,
                receive_maximum,
                connack_refusal_reason(reason_code) if reason_code.is_failure else "",
            ),
        )

    def _on_disconnect(self, client, _userdata, flags, reason_code, _properties) -> None:
        tell_unless_dead(
            self.actor_ref,
            _Disconnected(
                client.epoch, str(reason_code), reason_from_paho_disconnect(flags, reason_code)
            ),
        )

    def _on_subscribe(self, _client, _userdata, mid, reason_codes, _properties) -> None:
        tell_unless_dead(
            self.actor_ref,
            _Subscribed(
                mid,
                tuple(describe_suback_reason(r) for r in reason_codes),
                tuple(r.is_failure for r in reason_codes),
            ),
        )

    # -- messages ---------------------------------------------------------------------------

    def on_receive(self, message: object) -> None:
        if isinstance(message, _Connected):
            self._handle_connected(message)
        elif isinstance(message, _Disconnected):
            self._handle_disconnected(message)
        elif isinstance(message, _Subscribed):
            self._handle_subscribed(message)
        elif isinstance(message, SendPublishes):
            self._client.send_publishes(message.epoch, message.messages)
        elif isinstance(message, SendPubrels):
            self._client.send_pubrels(message.epoch, message.packet_ids)
        elif isinstance(message, Publish):
            self._publish(message)
        elif isinstance(message, _TlsError):
            self._tls_errors[message.epoch] = message.cause
        elif isinstance(message, _Resubscribe):
            self._resubscribe_timer = None
            self._resubscribe(message.epoch)
        elif isinstance(message, _Reconnect):
            self._timer = None
            self._next_attempt_at = None
            if not self._stopping:
                self._attempt()
        else:
            log.warning("%s: ignored %r", self._s.name, message)

    def _publish(self, message: Publish) -> None:
        assert self._client is not None
        # paho keeps a QoS 1 message until its PUBACK and sends it after a reconnect when it is
        # told while we are offline; lost only with the process (see actors.lifecycle_sink).
        info = self._client.publish(message.topic, message.payload, qos=message.qos)
        log.debug(
            "%s: published %s (mid %d, rc %s)", self._s.name, message.topic, info.mid, info.rc
        )

    def _handle_connected(self, message: _Connected) -> None:
        if message.failed:
            self._last_reason = message.reason
            log.error("%s: broker refused the connection: %s", self._s.name, message.reason)
            # A refused CONNECT (wrong password, not authorised) is a life-cycle fact too.
            self._lifecycle_tell(
                SessionDisconnected(
                    self._s.client_id, self._s.client_id, message.epoch, message.event_reason
                )
            )
            self._refused_epoch = message.epoch
            return  # the broker closes the socket; the disconnect schedules the retry
        self._state = "connected"
        self._connects += 1
        self._ever_connected = True
        self._backoff.reset()
        log.info(
            "%s: connected to %s:%d as %s (session present: %s, receive maximum %d)",
            self._s.name,
            self._s.host,
            self._s.port,
            self._s.client_id,
            message.session_present,
            message.receive_maximum,
        )
        self._listener.tell(
            SessionStarted(message.epoch, message.session_present, message.receive_maximum)
        )
        self._lifecycle_tell(SessionConnected(self._s.client_id, self._s.client_id, message.epoch))
        self._cancel_resubscribe()
        self._resubscribe_backoff.reset()
        self._subscribing.clear()  # packet ids are per connection
        self._subscribe(self._s.subscriptions)

    def _subscribe(self, topics: tuple[str, ...]) -> None:
        assert self._client is not None
        if not topics:
            return
        # retainHandling=1: retained messages only for a new subscription, not on every
        # reconnect.
        options = SubscribeOptions(qos=self._s.qos, retainHandling=1)
        _, mid = self._client.subscribe([(topic, options) for topic in topics])
        if mid is not None:  # None: the socket is gone, and its disconnect is on its way
            self._subscribing[mid] = topics

    def _handle_subscribed(self, message: _Subscribed) -> None:
        # The SUBACK answers the filters of its SUBSCRIBE in order (MQTT 5 §3.9.3): every
        # filter on a new connection, the refused ones when they are asked for again.
        topics = self._subscribing.pop(message.mid, self._s.subscriptions)
        for topic, reason, failed in zip(topics, message.reasons, message.failed, strict=False):
            if failed:
                again = topic in self._refused
                self._refused[topic] = reason
                self._refusals += 1
                if again:
                    log.warning(
                        "%s: the broker refused the subscription to %s again: %s",
                        self._s.name,
                        topic,
                        reason,
                    )
                else:
                    log.error(
                        "%s: the broker refused the subscription to %s: %s; nothing arrives "
                        "on it until a later SUBACK grants it (check the broker's ACL for %s)",
                        self._s.name,
                        topic,
                        reason,
                        self._s.client_id,
                    )
            elif self._refused.pop(topic, None) is not None:
                log.warning(
                    "%s: subscription to %s granted (%s) after a refusal",
                    self._s.name,
                    topic,
                    reason,
                )
            else:
                log.info("%s: subscribed to %s (%s)", self._s.name, topic, reason)
        if not self._refused:
            self._resubscribe_backoff.reset()
        elif self._resubscribe_timer is None and not self._stopping and self._client is not None:
            delay = self._resubscribe_backoff.next_delay()
            epoch = self._client.epoch
            log.info(
                "%s: asking the broker again for %s in %.0f s",
                self._s.name,
                ", ".join(self._refused),
                delay,
            )
            self._resubscribe_timer = self._clock.call_later(
                delay, lambda: tell_unless_dead(self.actor_ref, _Resubscribe(epoch))
            )

    def _resubscribe(self, epoch: int) -> None:
        """The refused filters, asked for again on the connection that refused them."""
        if self._stopping or self._client is None or self._client.epoch != epoch:
            return  # that connection is gone: the next one subscribes to every filter
        if self._state != "connected" or not self._refused:
            return
        self._subscribe(tuple(self._refused))

    def _cancel_resubscribe(self) -> None:
        if self._resubscribe_timer is not None:
            self._resubscribe_timer.cancel()
            self._resubscribe_timer = None

    def _handle_disconnected(self, message: _Disconnected) -> None:
        if self._stopping:
            return
        assert self._client is not None
        if message.epoch != self._client.epoch:
            return  # a late report about a connection we already replaced
        self._cancel_resubscribe()
        if self._state == "connected":
            self._disconnects += 1
            self._lifecycle_tell(
                SessionDisconnected(
                    self._s.client_id, self._s.client_id, message.epoch, message.event_reason
                )
            )
        tls_cause = self._tls_errors.pop(message.epoch, None)
        self._tls_errors.clear()  # older epochs will not report again
        if tls_cause is not None and self._state != "connected":
            self._tls_failed(message.epoch, tls_cause)  # refused before any CONNACK
        else:
            if self._refused_epoch != message.epoch:
                self._last_reason = message.reason
            if tls_cause is not None:
                log.warning(
                    "%s: disconnected: %s (TLS: %s)", self._s.name, message.reason, tls_cause
                )
            else:
                log.warning("%s: disconnected: %s", self._s.name, message.reason)
        self._listener.tell(SessionEnded(message.epoch, message.reason))
        self._schedule_reconnect()

    # -- connecting -------------------------------------------------------------------------

    def _attempt(self) -> None:
        client = self._client
        assert client is not None
        s = self._s
        self._state = "connecting"
        client.loop_stop()  # the previous network thread, if any, has ended or ends now
        if s.password_file is not None:
            try:
                client.username_pw_set(s.username, read_password_file(s.password_file))
            except (OSError, ValueError) as error:
                # An OSError names the file; a problem with its content does not.
                problem = error if isinstance(error, OSError) else f"{s.password_file}: {error}"
                self._last_reason = f"password file unreadable: {problem}"
                log.error("%s: cannot read the password file: %s", s.name, problem)
                self._schedule_reconnect()
                return
        try:
            if not self._ever_attempted(client):
                properties = Properties(PacketTypes.CONNECT)
                properties.SessionExpiryInterval = s.session_expiry_seconds
                properties.ReceiveMaximum = s.receive_maximum
                client.connect(
                    s.host,
                    s.port,
                    keepalive=s.keepalive_seconds,
                    clean_start=s.clean_start,
                    properties=properties,
                )
            else:
                client.reconnect()
        except ssl.SSLError as error:  # before OSError, which it is too
            self._tls_failed(client.epoch, describe_tls_error(error))
            self._schedule_reconnect()
            return
        except (OSError, ValueError) as error:
            self._last_reason = f"connect failed: {error}"
            # A reset can only come after the TCP connect, so in the handshake: mosquitto
            # resets a TLS ClientHello on a plain listener.
            hint = (
                " (during the TLS handshake: is this port a TLS listener?)"
                if s.tls and isinstance(error, ConnectionResetError)
                else ""
            )
            log.warning("%s: cannot connect to %s:%d: %s%s", s.name, s.host, s.port, error, hint)
            self._schedule_reconnect()
            return
        if client.loop_start() != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise RuntimeError(f"{s.name}: paho network thread did not start")

    @staticmethod
    def _ever_attempted(client: EpochClient) -> bool:
        return client.epoch > 0

    def _schedule_reconnect(self) -> None:
        if not self._s.auto_reconnect:
            self._state = "not_reconnecting"
            log.error(
                "%s: connection to %s:%d ended (%s) and auto_reconnect = false: not reconnecting; "
                "restart fxgate once the broker is reachable",
                self._s.name,
                self._s.host,
                self._s.port,
                self._last_reason or "-",
            )
            return
        self._cancel_timer()
        delay = self._backoff.next_delay()
        self._state = "waiting"
        self._next_attempt_at = self._clock.monotonic() + delay
        log.info(
            "%s: reconnecting in %.2f s (attempt %d)", self._s.name, delay, self._backoff.attempt
        )
        self._timer = self._clock.call_later(
            delay, lambda: tell_unless_dead(self.actor_ref, _Reconnect())
        )

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- status -----------------------------------------------------------------------------

    def state(self) -> ConnectionState:
        next_in = None
        if self._next_attempt_at is not None:
            next_in = max(0.0, self._next_attempt_at - self._clock.monotonic())
        return ConnectionState(
            self._s.name,
            self._state,
            self._s.client_id,
            self._last_reason,
            self._connects,
            self._disconnects,
            next_in,
            dict(self._refused),
            self._refusals,
        )
