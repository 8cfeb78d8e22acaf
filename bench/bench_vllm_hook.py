"""The vLLM hook's cost: KVAuditConnector around ExampleConnector against ExampleConnector alone.

Both run in this process on the engine configuration of the hook tests (tiny model,
32-token blocks), driven through the calls vLLM makes for a request: scheduler side
lookup, allocation, metadata and finish; worker side the per-layer saves (first
pass: every prompt new) or the loads (second pass: every prompt a hit), with
ExampleConnector's real safetensors files. The wrapper's traces go to an OTLP JSON
lines file.

The wrapper's own cost is its calls' time minus the time spent inside the inner
connector in those same calls (`InnerClock`), which is exact where a difference of
two runs would drown in disk noise. Two prompt lengths separate what the wrapper
costs per request from what it costs per page. Times are CPU times (see `CLOCK`);
the background exporter's CPU is reported beside them.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.common import sized
from tests.support.tiny_model import tiny_llama

# CPU time of the serving thread: the machine is shared, and wall time would count
# the time other processes held the cores.
CLOCK = time.thread_time
REQUESTS = sized(200, 4)
ROUNDS = sized(2, 1)
PROMPTS = (208, 976)  # 6 and 30 pages of 32 tokens (ExampleConnector leaves the last token)
BLOCK = 32


def pages_of(prompt_tokens: int) -> int:
    return (prompt_tokens - 1) // BLOCK


def _config(model: Path, storage: Path, audit: dict[str, Any] | None) -> Any:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs

    extra: dict[str, Any] = {"shared_storage_path": str(storage)}
    name = "ExampleConnector"
    if audit is not None:
        extra["kvaudit"] = audit
        name = "KVAuditConnector"
    return EngineArgs(
        model=str(model),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        block_size=BLOCK,
        max_model_len=1024,
        kv_transfer_config=KVTransferConfig(kv_connector=name, kv_role="kv_both", kv_connector_extra_config=extra),
    ).create_engine_config()


class InnerClock:
    """Stands in for the wrapper's inner connector and adds up the time spent inside it.

    What the stand-in itself costs outside its clock readings would count as the
    wrapper's; `overhead_s()` measures that per call, and `Pass` takes it off.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.seconds = 0.0
        self.calls = 0

    @staticmethod
    def overhead_s(calls: int = 100_000) -> float:
        """Seconds per call the stand-in adds outside its own clock readings."""
        clock = InnerClock(SimpleNamespace(noop=lambda: None))
        started = CLOCK()
        for _ in range(calls):
            clock.noop()
        return (CLOCK() - started - clock.seconds) / calls

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute):
            return attribute

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            started = CLOCK()
            try:
                return attribute(*args, **kwargs)
            finally:
                self.seconds += CLOCK() - started

        return timed


class Driver:
    """Plays vLLM's part for one scheduler-side and one worker-side connector."""

    def __init__(self, vllm_config: Any, pages: int) -> None:
        import torch
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        self.pages = pages
        self.scheduler = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.SCHEDULER, None)
        self.worker = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.WORKER, None)
        self.clocks = []
        self.stand_in_s = InnerClock.overhead_s()
        for connector in (self.scheduler, self.worker):
            half = getattr(connector, "_half", None)  # the wrapper's half that calls the inner connector
            if half is not None:
                inner = half._inner
                clock = half._inner = connector._inner = InnerClock(inner)
                self.clocks.append(clock)
                # Calls the wrapper binds straight to the inner connector's methods are
                # the inner's time too: clocked like the rest.
                for name, value in list(vars(connector).items()):
                    if getattr(value, "__self__", None) is inner:
                        setattr(connector, name, getattr(clock, name))
        blocks = REQUESTS * (pages + 1) + 1
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
            half = getattr(connector, "_half", None)
            if half is not None:
                half._emitter.flush()

    def close(self) -> None:
        """Release the trace files: a process holds each file of a replica once."""
        self.scheduler.shutdown()
        self.worker.shutdown()


