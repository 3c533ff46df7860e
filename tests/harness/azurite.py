"""Azurite, the Azure Storage emulator (installed by `make`), for the object-store tables' tests:
each started on a free loopback port with its own data folder, ended by its own PID when the test
ends. A test reaches it the way an operator reaches Azure: the storage account variables in the
environment (`AzuriteProcess.environment`), for the test's process and the daemons it starts."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from actors.devtools.azurite import AzuriteProcess


@pytest.fixture
def azurite_factory(tmp_path_factory, monkeypatch) -> Iterator[Callable[[], AzuriteProcess]]:
    """Start Azurites on demand; the last one started is the one this process's environment
    points at. Every one is killed when the test ends."""
    started: list[AzuriteProcess] = []

    def make() -> AzuriteProcess:
        emulator = AzuriteProcess(tmp_path_factory.mktemp("azurite"))
        started.append(emulator)
        emulator.start()
        for name, value in emulator.environment().items():
            monkeypatch.setenv(name, value)
        return emulator

    yield make
    for emulator in started:
        emulator.kill()


@pytest.fixture
def azurite(azurite_factory) -> AzuriteProcess:
    return azurite_factory()
