"""Scraping `kvaudit exporter` in tests, once it has caught up (a condition, never the clock)."""

from __future__ import annotations

import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .waiting import wait_until

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(port: int) -> Samples:
    """The samples of one scrape: name -> sorted labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as reply:
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def caught_up(server: Any) -> None:
    """Wait until the exporter started by `serve` has read and figured every byte of its files."""
    wait_until(server.metrics.caught_up, what="the exporter read and figured every byte of its traces")


def scrape_caught_up(server: Any, port: int) -> Samples:
    """A scrape once the exporter caught up: it then says it is behind by nothing."""
    caught_up(server)
    samples = scrape(port)
    assert samples["kvaudit_exporter_behind_bytes"] == {(): 0}
    return samples
