"""Delta tables on an object store (issue 35), landed by delta-rs in this process, each test once
on Azure and once on S3: a real Azurite (the Azure Storage emulator, tests/harness/azurite.py)
reached as Azure is, the storage account variables in the environment and an
`az://container/path` tables location; a real SeaweedFS S3 gateway (tests/harness/seaweedfs.py)
reached as S3 is, the AWS variables and an `s3://bucket/path` location. Both have the conditional
writes delta-rs commits with.

What the local tables' tests show holds on the store too, and is shown here with the store's own
faults: each batch once through its transaction id and its replay; a kill between the files and
the commit leaves blobs no snapshot lists; a store that is down fails the write (the writer
actor's backoff retries it, the ledger holding the reads) and the same batch lands once after;
through a fault proxy, a stalled store, a throttling one (503) and a commit whose reply is lost
each leave every batch in once;
two group members' merges forced to race; a claimed OPTIMIZE and a VACUUM beside a member's
landing. Readers in other processes (delta-rs, Polars, DuckDB) read the table the way their users
do.
"""

from __future__ import annotations

import pytest

from spark.location import delta_location, object_store, parse_location
from spark.maintenance import CLAIMED_BEFORE_OPTIMIZE, DeltaMaintainer
from spark.tables import (
    BEFORE_MERGE,
    LANDED_NOT_COMMITTED,
    READS,
    ArrowTableWriter,
    count_rows,
    is_delta_table,
    read_table_arrow,
    table_path,
)
from tests.harness.delta_readers import read_once
from tests.spark.test_group_tables import (
    APP_A,
    APP_B,
    NOW,
    Armed,
    ids_of,
    member,
    once_at,
    reads,
)

APP = "fxgate-ledger-object-store"


class Killed(Exception):
    """Stands for a SIGKILL at a crash point: nothing after it runs."""


def kill_at(point: str):
    def hook(name: str) -> None:
        if name == point:
            raise Killed(name)

    return hook


@pytest.fixture
def store(object_store_process):
    """The test's own store: an Azurite, then a SeaweedFS."""
    return object_store_process


@pytest.fixture
def tables(store) -> str:
    """An environment's tables directory in a fresh container (bucket) of the test's store."""
    return store.create_root("fxgate") + "/env-a"


def data_blobs(tables: str, name: str = READS) -> list[str]:
    """The data files under table `name` (not its log), listed by the store itself (obstore),
    whatever the Delta log says."""
    import obstore
    from obstore.store import from_url

    listed = obstore.list(from_url(table_path(tables, name))).collect()
    return sorted(
        entry["path"]
        for entry in listed
        if entry["path"].endswith(".parquet") and not entry["path"].startswith("_delta_log/")
    )


def read_elsewhere(engine: str, tables: str, work_dir) -> dict:
    """One read of `reads` through `engine` in a process of its own."""
    return read_once(engine, table_path(tables, READS), work_dir)


def once(record: dict) -> int | None:
    """The rows a reader saw, if it saw each key once (None if any key came twice)."""
    if record["duplicate_keys"] or record["distinct_keys"] != record["rows"]:
        return None
    return record["rows"]


def test_an_object_store_location_is_landed_by_delta_rs_and_refuses_credentials_in_the_uri():
    assert object_store(parse_location("az://fxgate/env-a/")) == "Azure"
    assert delta_location(parse_location("az://fxgate/env-a/")) == "az://fxgate/env-a"
    abfss = "abfss://fxgate@account.dfs.core.windows.net/env-a"
    assert delta_location(parse_location(abfss)) == abfss
    assert object_store(parse_location("s3://bucket/env-a")) == "S3"
    assert delta_location(parse_location("s3a://bucket/env-a")) is None  # Spark's
    with pytest.raises(ValueError, match="credentials"):
        parse_location("s3://KEY:SECRET@bucket/env-a")
    with pytest.raises(ValueError, match="credentials"):
        parse_location("az://account@fxgate/env-a")
    with pytest.raises(ValueError, match="container"):
        parse_location("az:///env-a")


def test_batches_land_once_on_the_store_and_a_replay_is_skipped(tables, tmp_path):
    writer = ArrowTableWriter(None, tables, APP)
    assert not is_delta_table(table_path(tables, READS))
    assert writer.write_batch(1, {READS: reads(range(10))}) == {READS: 10}
    assert writer.write_batch(2, {READS: reads(range(10, 20))}) == {READS: 10}
    # The ledger replays batch 2 after a restart: its transaction id says it is in.
    again = ArrowTableWriter(None, tables, APP)
    assert again.last_version(READS) == 2
    again.write_batch(2, {READS: reads(range(10, 20))})
    assert is_delta_table(table_path(tables, READS))
    assert count_rows(tables, READS) == 20
    assert sorted(ids_of(read_table_arrow(tables, READS))) == sorted(ids_of(reads(range(20))))
    for engine in ("deltalake", "polars", "duckdb"):
        record = read_elsewhere(engine, tables, tmp_path / engine)
        assert once(record) == 20, (engine, record)


