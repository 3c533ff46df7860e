"""PackActor: groups committed inbound messages into packs of at most `max_messages`.

A pack is sealed when it is full or when its first message has waited `linger` seconds on the
clock, so a trickle of reads still reaches the table promptly. Sealed packs go to the Spark writer
in arrival order, which keeps per-reader order into the table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import pykka

from actors.clock import Clock, TimerHandle
from actors.ledger import LedgerRecord
from actors.messages import Committed, Pack, PackSealed
from actors.tell import tell_unless_dead

log = logging.getLogger(__name__)


class PackAssembler:
    """Pure pack assembly: fill, seal when full, seal the rest on demand."""

    def __init__(self, max_messages: int, next_pack_id: int = 1) -> None:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        self.max_messages = max_messages
        self.next_pack_id = next_pack_id
        self._open: list[LedgerRecord] = []

    def __len__(self) -> int:
        return len(self._open)

    def add(self, records: Iterable[LedgerRecord]) -> list[Pack]:
        sealed = []
        for record in records:
            self._open.append(record)
            if len(self._open) >= self.max_messages:
                sealed.append(self._seal())
        return sealed

    def seal(self) -> Pack | None:
        return self._seal() if self._open else None

    def _seal(self) -> Pack:
        pack_id, self.next_pack_id = self.next_pack_id, self.next_pack_id + 1
        records = tuple(r.in_pack(pack_id) for r in self._open)
        self._open = []
        return Pack(pack_id, records)


@dataclass(frozen=True, slots=True)
class _LingerExpired:
    generation: int


class PackActor(pykka.ThreadingActor):
    def __init__(
        self,
        writer: pykka.ActorRef,
        clock: Clock,
        *,
        max_messages: int = 200,
        linger_seconds: float = 1.0,
        next_pack_id: int = 1,
    ) -> None:
        super().__init__()
        self._writer = writer
        self._clock = clock
        self._linger = linger_seconds
        self._assembler = PackAssembler(max_messages, next_pack_id)
        self._timer: TimerHandle | None = None
        self._generation = 0
        self.sealed = 0

    def on_receive(self, message: object) -> None:
        if isinstance(message, Committed):
            sealed = self._assembler.add(message.records)
            for pack in sealed:
                self._send(pack)
            if sealed:
                # The open pack, if any, is a new one: its linger starts now.
                self._cancel_linger()
            self._arm_linger()
        elif isinstance(message, _LingerExpired):
            if message.generation == self._generation:
                self._timer = None
                pack = self._assembler.seal()
                if pack is not None:
                    self._send(pack)
        else:
            log.warning("pack actor ignored %r", message)

    def on_stop(self) -> None:
        self._cancel_linger()
        pack = self._assembler.seal()
        if pack is not None:
            self._send(pack)

    def _send(self, pack: Pack) -> None:
        self.sealed += 1
        self._writer.tell(PackSealed(pack))

    def _arm_linger(self) -> None:
        """A linger timer runs exactly while the open pack holds something."""
        if not len(self._assembler):
            self._cancel_linger()
        elif self._timer is None:
            self._generation += 1
            generation = self._generation
            self._timer = self._clock.call_later(self._linger, lambda: self._expire(generation))

    def _cancel_linger(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._generation += 1

    def _expire(self, generation: int) -> None:
        tell_unless_dead(self.actor_ref, _LingerExpired(generation))
