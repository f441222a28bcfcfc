"""Account for outcomes once written: logs and metrics, and why a write did not hold.

A finish that the database did not take means the worker no longer held the
lease, with one benign exception: the handler completed its own job inside its
own transaction (`rota.complete`), so the row is already done by this worker at
this attempt.
"""

from __future__ import annotations

import logging

from rota import claim as claims
from rota.claim import Finished
from rota.metrics import record_finish
from rota_worker.execute import Ran
from rota_worker.link import Link

log = logging.getLogger("rota.worker")


async def settle_unwritten(link: Link, worker_id: str, unwritten: list[Ran]) -> set[int]:
    """Ids among `unwritten` whose lease was really lost (not self-completed)."""
    if not unwritten:
        return set()
    states = await link.run(claims.states, [r.finish.job_id for r in unwritten])
    lost = set()
    for ran in unwritten:
        row = states.get(ran.finish.job_id)
        self_completed = (
            row is not None
            and row["status"] == "done"
            and row["locked_by"] == worker_id
            and row["attempts"] == ran.finish.attempts
        )
        if not self_completed:
            lost.add(ran.finish.job_id)
    return lost


def record(ran: Ran, written: Finished | None, job_type: str, lost: bool) -> None:
    finish = ran.finish
    if lost:
        log.warning(
            "job %s: lease lost before its outcome (%s) was written; nothing written",
            finish.job_id,
            finish.outcome,
        )
        outcome = "lease_lost"
    elif written is None:
        outcome = "done"  # completed by the handler in its own transaction
    elif finish.outcome == "release":
        outcome = "released"
    elif finish.outcome == "retry":
        outcome = "dead" if written.status == "dead" else "retry"
    else:
        outcome = finish.outcome
    if outcome in ("retry", "dead", "failed"):
        first_line = (finish.error or "").splitlines()[0] if finish.error else ""
        log.warning(
            "job %s (%s) attempt %d: %s: %s",
            finish.job_id,
            job_type,
            finish.attempts,
            outcome,
            first_line,
        )
    else:
        log.debug(
            "job %s (%s): %s in %.3fs", finish.job_id, job_type, outcome, ran.duration_seconds
        )
    record_finish(job_type, outcome, ran.duration_seconds, finish.attempts)
