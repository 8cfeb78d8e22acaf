"""kvaudit's errors: one family, whose two branches the command line tells apart by type.

`InputError`: what kvaudit was given cannot be used (the user's data, flags, files,
rule files, or a server or receiver they pointed it at). `kvaudit` says what in one
line and exits 2. `InternalError`: kvaudit failed on its own; `kvaudit` exits 3, as it
does for any exception outside the family, which can only be a bug (docs/operations.md,
"Exit codes"; docs/architecture.md, "Errors").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class KvauditError(Exception):
    """Every error kvaudit raises on purpose."""


class InputError(KvauditError):
    """Input that cannot be used: the message names it, in one line."""


class BadValueError(InputError, ValueError):
    """A value given in a flag, a spec or a setting that cannot be used.

    Also a ValueError: argparse's `type=` converters and the parsers of values catch it as one.
    """


class InternalError(KvauditError):
    """kvaudit's own failure, whatever its input: a bug to report."""


@contextmanager
def user_files() -> Iterator[None]:
    """Around opening files, directories or addresses the user named: what fails there is bad input.

    An OSError becomes an InputError naming the file and the reason; text that is not
    UTF-8 one too. Kept tight around the opening: an OSError elsewhere is not the
    user's to fix.
    """
    try:
        yield
    except OSError as exc:
        named = exc.filename is not None and exc.strerror
        raise InputError(f"{exc.filename}: {exc.strerror}" if named else str(exc) or type(exc).__name__) from exc
    except UnicodeDecodeError as exc:
        raise InputError(str(exc)) from exc
