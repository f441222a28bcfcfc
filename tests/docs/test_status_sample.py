"""docs/observability.md shows `rota status` as it prints: the same columns, and
every key of `--json` named."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from rota import status
from rota.status import LeaseExpirations, QueueStatus, TypeStatus

PAGE = Path(__file__).parents[2] / "docs" / "observability.md"


def section() -> str:
    text = PAGE.read_text()
    return text[text.index("## `rota status`") :].split("\n## ")[0]


def test_the_sample_has_the_columns_rota_status_prints() -> None:
    header = next(line for line in section().splitlines() if line.startswith("TYPE "))
    assert tuple(re.split(r"\s{2,}", header.strip())) == status._COLUMNS


def test_every_json_key_is_named() -> None:
    shown = QueueStatus(
        now=datetime(2030, 3, 14, tzinfo=UTC),
        types={"email": TypeStatus(ready=1)},
        lease_expirations=LeaseExpirations(0, 0, 0, 0),
    ).to_json()
    keys = {*shown, *shown["types"]["email"], "key_index", "warnings"}
    named = set(re.findall(r"`([a-z_]+)`", section()))
    assert keys - named == set()
