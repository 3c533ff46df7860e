"""A shared group's one table (DESIGN §7.12): members land insert-if-absent, with no lock between
them, and Delta's conflict checks make them one idempotent receiver.

The races here are made, not hoped for: a member's hook at the moment between reading its
snapshot and committing (`BEFORE_MERGE`, `CLAIMED_BEFORE_OPTIMIZE`) runs the other member's whole
commit, so the first member's commit always meets a newer table than the one it read. Two
`GroupTableWriter`s in one process keep separate snapshots, as two processes would: Delta's log
on the disk is all they share.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from spark.maintenance import CLAIMED_BEFORE_OPTIMIZE, DeltaMaintainer
from spark.tables import (
    BEFORE_MERGE,
    CONFLICT_SCHEME,
    CONFLICTS,
    DEAD_LETTERS,
    GROUP_OF,
    LANDED_BY,
    READS,
    ArrowTableWriter,
    GroupTableWriter,
    TablesOfAnotherGroup,
    absent_rows,
    candidate_files,
    check_group,
    conflict_ids,
    group_application_id,
    table_path,
)

GROUP = "fxgate-env-a"
APP_A = "fxgate-ledger-member-a"
APP_B = "fxgate-ledger-member-b"
T0 = datetime(2026, 11, 29, 23, 59, 50, 123456, tzinfo=UTC)
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC).timestamp()


def reads(numbers, received: datetime = T0, reader: str = "fx9600-01") -> pa.Table:
    """One read per number: its id and its event time are the read's own (the same whichever
    member received it); `date` is the day it was received."""
    numbers = list(numbers)
    return pa.table(
        {
            "message_id": pa.array([f"{reader}-{n:05d}:0" for n in numbers], pa.string()),
            "reader_id": pa.array([reader] * len(numbers), pa.string()),
            "event_num": pa.array(numbers, pa.int64()),
            "event_time": pa.array(
                [T0 + timedelta(milliseconds=10 * n) for n in numbers], pa.timestamp("us", "UTC")
            ),
            "received_time": pa.array([received] * len(numbers), pa.timestamp("us", "UTC")),
            "date": pa.array([received.strftime("%Y-%m-%d")] * len(numbers), pa.string()),
        }
    )


def member(tables, app_id: str, name: str, checkpoint=lambda point: None) -> GroupTableWriter:
    return GroupTableWriter(None, tables, app_id, checkpoint=checkpoint, group=GROUP, member=name)


class Armed:
    """A checkpoint hook that runs the action it is armed with the next time `point` is
    reached, once (`once_at` arms it at once)."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.action = None

    def arm(self, action) -> Armed:
        self.action = action
        return self

    def __call__(self, name: str) -> None:
        if name == self.point and self.action is not None:
            action, self.action = self.action, None
            action()


def once_at(point: str, action) -> Armed:
    return Armed(point).arm(action)


def table_rows(tables, name: str = READS) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(table_path(str(tables), name)).to_pyarrow_table()


def ids_of(table: pa.Table) -> list[str]:
    return table.column("message_id").to_pylist()


