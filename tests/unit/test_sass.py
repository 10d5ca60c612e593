"""kvprefetch.verify.sass (parse_sass / judge / summarise) on SAVED real cuobjdump output.

The samples in tests/samples/sass/ are verbatim lines of real ``cuobjdump -sass`` listings,
filtered by tests/samples/sass/filter_sass.py; README.md there says exactly how each was made:
  * kw_baseline.sass / kw_patched.sass: a real kernels-only build of both vLLM 0.10.2 trees for
    sm_90 (head 128, block 16, fp16+bf16: 4 kernels per launcher, v1 and v2);
  * tiny_sm80_sm90.sass: a small kernel of ours named like vLLM's template that calls
    csrc/kvprefetch/l2_prefetch.cuh, compiled for sm_80 AND sm_90 -- a pre-Hopper cubin next to
    a Hopper one.
Where a test needs a case no real build can produce (UBLKPF in an sm_80 cubin, a patched
kernel that lost a site), it edits a copy of a real sample in the test and says so."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest

from kvprefetch.verify.sass import decode_kernel_name, judge, parse_sass, summarise

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "sass"
CSRC = Path(__file__).resolve().parents[2] / "csrc"

# What the narrowed build instantiates: (version, dtype, sparse) x head 128 x block 16.
EXPECTED = {(v, d, s) for v in ("v1", "v2") for d in ("fp16", "bf16") for s in (False, True)}


def _sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_baseline_sample_has_every_kernel_and_no_prefetch() -> None:
    kernels = parse_sass(_sample("kw_baseline.sass"))
    assert {(k.version, k.dtype, k.block_sparse) for k in kernels} == EXPECTED
    assert len(kernels) == 8  # v2's reduce kernels are not paged_attention_v2_kernel
    assert all(k.arch == "sm_90" and k.head_size == 128 and k.block_size == 16
               and k.kv_cache == "auto" for k in kernels)
    assert [k.ublkpf for k in kernels] == [0] * 8
    verdict = judge(kernels, patched=False)
    assert verdict.ok and verdict.problems == () and verdict.with_prefetch == 0
    # judged as if it were the patched build, the stock build fails on every kernel
    as_patched = judge(kernels, patched=True)
    assert not as_patched.ok and len(as_patched.problems) == 8


def test_patched_sample_has_k_and_v_sites_in_every_kernel() -> None:
    kernels = parse_sass(_sample("kw_patched.sass"))
    assert {(k.version, k.dtype, k.block_sparse) for k in kernels} == EXPECTED
    assert all(k.ublkpf >= 2 for k in kernels), [(k.name, k.ublkpf) for k in kernels]
    # counted per function: the sample's UBLKPF lines all belong to these 8 kernels
    assert sum(k.ublkpf for k in kernels) == _sample("kw_patched.sass").count("UBLKPF")
    verdict = judge(kernels, patched=True)
    assert verdict.ok and verdict.kernels == 8 and verdict.with_prefetch == 8
    wrong_way = judge(kernels, patched=False)
    assert not wrong_way.ok
    assert all("UBLKPF in the baseline (expected 0)" in p for p in wrong_way.problems)


def test_a_patched_kernel_missing_one_site_is_named() -> None:
    """Hand-edited copy of the real patched sample: the second UBLKPF line of the sparse bf16
    v2 kernel is deleted, as if the V-site prefetch had been optimised away."""
    lines = _sample("kw_patched.sass").splitlines()
    start = next(i for i, ln in enumerate(lines)
                 if "Function : " in ln and "paged_attention_v2_kernelI13__nv_bfloat16" in ln
                 and "Lb1E" in ln)
    sites = [i for i in range(start + 1, len(lines)) if "UBLKPF" in lines[i]][:2]
    assert "Function" not in "".join(lines[start + 1:sites[1]])  # both in that function
    del lines[sites[1]]
    verdict = judge(parse_sass("\n".join(lines)), patched=True)
    assert not verdict.ok
    assert verdict.problems == (
        "sm_90 v2 head=128 block=16 bf16/auto sparse: 1 UBLKPF (expected >= 2: K and V sites)",)


def test_no_kernels_at_all_is_a_problem() -> None:
    verdict = judge(parse_sass("arch = sm_90\n\tcode for sm_90\n"), patched=False)
    assert not verdict.ok and "no paged_attention_v1/v2 kernels" in verdict.problems[0]


def test_summarise_table_rows() -> None:
    rows = summarise(parse_sass(_sample("kw_patched.sass")))
    assert [(r["arch"], r["head_size"], r["block_size"], r["dtype"], r["kv_cache"], r["kernels"])
            for r in rows] == [("sm_90", 128, 16, "bf16", "auto", 4),
                               ("sm_90", 128, 16, "fp16", "auto", 4)]
    assert all(r["ublkpf_min"] >= 2 for r in rows)
    base = summarise(parse_sass(_sample("kw_baseline.sass")))
    assert all(r["ublkpf_max"] == 0 for r in base) and len(base) == 2


def test_decode_kernel_names() -> None:
    names = re.findall(r"Function : (\S+)", _sample("kw_patched.sass"))
    decoded = [decode_kernel_name(n) for n in names]
    assert sum(d is not None for d in decoded) == 8
    assert [n for n, d in zip(names, decoded, strict=True) if d is None] == [
        n for n in names if "reduce_kernel" in n]
    # fp8 cache, fp32 and the other head sizes: names built the way the compiler mangles them
    # (checked against vLLM's template parameter order), as no saved sample has them
    assert decode_kernel_name("_ZN4vllm25paged_attention_v1_kernelIthLi256ELi32ELi128E"
                              "LNS_18Fp8KVCacheDataTypeE1ELb0EEEvPT_") == {
        "version": "v1", "dtype": "fp16", "kv_cache": "fp8_e4m3", "head_size": 256,
        "block_size": 32, "block_sparse": False}
    assert decode_kernel_name("_ZN4vllm25paged_attention_v2_kernelIffLi64ELi8ELi128E"
                              "LNS_18Fp8KVCacheDataTypeE0ELb1ELi512EEEvPfS3_") == {
        "version": "v2", "dtype": "fp32", "kv_cache": "auto", "head_size": 64,
        "block_size": 8, "block_sparse": True}
    assert decode_kernel_name("_ZN4vllm32paged_attention_v2_reduce_kernelIfLi128ELi128E") is None


def test_pre_hopper_cubin_keeps_its_kernel_without_prefetch() -> None:
    kernels = parse_sass(_sample("tiny_sm80_sm90.sass"))
    by_arch = {k.arch: k for k in kernels}
    assert set(by_arch) == {"sm_80", "sm_90"}
    assert by_arch["sm_80"].ublkpf == 0  # the helper compiles to nothing before Hopper
    assert by_arch["sm_90"].ublkpf >= 2
    verdict = judge(kernels, patched=True)
    assert verdict.ok and verdict.kernels == 2 and verdict.with_prefetch == 1


def test_ublkpf_in_a_pre_hopper_cubin_is_a_problem() -> None:
    """Hand-edited copy of the real tiny sample: one UBLKPF line of its sm_90 kernel is
    inserted into the sm_80 kernel (sm_80 cannot assemble it, so no real build has this)."""
    lines = _sample("tiny_sm80_sm90.sass").splitlines()
    ublkpf = next(ln for ln in lines if "UBLKPF" in ln)
    sm80_func = next(i for i, ln in enumerate(lines) if "Function :" in ln)
    assert "sm_80" in "".join(lines[:sm80_func])
    lines.insert(sm80_func + 2, ublkpf)
    verdict = judge(parse_sass("\n".join(lines)), patched=True)
    assert not verdict.ok
    assert verdict.problems == (
        "sm_80 v1 head=128 block=16 fp32/auto: UBLKPF in a pre-Hopper cubin",)


def test_prefetch_rule_cases() -> None:
    """policy.prefetches_in on the cases that matter, beside the header check above: the
    `prefetch` prologue goes into v2 only; seed everywhere; launch, control and stock nowhere."""
    from kvprefetch.kernels import policy

    table = (CSRC / "kvprefetch" / "rules.inc").read_text()
    m = re.search(r"^KVP_RULE\(kPrologueMinHeadSize, (\d+)\)$", table, re.MULTILINE)
    assert m is not None and int(m.group(1)) == policy.PROLOGUE_MIN_HEAD_SIZE
    rule = policy.prefetches_in
    assert rule("prefetch", "v2", "auto", 128, 16, "fp16")
    assert rule("prefetch", "v2", "auto", 128, 32, "fp16")
    assert rule("prefetch", "v2", "auto", 256, 16, "fp16")
    # a block's K in 128 registers per thread (head 256, block 32): no prologue
    assert policy.k_registers(256, 32, 2) > policy.PROLOGUE_MAX_K_REGISTERS
    assert not rule("prefetch", "v2", "auto", 256, 32, "fp16")
    assert rule("prefetch", "v2", "auto", 128, 16, "bf16")
    assert not rule("prefetch", "v2", "auto", 256, 16, "bf16")
    assert not rule("prefetch", "v2", "auto", 128, 16, "fp32")
    assert not rule("prefetch", "v1", "auto", 128, 16, "fp16")
    assert not rule("prefetch", "v2", "fp8_e4m3", 128, 16, "fp16")
    assert not rule("prefetch", "v2", "auto", 64, 16, "fp16")
    assert rule("seed", "v1", "fp8_e5m2", 64, 16, "fp16")
    assert not rule("launch", "v2", "auto", 128, 16, "fp16")
    assert not rule(None, "v2", "auto", 128, 16, "fp16")


def test_old_everywhere_patch_fails_the_prefetch_rule() -> None:
    """The saved patched sample (a build where every kernel carried the prefetch) judged by the
    `prefetch` variant's rule: its v1 kernels should have been left stock, and are named."""
    from kvprefetch.kernels import policy

    kernels = parse_sass(_sample("kw_patched.sass"))
    verdict = judge(kernels, patched=True, expects=lambda k: policy.prefetches_in(
        "prefetch", k.version, k.kv_cache, k.head_size, k.block_size, k.dtype))
    assert not verdict.ok
    assert len(verdict.problems) == sum(1 for k in kernels if k.version == "v1") == 4
    assert all(" v1 " in p and "a kernel this variant leaves stock" in p for p in verdict.problems)


