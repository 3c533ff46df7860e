from persistence.compaction_request import (
    done,
    pending_compaction_requests,
    write_compaction_request,
)


def test_a_request_is_pending_from_its_rename_until_the_pass_that_ran_for_it_is_done(tmp_path):
    assert pending_compaction_requests(tmp_path) == []
    first = write_compaction_request(tmp_path)
    second = write_compaction_request(tmp_path)
    assert pending_compaction_requests(tmp_path) == sorted([first, second])
    # A half-written request (its hidden temporary name) is never taken.
    (tmp_path / "compact" / ".abc.tmp").write_text("{")
    done([first])
    assert pending_compaction_requests(tmp_path) == [second]
