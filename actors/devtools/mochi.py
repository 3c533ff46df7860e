"""A local Mochi MQTT broker, for the tests.

`make` builds it from actors/devtools/brokers/mochi (the Mochi module pinned in its go.mod and
go.sum, fetched from the Go module proxy) into the virtualenv (share/fxgate/bin/fxgate-mochi). It
keeps its sessions, subscriptions and queued messages in a Pebble store in its own data folder, so
that they survive a restart (see main.go for why not Mochi's bbolt hook); everything else is Mochi's
shipped setting: a Receive Maximum of 1,024, QoS 1/2 messages past 8,192 in flight dropped, a 24 h
maximum message expiry.
"""

from __future__ import annotations

from pathlib import Path

from actors.devtools.broker_process import BrokerProcess, installed

READY_MARK = "fxgate-mochi: started"


class MochiProcess(BrokerProcess):
    """One Mochi MQTT on loopback; `stop`/`kill`/`start` keep its port and its store."""

    kind = "mochi"
    ready_mark = READY_MARK

    def __init__(
        self, data_dir: Path, port: int | None = None, *, binary: Path | None = None
    ) -> None:
        super().__init__(data_dir, port)
        self.binary = binary or installed("bin", "fxgate-mochi")
        self.state_dir = self.data_dir / "pebble"

    def argv(self) -> list[str]:
        if not self.binary.exists():
            raise RuntimeError(
                f"Mochi MQTT is not installed ({self.binary} is missing): run `make` to build it"
            )
        return [
            str(self.binary),
            "--address",
            f"{self.host}:{self.port}",
            "--data",
            str(self.state_dir),
        ]
