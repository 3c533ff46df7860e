"""The messages the actors exchange, in one module that imports nothing above it.

Each is an immutable value told (or asked) from one actor to another; an actor's own timer and
retry messages stay private in its module. Grouped by the actor that receives them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from persistence.records import LedgerRecord, ReaderCount

if TYPE_CHECKING:
    import pykka

    from actors.mqtt.client import InboundPublish, InboundPubrel
    from actors.mqtt.upstream import OutboundAck, OutboundPublish


# -- connections -> their listener (the ledger, the outbound ledger) ---------------------------


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """Told to the listener at each CONNACK. Without a session present the broker has forgotten
    every packet id of ours; `receive_maximum` is how many QoS 1/2 messages it takes in flight."""

    epoch: int
    session_present: bool
    receive_maximum: int = 65535


@dataclass(frozen=True, slots=True)
class SessionEnded:
    """Told to the listener when the connection of `epoch` is gone."""

    epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class Publish:
    """A message of the gateway's own (a life-cycle event) to publish on this connection."""

    topic: str
    payload: bytes
    qos: int


@dataclass(frozen=True, slots=True)
class Inbound:
    """A packet from the source connection, with the way back for its acknowledgement."""

    packet: InboundPublish | InboundPubrel
    acks: object  # actors.mqtt.client.AckSender


@dataclass(frozen=True, slots=True)
class InboundBurst:
    """Packets of the source connection handed over together, in the order they came (up to
    HAND_OVER_PACKETS of a read burst in one actor message: actors.mqtt.client), with the way
    back for their acknowledgements. `over`: the read burst ended with the socket empty (the
    packets may be none then: the burst's last hand-over took them all)."""

    packets: tuple[InboundPublish | InboundPubrel, ...]
    acks: object  # actors.mqtt.client.AckSender
    over: bool = False

    def __iter__(self) -> Iterator[Inbound]:
        return (Inbound(packet, self.acks) for packet in self.packets)


@dataclass(frozen=True, slots=True)
class OutboundAcks:
    """The PUBACK / PUBREC / PUBCOMP one hand-over of the upstream connection brought, in
    order (one actor message for them all: actors.mqtt.client)."""

    acks: tuple[OutboundAck, ...]


# -- the ledgers -> the connection that owns the paho client (actors.mqtt.relay) ------------


@dataclass(frozen=True, slots=True)
class SendPublishes:
    """PUBLISHes whose state is committed, for the connection of `epoch`."""

    epoch: int
    messages: tuple[OutboundPublish, ...]


@dataclass(frozen=True, slots=True)
class SendPubrels:
    """PUBRELs whose `pubrel` state is committed, for the connection of `epoch`."""

    epoch: int
    packet_ids: tuple[int, ...]


# -- the inbound ledger and its sinks ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Committed:
    """Told to a sink's feed target: rows it owes, in arrival order."""

    records: tuple[LedgerRecord, ...]


@dataclass(frozen=True)
class Recovery:
    """What a previous run left unfinished: batches begun but not committed (replay them as they
    were), the number of committed rows each sink still owes (the ledger hands them on again,
    from the database, as each sink grants credit), and the readers' counters."""

    open_batches: tuple[tuple[int, tuple[LedgerRecord, ...]], ...]
    loose: int
    next_pack_id: int
    readers: Mapping[str, ReaderCount] = field(default_factory=dict)
    # Each reader's health state (spark.reader_health), as of the last committed batch.
    reader_health: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Forwarded:
    """From the upstream side, after it committed its own progress: these messages are done
    for the upstream — `done` acknowledged (or wanted by no route), `dead` given up on, with the
    reason. `reply_to` (the outbound ledger) is told `ForwardRecorded` once this is committed."""

    done: tuple[int, ...]
    dead: tuple[tuple[int, str], ...] = ()
    reply_to: pykka.ActorRef | None = None


@dataclass(frozen=True, slots=True)
class ForwardRecorded:
    """To the outbound ledger: the ledger has committed these seqs as done upstream."""

    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TakeReplays:
    """Replay requests wait in this data directory (persistence.replay)."""

    data_dir: Path


