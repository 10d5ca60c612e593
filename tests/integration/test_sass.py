"""verify's SASS and module checks on REAL compiles: small kernels of tests/samples/sass/*.cu
built with the machine's nvcc against the CURRENT csrc/ headers and disassembled with
cuobjdump, and the header's host rules compiled and run on the CPU against their Python mirrors
in kvprefetch.sources.upstream. The parsers themselves are tested on saved listings in
tests/unit/test_sass.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprefetch.build.toolchain import find_cuobjdump, find_nvcc
from kvprefetch.runner import run
from kvprefetch.verify.sass import decode_kernel_name, judge, parse_sass

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "sass"


CSRC = Path(__file__).resolve().parents[2] / "csrc"


def _sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_tiny_sample_is_reproducible_with_the_real_toolchain(tmp_path: Path) -> None:
    """Recompile tests/samples/sass/tiny_prefetch.cu against the CURRENT csrc/kvprefetch/
    with the machine's nvcc and disassemble it: the helper still compiles for both archs and
    the live listing judges like the saved one."""
    nvcc = find_nvcc()
    tools = find_cuobjdump()
    assert nvcc is not None, "nvcc is needed (the kernels-only build needs it too)"
    assert tools is not None, "cuobjdump is needed (pip install nvidia-cuda-cuobjdump)"
    fatbin = tmp_path / "tiny.fatbin"
    run([str(nvcc), "-std=c++17", "-O2", f"-I{CSRC}", "-gencode=arch=compute_80,code=sm_80",
         "-gencode=arch=compute_90,code=sm_90", "-fatbin", "-o", str(fatbin),
         str(SAMPLES / "tiny_prefetch.cu")], echo=False)
    import os

    sass = run([str(tools.cuobjdump), "-sass", str(fatbin)], env=tools.environ(dict(os.environ)),
               echo=False).output
    live = {k.arch: k.ublkpf for k in parse_sass(sass)}
    saved = {k.arch: k.ublkpf for k in parse_sass(_sample("tiny_sm80_sm90.sass"))}
    assert live["sm_80"] == saved["sm_80"] == 0
    assert live["sm_90"] >= 2 and saved["sm_90"] >= 2
    assert judge(parse_sass(sass), patched=True).ok


def _compile_and_disassemble(tmp_path: Path, source: Path, *gencode: str) -> str:
    import os

    nvcc, tools = find_nvcc(), find_cuobjdump()
    assert nvcc is not None and tools is not None
    fatbin = tmp_path / (source.stem + ".fatbin")
    run([str(nvcc), "-std=c++17", "-O2", f"-I{CSRC}", *gencode, "-fatbin", "-o", str(fatbin),
         str(source)], echo=False)
    return run([str(tools.cuobjdump), "-sass", str(fatbin)],
               env=tools.environ(dict(os.environ)), echo=False).output


@pytest.mark.parametrize("archs", [("90", "100"), ("100",)])
def test_launch_variant_prefetch_kernel_counts_on_hopper_and_newer(tmp_path: Path,
                                                                    archs: tuple[str, ...]) -> None:
    """verify's check for the `launch` variant on a REAL compile of kvprefetch's
    kv_l2_prefetch_kernel for sm_90 and sm_100 (Blackwell, also "sm_90+"), then sm_100 alone
    (a user building with --arch 10.0)."""
    from kvprefetch.verify.machine_code import check_sass
    from kvprefetch.verify.report import VerifyReport
    from kvprefetch.verify.sass import prefetch_kernels

    sass = _compile_and_disassemble(tmp_path, SAMPLES / "l2_prefetch_kernel.cu",
                                    *(f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs))
    counts = prefetch_kernels(sass)
    assert sorted(a for a, _ in counts) == sorted(f"sm_{a}" for a in archs)
    assert all(n == 2 for n in counts.values())  # one K and one V prefetch per block
    rep = VerifyReport("unused")
    check_sass(rep, "launch", "l2_prefetch_kernel.fatbin", "launch", text=sass)
    (check,) = [c for c in rep.checks if c.name == "L2 prefetch kernel carries UBLKPF"]
    assert check.status == "pass", check.detail
    assert check.detail.startswith(f"{len(archs)} sm_90+ kv_l2_prefetch_kernel instantiation(s)")


def _compile_elf(tmp_path: Path, source: Path, *defines: str) -> str:
    import os

    nvcc, tools = find_nvcc(), find_cuobjdump()
    assert nvcc is not None and tools is not None
    tag = "".join("-" + d.removeprefix("-D").replace("=", "") for d in defines)
    fatbin = tmp_path / f"{source.stem}{tag}.fatbin"
    run([str(nvcc), "-std=c++17", "-O2", f"-I{CSRC}", *defines,
         "-gencode=arch=compute_90,code=sm_90", "-fatbin", "-o", str(fatbin), str(source)],
        echo=False)
    return run([str(tools.cuobjdump), "-elf", str(fatbin)],
               env=tools.environ(dict(os.environ)), echo=False).output


def test_module_check_on_real_compiles_of_the_header(tmp_path: Path) -> None:
    """verify's module check on REAL nvcc compiles of the current csrc/kvprefetch/ headers: the
    prologue's state (address table and mode) only beside a kernel the variant prefetches in,
    and no user __constant__ bank. Each rule broken once, as each measured slower: a v1 kernel
    beside the state under `prefetch`'s rule, a __constant__ in the module, the launcher-only
    unit without KVPREFETCH_LAUNCHER_ONLY."""
    from kvprefetch.verify.cubin import parse_elf
    from kvprefetch.verify.machine_code import MODULE_CHECK, check_module_state
    from kvprefetch.verify.report import VerifyReport

    def verdict(elf: str, variant: str) -> tuple[str, str]:
        rep = VerifyReport("unused")
        check_module_state(rep, "t", variant, elf, "")  # stock: no module, no constant bank
        (c,) = [c for c in rep.checks if c.name == MODULE_CHECK]
        return c.status, c.detail

    tiny = _compile_elf(tmp_path, SAMPLES / "tiny_prefetch.cu")
    (m,) = parse_elf(tiny)
    assert m.arch == "sm_90" and m.holds_state and not m.constant_bank
    assert any("paged_attention_v1_kernel" in k for k in m.kernels)
    assert verdict(tiny, "seed")[0] == "pass"          # seed prefetches in every kernel
    status, detail = verdict(tiny, "prefetch")         # prefetch's rule: never in v1
    assert status == "fail" and "without a kernel that prefetches (sm_90: v1 head 128)" in detail

    banked = tmp_path / "tiny_constant.cu"
    banked.write_text(f'#include "{SAMPLES / "tiny_prefetch.cu"}"\n'
                      "__constant__ int kvprefetch_test_bank = 1;\n"
                      "__global__ void kvprefetch_test_read(int* o) { *o = kvprefetch_test_bank; }\n")
    const = _compile_elf(tmp_path, banked)
    assert parse_elf(const)[0].constant_bank
    status, detail = verdict(const, "seed")
    assert status == "fail" and "a user __constant__ bank in 1 (stock: 0)" in detail

    lean = _compile_elf(tmp_path, SAMPLES / "l2_prefetch_kernel.cu", "-DKVPREFETCH_LAUNCHER_ONLY=1")
    (m,) = parse_elf(lean)
    assert not m.holds_state and not m.constant_bank
    assert verdict(lean, "launch")[0] == "pass"
    full = _compile_elf(tmp_path, SAMPLES / "l2_prefetch_kernel.cu")
    status, detail = verdict(full, "launch")
    assert status == "fail" and "(sm_90: no attention kernel)" in detail


def test_launcher_prefetch_runs_beside_the_attention_launch(tmp_path: Path) -> None:
    """A REAL nvcc compile of a launcher shaped like the patched v1 launcher (it keeps the
    L2PrefetchJoin until after its launch): the object forks a side stream and joins it back
    (stream and event calls). The GPU behaviour is measured on the H200 (bench kernel, graphs
    and eager), not here."""
    import shutil

    nvcc = find_nvcc()
    nm = shutil.which("nm")
    assert nvcc is not None, "nvcc is needed (the kernels-only build needs it too)"
    assert nm is not None, "nm (binutils) is needed"
    obj = tmp_path / "launcher.o"
    run([str(nvcc), "-std=c++17", "-O2", f"-I{CSRC}", "-gencode=arch=compute_90,code=sm_90",
         "-c", "-o", str(obj),
         str(SAMPLES / "launcher_overlap.cu")], echo=False)
    undefined = set(run([nm, "-u", "--format=just-symbols", str(obj)], echo=False).output.split())
    side_stream_calls = {"cudaStreamCreateWithFlags", "cudaEventCreateWithFlags",
                         "cudaEventRecord", "cudaStreamWaitEvent"}
    assert "cudaDeviceGetAttribute" in undefined  # the launch-time decision is compiled in
    assert side_stream_calls <= undefined


def test_v2_launcher_holds_the_prefetch_kernel(tmp_path: Path) -> None:
    """A REAL nvcc compile of a launcher shaped like the `prefetch` variant's v2 launcher, for a
    16-bit and an fp8 cache: the device code holds kv_l2_prefetch_kernel for both cache types
    (the launcher fires it before every v2 kernel), each with its K and V UBLKPF."""
    from kvprefetch.verify.sass import prefetch_kernels

    sass = _compile_and_disassemble(tmp_path, SAMPLES / "v2_launcher.cu",
                                    "-gencode=arch=compute_90,code=sm_90")
    counts = prefetch_kernels(sass)
    assert len(counts) == 2 and all(n == 2 for n in counts.values()), counts
    assert any("IhE" in name for _, name in counts) and any("ItE" in name for _, name in counts)


def test_l2_prefetch_runs_cover_every_block_once(tmp_path: Path) -> None:
    """The launcher's grid for kv_l2_prefetch_kernel (l2_prefetch_runs in the REAL header,
    compiled by nvcc and run on the CPU): runs of rules.inc's kL2BlocksPerCta blocks, so that
    every block of a sequence is in exactly one CTA's run, z stays within CUDA's 65535, and an
    empty step launches nothing."""
    from kvprefetch.kernels.rules import rules

    nvcc = find_nvcc()
    assert nvcc is not None, "nvcc is needed (the kernels-only build needs it too)"
    exe = tmp_path / "runs"
    run([str(nvcc), "-std=c++17", "-O2", f"-I{CSRC}", "-o", str(exe),
         str(SAMPLES / "l2_prefetch_runs.cu")], echo=False)
    counts = [0, 1, 5, 16, 17, 32, 33, 64, 65, 1024, 8192, 65535 * 64, 65535 * 64 + 1, 10**7]
    out = run([str(exe), *map(str, counts)], echo=False).output.split("\n")
    rows = {int(b): (int(z), int(n), int(t)) for b, z, n, t in
            (line.split() for line in out if line.strip())}
    assert sorted(rows) == sorted(counts)
    assert rows[0] == (0, 0, 0)
    for blocks in counts[1:]:
        ctas, n, threads = rows[blocks]
        assert 1 <= ctas <= 65535 and (ctas - 1) * n < blocks <= ctas * n, (blocks, rows[blocks])
        assert threads == (32 if n <= 32 else 128)
    per_cta = rules().l2_blocks_per_cta
    assert rows[per_cta][:2] == (1, per_cta) and rows[per_cta + 1][:2] == (2, per_cta)
    # past 65535 runs, a run grows so that z stays within the limit
    assert rows[65535 * per_cta + 1][1] == per_cta + 1


@pytest.mark.parametrize(("head", "plain", "ok"), [(96, False, True), (128, False, True),
                                                    (128, True, False), (96, True, True)])
def test_launch_bounds_check_on_real_compiles(tmp_path: Path, head: int, plain: bool,
                                              ok: bool) -> None:
    """verify's launch-bounds check on REAL sm_90 compiles of a kernel declared as the patch
    declares vLLM's v1 kernel (bounded_kernel.cu): the bound is read from the module
    (EIATTR_MAX_THREADS) and must be there exactly where upstream.min_blocks puts one; the
    head-128 kernel compiled without the bound line (stock) fails the `prefetch` rule."""
    from kvprefetch.verify.cubin import parse_elf
    from kvprefetch.verify.machine_code import BOUNDS_CHECK, check_launch_bounds
    from kvprefetch.verify.report import VerifyReport

    elf = _compile_elf(tmp_path, SAMPLES / "bounded_kernel.cu", f"-DSAMPLE_HEAD={head}",
                       *(["-DSAMPLE_PLAIN"] if plain else []))
    (mod,) = parse_elf(elf)
    (kernel,) = mod.kernels
    assert decode_kernel_name(kernel) is not None  # read as vLLM's v1 kernel
    assert dict(mod.max_threads).get(kernel) == (128 if head == 128 and not plain else None)
    rep = VerifyReport("unused")
    check_launch_bounds(rep, "patched", "prefetch", elf)
    (check,) = [c for c in rep.checks if c.name == BOUNDS_CHECK]
    assert (check.status == "pass") is ok, check.detail
    if not ok:
        assert "v1 head 128 block 16 fp16/auto: no bound, expected 128" in check.detail


def _header_rules(tmp_path: Path, *defines: str) -> list[list[str]]:
    """Compile tests/samples/sass/min_blocks_rule.cu (host code) against the CURRENT
    csrc/kvprefetch/launch_policy.cuh with ``defines`` and run it: one row per instantiation
    vLLM builds."""
    nvcc = find_nvcc()
    assert nvcc is not None, "nvcc is needed (the kernels-only build needs it too)"
    exe = tmp_path / "rules"
    run([str(nvcc), "-std=c++17", "-O2", f"-I{CSRC}", *defines, "-o", str(exe),
         str(SAMPLES / "min_blocks_rule.cu")], echo=False)
    return [ln.split() for ln in run([str(exe)], echo=False).output.splitlines() if ln.strip()]


_CACHE_DTYPE = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32", "u8": "fp16"}


_KV_CACHE = {"0": "auto", "1": "fp8_e4m3", "2": "fp8_e5m2"}


def test_header_rules_match_what_verify_expects(tmp_path: Path) -> None:
    """The header's constexpr rules (launch bound, prologue, GQA twins), compiled by nvcc and run
    on the CPU, agree with their Python mirrors in kvprefetch.sources.upstream for every one of the 270
    instantiations vLLM 0.10.2 builds (9 head sizes x 3 block sizes x 5 caches x v1/v2): what
    verify-kernel expects of a binary is what the header compiles. (fp8 caches are listed with
    an fp16 query; the rules do not depend on the query type there.) The twins' table and
    `auto`'s pick agree with upstream.TWIN_SHAPES / auto_twin too."""
    from kvprefetch.sources import upstream
    rows = _header_rules(tmp_path)
    kernels = [r for r in rows if r[0] in ("v1", "v2")]
    assert len(kernels) == 270
    seen = {"bounded": 0, "prologue": 0, "twins": 0}
    for version, head, block, cache, kv, bound, prologue, twins in kernels:
        dtype, kv_cache = _CACHE_DTYPE[cache], _KV_CACHE[kv]
        h, b = int(head), int(block)
        want = (upstream.min_blocks("prefetch", version, kv_cache, h, b, dtype),
                upstream.prefetches_in("prefetch", version, kv_cache, h, b, dtype),
                bool(upstream.twin_shapes("prefetch", version, kv_cache, h, b, dtype)))
        assert (int(bound), prologue == "1", twins == "1") == want, (version, head, block, cache)
        seen["bounded"] += int(bound) > 0
        seen["prologue"] += prologue == "1"
        seen["twins"] += twins == "1"
    # v1: 3 heads x 2 caches bounded; v2 prologue: fp16 and bf16 head 128 at block 8, 16 and
    # 32, fp16 head 192 at block 8 and 16, fp16 head 256 at block 8 and 16 (a block's K in at
    # most 64 registers per thread); the twins: head 128, block 16: fp16 v1 and v2, bf16 v2;
    # head 64, block 16: fp16 and bf16 v2; head 64, block 32: fp16 and bf16, v1 and v2.
    assert seen == {"bounded": 6, "prologue": 10, "twins": 9}
    table = [(int(g), int(s), int(lo)) for _, g, s, lo, _ in (r for r in rows if r[0] == "twin")]
    assert tuple(table) == upstream.TWIN_SHAPES
    assert [r[4] for r in rows if r[0] == "twin"] == [f"{g}x{s}" for g, s, _ in table]
    autos = [(int(p), table[int(i)][:2], table[int(j)][:2])
             for _, p, i, j in (r for r in rows if r[0] == "auto")]
    assert len(autos) == 121
    assert all(got == upstream.auto_twin(p) for p, got, _ in autos)
    assert all(safe == upstream.auto_twin(p, True) for p, _, safe in autos)
    # every twin is somebody's pick: 2x4 below 1.5 CTAs per SM ... 4x1 from 10 per SM on; the
    # chain-safe ones (v1) only 2x4 and 2x2
    assert {got for _, got, _ in autos} == {(g, s) for g, s, _ in upstream.TWIN_SHAPES}
    assert {safe for _, _, safe in autos} == {(2, 4), (2, 2)}
    assert upstream.auto_twin(100) == (2, 4) and upstream.auto_twin(388) == (2, 2)
    assert upstream.auto_twin(776) == (4, 2) and upstream.auto_twin(1551) == (4, 1)


