"""`kvaudit demo`: two replicas sharing one pool, traced and summarised end to end.

Replica r1 serves the first turn of a set of conversations and stores their pages;
the router then sends the follow-up turns to r2, which fetches r1's pages from the
pool. Every operation goes through the real emitter and file exporter, and the
summary is the named `summary` query over the resulting trace files.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
from pathlib import Path

from kvaudit.cli import command_parser
from kvaudit.contract import Hook, KVConfig, Op, Outcome, PageDescriptor
from kvaudit.emission import Emitter, setup_emitter
from kvaudit.named_queries import load
from kvaudit.output import write_rows
from kvaudit.store import open_store

PAGE_TOKENS = 256
# Gemma-2-27B: 46 layers x 16 KV heads x head size 128, bf16 (DESIGN.md section 5).
KV = KVConfig(
    model="google/gemma-2-27b",
    dtype="bfloat16",
    layout="KV_2LTD",
    block_size=PAGE_TOKENS,
    world_size=1,
    rank=0,
    hash_algo="sha256_cbor",
    layers=46,
    kv_heads=16,
    head_size=128,
)
SHAPE = (2, 46, PAGE_TOKENS, 16 * 128)
PAGE_BYTES = 2 * 46 * PAGE_TOKENS * 16 * 128 * 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "demo",
        "Trace two replicas sharing one KV pool and summarise reuse from the traces.",
        "kvaudit demo --out demo-out --conversations 50",
    )
    parser.add_argument("--out", default="demo-out", help="directory for the trace files (replaced)")
    parser.add_argument("--conversations", type=int, default=40)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    replicas = {
        name: setup_emitter(name, f"file:{out}/{name}.jsonl", engine="kvaudit-demo", kv=KV) for name in ("r1", "r2")
    }
    for conversation in range(args.conversations):
        prompt_pages = 2 + conversation % 6
        _serve(replicas["r1"], f"c{conversation}-t1", conversation, prompt_pages, cached_pages=0)
        # The follow-up turn shares the first turn's prefix and adds one page.
        _serve(replicas["r2"], f"c{conversation}-t2", conversation, prompt_pages + 1, cached_pages=prompt_pages)
    for emitter in replicas.values():
        emitter.shutdown()
    store = open_store([str(out)])
    columns, rows = store.query(load("summary"))
    write_rows(columns, rows, title="Shared KV pool: per-replica summary")
    print(f'\nTraces: {out}/*.jsonl   Look further: kvaudit sql {out} "SELECT * FROM pages LIMIT 10"')
    return 0


def _serve(emitter: Emitter, request: str, conversation: int, pages: int, cached_pages: int) -> None:
    keys = _chained_keys(conversation, pages)
    with emitter.operation(
        Op.FETCH, hook=Hook.SIMULATOR, request_id=request, backend="demo.pool", tokens_requested=pages * PAGE_TOKENS
    ) as fetch:
        for i in range(cached_pages):
            fetch.add_page(_page(keys[i], i, used=True))
        fetch.end(
            Outcome.HIT if cached_pages == pages else Outcome.PARTIAL if cached_pages else Outcome.MISS,
            tokens_hit=cached_pages * PAGE_TOKENS,
        )
    with emitter.operation(Op.STORE, hook=Hook.SIMULATOR, request_id=request, backend="demo.pool") as store:
        for i in range(cached_pages, pages):
            store.add_page(_page(keys[i], i))
        store.end(Outcome.HIT, tokens_stored=(pages - cached_pages) * PAGE_TOKENS)


def _chained_keys(conversation: int, pages: int) -> list[str]:
    keys, parent = [], b""
    for i in range(pages):
        parent = hashlib.sha256(parent + f"{conversation}:{i}".encode()).digest()
        keys.append(parent.hex())
    return keys


def _page(key: str, index: int, used: bool | None = None) -> PageDescriptor:
    return PageDescriptor(
        key=key,
        hash_algo=KV.hash_algo,
        token_start=index * PAGE_TOKENS,
        token_end=(index + 1) * PAGE_TOKENS,
        model=KV.model,
        dtype=KV.dtype,
        shape=SHAPE,
        layout=KV.layout,
        bytes=PAGE_BYTES,
        world_size=1,
        rank=0,
        layers=46,
        kv_heads=16,
        head_size=128,
        used=used,
        tier="cpu",
    )
