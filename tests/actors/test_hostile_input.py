"""10,000 generated hostile messages through the running daemon and a real mosquitto: the daemon
stays up, no actor restarts, and every message ends exactly once as its rows or one dead letter
with the reason it deserves (DESIGN §3.6)."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from persistence.keys import message_key
from spark.tables import DEAD_LETTERS, READS, read_table_arrow
from spark.topics import safe_reader_id
from tests.harness.mqtt import publish_all

pytestmark = [pytest.mark.broker, pytest.mark.spark]

MESSAGES = 10_000
MAX_PAYLOAD_BYTES = 4096
MAX_READS = 50

# Reader levels under the subscribed filter zebra/fx/+/reads. mosquitto 2.0.11 refuses (and
# disconnects the publisher for) control characters and Unicode non-characters in a topic, so
# NUL, controls and invalid UTF-8 topics are covered below the broker (tests/spark).
READERS = [f"fx9600-{n:02d}" for n in range(1, 5)] + [
    "..",
    ".",
    "_temporary",
    ".hidden",
    "a b",
    "é漢😀",
    "%2F",
    "date=2000-01-01",
    "x" * 300,
    "\ufeff",
    "$x",
    "",
    "\ufffd",
    "~",
]


@dataclass(frozen=True)
class Sent:
    topic: str
    payload: bytes
    outcome: str  # "rows", or the dead-letter reason it must get
    reads: int = 0

    @property
    def key(self) -> str:
        return message_key(self.topic, self.payload)


def tag_event(n: int, **data) -> dict:
    return {
        "data": {"idHex": f"e280{n:020x}", "antenna": 1 + n % 4, "eventNum": n, **data},
        "timestamp": f"2026-11-21T10:{n // 60000 % 60:02d}:{n // 1000 % 60:02d}.{n % 1000:03d}Z",
        "type": "SIMPLE",
    }


def encode(doc: object) -> bytes:
    return json.dumps(doc).encode()


def one_message(n: int, rng: random.Random) -> tuple[bytes, str, int]:
    """(payload, outcome, reads) of message `n`; every payload holds `n`, so none repeats."""
    kind = rng.choices(
        [
            "single",
            "batch",
            "invalid_json",
            "invalid_utf8",
            "oversized",
            "nested_too_deep",
            "too_many_reads",
            "wrong_type",
            "bad_epc",
            "missing_field",
            "bad_timestamp",
            "not_a_tag_event",
            "empty_array",
        ],
        weights=[30, 10, 6, 6, 3, 4, 3, 10, 5, 5, 5, 4, 1],
    )[0]
    if kind == "single":
        return encode(tag_event(n)), "rows", 1
    if kind == "batch":
        count = rng.randint(2, 5)
        return encode([tag_event(n * 10 + i) for i in range(count)]), "rows", count
    if kind == "invalid_json":
        return encode(tag_event(n))[: rng.randint(1, 40)] + b"%d" % n, kind, 0
    if kind == "invalid_utf8":
        return b'{"n": "%d\xff\xfe"}' % n, kind, 0
    if kind == "oversized":
        return encode(tag_event(n, pad="p" * MAX_PAYLOAD_BYTES)), kind, 0
    if kind == "nested_too_deep":
        depth = rng.randint(600, 2000)  # within MAX_PAYLOAD_BYTES, past spark.zebra.MAX_NESTING
        return b"[" * depth + b"%d" % n + b"]" * depth, kind, 0
    if kind == "too_many_reads":
        return b'[{"n": %d}' % n + b", {}" * MAX_READS + b"]", kind, 0
    if kind == "wrong_type":
        field, value = rng.choice(
            [
                ("antenna", "1"),
                ("eventNum", 1.5),
                ("peakRssi", "x"),
                ("idHex", 7),
                ("antenna", True),
            ]
        )
        doc = tag_event(n)
        doc["data"][field] = value
        doc["n"] = n
        return encode(doc), kind, 0
    if kind == "bad_epc":
        return encode(tag_event(n, idHex=f"zz{n}")), kind, 0
    if kind == "missing_field":
        doc = tag_event(n)
        del doc["timestamp"]
        return encode(doc), kind, 0
    if kind == "bad_timestamp":
        doc = tag_event(n)
        doc["timestamp"] = rng.choice([f"yesterday {n}", f"{1000 + n % 800}-01-01T00:00:00Z"])
        return encode(doc), kind, 0
    if kind == "not_a_tag_event":
        return encode(rng.choice([n, f"read {n}", {"n": n}, [n]])), kind, 0
    # empty_array: `n` written in JSON whitespace, base 4, keeps each one distinct and short.
    spaces = ""
    while True:
        n, digit = divmod(n, 4)
        spaces += " \t\n\r"[digit]
        if not n:
            break
    return b"[" + spaces.encode() + b"]", kind, 0


def generate(count: int, seed: int) -> list[Sent]:
    rng = random.Random(seed)
    sent = []
    for n in range(count):
        payload, outcome, reads = one_message(n, rng)
        reader = READERS[n % 4] if rng.random() < 0.6 else rng.choice(READERS)
        sent.append(Sent(f"zebra/fx/{reader}/reads", payload, outcome, reads))
    assert len({s.key for s in sent}) == count, "every message must have its own key"
    return sent


def landed(tables: Path) -> tuple[list[dict], list[dict]]:
    reads = read_table_arrow(tables, READS)
    reads = reads.select(["message_id", "topic", "reader_id"]).to_pylist() if reads.num_rows else []
    dead = read_table_arrow(tables, DEAD_LETTERS)
    dead = dead.select(["message_key", "reason"]).to_pylist() if dead.num_rows else []
    return reads, dead


def accounted(reads: list[dict], dead: list[dict]) -> int:
    return len({r["message_id"].split(":")[0] for r in reads} | {d["message_key"] for d in dead})


def wait_until_accounted(daemon, tables: Path, count: int, timeout: float) -> None:
    """Wait, on the daemon's 'batch written' lines, until `count` messages are in the tables."""
    daemon.wait_for_batches(
        lambda: accounted(*landed(tables)) >= count,
        lambda: f"{accounted(*landed(tables))} of {count} messages landed",
        timeout,
    )