def test_a_kill_between_the_blobs_and_the_commit_leaves_blobs_no_snapshot_lists(tables):
    ArrowTableWriter(None, tables, APP).write_batch(1, {READS: reads(range(10))})
    killed = ArrowTableWriter(None, tables, APP, checkpoint=kill_at(LANDED_NOT_COMMITTED))
    with pytest.raises(Killed):
        killed.write_batch(2, {READS: reads(range(10, 20))})
    assert len(data_blobs(tables)) == 2  # batch 2's blob is there, whole
    assert count_rows(tables, READS) == 10  # and no snapshot lists it
    restarted = ArrowTableWriter(None, tables, APP)
    restarted.write_batch(2, {READS: reads(range(10, 20))})
    assert sorted(ids_of(read_table_arrow(tables, READS))) == sorted(ids_of(reads(range(20))))


def test_a_store_that_is_down_fails_the_write_and_the_same_batch_lands_once_after(store, tables):
    writer = ArrowTableWriter(None, tables, APP)
    writer.write_batch(1, {READS: reads(range(10))})
    store.stop()
    with pytest.raises(OSError):
        writer.write_batch(2, {READS: reads(range(10, 20))})
    store.start()
    assert writer.write_batch(2, {READS: reads(range(10, 20))}) == {READS: 10}
    writer.write_batch(2, {READS: reads(range(10, 20))})  # a retry after all: skipped
    assert sorted(ids_of(read_table_arrow(tables, READS))) == sorted(ids_of(reads(range(20))))


def test_two_members_racing_on_the_store_land_each_read_once_and_the_loser_merges_again(
    tables, tmp_path
):
    b = member(tables, APP_B, "fxgate-env-a-a2")
    race = Armed(BEFORE_MERGE)
    a = member(tables, APP_A, "fxgate-env-a-a1", checkpoint=race)
    a.write_batch(1, {READS: reads(range(10))})
    race.arm(lambda: b.write_batch(1, {READS: reads(range(15, 25))}))
    # a1 has read the table's snapshot when a2 commits 15..24 on the store: a1's commit of
    # 10..19 fails the store's conditional create, and its merge again skips 15..19.
    a.write_batch(2, {READS: reads(range(10, 20))})
    assert race.action is None
    assert a.take_merge_counts() == (1, 5)
    ids = ids_of(read_table_arrow(tables, READS))
    assert sorted(ids) == sorted(ids_of(reads(range(25))))
    for engine in ("deltalake", "polars", "duckdb"):
        record = read_elsewhere(engine, tables, tmp_path / engine)
        assert once(record) == 25, (engine, record)


def test_a_claimed_optimize_and_a_vacuum_on_the_store_beside_a_landing_member_keep_each_read_once(
    tables, tmp_path
):
    a = member(tables, APP_A, "fxgate-env-a-a1")
    b = member(tables, APP_B, "fxgate-env-a-a2")
    for batch in range(1, 4):
        a.write_batch(batch, {READS: reads(range(10 * batch, 10 * batch + 10))})
    # b lands (overlapping a's last batch) between a1's claim and its OPTIMIZE.
    hook = once_at(CLAIMED_BEFORE_OPTIMIZE, lambda: b.write_batch(1, {READS: reads(range(35, 50))}))
    maintainer = DeltaMaintainer(
        tables, claim="fxgate-env-a-a1", checkpoint=hook, vacuum_retention_hours=0
    )
    result = maintainer.run(NOW)
    assert hook.action is None
    # a1's three files compacted into one (b's, committed after the claim's snapshot, not
    # among them), the three deleted by the VACUUM that follows (no retention here).
    assert (result.files_compacted, result.files_vacuumed) == (3, 3), result.summary()
    ids = ids_of(read_table_arrow(tables, READS))
    assert sorted(ids) == sorted(ids_of(reads(range(10, 50))))
    # A second pass compacts what the first left and VACUUM deletes the replaced blobs.
    DeltaMaintainer(tables, claim="fxgate-env-a-a1", vacuum_retention_hours=0).run(NOW)
    assert len(data_blobs(tables)) == 1
    for engine in ("deltalake", "polars", "duckdb"):
        record = read_elsewhere(engine, tables, tmp_path / engine)
        assert once(record) == 40, (engine, record)


def test_readers_of_a_table_only_spark_reaches_are_told_so():
    from spark.tables import TablesNotReadable

    with pytest.raises(TablesNotReadable, match="only Spark"):
        count_rows("hdfs://namenode/fxgate", READS)


