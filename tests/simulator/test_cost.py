"""The simulator's cost model against FLOPs and bytes computed by hand, its presets against the published configs."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from kvaudit.simulator.hardware import GPUS, GpuProfile, load_gpu
from kvaudit.simulator.model import PRESETS, CostModel, ModelGeometry

GEMMA2, GEMMA3, LLAMA = PRESETS["gemma-2-27b"], PRESETS["gemma-3-27b"], PRESETS["llama-3.1-70b"]
H100 = CostModel()  # H100 SXM, bf16, MFU 0.5
PAGE = 256

# The published config.json values (Hugging Face names; sources in docs/boundaries.md).
PUBLISHED = {
    "gemma-2-27b": {
        "num_hidden_layers": 46,
        "hidden_size": 4608,
        "intermediate_size": 36864,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "sliding_window": 4096,
        "max_position_embeddings": 8192,
        "vocab_size": 256000,
        "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "full_attention"],  # alternating, the first local
    },
    "gemma-3-27b": {
        "num_hidden_layers": 62,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "sliding_window": 1024,
        "max_position_embeddings": 131072,
        "vocab_size": 262208,
        "tie_word_embeddings": True,
        "layer_types": 5 * ["sliding_attention"] + ["full_attention"],  # sliding_window_pattern 6
    },
    "llama-3.1-70b": {
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "sliding_window": None,
        "max_position_embeddings": 131072,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"],
    },
}


def _parameters(config: dict) -> int:
    """Decoder parameters from a config: attention and gated-MLP projections per layer, plus the embeddings."""
    hidden, heads, kv, dim = (
        config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    )
    attention = 2 * hidden * heads * dim + 2 * hidden * kv * dim  # q and o; k and v
    mlp = 3 * hidden * config["intermediate_size"]
    embeddings = config["vocab_size"] * hidden * (1 if config["tie_word_embeddings"] else 2)
    return config["num_hidden_layers"] * (attention + mlp) + embeddings


@pytest.mark.parametrize("preset", list(PUBLISHED))
def test_presets_match_the_published_configs(preset: str):
    model, config = PRESETS[preset], PUBLISHED[preset]
    assert (model.layers, model.hidden_size, model.attention_heads, model.kv_heads, model.head_size) == (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )
    assert (model.sliding_window, model.context_length) == (config["sliding_window"], config["max_position_embeddings"])
    letters = "".join("L" if kind == "sliding_attention" else "G" for kind in config["layer_types"])
    assert model.layer_pattern == letters
    # Parameters as counted from the config, within 0.5% (norms and biases left out).
    assert model.params == pytest.approx(_parameters(config), rel=0.005)


def test_layer_patterns_count_local_and_global_layers():
    assert (GEMMA2.local_layers, GEMMA2.layers - GEMMA2.local_layers) == (23, 23)
    assert (GEMMA3.local_layers, GEMMA3.layers - GEMMA3.local_layers) == (52, 10)  # global: layers 6, 12, ..., 60
    assert LLAMA.local_layers == 0


def test_kv_bytes_per_token():
    assert GEMMA2.kv_bytes_per_token == 46 * 2 * 16 * 128 * 2 == 376_832
    assert GEMMA3.kv_bytes_per_token == 62 * 2 * 16 * 128 * 2 == 507_904
    assert LLAMA.kv_bytes_per_token == 80 * 2 * 8 * 128 * 2 == 327_680


def test_linear_flops_are_two_per_parameter_per_token():
    assert GEMMA2.linear_flops(1000) == 2 * 27.2e9 * 1000
    assert LLAMA.linear_flops(8192) == 2 * 70.6e9 * 8192


def test_attention_flops_from_nothing():
    # Each (query, key) pair costs 4 x query heads x head size; within the window, the
    # n-th token attends to n positions: n (n + 1) / 2 pairs per layer.
    assert GEMMA2.attention_flops(1000) == 4 * 32 * 128 * 46 * (1000 * 1001 // 2)
    assert LLAMA.attention_flops(8192) == 4 * 64 * 128 * 80 * (8192 * 8193 // 2)
    # Gemma-3 over 2,048 tokens: its 52 local layers cap each token at 1,024 positions.
    local = 1024 * 1025 // 2 + 1024 * 1024
    assert GEMMA3.attention_flops(2048) == 4 * 32 * 128 * (10 * (2048 * 2049 // 2) + 52 * local)


def test_attention_flops_on_a_cached_prefix_with_and_without_sliding_windows():
    # 100 new tokens after 8,000 cached: positions 8,000..8,099 attend to 8,001..8,100
    # positions on a global layer, to 4,096 on a local one.
    global_pairs = (8001 + 8100) * 100 // 2
    assert GEMMA2.attention_flops(100, 8000) == 4 * 32 * 128 * (23 * global_pairs + 23 * 100 * 4096)
    no_window = msgspec.structs.replace(GEMMA2, layer_pattern="G")
    assert no_window.attention_flops(100, 8000) == 4 * 32 * 128 * 46 * global_pairs
    # 200 new after 4,000: the local layers' window fills at position 4,095.
    local_pairs = (4001 + 4096) * 96 // 2 + 104 * 4096
    assert GEMMA2.attention_flops(200, 4000) == 4 * 32 * 128 * 23 * ((4001 + 4200) * 200 // 2 + local_pairs)
    # Split anywhere, a prefill costs the same attention as in one go.
    assert GEMMA3.attention_flops(3000, 5000) + GEMMA3.attention_flops(5000) == GEMMA3.attention_flops(8000)


def test_attention_reads_each_attended_position_once_per_layer():
    per_layer_token = 2 * 16 * 128 * 2
    assert GEMMA2.attention_read_bytes(100, 8000) == (23 * 8100 + 23 * (100 + 4095)) * per_layer_token
    assert GEMMA2.attention_read_bytes(100, 1000) == 46 * 1100 * per_layer_token  # all inside the window
    assert LLAMA.attention_read_bytes(10, 0) == 80 * 10 * (2 * 8 * 128 * 2)


def test_prefill_is_the_slower_of_compute_and_memory():
    rate = 989.4e12 * 0.5
    flops = 2 * 70.6e9 * 8192 + LLAMA.attention_flops(8192)
    assert H100.prefill_s(LLAMA, 8192) == pytest.approx(flops / rate)  # compute-bound
    # One token reads every weight once: memory-bound on the 3.35 TB/s of HBM.
    nbytes = 70.6e9 * 2 + 327_680 + 80 * 4096
    assert H100.prefill_s(LLAMA, 1) == pytest.approx(nbytes / 3.35e12)
    assert H100.prefill_s(LLAMA, 0) == 0.0
    fp8 = CostModel(precision="fp8")
    assert fp8.prefill_s(LLAMA, 8192) == pytest.approx(flops / (1978.9e12 * 0.5))
    assert CostModel(gpu_flops=500e12, attention=False).prefill_s(GEMMA2, 4096) == pytest.approx(
        4096 * 2 * 27.2e9 / 500e12
    )


def test_loading_is_bytes_over_bandwidth_plus_a_latency_per_transfer():
    page = GEMMA2.page_bytes(PAGE)
    assert H100.transfer_s(page) == pytest.approx(page / 25e9 + 50e-6)
    assert H100.transfer_s(page, local=True) == pytest.approx(page / 64e9 + 10e-6)  # the H100's PCIe Gen5 link
    # 1,000 tokens: three full pages and a partial one, four transfers.
    assert H100.load_s(GEMMA2, 1000, PAGE) == pytest.approx(1000 * 376_832 / 25e9 + 4 * 50e-6)


# At a 99% hit rate: the first 99% of the context loaded, the last 1% prefilled (enough
# tokens for compute, not the weights' memory traffic, to bound the prefill).
CONTEXTS = (32000, 64000, 128000)
HIT = 0.99


def _idle_speedup(cost: CostModel, model: ModelGeometry, context: int) -> float:
    cached = round(context * HIT)
    return cost.reuse_speedup(model, cached, context - cached, PAGE)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_idle_speedup_at_high_hit_rate_grows_with_context(preset: str):
    speedups = [_idle_speedup(H100, PRESETS[preset], context) for context in CONTEXTS]
    assert speedups == sorted(speedups) and speedups[-1] > 1.05 * speedups[0], speedups


@pytest.mark.parametrize("preset", list(PRESETS))
def test_without_attention_the_idle_speedup_stays_at_the_linear_bound(preset: str):
    model, linear = PRESETS[preset], CostModel(attention=False)
    load_per_token = (model.page_bytes(PAGE) / 25e9 + 50e-6) / PAGE
    ratio = load_per_token / (2 * model.params / (989.4e12 * 0.5))
    for context in CONTEXTS:  # a partial last page costs a whole page's latency: within 0.1%
        assert _idle_speedup(linear, model, context) == pytest.approx(1 / (1 - HIT + HIT * ratio), rel=1e-3)
    assert 1 / (1 - HIT + HIT * ratio) < 1 / ratio  # the bound whatever the hit rate


def test_breakeven_bandwidth_falls_with_context_under_attention():
    for model in PRESETS.values():
        with_attention = [H100.breakeven_bytes_per_s(model, context) for context in (1024, 8192, 32768)]
        assert with_attention == sorted(with_attention, reverse=True)
        linear = CostModel(attention=False)
        flat = model.kv_bytes_per_token * 989.4e12 * 0.5 / (2 * model.params)
        assert linear.breakeven_bytes_per_s(model, 8192) == pytest.approx(flat)
    assert 3e9 < H100.breakeven_bytes_per_s(GEMMA2, 4096) < 3.5e9


def test_gpu_profiles_and_bad_input(tmp_path: Path):
    assert GPUS["h200"].bf16_flops == GPUS["h100"].bf16_flops and GPUS["h200"].hbm_bytes_per_s == 4.8e12
    with pytest.raises(ValueError, match="no fp8"):
        CostModel(gpu=GPUS["a100"], precision="fp8")
    for bad in ({"mfu": 0}, {"mfu": 1.5}, {"precision": "int4"}, {"pool_bytes_per_s": 0}):
        with pytest.raises(ValueError):
            CostModel(**bad)
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"name": "mine", "bf16_flops": 1e15, "hbm_bytes_per_s": 5e12, "host_bytes_per_s": 1e11}))
    assert load_gpu(str(path)) == GpuProfile(name="mine", bf16_flops=1e15, hbm_bytes_per_s=5e12, host_bytes_per_s=1e11)
    path.write_text('{"name": "mine", "bf16_flops": -1, "hbm_bytes_per_s": 5e12, "host_bytes_per_s": 1e11}')
    for spec in (str(path), "tpu-v9", str(tmp_path)):
        with pytest.raises(ValueError):
            load_gpu(spec)


def test_geometry_rejects_bad_attention_layouts():
    base = {"name": "m", "params": 1e9, "layers": 4, "kv_heads": 2, "head_size": 64}
    for bad in ({"query_heads": 3}, {"layer_pattern": "LG"}, {"layer_pattern": "GX", "sliding_window": 8}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(base | bad, ModelGeometry)
    assert msgspec.convert(base, ModelGeometry).attention_heads == 2  # multi-head attention by default