def test_stock_v1_rule_on_the_cpu(tmp_path: Path) -> None:
    """Where a bounded v1 launch runs stock's unbounded code (launch_policy.cuh stock_v1_wins),
    compiled from the header and run on the CPU, agrees with its mirror upstream.stock_v1_wins,
    and does what its model says on the H200's 132 SMs: the bound keeps only grids whose long
    CTAs fit one of its waves, or where it holds as many CTAs per SM as stock's code, since
    some number of long rows (a graph's bucket padded with length-1 rows) would otherwise give
    it a wave more, whatever the chain."""
    from kvprefetch.sources import upstream
    rows = [tuple(map(int, r[1:])) for r in _header_rules(tmp_path) if r[0] == "stockv1"]
    assert rows
    got = {r[:5]: bool(r[5]) for r in rows}
    assert all(upstream.stock_v1_wins(*k) == v for k, v in got.items())
    # head 128 (4 against 5 CTAs per SM, 528 and 660 slots): Llama-3.1-8B's 32 heads at batch 16
    # fit one bounded wave; bucket 24 (a batch of 20 replays it) holds 17-20 long rows, one wave
    # of stock's and two of the bound's: stock's code, and at every larger grid too
    assert not got[(32, 16, 132, 4, 5)] and got[(32, 17, 132, 4, 5)]
    assert got[(32, 24, 132, 4, 5)] and got[(32, 256, 132, 4, 5)]
    assert got[(8, 72, 132, 4, 5)] and not got[(8, 64, 132, 4, 5)]  # Llama-3-70B at TP 8
    # head 256 loses no occupancy to its bound, nor head 64 where the capture length's logits
    # (32 KiB a CTA) hold both kernels to 6 per SM: never
    assert not any(v for k, v in got.items() if k[3:5] in ((3, 3), (6, 6)))


