"""One vLLM replica around LMCache's MP server with the probe's clocks inside, for bench_vllm_mp.

    python -m bench.vllm_mp_timed SPEC_JSON

SPEC_JSON: {"model": DIR, "kv_transfer": {KVTransferConfig fields, the connector from
`bench.vllm_mp_probe`}, "probe_out": PREFIX (`$KVAUDIT_PROBE_OUT`), "first": N (the
first prompt's seed), "warm_ups": W, "requests": R, "tokens": T}. vLLM's own prefix cache
is off, so a prompt served again is loaded from the server. The warm-up: W prompts stored
and then loaded; then the store pass (R fresh prompts, one at a time, one token each) and
the load pass (the same R prompts again). Prints one line `RESULT {"store": FIGURES,
"load": FIGURES}`, FIGURES the change of each process's totals over the pass (bench/
vllm_mp_probe.py; its exporter threads' up to the export of the pass's spans), and the
tokens the load pass found in the server.

A separate process because vLLM spawns its EngineCore and Worker processes from it, and
the replica with kvaudit and the one without must each be a fresh engine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_until

ROLES = ("worker", "scheduler")
EXPORT_WAIT_S = 2.0  # kvaudit.emit's export delay is 1 s


def _totals(prefix: str, after: float) -> dict[str, dict[str, float]]:
    """Each process's totals, as its probe wrote them after the time `after` (and so once
    every call before it had ended)."""

    def read() -> dict[str, dict[str, float]] | None:
        figures = {}
        for role in ROLES:
            path = Path(f"{prefix}.{role}.json")
            if not path.exists():
                return None
            figures[role] = json.loads(path.read_text())
            if figures[role]["written"] <= after:
                return None
        return figures

    return wait_until(read, what="the probe's totals written")


def _change(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    change = {
        f"{role}.{name}": after[role][name] - before[role][name]
        for role in ROLES
        for name in ("steps", "outer_s", "inner_s")
    }
    # The engine's CPU: its processes' (one, where vLLM runs the model in its EngineCore).
    roles = {after[role]["pid"]: role for role in ROLES}.values()
    for name in ("process_cpu_s", "exporters_cpu_s"):
        change[name] = sum(after[role][name] - before[role][name] for role in roles)
    return change


def main(spec: dict[str, Any]) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    os.environ["KVAUDIT_PROBE_OUT"] = spec["probe_out"]
    llm = LLM(
        model=spec["model"],
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype="bfloat16",
        enforce_eager=True,
        enable_prefix_caching=False,
        block_size=32,
        max_model_len=1024,
        seed=0,
        kv_transfer_config=KVTransferConfig(**spec["kv_transfer"]),
    )
    params = SamplingParams(temperature=0, max_tokens=1, detokenize=False, ignore_eos=True)

    def serve(prompts: list[list[int]]) -> int:
        cached = 0
        for prompt in prompts:  # one at a time: each request in engine steps of its own
            (output,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
            cached += output.num_cached_tokens or 0
        return cached

    def prompts(first: int, count: int) -> list[list[int]]:
        return [[(i * 131 + j * 7) % 1000 + 3 for j in range(spec["tokens"])] for i in range(first, first + count)]

    warm = prompts(spec["first"], spec["warm_ups"])
    serve(warm)
    serve(warm)
    measured = prompts(spec["first"] + spec["warm_ups"], spec["requests"])
    result: dict[str, Any] = {}
    for name in ("store", "load"):
        # Read once the spans of what came before are exported (the exporters' delay), so
        # that the pass's exporter CPU is its own; the engine is idle meanwhile.
        before = _totals(spec["probe_out"], time.time() + EXPORT_WAIT_S)
        cached = serve(measured)
        ended = time.time()
        result[name] = _change(before, _totals(spec["probe_out"], ended))
        exported = _totals(spec["probe_out"], ended + EXPORT_WAIT_S)
        result[name]["exporters_cpu_s"] = _change(before, exported)["exporters_cpu_s"]
        result[name]["cached_tokens"] = cached
    # One write, newline included: an engine process writing to the same stdout could land between.
    sys.stdout.write(f"RESULT {json.dumps(result)}\n")
    sys.stdout.flush()
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
