"""Throw-away certificates for TLS tests, made with the `openssl` command line tool.

One run makes two certificate authorities (the one the tests trust and a stranger), a server
certificate for `localhost` / 127.0.0.1, a server certificate for another name only
(`broker.example`, to be refused by hostname verification) and a client certificate for mutual
TLS. Keys are EC P-256: generated in milliseconds, unlike RSA.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
# Short-lived on purpose: nothing made here should be usable after the test run.
DAYS = "2"


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CertificateSet:
    ca: Path  # the CA the gateway is told to trust
    other_ca: Path  # a CA that signed none of the certificates below
    server: KeyPair  # for localhost and 127.0.0.1, signed by `ca`
    wrong_name_server: KeyPair  # for broker.example only, signed by `ca`
    client: KeyPair  # clientAuth, signed by `ca`


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [OPENSSL, *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{result.stderr}")


def _new_key(path: Path) -> None:
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        str(path),
        cwd=path.parent,
    )
    os.chmod(path, 0o600)


def _make_ca(directory: Path, name: str) -> KeyPair:
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _new_key(pair.key)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(pair.key),
        "-out",
        str(pair.cert),
        "-days",
        DAYS,
        "-subj",
        f"/CN=fxgate test {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )
    return pair


def _issue(directory: Path, ca: KeyPair, name: str, common_name: str, extensions: str) -> KeyPair:
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _new_key(pair.key)
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n" + extensions
    )
    _openssl(
        "req",
        "-new",
        "-key",
        str(pair.key),
        "-out",
        str(csr),
        "-subj",
        f"/CN={common_name}",
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca.cert),
        "-CAkey",
        str(ca.key),
        "-CAcreateserial",
        "-out",
        str(pair.cert),
        "-days",
        DAYS,
        "-extfile",
        str(ext),
        cwd=directory,
    )
    return pair


def make_certificates(directory: Path) -> CertificateSet:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _make_ca(directory, "ca")
    other = _make_ca(directory, "other-ca")
    server = _issue(
        directory,
        ca,
        "server",
        "localhost",
        "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    wrong_name = _issue(
        directory,
        ca,
        "wrong-name-server",
        "broker.example",
        "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:broker.example\n",
    )
    client = _issue(directory, ca, "client", "gateway", "extendedKeyUsage=clientAuth\n")
    return CertificateSet(ca.cert, other.cert, server, wrong_name, client)
