"""A local Azurite (Microsoft's Azure Storage emulator), for the tests and the benchmarks.

`make` installs it from the npm registry (the version pinned in actors/devtools/azurite's
package.json and package-lock.json) into the virtualenv (share/fxgate/azurite). Only its Blob
service runs, on a loopback port of its own, keeping its blobs in its own data folder, so that a
restarted Azurite serves what it held. It knows one account, Azure's well-known emulator account,
whose key Microsoft publishes with the emulator.

`environment()` is what a process needs to reach it the way an operator reaches Azure: the
storage account variables, with delta-rs told to use the emulator at this port. Azure's tools
make a container before anything is stored in it, and so does `create_root` here (pyarrow's
Azure file system: delta-rs and obstore store into a container, and make none).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import shutil
import time
from pathlib import Path
from urllib.parse import urlencode

from actors.devtools.broker_process import BrokerProcess, installed

READY_MARK = "Azurite Blob service successfully listens on"
# The emulator's one account and its key: public, the same in every Azurite.
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


class AzuriteProcess(BrokerProcess):
    """One Azurite Blob service on loopback; `stop`/`kill`/`start` keep its port and its
    blobs."""

    kind = "azurite"
    ready_mark = READY_MARK
    start_timeout = 30.0

    def __init__(self, data_dir: Path, port: int | None = None, *, home: Path | None = None):
        super().__init__(data_dir, port)
        self.home = home or installed("azurite")
        self.blobs_dir = self.data_dir / "blobs"

    @property
    def url(self) -> str:
        """The Blob service's endpoint, with the account (Azurite's path-style URLs)."""
        return f"http://{self.host}:{self.port}/{ACCOUNT}"

    def argv(self) -> list[str]:
        script = self.home / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
        node = shutil.which("node")
        if not script.exists() or node is None:
            raise RuntimeError(
                f"Azurite is not installed ({script} is missing, or no node on the PATH): run "
                "`make` to install it"
            )
        self.blobs_dir.mkdir(parents=True, exist_ok=True)
        return [
            node,
            str(script),
            "--blobHost",
            self.host,
            "--blobPort",
            str(self.port),
            "--location",
            str(self.blobs_dir),
            # A newer client's API version is served, not refused: delta-rs's object_store
            # moves ahead of the emulator.
            "--skipApiVersionCheck",
            # No access log on stdout: only the start and errors are read from it.
            "--silent",
        ]

    def create_root(self, name: str) -> str:
        """Make container `name` (if missing); its `az://` URI."""
        from pyarrow.fs import AzureFileSystem

        files = AzureFileSystem(
            account_name=ACCOUNT,
            account_key=ACCOUNT_KEY,
            blob_storage_authority=f"{self.host}:{self.port}",
            dfs_storage_authority=f"{self.host}:{self.port}",
            blob_storage_scheme="http",
            dfs_storage_scheme="http",
        )
        files.create_dir(name)
        return f"az://{name}"

    def sas_token(self, permissions: str = "racwdl", key: str = ACCOUNT_KEY) -> str:
        """An account SAS of the emulator's account for its Blob service (`permissions` on
        containers and blobs, valid for a day), signed with `key`: what an operator puts in
        `AZURE_STORAGE_SAS_TOKEN`. Signed as Azure's "account SAS" is (service version
        2019-12-12: the account, permissions, services, resource types, start, expiry, IP,
        protocol and version, each followed by a newline, HMAC-SHA256 with the key)."""
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 86400))
        fields = {"sv": "2019-12-12", "ss": "b", "srt": "sco", "sp": permissions, "se": expiry}
        fields["spr"] = "https,http"
        signed = "\n".join(
            [ACCOUNT, permissions, "b", "sco", "", expiry, "", "https,http", "2019-12-12", ""]
        )
        digest = hmac.new(base64.b64decode(key), signed.encode(), hashlib.sha256).digest()
        fields["sig"] = base64.b64encode(digest).decode()
        return urlencode(fields)

    def environment(self, port: int | None = None) -> dict[str, str]:
        """The variables a process sets to reach this Azurite as it would reach Azure with an
        account key (delta-rs reads them; `AZURITE_BLOB_STORAGE_URL` points its emulator mode
        at this port instead of 10000, or at `port`, a proxy's in front of it)."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": ACCOUNT_KEY,
            "AZURE_STORAGE_USE_EMULATOR": "true",
            "AZURITE_BLOB_STORAGE_URL": f"http://{self.host}:{port or self.port}",
        }
