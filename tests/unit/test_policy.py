"""What the launch policy (kvprefetch.kernels.policy) decides on the H200, in Python alone.

That the header (csrc/kvprefetch/launch_policy.cuh) decides the same on any input is
tests/integration/test_sass.py's: it compiles the header into a host program and compares the
two over generated inputs. Here the policy's extent and its measured cases are written out, so
that a change of a rule shows in a test that says what it changes."""

from __future__ import annotations

import itertools

from kvprefetch.kernels import policy

# Every instantiation vLLM 0.10.2 builds: 9 head sizes x 3 block sizes x 5 caches x v1/v2 (as
# (query dtype, kv_cache); fp8 caches with an fp16 query).
_HEADS = (32, 64, 80, 96, 112, 120, 128, 192, 256)
_CACHES = (("fp16", "auto"), ("bf16", "auto"), ("fp32", "auto"), ("fp16", "fp8_e4m3"),
           ("fp16", "fp8_e5m2"))
_INSTANTIATIONS = list(itertools.product(("v1", "v2"), _HEADS, (8, 16, 32), _CACHES))


def test_which_instantiations_the_rules_change() -> None:
    """v1: 3 heads x 2 caches bounded; v2 prologue: fp16 and bf16 head 128 at block 8, 16 and
    32, fp16 head 192 at block 8 and 16, fp16 head 256 at block 8 and 16 (a block's K in at most
    64 registers per thread); the twins: head 128, block 16: fp16 v1 and v2, bf16 v2; head 64,
    block 16: fp16 and bf16 v2; head 64, block 32: fp16 and bf16, v1 and v2."""
    assert len(_INSTANTIATIONS) == 270
    seen = {"bounded": 0, "prologue": 0, "twins": 0}
    for version, head, block, (dtype, kv_cache) in _INSTANTIATIONS:
        seen["bounded"] += policy.min_blocks("prefetch", version, kv_cache, head, block,
                                             dtype) > 0
        seen["prologue"] += policy.prefetches_in("prefetch", version, kv_cache, head, block,
                                                 dtype)
        seen["twins"] += bool(policy.twin_shapes("prefetch", version, kv_cache, head, block,
                                                 dtype))
    assert seen == {"bounded": 6, "prologue": 10, "twins": 9}


def test_auto_twin_thresholds() -> None:
    """Every twin is somebody's pick: 2x4 below 1.5 CTAs per SM ... 4x1 from 10 per SM on; the
    chain-safe ones (v1) only 2x4 and 2x2."""
    picks = {policy.auto_twin(p) for p in range(0, 3001, 25)}
    safe = {policy.auto_twin(p, True) for p in range(0, 3001, 25)}
    assert picks == {(g, s) for g, s, _ in policy.TWIN_SHAPES}
    assert safe == {(2, 4), (2, 2)}
    assert policy.auto_twin(100) == (2, 4) and policy.auto_twin(388) == (2, 2)
    assert policy.auto_twin(776) == (4, 2) and policy.auto_twin(1551) == (4, 1)


def test_stock_v1_rule_on_the_h200() -> None:
    """stock_v1_wins on the H200's 132 SMs: the bound keeps only grids whose long CTAs fit one
    of its waves, or where it holds as many CTAs per SM as stock's code, since some number of
    long rows (a graph's bucket padded with length-1 rows) would otherwise give it a wave more,
    whatever the chain."""
    wins = policy.stock_v1_wins
    # head 128 (4 against 5 CTAs per SM, 528 and 660 slots): Llama-3.1-8B's 32 heads at batch 16
    # fit one bounded wave; bucket 24 (a batch of 20 replays it) holds 17-20 long rows, one wave
    # of stock's and two of the bound's: stock's code, and at every larger grid too
    assert not wins(32, 16, 132, 4, 5) and wins(32, 17, 132, 4, 5)
    assert wins(32, 24, 132, 4, 5) and wins(32, 256, 132, 4, 5)
    assert wins(8, 72, 132, 4, 5) and not wins(8, 64, 132, 4, 5)  # Llama-3-70B at TP 8
    # head 256 loses no occupancy to its bound, nor head 64 where the capture length's logits
    # (32 KiB a CTA) hold both kernels to 6 per SM: never
    for heads, seqs in itertools.product((8, 28, 32), (1, 2, 16, 17, 24, 40, 64, 128, 256)):
        assert not wins(heads, seqs, 132, 3, 3) and not wins(heads, seqs, 132, 6, 6)


