"""verify's SASS and module checks on REAL compiles: small kernels of tests/samples/sass/*.cu
built with the machine's nvcc against the CURRENT csrc/ headers and disassembled with
cuobjdump, and the header's host rules compiled and run on the CPU against their Python
statement, kvprefetch.kernels.policy, over generated inputs. The parsers themselves are tested on
saved listings in tests/unit/test_sass.py."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvprefetch.kernels import policy
from kvprefetch.machine.toolchain import find_cuobjdump, find_nvcc
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
                      "__global__ void kvprefetch_test_read(int* o) "
                      "{ *o = kvprefetch_test_bank; }\n")
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
    (EIATTR_MAX_THREADS) and must be there exactly where policy.min_blocks puts one; the
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
    vLLM builds, then the twins' table, KVPREFETCH_GQA's parsing and the stream slots."""
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
    on the CPU through the templates the kernels use, agree with kvprefetch.kernels.policy for
    every one of the 270 instantiations vLLM 0.10.2 builds (9 head sizes x 3 block sizes x 5
    caches x v1/v2): what verify-kernel expects of a binary is what the header compiles. (fp8
    caches are listed with an fp16 query; the rules do not depend on the query type there.)
    The twins' table agrees with policy.TWIN_SHAPES too. The rules' functions on any inputs:
    test_launch_policy_agrees_with_the_header_on_the_cpu."""
    rows = _header_rules(tmp_path)
    kernels = [r for r in rows if r[0] in ("v1", "v2")]
    assert len(kernels) == 270
    got = []
    for version, head, block, cache, kv, bound, prologue, twins in kernels:
        dtype, kv_cache = _CACHE_DTYPE[cache], _KV_CACHE[kv]
        h, b = int(head), int(block)
        want = (policy.min_blocks("prefetch", version, kv_cache, h, b, dtype),
                policy.prefetches_in("prefetch", version, kv_cache, h, b, dtype),
                bool(policy.twin_shapes("prefetch", version, kv_cache, h, b, dtype)))
        got.append((int(bound), prologue == "1", twins == "1"))
        assert got[-1] == want, (version, head, block, cache)
    # each rule holds somewhere and not everywhere (its extent: tests/unit/test_policy.py)
    for rule in range(3):
        assert len({bool(g[rule]) for g in got}) == 2, rule
    table = [(int(g), int(s), int(lo)) for _, g, s, lo, _ in (r for r in rows if r[0] == "twin")]
    assert tuple(table) == policy.TWIN_SHAPES
    assert [r[4] for r in rows if r[0] == "twin"] == [f"{g}x{s}" for g, s, _ in table]


# ---- The launch policy on generated inputs: the header (policy_oracle.cu) against
# kernels/policy.py
# Every decision function of launch_policy.cuh, compiled into a host program, answers a seeded
# random sample over the real ranges plus the boundaries, and kvprefetch.kernels.policy must
# answer each input the same. The ranges: GQA ratios 1..16 (kv heads 1..16), head sizes 64, 128
# and 256 (and any other, for the compile-time rules), blocks 16 and 32, 1..512 sequences, the SM
# counts of the parts the kit meets (78: H20, 114: H100 PCIe, 132: H100 SXM and H200) and the
# edges (0: unknown, 1, 16), the shared memory of Hopper, A100 and Ada SMs.

_SEED = 45
_SAMPLE = 1500  # random inputs per function, besides the boundaries
_SMS = (78, 114, 132)
_EDGE_SMS = (0, 1, 16)
_HEADS = (64, 128, 256)
_BLOCKS = (16, 32)
# (shared memory per SM, the most one CTA may opt into), bytes
_DEVICES = ((233472, 232448), (167936, 166912), (102400, 101376))
# A cache kind as the header's rules take it (cache_t's bytes, KV_DTYPE, fp16 cache, bf16 cache)
# and as policy's do (the query's dtype, kv_cache)
_CACHES = (((2, 0, 1, 0), ("fp16", "auto")), ((2, 0, 0, 1), ("bf16", "auto")),
           ((4, 0, 0, 0), ("fp32", "auto")), ((1, 1, 0, 0), ("fp16", "fp8_e4m3")),
           ((1, 2, 0, 0), ("bf16", "fp8_e5m2")))
_INSTANCE_HEADS = (32, 64, 80, 96, 112, 120, 128, 192, 256)
_SHAPES = [(g, s) for g, s, _ in policy.TWIN_SHAPES]

Inputs = tuple[int, ...]


@dataclass(frozen=True)
class PolicyCase:
    """One function of the policy: ``inputs`` makes its inputs from a seeded random source,
    ``query`` is the oracle's query for an input and ``want`` policy's answer to it."""

    query: str
    inputs: Callable[[random.Random], Sequence[Inputs]]
    want: Callable[[Inputs], int]
    args: Callable[[Inputs], Inputs] = lambda x: x


def _sms(rng: random.Random) -> int:
    return rng.choice(_EDGE_SMS) if rng.random() < 0.05 else rng.choice(_SMS)


def _log_int(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], uniform in its logarithm (as many short contexts as long ones)."""
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def _heads_kv(rng: random.Random) -> tuple[int, int]:
    """(query heads, kv heads): GQA ratios 1..16 over 1..16 kv heads; now and then a count that
    does not divide (the launcher runs vLLM's kernel there) or no kv heads."""
    kv, ratio = rng.randint(1, 16), rng.randint(1, 16)
    edge = rng.random()
    if edge < 0.02:
        return kv * ratio + 1, kv
    if edge < 0.03:
        return kv * ratio, 0
    return kv * ratio, kv


