"""The tiny model both vLLM test modules run: a local `config.json`, random weights.

vLLM builds it with `load_format="dummy"` (weights from a fixed seed, the same in every
process), so no weights are ever downloaded (RECIPES.md).
"""

from __future__ import annotations

from typing import Any

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "vocab_size": 1024,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def tiny_llama(dtype: str) -> dict[str, Any]:
    """The tiny model's config with its weights (and so its KV cache) in `dtype`."""
    return {**TINY_LLAMA, "torch_dtype": dtype}
