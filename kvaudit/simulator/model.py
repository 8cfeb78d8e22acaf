"""Model geometry (page bytes and shapes per KV layout, attention layout) and the cost model of one replica.

The cost model is first-order and documented in docs/boundaries.md: prefilling `new`
tokens on `cached` ones costs linear FLOPs (2 × parameters per new token) plus
attention FLOPs (each new token against every position it attends to, over each
layer's window), on a roofline of the GPU's peak rate × a model-FLOPs-utilisation
factor and its memory bandwidth; loading KV costs its bytes over the tier's
bandwidth plus a latency per transfer. Every number a run reports can be checked by
hand from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from kvaudit.contract import KVConfig, bytes_per_element
from kvaudit.simulator.hardware import GPUS, WEIGHT_BYTES, GpuProfile
from kvaudit.simulator.specs import load_spec

# The two KV layouts of the rolling upgrade (docs/design.md section 1), per page of one
# block over all layers: [layers, 2, block, heads, head_size] and the packed
# [layers, heads, block, 2 * head_size]. Same bytes, different meaning.
LAYOUT_SPLIT: Final = "NB_2_BS_NH_HS"
LAYOUT_PACKED: Final = "NB_NH_BS_2HS"
HASH_ALGO: Final = "sha256_chain"
GLOBAL: Final = "G"  # a layer attending to every earlier position
LOCAL: Final = "L"  # a layer attending to its sliding window only


class ModelGeometry(msgspec.Struct, frozen=True, kw_only=True):
    """What the simulator needs to know about a model (the names of its Hugging Face config.json in brackets).

    params: parameters the prefill multiplies by (2 FLOPs each per token).
    layers [num_hidden_layers], kv_heads [num_key_value_heads], head_size [head_dim].
    query_heads [num_attention_heads]: None for as many as KV heads (multi-head attention).
    hidden_size [hidden_size], context_length [max_position_embeddings]: shown with the
        geometry; the cost model does not need them.
    sliding_window [sliding_window]: the window, in tokens, of the local layers.
    layer_pattern: one letter per layer, repeated over the layers: G attends to every
        earlier position, L to its sliding window (Gemma-2: LG; Gemma-3: LLLLLG).
    """

    name: str
    params: float
    layers: int
    kv_heads: int
    head_size: int
    dtype: str = "bfloat16"
    query_heads: int | None = None
    hidden_size: int | None = None
    context_length: int | None = None
    sliding_window: int | None = None
    layer_pattern: str = GLOBAL

    def __post_init__(self) -> None:
        if bytes_per_element(self.dtype) is None:
            raise ValueError(f"model {self.name}: unknown dtype {self.dtype!r}")
        if min(self.params, self.layers, self.kv_heads, self.head_size) <= 0:
            raise ValueError(f"model {self.name}: params, layers, kv_heads and head_size must be positive")
        if self.attention_heads % self.kv_heads:
            raise ValueError(f"model {self.name}: query_heads must be a multiple of kv_heads")
        if not self.layer_pattern or set(self.layer_pattern) - {GLOBAL, LOCAL}:
            raise ValueError(f"model {self.name}: layer_pattern must be letters {GLOBAL} and {LOCAL}")
        if LOCAL in self.layer_pattern and (self.sliding_window or 0) <= 0:
            raise ValueError(f"model {self.name}: local ({LOCAL}) layers need a positive sliding_window")

    @property
    def attention_heads(self) -> int:
        return self.query_heads or self.kv_heads

    @property
    def local_layers(self) -> int:
        """Layers attending over the sliding window: the pattern's L letters, repeated over the layers."""
        pattern = self.layer_pattern
        return sum(pattern[i % len(pattern)] == LOCAL for i in range(self.layers))

    @property
    def kv_bytes_per_layer_token(self) -> int:
        return 2 * self.kv_heads * self.head_size * (bytes_per_element(self.dtype) or 0)

    @property
    def kv_bytes_per_token(self) -> int:
        """Every layer keeps every token's K and V (the pool stores local layers in full too)."""
        return self.layers * self.kv_bytes_per_layer_token

    def linear_flops(self, new: int) -> float:
        """The matrix multiplications by the weights: 2 FLOPs per parameter per new token."""
        return 2 * self.params * new

    def attention_flops(self, new: int, cached: int = 0) -> float:
        """QKᵀ and attention × V for `new` tokens at positions cached .. cached + new - 1.

        Each (query, key) pair costs 4 × query heads × head size FLOPs (2 for the dot
        product, 2 for weighting the value), summed over the layers and, for each new
        token, over the positions it attends to: itself and every earlier one on a
        global layer, at most `sliding_window` of them on a local layer.
        """
        pairs = (self.layers - self.local_layers) * _attended(cached, new, None)
        if self.local_layers:
            pairs += self.local_layers * _attended(cached, new, self.sliding_window)
        return 4 * self.attention_heads * self.head_size * pairs

    def attention_read_bytes(self, new: int, cached: int = 0) -> float:
        """KV the attention of `new` tokens reads, each position once per layer (the roofline's least traffic)."""
        positions = (self.layers - self.local_layers) * (cached + new)
        if self.local_layers and self.sliding_window:
            positions += self.local_layers * min(cached + new, new + self.sliding_window - 1)
        return positions * self.kv_bytes_per_layer_token

    def page_bytes(self, page_tokens: int) -> int:
        return self.kv_bytes_per_token * page_tokens

    def page_shape(self, layout: str, page_tokens: int) -> tuple[int, ...]:
        if layout == LAYOUT_PACKED:
            return (self.layers, self.kv_heads, page_tokens, 2 * self.head_size)
        return (self.layers, 2, page_tokens, self.kv_heads, self.head_size)

    def kv_config(self, layout: str, page_tokens: int) -> KVConfig:
        return KVConfig(
            model=self.name,
            dtype=self.dtype,
            layout=layout,
            block_size=page_tokens,
            world_size=1,
            rank=0,
            hash_algo=HASH_ALGO,
            layers=self.layers,
            kv_heads=self.kv_heads,
            head_size=self.head_size,
        ).with_geometry()