def _requests(tag: str, prompt_tokens: int) -> list[tuple[Any, list[int]]]:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    span = pages_of(prompt_tokens) + 1
    out = []
    for i in range(REQUESTS):
        prompt = [(i * 131 + j * 7) % 1000 + 3 for j in range(prompt_tokens)]
        request = Request(f"{tag}{i}-0a1b2c3d", prompt, SamplingParams(max_tokens=1), None, block_hasher=hasher)
        out.append((request, list(range(1 + i * span, 1 + (i + 1) * span))))
    return out


@dataclass
class Pass:
    """CPU seconds of one pass over REQUESTS requests."""

    total_s: float  # the serving thread, in all connector calls
    inner_s: float  # of which inside ExampleConnector (all of it when unwrapped)
    export_s: float  # the process's other threads (the trace exporter), up to the end of its flush

    @property
    def own_s(self) -> float:
        return self.total_s - self.inner_s


def _pass(driver: Driver, requests: list[tuple[Any, list[int]]]) -> Pass:
    for clock in driver.clocks:
        clock.seconds, clock.calls = 0.0, 0
    process_started, started = time.process_time(), CLOCK()
    for request, block_ids in requests:
        driver.request(request, block_ids)
    total = CLOCK() - started
    driver.flush()
    others = time.process_time() - process_started - (CLOCK() - started)
    inner = total
    if driver.clocks:
        stand_in = sum(clock.calls for clock in driver.clocks) * driver.stand_in_s
        inner = sum(clock.seconds for clock in driver.clocks) + stand_in
    return Pass(total, inner, max(others, 0.0))


def _best(config: Any, prompt_tokens: int, tag: str) -> tuple[Pass, Pass]:
    """The best store pass and load pass over ROUNDS drivers (the machine is shared)."""
    runs = []
    for round_ in range(ROUNDS):
        driver = Driver(config, pages_of(prompt_tokens))
        try:
            name = f"{tag}{prompt_tokens}-{round_}-"
            runs.append((_pass(driver, _requests(name, prompt_tokens)), _pass(driver, _requests(name, prompt_tokens))))
        finally:
            driver.close()
    return min((r[0] for r in runs), key=lambda p: p.total_s), min((r[1] for r in runs), key=lambda p: p.total_s)


def main() -> None:
    if find_spec("vllm") is None:
        print("skipped: vllm is not installed (scripts/install-vllm.sh)")
        return
    import torch

    # One compute thread: torch's own pool would otherwise count as "other threads".
    torch.set_num_threads(1)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    logging.getLogger("vllm").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "model").mkdir()
        (root / "model" / "config.json").write_text(json.dumps(tiny_llama("bfloat16")))
        audit = {"wrap": "ExampleConnector", "replica": "bench", "export": f"file:{root}/traces/bench.jsonl"}
        plain_config = _config(root / "model", root / "plain", None)
        wrapped_config = _config(root / "model", root / "wrapped", audit)
        results = {tokens: (_best(plain_config, tokens, "p"), _best(wrapped_config, tokens, "w")) for tokens in PROMPTS}
    us = 1e6 / REQUESTS
    print(f"{REQUESTS} requests per pass, ExampleConnector on local disk; CPU us per request")
    for index, name in enumerate(("store", "load")):
        own = {}
        for tokens, (plain, wrapped) in results.items():
            alone, audited = plain[index], wrapped[index]
            own[tokens] = audited.own_s * us
            print(
                f"  {name} {pages_of(tokens):2d} pages: ExampleConnector {alone.total_s * us:7.0f}, "
                f"wrapped {audited.total_s * us:7.0f} (ratio {audited.total_s / alone.total_s:.3f}); "
                f"wrapper's own {own[tokens]:5.0f} = {audited.own_s / audited.inner_s:.1%} of the inner's; "
                f"exporter {audited.export_s * us:5.0f} (unwrapped {alone.export_s * us:.0f})"
            )
        short, long_ = PROMPTS
        per_page = (own[long_] - own[short]) / (pages_of(long_) - pages_of(short))
        fixed = own[short] - per_page * pages_of(short)
        print(f"  {name}: wrapper costs {fixed:.0f} us per request + {per_page:.1f} us per page")


if __name__ == "__main__":
    main()
