"""SeaweedFS with its S3 gateway (built by `make`), for the S3 tables' tests
(tests/harness/object_stores.py): reached the way an operator reaches S3, the AWS variables in
the environment (`SeaweedFSProcess.environment`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from actors.devtools.seaweedfs import SeaweedFSProcess
from tests.harness.object_stores import started_stores


@pytest.fixture
def seaweedfs_factory(tmp_path_factory, monkeypatch) -> Iterator[Callable[[], SeaweedFSProcess]]:
    """Start SeaweedFS stores on demand; the last one started is the one this process's
    environment points at. Every one is killed when the test ends."""
    yield from started_stores(SeaweedFSProcess, tmp_path_factory, monkeypatch)


@pytest.fixture
def seaweedfs(seaweedfs_factory) -> SeaweedFSProcess:
    return seaweedfs_factory()
