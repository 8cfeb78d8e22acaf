"""Model geometry (page bytes and shapes per KV layout) and the cost model of one replica.

The cost model is deliberately first-order (docs/design.md section 5): prefill costs
2 × parameters FLOPs per token at an effective GPU rate, and moving a page costs its
bytes over a host-to-GPU bandwidth. That is enough to say when loading beats
recomputing, and every number a run reports can be checked by hand from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from kvaudit.contract import KVConfig, bytes_per_element

# The two KV layouts of the rolling upgrade (docs/design.md section 1), per page of one
# block over all layers: [layers, 2, block, heads, head_size] and the packed
# [layers, heads, block, 2 * head_size]. Same bytes, different meaning.
LAYOUT_SPLIT: Final = "NB_2_BS_NH_HS"
LAYOUT_PACKED: Final = "NB_NH_BS_2HS"
HASH_ALGO: Final = "sha256_chain"


class ModelGeometry(msgspec.Struct, frozen=True, kw_only=True):
    """What the simulator needs to know about a model."""

    name: str
    params: float
    layers: int
    kv_heads: int
    head_size: int
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if bytes_per_element(self.dtype) is None:
            raise ValueError(f"model {self.name}: unknown dtype {self.dtype!r}")
        if min(self.params, self.layers, self.kv_heads, self.head_size) <= 0:
            raise ValueError(f"model {self.name}: params, layers, kv_heads and head_size must be positive")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_size * (bytes_per_element(self.dtype) or 0)

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
        )


PRESETS: Final[dict[str, ModelGeometry]] = {
    "gemma-2-27b": ModelGeometry(name="google/gemma-2-27b", params=27.2e9, layers=46, kv_heads=16, head_size=128),
    "gemma-3-27b": ModelGeometry(name="google/gemma-3-27b", params=27.4e9, layers=62, kv_heads=16, head_size=128),
}


def load_model(spec: str) -> ModelGeometry:
    """A preset name, or a JSON file with name, params, layers, kv_heads, head_size (and dtype).

    Raises:
        ValueError: neither a preset nor a readable geometry file.
    """
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"model {spec!r}: not a preset ({', '.join(PRESETS)}) nor a geometry JSON file")
    try:
        return msgspec.convert(json.loads(path.read_text()), ModelGeometry)
    except (json.JSONDecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"{spec}: bad model geometry ({exc})") from None


@dataclass(frozen=True)
class CostModel:
    """Latencies of one replica's operations, in seconds.

    Args:
        gpu_flops: effective prefill rate (FLOP/s); ~500 TFLOP/s on an H100-class GPU.
        pool_bytes_per_s: shared pool to GPU bandwidth.
        local_bytes_per_s: the replica's own local tier to GPU bandwidth.
        lookup_s: a pool lookup's fixed latency.
        decode_s_per_token: time per generated token, which spaces a session's turns.
    """

    gpu_flops: float = 500e12
    pool_bytes_per_s: float = 25e9
    local_bytes_per_s: float = 50e9
    lookup_s: float = 200e-6
    decode_s_per_token: float = 0.025

    def prefill_s(self, model: ModelGeometry, tokens: int) -> float:
        return tokens * 2 * model.params / self.gpu_flops

    def transfer_s(self, nbytes: int, *, local: bool = False) -> float:
        return nbytes / (self.local_bytes_per_s if local else self.pool_bytes_per_s)

    def breakeven_bytes_per_s(self, model: ModelGeometry) -> float:
        """The bandwidth below which loading a token's KV is slower than recomputing it."""
        return model.kv_bytes_per_token / self.prefill_s(model, 1)
