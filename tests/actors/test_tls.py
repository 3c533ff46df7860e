"""TLS and secrets against real mosquitto TLS listeners, with certificates made for the run
(issue 7, security).

A wrong password on a `password_file` listener is already covered by
tests/actors/test_lifecycle_wiring.py::test_a_wrong_password_is_an_authentication_error_then_a_backoff_not_a_crash_loop.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from actors.app.status import collect_status, format_status
from actors.clock import RealClock, SimulatedClock
from actors.config.schema import Config, ConfigError, load_config
from actors.devtools.broker_process import free_port
from actors.devtools.mosquitto import ListenerTls
from actors.devtools.simulate import TagEventGenerator
from actors.lifecycle import SESSION_DISCONNECTED, LifecycleActor, client_info
from actors.messages import ClientsConfigured
from actors.supervisor import Supervisor, source_settings, spark_session_factory, upstream_settings
from tests.actors.test_connection import InstantLedger, settings
from tests.actors.test_lifecycle_wiring import Events
from tests.harness.certs import CertificateSet, make_certificates

pytestmark = pytest.mark.broker

TOPIC = "zebra/fx/fx9600-01/reads"
SECRET = "s3cret-Pa55word-of-the-gateway"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> CertificateSet:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def server_tls(certs: CertificateSet, *, mutual: bool = False, wrong_name: bool = False):
    pair = certs.wrong_name_server if wrong_name else certs.server
    return ListenerTls(certs.ca, pair.cert, pair.key, require_certificate=mutual)


def tls_settings(broker, certs: CertificateSet, *, client_cert: bool = False, **overrides):
    tls = {
        "tls": True,
        "tls_ca_file": str(certs.ca),
        "tls_cert_file": str(certs.client.cert) if client_cert else None,
        "tls_key_file": str(certs.client.key) if client_cert else None,
    }
    return settings(broker, **{**tls, **overrides})


@pytest.fixture
def lifecycle(tmp_path):
    """A real LifecycleActor whose events are collected; started on demand for a setting."""
    started = []

    def start(connection_settings, clock):
        events = Events()
        ref = LifecycleActor.start(tmp_path / "lifecycle.sqlite", clock, (events,), "test")
        ref.tell(ClientsConfigured((client_info(connection_settings),)))
        started.append(ref)
        return ref, events

    yield start
    for ref in started:
        if ref.is_alive():
            ref.stop()


def publish_over_tls(
    broker, certs: CertificateSet, payloads: list[bytes], timeout=15.0, username=None, password=None
) -> None:
    """Publish at QoS 1 as a reader would, over TLS with a client certificate; wait for acks."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="tls-reader", protocol=MQTTProtocolVersion.MQTTv5
    )
    if username is not None:
        client.username_pw_set(username, password)
    client.tls_set(
        ca_certs=str(certs.ca), certfile=str(certs.client.cert), keyfile=str(certs.client.key)
    )
    cond = threading.Condition()
    acked: list[int] = []

    def on_publish(_c, _u, mid, _reason, _p):
        with cond:
            acked.append(mid)
            cond.notify_all()

    client.on_publish = on_publish
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        for payload in payloads:
            client.publish(TOPIC, payload, qos=1)
        with cond:
            assert cond.wait_for(lambda: len(acked) == len(payloads), timeout), acked
    finally:
        client.disconnect()
        client.loop_stop()


def errors_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# --- connecting over TLS -----------------------------------------------------------------------


def test_a_read_published_over_tls_reaches_the_ledger_and_our_ack_reaches_the_broker(
    mosquitto_factory, certs, actors
):
    broker = mosquitto_factory(tls=server_tls(certs), debug_log=True)
    ledger = InstantLedger()
    actors(tls_settings(broker, certs, subscriptions=(TOPIC,), qos=1), SimulatedClock(), ledger)
    ledger.wait_sessions(1)
    assert broker.wait_for_output(f"fxgate-test-gw1 1 {TOPIC}", 10)
    publish_over_tls(broker, certs, [b"read-%d" % i for i in range(5)])
    assert ledger.wait_payloads(5) == [b"read-%d" % i for i in range(5)]
    # The InstantLedger acked each one: the broker got our PUBACKs over the TLS session.
    assert broker.wait_for_output("Received PUBACK from fxgate-test-gw1", 10)


