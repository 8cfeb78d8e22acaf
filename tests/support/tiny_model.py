"""The tiny model the vLLM tests and benchmarks run: a local `config.json`, random weights.

vLLM builds it with `load_format="dummy"` (weights from a fixed seed, the same in every
process), so no weights are ever downloaded (RECIPES.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import ROOT

# The model of examples/reference_deployment.py: one config for the examples, tests and benchmarks.
TINY_LLAMA: dict[str, Any] = json.loads((ROOT / "examples" / "tiny_llama.json").read_text())


def tiny_llama(dtype: str) -> dict[str, Any]:
    """The tiny model's config with its weights (and so its KV cache) in `dtype`."""
    return {**TINY_LLAMA, "torch_dtype": dtype}


def write_random_weights(directory: Any, config: dict[str, Any], seed: int = 0, scale: float = 0.15) -> None:
    """Random weights for `config` in `directory`/model.safetensors, loaded with vLLM's default loader.

    vLLM's `dummy` weights are drawn from ±1e-3: attention is then almost uniform and the
    greedy output hardly depends on the KV cache (a misread cache changes nothing you can
    see). These are normal with standard deviation `scale` (embeddings 1.0), large enough
    for attention to pick tokens, so a misread KV cache changes the output. Seeded: the
    same file in every run.
    """
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head = config["head_dim"]
    q_width, kv_width = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    dtype = getattr(torch, config["torch_dtype"])

    def normal(*shape: int, std: float = scale) -> torch.Tensor:
        return (torch.randn(shape, generator=generator) * std).to(dtype)

    tensors = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden, std=1.0)}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        tensors |= {
            prefix + "self_attn.q_proj.weight": normal(q_width, hidden),
            prefix + "self_attn.k_proj.weight": normal(kv_width, hidden),
            prefix + "self_attn.v_proj.weight": normal(kv_width, hidden),
            prefix + "self_attn.o_proj.weight": normal(hidden, q_width),
            prefix + "mlp.gate_proj.weight": normal(inter, hidden),
            prefix + "mlp.up_proj.weight": normal(inter, hidden),
            prefix + "mlp.down_proj.weight": normal(hidden, inter),
            prefix + "input_layernorm.weight": torch.ones(hidden, dtype=dtype),
            prefix + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype),
        }
    tensors["model.norm.weight"] = torch.ones(hidden, dtype=dtype)
    tensors["lm_head.weight"] = normal(config["vocab_size"], hidden)
    save_file(tensors, str(Path(directory) / "model.safetensors"))


# A tiny hybrid model: Gemma 3's sliding-window and global layers, one of each, so that vLLM
# keeps two KV cache groups (docs/design.md section 7.1). A window of one 32-token block.
TINY_GEMMA3: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_local_base_freq": 10000.0,
    "query_pre_attn_scalar": 32,
    "sliding_window": 32,
    "layer_types": ["sliding_attention", "full_attention"],
    "vocab_size": 1024,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