def _listing(kernels: dict[tuple[str, str], list[str]]) -> str:
    """A cuobjdump-shaped listing: per (arch, mangled name) its instructions."""
    lines: list[str] = []
    for arch in sorted({a for a, _ in kernels}):
        lines += [f"\tarch = {arch}", f"\tcode for {arch}"]
        for (a, name), body in kernels.items():
            if a != arch:
                continue
            lines.append(f"\t\tFunction : {name}")
            lines += [f"        /*{i * 16:04x}*/                   {ins} ;"
                      for i, ins in enumerate(body)]
    return "\n".join(lines) + "\n"


def _fake_listing(loads: dict[str, int]) -> str:
    """An sm_90 listing (``_listing``): per kernel ``n`` read-only K/V loads and one plain load."""
    return _listing({("sm_90", name): ["LDG.E.64.CONSTANT R4, desc[UR4][R2.64]"] * n
                     + ["LDG.E.64 R6, desc[UR4][R2.64]"] for name, n in loads.items()})


def test_readonly_check_fails_when_loads_lose_the_read_only_path() -> None:
    """check_readonly_path compares LDG….CONSTANT per prefetching kernel against stock: a
    `prefetch` build that lost them fails, naming the kernel; a seed build is reported only."""
    from kvprefetch.verify.machine_code import check_readonly_path
    from kvprefetch.verify.report import VerifyReport

    v2 = ("_ZN4vllm25paged_attention_v2_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0"
          "ELi512EEEvPfS2_PT_PKS3_PKT0_S9_ifPKiSB_iPKfiiiSD_SD_iiiii")
    stock, lost, kept = (_fake_listing({v2: n}) for n in (21, 5, 21))
    rep = VerifyReport("unused")
    check_readonly_path(rep, "patched", "prefetch", lost, stock)
    check_readonly_path(rep, "ok", "prefetch", kept, stock)
    check_readonly_path(rep, "seed", "seed", lost, stock)
    status = {c.tree: c for c in rep.checks}
    assert status["patched"].status == "fail" and ": 5 vs 21" in status["patched"].detail
    assert status["ok"].status == "pass"
    assert (status["seed"].status == "not checked"
            and "1 kernels have fewer" in status["seed"].detail)


