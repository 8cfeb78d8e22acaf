"""Which requests the hooks record: all of them, or a share chosen by request id.

A replica that records a share of its requests (docs/design.md section 3.10) chooses
each request by its engine request id, in every layer and process alike: vLLM's
scheduler and workers and LMCache's hook all see vLLM's internal request id, so a
request is recorded by every layer or by none, and the layers' spans still join. The
choice is a hash of the id against the rate, not a random draw, so nothing has to travel
between the processes for them to agree. The guard judges every request's pages,
recorded or not.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final

# Chooses a request by its id: True where it is recorded. An unknown id (None) is.
RequestSampler = Callable[[str | None], bool]

_SPAN: Final = 1 << 32  # zlib.crc32's range


def sample_rate(value: object, where: str) -> float:
    """`value` as a share of requests to record, 0 to 1; ValueError naming `where` otherwise."""
    refusal = f"kvaudit {where} must be a number from 0 to 1, not {value!r}"
    try:
        rate = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(refusal) from None
    if not 0.0 <= rate <= 1.0:  # NaN fails this too
        raise ValueError(refusal)
    return rate


def request_sampler(rate: float) -> RequestSampler | None:
    """The sampler of `rate`; None where every request is recorded (rate 1), so that the
    serving threads test for None and make no call."""
    if rate >= 1.0:
        return None
    threshold = int(rate * _SPAN)

    def chosen(request_id: str | None) -> bool:
        # crc32: in C, and the same in every process and Python version (`hash` of a str is not).
        return request_id is None or zlib.crc32(request_id.encode()) < threshold

    return chosen
