"""The command line page is written from the parser: every command and option is in it."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from rota.cli import build_parser, reference

ROOT = Path(__file__).parents[2]


def hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts/mkdocs_hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_and_option_of_the_parser_is_in_the_reference() -> None:
    parser = build_parser()
    text = reference.markdown(parser)
    found = list(reference.commands(parser))
    assert {" ".join(words) for words, _, _ in found} >= {
        "rota migrate",
        "rota jobs show",
        "rota dead retry",
        "rota schedule add",
        "rota worker",
        "rota demo",
    }
    for words, _, sub in found:
        assert f"## `{' '.join(words)}`" in text
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert f"`{flag}" in text, (words, flag)


def test_the_docs_page_gets_the_reference_at_build_time() -> None:
    module = hooks()
    page = (ROOT / "docs" / "cli.md").read_text()
    assert module.CLI_REFERENCE in page
    built = module.on_page_markdown(page, page=None, config=None, files=None)
    assert module.CLI_REFERENCE not in built
    assert reference.markdown() in built
