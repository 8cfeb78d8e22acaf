"""The page scanner's machine code: where numba keeps it, whether it is built, and building it.

numba compiles the page scanner (`kvaudit.read.page_scan` and the modules it calls into)
on first use, about a minute on two cores, and keeps the machine code on disk. kvaudit
keeps it in a user cache directory ($KVAUDIT_CACHE_DIR, else $XDG_CACHE_HOME/kvaudit,
else ~/.cache/kvaudit; numba's own NUMBA_CACHE_DIR wins where set) rather than beside
the installed package, which may be read-only or thrown away with its container. An
image builds it ahead of time with `python -m kvaudit.read.scanner_cache` (`make
install` does), with the same cache directory set at build and at run time.

A read that finds it unbuilt does not wait: it starts the build in a process of its own
(one at a time, under a lock), says so once on stderr, and reads with msgspec meanwhile;
reads after the build has marked it done use the scanner. The mark names numba's
version and the scanner's sources, and so does the directory of the machine code
(`numba_code_dir`): upgrading either builds again. This module imports neither numba
nor the scanner: `kvaudit --version` asks it cheaply.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Final

# The page scanner's compiled modules: its JSON primitives, its OTLP grammar, its driver.
SCANNER_MODULES: Final = ("kvaudit.read.scan_json", "kvaudit.read.scan_otlp", "kvaudit.read.page_scan")
_announced = False


def cache_dir() -> Path:
    """Where kvaudit keeps the page scanner's machine code and its marks."""
    if os.environ.get("KVAUDIT_CACHE_DIR"):
        return Path(os.environ["KVAUDIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvaudit"


def numba_cache_dir() -> str:
    """The directory numba is to cache compiled functions in (for `numba.config.CACHE_DIR`)."""
    return os.environ.get("NUMBA_CACHE_DIR") or str(cache_dir() / "numba")


def numba_code_dir() -> str:
    """Where numba keeps the scanner's machine code: in `numba_cache_dir()`, a directory per
    version of numba and of the scanner's sources. numba checks a function's cached code
    against the function's own file only, not the files of the functions it calls, and the
    scanner's functions call across its modules: a change to any of them builds them all."""
    return os.path.join(numba_cache_dir(), _fingerprint() or "")


def state() -> str:
    """`built`, `building`, `failed` (see the log), `not built`, or `unavailable` (no numba here)."""
    fingerprint = _fingerprint()
    if fingerprint is None:
        return "unavailable"
    directory = cache_dir()
    if (directory / f"page-scan-{fingerprint}.built").exists():
        return "built"
    if (directory / f"page-scan-{fingerprint}.failed").exists():
        return "failed"
    return "building" if _locked(directory) else "not built"


def describe() -> str:
    """One line for `kvaudit --version`."""
    status = state()
    where = cache_dir()
    if status == "built":
        return f"page scanner: built ({where})"
    if status == "unavailable":
        return "page scanner: needs numba (pip install 'kvaudit[analysis]')"
    if status == "failed":
        return f"page scanner: its build failed (see {where / 'page-scan.log'}); reads use msgspec"
    return f"page scanner: {status} (python -m {__name__} builds it into {where})"


def ready_or_building() -> bool:
    """True when the scanner is built; else start its build in the background (once) and return False."""
    status = state()
    if status == "built":
        return True
    if status == "not built":
        _start_build()
    global _announced
    if not _announced and status in ("not built", "building"):
        _announced = True
        print(
            "kvaudit: compiling the page scanner in the background (once after an install, about a minute);"
            " reading with the slower decoder meanwhile",
            file=sys.stderr,
            flush=True,
        )
    return False


def _fingerprint() -> str | None:
    """numba's version and each scanner source's path, size and time, as numba's cache index keys one."""
    try:
        version = metadata.version("numba")
    except metadata.PackageNotFoundError:
        return None
    key = version
    for module in SCANNER_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            return None
        source = os.stat(spec.origin)
        key += f"\0{spec.origin}\0{source.st_size}\0{source.st_mtime_ns}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _locked(directory: Path) -> bool:
    """Whether a build holds the lock now."""
    try:
        with open(directory / "page-scan.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _start_build() -> None:
    """Run `python -m kvaudit.read.scanner_cache` detached: it outlives the command that started it."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        log = open(directory / "page-scan.log", "ab")  # noqa: SIM115 - handed to the child
    except OSError:
        return  # nowhere to keep it: reads stay on msgspec
    with log:
        subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def build() -> int:
    """Build the scanner's machine code now (or find it built) and mark it; the exit status."""
    fingerprint = _fingerprint()
    if fingerprint is None:
        print(describe(), file=sys.stderr)
        return 2
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    built = directory / f"page-scan-{fingerprint}.built"
    with open(directory / "page-scan.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a second finds the first's mark
        if built.exists():
            return 0
        try:
            from kvaudit.read.reader import page_scanner

            page_scanner().compile()
        except Exception as exc:  # any failure leaves reads on msgspec, named in the log
            (directory / f"page-scan-{fingerprint}.failed").write_text(f"{type(exc).__name__}: {exc}\n")
            print(f"kvaudit: building the page scanner failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 3
        built.write_text("")
    print(describe())
    return 0


if __name__ == "__main__":
    sys.exit(build())
