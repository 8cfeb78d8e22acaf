"""The vLLM hook's cost: KVAuditConnector around ExampleConnector against ExampleConnector alone.

Both connectors run in this process on the same engine configuration (the tiny model
of the hook tests), driven through the calls vLLM makes for one request: on the
scheduler side lookup, allocation, metadata and finish; on the worker side the
per-layer saves (first pass, every prompt new) and the loads (second pass, every
prompt a hit), with ExampleConnector's real safetensors files. The wrapper's traces
go to an OTLP JSON lines file and are flushed inside the timed region. Printed: time
per request and per page for each, the wrapper's extra cost, and the ratios.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REQUESTS = 200
PROMPT_TOKENS = 400
BLOCK = 32
PAGES = (PROMPT_TOKENS - 1) // BLOCK
MODEL_CONFIG = (
    '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, '
    '"intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, '
    '"head_dim": 32, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, '
    '"rope_theta": 10000.0, "vocab_size": 1024, "bos_token_id": 1, "eos_token_id": 2, '
    '"tie_word_embeddings": false, "torch_dtype": "bfloat16"}'
)


def _config(model: Path, storage: Path, audit: dict[str, Any] | None) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    extra: dict[str, Any] = {"shared_storage_path": str(storage)}
    transfer: dict[str, Any] = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}
    if audit is not None:
        extra["kvaudit"] = audit
        transfer = {"kv_connector": "KVAuditConnector", "kv_role": "kv_both"}
    from vllm.config import KVTransferConfig

    return EngineArgs(
        model=str(model),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        block_size=BLOCK,
        max_model_len=1024,
        kv_transfer_config=KVTransferConfig(**transfer, kv_connector_extra_config=extra),
    ).create_engine_config()


class Driver:
    """Plays vLLM's part for one scheduler-side and one worker-side connector."""

    def __init__(self, vllm_config: Any) -> None:
        import torch
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        self.scheduler = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.SCHEDULER, None)
        self.worker = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.WORKER, None)
        blocks = REQUESTS * (PAGES + 1) + 1
        self.layers = {
            f"model.layers.{i}.self_attn.attn": SimpleNamespace(kv_cache=torch.randn(blocks, 2, BLOCK, 64).bfloat16())
            for i in range(2)
        }
        self.worker.register_kv_caches({name: layer.kv_cache for name, layer in self.layers.items()})
        self.forward = SimpleNamespace(
            attn_metadata={name: object() for name in self.layers}, no_compile_layers=self.layers
        )

    def request(self, request: Any, block_ids: list[int]) -> None:
        matched, _ = self.scheduler.get_num_new_matched_tokens(request, 0)
        self.scheduler.update_state_after_alloc(request, None, matched or 0)
        new = SimpleNamespace(
            req_id=request.request_id, prompt_token_ids=request.prompt_token_ids, block_ids=(block_ids,), mm_features=[]
        )
        cached = SimpleNamespace(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[])
        meta = self.scheduler.build_connector_meta(
            SimpleNamespace(scheduled_new_reqs=[new], scheduled_cached_reqs=cached, num_scheduled_tokens={})
        )
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(self.forward)
        for name, layer in self.layers.items():
            self.worker.save_kv_layer(name, layer.kv_cache, object())
        self.worker.wait_for_save()
        self.worker.get_block_ids_with_load_errors()
        self.worker.clear_connector_metadata()
        self.scheduler.request_finished(request, block_ids)

    def flush(self) -> None:
        for connector in (self.scheduler, self.worker):
            emitter = getattr(connector, "_emitter", None)
            if emitter is not None:
                emitter.flush()


def _requests(tag: str) -> list[tuple[Any, list[int]]]:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    out = []
    for i in range(REQUESTS):
        prompt = [(i * 131 + j * 7) % 1000 + 3 for j in range(PROMPT_TOKENS)]
        request = Request(f"{tag}{i}-0a1b2c3d", prompt, SamplingParams(max_tokens=1), None, block_hasher=hasher)
        out.append((request, list(range(1 + i * (PAGES + 1), 1 + (i + 1) * (PAGES + 1)))))
    return out


def _timed(driver: Driver, requests: list[tuple[Any, list[int]]]) -> float:
    started = time.perf_counter()
    for request, block_ids in requests:
        driver.request(request, block_ids)
    driver.flush()
    return time.perf_counter() - started


def _measure(make: Callable[[str], Driver], tag: str) -> tuple[float, float]:
    """Seconds for a store pass (every prompt new) and a load pass (every prompt a hit)."""
    driver = make(tag)
    return _timed(driver, _requests(tag)), _timed(driver, _requests(tag))


def main() -> None:
    if find_spec("vllm") is None:
        print("skipped: vllm is not installed (scripts/install-vllm.sh)")
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import logging

    logging.getLogger("vllm").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "model").mkdir()
        (root / "model" / "config.json").write_text(MODEL_CONFIG)
        audit = {"wrap": "ExampleConnector", "replica": "bench", "export": f"file:{root}/traces/bench.jsonl"}
        plain_config = _config(root / "model", root / "plain", None)
        wrapped_config = _config(root / "model", root / "wrapped", audit)
        # Alternate the two, twice, and keep each one's best: the machine is shared.
        results: dict[str, list[tuple[float, float]]] = {"plain": [], "wrapped": []}
        for round_ in range(2):
            results["plain"].append(_measure(lambda tag: Driver(plain_config), f"p{round_}-"))
            results["wrapped"].append(_measure(lambda tag: Driver(wrapped_config), f"w{round_}-"))
    plain = tuple(min(r[i] for r in results["plain"]) for i in range(2))
    wrapped = tuple(min(r[i] for r in results["wrapped"]) for i in range(2))
    print(f"{REQUESTS} requests of {PROMPT_TOKENS} tokens, {PAGES} pages each, ExampleConnector on local disk")
    for i, name in enumerate(("store pass", "load pass")):
        per_plain = plain[i] / REQUESTS * 1e6
        per_wrapped = wrapped[i] / REQUESTS * 1e6
        extra = per_wrapped - per_plain
        print(
            f"  {name}: ExampleConnector {per_plain:8.0f} us/request, KVAuditConnector {per_wrapped:8.0f} us/request; "
            f"wrapper +{extra:6.0f} us/request, +{extra / PAGES:5.1f} us/page; ratio {per_wrapped / per_plain:.3f}"
        )


if __name__ == "__main__":
    main()
