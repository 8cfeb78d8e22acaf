"""Synthetic workloads: sessions of requests whose prompts are chained page hashes.

A prompt is an append-only list of content segments (a shared system prompt, a user
message, a tool output, a model response). A page's key hashes its parent's key
with the segment pieces covering its tokens, exactly like a chained prefix hash
over token blocks, so two prompts share page keys only as far as they share a
prefix: reuse emerges from the workload, it is never scripted.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

MAX_CONTEXT_TOKENS: Final = 32768


class TokenStream:
    """A prompt growing by segments, with the keys of its full pages."""

    def __init__(self, page_tokens: int) -> None:
        self.page_tokens = page_tokens
        self.tokens = 0
        self._segments: list[tuple[str, int, int]] = []  # (id, first token, length)
        self._keys: list[str] = []
        self._parent = b""

    def append(self, segment: str, length: int) -> None:
        self._segments.append((segment, self.tokens, length))
        self.tokens += length

    def page_keys(self) -> list[str]:
        """Keys of the full pages; a page's key never changes once it is full."""
        full = self.tokens // self.page_tokens
        while len(self._keys) < full:
            start = len(self._keys) * self.page_tokens
            pieces = self._pieces(start, start + self.page_tokens)
            self._parent = hashlib.sha256(self._parent + pieces.encode()).digest()
            self._keys.append(self._parent.hex())
        return self._keys[:full]

    def _pieces(self, start: int, end: int) -> str:
        """The segment slices covering tokens [start, end), as the page's content."""
        return ";".join(
            f"{segment}@{max(start, first) - first}:{min(end, first + length) - first}"
            for segment, first, length in self._segments
            if first < end and first + length > start
        )


@dataclass
class Turn:
    """One request of a session: what its prompt adds, what it generates, the pause after it."""

    adds: list[tuple[str, int]]
    output_tokens: int
    think_s: float


@dataclass
class Session:
    id: str
    workload: str
    turns: list[Turn]
    stream: TokenStream
    next_turn: int = 0


def _chat(rng: random.Random, sid: str) -> list[Turn]:
    """Multi-turn chat: a short common system prompt and a conversation that grows."""
    turns = [Turn([("chat-system", 768), (f"{sid}:u0", rng.randint(100, 600))], rng.randint(200, 700), 0)]
    while rng.random() < 0.8:
        turns[-1].think_s = rng.expovariate(1 / 15)
        turns.append(Turn([(f"{sid}:u{len(turns)}", rng.randint(50, 400))], rng.randint(200, 700), 0))
    return turns


def _agent(rng: random.Random, sid: str) -> list[Turn]:
    """Agent loop: long shared tool definitions, then tool outputs appended step after step."""
    turns = [Turn([("agent-tools", 6144), (f"{sid}:task", rng.randint(300, 1000))], rng.randint(100, 400), 0)]
    for step in range(rng.randint(4, 16)):
        turns[-1].think_s = rng.uniform(0.5, 3.0)  # the tool call runs between steps
        turns.append(Turn([(f"{sid}:tool{step}", rng.randint(300, 3000))], rng.randint(100, 400), 0))
    return turns


def _shared(rng: random.Random, sid: str) -> list[Turn]:
    """One question over one of a few long shared documents or system prompts."""
    doc = rng.randrange(4)
    return [Turn([(f"shared-doc{doc}", 8192), (f"{sid}:q", rng.randint(100, 400))], rng.randint(100, 300), 0)]


def _oneshot(rng: random.Random, sid: str) -> list[Turn]:
    """A unique prompt: nothing to reuse."""
    return [Turn([(f"{sid}:prompt", rng.randint(1000, 6000))], rng.randint(100, 400), 0)]


WORKLOADS: Final[dict[str, Callable[[random.Random, str], list[Turn]]]] = {
    "chat": _chat,
    "agent": _agent,
    "shared": _shared,
    "oneshot": _oneshot,
}


def parse_mix(spec: str) -> dict[str, float]:
    """`chat` or `chat=4,agent=2,shared=2,oneshot=2` -> normalised weights.

    Raises:
        ValueError: unknown workload or bad weight.
    """
    weights: dict[str, float] = {}
    for part in spec.split(","):
        name, _, weight = part.strip().partition("=")
        if name not in WORKLOADS:
            raise ValueError(f"workload {name!r}: expected one of {', '.join(WORKLOADS)}")
        try:
            weights[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"workload {part!r}: the weight must be a number") from None
        if weights[name] < 0:
            raise ValueError(f"workload {part!r}: the weight must not be negative")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"workload mix {spec!r}: weights sum to zero")
    return {name: weight / total for name, weight in weights.items()}


def new_session(index: int, mix: dict[str, float], seed: int, page_tokens: int) -> Session:
    """Session `index` of a run: its own random stream, so it does not depend on the router or the pool."""
    rng = random.Random(f"{seed}:session:{index}")
    workload = rng.choices(list(mix), weights=list(mix.values()))[0]
    sid = f"{workload}-{index}"
    return Session(sid, workload, WORKLOADS[workload](rng, sid), TokenStream(page_tokens))


def next_prompt(session: Session) -> Turn | None:
    """Grow the session's prompt by its next turn; None when it is done or past the context length."""
    if session.next_turn >= len(session.turns):
        return None
    turn = session.turns[session.next_turn]
    if session.next_turn:
        previous = session.turns[session.next_turn - 1]
        session.stream.append(f"{session.id}:a{session.next_turn - 1}", previous.output_tokens)
    for segment, length in turn.adds:
        session.stream.append(segment, length)
    if session.stream.tokens > MAX_CONTEXT_TOKENS:
        return None
    session.next_turn += 1
    return turn
