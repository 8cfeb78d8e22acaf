"""The `kvaudit` command line: one subcommand per module of `kvaudit.commands` (`SUMMARIES` lists them).

Each command module exposes `register(subparsers)`, which adds its parser and sets
`run` (a callable taking the parsed arguments and returning an exit status). A command
module imports what its command runs inside `run`: parsing (`kvaudit --help`) loads no
query engine, and works on the serving-side install (tests/package/test_install.py holds both). What the
statuses mean is `kvaudit.commands.exit_status` (docs/operations.md, "Exit codes"),
told apart by the exception's type (`kvaudit.errors`): bad input (`InputError`, or a
library that a command needs and the install lacks, with the extra that brings it) is
one line and 2; anything else, kvaudit's `InternalError` as any exception outside the
family, is a bug: one line and 3 (its traceback with `--debug` or KVAUDIT_DEBUG=1);
Ctrl-C 130, and a reader of stdout that went away (`| head`) ends the command quietly
with 141, as the shell reports a command killed by SIGPIPE.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import logging
import os
import select
import struct
import sys
import termios
import traceback
from collections.abc import Sequence

from kvaudit.commands import SUMMARIES
from kvaudit.commands.exit_status import ExitStatus
from kvaudit.commands.version import VersionAction
from kvaudit.errors import InputError
from kvaudit.safe_text import visible

DEBUG_VARIABLE = "KVAUDIT_DEBUG"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with `argv`, only the parser of the command it names is built.

    The others stand as their one line of `kvaudit.commands.SUMMARIES`: `kvaudit --help`
    and each command start without importing every command module.
    """
    parser = argparse.ArgumentParser(
        prog="kvaudit",
        description="Observability and cache audit for shared KV caching across LLM serving replicas.",
        epilog='Example: kvaudit sql traces/ "SELECT replica, op, count(*) FROM pages GROUP BY ALL"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument(
        "--debug", action="store_true", help=f"show the traceback of an internal error (or set {DEBUG_VARIABLE}=1)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = None if argv is None else next((arg for arg in argv if not arg.startswith("-")), "")
    for name, summary in SUMMARIES.items():
        if named is None or name == named:
            importlib.import_module(f"kvaudit.commands.{name}").register(subparsers)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


class _VisibleFormatter(logging.Formatter):
    """Log lines with control characters escaped: a message may quote a trace or a rule file."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def main(argv: Sequence[str] | None = None) -> int:
    handler = logging.StreamHandler()
    handler.setFormatter(_VisibleFormatter("kvaudit: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    arguments = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(arguments).parse_args(arguments)
    try:
        status = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here at the latest, not at interpreter exit
        if _reader_left():
            raise BrokenPipeError
        return status
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:
        _discard_stdout()
        return ExitStatus.BROKEN_PIPE
    except InputError as exc:
        print(f"kvaudit {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return ExitStatus.BAD_INPUT
    except Exception as exc:
        from kvaudit.commands.extras import extra_providing  # reads the installed metadata: only when needed

        extra = extra_providing(exc.name or "") if isinstance(exc, ModuleNotFoundError) else None
        if extra is not None:
            print(
                f"kvaudit {args.command}: needs {exc.name}, which this install lacks: pip install 'kvaudit[{extra}]'",
                file=sys.stderr,
            )
            return ExitStatus.BAD_INPUT
        if args.debug or os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
            traceback.print_exc()
        print(
            f"kvaudit {args.command}: internal error: {type(exc).__name__}: {_one_line(exc)}"
            f" (a bug in kvaudit; {DEBUG_VARIABLE}=1 shows the traceback)",
            file=sys.stderr,
        )
        return ExitStatus.INTERNAL_ERROR


def _reader_left() -> bool:
    """Whether stdout is a pipe whose reader went away before reading all that was written.

    A large write that the reader leaves halfway through returns what it wrote and raises
    nothing (CPython's buffered writer; Rich writes a table in one piece): the pipe itself
    still says so. A reader that read everything and then left (`| head -1` of one line)
    is no closed pipe, as for any program whose writes all succeeded.
    """
    try:
        descriptor = sys.stdout.fileno()
        poller = select.poll()
        poller.register(descriptor, select.POLLOUT)
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return False
        [unread] = struct.unpack("i", fcntl.ioctl(descriptor, termios.FIONREAD, b"\0\0\0\0"))
        return unread > 0
    except (AttributeError, OSError, ValueError):  # no descriptor (a test's stream), no poll() or FIONREAD
        return False


def _discard_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for a reader that left is dropped
    without another error at exit (what Python's documentation of SIGPIPE recommends)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _one_line(exc: BaseException) -> str:
    return visible(" ".join((str(exc).strip() or type(exc).__name__).split()))


if __name__ == "__main__":
    sys.exit(main())