def test_mutual_tls_accepts_our_client_certificate_and_refuses_a_connection_without_one(
    mosquitto_factory, certs, actors, lifecycle, caplog
):
    broker = mosquitto_factory(tls=server_tls(certs, mutual=True))
    with_cert = InstantLedger()
    actors(tls_settings(broker, certs, client_cert=True), SimulatedClock(), with_cert)
    assert with_cert.wait_sessions(1).session_present is False

    clock = SimulatedClock()
    without = tls_settings(broker, certs, client_id="fxgate-test-nocert")
    events_ref, events = lifecycle(without, clock)
    no_cert = InstantLedger()
    connection = actors(without, clock, no_cert, lifecycle=events_ref)
    refused = events.wait_sessions(1)[0]
    assert refused["type"] == SESSION_DISCONNECTED
    assert refused["data"]["disconnectionReason"] == "ClientError"
    assert no_cert.sessions == []
    assert any(
        "source: TLS handshake with 127.0.0.1" in line and "client certificate" in line
        for line in errors_logged(caplog)
    ), errors_logged(caplog)
    assert clock.wait_for_timers(1)
    assert connection.proxy().state().get(timeout=5).state == "waiting"


def test_a_broker_certificate_from_an_unknown_ca_is_refused_then_retried_on_the_backoff(
    mosquitto_factory, certs, actors, lifecycle, caplog
):
    broker = mosquitto_factory(tls=server_tls(certs))
    clock = SimulatedClock()
    s = tls_settings(broker, certs, tls_ca_file=str(certs.other_ca))
    events_ref, events = lifecycle(s, clock)
    ledger = InstantLedger()
    connection = actors(s, clock, ledger, lifecycle=events_ref)

    first = events.wait_sessions(1)[0]
    assert first["data"]["disconnectionReason"] == "ClientError"
    assert (
        f"source: TLS handshake with 127.0.0.1:{broker.port} failed: certificate verify failed: "
        "self-signed certificate in certificate chain"
    ) in errors_logged(caplog)
    assert clock.wait_for_timers(1)
    state = connection.proxy().state().get(timeout=5)
    assert state.state == "waiting"
    assert state.last_reason.startswith("TLS failed: certificate verify failed")
    first_delay = state.next_attempt_in

    # The next attempt comes from the backoff timer, fails the same way, and waits longer.
    clock.advance(clock.next_due_in())
    events.wait_sessions(2)
    assert clock.wait_for_timers(1)
    state = connection.proxy().state().get(timeout=5)
    assert state.state == "waiting"
    assert state.next_attempt_in > first_delay
    assert connection.is_alive()
    assert ledger.sessions == []


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "IP address mismatch, certificate is not valid for '127.0.0.1'"),
        ("localhost", "Hostname mismatch, certificate is not valid for 'localhost'"),
    ],
)
def test_a_broker_certificate_for_another_host_name_is_refused_with_the_mismatch_named(
    mosquitto_factory, certs, actors, lifecycle, caplog, host, expected
):
    broker = mosquitto_factory(tls=server_tls(certs, wrong_name=True))
    clock = SimulatedClock()
    s = tls_settings(broker, certs, host=host)
    events_ref, events = lifecycle(s, clock)
    actors(s, clock, InstantLedger(), lifecycle=events_ref)
    assert events.wait_sessions(1)[0]["data"]["disconnectionReason"] == "ClientError"
    assert any(
        "failed: certificate verify failed: " + expected in line for line in errors_logged(caplog)
    ), errors_logged(caplog)
    assert clock.wait_for_timers(1)