_V1 = ("_ZN4vllm25paged_attention_v1_kernelIttLi{h}ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0EE"
       "EvPT_PKS2_PKT0_S8_ifPKiSA_iPKfiiiSC_SC_iiiii")


@pytest.mark.parametrize(("bounded_body", "stock_body", "ok", "detail"), [
    (["LDG.E.64.CONSTANT R4", "FFMA R1"], ["EXIT"], True,
     "the 1 kernels prefetch leaves stock compared, 0 differ; of the 1 it changes, 0 identical"),
    (["EXIT"], ["EXIT"], False, "of the 1 it changes, 1 identical to stock"),
    (["LDG.E.64.CONSTANT R4", "FFMA R1"], ["NOP"], False,
     "the 1 kernels prefetch leaves stock compared, 1 differ"),
])
def test_identical_check_judges_left_and_changed_kernels(bounded_body: list[str],
                                                         stock_body: list[str], ok: bool,
                                                         detail: str) -> None:
    """check_identical_attention with the `prefetch` rules: the head-96 v1 kernel (no bound)
    must equal stock's instruction by instruction, the head-128 v1 kernel (bounded) must
    differ from stock's; a bound that did not reach its kernel fails like a changed stock one."""
    from kvprefetch.verify.machine_code import check_identical_attention
    from kvprefetch.verify.report import VerifyReport

    base = {("sm_90", _V1.format(h=128)): ["EXIT"], ("sm_90", _V1.format(h=96)): ["EXIT"]}
    mine = {("sm_90", _V1.format(h=128)): bounded_body, ("sm_90", _V1.format(h=96)): stock_body}
    rep = VerifyReport("unused")
    check_identical_attention(rep, "patched", _listing(mine), _listing(base), "prefetch")
    (check,) = rep.checks
    assert (check.status == "pass") is ok, check.detail
    assert detail in check.detail


