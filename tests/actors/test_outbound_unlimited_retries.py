"""`[packs] retries = 0` means unlimited (TBMQ's RETRY_ALL with 0 retries; DESIGN §1).

The outbound ledger forwards through a real upstream ConnectionActor and paho client to the
scripted fake broker (mosquitto never refuses a PUBLISH), on the simulated clock: each
`processing_timeout` is one clock step, so a pack can be refused and left unacknowledged far more
often than the default budget of 3 retries without the test waiting for any of it.
"""

from __future__ import annotations

import pytest

from actors.clock import SimulatedClock
from actors.config.routes import Route
from actors.connection import ConnectionActor
from actors.forward_leg import upstream_client_factory
from actors.ledger import LedgerRecord
from actors.messages import Forwarded, Pack, PackSealed
from actors.mqtt.upstream import IDEMPOTENCY_PROPERTY
from actors.outbound import OutboundLedger
from tests.actors.test_connection import settings
from tests.harness.checks import wait_until
from tests.harness.fake_broker import FakeBroker
from tests.harness.inbox import Inbox

pytestmark = pytest.mark.broker

TIMEOUT = 20.0
QUOTA_EXCEEDED = 0x97
READ = b'{"type":"SIMPLE","data":{"idHex":"e28011"}}'


def forwarded(messages: list) -> list[Forwarded]:
    return [m for m in messages if isinstance(m, Forwarded)]


@pytest.fixture
def upstream(tmp_path):
    """An OutboundLedger and its upstream connection to a fake broker, on a simulated clock."""
    started = []

    def start(fake: FakeBroker, retries: int):
        clock = SimulatedClock()
        ledger = Inbox()
        outbound = OutboundLedger.start(
            tmp_path / "outbound.sqlite",
            clock,
            ledger,
            (Route(0, "zebra/fx/+/reads", "cloud/{topic}", qos=1),),
            "env",
            processing_timeout=TIMEOUT,
            ack_strategy="RETRY_ALL",
            retries=retries,
        )
        started.append(outbound)
        connection = ConnectionActor.start(
            settings(fake, name="upstream", client_id="up-env-gw1", subscriptions=()),
            clock,
            outbound,
            client_factory=upstream_client_factory(outbound),
        )
        started.append(connection)
        assert fake.wait_for(lambda f: f.clients, 15)
        record = LedgerRecord(1, "k1", "zebra/fx/fx9600-01/reads", READ, 1, 0.0, 0)
        outbound.tell(PackSealed(Pack(0, (record,))))
        return outbound.proxy(), clock, ledger

    yield start
    for ref in reversed(started):
        if ref.is_alive():
            ref.stop(timeout=10)


def wait_received(fake: FakeBroker, count: int) -> None:
    assert fake.wait_for(lambda f: len(f.received) >= count, 15), fake.received


def wait_refused(outbound, count: int) -> None:
    """Until the outbound ledger has taken `count` refusals (only its answer can show it)."""
    assert wait_until(lambda: outbound.status().get(timeout=5)["failed_acks"] >= count)


def next_timeout(clock: SimulatedClock) -> None:
    assert clock.wait_for_timers(1)
    clock.advance(TIMEOUT)


def test_with_unlimited_retries_a_pack_refused_and_unanswered_past_three_tries_is_delivered(
    upstream,
):
    with FakeBroker() as fake:
        fake.reply_publish([QUOTA_EXCEEDED] * 4)
        outbound, clock, ledger = upstream(fake, retries=0)
        # Four refusals (PUBACK 0x97), each retried at the pack's timeout with a new packet id.
        for refusal in range(1, 5):
            wait_received(fake, refusal)
            wait_refused(outbound, refusal)
            if refusal == 4:
                fake.hold_acks()  # from the fifth send on, the broker answers nothing
            next_timeout(clock)
        # Two timeouts without an answer: the one in flight is not sent again on the live
        # connection (MQTT 5 §4.4; HiveMQ CE counts a copy until the connection ends).
        wait_received(fake, 5)
        next_timeout(clock)
        next_timeout(clock)
        status = outbound.status().get(timeout=5)
        # Six retries, twice the default budget: nothing is given up on, nothing is reported.
        assert (status["retries"], status["dead"], forwarded(ledger.messages)) == (6, 0, [])

        fake.release_acks()  # the broker accepts at last
        ledger.wait_for(lambda m: len(forwarded(m)) == 1)
        (report,) = forwarded(ledger.messages)
        assert (report.done, report.dead) == ((1,), ())
        assert outbound.status().get(timeout=5)["dead"] == 0

    sent = fake.received
    assert [r.payload for r in sent] == [READ] * 5
    assert len({dict(r.user_properties)[IDEMPOTENCY_PROPERTY] for r in sent}) == 1
    assert [r.dup for r in sent] == [False] * 5


def test_with_three_retries_the_same_refusals_dead_letter_the_message(upstream):
    """The control: the script above exhausts the default budget, so retries = 0 is what
    keeps the message alive there."""
    with FakeBroker() as fake:
        fake.reply_publish([QUOTA_EXCEEDED] * 4)
        outbound, clock, ledger = upstream(fake, retries=3)
        for refusal in range(1, 5):
            wait_received(fake, refusal)
            wait_refused(outbound, refusal)
            next_timeout(clock)
        ledger.wait_for(lambda m: len(forwarded(m)) == 1)
        (report,) = forwarded(ledger.messages)
        assert (report.done, report.dead) == ((), ((1, "forward_failed"),))
        assert len(fake.received) == 4
