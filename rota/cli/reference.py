"""The command line's reference in Markdown, written from the parser itself.

The docs site's command line page is this text (a hook of `make docs` puts it
where the page says), so the reference cannot drift from the commands: a new
option shows up in the docs the moment the parser has it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from rota.cli import build_parser


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("rota",)
) -> Iterator[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """Every command under `parser`, depth first: (words, one-line help, its parser)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, sub in action.choices.items():
            yield (*path, name), helps.get(name, ""), sub
            yield from commands(sub, (*path, name))


def _leaf(parser: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _option(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if not action.option_strings:
        return f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
    if action.nargs == 0:
        return ", ".join(f"`{flag}`" for flag in action.option_strings)
    args = formatter._format_args(action, action.dest.upper())
    return ", ".join(f"`{flag} {args}`" for flag in action.option_strings)


def _meaning(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    text = formatter._expand_help(action) if action.help else ""
    if action.choices is not None and action.metavar is not None:
        text += f" (one of: {', '.join(str(choice) for choice in action.choices)})"
    return _cell(text.strip())


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    """The parser's formatter at a fixed width, so the page is the same on every terminal."""
    return argparse.HelpFormatter(prog=parser.prog, width=_WIDTH)


_WIDTH = 88


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = _formatter(parser)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The reference: a table of every command, then each command's usage and options."""
    parser = parser or build_parser()
    found = list(commands(parser))
    lines = ["| command | what it does |", "| --- | --- |"]
    lines += [f"| [`{' '.join(words)}`](#{_anchor(words)}) | {_cell(h)} |" for words, h, _ in found]
    lines += ["", "## `rota`", "", "Options every command takes, given before it:", ""]
    lines += _options(parser)
    for words, help_text, sub in found:
        lines += ["", f"## `{' '.join(words)}`", ""]
        if help_text:
            lines += [_cell(help_text)[0].upper() + _cell(help_text)[1:] + ".", ""]
        if sub.description:
            lines += [_cell(sub.description), ""]
        lines += ["```text", _usage(sub), "```", ""]
        if _leaf(sub) or len(sub._actions) > 2:
            lines += _options(sub)
    return "\n".join(lines).rstrip() + "\n"


def _anchor(words: tuple[str, ...]) -> str:
    """The anchor MkDocs gives the heading of a command's section."""
    return "-".join(words)


def _options(parser: argparse.ArgumentParser) -> list[str]:
    formatter = _formatter(parser)
    rows = [
        f"| {_option(action, formatter)} | {_meaning(action, formatter)} |"
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        and not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]
    if not rows:
        return ["No options.", ""]
    return ["| argument | meaning |", "| --- | --- |", *rows, ""]