@dataclass(frozen=True, slots=True)
class StoreLocal:
    """A message made by the gateway itself (a life-cycle event): stored like an inbound one,
    so it is packed, forwarded and landed exactly-once like reads, with no broker to ack."""

    topic: str
    payload: bytes
    qos: int = 1


# -- a sink -> the inbound ledger --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Grant:
    """From a sink to the ledger: it takes up to `limit` records and `limit_bytes` payload bytes
    in all, counted since its feed began (a window, actors.feed)."""

    sink: str
    limit: int
    limit_bytes: int


# -- packs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pack:
    pack_id: int
    records: tuple[LedgerRecord, ...]

    @property
    def seqs(self) -> tuple[int, ...]:
        return tuple(r.seq for r in self.records)


@dataclass(frozen=True, slots=True)
class PackSealed:
    pack: Pack


# -- the outbound ledger -> tier 2 -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Demand:
    """From the OutboundLedger: it can take one more pack."""


# -- the Spark writer --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayBatch:
    """A batch begun and not committed: write it again, same id, same rows (after a crash, or
    when a write failed). `credited`: its rows came through the feed, so writing it gives the
    ledger their credit back (a batch recovered at start did not)."""

    batch_id: int
    records: tuple[LedgerRecord, ...]
    credited: bool = False


@dataclass(frozen=True)
class WriterHealth:
    """How the writer fares, for status and /healthz: `failures` counts the failed attempts in
    a row (0 = writing), times are wall-clock seconds."""

    failures: int = 0
    total_failures: int = 0
    last_error: str | None = None
    last_failure_time: float | None = None
    failing_since: float | None = None
    next_retry_time: float | None = None
    waiting_batch: int | None = None  # the batch that waits for the retry, if it was begun


@dataclass(frozen=True)
class CompactionReport:
    """How the writer's table maintenance fares (OPTIMIZE, VACUUM), for status and /metrics
    (times: wall-clock seconds). `last_outcome`: "compacted" (the pass ran, whatever it found
    to do), "failed", or "skipped" (not run now: a batch waited to be written)."""

    passes: int = 0
    failed_passes: int = 0
    files_compacted: int = 0  # small files OPTIMIZE replaced, over every pass of this run
    files_vacuumed: int = 0  # files VACUUM deleted, over every pass of this run
    # In a shared group: OPTIMIZEs skipped because another member's commit came first.
    optimizes_lost: int = 0
    last_outcome: str | None = None
    last_reason: str | None = None  # scheduled, or requested by fxgate compact
    last_time: float | None = None
    last_seconds: float | None = None
    last_summary: str | None = None  # the pass's own summary, or the error
    next_pass_time: float | None = None


@dataclass(frozen=True)
class BatchWritten:
    batch_id: int
    messages: int
    rows: int
    dead_letters: int
    seconds: float
    events: int = 0  # life-cycle events landed in the `events` table
    # The event-number counters of the readers this batch had reads of, after it (spark.gaps).
    readers: tuple[ReaderCount, ...] = ()
    reader_events: int = 0  # management events landed in the `reader_events` table
    # The health states of the readers this batch had messages of, after it.
    reader_health: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    # Its dead letters as (sink, reason, count): what /metrics counts per reason (plain tuples,
    # so the status snapshot that carries the last batch stays JSON).
    dead_letter_reasons: tuple[tuple[str, str, int], ...] = ()
    # In a shared group's tables (spark.tables.GroupTableWriter): the batch's rows another
    # member had landed first (the merge skipped them), and its merges that lost a commit race
    # and were merged again.
    already_landed: int = 0
    merges_retried: int = 0


# -- connections -> the life-cycle actor -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """One configured connection as the life-cycle events describe it (no secrets)."""

    name: str  # source | upstream
    client_id: str
    authentication_name: str  # the username, or the client id when anonymous
    host: str
    port: int
    fingerprint: str  # changes whenever the connection's configuration does


@dataclass(frozen=True, slots=True)
class ClientsConfigured:
    """Told once at start with every configured connection."""

    clients: tuple[ClientInfo, ...]


@dataclass(frozen=True, slots=True)
class SessionConnected:
    client_id: str
    session_name: str
    epoch: int


@dataclass(frozen=True, slots=True)
class SessionDisconnected:
    client_id: str
    session_name: str
    epoch: int
    reason: str  # one of Event Grid's disconnection reasons, mapped by the caller