def test_the_generated_messages_cover_every_outcome_once_per_key():
    sent = generate(MESSAGES, seed=7)
    outcomes = Counter(s.outcome for s in sent)
    assert set(outcomes) == {
        "rows",
        "invalid_json",
        "invalid_utf8",
        "oversized",
        "nested_too_deep",
        "too_many_reads",
        "wrong_type",
        "bad_epc",
        "missing_field",
        "bad_timestamp",
        "not_a_tag_event",
        "empty_array",
    }
    assert {s.topic for s in sent} == {f"zebra/fx/{r}/reads" for r in READERS}


def test_ten_thousand_hostile_messages_land_once_each_as_rows_or_dead_letters(
    mosquitto, daemon_factory, tmp_path
):
    sent = generate(MESSAGES, seed=7)
    data = tmp_path / "data"
    daemon = daemon_factory(
        {
            "FXGATE__SOURCE__PORT": str(mosquitto.port),
            "FXGATE__GATEWAY__DATA_DIR": str(data),
            "FXGATE__PACKS__LINGER_SECONDS": "0.2",
            "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
            "FXGATE__SPARK__MAX_PAYLOAD_BYTES": str(MAX_PAYLOAD_BYTES),
            "FXGATE__SPARK__MAX_READS_PER_MESSAGE": str(MAX_READS),
        }
    )
    daemon.wait_for_log(r"source: subscribed", timeout=90)

    acked = publish_all(
        mosquitto.host,
        mosquitto.port,
        [(s.topic, s.payload) for s in sent],
        qos=1,
        client_id="hostile-publisher",
        timeout=120,
    )
    assert acked == MESSAGES
    wait_until_accounted(daemon, data / "tables", MESSAGES, timeout=150)

    assert daemon.proc.poll() is None, "the daemon died"
    assert daemon.count_logs(r"restarting all actors") == 0, daemon.output()[-5000:]
    assert daemon.count_logs(r"parser failed|Traceback") == 0, daemon.output()[-5000:]
    assert daemon.terminate() == 0

    reads, dead = landed(data / "tables")
    ids = Counter(r["message_id"] for r in reads)
    assert [i for i, n in ids.items() if n > 1] == []
    rows_per_key = Counter(i.split(":")[0] for i in ids)
    dead_per_key = Counter(d["message_key"] for d in dead)
    assert [k for k, n in dead_per_key.items() if n > 1] == []
    reasons = {d["message_key"]: d["reason"] for d in dead}

    by_key = {s.key: s for s in sent}
    assert set(rows_per_key) | set(dead_per_key) == set(by_key)
    assert set(rows_per_key) & set(dead_per_key) == set()
    wrong = [
        (s.topic[:40], s.outcome, rows_per_key.get(s.key, 0), reasons.get(s.key))
        for s in sent
        if (s.outcome == "rows" and (rows_per_key[s.key] != s.reads or s.key in reasons))
        or (s.outcome != "rows" and reasons.get(s.key) != s.outcome)
    ]
    assert wrong == []
    assert len(reads) == sum(s.reads for s in sent)
    assert len(reads) + len(dead) > MESSAGES  # batched messages gave several rows

    for row in reads:
        sent_message = by_key[row["message_id"].split(":")[0]]
        assert row["topic"] == sent_message.topic
        assert row["reader_id"] == safe_reader_id(sent_message.topic.split("/")[2] or row["topic"])


