"""Cancelling durable jobs: a parent's children, and theirs, end with it."""

from __future__ import annotations

import rota
from rota import control
from tests.durable.helpers import row


def test_cancelling_parents_by_type_cancels_their_children_too(conn) -> None:
    # As a cancel by id does: a child of a cancelled parent is not left to run.
    waiting, running_parent, other = (rota.enqueue(conn, t) for t in ("p", "p", "q"))
    conn.execute("UPDATE rota.job SET status = 'waiting' WHERE id = %s", (waiting,))
    conn.execute(
        "UPDATE rota.job SET status = 'running', attempts = 1, locked_by = 'w',"
        " locked_until = now() + interval '1 hour' WHERE id = %s",
        (running_parent,),
    )
    child = rota.enqueue(conn, "c")
    grandchild = rota.enqueue(conn, "c")
    of_running = rota.enqueue(conn, "c")
    of_other = rota.enqueue(conn, "c")
    for kid, parent in ((child, waiting), (grandchild, child), (of_running, running_parent),
                        (of_other, other)):  # fmt: skip
        conn.execute("UPDATE rota.job SET parent_id = %s WHERE id = %s", (parent, kid))
    result = control.cancel_matching(conn, "p")
    assert result.ended == sorted([waiting, child, grandchild, of_running])
    assert result.requested == [running_parent]
    assert row(conn, of_other)["status"] == "ready"