def test_two_members_racing_with_overlapping_batches_land_each_read_once_and_the_loser_merges_again(
    tmp_path,
):
    from deltalake import DeltaTable

    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    race = Armed(BEFORE_MERGE)
    a = member(tmp_path, APP_A, "fxgate-env-a-a1", checkpoint=race)
    a.write_batch(1, {READS: reads(range(10))})
    assert a.take_merge_counts() == (0, 0)
    race.arm(lambda: b.write_batch(1, {READS: reads(range(15, 25))}))

    # a1 has read the table at its batch 1 when a2 commits reads 15..24; a1's merge of 10..19
    # then fails on the concurrent commit, merges again from the new snapshot and skips 15..19.
    a.write_batch(2, {READS: reads(range(10, 20))})
    assert a.take_merge_counts() == (1, 5)
    assert b.take_merge_counts() == (0, 0)

    rows = table_rows(tmp_path)
    ids = ids_of(rows)
    assert sorted(ids) == sorted(ids_of(reads(range(25))))
    assert len(ids) == len(set(ids)) == 25
    by = dict(zip(ids, rows.column(LANDED_BY).to_pylist(), strict=True))
    assert {n for n in range(25) if by[ids_of(reads([n]))[0]] == "fxgate-env-a-a2"} == set(
        range(15, 25)
    )
    table = DeltaTable(table_path(str(tmp_path), READS))
    # Each member's own batches stay exactly once through its transaction id; both commits
    # carry the group's identifier of their reads' conflict key (one reader, one second), which
    # is what made a1's fail.
    assert table.transaction_version(APP_A) == 2
    assert table.transaction_version(APP_B) == 1
    group = group_application_id(GROUP)
    shared = set(conflict_ids(group, READS, reads(range(10, 20)))) & set(
        conflict_ids(group, READS, reads(range(15, 25)))
    )
    assert shared and all(table.transaction_version(app) is not None for app in shared)
    assert table.metadata().configuration[GROUP_OF] == GROUP
    assert table.metadata().configuration[CONFLICTS] == CONFLICT_SCHEME


def other_reads(numbers) -> pa.Table:
    """Reads of the same reader at the same moments as `reads(numbers)`, but other reads (other
    ids): the same conflict key, none of the same rows."""
    table = reads(numbers)
    ids = [f"{i}-other" for i in ids_of(table)]
    return table.set_column(0, "message_id", pa.array(ids, pa.string()))


def test_a_member_that_loses_a_race_to_other_reads_commits_the_files_it_wrote_once_more(tmp_path):
    """The other member's commit holds none of this member's rows (other reads of the same
    reader in the same second): the retry reads only the file committed since its snapshot and
    commits the file it had written, not rewritten."""
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    race = Armed(BEFORE_MERGE)
    a = member(tmp_path, APP_A, "fxgate-env-a-a1", checkpoint=race)
    a.write_batch(1, {READS: reads(range(10))})
    race.arm(lambda: b.write_batch(1, {READS: other_reads(range(10, 20))}))
    a.write_batch(2, {READS: reads(range(10, 20))})
    assert a.take_merge_counts() == (1, 0)
    # Files read: none at a1's first landing (no table yet), none at its second (batch 1's
    # file holds earlier times), then at the retry a2's new file, whose times overlap.
    assert a.take_files_read() == [0, 0, 1]
    on_disk = list((tmp_path / READS).rglob("*.parquet"))
    assert len(on_disk) == 3  # no orphan: a1's batch 2 was written once
    assert len(table_rows(tmp_path)) == 30


def test_members_landing_other_readers_at_the_same_moment_commit_side_by_side(tmp_path):
    """Another reader's reads in the same second cannot be one of this member's: the commits
    carry different conflict keys, and neither waits for the other."""
    from deltalake import DeltaTable

    group = group_application_id(GROUP)
    mine, theirs = reads(range(10, 20)), reads(range(10, 20), reader="fx9600-02")
    assert not set(conflict_ids(group, READS, mine)) & set(conflict_ids(group, READS, theirs))
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    race = Armed(BEFORE_MERGE)
    a = member(tmp_path, APP_A, "fxgate-env-a-a1", checkpoint=race)
    a.write_batch(1, {READS: reads(range(10))})
    race.arm(lambda: b.write_batch(1, {READS: theirs}))
    a.write_batch(2, {READS: mine})
    assert race.action is None  # b's commit came between a1's snapshot and its commit
    assert a.take_merge_counts() == (0, 0)
    assert a.take_files_read() == [0, 0]
    assert len(table_rows(tmp_path)) == 30
    assert DeltaTable(table_path(str(tmp_path), READS)).version() == 3  # made, a1, a2, a1


