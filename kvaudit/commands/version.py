"""`kvaudit --version`: the version, and whether the page scanner's machine code is built (issue 18)."""

from __future__ import annotations

import argparse

from kvaudit import __version__


class VersionAction(argparse.Action):
    """Print the version and the page scanner's state (asked only when shown: it reads the disk)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="kvaudit's version, and whether its page scanner is built")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from kvaudit.read import scanner_cache

        print(f"kvaudit {__version__}\n{scanner_cache.describe()}")
        parser.exit()