def test_wave_guard_closed_form_on_the_cpu(tmp_path: Path) -> None:
    """more_waves_for_some's closed form (launch_policy.cuh), compiled and run on the CPU,
    agrees with the plain search over every number of long sequences
    (upstream.more_waves_for_some) at every input of the sample, and gives no verdict where a
    count is unknown."""
    from kvprefetch.sources import upstream
    rows = [tuple(map(int, r[1:])) for r in _header_rules(tmp_path) if r[0] == "waves"]
    assert rows
    for seqs, sps, spm, vps, vpm, sms, more in rows:
        assert upstream.more_waves_for_some(seqs, sps, spm, vps, vpm, sms) == bool(more), (
            seqs, sps, spm, vps, vpm, sms)
    assert not any(r[6] for r in rows if r[0] == 0 or r[2] == 0)
    verdicts = {bool(r[6]) for r in rows}
    assert verdicts == {True, False}


def test_least_work_guard_on_the_cpu(tmp_path: Path) -> None:
    """outlasts_stock (launch_policy.cuh: whether a twin's grid could take longer than stock's
    code if every CTA but the longest sequence's had the least work), compiled from the header
    and run on the CPU, agrees with its mirror upstream.outlasts_stock at every input of the
    sample, and does what its model says on the H200's 132 SMs: no verdict where stock's CTAs
    per SM are unknown; a twin that takes more waves of least CTAs than stock is declined
    unless the longest chain outlasts them; at equal waves the twin's dearer least CTA
    declines it; empty v2 CTAs count a quarter."""
    from kvprefetch.sources import upstream
    rows = [tuple(map(int, r[1:])) for r in _header_rules(tmp_path) if r[0] == "least"]
    assert len(rows) == 6 * 2 * 2 * 4 * 3 * 5
    got = {r[:7]: bool(r[7]) for r in rows}
    for (sc, ss, sp, tc, ts, tp, blocks), verdict in got.items():
        assert upstream.outlasts_stock(sc, ss, sp, tc, ts, tp, 132, blocks) == verdict
    assert not any(v for k, v in got.items() if k[2] == 0)
    # v1 b98 x 64 heads of one or two blocks beside a 51-block sequence (head 64 / block 32
    # bf16, 2x2): 10 waves of stock's 5 per SM, 12 of the twin's 2; a chain of 13 links
    # outlasts 7 waves only
    assert got[(6272, 6272, 5, 3136, 3136, 2, 51)]
    assert not got[(6272, 6272, 5, 3136, 3136, 2, 680)]
    # equal waves: the twin's least CTA costs 1.2 of stock's; one wave each is one CTA's time
    assert got[(1688, 1688, 4, 844, 844, 2, 14)]
    assert not got[(528, 528, 4, 264, 264, 2, 5)]
    # a tenth of the CTAs sure, the rest empty (a quarter each): 24200 CTAs take 12 waves at
    # 5 per SM; a 4-head twin at 2 per SM 8 (x 1.2 = 9.6): no verdict against it
    assert upstream.least_waves(24200, 2420, 132, 5) == 12
    assert upstream.least_waves(6050, 605, 132, 2) == 8
    assert not got[(24200, 2420, 5, 6050, 605, 2, 32)]


