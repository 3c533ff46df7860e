"""Named crash points: fault-injection tests make the daemon SIGKILL itself at an exact moment.

`FXGATE_CRASH_AT=name` (or `name:n`, the n-th time the point is reached) arms one point for the
life of the process. Unarmed, a crash point is one comparison. Each point sits in a window where a
crash could lose or double a read if the design were wrong, so each is a test
(tests/actors/test_crashpoints.py).
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)

ENVIRONMENT_VARIABLE = "FXGATE_CRASH_AT"

POINTS = frozenset(
    {
        # Rows are durable, the broker has no PUBACK/PUBREC yet: it must redeliver, we dedupe.
        "after_ledger_commit_before_ack",
        # The broker has our PUBREC (its PUBREL proves it); we die before recording the release.
        "after_pubrec_before_pubrel",
        # A batch id and its packs are recorded; no Spark job has run.
        "after_batch_begin_before_job",
        # Killed while the Spark job writes files (a timer fires shortly after the job starts).
        "mid_spark_job",
        # Default landing (spark.tables.ArrowTableWriter): a table's files of the batch are
        # written and synced; its Delta commit is not made yet.
        "landing_after_write_before_commit",
        # One table of a batch has its commit, the next table not yet (a batch spans up to four
        # tables, each its own commit): the replay must land the rest, and nothing twice.
        "landing_between_tables",
        # Every table has the batch (a Spark job or delta-rs commits); the ledger does not know.
        "after_spark_job_before_mark",
        # Upstream QoS 2: the broker's PUBREC arrived, not yet recorded (it has our PUBLISH).
        "after_publish_before_pubrec",
        # A life-cycle event and its sequence number are committed; no sink has the event.
        "after_lifecycle_commit_before_hand_on",
        # Upstream QoS 2: the broker's PUBCOMP arrived, not yet recorded (it has our PUBREL).
        "after_pubrec_before_pubcomp",
        # Maintenance (spark/maintenance.py): killed inside OPTIMIZE or VACUUM (a timer fires as
        # the operation starts), or between the two.
        "maintenance_inside_optimize",
        "maintenance_after_optimize_before_vacuum",
        "maintenance_inside_vacuum",
        # A shared group's tables: a member read a table's snapshot and has not merged its batch
        # into it yet; a member claimed an OPTIMIZE and has not run it yet.
        "group_before_merge",
        "maintenance_claimed_before_optimize",
        # Conversion of the layout before Delta (spark/convert.py): a chunk's files written and
        # not committed; a chunk committed; the old directories half removed.
        "convert_after_write_before_commit",
        "convert_after_commit",
        "convert_during_removal",
    }
)

MID_JOB_DELAY = 0.05
# The maintenance points "inside" OPTIMIZE or VACUUM fire this long after the operation starts:
# on a test's small tables either takes tens of milliseconds.
MAINTENANCE_CRASH_DELAY = 0.005

_lock = threading.Lock()
_armed: list[object] = [None, 0]  # [name, hits still to go]
# In the forward process (actors.forward_process): a crash point there kills the daemon too.
_parent_too = [False]


class CrashPointError(ValueError):
    pass


def arm(spec: str | None) -> None:
    """Arm `name` or `name:n`; None or "" disarms."""
    if not spec:
        _armed[:] = [None, 0]
        return
    name, _, count = spec.partition(":")
    if name not in POINTS:
        known = ", ".join(sorted(POINTS))
        raise CrashPointError(
            f"{ENVIRONMENT_VARIABLE}: unknown crash point {name!r}; known: {known}"
        )
    try:
        hits = int(count) if count else 1
    except ValueError:
        raise CrashPointError(f"{ENVIRONMENT_VARIABLE}: {count!r} is not a whole number") from None
    if hits < 1:
        raise CrashPointError(f"{ENVIRONMENT_VARIABLE}: the count must be at least 1")
    _armed[:] = [name, hits]
    log.warning("crash point armed: %s (hit %d)", name, hits)


def arm_from_environ() -> None:
    arm(os.environ.get(ENVIRONMENT_VARIABLE))


def take_parent_along() -> None:
    """This process is the daemon's forward process: a crash point here kills the daemon too,
    so that a test sees the whole gateway die at the point, as in one process."""
    _parent_too[0] = True


def crash_point(name: str) -> None:
    if _armed[0] != name:
        return
    with _lock:
        _armed[1] -= 1
        if _armed[1] > 0:
            return
    _die(name)


def crash_soon(name: str, delay: float = MID_JOB_DELAY) -> threading.Timer | None:
    """For points inside a long operation: die `delay` seconds from now unless cancelled."""
    if _armed[0] != name:
        return None
    timer = threading.Timer(delay, crash_point, args=(name,))
    timer.daemon = True
    timer.start()
    return timer


def _die(name: str) -> None:
    log.critical("crash point %s reached: SIGKILL", name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if _parent_too[0]:
        os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
