"""The model side of ``bench decode``: a decoder-only transformer at a real model's shapes and
dtype, with random weights, whose decode step runs every layer the way vLLM 0.10.2's Llama/Qwen2
models do on the V0 XFORMERS path: RMSNorm, the fused QKV projection, rotary embedding
(neox style), the K/V write into vLLM's paged cache layout, paged attention through one tree's
compiled ``paged_attention_v1/v2`` (vLLM's v1/v2 rule, ``ops.forward_decode``), the output
projection, the gated SiLU MLP, the final norm and the LM head.

Why our own minimal decoder rather than transformers' modelling code: the step must be captured
whole in a CUDA graph with static buffers and read K/V from vLLM's paged layout, which
transformers' cache classes do not hold; and transformers is not on the H200 the results come
from (no network). The arithmetic outside attention is plain torch (matmul, rsqrt, silu) and is
the same for every tree, so any difference between trees is the attention kernel's.

The K/V write is torch indexing into vLLM's layouts (K ``[blocks, kv_heads, head/x, block, x]``,
V ``[blocks, kv_heads, head, block]``), the equivalent of vLLM's ``reshape_and_cache`` for
16-bit caches; tests check it against ``kvprefetch.verify.reference.gather_kv``, the reader the
identity checks use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..reading import load_json
from .schema import DecodeModel


@dataclass(frozen=True)
class DecoderConfig:
    """One GPU's share of a model (``tp`` ways tensor-parallel; the all-reduces are left out)."""

    name: str
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    qkv_bias: bool = False
    dtype: str = "float16"
    tp: int = 1
    source: str = ""

    def __post_init__(self) -> None:
        if min(self.hidden, self.num_heads, self.num_kv_heads, self.head_dim, self.intermediate,
               self.layers, self.vocab) < 1:
            raise ConfigError(f"model config '{self.name}' has a non-positive size",
                              "check the config's sizes")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{self.num_heads} query heads are not a multiple of "
                              f"{self.num_kv_heads} kv heads", "check the config")
        if self.dtype not in ("float16", "bfloat16"):
            raise ConfigError(f"dtype {self.dtype} is not benchmarked",
                              "use float16 or bfloat16 (--dtype)")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def weight_bytes(self) -> int:
        per_layer = (self.hidden * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden
                     + 3 * self.hidden * self.intermediate + 2 * self.hidden)
        return 2 * (self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden)

    def kv_bytes_per_block(self, block_size: int) -> int:
        """K and V of one block over every layer (16-bit caches)."""
        return 2 * 2 * self.layers * self.kv_size * block_size

    def to_dict(self) -> DecodeModel:
        return {"name": self.name, "hidden": self.hidden, "num_heads": self.num_heads,
                "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "intermediate": self.intermediate, "layers": self.layers, "vocab": self.vocab,
                "rope_theta": self.rope_theta, "rms_eps": self.rms_eps,
                "qkv_bias": self.qkv_bias, "dtype": self.dtype, "tp": self.tp,
                "source": self.source}


# No real model has sizes near these; a config beyond them is a mistake (or an attack), not a
# model, and would only fail later in an allocation.
_MAX_SIZE = 1 << 24
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KiB
_MAX_NUMBER = 1e300  # rope_theta, rms_norm_eps: a float (an int past it was an OverflowError)


def _size(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    """``cfg[key]`` as a size: a whole number from 1 to 2**24 (a JSON integer, or a float
    with no fraction); ``default`` when absent or null (required without one)."""
    if cfg.get(key) is None:
        if default is None:
            raise KeyError(key)
        return default
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) \
            or v != int(v):
        raise ValueError(f"'{key}' ({_shown(v)}: not a whole number)")
    if not 1 <= v <= _MAX_SIZE:
        raise ValueError(f"'{key}' ({_shown(v)}: a size must be 1 to {_MAX_SIZE})")
    return int(v)


def _finite(v: float) -> bool:
    """Whether the number is finite: an int always is (``math.isfinite`` of a JSON integer of
    hundreds of digits raised OverflowError, and the message named no key: "lacks or mangles
    int too large to convert to float"; issue 41, the thirty-seventh hostile pass)."""
    return isinstance(v, int) or math.isfinite(v)


def _shown(v: Any) -> str:
    """A config's value as a message shows it: cut, so a number of 4,300 digits is no page."""
    text = repr(v)
    return text if len(text) <= 40 else text[:40] + "…"


def _positive(cfg: dict[str, Any], key: str, default: float) -> float:
    """``cfg[key]`` as a positive finite number; ``default`` when absent or null."""
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or v <= 0 \
            or v > _MAX_NUMBER:
        raise ValueError(f"'{key}' ({_shown(v)}: not a positive number of at most 1e300)")
    return float(v)


