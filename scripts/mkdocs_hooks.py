"""MkDocs hooks (mkdocs.yml `hooks:`): pages whose content is generated from the code.

A page that holds CLI_REFERENCE gets the command line's reference there,
written from the parser at build time (rota.cli.reference), so it cannot drift.
"""

from __future__ import annotations

from typing import Any

from rota.cli import reference

CLI_REFERENCE = "<!-- generated: the command line reference (rota.cli.reference) -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if CLI_REFERENCE in markdown:
        return markdown.replace(CLI_REFERENCE, reference.markdown())
    return markdown
