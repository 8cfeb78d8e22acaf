"""Trace values an attacker chooses: Rich markup and terminal control sequences in a replica
name and a page key, written through the real emitter and file exporter.

A replica whose name is `HOSTILE_REPLICA` fetches a raw-pointer page whose key is
`HOSTILE_KEY` (a finding of KVA001 and KVA002 about both) after `r1` stored clean pages.
Shown anywhere, none of it may act as markup (`[/]` crashed Rich) or reach a terminal raw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import exporter_for, replica_resource
from kvaudit.emit.span_batcher import SpanBatcher

from .fleet import page
from .pages import KV

# Closing markup with nothing open, styled text, the window title (OSC 0), a cleared screen, a bell.
HOSTILE_REPLICA: Final = "[/]r9[bold red]red[/bold red]\x1b]0;pwned\x07\x1b[2J\u202e"
# A hyperlink (OSC 8) and a cursor move, inside a page key.
HOSTILE_KEY: Final = "\x1b]8;;http://127.0.0.1:9/\x1b\\link\x1b]8;;\x1b\\\x1b[5A" + "ab" * 24
# What must never reach a terminal from these values.
RAW: Final = ("\x1b", "\x07", "\u202e")


def _emitter(trace_dir: Path, replica: str, file: str) -> Emitter:
    return Emitter(
        replica_resource(replica, engine="vllm", kv=KV), SpanBatcher(exporter_for(f"file:{trace_dir / file}", "r"))
    )


def write(trace_dir: Path) -> None:
    producer = _emitter(trace_dir, "r1", "r1.jsonl")
    with producer.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id="q") as op:
        op.add_page(page("00" * 32))
        op.end(Outcome.HIT, tokens_stored=32)
    consumer = _emitter(trace_dir, HOSTILE_REPLICA, "hostile.jsonl")
    with consumer.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id="q", tokens_requested=64) as op:
        op.add_page(page("00" * 32, used=True))
        op.add_page(
            PageDescriptor(key=HOSTILE_KEY, token_start=32, token_end=64, transfer="raw_ptr", address=1, used=True)
        )
        op.end(Outcome.HIT, tokens_hit=64)
    producer.shutdown()
    consumer.shutdown()
