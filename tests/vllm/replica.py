"""One vLLM replica for the hook tests, run as its own process: `python replica.py SPEC_JSON`.

SPEC_JSON: {"model": DIR, "dtype": "bfloat16", "prompts": [[token ids], ...],
"max_tokens": 16, "kv_transfer": {KVTransferConfig fields} or null}. Prints one line
`RESULT [{"tokens": [...], "cached": N, "finish": "length"}, ...]`, one entry per prompt.
A separate process because vLLM spawns its EngineCore and Worker processes from it,
and because each replica must be a fresh engine, as in a fleet.
"""

from __future__ import annotations

import json
import sys


def main(spec: dict) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    transfer = spec.get("kv_transfer")
    llm = LLM(
        model=spec["model"],
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=spec.get("dtype", "bfloat16"),
        enforce_eager=True,
        block_size=32,
        max_model_len=1024,
        seed=0,
        kv_transfer_config=KVTransferConfig(**transfer) if transfer else None,
    )
    params = SamplingParams(temperature=0, max_tokens=spec.get("max_tokens", 16), detokenize=False, ignore_eos=True)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]], params)
    results = [
        {"tokens": list(o.outputs[0].token_ids), "cached": o.num_cached_tokens, "finish": o.outputs[0].finish_reason}
        for o in outputs
    ]
    print("RESULT " + json.dumps(results), flush=True)
    # Shut the engine down here, not at interpreter exit, so that the connectors'
    # shutdown (which flushes their traces) runs before the processes are reaped.
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