def from_hf_config(cfg: dict[str, Any], name: str = "config", tp: int = 1,
                   layers: int | None = None, dtype: str | None = None,
                   source: str = "") -> DecoderConfig:
    """A ``DecoderConfig`` from a Hugging Face ``config.json`` (Llama, Mistral, Qwen2 style),
    ``tp`` ways tensor-parallel (heads, kv heads, intermediate and vocab split), optionally
    only ``layers`` layers."""
    fix = "pass a Hugging Face config.json of a decoder-only model"
    try:
        heads = _size(cfg, "num_attention_heads")
        hidden = _size(cfg, "hidden_size")
        kv = _size(cfg, "num_key_value_heads", heads)
        head_dim = _size(cfg, "head_dim") if cfg.get("head_dim") else hidden // heads
        inter, n_layers, vocab = (_size(cfg, "intermediate_size"),
                                  _size(cfg, "num_hidden_layers"), _size(cfg, "vocab_size"))
        rope_theta = _positive(cfg, "rope_theta", 10000.0)
        rms_eps = _positive(cfg, "rms_norm_eps", 1e-5)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"model config '{name}' lacks or mangles {exc}", fix) from exc
    if layers is not None and not 1 <= layers <= n_layers:
        raise ConfigError(f"--layers {layers}: model config '{name}' has {n_layers} layers",
                          f"pass --layers from 1 to {n_layers}, or leave it out for all of them")
    if tp < 1 or heads % tp or kv % tp or inter % tp:
        raise ConfigError(f"tensor-parallel {tp} does not divide {heads} heads, {kv} kv heads "
                          f"and intermediate {inter}", "pick a --tp that divides them")
    torch_dtype = str(cfg.get("torch_dtype") or "float16")
    return DecoderConfig(
        name=name, hidden=hidden, num_heads=heads // tp, num_kv_heads=kv // tp,
        head_dim=head_dim, intermediate=inter // tp, layers=layers or n_layers,
        vocab=-(-vocab // tp), rope_theta=rope_theta, rms_eps=rms_eps,
        qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        dtype=dtype or ("bfloat16" if torch_dtype == "bfloat16" else "float16"), tp=tp,
        source=source or name)


def load_config(path: Path, **kw: Any) -> DecoderConfig:
    try:
        cfg = load_json(Path(path), MAX_CONFIG_BYTES)  # a FIFO or /dev/zero: a ValueError
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read model config {path}: {exc}",
                          "pass the path of a Hugging Face config.json") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} is not a JSON object", "pass a Hugging Face config.json")
    return from_hf_config(cfg, name=Path(path).parent.name or Path(path).stem, source=str(path),
                          **kw)


# The models' own config.json values (sizes only; nothing is downloaded).
_LLAMA31_8B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "num_hidden_layers": 32, "vocab_size": 128256,
               "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}
_QWEN25_7B = {"hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
              "intermediate_size": 18944, "num_hidden_layers": 28, "vocab_size": 152064,
              "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "model_type": "qwen2",
              "torch_dtype": "bfloat16"}
