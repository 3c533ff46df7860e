"""Real mosquitto brokers for tests, each on a free loopback port with its own config and data."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from actors.devtools.mosquitto import MosquittoProcess


@pytest.fixture
def mosquitto_factory(tmp_path_factory) -> Iterator[Callable[..., MosquittoProcess]]:
    """Start brokers on demand; every one is ended (by its own PID) when the test ends."""
    started: list[MosquittoProcess] = []

    def make(**config_options) -> MosquittoProcess:
        broker = MosquittoProcess(tmp_path_factory.mktemp("mosquitto"), **config_options)
        started.append(broker)
        broker.start()
        return broker

    yield make
    for broker in started:
        broker.kill()


@pytest.fixture
def mosquitto(mosquitto_factory) -> MosquittoProcess:
    return mosquitto_factory()
