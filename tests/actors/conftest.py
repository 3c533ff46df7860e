"""Fixtures shared by the actor tests."""

import pytest

from actors.connection import ConnectionActor


@pytest.fixture
def actors():
    """Start ConnectionActors on demand; every one still alive is stopped when the test ends."""
    started = []

    def start(*args, **kwargs):
        ref = ConnectionActor.start(*args, **kwargs)
        started.append(ref)
        return ref

    yield start
    for ref in started:
        if ref.is_alive():
            ref.stop()