_LLAMA3_70B = {"hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
               "intermediate_size": 28672, "num_hidden_layers": 80, "vocab_size": 128256,
               "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}
_PRESET_CONFIGS = {"llama-3.1-8b": _LLAMA31_8B, "qwen2.5-7b": _QWEN25_7B,
                   "llama-3-70b-tp8": _LLAMA3_70B}
PRESETS: dict[str, DecoderConfig] = {c.name: c for c in (
    from_hf_config(_LLAMA31_8B, "llama-3.1-8b", dtype="float16",
                   source="meta-llama/Llama-3.1-8B config.json"),
    from_hf_config(_QWEN25_7B, "qwen2.5-7b", dtype="float16",
                   source="Qwen/Qwen2.5-7B config.json"),
    # one GPU of eight: 8 query heads over 1 kv head, a few of the 80 layers
    from_hf_config(_LLAMA3_70B, "llama-3-70b-tp8", tp=8, layers=8, dtype="float16",
                   source="meta-llama/Meta-Llama-3-70B config.json, tensor-parallel 8, 8 layers"),
)}


def preset(name: str, dtype: str | None = None, layers: int | None = None) -> DecoderConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown decode preset '{name}'", f"use one of: {', '.join(PRESETS)}")
    c = PRESETS[name]
    if layers is not None:  # checked against the whole model's count (a preset may run fewer)
        from_hf_config(_PRESET_CONFIGS[name], name, tp=c.tp, layers=layers)
    return replace(c, dtype=dtype or c.dtype, layers=layers or c.layers)


class Decoder:
    """Random weights at the config's shapes on ``device``, and the paged KV caches of
    ``num_blocks`` blocks per layer (``alloc_cache``). ``step`` is one decode token per
    sequence."""

    def __init__(self, cfg: DecoderConfig, num_blocks: int, block_size: int = 16,
                 device: str = "cuda", seed: int = 0, max_position: int = 32768) -> None:
        import torch

        self.cfg, self.block_size, self.device = cfg, block_size, device
        dt = getattr(torch, cfg.dtype)
        self.dtype = dt
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*shape: int, scale: float = 0.02) -> Any:
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
                    * scale).to(dt)

        h, L = cfg.hidden, cfg.layers
        self.embed = w(cfg.vocab, h, scale=1.0)
        self.layers = [{
            "ln1": 1.0 + w(h), "ln2": 1.0 + w(h),
            "qkv": w(cfg.q_size + 2 * cfg.kv_size, h),
            "qkv_b": w(cfg.q_size + 2 * cfg.kv_size) if cfg.qkv_bias else None,
            "o": w(h, cfg.q_size), "gate_up": w(2 * cfg.intermediate, h),
            "down": w(h, cfg.intermediate),
        } for _ in range(L)]
        self.norm = 1.0 + w(h)
        self.lm_head = w(cfg.vocab, h)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device,
                                                     dtype=torch.float32) / cfg.head_dim))
        freqs = torch.outer(torch.arange(max_position, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = freqs.cos().to(dt), freqs.sin().to(dt)
        self.one = torch.ones((), dtype=torch.float32, device=device)  # k_scale, v_scale
        self.k_caches: list[Any] = []
        self.v_caches: list[Any] = []
        if num_blocks:
            self.alloc_cache(num_blocks, seed)

    def alloc_cache(self, num_blocks: int, seed: int = 0) -> None:
        """Paged K/V caches of ``num_blocks`` blocks per layer (vLLM's layouts), filled."""
        import torch

        self.drop_cache()
        c, bs = self.cfg, self.block_size
        x = 16 // 2  # vLLM's x: elements of a 16-byte vector
        self.k_caches = [torch.empty(num_blocks, c.num_kv_heads, c.head_dim // x, bs, x,
                                     dtype=self.dtype, device=self.device)
                         for _ in range(c.layers)]
        self.v_caches = [torch.empty(num_blocks, c.num_kv_heads, c.head_dim, bs,
                                     dtype=self.dtype, device=self.device)
                         for _ in range(c.layers)]
        self.fill_cache(seed)

    def drop_cache(self) -> None:
        import gc

        import torch

        self.k_caches, self.v_caches = [], []
        gc.collect()
        if str(self.device).startswith("cuda"):
            torch.cuda.empty_cache()

    def fill_cache(self, seed: int) -> None:
        """Random K/V in every block: the prompts' K/V, as if prefilled (nothing timed)."""
        import torch

        g = torch.Generator(device=self.device).manual_seed(seed + 1)
        for t in (*self.k_caches, *self.v_caches):
            t.normal_(generator=g)

    def _rms(self, x: Any, weight: Any) -> Any:
        import torch

        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps)
        return xf.to(self.dtype) * weight

    def _rope(self, t: Any, cos: Any, sin: Any) -> Any:
        import torch

        a, b = t.chunk(2, dim=-1)
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    def write_kv(self, layer: int, k: Any, v: Any, slots: Any) -> None:
        """K/V of one token per sequence into the layer's paged caches at ``slots`` (vLLM's
        reshape_and_cache for 16-bit caches; padded rows point at the scratch block)."""
        n = k.shape[0]
        blocks, offs = slots // self.block_size, slots % self.block_size
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        kc[blocks, :, :, offs, :] = k.view(n, self.cfg.num_kv_heads, -1, kc.shape[-1])
        vc[blocks, :, :, offs] = v.view(n, self.cfg.num_kv_heads, self.cfg.head_dim)

    def step(self, ops: Any, tokens: Any, positions: Any, slots: Any, seq_lens: Any,
             block_tables: Any, max_seq_len: int, attn_out: Any = None,
             workspace: Any = None) -> Any:
        """Logits ``[batch, vocab]`` of one decode step through ``ops``' paged attention."""
        import torch.nn.functional as F

        from ..kernels.ops import DecodeArgs, forward_decode

        c = self.cfg
        n = tokens.shape[0]
        x = F.embedding(tokens, self.embed)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        scale = c.head_dim ** -0.5
        for i, lw in enumerate(self.layers):
            h = self._rms(x, lw["ln1"])
            qkv = F.linear(h, lw["qkv"], lw["qkv_b"])
            q, k, v = qkv.split((c.q_size, c.kv_size, c.kv_size), dim=-1)
            q = self._rope(q.view(n, c.num_heads, c.head_dim), cos, sin)
            k = self._rope(k.view(n, c.num_kv_heads, c.head_dim), cos, sin)
            self.write_kv(i, k, v, slots)
            args = DecodeArgs(query=q.contiguous(), key_cache=self.k_caches[i],
                              value_cache=self.v_caches[i], block_tables=block_tables,
                              seq_lens=seq_lens, max_seq_len=max_seq_len, kv_cache_dtype="auto",
                              num_kv_heads=c.num_kv_heads, scale=scale, alibi_slopes=None,
                              k_scale=self.one, v_scale=self.one)
            attn, _ = forward_decode(ops, args, out=attn_out, workspace=workspace)
            x = x + F.linear(attn.reshape(n, c.q_size), lw["o"])
            h = self._rms(x, lw["ln2"])
            gate, up = F.linear(h, lw["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, lw["down"])
        return F.linear(self._rms(x, self.norm), self.lm_head)

    def free(self) -> None:
        self.layers = []
        self.drop_cache()