def test_a_topic_that_is_not_utf8_is_acked_and_lands_as_an_invalid_topic_dead_letter(
    spark_session, tmp_path
):
    """mosquitto refuses such a PUBLISH; a broker that does not (the scripted fake here) must
    not get it into `reads` or upstream: it is stored, acked, and dead-lettered."""
    from actors.clock import RealClock
    from actors.config.schema import load_config
    from actors.supervisor import Supervisor
    from spark.schema import DEAD_LETTERS_SCHEMA, READS_SCHEMA
    from tests.harness.fake_broker import FakeBroker

    good = json.dumps(
        {
            "data": {"idHex": "e2801160600002054c5a0b01", "antenna": 1, "peakRssi": -60},
            "timestamp": "2026-11-21T12:00:00.000+0000",
            "type": "SIMPLE",
        }
    ).encode()
    with FakeBroker() as broker:
        config = load_config(
            None,
            environ={
                "FXGATE__SOURCE__PORT": str(broker.port),
                "FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data"),
                "FXGATE__PACKS__LINGER_SECONDS": "0.2",
                "FXGATE__SPARK__BATCH_MAX_SECONDS": "0.5",
            },
            hostname="gw-test",
        )
        clock = RealClock()
        supervisor = Supervisor(config, clock, session_factory=lambda: spark_session)
        supervisor.start()
        try:
            assert broker.wait_for(lambda b: b.subscribes, timeout=30)
            broker.publish_to_clients(b"zebra/fx/fx\xff9600/reads", good, qos=1)
            broker.publish_to_clients("zebra/fx/fx9600-01/reads", good, qos=1)
            assert supervisor.wait_for_landed(1, dead_letters=1, timeout=120)
            assert broker.wait_for(
                lambda b: len([a for a in b.client_acks if a[1] == "PUBACK"]) == 2, timeout=30
            )
        finally:
            supervisor.stop()
            clock.close()
    tables = config.tables_path
    dead = read_table_arrow(tables, DEAD_LETTERS, DEAD_LETTERS_SCHEMA).to_pylist()
    assert [(d["reason"], d["topic"]) for d in dead] == [
        ("invalid_topic", "zebra/fx/fx\ufffd9600/reads")
    ]
    reads = read_table_arrow(tables, READS, READS_SCHEMA).to_pylist()
    assert [r["topic"] for r in reads] == ["zebra/fx/fx9600-01/reads"]
