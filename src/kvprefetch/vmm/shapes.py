"""The vmm bench's shapes: its configuration and, per (batch, context), how many layers one
replay rotates through and how much memory a variant holds. Pure: no torch, no driver. Shared
by ``bench`` (which times them) and ``paged`` (which times vLLM's paged kernel on them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .layout import KVCacheSpec, make_geometry

DEFAULT_BATCHES = (1, 8, 32, 64, 128)
DEFAULT_CONTEXTS = (512, 1024, 4096, 16384)
L2_BYTES_IF_UNKNOWN = 60 * 1024 * 1024
GRANULARITY_ASSUMED_FOR_PLANNING = 2 * 1024 * 1024  # only for --dry-run estimates

@dataclass(frozen=True)
class DecodeConfig:
    q_heads: int = 32          # Llama-3.1-8B
    kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "float16"
    batches: tuple[int, ...] = DEFAULT_BATCHES
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    l2_factor: float = 4.0
    max_layers: int = 128
    rounds: int = 9
    sample_ms: float = 4.0     # target time of one timed sample
    memory_fraction: float = 0.35  # of free device memory one shape may use (both variants)


@dataclass(frozen=True)
class ShapePlan:
    batch: int
    context: int
    layers: int                # layers rotated per replay
    kv_bytes_per_call: int     # K + V bytes one SDPA call reads
    bytes_per_variant: int     # device memory one variant holds (page-rounded for VMM)


def layers_to_rotate(bytes_per_layer: int, l2_bytes: int, l2_factor: float, max_layers: int) -> int:
    """How many layers one replay walks so that it reads at least ``l2_factor`` x L2."""
    need = math.ceil(l2_factor * l2_bytes / max(1, bytes_per_layer))
    return max(1, min(max_layers, need))


def plan_shapes(cfg: DecodeConfig, l2_bytes: int, free_bytes: int | None,
                page_size: int = GRANULARITY_ASSUMED_FOR_PLANNING) -> tuple[list[ShapePlan],
                                                                            list[str]]:
    """The shapes to run and why any were trimmed (memory)."""
    plans: list[ShapePlan] = []
    trimmed: list[str] = []
    for b in cfg.batches:
        for s in cfg.contexts:
            spec = KVCacheSpec(num_layers=1, num_kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                               max_batch=b, max_context=s, dtype=cfg.dtype)
            g = make_geometry(spec, page_size)
            kv_bytes = 2 * b * s * g.token_bytes
            layers = layers_to_rotate(kv_bytes, l2_bytes, cfg.l2_factor, cfg.max_layers)
            per_variant = layers * 2 * g.tensor_bytes
            if free_bytes is not None and 2 * per_variant > cfg.memory_fraction * free_bytes:
                trimmed.append(f"B={b} S={s}: needs {2 * per_variant / 2**30:.1f} GiB, more than "
                               f"{cfg.memory_fraction:.0%} of {free_bytes / 2**30:.0f} GiB free")
                continue
            plans.append(ShapePlan(b, s, layers, kv_bytes, per_variant))
    return plans, trimmed
