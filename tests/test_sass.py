"""kvprefetch.sass (parse_sass / judge / summarise) on SAVED real cuobjdump output.

The samples in tests/samples/sass/ are verbatim lines of real ``cuobjdump -sass`` listings,
filtered by tests/samples/sass/filter_sass.py; README.md there says exactly how each was made:
  * kw_baseline.sass / kw_patched.sass: a real kernels-only build of both vLLM 0.10.2 trees for
    sm_90 (head 128, block 16, fp16+bf16: 4 kernels per launcher, v1 and v2);
  * tiny_sm80_sm90.sass: a small kernel of ours named like vLLM's template that calls
    csrc/kvprefetch/l2_prefetch.cuh, compiled for sm_80 AND sm_90 -- a pre-Hopper cubin next to a Hopper one.
Where a test needs a case no real build can produce (UBLKPF in an sm_80 cubin, a patched
kernel that lost a site), it edits a copy of a real sample in the test and says so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvprefetch.runner import run
from kvprefetch.sass import decode_kernel_name, judge, parse_sass, summarise
from kvprefetch.toolchain import find_cuobjdump, find_nvcc

SAMPLES = Path(__file__).parent / "samples" / "sass"
CSRC = Path(__file__).resolve().parent.parent / "csrc"

# What the narrowed build instantiates: (version, dtype, sparse) x head 128 x block 16.
EXPECTED = {(v, d, s) for v in ("v1", "v2") for d in ("fp16", "bf16") for s in (False, True)}


def _sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_filter_keeps_only_verbatim_lines() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("filter_sass", SAMPLES / "filter_sass.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = _sample("kw_patched.sass")
    assert mod.filter_sass(text) == text  # the samples are fixed points of the filter


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
    assert [n for n, d in zip(names, decoded) if d is None] == [
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
    assert verdict.problems == ("sm_80 v1 head=128 block=16 fp32/auto: UBLKPF in a pre-Hopper cubin",)


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


@pytest.mark.parametrize("name", ["kw_baseline.sass", "kw_patched.sass", "tiny_sm80_sm90.sass"])
def test_samples_are_small_and_real(name: str) -> None:
    text = _sample(name)
    assert len(text) < 20_000
    assert text.startswith("arch = sm_")
    # every instruction line carries cuobjdump's address and encoding columns
    for ln in text.splitlines():
        if ln.strip().startswith("/*"):
            assert re.match(r"^\s*/\*[0-9a-f]{4}\*/\s+\S.*;\s+/\* 0x[0-9a-f]{16} \*/$", ln), ln


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
    from kvprefetch.sass import prefetch_kernels
    from kvprefetch.verify import VerifyReport, check_sass

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


def test_prefetch_rule_cases() -> None:
    """upstream.prefetches_in on the cases that matter, beside the header check above: the
    `prefetch` prologue goes into v2 only; seed everywhere; launch, control and stock nowhere."""
    from kvprefetch import upstream

    table = (CSRC / "kvprefetch" / "rules.inc").read_text()
    m = re.search(r"^KVP_RULE\(kPrologueMinHeadSize, (\d+)\)$", table, re.MULTILINE)
    assert m is not None and int(m.group(1)) == upstream.PROLOGUE_MIN_HEAD_SIZE
    rule = upstream.prefetches_in
    assert rule("prefetch", "v2", "auto", 128, "fp16")
    assert rule("prefetch", "v2", "auto", 256, "fp16")
    assert rule("prefetch", "v2", "auto", 128, "bf16")
    assert not rule("prefetch", "v2", "auto", 256, "bf16")
    assert not rule("prefetch", "v2", "auto", 128, "fp32")
    assert not rule("prefetch", "v1", "auto", 128, "fp16")
    assert not rule("prefetch", "v2", "fp8_e4m3", 128, "fp16")
    assert not rule("prefetch", "v2", "auto", 64, "fp16")
    assert rule("seed", "v1", "fp8_e5m2", 64, "fp16")
    assert not rule("launch", "v2", "auto", 128, "fp16")
    assert not rule(None, "v2", "auto", 128, "fp16")


def test_old_everywhere_patch_fails_the_prefetch_rule() -> None:
    """The saved patched sample (a build where every kernel carried the prefetch) judged by the
    `prefetch` variant's rule: its v1 kernels should have been left stock, and are named."""
    from kvprefetch import upstream

    kernels = parse_sass(_sample("kw_patched.sass"))
    verdict = judge(kernels, patched=True, expects=lambda k: upstream.prefetches_in(
        "prefetch", k.version, k.kv_cache, k.head_size, k.dtype))
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
    from kvprefetch.verify import VerifyReport, check_readonly_path

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
    assert status["seed"].status == "not checked" and "1 kernels have fewer" in status["seed"].detail


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
    from kvprefetch.cubin import parse_elf
    from kvprefetch.verify import MODULE_CHECK, VerifyReport, check_module_state

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
    from kvprefetch.sass import prefetch_kernels

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
    from kvprefetch.kernel_rules import rules

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
    from kvprefetch.cubin import parse_elf
    from kvprefetch.verify import BOUNDS_CHECK, VerifyReport, check_launch_bounds

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
    from kvprefetch.verify import VerifyReport, check_identical_attention

    base = {("sm_90", _V1.format(h=128)): ["EXIT"], ("sm_90", _V1.format(h=96)): ["EXIT"]}
    mine = {("sm_90", _V1.format(h=128)): bounded_body, ("sm_90", _V1.format(h=96)): stock_body}
    rep = VerifyReport("unused")
    check_identical_attention(rep, "patched", _listing(mine), _listing(base), "prefetch")
    (check,) = rep.checks
    assert (check.status == "pass") is ok, check.detail
    assert detail in check.detail


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
    on the CPU, agree with their Python mirrors in kvprefetch.upstream for every one of the 270
    instantiations vLLM 0.10.2 builds (9 head sizes x 3 block sizes x 5 caches x v1/v2): what
    verify-kernel expects of a binary is what the header compiles. (fp8 caches are listed with
    an fp16 query; the rules do not depend on the query type there.) The twins' table and
    `auto`'s pick agree with upstream.TWIN_SHAPES / auto_twin too."""
    from kvprefetch import upstream
    rows = _header_rules(tmp_path)
    kernels = [r for r in rows if r[0] in ("v1", "v2")]
    assert len(kernels) == 270
    seen = {"bounded": 0, "prologue": 0, "twins": 0}
    for version, head, block, cache, kv, bound, prologue, twins in kernels:
        dtype, kv_cache = _CACHE_DTYPE[cache], _KV_CACHE[kv]
        h, b = int(head), int(block)
        want = (upstream.min_blocks("prefetch", version, kv_cache, h, b, dtype),
                upstream.prefetches_in("prefetch", version, kv_cache, h, dtype),
                bool(upstream.twin_shapes("prefetch", version, kv_cache, h, b, dtype)))
        assert (int(bound), prologue == "1", twins == "1") == want, (version, head, block, cache)
        seen["bounded"] += int(bound) > 0
        seen["prologue"] += prologue == "1"
        seen["twins"] += twins == "1"
    # v1: 3 heads x 2 caches bounded; v2 prologue: fp16 heads 128/192/256 + bf16 head 128,
    # each at 3 block sizes; the twins: head 128, block 16: fp16 v1 and v2, bf16 v2.
    assert seen == {"bounded": 6, "prologue": 12, "twins": 3}
    table = [(int(g), int(s), int(lo)) for _, g, s, lo, _ in (r for r in rows if r[0] == "twin")]
    assert tuple(table) == upstream.TWIN_SHAPES
    assert [r[4] for r in rows if r[0] == "twin"] == [f"{g}x{s}" for g, s, _ in table]
    picks = [(int(p), table[int(i)][:2]) for _, p, i in (r for r in rows if r[0] == "auto")]
    assert len(picks) == 121
    assert all(got == upstream.auto_twin(p) for p, got in picks)
    # every twin is somebody's pick: 2x4 below 1.5 CTAs per SM ... 4x1 from 10 per SM on
    assert {got for _, got in picks} == {(g, s) for g, s, _ in upstream.TWIN_SHAPES}
    assert upstream.auto_twin(100) == (2, 4) and upstream.auto_twin(388) == (2, 2)
    assert upstream.auto_twin(776) == (4, 2) and upstream.auto_twin(1551) == (4, 1)