def test_twin_mode_and_pick_on_the_cpu(tmp_path: Path) -> None:
    """The launchers' host rule, compiled from the header and run on the CPU: KVPREFETCH_GQA's
    values (unset/empty: the default; on = 4x1; case matters, unknown values fall back and are
    reported), and which twin a decode step gets by mode, model, batch and context on the H200:
    a forced mode's twin wherever its G is at most the query heads per kv head (7 of them run
    as 4 + 3, or 2 + 2 + 2 + 1) and its shared memory fits; in auto what upstream.twin_pick (the mirror) says, at every step of the
    sample."""
    from kvprefetch.sources import upstream
    rows = _header_rules(tmp_path)
    modes = {r[1]: (int(r[2]), r[3] == "1") for r in rows if r[0] == "mode"}
    assert modes == {"-": (99, False), "''": (99, False), "off": (-1, False),
                     "auto": (-2, False), "on": (0, False), "4x1": (0, False), "4x2": (1, False),
                     "2x2": (2, False), "2x4": (3, False), "ON": (99, True), "3x3": (99, True)}
    picks = [r[1:] for r in rows if r[0] == "pick"]
    assert picks, "the rule program printed no picks"
    shapes = [(g, s) for g, s, _ in upstream.TWIN_SHAPES]
    seen: dict[str, set[int]] = {}
    for mode_s, heads_s, kv_s, batch_s, ctx_s, kernel, got_s in picks:
        mode, heads, kv, batch, ctx, got = map(int, (mode_s, heads_s, kv_s, batch_s, ctx_s,
                                                    got_s))
        per_kv = heads // kv
        if mode == -1:
            want = -1
        elif mode == -2:
            pick = upstream.twin_pick(heads, kv, batch, ctx, kernel)
            want = -1 if pick is None else shapes.index(pick)
        else:
            g, s = shapes[mode]
            fits = upstream.twin_smem(g, s, ctx, kernel) <= upstream.H200_MAX_SMEM
            want = mode if g <= per_kv and fits else -1
        assert got == want, (mode, heads, kv, batch, ctx, kernel)
        if mode == -2:
            seen.setdefault(f"{kernel} {per_kv}", set()).add(got)
    # MHA never gets a twin in auto; in v2 every GQA model (4:1, 5:1, 7:1, 8:1) gets every twin
    # somewhere, in v1 only the chain-safe 2x2 and 2x4, and no twin at all at contexts of at
    # most 4 blocks
    assert seen["v1 1"] == seen["v2 1"] == {-1}
    for per_kv in (4, 5, 7, 8):
        assert seen[f"v2 {per_kv}"] - {-1} == {0, 1, 2, 3}, per_kv
        assert seen[f"v1 {per_kv}"] == {-1, 2, 3}, per_kv


