"""Waiting in tests: on a condition, never on the clock.

A loaded machine makes everything slower but changes no outcome, so a test waits until what
it expects is so. The timeout only bounds a hang: it is generous, and a wait that reaches it
fails naming what it waited for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Long enough for anything a test waits on at any load, short of the suite's own timeout.
HANG_S = 120.0


def wait_until(predicate: Callable[[], T], *, timeout: float = HANG_S, what: str, interval: float = 0.05) -> T:
    """Call `predicate` until it returns something true, and return that.

    Raises:
        AssertionError: `predicate` was still false after `timeout` seconds (`what` did not happen).
    """
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout:g} s")
        time.sleep(interval)
    return result


async def until(
    predicate: Callable[[], T], *, timeout: float = HANG_S, what: str = "the app caught up", interval: float = 0.05
) -> T:
    """`wait_until` in an event loop, yielding to it between calls (a Textual app reads and
    redraws in the same loop as the test's pilot)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (result := predicate()):
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not so after {timeout:g} s")
        await asyncio.sleep(interval)
    return result
