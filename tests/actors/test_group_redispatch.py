"""EMQX 5's re-dispatch at a member's session expiry, with two gateways of one shared group.

EMQX 5 keeps the share of a shared group's member that is down queued for its session, and when
that session expires gives the member's QoS 1 messages in flight (sent, not acknowledged) and its
queued ones to the other members (DESIGN §4, "Shared subscriptions when a member dies"). The
member that died had journaled the ones in flight, and lands them from its journal when it comes
back: the broker handed those reads to two members, and only the group's one table (DESIGN
§7.12) can keep each read once. The control runs the same script with each member landing into
a table of its own, and finds every re-dispatched read in flight landed twice across them: the
script really gives a read to both members, and the group table is what removes the copy.

No EMQX here: the scripted fake broker (tests/harness/fake_broker.py) plays it, so the script is
deterministic. Every step waits on a log line, the fake's state or the tables, never on a sleep:

1. a1 and a2 (`fxgate run`, environment env-a, group fxgate) connect and subscribe; every read
   message below is a QoS 1 PUBLISH;
2. each gets a read message of its own, as a dispatch would, and lands it (a row of each
   member's `landed_by` in the group table);
3. a1 gets R1 in one write; armed with `after_ledger_commit_before_ack:2`, it journals R1 in one
   group commit (its second with acks) and SIGKILLs itself before any PUBACK leaves;
4. R2 is queued for a1's session (never sent: a1 is dead);
5. a1's session expires: the fake sends R1 and R2 to a2, which lands them;
6. a1 starts again (same data dir, no crash point, no session present) and lands R1 from its
   journal: into the group table, each of R1 is a row a2 landed already.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from actors.devtools.simulate import TagEventGenerator
from persistence.database import open_engine
from persistence.keys import message_key, read_id
from spark.report import compare, landed_ids_arrow
from spark.tables import READS, table_path
from tests.actors.test_several_gateways import member_env, shares
from tests.harness.checks import wait_until, wait_until_landed_union
from tests.harness.daemon import DaemonProcess
from tests.harness.delta_readers import read_once
from tests.harness.fake_broker import FakeBroker

ENVIRONMENT = "env-a"
SHARE = "$share/fxgate-env-a/zebra/fx/+/reads"
A1, A2 = "fxgate-env-a-a1", "fxgate-env-a-a2"
READS_PER_MESSAGE = 3
# a1's first commit with acks is its own message's (step 2); the second, R1's (step 3).
CRASH_AT = "after_ledger_commit_before_ack:2"
START_TIMEOUT = 120.0
LAND_TIMEOUT = 180.0
ALREADY_LANDED = re.compile(
    r"batch \d+, table reads: (\d+) of \d+ row\(s\) already landed by another member"
)


@dataclass(frozen=True)
class Reads:
    """Read messages as an FX9600 sends them, and the `message_id` of every read in them."""

    messages: tuple[tuple[str, bytes], ...]

    @property
    def ids(self) -> set[str]:
        return {
            read_id(message_key(topic, payload), index)
            for topic, payload in self.messages
            for index in range(READS_PER_MESSAGE)
        }

    @property
    def keys(self) -> set[str]:
        """Each message's idempotency key, as the ledger journals it."""
        return {message_key(topic, payload) for topic, payload in self.messages}

    @property
    def payloads(self) -> list[bytes]:
        return [payload for _, payload in self.messages]


def reads(reader: str, count: int) -> Reads:
    events = TagEventGenerator(reader, seed=7)
    topic = f"zebra/fx/{reader}/reads"
    return Reads(tuple((topic, events.next_payload(READS_PER_MESSAGE)) for _ in range(count)))


@dataclass
class Member:
    data: Path
    env: dict[str, str]
    daemon: DaemonProcess | None = None

    @property
    def pair(self) -> tuple[DaemonProcess, Path]:
        assert self.daemon is not None
        return self.daemon, self.data

    def already_landed(self) -> int:
        """Rows this member's merges found landed by another member, by its log lines."""
        assert self.daemon is not None
        return sum(int(n) for n in ALREADY_LANDED.findall(self.daemon.output()))

    def status(self) -> dict:
        """Its `status.json`, which the daemon replaces atomically every second."""
        try:
            return json.loads((self.data / "status.json").read_text())
        except FileNotFoundError:
            return {}


