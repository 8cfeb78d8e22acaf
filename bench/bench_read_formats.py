"""Read throughput by the form trace files come in, side by side in one run (issues 17 and 18).

The same page descriptors, read by `TraceStore` (as `kvaudit sql` reads them) from:
- compact OTLP JSON lines (the baseline: what kvaudit and the Collector write);
- the same lines written with a space after every separator (any `json.dumps`-style writer);
- each line a pretty-printed document (`indent=2`, as saved request bodies are);
- the compact lines gzip'd, and zstd'd (the Collector's `compression` option);
- many small files (a few lines each, as many replicas' short files are) beside one file
  holding the same bytes.

Each form runs KVAUDIT_BENCH_READ_REPEAT times (default 3), its fastest run reported, in
wall and CPU seconds (this process's threads). Sizes: KVAUDIT_BENCH_FORMATS_PAGES
(default 100,000 descriptors per form), KVAUDIT_BENCH_SMALL_FILE_LINES (lines per small
file, default 4).
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.bench_read import _store, _timed, _write
from bench.common import KV, env_int, machine, page, report
from kvaudit.contract import Hook, Op, Outcome
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.reader import page_scanner
from kvaudit.read.sources import zstd

PAGES_PER_SMALL_SPAN = 8  # a short request's fetch: a line per span, a few lines per file


def _lines_rewritten(source: Path, target: Path, rewrite: Callable[[bytes], bytes]) -> None:
    with source.open("rb") as lines, target.open("wb") as out:
        for line in lines:
            out.write(rewrite(line))


def _spaced(line: bytes) -> bytes:
    return json.dumps(json.loads(line)).encode() + b"\n"


def _document(line: bytes) -> bytes:
    return json.dumps(json.loads(line), indent=2).encode() + b"\n"


def _compressed(source: Path, target: Path, compress: Callable[[bytes], bytes]) -> None:
    target.write_bytes(compress(source.read_bytes()))


def _small_lines(path: Path, descriptors: int) -> list[bytes]:
    """Lines of one span of PAGES_PER_SMALL_SPAN descriptors each, from the real emitter:
    one line written, the rest that line with its request id changed."""
    emitter = setup_emitter("r1", f"file:{path}", engine="vllm", kv=KV)
    with emitter.operation(Op.FETCH, hook=Hook.SIMULATOR, request_id="q-template") as op:
        for n in range(PAGES_PER_SMALL_SPAN):
            op.add_page(page(n))
        op.end(Outcome.HIT)
    emitter.shutdown()
    [template] = path.read_bytes().splitlines(keepends=True)
    return [template.replace(b'"q-template"', f'"q{n}"'.encode()) for n in range(descriptors // PAGES_PER_SMALL_SPAN)]


def _forms(tmp: Path, descriptors: int) -> dict[str, Path]:
    compact = tmp / "compact.jsonl"
    _write(compact, descriptors)
    forms = {"compact lines (baseline)": compact}
    for name, rewrite in (("spaced lines (json.dumps)", _spaced), ("pretty-printed documents", _document)):
        forms[name] = tmp / f"{name.split()[0]}.json"
        _lines_rewritten(compact, forms[name], rewrite)
    forms["gzip (level 6)"] = tmp / "compact.jsonl.gz"
    _compressed(compact, forms["gzip (level 6)"], lambda text: gzip.compress(text, compresslevel=6))
    forms["zstd (level 3)"] = tmp / "compact.jsonl.zst"
    _compressed(compact, forms["zstd (level 3)"], lambda text: zstd.compress(text, level=3))
    return forms


def _small_files(tmp: Path, descriptors: int, per_file: int) -> tuple[Path, Path, int]:
    """A directory of small files and one file of the same bytes; returns both and the file count."""
    lines = _small_lines(tmp / "template.jsonl", descriptors)
    small = tmp / "small"
    small.mkdir()
    for k in range(0, len(lines), per_file):
        (small / f"r{k // per_file:06d}.jsonl").write_bytes(b"".join(lines[k : k + per_file]))
    one = tmp / "one" / "all.jsonl"
    one.parent.mkdir()
    with one.open("wb") as out:
        for part in sorted(small.iterdir()):
            with part.open("rb") as f:
                shutil.copyfileobj(f, out)
    return small, one.parent, (len(lines) + per_file - 1) // per_file


def main() -> None:
    print(machine())
    descriptors = env_int("KVAUDIT_BENCH_FORMATS_PAGES", 100_000, 2_000)
    repeat = env_int("KVAUDIT_BENCH_READ_REPEAT", 3, 1)
    per_file = env_int("KVAUDIT_BENCH_SMALL_FILE_LINES", 4, 4)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        started = time.perf_counter()
        forms = _forms(tmp, descriptors)
        small, one, files = _small_files(tmp, descriptors, per_file)
        print(f"inputs written in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        page_scanner().compile()
        print(f"page scanner machine code loaded in {time.perf_counter() - started:.2f} s (once per process)")
        runs = {name: _timed(_store, path, repeat)[0] for name, path in forms.items()}
        count = runs["compact lines (baseline)"][2]
        assert {run[2] for run in runs.values()} == {count}, runs
        compact_wall, compact_cpu = runs["compact lines (baseline)"][:2]
        compact_mb = forms["compact lines (baseline)"].stat().st_size / 1e6
        print(f"{count:,} descriptors, {compact_mb:.0f} MB of compact OTLP JSON; fastest of {repeat} runs each")
        rows: list[tuple[object, ...]] = []
        for name, (wall, cpu, _) in runs.items():
            size = forms[name].stat().st_size / 1e6  # MB
            baseline = name.startswith("compact")
            rows.append(
                (
                    f"{name}, {size:.1f} MB on disk",
                    f"{count / wall:,.0f} desc/s wall, {count / cpu:,.0f} per CPU s",
                    "" if baseline else f"{count / compact_wall:,.0f} desc/s wall (compact)",
                    "" if baseline else f"{wall / compact_wall:.2f}× wall, {cpu / compact_cpu:.2f}× CPU",
                    "",
                )
            )
        many = _timed(_store, small, repeat)[0]
        single = _timed(_store, one, repeat)[0]
        assert many[2] == single[2], (many, single)
        megabytes = sum(f.stat().st_size for f in one.iterdir()) / 1e6
        print(f"\nmany small files: {single[2]:,} descriptors, {megabytes:.0f} MB, {files:,} files of {per_file} lines")
        rows.append(
            (
                f"{files:,} small files",
                f"{single[2] / many[0]:,.0f} desc/s wall, {single[2] / many[1]:,.0f} per CPU s",
                f"{single[2] / single[0]:,.0f} desc/s wall, {single[2] / single[1]:,.0f} per CPU s (one file)",
                f"{many[0] / single[0]:.2f}× wall, {many[1] / single[1]:.2f}× CPU",
                "< 10× one file",
            )
        )
        report(rows)
