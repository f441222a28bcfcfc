"""Log lines as `rota` prints them: one record, one line."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from rota import logs


@pytest.fixture
def printed() -> Iterator[io.StringIO]:
    """What `rota`'s log handler prints, configured as the CLI configures it."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logs.configure()
    out = io.StringIO()
    root.handlers[0].setStream(out)  # type: ignore[attr-defined]
    try:
        yield out
    finally:
        root.handlers[:], root.level = saved
        for name in ("psycopg",):
            logging.getLogger(name).filters.clear()


class BadPipeline:
    def __repr__(self) -> str:
        return "<psycopg.Pipeline [BAD] at 0x7f>"


def test_psycopg_ending_a_pipeline_on_a_lost_connection_adds_no_line(printed) -> None:
    # psycopg notes that ending the pipeline failed while the block's own error
    # (the connection lost) propagates; Rota reports that error itself.
    logging.getLogger("psycopg").warning(
        "error ignored terminating %r: %s", BadPipeline(), "server closed the connection\n\tThis"
    )
    logging.getLogger("psycopg").warning("another warning")
    assert printed.getvalue().splitlines()[-1].endswith("another warning")
    assert "error ignored terminating" not in printed.getvalue()