@dataclass
class Outcome:
    a1: Member
    a2: Member
    tables: Path | None  # the group's tables; None: each member's own
    own_a1: Reads  # a1's own share (step 2)
    own_a2: Reads  # a2's
    r1: Reads  # in flight to a1 when it died
    r2: Reads  # queued for a1's session

    @property
    def expected(self) -> set[str]:
        return self.own_a1.ids | self.own_a2.ids | self.r1.ids | self.r2.ids


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    with FakeBroker() as broker:
        yield broker


def publish_once(fake: FakeBroker, client_id: str, batch: Reads) -> None:
    """`batch` to `client_id` alone (its share, as the broker's dispatch chose), in one write:
    the member reads it in one burst, and its ledger commits it in one group."""
    with fake.one_write():
        for topic, payload in batch.messages:
            sent = fake.publish_to_clients(topic, payload, 1, client_id=client_id)
            assert [client for client, _ in sent] == [client_id]


def journaled_keys(data: Path) -> set[str]:
    """The keys of the read messages in a member's ledger (not its own life-cycle events)."""
    engine = open_engine(data / "ledger.sqlite", readonly=True)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT message_key FROM inbound WHERE topic LIKE 'zebra/fx/%/reads'"
            ).fetchall()
    finally:
        engine.dispose()
    return {key for (key,) in rows}


def run_script(fake: FakeBroker, daemon_factory, tmp_path: Path, shared: bool) -> Outcome:
    """Steps 1-6 of the module docstring; returns once every read has landed and both ledgers
    have nothing pending (both daemons still running)."""
    tables = tmp_path / "tables-env-a" if shared else None
    a1, a2 = (
        Member(
            tmp_path / name,
            {
                **member_env(fake, tmp_path / name, ENVIRONMENT, name, tables),
                "FXGATE__SOURCE__HOST": "127.0.0.1",
            },
        )
        for name in ("a1", "a2")
    )
    outcome = Outcome(
        a1,
        a2,
        tables,
        own_a1=reads("fx9600-01", 1),
        own_a2=reads("fx9600-02", 1),
        r1=reads("fx9600-03", 8),
        r2=reads("fx9600-04", 5),
    )

    # 1. Both members connect and subscribe to the group's share.
    a1.daemon = daemon_factory({**a1.env, "FXGATE_CRASH_AT": CRASH_AT})
    a2.daemon = daemon_factory(a2.env)
    for member in (a1, a2):
        member.daemon.wait_for_log(rf"source: subscribed to {re.escape(SHARE)}", START_TIMEOUT)

    # 2. A message of its own to each, landed: the first ack a1 sends is a normal one.
    publish_once(fake, A1, outcome.own_a1)
    publish_once(fake, A2, outcome.own_a2)
    own = len(outcome.own_a1.ids | outcome.own_a2.ids)
    wait_until_landed_union([a1.pair, a2.pair], own, timeout=LAND_TIMEOUT, tables=tables)

    # 3. R1 to a1: journaled, then SIGKILL before its PUBACKs; in flight at the broker.
    a1.daemon.remember_children()  # whatever it spawned (nothing with these settings)
    publish_once(fake, A1, outcome.r1)
    assert a1.daemon.proc.wait(60) == -signal.SIGKILL, a1.daemon.output()
    a1.daemon.wait_for_log(r"crash point after_ledger_commit_before_ack reached", timeout=5)
    # Any child ends with it (its stdin closes); the fixture would reap it otherwise.
    assert wait_until(lambda: a1.daemon.alive_spawned() == [], 30), a1.daemon.alive_spawned()
    assert fake.wait_for(lambda broker: A1 not in broker.clients, 30)
    assert [payload for _, _, payload in fake.in_flight(A1)] == outcome.r1.payloads
    # All of R1 in the one group commit the crash followed (one write, one burst).
    assert journaled_keys(a1.data) == outcome.own_a1.keys | outcome.r1.keys

    # 4. R2 is a1's share while it is down: queued for its session, sent to nobody.
    for topic, payload in outcome.r2.messages:
        fake.queue_for_session(A1, topic, payload, 1)

    # 5. a1's session expires: its QoS 1 in flight, then its queue, go to the other member.
    redispatched = fake.expire_session(A1)
    assert [client for client, _, _ in redispatched] == [A2] * len(redispatched)
    in_flight_then_queued = outcome.r1.payloads + outcome.r2.payloads
    assert [payload for _, _, payload in redispatched] == in_flight_then_queued
    # Into the group table, a2 completes it; into its own, its share, R1 and R2.
    by_a2 = outcome.own_a2.ids | outcome.r1.ids | outcome.r2.ids
    after_expiry = len(outcome.expected if shared else by_a2)
    wait_until_landed_union([a2.pair], after_expiry, timeout=LAND_TIMEOUT, tables=tables)
    assert fake.wait_for(lambda broker: broker.in_flight(A2) == [], 30), fake.in_flight(A2)

    # 6. a1 again, its session gone: it lands R1 from its journal.
    a1.daemon = daemon_factory(a1.env)
    a1.daemon.wait_for_log(rf"as {A1} \(session present: False", START_TIMEOUT)
    landed = len(outcome.expected) if shared else len(outcome.expected) + len(outcome.r1.ids)
    wait_until_landed_union([a1.pair, a2.pair], landed, timeout=LAND_TIMEOUT, tables=tables)
    return outcome


