"""The object stores the tables' tests run on, each a real server started by its fixture on free
loopback ports with its own data folder and ended by its own PID when the test ends: Azurite for
Azure (tests/harness/azurite.py), SeaweedFS for S3 (tests/harness/seaweedfs.py). A test reaches a
store the way an operator reaches the real one: the store's variables in the environment
(`environment()`), for the test's process and the daemons it starts."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

# The object stores the tables' tests run on: Azure (Azurite) and S3 (SeaweedFS).
STORES = ("azurite", "seaweedfs")


def started_stores(kind: Callable, tmp_path_factory, monkeypatch) -> Iterator[Callable]:
    """A fixture's body: start stores of `kind` on demand, this process's environment pointed at
    the last one started; every one killed when the test ends."""
    started = []

    def make():
        store = kind(tmp_path_factory.mktemp(kind.kind))
        started.append(store)
        store.start()
        for name, value in store.environment().items():
            monkeypatch.setenv(name, value)
        return store

    yield make
    for store in started:
        store.kill()


@pytest.fixture(params=STORES)
def object_store_process(request):
    """Each object store in turn (a test taking it runs once on each), started as its own
    fixture; both have `kind`, `create_root`, `stop`, `start` and `environment`."""
    return request.getfixturevalue(request.param)
