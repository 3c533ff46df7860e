"""A local mosquitto broker process with a deliberate configuration, for the demo and the tests.

mosquitto's defaults lose messages silently (DESIGN §4): past `max_queued_messages` (1000) it
drops QoS 1/2 messages for an offline client while the publisher sees success, and a session
survives a restart only if it was saved. So every broker we start says what it queues and when it
saves, listens on loopback only, and keeps its state in a directory of its own.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from actors.devtools.broker_process import BrokerProcess

READY_MARK = " running"
# mosquitto 2.0.11's own limits, as operators run it (DESIGN §4): past 1,000 queued messages an
# offline client's QoS 1/2 messages are dropped, and 20 are in flight per client. `broker_config`
# holds far more by default, on purpose; tests and benchmarks of the field pass these.
SHIPPED_LIMITS = {"max_queued_messages": 1000, "max_inflight_messages": 20}


@dataclass(frozen=True)
class ListenerTls:
    """TLS on the broker's listener: its certificate and key, and the CA its clients'
    certificates must chain to. `require_certificate` makes it mutual TLS: a client without a
    certificate signed by `cafile` is refused during the handshake."""

    cafile: Path
    certfile: Path
    keyfile: Path
    require_certificate: bool = False

    def lines(self) -> list[str]:
        return [
            f"cafile {self.cafile}",
            f"certfile {self.certfile}",
            f"keyfile {self.keyfile}",
            f"require_certificate {'true' if self.require_certificate else 'false'}",
        ]


def broker_config(
    port: int,
    data_dir: Path,
    *,
    host: str = "127.0.0.1",
    max_queued_messages: int = 1_000_000,
    max_inflight_messages: int = 1000,
    autosave_interval: int = 1,
    debug_log: bool = False,
    password_file: Path | None = None,
    tls: ListenerTls | None = None,
    extra: Iterable[str] = (),
) -> str:
    log_types = (
        ["all"]
        if debug_log
        else ["error", "warning", "notice", "information", "subscribe", "unsubscribe"]
    )
    lines = [
        f"listener {port} {host}",
        # Listener options belong right after their `listener` line.
        *(tls.lines() if tls is not None else []),
        *(
            ["allow_anonymous true"]
            if password_file is None
            else ["allow_anonymous false", f"password_file {password_file}"]
        ),
        # Never switch to the 'mosquitto' user: the data dir belongs to whoever started us.
        "user root",
        "persistence true",
        f"persistence_location {data_dir}/",
        "persistence_file mosquitto.db",
        # Save sessions and queues every second so a SIGKILLed broker loses at most that much,
        # and a graceful stop saves everything.
        f"autosave_interval {autosave_interval}",
        # The default of 1000 drops silently for offline clients; hold far more, on purpose.
        f"max_queued_messages {max_queued_messages}",
        "max_queued_bytes 0",
        # Let each client's Receive Maximum govern in-flight messages, not the broker default 20.
        f"max_inflight_messages {max_inflight_messages}",
        "set_tcp_nodelay true",
        "log_dest stdout",
        f"log_dest file {data_dir}/mosquitto.log",
        "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        *[f"log_type {t}" for t in log_types],
        *extra,
    ]
    return "\n".join(lines) + "\n"


class MosquittoProcess(BrokerProcess):
    """One mosquitto on loopback; `stop`/`kill`/`start` keep its port and persistence dir."""

    kind = "mosquitto"
    ready_mark = READY_MARK

    def __init__(self, data_dir: Path, port: int | None = None, **config_options) -> None:
        super().__init__(data_dir, port)
        self.conf_path = self.data_dir / "mosquitto.conf"
        self.conf_path.write_text(broker_config(self.port, self.data_dir, **config_options))
        self.log_path = self.data_dir / "mosquitto.log"

    def argv(self) -> list[str]:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        # mosquitto block-buffers stdout into a pipe; line-buffer it so readiness is seen at once.
        argv = [binary, "-c", str(self.conf_path)]
        if shutil.which("stdbuf"):
            argv = ["stdbuf", "-oL", *argv]
        return argv