def test_the_conflict_keys_are_one_per_reader_and_second_and_bounded():
    from spark.tables import CONFLICT_SLOTS

    group = group_application_id(GROUP)
    one_second = reads(range(50))  # 0.5 s from T0's .123 s: one second
    assert len(conflict_ids(group, READS, one_second)) == 1
    assert len(conflict_ids(group, READS, reads(range(100)))) == 2  # into the next second
    # A batch of a long backlog (10,000 seconds of one reader): as many identifiers as slots.
    backlog = reads(range(0, 1_000_000, 100))
    assert len(conflict_ids(group, READS, backlog)) == CONFLICT_SLOTS
    # Tables without keys: one identifier for the whole group.
    assert conflict_ids(group, DEAD_LETTERS, pa.table({"x": [1]})) == [group]
    # A batch without event times: one key per reader, whatever the moment.
    timeless = reads(range(100)).drop_columns(["event_time"])
    assert conflict_ids(group, READS, timeless) == conflict_ids(group, READS, timeless[:1])


def test_without_the_race_the_second_member_skips_what_the_first_landed_and_counts_it(tmp_path):
    a = member(tmp_path, APP_A, "fxgate-env-a-a1")
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    a.write_batch(1, {READS: reads(range(20))})
    written = b.write_batch(7, {READS: reads(range(12, 30))})
    # What the batch holds is what the ledger is told; the merge skipped what a1 had.
    assert written == {READS: 18}
    assert b.take_merge_counts() == (0, 8)
    assert sorted(ids_of(table_rows(tmp_path))) == sorted(ids_of(reads(range(30))))


def test_a_read_the_second_member_received_on_the_next_day_is_found_in_the_first_ones_day(
    tmp_path,
):
    """A re-dispatched read is received again later, here after midnight: the merge must look
    beyond the receive date's partition, by what both members see."""
    a = member(tmp_path, APP_A, "fxgate-env-a-a1")
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    a.write_batch(1, {READS: reads(range(5), received=T0)})
    tomorrow = T0 + timedelta(minutes=5)
    assert tomorrow.date() != T0.date()
    b.write_batch(1, {READS: reads(range(3, 8), received=tomorrow)})
    rows = table_rows(tmp_path)
    assert sorted(ids_of(rows)) == sorted(ids_of(reads(range(8))))
    days = dict(zip(ids_of(rows), rows.column("date").to_pylist(), strict=True))
    assert days[ids_of(reads([4]))[0]] == "2026-11-29"
    assert days[ids_of(reads([7]))[0]] == "2026-11-30"


def test_a_members_replay_of_its_own_batch_is_skipped_by_its_transaction_id(tmp_path):
    from deltalake import DeltaTable

    a = member(tmp_path, APP_A, "fxgate-env-a-a1")
    a.write_batch(1, {READS: reads(range(10))})
    version = DeltaTable(table_path(str(tmp_path), READS)).version()
    again = member(tmp_path, APP_A, "fxgate-env-a-a1")  # after a restart
    assert again.write_batch(1, {READS: reads(range(10))}) == {READS: 10}
    assert DeltaTable(table_path(str(tmp_path), READS)).version() == version
    assert again.take_merge_counts() == (0, 0)


def test_a_member_reads_only_the_files_its_batch_can_be_in(tmp_path):
    """After many commits a landing's cost follows its batch: the event-time range skips every
    file whose statistics cannot hold one of its reads, and only the identity is read."""
    from deltalake import DeltaTable

    a = member(tmp_path, APP_A, "fxgate-env-a-a1")
    for batch_id in range(1, 31):
        a.write_batch(batch_id, {READS: reads(range(batch_id * 10, batch_id * 10 + 10))})
    table = DeltaTable(table_path(str(tmp_path), READS))
    assert len(table.file_uris()) == 30
    batch = reads(range(295, 315))
    assert len(candidate_files(table, READS, batch)) == 2  # batches 29 and 30
    fresh = absent_rows(table, tmp_path / READS, READS, batch)
    assert ids_of(fresh) == ids_of(reads(range(310, 315)))
    # Without an event time on every row, every file is a candidate: nothing is missed.
    unknown = batch.set_column(
        batch.schema.get_field_index("event_time"),
        "event_time",
        pa.array([None] * batch.num_rows, pa.timestamp("us", "UTC")),
    )
    assert len(candidate_files(table, READS, unknown)) == 30
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    b.write_batch(1, {READS: batch})
    assert b.take_merge_counts() == (0, 15)
    assert len(table_rows(tmp_path)) == 305