def test_stage_count_on_the_cpu(tmp_path: Path) -> None:
    """The staged twins' ring (launch_policy.cuh stage_count), compiled from the header and
    run on the CPU, agrees with its mirror upstream.stage_count at every input of the sample
    (grids, shared memory besides the ring, warps and blocks per CTA, two devices); and on the
    H200 (132 SMs, 228 KiB each) the launcher stages exactly where repeat run 41 measured the
    ring's gains (b8 x 512, b8 x 1k, b1 x 4k, b1 x 16k, b32 x 512/1k) and not at b32 x 4k (v1:
    a 4k context's logits for 4 heads leave no room for two slots beside a second CTA), where
    run 39 measured one slot 18% slower."""
    from kvprefetch.sources import upstream
    rows = [r for r in _header_rules(tmp_path) if r[0] == "stage"]
    assert len(rows) == 2 * 5 * 5 * 2 * 5
    for _, ctas, sms, per_sm, fixed, warps, chunk, blocks, got in rows:
        want = upstream.stage_count(int(ctas), int(sms), int(per_sm), int(fixed), int(warps),
                                    int(chunk), int(blocks))
        assert int(got) == want, (ctas, sms, per_sm, fixed, warps, blocks)
    assert {int(r[-1]) for r in rows} == {0, 2}  # 2 slots at most, never 1
    slots = {(b, c): upstream.twin_stage_slots(b, c, k, *upstream.auto_twin(p))
             for b, c, k, p in ((8, 512, "v1", 193), (8, 1024, "v2", 387), (1, 4096, "v2", 193),
                                (1, 16384, "v2", 775), (32, 512, "v1", 775),
                                (32, 1024, "v1", 775), (32, 4096, "v1", 775),
                                (1, 1024, "v2", 48), (64, 512, "v1", 1551))}
    assert slots == {(8, 512): 2, (8, 1024): 2, (1, 4096): 2, (1, 16384): 2, (32, 512): 2,
                     (32, 1024): 2, (32, 4096): 0, (1, 1024): 0, (64, 512): 0}, slots


