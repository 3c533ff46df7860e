"""SeaweedFS with its S3 gateway (built by `make`), for the S3 tables' tests: each started on free
loopback ports with its own data folder, ended by its own PID when the test ends. A test reaches
it the way an operator reaches S3: the AWS variables in the environment
(`SeaweedFSProcess.environment`), for the test's process and the daemons it starts."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from actors.devtools.seaweedfs import SeaweedFSProcess


@pytest.fixture
def seaweedfs_factory(tmp_path_factory, monkeypatch) -> Iterator[Callable[[], SeaweedFSProcess]]:
    """Start SeaweedFS stores on demand; the last one started is the one this process's
    environment points at. Every one is killed when the test ends."""
    started: list[SeaweedFSProcess] = []

    def make() -> SeaweedFSProcess:
        store = SeaweedFSProcess(tmp_path_factory.mktemp("seaweedfs"))
        started.append(store)
        store.start()
        for name, value in store.environment().items():
            monkeypatch.setenv(name, value)
        return store

    yield make
    for store in started:
        store.kill()


@pytest.fixture
def seaweedfs(seaweedfs_factory) -> SeaweedFSProcess:
    return seaweedfs_factory()


# The object stores the tables' tests run on: Azure (Azurite) and S3 (SeaweedFS).
STORES = ("azurite", "seaweedfs")


@pytest.fixture(params=STORES)
def object_store_process(request):
    """Each object store in turn (a test taking it runs once on each), started as its own
    fixture; both have `kind`, `create_root`, `stop`, `start` and `environment`."""
    return request.getfixturevalue(request.param)