def test_twin_mode_and_pick_on_the_cpu(tmp_path: Path) -> None:
    """The launchers' host rule, compiled from the header and run on the CPU: KVPREFETCH_GQA's
    values (unset/empty: the default; on = 4x1; case matters, unknown values fall back and are
    reported), and which twin a decode step gets by mode, model, batch and context on the H200:
    a forced mode's twin wherever its G divides the query heads per kv head and its shared
    memory fits; in auto what upstream.twin_pick (the mirror) says, at every step of the
    sample."""
    from kvprefetch import upstream
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
            want = mode if per_kv % g == 0 and fits else -1
        assert got == want, (mode, heads, kv, batch, ctx, kernel)
        if mode == -2:
            seen.setdefault(f"{kernel} {per_kv}", set()).add(got)
    # MHA and 7:1 never get a twin in auto; 4:1 and 8:1 get every twin somewhere
    assert seen["v1 1"] == seen["v2 1"] == seen["v1 7"] == {-1}
    assert seen["v1 4"] | seen["v2 4"] == {0, 1, 2, 3}
    assert seen["v1 8"] | seen["v2 8"] == {0, 1, 2, 3}


def test_auto_keeps_two_twin_ctas_per_sm() -> None:
    """`auto` runs a twin only where an SM holds two of its CTAs, unless its grid or its launch
    bound gives an SM only one (upstream.twin_pick, the mirror of the launcher's rule): on the
    H200 a Llama-3.1-8B v1 step moves from 4x1 (a 4-head CTA's logits need 16 bytes per token)
    to 2x2 past 7040 tokens, and from 4x2 (a grid of 1.5-10 stock CTAs per SM) to 2x2 past 6016;
    every v2 step (a partition's logits only) keeps auto_twin's pick."""
    from kvprefetch import upstream
    pick = upstream.twin_pick
    assert [pick(32, 8, 128, c, "v1") for c in (2048, 4096, 7040, 7056, 8192)] == [
        (4, 1), (4, 1), (4, 1), (2, 2), (2, 2)]
    assert [pick(32, 8, 32, c, "v1") for c in (2048, 6016, 6032, 8192)] == [
        (4, 2), (4, 2), (2, 2), (2, 2)]
    # a grid of no more CTAs than SMs needs one per SM; the 4x1 twin's 8k footprint fits one
    smem_8k = upstream.twin_smem(4, 1, 8192, "v1")
    assert upstream.keeps_occupancy(1, 132, 132, smem_8k, upstream.H200_SMEM_PER_SM)
    assert not upstream.keeps_occupancy(1, 133, 132, smem_8k, upstream.H200_SMEM_PER_SM)
    for batch in (1, 8, 32, 64, 128, 256):
        for ctx in (512, 4096, 16384, 32768):
            pct = 100 * 32 * batch * -(-ctx // 512) // 132
            assert pick(32, 8, batch, ctx, "v2") == upstream.auto_twin(pct), (batch, ctx)


def test_stage_count_on_the_cpu(tmp_path: Path) -> None:
    """The staged twins' ring (launch_policy.cuh stage_count), compiled from the header and
    run on the CPU, agrees with its mirror upstream.stage_count at every input of the sample
    (grids, shared memory besides the ring, warps and blocks per CTA, two devices); and on the
    H200 (132 SMs, 228 KiB each) the launcher stages exactly where repeat run 41 measured the
    ring's gains (b8 x 512, b8 x 1k, b1 x 4k, b1 x 16k, b32 x 512/1k) and not at b32 x 4k (v1:
    a 4k context's logits for 4 heads leave no room for two slots beside a second CTA), where
    run 39 measured one slot 18% slower."""
    from kvprefetch import upstream
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
    # b1 x 1k runs 2x4 and b64 x 512 runs 4x1: neither is staged (S != 2)


def test_which_reduction_follows_a_v2_twin_on_the_cpu(tmp_path: Path) -> None:
    """The v2 launcher's reduction rules (csrc/kvprefetch/launch_policy.cuh), compiled and
    run on the CPU: pdl_reduce_after (kvprefetch's early-launched reduce kernel except after
    grids of more than half and at most all of the SMs' count of CTAs) and twin_reduces (a
    fusable twin reduces itself exactly on those grids where the launcher allows it, under the
    default KVPREFETCH_TWIN_FUSE=1) agree with upstream.twin_reduces at every grid of the
    sample; where not allowed, or for a twin that is not fusable, never. On the H200's 132 SMs:
    67-132 CTAs."""
    from kvprefetch import upstream
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
    from kvprefetch.sass import decode_twin_name
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
    v2 kernels (upstream.twin_shapes) and nowhere else, each twin's global loads all read-only;
    stock holds none. A missing twin, an extra one (bf16 v1) and a plain load each fail."""
    from kvprefetch.verify import VerifyReport, check_gqa_twin

    ro = ["LDG.E.64.CONSTANT R4, desc[UR4][R2.64]"] * 3
    base = {("sm_90", _V1_FP16): ro, ("sm_90", _V2_BF16): ro, ("sm_90", _V1_BF16): ro}
    twins = {("sm_90", n): ro for n in _all_twins(_TWIN_V1_FP16) + _all_twins(_TWIN_V2_BF16)}
    good = _listing({**base, **twins})
    missing = _listing({**base, **{k: v for k, v in twins.items() if "ELi2ELi4E" not in k[1]
                                   or "v2_cu" in k[1]}})
    extra = _listing({**base, **twins, ("sm_90", _TWIN_V1_BF16): ro})
    plain = _listing({**base, **twins,
                      ("sm_90", _TWIN_V1_FP16): ro + ["LDG.E.64 R6, desc[UR4][R2.64]"]})
    # the ring (csrc/kvprefetch/gqa_twins.cuh): the S = 2 twins also compiled staged; a staged 2x4 is
    # off the rule, and so is a staged twin without its unstaged instantiation
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
    strong = ro + ["LDG.E.STRONG.GPU R8, desc[UR4][R2.64]"]
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


def test_pdl_order_on_a_real_compile(tmp_path: Path) -> None:
    """pdl_waits on a REAL sm_90 compile (tests/samples/sass/pdl_order.cu): nvcc 13.0 emits
    griddepcontrol.wait as ACQBULK, and the check tells a kernel that waits before its first
    global load from one that loads first and from one that never waits."""
    from kvprefetch.sass import pdl_waits
    from kvprefetch.verify import PDL_CHECK, VerifyReport, check_pdl_order

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


def test_pdl_check_passes_when_every_wait_comes_first() -> None:
    """check_pdl_order: twins that wait (ACQBULK) before their first global instruction pass,
    predicated or not; a store before the wait fails; a tree without twins gets no row."""
    from kvprefetch.verify import PDL_CHECK, VerifyReport, check_pdl_order

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
    from kvprefetch.verify import VerifyReport, check_gqa_twin

    ro = ["LDG.E.64.CONSTANT R4, desc[UR4][R2.64]"] * 3
    coherent = ["ACQBULK", "LDG.E.STRONG.SM R0, desc[UR6][R2.64]",
                "LDG.E.64.STRONG.GPU R8, desc[UR6][R2.64]"] + ro
    base = {("sm_90", _V1_FP16): ro, ("sm_90", _V2_BF16): ro, ("sm_90", _V1_BF16): ro}
    names = _all_twins(_TWIN_V1_FP16) + _all_twins(_TWIN_V2_BF16)
    rep = VerifyReport("unused")
    check_gqa_twin(rep, "pdl", "prefetch", _listing({**base, **{("sm_90", n): coherent
                                                                for n in names}}))
    plain = {("sm_90", n): coherent for n in names} | {
        ("sm_90", names[0]): coherent + ["LDG.E R6, desc[UR4][R2.64]"]}
    check_gqa_twin(rep, "plain", "prefetch", _listing({**base, **plain}))
    status = {c.tree: c for c in rep.checks}
    assert status["pdl"].status == "pass", status["pdl"].detail
    assert status["plain"].status == "fail" and "1 with a global load off" in status["plain"].detail
