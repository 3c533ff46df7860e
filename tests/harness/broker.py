"""Real brokers for tests, each on a free loopback port with its own config and data folder:
mosquitto (Debian's), HiveMQ CE embedded and Mochi MQTT (both installed by `make`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from actors.devtools.broker_kinds import BROKERS
from actors.devtools.broker_process import BrokerProcess
from actors.devtools.mosquitto import MosquittoProcess


@pytest.fixture
def broker_factory(tmp_path_factory) -> Iterator[Callable[..., BrokerProcess]]:
    """Start brokers of any kind on demand; every one is ended (by its own PID) when the test
    ends."""
    started: list[BrokerProcess] = []

    def make(kind: str, **options) -> BrokerProcess:
        broker = BROKERS[kind](tmp_path_factory.mktemp(kind), **options)
        started.append(broker)
        broker.start()
        return broker

    yield make
    for broker in started:
        broker.kill()


@pytest.fixture
def mosquitto_factory(broker_factory) -> Callable[..., MosquittoProcess]:
    def make(**config_options) -> MosquittoProcess:
        return broker_factory("mosquitto", **config_options)

    return make


@pytest.fixture
def mosquitto(mosquitto_factory) -> MosquittoProcess:
    return mosquitto_factory()