def test_a_file_without_statistics_is_always_read_and_dead_letters_are_one_per_sink_and_reason(
    tmp_path,
):
    """A file that another writer committed without statistics may hold any read; a message's
    dead letters are one per sink and reason (a null sink a value of its own)."""
    from deltalake import DeltaTable

    from spark.tables import _prepared, _write_files, commit_files

    a = member(tmp_path, APP_A, "fxgate-env-a-a1")
    a.write_batch(1, {READS: reads(range(10))})
    a.write_batch(2, {READS: reads(range(100, 110))})
    path = table_path(str(tmp_path), READS)
    table = DeltaTable(path)
    bare = _write_files(Path(path), _prepared(reads(range(200, 205)), 1), stats=())
    commit_files(table, bare, "fxgate-ledger-elsewhere", 1)
    table.update_incremental()
    assert len(table.file_uris()) == 3
    # Read 3 can be in batch 1's file and in the file without statistics, not in batch 2's.
    assert set(candidate_files(table, READS, reads([3]))) == {
        bare[0].path,
        *candidate_files(table, READS, reads(range(10))),
    }
    assert len(candidate_files(table, READS, reads([3]))) == 2

    letters = pa.table(
        {
            "message_key": ["k1", "k1", "k1", "k2"],
            "sink": ["table", "upstream", "upstream", None],
            "reason": ["invalid_json", "forward_failed", "expired", "invalid_json"],
            "date": ["2026-11-29"] * 4,
        }
    )
    a.write_batch(3, {DEAD_LETTERS: letters})
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    b.write_batch(1, {DEAD_LETTERS: letters})
    assert table_rows(tmp_path, DEAD_LETTERS).num_rows == 4


def test_a_read_at_the_edge_of_a_files_range_still_finds_its_twin(tmp_path):
    """The range's ends are the batch's own event times, to the microsecond, while Delta keeps
    a file's timestamp statistics to the millisecond: the first and last read of a file, found
    among files whose statistics prune."""
    a = member(tmp_path, APP_A, "fxgate-env-a-a1")
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    for batch_id in range(1, 6):
        a.write_batch(batch_id, {READS: reads(range(batch_id * 10, batch_id * 10 + 10))})
    b.write_batch(1, {READS: reads([29])})
    b.write_batch(2, {READS: reads([30])})
    assert b.take_merge_counts() == (0, 2)
    assert len(table_rows(tmp_path)) == 50


# -- maintenance by any member ----------------------------------------------------------------


def small_files(tmp_path, count: int = 6) -> None:
    a = member(tmp_path, APP_A, "fxgate-env-a-a1")
    for batch_id in range(1, count + 1):
        a.write_batch(batch_id, {READS: reads(range(batch_id * 10, batch_id * 10 + 10))})


def test_delta_rs_commits_two_optimizes_of_the_same_files_which_is_why_each_is_claimed(tmp_path):
    """The fact the claims exist for (deltalake 1.6.6): an OPTIMIZE from a snapshot whose files
    another OPTIMIZE has replaced since still commits, and every row of those files is then in
    the table twice. If this fails, delta-rs has learnt to refuse it, and the claims in
    spark/maintenance.py can go."""
    from deltalake import DeltaTable

    small_files(tmp_path)
    path = table_path(str(tmp_path), READS)
    first, second = DeltaTable(path), DeltaTable(path)
    first.optimize.compact()
    second.optimize.compact()
    ids = ids_of(table_rows(tmp_path))
    assert len(set(ids)) == 60
    assert len(ids) == 120


