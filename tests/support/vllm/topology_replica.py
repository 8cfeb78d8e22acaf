"""One vLLM replica of the reference deployment (LMCache's connector inside), as its own process.

    python topology_replica.py SPEC_JSON

SPEC_JSON: {"model": DIR (a config.json and model.safetensors), "dtype": "bfloat16",
"hf_overrides": {config fields} or null,
"kv_transfer": {KVTransferConfig fields}, "max_tokens": 16, "requests": [{"prompt": [token
ids], "cache_salt": null, "lmcache_tag": null}, ...]}. The requests run one after the
other, each its own `generate` call, so a later one sees what an earlier one stored.
A request with `lmcache_tag` and `cache_salt` is this replica's no-cache baseline: the
salt keeps it out of vLLM's own prefix cache, the tag (`lmcache.tag.*`, part of
LMCache's keys) out of every page the pool holds, and it stores nothing.

Prints one line `RESULT [{"tokens": [...], "cached": N, "finish": "length"}, ...]`, one
entry per request. A separate process because vLLM spawns its EngineCore and Worker
processes from it, and each replica must be a fresh engine, as in a fleet.
"""

from __future__ import annotations

import json
import sys
import time

EXPORT_WAIT_S = 2.0  # kvaudit.emit's export delay is 1 s


def main(spec: dict) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        skip_tokenizer_init=True,
        dtype=spec.get("dtype", "bfloat16"),
        hf_overrides=spec.get("hf_overrides") or None,
        enforce_eager=True,
        block_size=32,
        max_model_len=1024,
        seed=0,
        kv_transfer_config=KVTransferConfig(**spec["kv_transfer"]),
    )
    results = []
    for request in spec["requests"]:
        tag = request.get("lmcache_tag")
        # LMCache reads its per-request settings (`lmcache.*`) from kv_transfer_params.
        extra = {"kv_transfer_params": {"lmcache.tag.run": tag, "lmcache.skip_save": True}} if tag else None
        params = SamplingParams(
            temperature=0,
            max_tokens=spec.get("max_tokens", 16),
            detokenize=False,
            ignore_eos=True,
            extra_args=extra,
        )
        salt = {"cache_salt": request["cache_salt"]} if request.get("cache_salt") else {}
        (output,) = llm.generate([TokensPrompt(prompt_token_ids=request["prompt"], **salt)], params)
        results.append(
            {
                "tokens": list(output.outputs[0].token_ids),
                "cached": output.num_cached_tokens,
                "finish": output.outputs[0].finish_reason,
            }
        )
    # One write, newline included: an engine process writing to the same stdout (unbuffered)
    # could otherwise land between the line and its end.
    sys.stdout.write(f"RESULT {json.dumps(results)}\n")
    sys.stdout.flush()
    # The hooks export in the background within EXPORT_WAIT_S; vLLM's shutdown kills an
    # EngineCore or Worker that does not exit within 5 s, so give the exporters their time.
    time.sleep(EXPORT_WAIT_S)
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