def test_tls_insecure_connects_to_a_certificate_for_another_name_and_warns_loudly(
    mosquitto_factory, certs, actors, caplog
):
    broker = mosquitto_factory(tls=server_tls(certs, wrong_name=True))
    ledger = InstantLedger()
    actors(tls_settings(broker, certs, tls_insecure=True), SimulatedClock(), ledger)
    ledger.wait_sessions(1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("TLS WITHOUT HOST NAME VERIFICATION" in line for line in warnings), warnings


def test_a_plain_listener_is_named_as_the_likely_cause_of_a_handshake_failure(
    mosquitto, certs, actors, caplog
):
    clock = SimulatedClock()
    actors(tls_settings(mosquitto, certs), clock, InstantLedger())
    assert clock.wait_for_timers(1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # mosquitto 2.0.11 resets the connection when a plain listener gets a TLS ClientHello.
    assert any("is this port a TLS listener?" in line for line in warnings), warnings


# --- passwords from a file ---------------------------------------------------------------------


def mosquitto_passwords(path: Path, user: str, password: str) -> Path:
    subprocess.run(
        ["mosquitto_passwd", "-c", "-b", str(path), user, password],
        check=True,
        capture_output=True,
    )
    return path


def test_a_password_file_is_read_at_each_connect_so_a_rotated_password_is_used(
    mosquitto_factory, certs, actors, lifecycle, tmp_path, caplog
):
    broker = mosquitto_factory(
        password_file=mosquitto_passwords(tmp_path / "passwd", "gateway", SECRET),
        tls=server_tls(certs),
    )
    secret_file = tmp_path / "source-password"
    secret_file.write_text(SECRET + "\n")  # the newline an editor leaves is not the password's
    clock = SimulatedClock()
    s = tls_settings(broker, certs, username="gateway", password_file=str(secret_file))
    events_ref, events = lifecycle(s, clock)
    ledger = InstantLedger()
    connection = actors(s, clock, ledger, lifecycle=events_ref)
    ledger.wait_sessions(1)

    # Rotated on disk to a password the broker does not know: the next connect reads it.
    secret_file.write_text("not-the-password\n")
    broker.restart()
    assert clock.wait_for_timers(1)
    clock.advance(clock.next_due_in())
    refused = events.wait_sessions(3)[2]
    assert refused["data"]["disconnectionReason"] == "ClientAuthenticationError"
    assert connection.is_alive()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET not in logged and "not-the-password" not in logged


def test_a_missing_password_file_is_a_clear_error_then_a_retry_not_a_crash(
    tmp_path, actors, caplog
):
    clock = SimulatedClock()

    class Nowhere:
        host, port = "127.0.0.1", free_port()

    s = settings(Nowhere, username="gateway", password_file=str(tmp_path / "gone"))
    connection = actors(s, clock, InstantLedger())
    assert clock.wait_for_timers(1)
    state = connection.proxy().state().get(timeout=5)
    assert state.state == "waiting"
    assert state.last_reason.startswith("password file unreadable")
    assert any("cannot read the password file" in line for line in errors_logged(caplog))


# --- configuration -----------------------------------------------------------------------------


def load(environ: dict[str, str], path: Path | None = None) -> Config:
    return load_config(path, environ=environ, hostname="gw-01")


def config_errors(environ: dict[str, str], path: Path | None = None) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        load(environ, path)
    return caught.value.errors


PRODUCTION = {"FXGATE__GATEWAY__MODE": "production", "MQTT_ENVIRONMENT_ID": "plant-7"}


def test_tls_keys_reach_the_source_and_upstream_connection_settings(certs, tmp_path):
    secret_file = tmp_path / "pw"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o600)
    toml = tmp_path / "fxgate.toml"
    toml.write_text(
        f'[upstream]\nhost = "cloud.example.com"\nport = 8883\nusername = "gw"\n'
        f'password_file = "{secret_file}"\ntls = true\ntls_ca_file = "{certs.ca}"\n'
        f'tls_cert_file = "{certs.client.cert}"\ntls_key_file = "{certs.client.key}"\n'
        '[[routes]]\nsource = "zebra/fx/+/reads"\n'
        f'[source]\ntls = true\ntls_ca_file = "{certs.ca}"\ntls_insecure = true\n'
    )
    config = load({}, toml)
    source, upstream = source_settings(config), upstream_settings(config)
    assert (source.tls, source.tls_ca_file, source.tls_insecure) == (True, str(certs.ca), True)
    assert source.tls_cert_file is None and source.password_file is None
    assert (upstream.tls, upstream.tls_insecure) == (True, False)
    assert (upstream.tls_cert_file, upstream.tls_key_file) == (
        str(certs.client.cert),
        str(certs.client.key),
    )
    assert upstream.password_file == str(secret_file)
    assert upstream.password is None  # read by the connection at each connect, not held here
    assert any("source.tls_insecure = true" in w for w in config.warnings())
    summary = "\n".join(config.summary_lines())
    assert f"TLS: broker verified against {certs.ca}, host name NOT verified" in summary
    assert f"password from file {secret_file}" in summary
    assert SECRET not in summary and SECRET not in repr(config)


def test_tls_files_are_checked_at_load_and_each_problem_names_its_key(certs, tmp_path):
    errors = config_errors(
        {
            "FXGATE__SOURCE__TLS": "true",
            "FXGATE__SOURCE__TLS_CA_FILE": str(tmp_path / "missing-ca.pem"),
            "FXGATE__SOURCE__TLS_CERT_FILE": str(certs.client.cert),
        }
    )
    assert errors == (
        "source.tls_key_file: required with source.tls_cert_file (mutual TLS needs the client "
        "certificate and its key)",
        f"source.tls_ca_file: {tmp_path / 'missing-ca.pem'}: no such file",
    )


def test_a_key_that_does_not_match_its_certificate_fails_at_load(certs):
    (error,) = config_errors(
        {
            "FXGATE__SOURCE__TLS": "true",
            "FXGATE__SOURCE__TLS_CERT_FILE": str(certs.client.cert),
            "FXGATE__SOURCE__TLS_KEY_FILE": str(certs.server.key),
        }
    )
    assert error.startswith(f"source.tls_key_file: {certs.server.key} and source.tls_cert_file")
    assert "KEY_VALUES_MISMATCH" in error


def test_a_ca_file_that_is_not_a_certificate_fails_at_load(tmp_path):
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello\n")
    (error,) = config_errors(
        {"FXGATE__SOURCE__TLS": "true", "FXGATE__SOURCE__TLS_CA_FILE": str(not_pem)}
    )
    assert error.startswith(f"source.tls_ca_file: {not_pem}: no PEM CA certificate")


def test_tls_files_without_tls_true_are_an_error_not_a_silent_plain_connection(certs):
    errors = config_errors(
        {"FXGATE__SOURCE__TLS_CA_FILE": str(certs.ca), "FXGATE__SOURCE__TLS_INSECURE": "true"}
    )
    assert [e.split(":")[0] for e in errors] == ["source.tls_ca_file", "source.tls_insecure"]
    assert all("source.tls = false" in e for e in errors)


def test_password_env_and_password_file_together_are_an_error(tmp_path):
    secret_file = tmp_path / "pw"
    secret_file.write_text(SECRET)
    errors = config_errors(
        {
            "FXGATE__SOURCE__PASSWORD_ENV": "PW",
            "FXGATE__SOURCE__PASSWORD_FILE": str(secret_file),
        }
    )
    assert errors == ("source.password_file: set password_env or password_file, not both",)


def test_a_group_readable_password_file_is_refused_in_production_and_warned_in_development(
    tmp_path,
):
    secret_file = tmp_path / "pw"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o640)
    environ = {"FXGATE__SOURCE__USERNAME": "gw", "FXGATE__SOURCE__PASSWORD_FILE": str(secret_file)}
    (error,) = config_errors({**environ, **PRODUCTION})
    assert error.startswith("source.password_file: the file is accessible by group or others")
    assert "mode 0640" in error and "chmod 600" in error

    development = load(environ)
    assert any(w.startswith("source.password_file: ") for w in development.warnings())

    secret_file.chmod(0o600)
    assert load({**environ, **PRODUCTION}).source.password_file == str(secret_file)