def test_of_two_members_overlapping_optimizes_one_is_skipped_and_every_row_stays_once(tmp_path):
    small_files(tmp_path)
    other = DeltaMaintainer(tmp_path, tables=(READS,), claim="fxgate-env-a-a2")
    passes = []
    # a1 claims its OPTIMIZE; before it runs, a2 claims and runs a whole pass of its own.
    hook = once_at(CLAIMED_BEFORE_OPTIMIZE, lambda: passes.append(other.run(NOW)))
    first = DeltaMaintainer(tmp_path, tables=(READS,), claim="fxgate-env-a-a1", checkpoint=hook)
    result = first.run(NOW)

    (theirs,) = passes[0].tables
    (ours,) = result.tables
    assert theirs.files_removed == 6 and theirs.optimizes_lost == 0
    # a1's first OPTIMIZE read the table before a2's claim, and lost; its second (the open
    # date) read it after a2's pass and found the one file a2 made.
    assert ours.optimizes_lost == 1
    assert ours.files_removed == 0
    assert "1 OPTIMIZE(s) lost to another member" in result.summary()
    ids = ids_of(table_rows(tmp_path))
    assert len(ids) == len(set(ids)) == 60


def test_a_merge_in_flight_when_a_member_claims_maintenance_merges_again(tmp_path):
    small_files(tmp_path, count=2)
    maintainer = DeltaMaintainer(tmp_path, tables=(READS,), claim="fxgate-env-a-a2")
    a = member(
        tmp_path,
        APP_A,
        "fxgate-env-a-a1",
        checkpoint=once_at(BEFORE_MERGE, lambda: maintainer.run(NOW)),
    )
    a.write_batch(3, {READS: reads(range(15, 40))})
    retried, already = a.take_merge_counts()
    assert retried >= 1 and already == 15
    # The claim failed a1's commit, and the OPTIMIZE's file holds only rows a1 had read: no
    # landing of the group's with a1's conflict keys came, so nothing is read again.
    assert a.take_files_read() == [2]
    ids = ids_of(table_rows(tmp_path))
    assert sorted(ids) == sorted(ids_of(reads(range(10, 40))))


def test_a_landing_compacted_away_before_the_retry_is_read_in_the_optimizes_file(tmp_path):
    """Another member lands some of a1's reads, and a pass compacts its file away, both between
    a1's look and its commit: the retry must read the OPTIMIZE's file, where those rows are."""
    small_files(tmp_path, count=2)
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    maintainer = DeltaMaintainer(tmp_path, tables=(READS,), claim="fxgate-env-a-a2")

    def land_and_compact():
        b.write_batch(1, {READS: reads(range(35, 45))})
        maintainer.run(NOW)

    a = member(
        tmp_path, APP_A, "fxgate-env-a-a1", checkpoint=once_at(BEFORE_MERGE, land_and_compact)
    )
    a.write_batch(3, {READS: reads(range(15, 40))})
    retried, already = a.take_merge_counts()
    assert retried >= 1 and already == 15 + 5
    assert a.take_files_read() == [2, 1]  # the first look; then the compacted file
    ids = ids_of(table_rows(tmp_path))
    assert sorted(ids) == sorted(ids_of(reads(range(10, 45))))


# -- whose table ------------------------------------------------------------------------------


def test_a_member_of_another_group_or_a_gateway_alone_is_refused_a_groups_table(tmp_path):
    member(tmp_path, APP_A, "fxgate-env-a-a1").write_batch(1, {READS: reads(range(3))})
    assert check_group(tmp_path, GROUP) == []
    with pytest.raises(TablesOfAnotherGroup, match=r"'fxgate-env-a'.* member of 'fxgate-env-b'"):
        check_group(tmp_path, "fxgate-env-b")
    with pytest.raises(TablesOfAnotherGroup, match=r"no \[source\] shared_subscription_group"):
        check_group(tmp_path, None)


def test_a_member_that_keys_its_commits_otherwise_is_refused_the_groups_table(tmp_path):
    """Members keying their commits differently would not be ordered (a later fxgate's scheme,
    say): the table names its scheme, and another one is refused before anything is written."""
    from deltalake import DeltaTable

    member(tmp_path, APP_A, "fxgate-env-a-a1").write_batch(1, {READS: reads(range(3))})
    table = DeltaTable(table_path(str(tmp_path), READS))
    table.alter.set_table_properties(
        {CONFLICTS: "reads: message_id; 7 slots"}, raise_if_not_exists=False
    )
    with pytest.raises(TablesOfAnotherGroup, match=r"'reads: message_id; 7 slots'.*one fxgate"):
        check_group(tmp_path, GROUP)


