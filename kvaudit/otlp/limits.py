"""What a trace line may hold and still be read: the limits every reader and the receiver share.

The readers (kvaudit.read) name and skip a line past any of these; the receiver
(kvaudit.receive) applies the same ones to each span before it answers, so that what
it acknowledges is what the readers read (docs/operations.md lists them).
"""

from __future__ import annotations

import os
from typing import Final

from kvaudit.contract import SCHEMA_VERSION

# The longest line (or pretty-printed document) read; a longer one is named and skipped
# unread, so that one line cannot take a reader's memory. kvaudit's writers rotate at this size.
MAX_LINE_BYTES: Final = int(os.environ.get("KVAUDIT_MAX_LINE_BYTES", 256 * 1024 * 1024))
# How deep arrays and maps may nest in an attribute value.
MAX_NESTING: Final = 32
# Attributes of one span, one event or one resource (the OpenTelemetry SDK's default
# span limit is 128; a page event carries about 30).
MAX_ATTRIBUTES: Final = 1024
# Integers are signed 64-bit; times are signed 64-bit nanoseconds (OTLP's are unsigned).
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
LATEST_TIME: Final = "2262-04-11T23:47:16.854775807Z"
# Ids in bytes (empty: absent, as OTLP allows for a parent).
TRACE_ID_BYTES: Final = 16
SPAN_ID_BYTES: Final = 8

NESTED_TOO_DEEP: Final = f"nested too deeply (an attribute value may nest {MAX_NESTING} arrays or maps)"


def too_many_attributes(count: int, what: str) -> str | None:
    """Why `count` attributes of one `what` (span, event, resource) cannot be read; None if they can."""
    if count > MAX_ATTRIBUTES:
        return f"{count} attributes of one {what}, more than the {MAX_ATTRIBUTES} kvaudit reads"
    return None


def bad_id(size: int, expected: int, name: str) -> str | None:
    """Why an id of `size` bytes cannot stand for `name` (None if it can: `expected` bytes, or none)."""
    if size in (0, expected):
        return None
    return f"bad value: {name} of {size} bytes (ids are {expected} bytes)"


def out_of_range(number: int, time: bool = False) -> str | None:
    """Why `number` cannot be read as an integer (a time when `time`), None if it can."""
    if INT64_MIN <= number <= INT64_MAX:
        return None
    if time and number > 0:
        return f"{number} is after {LATEST_TIME}, the latest time kvaudit reads (signed 64-bit nanoseconds)"
    return f"{number} is out of the signed 64-bit range"


def bad_schema(value: object) -> str | None:
    """Why a resource's `kvaudit.schema` value is one this kvaudit cannot read (None if absent or its own)."""
    if value is None or str(value) == str(SCHEMA_VERSION):
        return None
    return f"unknown kvaudit schema version {str(value)[:40]} (this kvaudit reads {SCHEMA_VERSION})"
