"""The source side through EMQX's live re-send: each read lands once and every packet is answered.

EMQX re-sends an unacknowledged QoS 1/2 PUBLISH, and a PUBREL, on the *live* connection every
`retry_interval` (30 s) with DUP set (DESIGN §4, other brokers); mosquitto re-sends only after a
reconnect, so the scripted fake broker plays EMQX here. The inbound ledger and the real
LedgerClient (through the source ConnectionActor) answer it: a re-sent PUBLISH gets its own
PUBACK/PUBREC (MQTT 5 §4.3.2, §4.3.3: the receiver acknowledges every PUBLISH it gets, and a QoS 2
one awaiting PUBREL is not delivered again), the message lands once (its idempotency key,
DESIGN §1), and a PUBREL re-sent for an id already released gets PUBCOMP (§4.3.3).

"Before fxgate's ack went out" is a state the test makes, not a race: the fake writes the
original and its re-send in one write (`one_write`), so the client reads them in one burst and
the ledger takes both before it commits and answers (a group commits when the burst is over).
"After" waits for the ack on the wire before the re-send goes.
"""

import logging
import sqlite3

import pytest

from actors.clock import SimulatedClock
from actors.ledger import RELEASE_DELAY, InboundLedger
from persistence.keys import message_key
from tests.actors.test_connection import settings
from tests.actors.test_ledger import listen
from tests.harness.checks import wait_until
from tests.harness.fake_broker import FakeBroker

TOPIC = "zebra/fx/fx9600-01/reads"
TIMEOUT = 15.0


class Source:
    """The fake EMQX, the inbound ledger on a simulated clock, and its table feed."""

    def __init__(self, fake, ledger, clock, table, db_path):
        self.fake = fake
        self.ledger = ledger
        self.clock = clock
        self.table = table
        self.db_path = db_path
        (self.client_id,) = fake.clients

    def publish(self, payload, qos, packet_id, dup=False):
        sent = self.fake.publish_to_clients(TOPIC, payload, qos, packet_id=packet_id, dup=dup)
        assert sent == [(self.client_id, packet_id)]

    def pubrel(self, packet_id):
        assert self.fake.pubrel_to_clients(packet_id) == [self.client_id]

    def stats(self):
        return self.ledger.proxy().stats().get(timeout=5)

    def wait_stats(self, **expected):
        """Until the ledger's counters say the packets sent so far reached it."""
        assert wait_until(
            lambda: all(self.stats()[name] == value for name, value in expected.items()),
            TIMEOUT,
        ), (expected, self.stats())

    def acks(self, count):
        """The first `count` acks the client sent, (kind, packet id, reason code)."""
        assert self.fake.wait_for(lambda f: len(f.client_acks) >= count, TIMEOUT), (
            self.fake.client_acks
        )
        return [ack[1:] for ack in self.fake.client_acks[:count]]

    def record_releases(self):
        """Let the ledger's release timer fire: PUBCOMP went without a commit (actors.ledger)."""
        assert self.clock.wait_for_timers(1)
        self.clock.advance(RELEASE_DELAY)
        assert wait_until(lambda: self.stats()["releases_unrecorded"] == 0, TIMEOUT)

    def rows(self):
        with sqlite3.connect(self.db_path) as conn:
            return conn.execute(
                "SELECT message_key, packet_id FROM inbound ORDER BY seq"
            ).fetchall()


@pytest.fixture
def source(tmp_path, actors):
    started = []
    with FakeBroker() as fake:
        # EMQX answers PUBREC with PUBREL; here the test decides when (and how often) it goes.
        fake.auto_pubrel = False
        db_path = tmp_path / "ledger.sqlite"
        # A group commits once the mailbox is empty: no timer on the clock to wait for.
        clock = SimulatedClock()
        ledger = InboundLedger.start(db_path, clock, group_commit_max_delay=0.0)
        started.append(ledger)
        try:
            table = listen(ledger)
            actors(settings(fake), SimulatedClock(), ledger)
            assert fake.wait_for(lambda f: f.subscribes, TIMEOUT)
            yield Source(fake, ledger, clock, table, db_path)
        finally:
            for ref in started:
                if ref.is_alive():
                    ref.stop()