def _instances(rng: random.Random) -> Sequence[Inputs]:
    """(v2, head size, block size, cache kind, block-sparse): every instantiation vLLM builds,
    either sparsity, then any head size and power-of-two block."""
    fixed = list(itertools.product((0, 1), _INSTANCE_HEADS, (8, 16, 32), range(len(_CACHES)),
                                   (0, 1)))
    return fixed + [(rng.randint(0, 1), rng.randint(1, 512), rng.choice((1, 2, 4, 8, 16, 32, 64)),
                     rng.randrange(len(_CACHES)), rng.randint(0, 1)) for _ in range(_SAMPLE)]


def _version(v2: int) -> str:
    return "v2" if v2 else "v1"


def _want_min_blocks(x: Inputs) -> int:
    v2, head, block, cache, _ = x
    dtype, kv_cache = _CACHES[cache][1]
    return policy.min_blocks("prefetch", _version(v2), kv_cache, head, block, dtype)


def _want_prologue(x: Inputs) -> int:
    v2, head, block, cache, _ = x
    dtype, kv_cache = _CACHES[cache][1]
    return int(policy.prefetches_in("prefetch", _version(v2), kv_cache, head, block, dtype))


def _want_twins(x: Inputs) -> int:
    v2, head, block, cache, sparse = x
    dtype, kv_cache = _CACHES[cache][1]
    return int(bool(policy.twin_shapes("prefetch", _version(v2), kv_cache, head, block, dtype,
                                       block_sparse=bool(sparse))))


def _k_registers(rng: random.Random) -> Sequence[Inputs]:
    fixed = list(itertools.product(_INSTANCE_HEADS, (8, 16, 32), (1, 2, 4)))
    return fixed + [(rng.randint(1, 512), rng.choice((1, 8, 16, 32, 64)), rng.choice((1, 2, 4)))
                    for _ in range(_SAMPLE)]


def _auto_twin(rng: random.Random) -> Sequence[Inputs]:
    edges = {max(lo + d, 0) for _, _, lo in policy.TWIN_SHAPES for d in (-1, 0, 1)}
    fixed = [(p, safe) for p in sorted(edges | {0, 10**6}) for safe in (0, 1)]
    return fixed + [(_log_int(rng, 1, 20000), rng.randint(0, 1)) for _ in range(_SAMPLE)]


def _twin_heads(rng: random.Random) -> Sequence[Inputs]:
    fixed = [(h, p, g) for h in (0, 1, 7, 28, 32, 40, 128) for p in (0, 1, 4, 5, 7, 8, 16)
             for g in (2, 4)]
    out = []
    for _ in range(_SAMPLE):
        per_kv = rng.randint(1, 16)
        out.append((per_kv * rng.randint(1, 4096), per_kv, rng.choice((1, 2, 4))))
    return fixed + out