def test_which_reduction_follows_a_v2_twin_on_the_cpu(tmp_path: Path) -> None:
    """The v2 launcher's reduction rules (csrc/kvprefetch/launch_policy.cuh), compiled and
    run on the CPU: pdl_reduce_after (kvprefetch's early-launched reduce kernel except after
    grids of more than half and at most all of the SMs' count of CTAs) and twin_reduces (a
    fusable twin reduces itself exactly on those grids where the launcher allows it, under the
    default KVPREFETCH_TWIN_FUSE=1) agree with upstream.twin_reduces at every grid of the
    sample; where not allowed, or for a twin that is not fusable, never. On the H200's 132 SMs:
    67-132 CTAs."""
    from kvprefetch.sources import upstream
    rows = _header_rules(tmp_path)
    reduce = [tuple(map(int, r[1:])) for r in rows if r[0] == "reduce"]
    assert len(reduce) == 3 * 15
    for ctas, sms, pdl, fused in reduce:
        assert fused == upstream.twin_reduces("v2", 2, 2, ctas, sms), (ctas, sms)
        assert pdl == (not fused), (ctas, sms)  # one of the two, never both
        assert not upstream.twin_reduces("v1", 2, 2, ctas, sms)
        assert not upstream.twin_reduces("v2", 4, 2, ctas, sms)
    assert {c for c, s, _, f in reduce if s == 132 and f} == {67, 100, 114, 115, 128, 132}
    assert {int(r[3]) + int(r[4]) for r in rows if r[0] == "reduce-off"} == {0}
    fuse0 = [r for r in _header_rules(tmp_path, "-DKVPREFETCH_TWIN_FUSE=0") if r[0] == "reduce"]
    assert {r[4] for r in fuse0} == {"0"}


