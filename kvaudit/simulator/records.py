"""The simulator's ground truth files: one JSON record per line (`ground_truth.jsonl`, `page_truth.jsonl`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import msgspec

Record = TypeVar("Record", bound=msgspec.Struct)


def write_records(path: Path, records: Sequence[msgspec.Struct]) -> None:
    encoder = msgspec.json.Encoder()
    with path.open("wb") as out:
        for record in records:
            out.write(encoder.encode(record) + b"\n")


def read_records(path: Path, kind: type[Record]) -> list[Record]:
    decoder = msgspec.json.Decoder(kind)
    return [decoder.decode(line) for line in path.read_bytes().splitlines() if line]