def test_a_password_never_appears_in_config_errors(tmp_path):
    toml = tmp_path / "fxgate.toml"
    # A password written into the file itself (there is no key for it)...
    toml.write_text(f'[source]\npassword = "{SECRET}"\n')
    assert config_errors({}, toml) == (
        "source.password: unknown key (did you mean 'password_env'?)",
    )
    # ... and one put where the path of a password file belongs.
    toml.write_text(f'[source]\npassword_file = "{SECRET}"\n')
    assert config_errors({}, toml) == ("source.password_file: no such file",)


def test_an_empty_password_file_fails_at_load(tmp_path):
    empty = tmp_path / "pw"
    empty.write_text("\n")
    assert config_errors({"FXGATE__SOURCE__PASSWORD_FILE": str(empty)}) == (
        "source.password_file: the file is empty (it must hold the password)",
    )


def test_secret_key_files_are_expected_private_in_production(certs, tmp_path):
    key = tmp_path / "client.key"
    key.write_bytes(certs.client.key.read_bytes())
    key.chmod(0o644)
    environ = {
        "FXGATE__SOURCE__TLS": "true",
        "FXGATE__SOURCE__TLS_CERT_FILE": str(certs.client.cert),
        "FXGATE__SOURCE__TLS_KEY_FILE": str(key),
        **PRODUCTION,
    }
    (error,) = config_errors(environ)
    assert error.startswith(f"source.tls_key_file: {key} is accessible by group or others")
    key.chmod(0o600)
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert load(environ).source.tls_key_file == str(key)


# --- the whole gateway -------------------------------------------------------------------------