def _attended(cached: int, new: int, window: int | None) -> int:
    """Sum over positions p in [cached, cached + new) of the positions p attends to: min(p + 1, window)."""

    def prefix(m: int) -> int:  # the same sum over [0, m)
        if window is None or m <= window:
            return m * (m + 1) // 2
        return window * (window + 1) // 2 + (m - window) * window

    return prefix(cached + new) - prefix(cached)


# Checked against each model's published config.json and parameter count (docs/boundaries.md).
PRESETS: Final[dict[str, ModelGeometry]] = {
    "gemma-2-27b": ModelGeometry(
        name="google/gemma-2-27b",
        params=27.2e9,
        layers=46,
        kv_heads=16,
        head_size=128,
        query_heads=32,
        hidden_size=4608,
        context_length=8192,
        sliding_window=4096,
        layer_pattern=LOCAL + GLOBAL,
    ),
    "gemma-3-27b": ModelGeometry(
        name="google/gemma-3-27b",
        params=27.0e9,
        layers=62,
        kv_heads=16,
        head_size=128,
        query_heads=32,
        hidden_size=5376,
        context_length=131072,
        sliding_window=1024,
        layer_pattern=5 * LOCAL + GLOBAL,
    ),
    # Llama-3-70B has the same geometry with an 8,192-token window.
    "llama-3.1-70b": ModelGeometry(
        name="meta-llama/Llama-3.1-70B",
        params=70.6e9,
        layers=80,
        kv_heads=8,
        head_size=128,
        query_heads=64,
        hidden_size=8192,
        context_length=131072,
    ),
}


def load_model(spec: str) -> ModelGeometry:
    """A preset name, or a JSON file with the fields of `ModelGeometry` (name, params, layers, kv_heads, ...).

    Raises:
        ValueError: neither a preset nor a readable geometry file.
    """
    return load_spec(spec, PRESETS, ModelGeometry, "model geometry")


