"""A local SeaweedFS with its S3 gateway, for the S3 tables' tests.

SeaweedFS is a real S3-compatible server (not an emulator of one) whose S3 gateway honours
conditional writes (`If-None-Match: *` on PutObject, checked under the filer's lock), which
delta-rs commits S3 tables with: two members creating the same log entry at once, one wins and the
other is told it exists. `make` builds its `weed` command from the Go module proxy's sources (the
version pinned in the Makefile) into the virtualenv.

`weed mini` runs the master, a volume server, the filer and the S3 gateway in one process, all
on loopback ports of their own (chosen once, kept through `stop`/`start`) and with their files in
the data folder, so that a restarted store serves what it held (all but the servers' local gRPC
sockets, which `weed mini` puts in /tmp whatever it is told: they are removed when the store
ends). It knows one identity, whose keys are given to it in its environment and to the clients
by `environment()`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from actors.devtools.broker_process import BrokerProcess, free_port, installed

READY_MARK = "All enabled components are running and ready to use"
ACCESS_KEY = "fxgate-tests"
SECRET_KEY = "fxgate-tests-secret"
REGION = "us-east-1"
# Every listener `weed mini` opens, besides the S3 port: each gets a free loopback port, or the
# defaults (8333, 9333, ...) would collide with another store and with the machine's services.
_OTHER_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "webdav.port",
    "admin.port",
    "admin.port.grpc",
)

# The local gRPC socket each server makes in /tmp, named by its gRPC port (left there by a kill).
_GRPC_SOCKETS = {
    "master": "master.port.grpc",
    "volume": "volume.port.grpc",
    "filer": "filer.port.grpc",
    "s3": "s3.port.grpc",
    "admin": "admin.port.grpc",
}


def seaweedfs_command() -> Path:
    """The `weed` command `make` built (share/fxgate/bin/weed in the virtualenv)."""
    return installed("bin", "weed")


class SeaweedFSProcess(BrokerProcess):
    """One SeaweedFS (`weed mini`) on loopback, its S3 gateway on `port`; `stop`/`kill`/`start`
    keep its ports and its objects."""

    kind = "seaweedfs"
    ready_mark = READY_MARK
    start_timeout = 60.0

    def __init__(self, data_dir: Path, port: int | None = None, *, command: Path | None = None):
        super().__init__(data_dir, port)
        self.command = command or seaweedfs_command()
        self.store_dir = self.data_dir / "store"
        self.ports = {name: free_port(self.host) for name in _OTHER_PORTS}

    @property
    def url(self) -> str:
        """The S3 endpoint (path-style bucket addressing)."""
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        if not self.command.exists():
            raise RuntimeError(
                f"SeaweedFS is not installed ({self.command} is missing): run `make`"
            )
        self.store_dir.mkdir(parents=True, exist_ok=True)
        return [
            str(self.command),
            "mini",
            f"-dir={self.store_dir}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-s3.port={self.port}",
            *(f"-{name}={port}" for name, port in self.ports.items()),
            "-admin.port.legacy=0",
            "-admin.ui=false",
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
            f"-s3.localSocket={self.data_dir / 's3.sock'}",
        ]

    def _end(self, sig: signal.Signals, timeout: float) -> None:
        super()._end(sig, timeout)
        for server, port in _GRPC_SOCKETS.items():
            Path(f"/tmp/seaweedfs-{server}-grpc-{self.ports[port]}.sock").unlink(missing_ok=True)

    def child_environment(self) -> dict[str, str]:
        # weed mini makes its one identity from the keys in its environment.
        return {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def create_root(self, name: str) -> str:
        """Make bucket `name` (if missing); its `s3://` URI."""
        from pyarrow.fs import S3FileSystem

        files = S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=self.url,
            scheme="http",
            allow_bucket_creation=True,
        )
        files.create_dir(name)
        return f"s3://{name}"

    def environment(self, port: int | None = None) -> dict[str, str]:
        """The variables a process sets to reach this store as it would reach S3 with an access
        key (delta-rs, obstore and the readers read them); at `port`, a proxy's in front of it,
        if given."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": f"http://{self.host}:{port or self.port}",
            "AWS_ALLOW_HTTP": "true",
        }