def test_stream_slots_on_the_cpu(tmp_path: Path) -> None:
    """StreamSlots (the fused twins' per-stream counters, gqa_twins.cuh fuse_slot): each
    stream keeps the slot it took first, eight streams get eight different slots, a ninth and
    tenth get none (-1: their launches run a reduce kernel instead)."""
    rows = [r for r in _header_rules(tmp_path) if r[0] == "slot"]
    got = [(int(k), int(v)) for _, k, v in rows]
    assert got == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (7, 7), (8, -1),
                   (9, -1), (0, 0), (5, 5), (8, -1)]


def test_pdl_order_on_a_real_compile(tmp_path: Path) -> None:
    """pdl_waits on a REAL sm_90 compile (tests/samples/sass/pdl_order.cu): nvcc 13.0 emits
    griddepcontrol.wait as ACQBULK, and the check tells a kernel that waits before its first
    global load from one that loads first and from one that never waits."""
    from kvprefetch.verify.machine_code import PDL_CHECK, check_pdl_order
    from kvprefetch.verify.report import VerifyReport
    from kvprefetch.verify.sass import pdl_waits

    sass = _compile_and_disassemble(tmp_path, SAMPLES / "pdl_order.cu",
                                    "-gencode=arch=compute_90,code=sm_90")
    got = {name: v for (_, name), v in pdl_waits(sass).items()}
    by_kind = {k: v for k in ("waits_first", "loads_first", "never_waits")
               for n, v in got.items() if k in n}
    assert by_kind == {"waits_first": (True, True), "loads_first": (True, False),
                       "never_waits": (False, False)}, got
    rep = VerifyReport("unused")
    check_pdl_order(rep, "patched", sass)
    (row,) = [c for c in rep.checks if c.name == PDL_CHECK]
    assert row.status == "fail" and "3 twin/reduce kernels, 2 launched" in row.detail
    assert "1 touch global memory before waiting" in row.detail
