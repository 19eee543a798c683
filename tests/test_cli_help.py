"""`specserve COMMAND --help` is where a newcomer looks up an option: each one says what it does,
and one that has a default says what it is (a flag with no help printed only its metavar)."""

from __future__ import annotations

import argparse

from specserve.cli.main import build_parser


def options(parser: argparse.ArgumentParser, name: str = "specserve") -> list[tuple[str, argparse.Action]]:
    """(command, action) of every option of the parser and its subcommands, --help left out."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, inner in action.choices.items():
                found += options(inner, f"{name} {sub}")
        elif action.option_strings and not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            found.append((name, action))
    return found


OPTIONS = options(build_parser())


def shown(action: argparse.Action) -> str:
    """The option's long name, as --help prints it last."""
    return action.option_strings[-1]


def test_every_option_says_what_it_does():
    assert [f"{c} {shown(a)}" for c, a in OPTIONS if not a.help] == []


def has_default(action: argparse.Action) -> bool:
    """A value the option takes when it is not given (an off flag, None and an empty list are none)."""
    off = action.default is None or action.default is False or action.default == argparse.SUPPRESS
    return not off and action.default not in ([], ())  # 0 and 0.0 are defaults (`0 == False`)


def test_every_option_with_a_default_names_it():
    unsaid = [(c, a) for c, a in OPTIONS if has_default(a) and "default" not in (a.help or "")]
    assert [f"{c} {shown(a)} (default {a.default!r})" for c, a in unsaid] == []