def test_least_work_guard_on_the_h200() -> None:
    """outlasts_stock on the H200's 132 SMs: no verdict where stock's CTAs per SM are unknown; a
    twin that takes more waves of least CTAs than stock is declined unless the longest chain
    outlasts them; at equal waves the twin's dearer least CTA declines it; empty v2 CTAs count a
    quarter."""
    outlasts = policy.outlasts_stock
    assert not any(outlasts(c, c, 0, c // 2, c // 2, t, 132, b)
                   for c in (64, 528, 6272, 24200) for t in (1, 2, 4) for b in (5, 51, 680))
    # v1 b98 x 64 heads of one or two blocks beside a 51-block sequence (head 64 / block 32
    # bf16, 2x2): 10 waves of stock's 5 per SM, 12 of the twin's 2; a chain of 13 links
    # outlasts 7 waves only
    assert outlasts(6272, 6272, 5, 3136, 3136, 2, 132, 51)
    assert not outlasts(6272, 6272, 5, 3136, 3136, 2, 132, 680)
    # equal waves: the twin's least CTA costs 1.2 of stock's; one wave each is one CTA's time
    assert outlasts(1688, 1688, 4, 844, 844, 2, 132, 14)
    assert not outlasts(528, 528, 4, 264, 264, 2, 132, 5)
    # a tenth of the CTAs sure, the rest empty (a quarter each): 24200 CTAs take 12 waves at
    # 5 per SM; a 4-head twin at 2 per SM 8 (x 1.2 = 9.6): no verdict against it
    assert policy.least_waves(24200, 2420, 132, 5) == 12
    assert policy.least_waves(6050, 605, 132, 2) == 8
    assert not outlasts(24200, 2420, 5, 6050, 605, 2, 132, 32)


def test_twin_pick_on_the_h200() -> None:
    """auto's pick over head-128, block-16 decode steps on the H200 (stock's code at 5 CTAs per
    SM): MHA never gets a twin; in v2 every GQA model (4:1, 5:1, 7:1, 8:1) gets every twin
    somewhere, in v1 only the chain-safe 2x2 and 2x4; no twin at all at contexts of at most 4
    blocks."""
    shapes = [(g, s) for g, s, _ in policy.TWIN_SHAPES]
    seen: dict[str, set[int]] = {}
    for (heads, kv), batch, ctx, kernel in itertools.product(
            ((32, 32), (32, 16), (32, 8), (8, 1), (28, 4), (40, 8)),
            (1, 8, 32, 64, 96, 123, 128, 256),
            (33, 64, 65, 114, 129, 512, 2048, 3072, 4096, 6016, 6032, 7040, 7056, 8192),
            ("v1", "v2")):
        pick = policy.twin_pick(heads, kv, batch, ctx, kernel, stock_per_sm=5)
        got = -1 if pick is None else shapes.index(pick)
        seen.setdefault(f"{kernel} {heads // kv}", set()).add(got)
        if -(-ctx // 16) <= policy.STOCK_WARPS:
            assert pick is None, (heads, kv, batch, ctx, kernel)
    assert seen["v1 1"] == seen["v2 1"] == {-1}
    for per_kv in (4, 5, 7, 8):
        assert seen[f"v2 {per_kv}"] - {-1} == {0, 1, 2, 3}, per_kv
        assert seen[f"v1 {per_kv}"] == {-1, 2, 3}, per_kv


def test_stage_count_on_the_h200() -> None:
    """The staged twins' ring gets 2 slots at most, never 1; and on the H200 (132 SMs, 228 KiB
    each) the launcher stages exactly where repeat run 41 measured the ring's gains (b8 x 512,
    b8 x 1k, b1 x 4k, b1 x 16k, b32 x 512/1k) and not at b32 x 4k (v1: a 4k context's logits
    for 4 heads leave no room for two slots beside a second CTA), where run 39 measured one slot
    18% slower."""
    counts = {policy.stage_count(ctas, sms, per_sm, fixed, warps, 4096, blocks)
              for sms, per_sm in ((132, 233472), (32, 101376))
              for ctas in (64, 128, 256, 512, 1024)
              for fixed in (4096, 12288, 24576, 40960, 81920)
              for warps in (8, 16) for blocks in (1, 8, 32, 64, 256)}
    assert counts == {0, 2}
    slots = {(b, c): policy.twin_stage_slots(b, c, k, *policy.auto_twin(p))
             for b, c, k, p in ((8, 512, "v1", 193), (8, 1024, "v2", 387), (1, 4096, "v2", 193),
                                (1, 16384, "v2", 775), (32, 512, "v1", 775),
                                (32, 1024, "v1", 775), (32, 4096, "v1", 775),
                                (1, 1024, "v2", 48), (64, 512, "v1", 1551))}
    assert slots == {(8, 512): 2, (8, 1024): 2, (1, 4096): 2, (1, 16384): 2, (32, 512): 2,
                     (32, 1024): 2, (32, 4096): 0, (1, 1024): 0, (64, 512): 0}, slots


def test_which_reduction_follows_a_v2_twin_on_the_h200() -> None:
    """The fusable twin (2x2) reduces inside on grids of more than half and at most all of the
    SMs' count of CTAs, on the H200's 132 SMs 67-132; other twins and v1 never."""
    ctas = (8, 32, 57, 58, 65, 66, 67, 100, 114, 115, 128, 132, 133, 256, 1024)
    assert {c for c in ctas if policy.twin_reduces("v2", 2, 2, c, 132)} == {67, 100, 114, 115,
                                                                              128, 132}
    assert not any(policy.twin_reduces("v1", 2, 2, c, 132) for c in ctas)
    assert not any(policy.twin_reduces("v2", 4, 2, c, 132) for c in ctas)
