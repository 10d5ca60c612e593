"""Which paged-attention instantiations a kernels-only build compiles.

vLLM's paged_attention_v{1,2}.cu instantiate 9 head sizes x 3 block sizes x 9 (query dtype,
cache dtype) pairs x 2 (block-sparse) = 486 kernels each. The full set is the default; a
narrowed set compiles a generated copy of the tree's real launcher source in which the
unselected ``case`` arms are dropped and the dtype dispatch is replaced by one of ours.
Everything here is a pure function of the source text, checked against what it expects to
find, so upstream drift is an error, not a silently different build."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import BuildError, ConfigError

HEAD_SIZES = (32, 64, 80, 96, 112, 120, 128, 192, 256)
BLOCK_SIZES = (8, 16, 32)
# token -> (query C type, cache C type, Fp8KVCacheDataType, kv_cache_dtype strings accepted)
_QUERY = {"fp16": "uint16_t", "bf16": "__nv_bfloat16", "fp32": "float"}
_TORCH = {"fp16": "at::ScalarType::Half", "bf16": "at::ScalarType::BFloat16",
          "fp32": "at::ScalarType::Float"}
KV_DTYPES = ("fp16", "bf16", "fp32", "fp8", "fp8_e5m2")


@dataclass(frozen=True)
class Selection:
    head_sizes: tuple[int, ...] = HEAD_SIZES
    block_sizes: tuple[int, ...] = BLOCK_SIZES
    kv_dtypes: tuple[str, ...] = KV_DTYPES

    @property
    def full(self) -> bool:
        return (set(self.head_sizes) == set(HEAD_SIZES)
                and set(self.block_sizes) == set(BLOCK_SIZES)
                and set(self.kv_dtypes) == set(KV_DTYPES))

    def combos(self) -> list[tuple[str, str, str]]:
        """(query dtype, cache dtype, kv_cache_dtype string) pairs compiled in."""
        queries = [d for d in ("fp16", "bf16", "fp32") if d in self.kv_dtypes] or ["fp16", "bf16"]
        out: list[tuple[str, str, str]] = [(d, d, "auto") for d in ("fp16", "bf16", "fp32")
                                           if d in self.kv_dtypes]
        for fp8 in ("fp8", "fp8_e5m2"):
            if fp8 in self.kv_dtypes:
                out += [(q, "fp8_e4m3" if fp8 == "fp8" else "fp8_e5m2", fp8) for q in queries]
        return out

    def kernel_count(self) -> int:
        """paged_attention kernels per launcher source (x2 for block-sparse)."""
        return len(self.head_sizes) * len(self.block_sizes) * len(self.combos()) * 2

    def to_dict(self) -> dict[str, object]:
        return {"head_sizes": list(self.head_sizes), "block_sizes": list(self.block_sizes),
                "kv_dtypes": list(self.kv_dtypes), "full": self.full,
                "kernels_per_source": self.kernel_count()}


def _ints(text: str | None, allowed: tuple[int, ...], what: str) -> tuple[int, ...]:
    if not text:
        return allowed
    try:
        vals = tuple(sorted({int(t) for t in re.split(r"[,\s]+", text.strip()) if t}))
    except ValueError:
        raise ConfigError(f"--{what} {text!r} is not a list of integers",
                          "use a comma-separated subset of "
                          f"{', '.join(map(str, allowed))}") from None
    bad = [v for v in vals if v not in allowed]
    if bad or not vals:
        raise ConfigError(f"--{what} {text!r}: vLLM v0.10.2 does not instantiate "
                          f"{bad or 'nothing'}",
                          f"choose from {', '.join(map(str, allowed))}")
    return vals


def parse_selection(head_sizes: str | None, block_sizes: str | None,
                    kv_dtypes: str | None) -> Selection:
    kv: tuple[str, ...] = KV_DTYPES
    if kv_dtypes:
        toks = tuple(dict.fromkeys(t.replace("fp8_e4m3", "fp8") for t in
                                   re.split(r"[,\s]+", kv_dtypes.strip()) if t))
        bad = [t for t in toks if t not in KV_DTYPES]
        if bad or not toks:
            raise ConfigError(f"--kv-dtypes {kv_dtypes!r}: unknown {bad or 'empty'}",
                              f"choose from {', '.join(KV_DTYPES)} (fp8 = fp8_e4m3)")
        kv = tuple(t for t in KV_DTYPES if t in toks)
    return Selection(_ints(head_sizes, HEAD_SIZES, "head-sizes"),
                     _ints(block_sizes, BLOCK_SIZES, "block-sizes"), kv)


def _drop(pattern: str, text: str, expected: int, what: str) -> str:
    new, n = re.subn(pattern, "", text, flags=re.MULTILINE)
    if n != expected:
        raise BuildError(f"narrowing {what}: expected {expected} match(es), found {n}; the "
                         "upstream launcher source is not the v0.10.2 one we know",
                         "build the full instantiation set (omit --head-sizes/--block-sizes/"
                         "--kv-dtypes) or fetch pristine trees")
    return new


def _expect(pattern: str, text: str, what: str) -> str:
    n = len(re.findall(pattern, text, flags=re.MULTILINE))
    if n != 1:
        raise BuildError(f"narrowing {what}: expected its case arm once in the launcher source, "
                         f"found {n}; the upstream source is not the v0.10.2 one we know",
                         "fetch pristine trees (kvprefetch fetch --force)")
    return text


def _dispatch_macro(sel: Selection) -> str:
    arms = []
    for q, _cache, kv in sel.combos():
        if kv == "auto":
            cond = f'KV_DTYPE == "auto" && SRC_DTYPE == {_TORCH[q]}'
            call = f"FN({_QUERY[q]}, {_QUERY[q]}, vllm::Fp8KVCacheDataType::kAuto);"
        else:
            names = ('KV_DTYPE == "fp8" || KV_DTYPE == "fp8_e4m3"' if kv == "fp8"
                     else 'KV_DTYPE == "fp8_e5m2"')
            enum = "kFp8E4M3" if kv == "fp8" else "kFp8E5M2"
            cond = f"({names}) && SRC_DTYPE == {_TORCH[q]}"
            call = f"FN({_QUERY[q]}, uint8_t, vllm::Fp8KVCacheDataType::{enum});"
        arms.append(f"if ({cond}) {{ {call} }}")
    body = " else ".join(arms)
    return ("// kvprefetch narrowed build: dispatch only the selected (dtype, kv cache dtype) "
            "pairs.\n"
            "#undef DISPATCH_BY_KV_CACHE_DTYPE\n"
            "#define DISPATCH_BY_KV_CACHE_DTYPE(SRC_DTYPE, KV_DTYPE, FN) \\\n"
            f"  {body} else {{ TORCH_CHECK(false, \"kvprefetch narrowed build: kv cache dtype \", "
            "KV_DTYPE, \" with \", SRC_DTYPE, \" was not compiled in\"); }\n")


def narrow_source(text: str, version: int, sel: Selection) -> str:
    """Return the launcher source ``paged_attention_v{version}.cu`` narrowed to ``sel``."""
    for h in HEAD_SIZES:
        arm = rf"^\s*case {h}:\n\s*LAUNCH_PAGED_ATTENTION_V{version}\({h}\);\n\s*break;\n"
        # A selected arm must be there too: without it the launcher would compile no kernel for
        # that size and fail only at run time with "Unsupported head size".
        text = _drop(arm, text, 1, f"head size {h}") if h not in sel.head_sizes \
            else _expect(arm, text, f"head size {h}")
    for b in BLOCK_SIZES:
        arm = (rf"^\s*case {b}:\s*\\\n\s*CALL_V{version}_LAUNCHER_SPARSITY\(T, CACHE_T, {b}, "
               rf"KV_DTYPE\);\s*\\\n\s*break;\s*\\\n")
        text = _drop(arm, text, 1, f"block size {b}") if b not in sel.block_sizes \
            else _expect(arm, text, f"block size {b}")
    anchor = f"void paged_attention_v{version}("
    if text.count(anchor) != 1:
        raise BuildError(f"narrowing: `{anchor}` not found exactly once in the launcher source",
                         "build the full instantiation set or fetch pristine trees")
    return text.replace(anchor, _dispatch_macro(sel) + "\n" + anchor)