def test_auto_picks_for_any_lengths() -> None:
    """`auto` (policy.twin_pick, the mirror of the launcher's rule) chooses what no length
    distribution behind the same grid makes slower than stock: in v1 only the chain-safe twins
    (2x2, 2x4: a long sequence's chain no longer than stock's), whatever the grid; in v2 the
    table read at the CTAs that surely have work, heads x (batch + partitions - 1), not the
    padded grid; no twin where the longest CTA has at most 4 blocks (stock's warps, one block
    each); and a twin only where an SM holds two of its CTAs, unless its grid or its launch
    bound gives an SM only one."""
    from kvprefetch.kernels import policy
    # the rule as it stood before the wave guard, which test_wave_guard_* covers
    pick = partial(policy.twin_pick, wave_guard=False)
    assert policy.chain_safe(2, 2) and policy.chain_safe(2, 4)
    assert not policy.chain_safe(4, 1) and not policy.chain_safe(4, 2)
    # v1: Llama-3.1-8B at 128 and 32 sequences, every context: 2x2 (4x1 / 4x2 before)
    assert {pick(32, 8, b, c, "v1") for b in (32, 128) for c in (2048, 4096, 7056, 8192)} == {
        (2, 2)}
    assert pick(32, 8, 1, 1024, "v1") == (2, 4)
    # the longest CTA's blocks: 3 and 4 blocks (33 / 64 tokens) none, 5 blocks a twin
    assert pick(32, 8, 3, 33, "v1") is None and pick(32, 8, 3, 64, "v1") is None
    assert pick(32, 8, 3, 65, "v1") == (2, 4)
    # a grid of no more CTAs than SMs needs one per SM; the 4x1 twin's 8k footprint fits one
    smem_8k = policy.twin_smem(4, 1, 8192, "v1")
    assert policy.keeps_occupancy(1, 132, 132, smem_8k, policy.H200_SMEM_PER_SM)
    assert not policy.keeps_occupancy(1, 133, 132, smem_8k, policy.H200_SMEM_PER_SM)
    for batch in (1, 8, 32, 64, 128, 256):
        for ctx in (512, 4096, 16384, 32768):
            pct = 100 * 32 * (batch + -(-ctx // 512) - 1) // 132
            assert pick(32, 8, batch, ctx, "v2") == policy.auto_twin(pct), (batch, ctx)
    # v2 b32 x 4k: 8192 padded CTAs (62 per SM: 4x1 before), 1248 sure (9.5: 4x2)
    assert pick(32, 8, 32, 4096, "v2") == (4, 2)



def test_twins_take_models_whose_heads_g_does_not_divide() -> None:
    """A kv head's query heads run in groups of G, the last holding the rest
    (policy.twin_heads, the mirror of launch_policy.cuh's): Qwen2.5-7B's 7 heads per kv head
    as 4 + 3 or 2 + 2 + 2 + 1, Qwen2.5-14B's 5 as 4 + 1 or 2 + 2 + 1. So `auto` gives such
    models the twin a 4- or 8-head model of the same grid gets, except one wider than the
    group (G > heads per kv head); the rule a run made before (``partial_groups=False``) gave
    them none."""
    from kvprefetch.kernels import policy
    # the rule as it stood before the wave guard, which test_wave_guard_* covers
    pick = partial(policy.twin_pick, wave_guard=False)
    assert policy.twin_heads(28, 7, 4) == 8 and policy.twin_heads(28, 7, 2) == 16
    assert policy.twin_heads(40, 5, 4) == 16 and policy.twin_heads(40, 5, 2) == 24
    assert policy.twin_heads(32, 4, 4) == 8 and policy.twin_heads(32, 4, 2) == 16
    # v1 b96 x 1k and v2 b4 x 16k on Qwen2.5-7B (28 heads, 4 kv heads); b64 x 1k on 40 / 8
    assert pick(28, 4, 96, 1024, "v1") == (2, 2)
    assert pick(28, 4, 4, 16384, "v2") == (4, 2)
    assert pick(40, 8, 64, 1024, "v1") == (2, 2)
    for args in ((28, 4, 96, 1024, "v1"), (28, 4, 4, 16384, "v2"), (40, 8, 64, 1024, "v1")):
        assert pick(*args, partial_groups=False) is None
    # 3 heads per kv head: no 4-head twin, and none at all where the table asks for one
    assert pick(12, 4, 1, 4096, "v2") == (2, 4)
    assert pick(96, 32, 256, 32768, "v2") is None
    assert pick(128, 32, 256, 32768, "v2") == (4, 1)
    # MHA: never
    assert all(pick(32, 32, b, c, k) is None for b in (1, 64, 256) for c in (512, 8192)
               for k in ("v1", "v2"))


def test_auto_declines_twins_that_short_ctas_could_outlast() -> None:
    """`auto` declines a twin whose grid could take longer than stock's code if every CTA but
    the longest sequence's had the least work (policy.outlasts_stock, the mirror of
    launch_policy.cuh's): the sampled steps where the twins lost most, which the rule before
    it (``least_guard=False``) gave a twin; and the long-tailed steps where one long chain
    outlasts the short CTAs' waves keep theirs (they ran 2.7-3.5x stock's)."""
    from kvprefetch.kernels import policy
    # the rule as it stood before the wave guard, which test_wave_guard_* covers
    pick = partial(policy.twin_pick, wave_guard=False)
    lost = (  # (heads, kv heads, batch, longest, kernel, head, block, cache): measured with
        ((64, 4, 98, 1625, "v1", 64, 32, "bf16"), (2, 2)),  # 0.606x
        ((28, 4, 140, 1447, "v1", 64, 32, "bf16"), (2, 2)),  # 0.667x
        ((5, 1, 97, 7632, "v2", 64, 16, "fp16"), (2, 2)),  # 0.748x, ragged
        ((10, 2, 110, 10868, "v2", 128, 16, "bf16"), (4, 2)),  # 0.854x, equal waves
    )
    for (heads, kv, batch, ctx, kernel, head, block, cache), before in lost:
        args = {"head_size": head, "block_size": block, "dtype": cache}
        assert pick(heads, kv, batch, ctx, kernel, least_guard=False, **args) == before
        assert pick(heads, kv, batch, ctx, kernel, **args) is None, (heads, batch, ctx)
    # one long sequence's chain beside a hundred short ones: 208 and 165 blocks
    assert pick(16, 4, 121, 6646, "v1", head_size=64, block_size=32) == (2, 2)
    assert pick(8, 4, 144, 5265, "v1", head_size=64, block_size=32) == (2, 2)
    # no verdict without stock's CTAs per SM: the table and the occupancy rules alone
    assert pick(64, 4, 98, 1625, "v1", head_size=64, block_size=32, dtype="bf16",
                stock_per_sm=0) == (2, 2)


def test_wave_guard_declines_what_long_rows_could_slow() -> None:
    """In vLLM's graph call (the bucket padded with length-1 rows, max_seq_len = 8192) the
    launcher runs neither the bound nor a twin where some number of long rows would give it
    more waves than stock's code (policy.more_waves_for_some): the batches that lost on the
    H200 (Llama-3.1-8B b20 in bucket 24, Qwen2.5-7B b17-23 and b40, Llama-3-70B at TP 8 b72-80)
    get stock's code; the v2 steps whose twin never needs more waves (b16's 4x2) keep it."""
    from kvprefetch.kernels import policy
    pick, code = policy.twin_pick, policy.v1_code_pick
    # bucket 24 of Llama-3.1-8B: 768 CTAs; 17-20 long rows are one wave of stock's 660 slots
    assert pick(32, 8, 24, 8192, "v1", wave_guard=False) == (2, 2)
    assert pick(32, 8, 24, 8192, "v1") is None and code(128, 24, 32, 8192) == "stock"
    assert code(128, 24, 32, 8192, wave_guard=False) == "bound"
    assert pick(28, 4, 40, 8192, "v1") is None and pick(8, 1, 72, 8192, "v1") is None
    # one bounded wave (16 x 32 heads = 512 CTAs of 528 slots) keeps the bound
    assert code(128, 16, 32, 1024) == "bound"
    # b16 in v2: 4x2 holds 8 heads per SM against stock's 5, never a wave more
    assert pick(32, 8, 16, 8192, "v2") == (4, 2)
    assert not policy.more_waves_for_some(16, 512, 5, 128, 2, 132)
    # the plain search: 17 rows of 32 CTAs fill one wave of 660 and two of 528
    assert policy.more_waves_for_some(17, 32, 5, 32, 4, 132)
    assert not policy.more_waves_for_some(16, 32, 5, 32, 4, 132)
    assert not policy.more_waves_for_some(24, 32, 0, 32, 4, 132)  # unknown: no verdict


def test_twins_at_head_64_by_version_and_cache() -> None:
    """rules.inc's KVP_TWIN_AT as policy.twin_shapes reads it: head 64 has twins at block 32
    in v1 and v2 and at block 16 in v2 only; bf16 v1 none where the launch bound is (block 16);
    head 128 at block 32 and head 256 none (their twins would spill)."""
    from kvprefetch.kernels import policy

    for cache in ("fp16", "bf16"):
        assert not policy.twin_shapes("prefetch", "v1", "auto", 64, 16, cache)
        assert policy.twin_shapes("prefetch", "v2", "auto", 64, 16, cache)
        assert policy.twin_shapes("prefetch", "v1", "auto", 64, 32, cache)
        assert policy.twin_shapes("prefetch", "v2", "auto", 64, 32, cache)
    assert not policy.twin_shapes("prefetch", "v1", "auto", 128, 16, "bf16")
    for head, block_size in ((128, 32), (256, 16), (256, 32)):
        assert not policy.twin_shapes("prefetch", "v2", "auto", head, block_size, "fp16")


# Real mangled names (nvcc 13.0, sm_90) of vLLM's kernels and of kvprefetch's GQA twin, which
# lives in an anonymous namespace (internal linkage, see csrc/kvprefetch/gqa_twins.cuh).
_V1_FP16 = ("_ZN4vllm25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0E"
            "Lb0EEEvPT_PKS3_PKT0_S9_ifPKiSB_iPKfiiiSD_SD_iiiii")
_V2_BF16 = ("_ZN4vllm25paged_attention_v2_kernelI13__nv_bfloat16S1_Li128ELi16ELi128ELNS_18Fp8KV"
            "CacheDataTypeE0ELb0ELi512EEEvPfS3_PT_PKS4_PKT0_SA_ifPKiSC_iPKfiiiSE_SE_iiiii")
_V1_BF16 = ("_ZN4vllm25paged_attention_v1_kernelI13__nv_bfloat16S1_Li128ELi16ELi128ELNS_18Fp8KV"
            "CacheDataTypeE0ELb0EEEvPT_PKS3_PKT0_S9_ifPKiSB_iPKfiiiSD_SD_iiiii")
_TWIN_V1_FP16 = ("_ZN10kvprefetch54_GLOBAL__N__c0c0872e_21_paged_attention_v1_cu_d115ef7d17gqa_"
                 "decode_kernelIttLi128ELi16ELi128ELN4vllm18Fp8KVCacheDataTypeE0ELi0ELi4ELi1EEEvPf"
                 "S4_PT_PKS5_PKT0_SB_ifPKiSD_iPKfiiii")
_TWIN_V2_BF16 = ("_ZN10kvprefetch54_GLOBAL__N__8196dde9_21_paged_attention_v2_cu_fcde414e17gqa_"
                 "decode_kernelI13__nv_bfloat16S2_Li128ELi16ELi128ELN4vllm18Fp8KVCacheDataTypeE0E"
                 "Li512ELi4ELi1EEEvPfS5_PT_PKS6_PKT0_SC_ifPKiSE_iPKfiiii")
# Not compiled by the rule (bf16 v1 has no twin): the v2 name with v1's PARTITION_SIZE.
_TWIN_V1_BF16 = _TWIN_V2_BF16.replace("ELi512ELi4E", "ELi0ELi4E")


def _all_twins(name_4x1: str) -> list[str]:
    """The four twins' names (4x1, 4x2, 2x2, 2x4) for one instantiation, from its 4x1 name."""
    return [name_4x1.replace("ELi4ELi1EEEvPf", f"ELi{g}ELi{s}EEEvPf") for g, s in
            ((4, 1), (4, 2), (2, 2), (2, 4))]


def test_decode_twin_names() -> None:
    from kvprefetch.verify.sass import decode_twin_name
    assert decode_twin_name(_TWIN_V1_FP16) == {
        "version": "v1", "dtype": "fp16", "kv_cache": "auto", "head_size": 128,
        "block_size": 16, "group": 4, "split": 1, "staged": False, "fused": False}
    # since v2's reduction in the twin, FUSED (Lb0E / Lb1E) follows STAGED
    fused = _TWIN_V2_BF16.replace("ELi4ELi1EEEvPf", "ELi2ELi2ELb1ELb1EEEvPf")
    assert decode_twin_name(fused)["fused"] is True  # type: ignore[index]
    assert decode_twin_name(fused)["staged"] is True  # type: ignore[index]
    # since the shared-memory ring the names end in STAGED (Lb0E / Lb1E)
    staged = _TWIN_V1_FP16.replace("ELi4ELi1EEEvPf", "ELi2ELi2ELb1EEEvPf")
    assert decode_twin_name(staged)["staged"] is True  # type: ignore[index]
    assert decode_twin_name(staged)["split"] == 2  # type: ignore[index]
    unstaged = _TWIN_V1_FP16.replace("ELi4ELi1EEEvPf", "ELi4ELi1ELb0EEEvPf")
    assert decode_twin_name(unstaged) == decode_twin_name(_TWIN_V1_FP16)
    assert decode_twin_name(_TWIN_V2_BF16)["version"] == "v2"  # type: ignore[index]
    assert decode_twin_name(_TWIN_V2_BF16)["dtype"] == "bf16"  # type: ignore[index]
    assert [(m["group"], m["split"]) for m in map(decode_twin_name, _all_twins(_TWIN_V2_BF16))
            if m is not None] == [(4, 1), (4, 2), (2, 2), (2, 4)]
    assert decode_twin_name(_V1_FP16) is None


def test_twin_check_wants_exactly_the_rule_set_on_the_read_only_path() -> None:
    """check_gqa_twin: a `prefetch` build must hold the four twins beside the fp16 v1 and bf16
    v2 kernels (policy.twin_shapes) and nowhere else, each twin's global loads all read-only;
    stock holds none. A missing twin, an extra one (bf16 v1) and a plain load each fail."""
    from kvprefetch.verify.machine_code import check_gqa_twin
    from kvprefetch.verify.report import VerifyReport

    ro = ["LDG.E.64.CONSTANT R4, desc[UR4][R2.64]"] * 3
    base = {("sm_90", _V1_FP16): ro, ("sm_90", _V2_BF16): ro, ("sm_90", _V1_BF16): ro}
    twins = {("sm_90", n): ro for n in _all_twins(_TWIN_V1_FP16) + _all_twins(_TWIN_V2_BF16)}
    good = _listing({**base, **twins})
    missing = _listing({**base, **{k: v for k, v in twins.items() if "ELi2ELi4E" not in k[1]
                                   or "v2_cu" in k[1]}})
    extra = _listing({**base, **twins, ("sm_90", _TWIN_V1_BF16): ro})
    plain = _listing({**base, **twins,
                      ("sm_90", _TWIN_V1_FP16): [*ro, "LDG.E.64 R6, desc[UR4][R2.64]"]})
    # the ring (csrc/kvprefetch/gqa_twins.cuh): the S = 2 twins also compiled staged; a staged
    # 2x4 is off the rule, and so is a staged twin without its unstaged instantiation
    ring = {("sm_90", n.replace("EEEvPf", "ELb1EEEvPf")): ro for n in
            _all_twins(_TWIN_V1_FP16) + _all_twins(_TWIN_V2_BF16) if "ELi2EEEvPf" in n}
    assert len(ring) == 4
    staged = _listing({**base, **twins, **ring})
    stray = _listing({**base, **twins, **ring, ("sm_90", _all_twins(_TWIN_V1_FP16)[3].replace(
        "EEEvPf", "ELb1EEEvPf")): ro})
    alone = _listing({**base, **ring})
    # v2's reduction in the twin: the v2 2x2 twin also compiled FUSED (staged and not, with
    # ordered loads: another CTA's writes, read through L2); a fused v1 twin or a fused 4x2 is
    # off the rule
    strong = [*ro, "LDG.E.STRONG.GPU R8, desc[UR4][R2.64]"]
    fuse = {("sm_90", n.replace("EEEvPf", f"ELb{st}ELb1EEEvPf")): strong
            for n in _all_twins(_TWIN_V2_BF16) if "ELi2ELi2EEEvPf" in n for st in (0, 1)}
    assert len(fuse) == 2
    fused = _listing({**base, **twins, **ring, **fuse})
    v1_fused = _listing({**base, **twins, **ring, **fuse, ("sm_90", _all_twins(
        _TWIN_V1_FP16)[2].replace("EEEvPf", "ELb0ELb1EEEvPf")): strong})
    fused_4x2 = _listing({**base, **twins, **ring, **fuse, ("sm_90", _all_twins(
        _TWIN_V2_BF16)[1].replace("EEEvPf", "ELb0ELb1EEEvPf")): strong})
    rep = VerifyReport("unused")
    for tree, text in (("good", good), ("missing", missing), ("extra", extra), ("plain", plain),
                       ("staged", staged), ("stray", stray), ("alone", alone),
                       ("fused", fused), ("v1_fused", v1_fused), ("fused_4x2", fused_4x2)):
        check_gqa_twin(rep, tree, "prefetch", text)
    check_gqa_twin(rep, "stock", None, _listing(base))
    check_gqa_twin(rep, "stock_with_twin", None, good)
    status = {c.tree: c for c in rep.checks}
    assert status["good"].status == "pass", status["good"].detail
    assert status["stock"].status == "pass"
    assert "1 missing" in status["missing"].detail and status["missing"].status == "fail"
    assert "1 unexpected" in status["extra"].detail and status["extra"].status == "fail"
    assert "1 with a global load off" in status["plain"].detail
    assert status["plain"].status == "fail"
    assert status["stock_with_twin"].status == "fail"
    assert status["staged"].status == "pass", status["staged"].detail
    assert "(4 staged, 0 fused)" in status["staged"].detail
    assert "1 staged or fused off the rule" in status["stray"].detail
    assert status["stray"].status == "fail"
    assert status["alone"].status == "fail" and "missing" in status["alone"].detail
    assert status["fused"].status == "pass", status["fused"].detail
    assert "14 twin kernels (4 staged, 1 fused)" in status["fused"].detail
    for tree in ("v1_fused", "fused_4x2"):
        assert status[tree].status == "fail"
        assert "1 staged or fused off the rule" in status[tree].detail, status[tree].detail


def test_pdl_check_passes_when_every_wait_comes_first() -> None:
    """check_pdl_order: twins that wait (ACQBULK) before their first global instruction pass,
    predicated or not; a store before the wait fails; a tree without twins gets no row."""
    from kvprefetch.verify.machine_code import PDL_CHECK, check_pdl_order
    from kvprefetch.verify.report import VerifyReport

    first = ["S2R R0, SR_TID.X", "ACQBULK", "@P0 LDG.E.64.CONSTANT R4, desc[UR4][R2.64]",
             "STG.E desc[UR4][R6.64], R4"]
    store_first = ["STG.E desc[UR4][R6.64], R4", "ACQBULK",
                   "LDG.E.64.CONSTANT R4, desc[UR4][R2.64]"]
    twins = _all_twins(_TWIN_V1_FP16)
    rep = VerifyReport("unused")
    check_pdl_order(rep, "good", _listing({("sm_90", n): first for n in twins}))
    check_pdl_order(rep, "bad", _listing({("sm_90", n): first for n in twins[1:]}
                                         | {("sm_90", twins[0]): store_first}))
    check_pdl_order(rep, "stock", _listing({("sm_90", _V1_FP16): first}))
    status = {c.tree: c for c in rep.checks if c.name == PDL_CHECK}
    assert status["good"].status == "pass", status["good"].detail
    assert "4 launched as programmatic dependents" in status["good"].detail
    assert status["bad"].status == "fail" and "1 touch global memory" in status["bad"].detail
    assert "stock" not in status


def test_twin_check_accepts_ordered_loads_not_plain_ones() -> None:
    """check_gqa_twin: a twin built as a programmatic dependent reads seq_lens, block tables and
    q with strong loads (LDG….STRONG.SM from ld.global.ca, as load_dep emits, or
    LDG….STRONG.GPU from ld.global.cg; kept after its wait) beside its read-only K/V loads: that
    passes; a plain weak LDG (neither read-only nor strong) still fails."""
    from kvprefetch.verify.machine_code import check_gqa_twin
    from kvprefetch.verify.report import VerifyReport

    ro = ["LDG.E.64.CONSTANT R4, desc[UR4][R2.64]"] * 3
    coherent = ["ACQBULK", "LDG.E.STRONG.SM R0, desc[UR6][R2.64]",
                "LDG.E.64.STRONG.GPU R8, desc[UR6][R2.64]", *ro]
    base = {("sm_90", _V1_FP16): ro, ("sm_90", _V2_BF16): ro, ("sm_90", _V1_BF16): ro}
    names = _all_twins(_TWIN_V1_FP16) + _all_twins(_TWIN_V2_BF16)
    rep = VerifyReport("unused")
    check_gqa_twin(rep, "pdl", "prefetch", _listing({**base, **{("sm_90", n): coherent
                                                                for n in names}}))
    plain = {("sm_90", n): coherent for n in names} | {
        ("sm_90", names[0]): [*coherent, "LDG.E R6, desc[UR4][R2.64]"]}
    check_gqa_twin(rep, "plain", "prefetch", _listing({**base, **plain}))
    status = {c.tree: c for c in rep.checks}
    assert status["pdl"].status == "pass", status["pdl"].detail
    assert status["plain"].status == "fail" and "1 with a global load off" in status["plain"].detail


# Stock's unbounded copy of a bounded v1 kernel (csrc/kvprefetch/stock_v1.cuh), as nvcc 13.0 names
# it: bf16 head 128 and (derived) head 64.
_COPY_V1_BF16 = ("_ZN10kvprefetch54_GLOBAL__N__f145f768_21_paged_attention_v1_cu_d115ef7d19"
                 "unbounded_v1_kernelI13__nv_bfloat16S2_Li128ELi16ELi128ELN4vllm18Fp8KVCacheDataTypeE0ELb0E"
                 "EEvPT_PKS5_PKT0_SB_ifPKiSD_iPKfiiiSF_SF_iiiii")


def test_unbounded_copies_are_stock_code_beside_each_bounded_kernel() -> None:
    """check_unbounded_copies: a `prefetch` build holds one unbounded copy beside each v1
    kernel its rule bounds (here head 128 fp16 and bf16; head 256 fp8 is not bounded), each
    instruction-identical to the baseline's kernel of the same instantiation; a copy that
    differs, a missing one and one beside an unbounded instantiation each fail; other variants
    hold none."""
    from kvprefetch.verify.machine_code import check_unbounded_copies
    from kvprefetch.verify.report import VerifyReport
    from kvprefetch.verify.sass import decode_unbounded_name

    assert decode_unbounded_name(_COPY_V1_BF16) == {
        "version": "v1", "dtype": "bf16", "kv_cache": "auto", "head_size": 128,
        "block_size": 16, "block_sparse": False}
    assert decode_unbounded_name(_V1_BF16) is None
    copy_fp16 = _COPY_V1_BF16.replace("I13__nv_bfloat16S2_", "Itt")
    fp8_256 = _V1_FP16.replace("Li128E", "Li256E").replace("E0ELb0", "E1ELb0")
    copy_fp8 = copy_fp16.replace("Li128E", "Li256E").replace("E0ELb0", "E1ELb0")
    body_fp16, body_bf16 = ["FFMA R1, R2, R3, R4", "EXIT"], ["HFMA2 R1, R2, R3, R4", "EXIT"]
    base = _listing({("sm_90", _V1_FP16): body_fp16, ("sm_90", _V1_BF16): body_bf16,
                     ("sm_90", fp8_256): ["EXIT"]})
    bounded = {("sm_90", _V1_FP16): [*body_fp16, "NOP"], ("sm_90", _V1_BF16): body_bf16}
    copies = {("sm_90", copy_fp16): body_fp16, ("sm_90", _COPY_V1_BF16): body_bf16}
    cases = {
        "good": {**bounded, **copies},
        "differs": {**bounded, **copies, ("sm_90", _COPY_V1_BF16): [*body_bf16, "NOP"]},
        "missing": {**bounded, ("sm_90", copy_fp16): body_fp16},
        "extra": {**bounded, **copies, ("sm_90", copy_fp8): ["EXIT"]},
    }
    rep = VerifyReport("unused")
    for tree, kernels in cases.items():
        check_unbounded_copies(rep, tree, "prefetch", _listing(kernels), base)
    check_unbounded_copies(rep, "launch", "launch", base, base)
    check_unbounded_copies(rep, "launch_with_copy", "launch", _listing(cases["good"]), base)
    status = {c.tree: c for c in rep.checks}
    assert status["good"].status == "pass", status["good"].detail
    assert "2 unbounded copies, 2 expected" in status["good"].detail
    assert status["launch"].status == "pass"
    for tree in ("differs", "missing", "extra", "launch_with_copy"):
        assert status[tree].status == "fail", (tree, status[tree].detail)
    assert "1 not instruction-identical" in status["differs"].detail
    assert "1 missing" in status["missing"].detail
    assert "1 unexpected" in status["extra"].detail
