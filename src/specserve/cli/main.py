"""`specserve` command line: one subcommand per module, each exposing add_parser(subparsers).

Errors a user can act on (SpecServeError, bad files, bad flags) print one line to stderr and
exit non-zero; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from .. import __version__
from ..errors import SpecServeError
from .environment import environment_problem
from .streams import StdoutWriteError, closed_stdout, drop_stdout, guarded_stdout, print_or_exit

SUBCOMMANDS = ("generate", "models", "serve", "bench", "edit", "replay")


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: bench's usage alone is 20 lines, which buried the message."""

    def error(self, message: str):
        self.exit(2, f"specserve: error: {message} (see {self.prog} --help)\n")

    def print_help(self, file=None) -> None:
        """--help on stdout, or one line and exit 2 where stdout is closed or refuses writes (argparse
        wrote it to stderr, or nowhere, and exited 0 as if it were where it was asked for)."""
        if file is not None:
            return super().print_help(file)
        print_or_exit(self, self.format_help(), f"{self.prog} --help")


class _Version(argparse.Action):
    """--version: the version on stdout and exit 0, or one line and exit 2 as for --help."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print_or_exit(parser, f"specserve {__version__}\n", "specserve --version")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="specserve",
        description="Lossless speculative decoding: Predicted Outputs, n-gram and draft-model drafting.",
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"specserve.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    with _Interrupts() as interrupts:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help, or a bad flag (already printed): its exit code
            return e.code if isinstance(e.code, int) else 2
        except KeyboardInterrupt:
            return _interrupted()
        if problem := closed_stdout(args.command) or environment_problem():  # before minutes of model loading
            print(f"specserve: error: {problem}", file=sys.stderr)
            return 2
        try:
            with guarded_stdout():
                code = int(args.func(args) or 0)
                if sys.stdout is not None:
                    sys.stdout.flush()  # here, not at exit: a stdout that refuses writes gets its one line
            return code
        except KeyboardInterrupt:
            return _interrupted()
        except Exception as e:
            if interrupts.seen:  # a library swallowed the Ctrl+C, or turned it into another error
                return _interrupted()
            if isinstance(e, BrokenPipeError):  # an OSError: before that check
                return _reader_left()
            if isinstance(e, StdoutWriteError):  # `> /dev/full`: said as stdout's, exit 2 as a closed stdout
                print(f"specserve: error: {e}", file=sys.stderr)
                drop_stdout()
                return 2
            if isinstance(e, SpecServeError | OSError | ValueError):
                print(f"specserve: error: {e}", file=sys.stderr)
                return 2
            raise


class _Interrupts:
    """Notes each Ctrl+C as it arrives, then raises KeyboardInterrupt as Python's own handler does.

    A Ctrl+C during the model load landed in an import inside a library's bare `except:`, which
    swallowed it and left numpy half imported; the load then failed with transformers' "Could not
    import module 'LlamaConfig'", a traceback and exit status 1. Whatever error follows a Ctrl+C
    is now the interruption (exit 130, one line). A SIGINT that was ignored when the command
    started (a script's `cmd &`) stays ignored; the handler before main() is put back after it."""

    def __init__(self) -> None:
        self.seen = False
        self.previous = None

    def _on_sigint(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def __enter__(self) -> _Interrupts:
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self.previous = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread (main() called from a test or an embedding app)
            pass
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None and signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, self.previous)  # not over _exit_on_next_interrupt's


def _interrupted() -> int:
    print("specserve: interrupted", file=sys.stderr)
    _exit_on_next_interrupt()
    return 130


def _reader_left() -> int:
    """stdout's reader went away (`specserve generate ... | head`): stop quietly, as a Unix tool
    killed by SIGPIPE does, with the status a shell gives one (128 + 13).

    It printed "specserve: error: [Errno 32] Broken pipe" and exited 2, and Python's last flush
    of stdout at exit then failed again; stdout now points at /dev/null for that flush.
    """
    drop_stdout()
    return 128 + signal.SIGPIPE


def _exit_on_next_interrupt() -> None:
    """Another Ctrl+C while Python tears down ends the process at once, without a traceback.

    The server's own shutdown (requests, the host tier's files) is over by the time its
    interrupt reaches main(); what is left are atexit hooks and finalizers, where a second
    KeyboardInterrupt (a user pressing twice, or uvicorn re-raising the signals it caught)
    used to print a traceback from weakref.
    """

    def leave(signum, frame):
        sys.stderr.flush()
        os._exit(130)

    try:
        signal.signal(signal.SIGINT, leave)
    except ValueError:  # not the main thread (main() called from a test or an embedding app)
        pass


if __name__ == "__main__":
    sys.exit(main())