def test_a_group_table_on_the_store_refuses_a_gateway_alone_and_another_group(tables):
    from spark.tables import GROUP_OF, TablesOfAnotherGroup, check_group

    member(tables, APP_A, "fxgate-env-a-a1").write_batch(1, {READS: reads(range(5))})
    assert check_group(tables, "fxgate-env-a") == []
    with pytest.raises(TablesOfAnotherGroup, match="fxgate-env-a"):
        check_group(tables, None)
    with pytest.raises(TablesOfAnotherGroup, match="each environment's group"):
        check_group(tables, "fxgate-env-b")
    from deltalake import DeltaTable

    assert DeltaTable(table_path(tables, READS)).metadata().configuration[GROUP_OF] == (
        "fxgate-env-a"
    )


# The variable of each store's client request timeout (object_store's `timeout`, 30 s unless
# set): short here, so that a request the store never answers fails within the test.
CLIENT_TIMEOUT = {"azurite": "AZURE_TIMEOUT", "seaweedfs": "AWS_TIMEOUT"}


def test_a_store_that_stalls_or_loses_a_commits_reply_gets_each_batch_once(
    store, tables, monkeypatch
):
    """Through a fault proxy in front of the store: a stall (connections open, nothing passes)
    holds a batch's write until it ends, then the batch lands; a commit the store made but
    whose reply is lost fails the write, and the writer's retry finds the batch in (its
    transaction id) and writes nothing."""
    import threading

    from tests.harness.proxy import FaultProxy

    with FaultProxy(store.host, store.port) as proxy:
        for name, value in store.environment(proxy.port).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(CLIENT_TIMEOUT[store.kind], "2s")
        ArrowTableWriter(None, tables, APP).write_batch(1, {READS: reads(range(10))})

        proxy.stall()
        outcome: list[object] = []
        writing = threading.Thread(
            target=lambda: outcome.append(_attempt(tables, 2, range(10, 20))), daemon=True
        )
        writing.start()
        writing.join(3.0)
        assert writing.is_alive(), outcome  # nothing passes the proxy: it cannot be done
        proxy.resume()
        writing.join(120)
        assert not writing.is_alive()
        if outcome != [{READS: 10}]:  # it failed (its requests timed out): the retry lands it
            assert isinstance(outcome[0], OSError), outcome
            assert _attempt(tables, 2, range(10, 20)) == {READS: 10}

        def lose_the_commits_reply(name: str) -> None:
            if name == LANDED_NOT_COMMITTED:
                proxy.lose_reply_to(b"PUT ", b"/_delta_log/0", b".json ")

        losing = ArrowTableWriter(None, tables, APP, checkpoint=lose_the_commits_reply)
        with pytest.raises(OSError):
            losing.write_batch(3, {READS: reads(range(20, 30))})
        assert proxy.wait_for_lost_reply(0)
        retry = ArrowTableWriter(None, tables, APP)
        assert retry.last_version(READS) == 3  # the store made the commit
        retry.write_batch(3, {READS: reads(range(20, 30))})
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    assert sorted(ids_of(read_table_arrow(tables, READS))) == sorted(ids_of(reads(range(30))))


# What a throttling store answers: Azure's and S3's "slow down" is a 503, and the store closes.
BUSY = (
    b"HTTP/1.1 503 Server Busy\r\nContent-Length: 0\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
)


def test_a_throttling_store_is_waited_out_and_the_batch_lands_once(store, tables, monkeypatch):
    """A store answering every request with 503 (through a fault proxy): the client retries on
    its own backoff, and the batch lands once the store serves again."""
    import threading

    from tests.harness.proxy import FaultProxy

    with FaultProxy(store.host, store.port) as proxy:
        for name, value in store.environment(proxy.port).items():
            monkeypatch.setenv(name, value)
        ArrowTableWriter(None, tables, APP).write_batch(1, {READS: reads(range(10))})
        proxy.reply_instead(BUSY)
        outcome: list[object] = []
        writing = threading.Thread(
            target=lambda: outcome.append(_attempt(tables, 2, range(10, 20))), daemon=True
        )
        writing.start()
        assert proxy.wait_for_replies_instead(3, 60), outcome  # refused, and asked again
        proxy.resume()
        writing.join(180)
        assert outcome == [{READS: 10}]
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    assert sorted(ids_of(read_table_arrow(tables, READS))) == sorted(ids_of(reads(range(20))))


def _attempt(tables: str, batch: int, ids: range) -> dict | OSError:
    """One attempt at writing `batch` (a writer as the writer actor makes after a restart)."""
    try:
        return ArrowTableWriter(None, tables, APP).write_batch(batch, {READS: reads(ids)})
    except OSError as error:
        return error