KEY = message_key(TOPIC, b"read-1")


def test_a_qos1_publish_resent_with_dup_before_its_puback_left_is_acked_twice_and_lands_once(
    source,
):
    with source.fake.one_write():  # EMQX's retry right behind the original: no ack between
        source.publish(b"read-1", qos=1, packet_id=5)
        source.publish(b"read-1", qos=1, packet_id=5, dup=True)
    source.wait_stats(accepted=1, duplicates=1)
    assert source.acks(2) == [("PUBACK", 5, 0), ("PUBACK", 5, 0)]
    assert [r.message_key for r in source.table.wait_for(1)] == [KEY]
    assert source.rows() == [(KEY, None)]


def test_a_qos1_publish_resent_with_dup_after_its_puback_left_is_acked_again_and_lands_once(
    source,
):
    source.publish(b"read-1", qos=1, packet_id=5)
    source.wait_stats(accepted=1)
    assert source.acks(1) == [("PUBACK", 5, 0)]

    # EMQX's retry crossed our PUBACK: §4.3.2 makes it a new message to us, the key a duplicate.
    source.publish(b"read-1", qos=1, packet_id=5, dup=True)
    source.wait_stats(duplicates=1)
    assert source.acks(2) == [("PUBACK", 5, 0), ("PUBACK", 5, 0)]
    assert [r.message_key for r in source.table.wait_for(1)] == [KEY]
    assert source.rows() == [(KEY, None)]
    assert source.stats()["accepted"] == 1


def test_a_qos2_publish_and_pubrel_resent_before_fxgates_answers_left_each_get_theirs(source):
    with source.fake.one_write():
        source.publish(b"read-1", qos=2, packet_id=7)
        source.publish(b"read-1", qos=2, packet_id=7, dup=True)
    source.wait_stats(accepted=1, duplicates=1, awaiting_pubrel=1)
    assert source.acks(2) == [("PUBREC", 7, 0), ("PUBREC", 7, 0)]
    assert source.rows() == [(KEY, 7)]  # awaiting PUBREL, durable before the PUBREC left

    with source.fake.one_write():  # EMQX's retry of the PUBREL, before our PUBCOMP went out
        source.pubrel(7)
        source.pubrel(7)
    source.wait_stats(awaiting_pubrel=0, unknown_pubrel=1)
    assert source.acks(4)[2:] == [("PUBCOMP", 7, 0), ("PUBCOMP", 7, 0)]
    assert [r.message_key for r in source.table.wait_for(1)] == [KEY]
    source.record_releases()
    assert source.rows() == [(KEY, None)]


def test_a_qos2_publish_and_pubrel_resent_after_fxgates_answers_left_each_get_theirs(
    source, caplog
):
    source.publish(b"read-1", qos=2, packet_id=7)
    source.wait_stats(accepted=1)
    assert source.acks(1) == [("PUBREC", 7, 0)]

    # The retry crossed our PUBREC: still awaiting PUBREL, so PUBREC again and no new message
    # (§4.3.3: not delivered again until the PUBREL).
    source.publish(b"read-1", qos=2, packet_id=7, dup=True)
    source.wait_stats(duplicates=1)
    assert source.acks(2)[1:] == [("PUBREC", 7, 0)]
    assert source.rows() == [(KEY, 7)]

    source.pubrel(7)
    source.wait_stats(awaiting_pubrel=0)
    assert source.acks(3)[2:] == [("PUBCOMP", 7, 0)]

    # The PUBREL's retry crossed our PUBCOMP: the id is released, and is completed again,
    # without the warning of a PUBREL the ledger never stored.
    with caplog.at_level(logging.DEBUG, logger="actors.ledger"):
        source.pubrel(7)
        source.wait_stats(unknown_pubrel=1)
    assert "PUBREL again for packet id 7, released already" in caplog.text
    assert "never stored" not in caplog.text
    assert source.acks(4)[3:] == [("PUBCOMP", 7, 0)]
    assert [r.message_key for r in source.table.wait_for(1)] == [KEY]
    assert len(source.table.records) == 1
    source.record_releases()
    assert source.rows() == [(KEY, None)]
    assert source.stats()["accepted"] == 1
