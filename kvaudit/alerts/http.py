"""JSON over HTTP POST with a timeout and retries with exponential backoff."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvaudit.errors import InputError

logger = logging.getLogger(__name__)


class DeliveryError(InputError):
    """A notification that did not get through, after every retry."""


@dataclass
class HttpPoster:
    """POSTs JSON bodies; retries connection failures, timeouts, 429 and 5xx.

    Other 4xx replies are not retried: the receiver understood and refused, and
    sending the same body again would be refused again.

    Args:
        timeout_s: per attempt.
        retries: attempts after the first.
        backoff_s: wait before the first retry, doubled for each further one.
        sleep: how to wait (tests pass a no-op).
    """

    timeout_s: float = 5.0
    retries: int = 3
    backoff_s: float = 0.5
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    @property
    def longest_s(self) -> float:
        """The longest a `post` can take: every attempt timing out, and the waits between them."""
        return (self.retries + 1) * self.timeout_s + self.backoff_s * (2**self.retries - 1)

    def post(self, url: str, body: Any) -> None:
        """Raises DeliveryError when every attempt failed."""
        data = json.dumps(body).encode()
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                request = urllib.request.Request(
                    url, data=data, method="POST", headers={"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                    reply.read()
                return
            except urllib.error.HTTPError as exc:
                reason = f"HTTP {exc.code} {exc.reason}"
                if exc.code != 429 and exc.code < 500:
                    raise DeliveryError(f"{url}: {reason}") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = str(getattr(exc, "reason", exc))
            if attempt < self.retries:
                logger.debug("POST %s failed (%s), retrying in %.3gs", url, reason, delay)
                self.sleep(delay)
                delay *= 2
        raise DeliveryError(f"{url}: {reason} (after {self.retries + 1} attempts)")
