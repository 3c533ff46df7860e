"""Gaps in a reader's `eventNum` counter: the rules the audit and the daemon's counters share.

Every FX9600 tag data event carries the reader's own event counter (`data.eventNum`), one up per
event. A number that never reached the gateway is a lost read — lost before us: a broker that
dropped past its queue limit, a QoS 0 hop, a reader that buffered past its retention (DESIGN §3.8).
The counter also starts again (a reader reboot, a firmware update), and a restart must be told
apart from a gap, or every reboot would look like billions of lost reads.

The rules, in one place (DESIGN §7.9):
- **reset**: a number below half the previous one (`is_reset`). A reader's counter only grows, so
  a small step back is re-ordering or a late arrival, a big one is a new counter.
- **epoch**: the numbers between two resets. Gaps are looked for within an epoch only: numbers
  before an epoch's first are not missing, since where a counter started is not known.
- **missing**: within an epoch, every number between two present numbers that is not present,
  reported as inclusive ranges (`missing_ranges`).
- **several gateways** (one shared group): each finds the resets in its own share, in its exact
  arrival order; `epoch_offsets` puts their epoch counts on one.

`spark.audit` applies these to a whole table with Spark (and is the authority); `ReaderCounter`
applies them live, one event at a time, for a running figure the daemon can keep and persist.
Pure: no Spark, no threads, no I/O. Event numbers are non-negative integers (the parser keeps
them within int64); the rules are not meant for negative ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

Gateway = TypeVar("Gateway")


def is_reset(previous: int, new: int) -> bool:
    """Whether `new`, coming after `previous`, starts a new counter: it dropped by more than half
    of `previous` (DESIGN §7.9). Exact for any integers (no float division)."""
    return 2 * new < previous


def missing_ranges(present: Sequence[int]) -> list[tuple[int, int]]:
    """The inclusive (first, last) ranges of numbers absent between consecutive numbers of
    `present`, which must be sorted ascending and distinct; one range per run of absent numbers.

    Nothing before the first number or after the last is reported: the counter's start is not
    known, and what comes after the last has not arrived yet (or was never made).
    """
    ranges: list[tuple[int, int]] = []
    for before, after in pairwise(present):
        if after <= before:
            raise ValueError(f"numbers must be sorted and distinct: {before} then {after}")
        if after - before > 1:
            ranges.append((before + 1, after - 1))
    return ranges


def split_epochs(numbers: Iterable[int]) -> list[list[int]]:
    """The numbers of one reader in arrival order, cut into epochs at each reset (`is_reset`
    against the number just before it): the reference the Spark audit is tested against."""
    epochs: list[list[int]] = []
    previous: int | None = None
    for number in numbers:
        if previous is None or is_reset(previous, number):
            epochs.append([])
        epochs[-1].append(number)
        previous = number
    return epochs


def epoch_offsets(
    first_seen: Mapping[Gateway, int], resets_seen: Mapping[Gateway, Sequence[int]]
) -> dict[Gateway, int]:
    """How many resets of one reader's counter happened before each gateway's first read of it:
    the number to add to that gateway's own epoch count to put it on the reader's count.

    Each gateway of a shared group sees a share of the reader's stream in its exact arrival
    order (the ledger seq), and so finds each reset exactly; what it cannot know is how many
    resets came before its first read. `first_seen` maps each gateway (any key) to the time of
    its first read of the reader, `resets_seen` to the times of the resets it found (same
    units). A gateway's offset is the most resets any gateway that started before it had seen,
    on the reader's count, by then. Only the times of these few moments are compared across
    gateways, never the order of every read (gateway clocks and latencies differ).

    What it cannot tell apart: a gateway whose very first reads of the reader came late across
    a reset (old numbers stamped after another gateway's first new one), and a gateway that got
    no read at all during a whole epoch (it finds one reset where there were two). Both mix two
    epochs of one reader, which the audit then shows as conflicts and false gaps.
    """
    offsets: dict[Gateway, int] = {}
    for gateway in sorted(first_seen, key=lambda g: (first_seen[g], g)):
        start = first_seen[gateway]
        offsets[gateway] = max(
            (
                offsets[earlier]
                + sum(1 for moment in resets_seen.get(earlier, ()) if moment < start)
                for earlier in offsets
            ),
            default=0,
        )
    return offsets


def range_size(first: int, last: int) -> int:
    return last - first + 1


@dataclass
class ReaderCounter:
    """Running counts of one reader's events, fed in arrival order (`observe`).

    - `received`: events with an eventNum; `without_event_num`: events without one (counted,
      never checked: there is nothing to check them by).
    - `resets`: how often the counter started again (`is_reset` against `last_event_num`, the
      highest number so far: a late arrival does not move it, where the audit compares with the
      number just before; for events arriving in order the two agree).
    - `missing`: numbers skipped forward — an event `n` after `last_event_num` = `m` (not a
      reset) adds `n - m - 1` when `n > m + 1`.
    - `last_event_num`: the highest number of the current epoch (None before the first).

    This is the live, approximate figure: a late arrival of a number already counted as missing
    (re-ordering between gateways of a shared group, a redelivery) is *not* un-counted, and a
    number below `last_event_num` that is not a reset changes nothing. The audit over the table
    (`fxgate audit`, spark/audit.py) is the authority: it looks at every number present.

    `state()` gives a plain dict of ints (JSON-able) and `from_state` takes it back, so the daemon
    can persist the counter and go on counting after a restart.
    """

    received: int = 0
    without_event_num: int = 0
    missing: int = 0
    resets: int = 0
    last_event_num: int | None = None

    _FIELDS = ("received", "without_event_num", "missing", "resets", "last_event_num")

    def observe(self, event_num: int | None) -> None:
        """Count one event; `event_num` None for an event that carried no eventNum."""
        if event_num is None:
            self.without_event_num += 1
            return
        self.received += 1
        last = self.last_event_num
        if last is None:
            self.last_event_num = event_num
        elif is_reset(last, event_num):
            self.resets += 1
            self.last_event_num = event_num
        elif event_num > last:
            self.missing += event_num - last - 1
            self.last_event_num = event_num

    def observe_all(self, event_nums: Iterable[int | None]) -> ReaderCounter:
        for event_num in event_nums:
            self.observe(event_num)
        return self

    def state(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in self._FIELDS}

    @classmethod
    def from_state(cls, state: Mapping[str, object]) -> ReaderCounter:
        """A counter from what `state()` gave; raises ValueError naming a bad or missing key
        (a corrupt saved state must not silently restart the counts)."""
        unknown = sorted(set(state) - set(cls._FIELDS))
        if unknown:
            raise ValueError(f"unknown counter state key(s): {', '.join(unknown)}")
        values: dict[str, int | None] = {}
        for name in cls._FIELDS:
            if name not in state:
                raise ValueError(f"counter state lacks {name!r}")
            value = state[name]
            if name == "last_event_num" and value is None:
                values[name] = None
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"counter state {name!r} is not an integer: {value!r}")
            if name != "last_event_num" and value < 0:
                raise ValueError(f"counter state {name!r} is negative: {value}")
            values[name] = value
        return cls(**values)
