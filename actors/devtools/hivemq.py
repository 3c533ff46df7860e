"""A local HiveMQ Community Edition broker (embedded, in a JVM of its own), for the tests.

`make` fetches the broker and its dependencies from Maven Central into the virtualenv
(share/fxgate/hivemq/lib, pinned in actors/devtools/brokers/hivemq/pom.xml) and compiles the
small launcher beside them (share/fxgate/hivemq/launcher). Each broker gets a generated
`config.xml`: a TCP listener on loopback, file persistence in its own data folder (sessions and
queued messages survive a restart), the per-client queue of queued messages at HiveMQ's shipped
1,000 discarding the newest unless told otherwise, no usage statistics and no update check (no
network). Everything else is HiveMQ's shipped setting, among them the server Receive Maximum
of 10: a client with an 11th QoS 1/2 PUBLISH in flight is disconnected (reason 0x93).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from actors.devtools.broker_process import BrokerProcess, installed

READY_MARK = "fxgate-hivemq: started"
SHIPPED_QUEUE_SIZE = 1000
LAUNCHER_CLASS = "FxgateHiveMQ"


def hivemq_config(port: int, *, max_queue_size: int = SHIPPED_QUEUE_SIZE) -> str:
    return f"""<?xml version="1.0"?>
<hivemq>
    <listeners>
        <tcp-listener>
            <port>{port}</port>
            <bind-address>127.0.0.1</bind-address>
        </tcp-listener>
    </listeners>
    <mqtt>
        <queued-messages>
            <max-queue-size>{max_queue_size}</max-queue-size>
            <strategy>discard</strategy>
        </queued-messages>
    </mqtt>
    <persistence>
        <mode>file</mode>
    </persistence>
    <anonymous-usage-statistics>
        <enabled>false</enabled>
    </anonymous-usage-statistics>
    <general>
        <update-check-enabled>false</update-check-enabled>
    </general>
</hivemq>
"""


class HiveMQProcess(BrokerProcess):
    """One embedded HiveMQ CE on loopback; `stop`/`kill`/`start` keep its port and data."""

    kind = "hivemq"
    ready_mark = READY_MARK
    start_timeout = 90.0

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        max_queue_size: int = SHIPPED_QUEUE_SIZE,
        home: Path | None = None,
    ) -> None:
        super().__init__(data_dir, port)
        self.home = home or installed("hivemq")
        self.conf_dir = self.data_dir / "conf"
        self.state_dir = self.data_dir / "data"
        self.extensions_dir = self.data_dir / "extensions"
        for folder in (self.conf_dir, self.state_dir, self.extensions_dir):
            folder.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "config.xml").write_text(
            hivemq_config(self.port, max_queue_size=max_queue_size)
        )

    def argv(self) -> list[str]:
        launcher = self.home / "launcher" / f"{LAUNCHER_CLASS}.class"
        if not launcher.exists():
            raise RuntimeError(
                f"HiveMQ CE is not installed ({launcher} is missing): run `make` to install it"
            )
        java = shutil.which("java") or "java"
        classpath = f"{self.home / 'launcher'}:{self.home / 'lib'}/*"
        return [
            java,
            "-Xmx512m",
            "-XX:+ExitOnOutOfMemoryError",
            f"-Djava.io.tmpdir={self.state_dir}",
            "-cp",
            classpath,
            LAUNCHER_CLASS,
            str(self.conf_dir),
            str(self.state_dir),
            str(self.extensions_dir),
        ]