def test_a_group_adopts_the_table_its_first_gateway_landed_alone(tmp_path):
    from deltalake import DeltaTable

    ArrowTableWriter(None, tmp_path, APP_A).write_batch(1, {READS: reads(range(5))})
    path = table_path(str(tmp_path), READS)
    assert check_group(tmp_path, None) == []
    # A gateway alone's check writes nothing (its data directory may be read-only then).
    assert CONFLICTS not in DeltaTable(path).metadata().configuration
    assert check_group(tmp_path, GROUP) == [READS]
    assert DeltaTable(path).metadata().configuration[GROUP_OF] == GROUP
    assert DeltaTable(path).metadata().configuration[CONFLICTS] == CONFLICT_SCHEME
    # The gateway alone's rows stay, and a member's merge skips them.
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    b.write_batch(1, {READS: reads(range(3, 9))})
    assert b.take_merge_counts() == (0, 2)
    assert len(table_rows(tmp_path)) == 9


# -- lock-free readers in other processes while one member maintains and the other lands ------

ROUNDS = 12
PASS_EVERY = 3  # rounds between a1's maintenance passes: 4 passes, the last at the end
READ_START_TIMEOUT = 240.0  # a Spark JVM on a loaded box (tests/spark/test_delta_readers.py)
READ_TIMEOUT = 120.0


def round_reads(round_number: int, side: int) -> pa.Table:
    """Round K's reads for member `side` (0: a1, 1: a2): 20 numbers each, the two overlapping
    in 10 (the reads a broker gave to both), and received on two days, as a round at midnight."""
    start = round_number * 30 + side * 10
    received = T0 if round_number % 2 else T0 + timedelta(minutes=1)
    return reads(range(start, start + 20), received=received)


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_lock_free_readers_see_each_read_once_while_one_member_maintains_and_the_other_lands(
    tmp_path,
):
    """a1 and a2 land overlapping rounds into the group's `reads`; a1's maintenance passes
    (OPTIMIZE and a VACUUM with no retention) run at the very moment a2 has read its snapshot
    and not yet merged, so a2's merge meets the claims and the compaction and merges again.
    Readers of every engine read the table in their own processes, taking no lock: no read may
    hold a read twice, none may lose one that a version before it held."""
    from deltalake import DeltaTable

    from tests.harness.delta_readers import ENGINES, delta_readers, vacuum_windows
    from tests.spark.test_delta_readers import checked_reads

    tables = tmp_path / "tables"
    path = table_path(str(tables), READS)
    maintainer = DeltaMaintainer(
        tables, vacuum_retention_hours=0, tables=(READS,), claim="fxgate-env-a-a1"
    )
    a1 = member(tables, APP_A, "fxgate-env-a-a1")
    race = Armed(BEFORE_MERGE)
    a2 = member(tables, APP_B, "fxgate-env-a-a2", checkpoint=race)
    passes = []
    landed: set[str] = set()
    counts = []  # (Delta version, reads in the table) after each commit of ours

    with delta_readers(ENGINES, path, tmp_path / "readers", key="message_id") as readers:
        for reader in readers.values():
            reader.wait_ready(READ_START_TIMEOUT)
        for round_number in range(1, ROUNDS + 1):
            a1.write_batch(round_number, {READS: round_reads(round_number, 0)})
            if round_number % PASS_EVERY == 0:
                race.arm(lambda: passes.append((time.time(), maintainer.run(NOW))))
            a2.write_batch(round_number, {READS: round_reads(round_number, 1)})
            for side in (0, 1):
                landed.update(ids_of(round_reads(round_number, side)))
            table = DeltaTable(path)
            counts.append((table.version(), len(landed)))
            if passes and passes[-1][0] > time.time() - 5:
                # Each engine reads the maintained table before more lands.
                for reader in readers.values():
                    reader.wait_for_read_started_after(passes[-1][0], READ_TIMEOUT)
        done = time.time()
        for reader in readers.values():
            reader.wait_for_read_started_after(done, READ_TIMEOUT)

    assert len(passes) == ROUNDS // PASS_EVERY
    retried, already = a2.take_merge_counts()
    assert retried >= len(passes), "a2's merges did not meet a1's maintenance"
    assert already == 10 * ROUNDS
    assert sum(result.files_compacted for _, result in passes) > 0
    assert sum(result.files_vacuumed for _, result in passes) > 0
    final = ids_of(table_rows(tables))
    assert len(final) == len(set(final)) == len(landed) and set(final) == landed

    windows = vacuum_windows(path)
    for engine, reader in readers.items():
        good = checked_reads(reader, windows)
        for read in good:
            assert not read["duplicate_keys"], f"{engine} read {read['read']}: {read}"
            assert read["rows"] == read["distinct_keys"]
            if read["version"] is not None:
                # Rows only grow with the versions: at least what our last commit before it held.
                held = max((n for version, n in counts if version <= read["version"]), default=0)
                assert read["rows"] >= held, (engine, read["version"], read["rows"], held)
        assert good[-1]["rows"] == len(landed), f"{engine}: {good[-1]}"


