"""The vLLM hook's cost: KVAuditConnector around ExampleConnector against ExampleConnector alone.

Both connectors run in this process on the same engine configuration (the tiny model
of the hook tests), driven through the calls vLLM makes for one request: on the
scheduler side lookup, allocation, metadata and finish; on the worker side the
per-layer saves (first pass, every prompt new) and the loads (second pass, every
prompt a hit), with ExampleConnector's real safetensors files; the wrapper's traces
go to an OTLP JSON lines file. Printed per request and per page: each connector's time,
the wrapper's own cost (its calls minus the inner connector's time inside them) and
its ratio to the inner connector's work, and the CPU the background trace exporter
spent (off the serving thread). Times are CPU times, see CLOCK.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# CPU time of the serving thread: the machine is shared, and wall time would count
# the time others' processes held the cores.
CLOCK = time.thread_time
REQUESTS = 200
ROUNDS = 2
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

    def close(self) -> None:
        """Release the trace files: a process holds each file of a replica once."""
        self.scheduler.shutdown()
        self.worker.shutdown()


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


class InnerClock:
    """Stands in for the wrapper's inner connector and adds up the time spent inside it.

    The wrapper's own cost is then the wrapped call time minus this, measured in the
    same calls, instead of a difference of two runs whose disk I/O alone varies more
    than the wrapper costs.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute):
            return attribute

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = CLOCK()
            try:
                return attribute(*args, **kwargs)
            finally:
                self.seconds += CLOCK() - started

        return timed


@dataclass
class Pass:
    total_s: float  # the serving thread's CPU time in all connector calls of the pass
    inner_s: float  # of which inside ExampleConnector (all of it when unwrapped)
    export_s: float  # CPU time of the process's other threads (the trace exporter) in the pass


def _pass(driver: Driver, requests: list[tuple[Any, list[int]]], clocks: list[InnerClock]) -> Pass:
    for clock in clocks:
        clock.seconds = 0.0
    process_started, started = time.process_time(), CLOCK()
    for request, block_ids in requests:
        driver.request(request, block_ids)
    total = CLOCK() - started
    driver.flush()
    others = time.process_time() - process_started - (CLOCK() - started)
    return Pass(total, sum(c.seconds for c in clocks) if clocks else total, max(others, 0.0))


def _measure(vllm_config: Any, tag: str) -> tuple[Pass, Pass]:
    """A store pass (every prompt new), then a load pass (every prompt a hit)."""
    driver = Driver(vllm_config)
    clocks = []
    for connector in (driver.scheduler, driver.worker):
        if hasattr(connector, "_inner"):
            connector._inner = InnerClock(connector._inner)
            clocks.append(connector._inner)
    try:
        return _pass(driver, _requests(tag), clocks), _pass(driver, _requests(tag), clocks)
    finally:
        driver.close()


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
        # Alternate the two and keep each one's best pass: the machine is shared.
        plain: list[tuple[Pass, Pass]] = []
        wrapped: list[tuple[Pass, Pass]] = []
        for round_ in range(ROUNDS):
            plain.append(_measure(plain_config, f"p{round_}-"))
            wrapped.append(_measure(wrapped_config, f"w{round_}-"))
    print(f"{REQUESTS} requests of {PROMPT_TOKENS} tokens, {PAGES} pages each, ExampleConnector on local disk")
    for index, name in enumerate(("store pass", "load pass")):
        alone = min((run[index] for run in plain), key=lambda p: p.total_s)
        audited = min((run[index] for run in wrapped), key=lambda p: p.total_s - p.inner_s)
        per_request = 1e6 / REQUESTS
        own = (audited.total_s - audited.inner_s) * per_request
        print(
            f"  {name}: ExampleConnector alone {alone.total_s * per_request:7.0f} us/request; wrapped "
            f"{audited.total_s * per_request:7.0f} us/request (ratio {audited.total_s / alone.total_s:.2f}, "
            f"disk noise included)\n"
            f"    wrapper's own cost {own:6.0f} us/request, {own / PAGES:5.1f} us/page; "
            f"{own / (audited.inner_s * per_request):.1%} of the inner connector's time in the same calls; "
            f"background trace export {audited.export_s * per_request:5.0f} us/request (unwrapped: "
            f"{alone.export_s * per_request:.0f})"
        )


if __name__ == "__main__":
    main()
