"""kvprefetch.kernels.selection on the REAL vLLM 0.10.2 launcher sources (paged_attention_v1.cu and
v2.cu from the fetched sdist): kernel-count arithmetic checked against the source text,
narrowing, refusal of a drifted source and of an unknown size on the CLI (the option parsing
alone is in tests/unit/test_selection.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvprefetch import upstream
from kvprefetch.errors import BuildError, ConfigError
from kvprefetch.kernels.selection import (
    BLOCK_SIZES,
    HEAD_SIZES,
    Selection,
    narrow_source,
    parse_selection,
)
from tests.integration.helpers import kvprefetch_cli_split


@pytest.fixture(scope="module")
def sources(fetched_template: Path) -> dict[int, str]:
    root = fetched_template / "pristine" / "sdist"
    return {v: (root / p).read_text()
            for v, p in zip((1, 2), upstream.PAGED_ATTENTION_SOURCES, strict=True)}


@pytest.fixture(scope="module")
def upstream_dispatch(fetched_template: Path) -> str:
    text = (fetched_template / "pristine" / "sdist" /
            "csrc/quantization/fp8/nvidia/quant_utils.cuh").read_text()
    start = text.index("#define DISPATCH_BY_KV_CACHE_DTYPE")
    return text[start:text.index("#endif", start)]


def _counts(text: str, version: int) -> tuple[int, int]:
    """(head-size arms, block-size arms) that the launcher source still instantiates."""
    heads = len(re.findall(rf"^\s*LAUNCH_PAGED_ATTENTION_V{version}\(\d+\);", text, re.MULTILINE))
    blocks = len(re.findall(
        rf"CALL_V{version}_LAUNCHER_SPARSITY\(T, CACHE_T, \d+, KV_DTYPE\)", text))
    return heads, blocks


def test_full_set_matches_the_real_sources(sources: dict[int, str], upstream_dispatch: str) -> None:
    full = Selection()
    assert full.full
    combos = len(re.findall(r"FN\(", upstream_dispatch))
    for version, text in sources.items():
        heads, blocks = _counts(text, version)
        assert (heads, blocks) == (len(HEAD_SIZES), len(BLOCK_SIZES))
        assert full.kernel_count() == heads * blocks * combos * 2  # x2: block-sparse or not
    assert full.kernel_count() == 486  # what vLLM 0.10.2 instantiates per launcher source


@pytest.mark.parametrize(("heads", "blocks", "kv", "combos"), [
    ("128", "16", "fp16,bf16", 2),
    ("64,128,256", "16,32", "fp16,bf16,fp8", 4),      # fp8 pairs with each query dtype
    ("128", "8", "fp8", 2),                           # fp8 alone: fp16 and bf16 queries
    ("80", "32", "fp32,fp8_e5m2", 2),
    (None, None, "fp16,bf16,fp32,fp8,fp8_e5m2", 9),
])
def test_narrowed_kernel_count_matches_the_narrowed_text(
        sources: dict[int, str], heads: str | None, blocks: str | None, kv: str,
        combos: int) -> None:
    sel = parse_selection(heads, blocks, kv)
    assert len(sel.combos()) == combos
    assert sel.kernel_count() == len(sel.head_sizes) * len(sel.block_sizes) * combos * 2
    for version, text in sources.items():
        narrowed = narrow_source(text, version, sel)
        assert _counts(narrowed, version) == (len(sel.head_sizes), len(sel.block_sizes))
        for h in HEAD_SIZES:
            present = f"LAUNCH_PAGED_ATTENTION_V{version}({h});" in narrowed
            assert present == (h in sel.head_sizes)
        macro = narrowed[narrowed.index("#define DISPATCH_BY_KV_CACHE_DTYPE"):
                         narrowed.index(f"void paged_attention_v{version}(")]
        assert macro.count("FN(") == combos
        assert _counts(narrowed, version)[0] * _counts(narrowed, version)[1] * \
            macro.count("FN(") * 2 == sel.kernel_count()
        # everything else of the real launcher is kept verbatim
        assert narrowed.count(f"void paged_attention_v{version}(") == 1
        assert f"void paged_attention_v{version}_launcher(" in narrowed
        assert "#undef DISPATCH_BY_KV_CACHE_DTYPE" in narrowed


def test_the_build_narrowing_is_what_the_kernels_only_build_uses(sources: dict[int, str]) -> None:
    sel = parse_selection("128", "16", "fp16,bf16")
    assert sel.to_dict() == {"head_sizes": [128], "block_sizes": [16],
                             "kv_dtypes": ["fp16", "bf16"], "full": False,
                             "kernels_per_source": 4}
    text = narrow_source(sources[1], 1, sel)
    assert 'KV_DTYPE == "auto" && SRC_DTYPE == at::ScalarType::Half' in text
    assert "FN(__nv_bfloat16, __nv_bfloat16, vllm::Fp8KVCacheDataType::kAuto)" in text
    assert "kFp8E4M3" not in text.split("#undef DISPATCH_BY_KV_CACHE_DTYPE")[1].split(
        "void paged_attention_v1(")[0]


def test_unknown_head_size_on_the_cli_is_exit_2(tmp_path: Path) -> None:
    res = kvprefetch_cli_split("build", "--workdir", str(tmp_path / "w"), "--kernels-only",
                               "--head-sizes", "100")
    assert res.returncode == ConfigError.exit_code
    assert "100" in res.stderr and "To fix: choose from 32, 64" in res.stderr
    assert not (tmp_path / "w").exists()


def test_a_drifted_source_is_a_build_error(sources: dict[int, str]) -> None:
    """Upstream drift, simulated on the real v1 launcher: the `case 64:` arm is gone."""
    drifted = re.sub(r"^\s*case 64:\n\s*LAUNCH_PAGED_ATTENTION_V1\(64\);\n\s*break;\n", "",
                     sources[1], flags=re.MULTILINE)
    assert drifted != sources[1]
    sel = parse_selection("128", "16", "fp16")
    with pytest.raises(BuildError) as exc:
        narrow_source(drifted, 1, sel)
    assert "head size 64: expected 1 match(es), found 0" in exc.value.cause
    assert "full instantiation set" in (exc.value.fix or "")
    # a block-size arm removed from v2, and the entry point renamed: also refused
    drifted2 = sources[2].replace("case 8:", "case 4:", 1)
    with pytest.raises(BuildError, match="block size 8"):
        narrow_source(drifted2, 2, sel)
    with pytest.raises(BuildError, match="not found exactly once"):
        narrow_source(sources[2].replace("void paged_attention_v2(", "void pa_v2("), 2, sel)


def test_selecting_an_arm_the_drifted_source_lacks_is_a_build_error(
        sources: dict[int, str]) -> None:
    """Drift in a SELECTED arm: the `case 64:` arm is gone and the build asks for head size 64
    only. Narrowing must refuse; otherwise the build compiles a launcher with no head-size
    case at all (zero kernels) and the op fails only at run time with "Unsupported head size"."""
    drifted = re.sub(r"^\s*case 64:\n\s*LAUNCH_PAGED_ATTENTION_V1\(64\);\n\s*break;\n", "",
                     sources[1], flags=re.MULTILINE)
    with pytest.raises(BuildError, match="head size 64"):
        narrow_source(drifted, 1, parse_selection("64", "16", "fp16"))
