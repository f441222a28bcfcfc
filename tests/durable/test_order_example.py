"""The worked example of docs/durable-jobs.md runs as written: an order shipped,
an order whose warehouse never answered (refunded and released, each once), and
an order whose card was declined (stock released, the job failed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import rota
from rota.durable import wake_due
from rota.handlers import Handler
from tests.durable.helpers import later, running, until_status

PAGE = Path(__file__).parents[2] / "docs" / "durable-jobs.md"
MARK = "<!-- tested: tests/durable/test_order_example.py -->"


def _example() -> dict[str, Handler]:
    """The page's example, run as a module of its own: its handlers, by type."""
    text = PAGE.read_text()
    code = re.search(re.escape(MARK) + r"\n```python\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)
    assert code, "the example block is gone from the page"
    scope: dict[str, Any] = {"__name__": "order_example"}
    exec(compile(code.group(1), str(PAGE), "exec"), scope)
    func = scope["place_order"]
    return {"order.place": Handler("order.place", func, is_async=False, wants_context=True)}


def _order(n: int, card: str = "4242") -> dict[str, Any]:
    return {"id": n, "sku": "A-1", "quantity": 2, "card": card, "amount": 30}


def _steps(conn: Any, job_id: int) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM rota.job_step WHERE job_id = %s ORDER BY finished_at, name", (job_id,)
    ).fetchall()
    return [r["name"] for r in rows]


def test_the_order_example_ships_times_out_and_compensates(conn, db_url) -> None:
    shipped = rota.enqueue(conn, "order.place", _order(1017))
    late = rota.enqueue(conn, "order.place", _order(1018))
    declined = rota.enqueue(conn, "order.place", _order(1019, card="declined"))
    with running(db_url, _example(), concurrency=2):
        until_status(conn, shipped, "waiting")
        until_status(conn, late, "waiting")
        failed = until_status(conn, declined, "failed")
        conn.execute("""SELECT rota.emit('warehouse:shipped:1017', '{"tracking": "1Z999"}')""")
        done = until_status(conn, shipped, "done")
        assert wake_due(db_url, now=later(conn, 2 * 86400 + 1)) == [late]
        cancelled = until_status(conn, late, "done")
    assert done["result"] == {"status": "shipped", "tracking": "1Z999"}
    assert _steps(conn, shipped) == ["reserve", "charge"]
    assert cancelled["result"]["status"] == "cancelled"
    assert _steps(conn, late) == ["reserve", "charge", "refund", "release"]
    assert "card declined; stock released" in failed["last_error"]
    assert _steps(conn, declined) == ["reserve", "release"]