@pytest.mark.timeout(600)
def test_reads_emqx_gives_a_second_member_when_the_first_ones_session_expires_land_once_in_the_group_table(  # noqa: E501
    fake, daemon_factory, tmp_path
):
    outcome = run_script(fake, daemon_factory, tmp_path, shared=True)
    a1, a2, tables = outcome.a1, outcome.a2, outcome.tables
    assert tables is not None

    # Read in this process (delta-rs) and in another (DuckDB's delta extension): each read
    # once, none missing, nothing else.
    here = compare(outcome.expected, landed_ids_arrow(tables)[0])
    assert here.exact, here.lines()
    there = read_once("duckdb", table_path(str(tables), READS), tmp_path / "duckdb-reader")
    elsewhere = compare(outcome.expected, there["keys"])
    assert elsewhere.exact, elsewhere.lines()
    assert there["duplicate_keys"] == []

    # a1 landed its own message; a2 its own, and R1 and R2 first. a1's copy of R1 was skipped.
    assert shares(tables) == {
        A1: len(outcome.own_a1.ids),
        A2: len(outcome.own_a2.ids | outcome.r1.ids | outcome.r2.ids),
    }
    assert a1.already_landed() == len(outcome.r1.ids), a1.daemon.output()
    assert a2.already_landed() == 0, a2.daemon.output()
    assert wait_until(
        lambda: a1.status().get("group", {}).get("already_landed") == len(outcome.r1.ids),
        timeout=30,
    ), a1.status().get("group")

    for member in (a1, a2):
        assert member.daemon.terminate() == 0, member.daemon.output()


@pytest.mark.timeout(600)
def test_reads_emqx_gives_a_second_member_land_twice_across_members_that_each_keep_their_own_table(
    fake, daemon_factory, tmp_path
):
    """The control: the same script, each member landing into `<data>/tables`."""
    outcome = run_script(fake, daemon_factory, tmp_path, shared=False)
    a1, a2 = outcome.a1, outcome.a2

    first = landed_ids_arrow(a1.data / "tables")[0]
    second = landed_ids_arrow(a2.data / "tables")[0]
    # Each table alone holds each of its reads once ...
    assert not compare(set(first), first).duplicates
    assert not compare(set(second), second).duplicates
    # ... and across the two, every read of R1 is there twice: a1 landed its journal, a2 what
    # the broker re-dispatched to it.
    union = compare(outcome.expected, first + second)
    assert not union.missing and not union.unexpected, union.lines()
    assert set(union.duplicates) == outcome.r1.ids
    assert len(first) + len(second) == len(outcome.expected) + len(outcome.r1.ids)
    assert outcome.r1.ids <= set(first) and outcome.r1.ids <= set(second)
    assert a1.already_landed() == 0 and a2.already_landed() == 0

    for member in (a1, a2):
        assert member.daemon.terminate() == 0, member.daemon.output()
