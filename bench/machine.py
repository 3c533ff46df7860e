"""The machine and software a benchmark ran on, recorded next to every number it produced.

Absolute throughput on a shared 2-vCPU box is noise without this; ratios are what we compare, but
a reader still needs to know which CPU, how much memory and which versions made them.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def mosquitto_version() -> str | None:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    try:
        out = subprocess.run(
            [binary, "-h"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError:
        return None
    match = re.search(r"mosquitto version (\S+)", out)
    return match.group(1) if match else None


def java_version() -> str | None:
    java = shutil.which("java")
    if java is None:
        return None
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except OSError:
        return None
    first = out.splitlines()[0] if out else ""
    return first.strip() or None


def _filesystem(path: Path) -> str | None:
    """The filesystem type under `path`: fsync costs (durability=power) depend on it."""
    best, kind = "", None
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and str(path).startswith(fields[1]) and len(fields[1]) > len(best):
                best, kind = fields[1], f"{fields[2]} ({fields[0]} on {fields[1]})"
    except OSError:
        pass
    return kind


PRODUCT_PATHS = ("actors", "persistence", "spark", "configs", "setup.cfg", "pyproject.toml")


def git_state() -> dict:
    """The commit the code under test comes from, and tracked files changed since (outside
    bench/): others commit to this tree while benchmarks run."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=False
            ).stdout
        except OSError:
            return ""

    changed = [
        line[3:]
        for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
        if not line[3:].startswith("bench/")
    ]
    return {
        "commit": git("rev-parse", "--short=12", "HEAD").strip() or None,
        # The newest commit that touched the code under test (not the benchmarks, not docs).
        "product_commit": git(
            "log", "-1", "--format=%h", "--abbrev=12", "--", *PRODUCT_PATHS
        ).strip()
        or None,
        "changed_files": changed,
    }


def describe(work_dir: Path) -> dict:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "ram_bytes": _ram_bytes(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "paho_mqtt": _version("paho-mqtt"),
        "pyspark": _version("pyspark"),
        "pyarrow": _version("pyarrow"),
        "pykka": _version("pykka"),
        "sqlalchemy": _version("sqlalchemy"),
        "mosquitto": mosquitto_version(),
        "java": java_version(),
        "work_dir_filesystem": _filesystem(work_dir.resolve()),
    }