def test_only_reads_another_member_landed_count_as_already_landed(tmp_path):
    """The count is of reads (what /metrics and status call it): a dead letter both members
    received is skipped the same way, and not counted among them."""
    letters = pa.table(
        {
            "message_key": ["k1", "k2"],
            "sink": ["table", "table"],
            "reason": ["invalid_json", "invalid_json"],
            "date": ["2026-11-29", "2026-11-29"],
        }
    )
    a = member(tmp_path, APP_A, "fxgate-env-a-a1")
    b = member(tmp_path, APP_B, "fxgate-env-a-a2")
    a.write_batch(1, {READS: reads(range(4)), DEAD_LETTERS: letters})
    b.write_batch(1, {READS: reads(range(2, 6)), DEAD_LETTERS: letters})
    assert b.take_merge_counts() == (0, 2)
    assert table_rows(tmp_path, DEAD_LETTERS).num_rows == 2
    assert table_rows(tmp_path).num_rows == 6


# -- two processes ------------------------------------------------------------------------------


def _member_process(tables, app_id, name, numbers, barrier, results) -> None:
    """One member in a process of its own: read the table, wait at `barrier` for the other
    member to have read the same snapshot, then merge; report (merges retried, reads skipped)."""
    waited = []

    def hook(point: str) -> None:
        if point == BEFORE_MERGE and not waited:
            waited.append(point)
            barrier.wait(timeout=60)

    writer = member(tables, app_id, name, checkpoint=hook)
    writer.write_batch(1, {READS: reads(numbers)})
    results.put((name, writer.take_merge_counts()))
    writer.close()


def test_two_member_processes_released_at_once_from_one_snapshot_land_each_read_once(tmp_path):
    """Both members have read the same version of the table when a barrier releases them, so
    whichever commits second meets the first's commit over what it read: Delta fails it, it
    merges again and skips the overlap. delta-rs must run in spawned processes (its runtime
    panics in a forked child, DESIGN §4)."""
    import multiprocessing

    member(tmp_path, "fxgate-ledger-seed", "fxgate-env-a-seed").write_batch(
        1, {READS: reads(range(5))}
    )
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    processes = [
        context.Process(
            target=_member_process,
            args=(tmp_path, app, name, numbers, barrier, results),
        )
        for app, name, numbers in (
            (APP_A, "fxgate-env-a-a1", range(5, 25)),
            (APP_B, "fxgate-env-a-a2", range(15, 35)),
        )
    ]
    for process in processes:
        process.start()
    try:
        counts = dict(results.get(timeout=120) for _ in processes)
    finally:
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()
                process.join(10)
    assert [process.exitcode for process in processes] == [0, 0]
    # Exactly one lost the race, retried once, and skipped the ten reads the other landed.
    assert sorted(counts.values()) == [(0, 0), (1, 10)], counts
    ids = ids_of(table_rows(tmp_path))
    assert len(ids) == len(set(ids)) == 35
