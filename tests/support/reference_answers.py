"""Answers worked out the slow, obvious way for the queries to be held to, and traces
changed as a Collector's processors would change them."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path


def brute_force_lru(stream: list[tuple[str, int]], capacity: float) -> float:
    cache: OrderedDict[str, int] = OrderedDict()
    size = hits = 0
    for key, size_of in stream:
        if key in cache:
            hits += 1
            cache.move_to_end(key)
            continue
        cache[key] = size_of
        size += size_of
        while size > capacity:
            size -= cache.popitem(last=False)[1]
    return hits / len(stream)


def tag_fetches(trace_dir: Path, attribute: str, value_of_request: dict[str, str]) -> None:
    """Add a span attribute as a Collector's attributes processor would."""
    for path in trace_dir.glob("*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            data = json.loads(line)
            for rs in data["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        request = next(
                            (a["value"]["stringValue"] for a in span["attributes"] if a["key"].endswith("request.id")),
                            None,
                        )
                        if request in value_of_request:
                            value = {"stringValue": value_of_request[request]}
                            span["attributes"].append({"key": attribute, "value": value})
            lines.append(json.dumps(data))
        path.write_text("\n".join(lines) + "\n")