@pytest.mark.spark
def test_a_gateway_over_tls_both_ways_lands_and_forwards_reads_and_shows_no_secret_anywhere(
    mosquitto_factory, certs, spark_session, tmp_path, caplog, capfd
):
    """Source: TLS with a password file. Upstream: mutual TLS. With forwarding on, a read lands
    only once the upstream broker acknowledged it, so landing all of them proves both legs. The
    forward leg runs in its own process (the default), which logs to the same stderr."""
    broker = mosquitto_factory(
        password_file=mosquitto_passwords(tmp_path / "passwd", "gateway", SECRET),
        tls=server_tls(certs),
    )
    upstream = mosquitto_factory(tls=server_tls(certs, mutual=True), debug_log=True)
    secret_file = tmp_path / "source-password"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    data = tmp_path / "data"
    config = load_config(
        None,
        environ={
            "FXGATE__SOURCE__PORT": str(broker.port),
            "FXGATE__SOURCE__USERNAME": "gateway",
            "FXGATE__SOURCE__PASSWORD_FILE": str(secret_file),
            "FXGATE__SOURCE__TLS": "true",
            "FXGATE__SOURCE__TLS_CA_FILE": str(certs.ca),
            "FXGATE__UPSTREAM__HOST": "127.0.0.1",
            "FXGATE__UPSTREAM__PORT": str(upstream.port),
            "FXGATE__UPSTREAM__TLS": "true",
            "FXGATE__UPSTREAM__TLS_CA_FILE": str(certs.ca),
            "FXGATE__UPSTREAM__TLS_CERT_FILE": str(certs.client.cert),
            "FXGATE__UPSTREAM__TLS_KEY_FILE": str(certs.client.key),
            "FXGATE__ROUTES__0__SOURCE": "zebra/fx/+/reads",
            "FXGATE__ROUTES__0__TARGET": "cloud/{environment}/{reader}",
            "FXGATE__ROUTES__0__QOS": "1",
            "FXGATE__GATEWAY__DATA_DIR": str(data),
            "FXGATE__PACKS__LINGER_SECONDS": "0.2",
            "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
            # The forward process logs at the configured level: DEBUG, like the lines below.
            "FXGATE__GATEWAY__LOG_LEVEL": "DEBUG",
        },
        hostname="gw-test",
    )
    # Every line of ours, DEBUG included, is checked for the password below.
    for name in ("actors", "persistence", "spark"):
        caplog.set_level(logging.DEBUG, logger=name)
    clock = RealClock()
    supervisor = Supervisor(config, clock, session_factory=lambda: spark_session)
    supervisor.start()
    try:
        assert broker.wait_for_output(config.identity.subscriptions[0], 15)
        reader = TagEventGenerator("fx9600-01")
        payloads = [reader.next_payload() for _ in range(20)]
        publish_over_tls(broker, certs, payloads, username="gateway", password=SECRET)
        assert supervisor.wait_for_landed(20, timeout=120)
        status = json.loads(json.dumps(supervisor.status(), default=str))
        report = collect_status(config)
        report["daemon"] = {**status, "running": True}
        shown = format_status(report)
        assert "source:     connected" in shown
        assert "upstream:   connected" in shown
    finally:
        supervisor.stop()
        clock.close()

    # This process's records, and the forward process's lines (its stderr is ours).
    logged = "\n".join(r.getMessage() for r in caplog.records) + capfd.readouterr().err
    assert "forward process started" in logged
    assert "forward actors.connection: upstream: connected to 127.0.0.1" in logged
    assert "source: connected to 127.0.0.1" in logged
    assert "upstream: connected to 127.0.0.1" in logged
    forwarded = re.findall(
        r"Received PUBLISH from fxgate-upstream\S* \(d0, q1, r0, m\d+, 'cloud/", upstream.output()
    )
    assert len(forwarded) == 20
    for text in (logged, json.dumps(status), shown, "\n".join(config.summary_lines())):
        assert SECRET not in text
    # Owner-only storage: the data dir, every SQLite file (and -wal/-shm), the tables dir.
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    sqlite_files = sorted(p.name for p in data.iterdir() if ".sqlite" in p.name)
    assert {"ledger.sqlite", "lifecycle.sqlite", "outbound.sqlite"} <= set(sqlite_files)
    assert {name: stat.S_IMODE(os.stat(data / name).st_mode) for name in sqlite_files} == {
        name: 0o600 for name in sqlite_files
    }
    assert stat.S_IMODE(os.stat(config.tables_path).st_mode) == 0o700


def test_the_daemons_spark_session_writes_table_files_owner_only(monkeypatch, tmp_path):
    captured = {}

    def fake_build_session(master, work_dir, **kwargs):
        captured.update(kwargs["conf"])
        return "session"

    monkeypatch.setattr("spark.session.build_session", fake_build_session)
    config = load({"FXGATE__GATEWAY__DATA_DIR": str(tmp_path)})
    assert spark_session_factory(config)() == "session"
    assert captured["spark.hadoop.fs.permissions.umask-mode"] == "077"
