"""One vLLM replica for the hook tests, run as its own process: `python replica.py SPEC_JSON`.

SPEC_JSON: {"model": DIR, "dtype": "bfloat16", "prompts": [[token ids], ...],
"cache_salt": null, "max_tokens": 16, "kv_transfer": {KVTransferConfig fields} or null,
"otlp_traces_endpoint": URL or null (vLLM's own request spans), "kv_events_endpoint":
ZMQ endpoint to publish vLLM's KV events on, or null, "engine_args": more `LLM`
arguments or null, "sleep": put the engine to sleep and wake it before generating
again, "after_reset": [[token ids], ...] or absent}. Prints one line `RESULT [{"tokens":
[...], "cached": N, "finish": "length"}, ...]`, one entry per prompt (with "sleep", the
entries of the generation after waking); with `after_reset`, then resets the prefix
cache and runs those prompts one after the other, printing `AFTER_RESET [...]` alike.
A separate process because vLLM spawns its EngineCore and Worker processes from it,
and because each replica must be a fresh engine, as in a fleet.
"""

from __future__ import annotations

import json
import sys
import time

EXPORT_WAIT_S = 2.0  # kvaudit.emit's export delay is 1 s


def main(spec: dict) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig, KVTransferConfig
    from vllm.inputs import TokensPrompt

    transfer = spec.get("kv_transfer")
    tracing = spec.get("otlp_traces_endpoint")
    events = spec.get("kv_events_endpoint")
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
        otlp_traces_endpoint=tracing,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=events)
        if events
        else None,
        # vLLM's offline LLM needs stats for its request spans (else an assertion fails).
        disable_log_stats=not tracing,
        **spec.get("engine_args", {}),
    )
    params = SamplingParams(temperature=0, max_tokens=spec.get("max_tokens", 16), detokenize=False, ignore_eos=True)
    # A cache salt changes vLLM's block hashes (the page keys), not what is computed.
    salt = {"cache_salt": spec["cache_salt"]} if spec.get("cache_salt") else {}
    prompts = [TokensPrompt(prompt_token_ids=p, **salt) for p in spec["prompts"]]
    outputs = llm.generate(prompts, params)
    if spec.get("sleep"):
        llm.sleep(level=1)
        llm.wake_up()
        outputs = llm.generate(prompts, params)
    # One write, newline included: an engine process writing to the same stdout (unbuffered)
    # could otherwise land between the line and its end.
    sys.stdout.write(f"RESULT {json.dumps([_result(o) for o in outputs])}\n")
    sys.stdout.flush()
    if spec.get("after_reset"):
        assert llm.reset_prefix_cache(), "the prefix cache was not reset"
        again = [llm.generate([TokensPrompt(prompt_token_ids=p, **salt)], params)[0] for p in spec["after_reset"]]
        print("AFTER_RESET " + json.dumps([_result(o) for o in again]), flush=True)
    # The hook exports its spans in the background within EXPORT_WAIT_S; vLLM's shutdown
    # kills an EngineCore or Worker that does not exit within 5 s, so give the exporters
    # their time first.
    time.sleep(EXPORT_WAIT_S)
    llm.llm_engine.engine_core.shutdown()


def _result(output) -> dict:
    first = output.outputs[0]
    return {"tokens": list(first.token_ids), "cached": output.num_cached_tokens, "finish": first.finish_reason}


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