@dataclass(frozen=True)
class CostModel:
    """Latencies of one replica's operations, in seconds.

    Args:
        gpu: the GPU profile the roofline runs on.
        mfu: model-FLOPs utilisation, the share of the peak rate prefill sustains.
        precision: of the weights and matrix multiplications (bf16 or fp8).
        attention: False charges the linear FLOPs only: prefill linear in prompt length.
        gpu_flops: an effective prefill rate (FLOP/s) replacing peak × MFU.
        pool_bytes_per_s: shared pool to GPU bandwidth (a 200 Gb/s network by default).
        local_bytes_per_s: the replica's local tier (host memory) to GPU; None: the GPU's host link.
        pool_latency_s, local_latency_s: fixed cost of each transfer from that tier.
        lookup_s: a pool lookup's fixed latency.
        decode_s_per_token: time per generated token, which spaces a session's turns.
    """

    gpu: GpuProfile = GPUS["h100"]
    mfu: float = 0.5
    precision: str = "bf16"
    attention: bool = True
    gpu_flops: float | None = None
    pool_bytes_per_s: float = 25e9
    local_bytes_per_s: float | None = None
    pool_latency_s: float = 50e-6
    local_latency_s: float = 10e-6
    lookup_s: float = 200e-6
    decode_s_per_token: float = 0.025

    def __post_init__(self) -> None:
        self.gpu.peak_flops(self.precision)  # raises for a precision unknown or missing on this GPU
        if not 0 < self.mfu <= 1:
            raise ValueError(f"MFU {self.mfu:g}: expected a share in (0, 1]")
        rates = (self.pool_bytes_per_s, self.local_bytes_per_s or 1.0, self.gpu_flops or 1.0)
        if min(rates) <= 0 or min(self.pool_latency_s, self.local_latency_s, self.lookup_s) < 0:
            raise ValueError("rates and bandwidths must be positive, latencies not negative")

    @property
    def effective_flops(self) -> float:
        return self.gpu_flops or self.gpu.peak_flops(self.precision) * self.mfu

    @property
    def host_bytes_per_s(self) -> float:
        return self.local_bytes_per_s or self.gpu.host_bytes_per_s

    def prefill_flops(self, model: ModelGeometry, new: int, cached: int = 0) -> float:
        attention = model.attention_flops(new, cached) if self.attention else 0.0
        return model.linear_flops(new) + attention

    def prefill_bytes(self, model: ModelGeometry, new: int, cached: int = 0) -> float:
        """GPU memory traffic: the weights once, the new tokens' KV written, and (with attention) the KV read."""
        attention = model.attention_read_bytes(new, cached) if self.attention else 0.0
        return model.params * WEIGHT_BYTES[self.precision] + new * model.kv_bytes_per_token + attention

    def prefill_s(self, model: ModelGeometry, new: int, cached: int = 0) -> float:
        """Prefill of `new` tokens after `cached` ones: the slower of computing and moving memory (0 for none)."""
        if new <= 0:
            return 0.0
        compute = self.prefill_flops(model, new, cached) / self.effective_flops
        return max(compute, self.prefill_bytes(model, new, cached) / self.gpu.hbm_bytes_per_s)

    def transfer_s(self, nbytes: int, *, local: bool = False) -> float:
        """One transfer from the pool (or the local tier): its bytes over the bandwidth, plus its fixed latency."""
        if local:
            return nbytes / self.host_bytes_per_s + self.local_latency_s
        return nbytes / self.pool_bytes_per_s + self.pool_latency_s

    def load_s(self, model: ModelGeometry, tokens: int, page_tokens: int, *, local: bool = False) -> float:
        """Loading `tokens` of KV page by page, one transfer per page (as the simulator fetches)."""
        pages, rest = divmod(tokens, page_tokens)
        page = self.transfer_s(model.page_bytes(page_tokens), local=local)
        return pages * page + (self.transfer_s(model.page_bytes(rest), local=local) if rest else 0.0)

    def reuse_speedup(
        self, model: ModelGeometry, cached: int, new: int, page_tokens: int, *, local: bool = False
    ) -> float:
        """Idle TTFT without reuse over with it, for a prompt whose first `cached` tokens are loaded."""
        with_reuse = self.load_s(model, cached, page_tokens, local=local) + self.prefill_s(model, new, cached)
        return self.prefill_s(model, cached + new) / with_reuse

    def breakeven_bytes_per_s(self, model: ModelGeometry, context: int) -> float:
        """The bandwidth below which loading a `context`-token prefix is slower than recomputing it.

        Per-transfer latencies aside: the prefix's KV bytes over the time to prefill it from nothing.
        """
        return context * model.kv_bytes_per_token / self.prefill_s(model, context)
