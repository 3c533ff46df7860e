"""Azurite, the Azure Storage emulator (installed by `make`), for the object-store tables' tests
(tests/harness/object_stores.py): reached the way an operator reaches Azure, the storage account
variables in the environment (`AzuriteProcess.environment`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from actors.devtools.azurite import AzuriteProcess
from tests.harness.object_stores import started_stores


@pytest.fixture
def azurite_factory(tmp_path_factory, monkeypatch) -> Iterator[Callable[[], AzuriteProcess]]:
    """Start Azurites on demand; the last one started is the one this process's environment
    points at. Every one is killed when the test ends."""
    yield from started_stores(AzuriteProcess, tmp_path_factory, monkeypatch)


@pytest.fixture
def azurite(azurite_factory) -> AzuriteProcess:
    return azurite_factory()
