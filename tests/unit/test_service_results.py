"""A service's log line says what its pass did in words, never a dataclass repr."""

from __future__ import annotations

from rota.archive import ArchiveResult
from rota.reaper import ReapResult
from rota.scheduler import SchedulerResult


def test_each_result_reads_as_a_sentence() -> None:
    assert str(ArchiveResult(done=14, failed=2, batches=3, deleted=5)) == (
        "archived 14 done and 2 failed/dead jobs; deleted 5 archived jobs"
    )
    assert str(ArchiveResult(done=1, batches=2, keys=7)) == (
        "archived 1 done and 0 failed/dead jobs; deleted 0 archived jobs and 7 expired unique keys"
    )
    assert str(ArchiveResult(done=1000, batches=100, capped=True)).endswith("; more waiting")
    assert str(ReapResult(requeued=[1, 2], dead=[3])) == (
        "3 expired lease(s): 2 job(s) ready again, 1 dead, 0 cancelled"
    )
    assert str(SchedulerResult(schedules=2, enqueued=1, missed=3)) == (
        "2 due schedule(s): 1 job(s) enqueued, 3 slot(s) missed, 0 skipped"
    )
    for result in (ArchiveResult(), ReapResult(), SchedulerResult(capped=True)):
        assert "Result(" not in str(result)
