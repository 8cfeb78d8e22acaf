"""The audit a partition at a time: one UTC day of fetched pages (or a key-hash bucket of one), in bounded memory.

The whole audit (`audit.run_audit`) joins every fetched page to the producer of its key
in one statement, so its memory grows with the traces: at a fleet's 1.8 billion page
descriptors a day, the producers' hash table alone does not fit one node. Here the
rules over fetched pages (`audit.page_rules`) run once per partition of the fetches: a
UTC day, split into buckets of `md5_number_upper(key)` (a hash every engine computes
alike) when the day holds more fetched pages than `rows_per_partition`. Each partition
runs the auditor's own statement with `pages` standing for the partition's rows
(`audit.audit_query(pages=...)`): its fetched pages, and the stores of the keys it
fetched within `lookback_s` of its day on either side, so a fetch whose producer
stored the day before finds it. The rules themselves do not change.

- Memory follows one partition (its fetched keys and their producers), not the traces.
- Partitions are independent: a cluster runs them in parallel (`kvaudit audit --by-day
  --list-partitions`, then `--partition P` for each), on every backend the auditor runs on.
- The rules over the traces as a whole (`audit.trace_rules`: KVA007, over spans and
  unreadable lines) run once (`TRACES`), not per partition.

The answers are the whole audit's whenever the earliest store of each fetched key, if
any, lies within `lookback_s` of the fetch's day (a producer further back is outside the
window, as if the traces began there); `lookback_s` is at least the clock skew allowed.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Final

from kvaudit.analyse.audit import Finding, audit_statements, findings, page_rules, prepare, sort_key, trace_rules
from kvaudit.backends import Source, as_backend
from kvaudit.contract import Op
from kvaudit.durations import DAY_NS
from kvaudit.errors import BadValueError

LOOKBACK_S: Final = 86_400.0
# Fetched pages per partition: the audit's peak memory grows with the rows of a partition, not
# with the whole traces, and this many keeps it within a few GiB on every backend (docs/scale.md).
ROWS_PER_PARTITION: Final = 2_000_000
TRACES: Final = "traces"  # the partition name of the rules over the traces as a whole
_EPOCH: Final = dt.date(1970, 1, 1)


@dataclass(frozen=True, order=True)
class Partition:
    """The fetched pages of one UTC day whose key hashes to `bucket` of `buckets` (a NULL key to bucket 0)."""

    day: dt.date
    bucket: int = 0
    buckets: int = 1

    def __str__(self) -> str:
        return self.day.isoformat() if self.buckets == 1 else f"{self.day.isoformat()}:{self.bucket}/{self.buckets}"

    @classmethod
    def parse(cls, text: str) -> Partition:
        """The partition `str()` names: `2026-12-01` or `2026-12-01:3/8`.

        Raises:
            BadValueError: not such a name.
        """
        day, _, bucket = text.partition(":")
        try:
            if not bucket:
                return cls(dt.date.fromisoformat(day))
            number, _, count = bucket.partition("/")
            partition = cls(dt.date.fromisoformat(day), int(number), int(count))
        except ValueError:
            raise BadValueError(f"{text!r}: not a partition (DAY or DAY:BUCKET/BUCKETS, e.g. 2026-12-01:3/8)") from None
        if not 0 <= partition.bucket < partition.buckets:
            raise BadValueError(f"{text!r}: bucket {partition.bucket} is not one of 0..{partition.buckets - 1}")
        return partition

    @property
    def start_ns(self) -> int:
        return (self.day - _EPOCH).days * DAY_NS

    def pages(self, lookback_s: float) -> str:
        """kvaudit SQL of the partition's rows of `pages`: its fetched pages, and the stores of their keys
        within `lookback_s` of its day on either side."""
        start, end = self.start_ns, self.start_ns + DAY_NS
        lookback = math.ceil(lookback_s * 1e9)
        fetched = f"op = '{Op.FETCH}' AND time_ns >= {start} AND time_ns < {end}"
        if self.buckets > 1:
            fetched += f" AND coalesce(md5_number_upper(key) % {self.buckets}, 0) = {self.bucket}"
        # Two branches, so that a reader of fetched pages only (the lineage) rules the stores out by
        # their `op` alone, without the semi-join that bounds them.
        return (
            f"SELECT * FROM pages WHERE {fetched} UNION ALL SELECT * FROM pages WHERE op = '{Op.STORE}'"
            f" AND time_ns >= {start - lookback} AND time_ns < {end + lookback}"
            f" AND key IN (SELECT key FROM pages WHERE {fetched})"
        )


def plan(source: Source, *, rows_per_partition: int = ROWS_PER_PARTITION) -> list[Partition]:
    """The partitions of the fetched pages: each UTC day holding any, in as many buckets as keep each
    partition within `rows_per_partition` fetched pages (if the keys spread evenly, as hashes do)."""
    _, rows = as_backend(source).query(
        f"SELECT time_ns - time_ns % {DAY_NS} AS day_ns, count(*) AS fetched FROM pages"
        f" WHERE op = '{Op.FETCH}' GROUP BY day_ns ORDER BY day_ns"
    )
    partitions = []
    for day_ns, fetched in rows:
        day = _EPOCH + dt.timedelta(days=int(day_ns) // DAY_NS)
        buckets = max(1, math.ceil(int(fetched) / rows_per_partition))
        partitions += [Partition(day, bucket, buckets) for bucket in range(buckets)]
    return partitions


def audit_partition(
    source: Source, partition: Partition | str, *, skew_s: float = 1.0, lookback_s: float = LOOKBACK_S
) -> list[Finding]:
    """The findings of one partition: the page rules over its fetched pages, or (`TRACES`) the trace rules.

    Args:
        partition: a `Partition` (or its name), or `TRACES`.
        skew_s: clock skew allowed when deciding that a store preceded a fetch.
        lookback_s: how far either side of its day a partition looks for the stores of its
            keys (at least `skew_s`).
    """
    backend = as_backend(source)
    prepare(backend)
    if partition == TRACES:
        return findings(backend, audit_statements(backend, trace_rules()), skew_s=skew_s)
    if isinstance(partition, str):
        partition = Partition.parse(partition)
    statements = audit_statements(backend, page_rules(), pages=partition.pages(max(lookback_s, skew_s)))
    return findings(backend, statements, skew_s=skew_s)


def run_audit_by_partition(
    source: Source,
    *,
    skew_s: float = 1.0,
    lookback_s: float = LOOKBACK_S,
    rows_per_partition: int = ROWS_PER_PARTITION,
) -> list[Finding]:
    """Every finding of every rule, as `audit.run_audit` gives them, a partition at a time (see the module)."""
    backend = as_backend(source)
    found = audit_partition(backend, TRACES, skew_s=skew_s)
    for partition in plan(backend, rows_per_partition=rows_per_partition):
        found += audit_partition(backend, partition, skew_s=skew_s, lookback_s=lookback_s)
    return sorted(found, key=sort_key)