def _smem_ctas(rng: random.Random) -> Sequence[Inputs]:
    fixed = [(per_sm, smem) for per_sm, _ in _DEVICES for smem in (0, 1024, 32768, 232448)]
    return fixed + [(rng.choice(_DEVICES)[0], _log_int(rng, 1, 240000)) for _ in range(_SAMPLE)]


def _keeps_occupancy(rng: random.Random) -> Sequence[Inputs]:
    out = []
    for _ in range(_SAMPLE):
        sms = _sms(rng)
        ctas = rng.choice((sms, sms + 1, 2 * sms, 2 * sms + 1)) if rng.random() < 0.3 \
            else _log_int(rng, 1, 100000)
        out.append((rng.randrange(len(_SHAPES)), ctas, sms, _log_int(rng, 512, 240000),
                    rng.choice(_DEVICES)[0]))
    return out


def _want_keeps_occupancy(x: Inputs) -> int:
    i, ctas, sms, smem, per_sm = x
    return int(policy.keeps_occupancy(_SHAPES[i][1], ctas, sms, smem, per_sm))


def _least_waves(rng: random.Random) -> Sequence[Inputs]:
    out = []
    for _ in range(_SAMPLE):
        ctas = _log_int(rng, 1, 200000)
        out.append((ctas, rng.choice((ctas, ctas // 10, rng.randint(0, ctas))), _sms(rng),
                    rng.randint(1, 12)))
    return out


def _outlasts_stock(rng: random.Random) -> Sequence[Inputs]:
    out = []
    for _ in range(_SAMPLE):
        heads, kv = _heads_kv(rng)
        per_kv = heads // max(kv, 1) or 1
        g = rng.choice((2, 4))
        ctas = heads * rng.randint(1, 512) * _log_int(rng, 1, 64)
        sure = rng.choice((ctas, ctas // 10, rng.randint(0, ctas)))
        out.append((ctas, sure, rng.randint(0, 10), policy.twin_heads(ctas, per_kv, g),
                    policy.twin_heads(sure, per_kv, g), rng.randint(0, 4), _sms(rng),
                    _log_int(rng, 1, 2048)))
    return out


def _more_waves(rng: random.Random) -> Sequence[Inputs]:
    """(seqs, stock's CTAs per sequence and per SM, the variant's): a bound's (the same CTAs per
    sequence) or a twin's (twin_heads of them), or any fewer."""
    pairs = ((32, 32), (32, 16), (32, 8), (28, 8), (28, 16), (448, 112), (8, 8), (1, 1))
    fixed = list(itertools.product((0, 1, 2, 16, 17, 24, 512), pairs, (0, 5, 9), (0, 2, 4),
                                   (*_SMS, 0, 16)))
    out = [(seqs, sps, spm, vps, vpm, sms) for seqs, (sps, vps), spm, vpm, sms in fixed]
    for _ in range(_SAMPLE):
        heads, kv = _heads_kv(rng)
        per_seq = heads * rng.choice((1, 1, rng.randint(1, 64)))
        per_kv = heads // max(kv, 1) or 1
        var = rng.choice((per_seq, policy.twin_heads(per_seq, per_kv, 2),
                          policy.twin_heads(per_seq, per_kv, 4), rng.randint(1, per_seq)))
        out.append((rng.randint(0, 512) if rng.random() < 0.95 else rng.randint(513, 4096),
                    per_seq, rng.randint(0, 12), var, rng.randint(0, 12), _sms(rng)))
    return out


def _stock_v1_wins(rng: random.Random) -> Sequence[Inputs]:
    occupancies = ((4, 5), (6, 9), (3, 3), (6, 6), (0, 5), (5, 4))
    fixed = [(h, s, sms, b, st) for h in (8, 28, 32) for s in (1, 16, 17, 24, 72, 512)
             for sms in _SMS for b, st in occupancies]
    out = []
    for _ in range(_SAMPLE):
        heads, _ = _heads_kv(rng)
        out.append((heads, rng.randint(1, 512), _sms(rng), rng.randint(0, 10),
                    rng.randint(0, 12)))
    return fixed + out


def _stage_count(rng: random.Random) -> Sequence[Inputs]:
    out = []
    for _ in range(_SAMPLE):
        split = rng.choice((1, 2, 4))
        per_sm, _ = rng.choice(_DEVICES)
        out.append((_log_int(rng, 1, 100000), _sms(rng), per_sm, _log_int(rng, 1, 200000),
                    4 * split, rng.choice(_HEADS) * rng.choice(_BLOCKS) * 2,
                    rng.choice((0, _log_int(rng, 1, 2048)))))
    return out


def _reduces(rng: random.Random) -> Sequence[Inputs]:
    """(v2, G, S, the twin's CTAs, SMs): every grid around half and all of the SMs."""
    fixed = [(1, *policy.FUSED_TWINS[0], c, sms) for sms in (*_SMS, *_EDGE_SMS)
             for c in sorted({0, 1, sms // 2, sms // 2 + 1, sms, sms + 1, 2 * sms})]
    out = [(rng.randint(0, 1), *rng.choice(_SHAPES), rng.randint(0, 300), _sms(rng))
           for _ in range(_SAMPLE)]
    return fixed + out


def _twin_smem(rng: random.Random) -> Sequence[Inputs]:
    return [(*rng.choice(_SHAPES), _log_int(rng, 1, 131072), rng.randint(0, 1),
             rng.choice(_HEADS), rng.choice(_BLOCKS)) for _ in range(_SAMPLE)]


def _want_twin_smem(x: Inputs) -> int:
    g, s, context, v2, head, block = x
    return policy.twin_smem(g, s, context, _version(v2), head, block)


def _twin_picks(rng: random.Random) -> Sequence[Inputs]:
    """Decode steps as the launcher sees them, in `auto` mostly, off and each forced twin too:
    (mode, heads, kv heads, batch, longest context, v2, head size, block size, SMs, shared memory
    per SM, the most per CTA, stock's CTAs per SM). The boundaries: contexts of at most and just
    over kStockWarps blocks and one partition, batches that fill a wave of stock's code on the
    H200 or just overfill it."""
    out = []
    for (heads, kv), batch, head, block, v2 in itertools.product(
            ((32, 8), (32, 32), (28, 4), (64, 8)), (1, 16, 17, 24, 128), _HEADS, _BLOCKS, (0, 1)):
        for context in (4 * block, 4 * block + 1, 512, 513, 8192):
            out.append((-2, heads, kv, batch, context, v2, head, block, 132, *_DEVICES[0], 5))
    for _ in range(_SAMPLE * 2):
        heads, kv = _heads_kv(rng)
        mode = rng.choice((-2,) * 6 + (-1, 0, 1, 2, 3))
        out.append((mode, heads, kv, _log_int(rng, 1, 512), _log_int(rng, 1, 32768),
                    rng.randint(0, 1), rng.choice(_HEADS), rng.choice(_BLOCKS), _sms(rng),
                    *rng.choice(_DEVICES), rng.randint(0, 12)))
    return out


def _want_twin_pick(x: Inputs) -> int:
    mode, heads, kv, batch, context, v2, head, block, sms, per_sm, max_smem, stock = x
    if mode == -1 or kv <= 0 or heads % kv:
        return -1
    if mode == -2:  # auto
        pick = policy.twin_pick(heads, kv, batch, context, _version(v2), sm_count=sms,
                                smem_per_sm=per_sm, max_smem=max_smem, stock_per_sm=stock,
                                head_size=head, block_size=block)
        return -1 if pick is None else _SHAPES.index(pick)
    g, s = _SHAPES[mode]  # forced: wherever the twin can run
    fits = policy.twin_smem(g, s, context, _version(v2), head, block) <= max_smem
    return mode if g <= heads // kv and fits else -1


_CASES = {
    "k_registers": PolicyCase("k_registers", _k_registers, lambda x: policy.k_registers(*x)),
    "min_blocks_rule": PolicyCase(
        "min_blocks_rule", _instances, _want_min_blocks,
        lambda x: (x[0], x[1], x[2], *_CACHES[x[3]][0][:2])),
    "prologue_rule": PolicyCase(
        "prologue_rule", _instances, _want_prologue,
        lambda x: (x[1], x[2], _CACHES[x[3]][0][0], x[0], *_CACHES[x[3]][0][2:])),
    "twin_rule": PolicyCase(
        "twin_rule", _instances, _want_twins,
        lambda x: (x[0], x[1], x[2], *_CACHES[x[3]][0][2:], x[4])),
    "auto_twin": PolicyCase(
        "auto_twin", _auto_twin,
        lambda x: _SHAPES.index(policy.auto_twin(x[0], bool(x[1])))),
    "chain_safe": PolicyCase("chain_safe", lambda _: [(i,) for i in range(len(_SHAPES))],
                             lambda x: int(policy.chain_safe(*_SHAPES[x[0]]))),
    "twin_bound_ctas": PolicyCase("twin_bound_ctas",
                                  lambda _: [(i,) for i in range(len(_SHAPES))],
                                  lambda x: policy.twin_bound_ctas(_SHAPES[x[0]][1])),
    "twin_heads": PolicyCase("twin_heads", _twin_heads, lambda x: policy.twin_heads(*x)),
    "smem_ctas": PolicyCase("smem_ctas", _smem_ctas, lambda x: policy.smem_ctas(*x)),
    "keeps_occupancy": PolicyCase("keeps_occupancy", _keeps_occupancy, _want_keeps_occupancy),
    "least_waves": PolicyCase("least_waves", _least_waves, lambda x: policy.least_waves(*x)),
    "outlasts_stock": PolicyCase("outlasts_stock", _outlasts_stock,
                                 lambda x: int(policy.outlasts_stock(*x))),
    "stock_v1_wins": PolicyCase("stock_v1_wins", _stock_v1_wins,
                                lambda x: int(policy.stock_v1_wins(*x))),
    "stage_count": PolicyCase("stage_count", _stage_count, lambda x: policy.stage_count(*x)),
    "twin_reduces": PolicyCase(
        "twin_reduces", _reduces,
        lambda x: int(policy.twin_reduces(_version(x[0]), x[1], x[2], x[3], x[4]))),
    "pdl_reduce_after": PolicyCase(  # the other reduction: wherever the fused twin would not
        "pdl_reduce_after", lambda rng: [x[3:] for x in _reduces(rng)],
        lambda x: int(not policy.twin_reduces("v2", *policy.FUSED_TWINS[0], x[0], x[1]))),
    "twin_smem": PolicyCase("twin_smem", _twin_smem, _want_twin_smem),
    "twin_pick": PolicyCase("twin_pick", _twin_picks, _want_twin_pick),
}
# more_waves_for_some has its own test below (the header's closed form, policy's plain search).
_WAVES = PolicyCase("more_waves_for_some", _more_waves,
                    lambda x: int(policy.more_waves_for_some(*x)))


def _compile_oracle(where: Path, *defines: str) -> Path:
    """tests/samples/sass/policy_oracle.cu compiled against the CURRENT csrc/kvprefetch/ headers
    with ``defines``: host code, run on the CPU."""
    nvcc = find_nvcc()
    assert nvcc is not None, "nvcc is needed (the kernels-only build needs it too)"
    exe = where / ("policy_oracle" + "".join(d.removeprefix("-D").replace("=", "")
                                             for d in defines))
    run([str(nvcc), "-std=c++17", "-O2", f"-I{CSRC}", *defines, "-o", str(exe),
         str(SAMPLES / "policy_oracle.cu")], echo=False)
    return exe


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The policy oracle, compiled once for this module's tests."""
    return _compile_oracle(tmp_path_factory.mktemp("oracle"))


def _ask(exe: Path, case: PolicyCase, inputs: Sequence[Inputs], where: Path) -> list[int]:
    """The header's answer to ``case`` for each of ``inputs``, in order."""
    queries = where / f"{case.query}.txt"
    queries.write_text("".join(f"{case.query} {' '.join(map(str, case.args(x)))}\n"
                               for x in inputs))
    answers = [int(a) for a in run([str(exe), str(queries)], echo=False).output.split()]
    assert len(answers) == len(inputs)
    return answers


def _disagreements(case: PolicyCase, inputs: Sequence[Inputs], answers: list[int]
                   ) -> list[tuple[Inputs, int, int]]:
    return [(x, got, want) for x, got in zip(inputs, answers, strict=True)
            if got != (want := case.want(x))]


@pytest.mark.parametrize("name", sorted(_CASES))
def test_launch_policy_agrees_with_the_header_on_the_cpu(oracle: Path, tmp_path: Path,
                                                         name: str) -> None:
    """Each function of csrc/kvprefetch/launch_policy.cuh, compiled into a host program
    (policy_oracle.cu) and run on the CPU, decides as kvprefetch.kernels.policy does on every
    input of a seeded sample over the real ranges and the boundaries (a few thousand each); and
    the sample reaches more than one answer, so that it tells a rule from a constant."""
    case = _CASES[name]
    inputs = case.inputs(random.Random(f"{_SEED}:{name}"))
    answers = _ask(oracle, case, inputs, tmp_path)
    wrong = _disagreements(case, inputs, answers)
    assert not wrong, f"{len(wrong)} of {len(inputs)} differ (input, header, policy): {wrong[:5]}"
    assert len(set(answers)) > 1, (name, set(answers))
    if name == "twin_pick":  # every twin and vLLM's kernel are somebody's pick in auto
        auto = {a for x, a in zip(inputs, answers, strict=True) if x[0] == -2}
        assert auto == {-1, *range(len(_SHAPES))}, auto


def test_wave_guard_closed_form_on_the_cpu(oracle: Path, tmp_path: Path) -> None:
    """more_waves_for_some's closed form (launch_policy.cuh), compiled and run on the CPU,
    agrees with the plain search over every number of long sequences
    (policy.more_waves_for_some) at every generated input: bounds and twins of every GQA ratio,
    up to 4096 sequences (past the form's shortcut), and gives no verdict where a count is
    unknown."""
    inputs = _WAVES.inputs(random.Random(f"{_SEED}:more_waves_for_some"))
    answers = _ask(oracle, _WAVES, inputs, tmp_path)
    wrong = _disagreements(_WAVES, inputs, answers)
    assert not wrong, f"{len(wrong)} of {len(inputs)} differ (input, header, policy): {wrong[:5]}"
    assert not any(a for x, a in zip(inputs, answers, strict=True)
                   if 0 in (x[0], x[1], x[2], x[3], x[4]))
    assert set(answers) == {0, 1}


def test_twin_modes_on_the_cpu(tmp_path: Path) -> None:
    """KVPREFETCH_GQA's values as the launchers read them (twin_mode_from, compiled from the
    header and run on the CPU): unset or empty the default; on = the first twin; a twin by its
    name; case matters, and unknown values fall back and are reported."""
    rows = _header_rules(tmp_path)
    modes = {r[1]: (int(r[2]), r[3] == "1") for r in rows if r[0] == "mode"}
    names = {f"{g}x{s}": (i, False) for i, (g, s) in enumerate(_SHAPES)}
    assert modes == {"-": (99, False), "''": (99, False), "off": (-1, False),
                     "auto": (-2, False), "on": (0, False), **names, "ON": (99, True),
                     "3x3": (99, True)}


def test_which_reduction_follows_a_v2_twin_on_the_cpu(tmp_path: Path) -> None:
    """A build with -DKVPREFETCH_TWIN_FUSE=0 (the `nofuse` tree) never reduces inside a twin:
    after every v2 twin kvprefetch's reduce kernel runs, on the grids where the default build
    reduces inside too. (The default build's rule: the twin_reduces and pdl_reduce_after cases
    of test_launch_policy_agrees_with_the_header_on_the_cpu.)"""
    exe = _compile_oracle(tmp_path, "-DKVPREFETCH_TWIN_FUSE=0")
    inputs = _CASES["twin_reduces"].inputs(random.Random(f"{_SEED}:twin_reduces"))
    assert set(_ask(exe, _CASES["twin_reduces"], inputs, tmp_path)) == {0}
    assert any(_CASES["twin_reduces"].want(x) for x in inputs)
    pdl = _ask(exe, _CASES["pdl_reduce_after"], [x[3:] for x in inputs], tmp_path)
    fused = policy.FUSED_TWINS[0]
    assert pdl == [int(not policy.twin_reduces("v2", *fused, c, s)) for *_, c, s in inputs]


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
