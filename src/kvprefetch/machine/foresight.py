"""What a build will give, and what it costs per instantiation, known before any plan exists
(issue 42: `build --arch 8.0` started an hour of compiling on two cores, without asking, for a
patched tree that could not hold the prefetch). The pure half of the build's foresight: doctor
says these before a build (``doctor.host``, ``doctor.preflight``) and ``builds.foresight``
applies them to a plan, so they live here, below both.

* ``lacking``: one line naming what the patched trees will not have on the archs asked for.
  The bulk L2 prefetch (``cp.async.bulk.prefetch.L2``) assembles only for sm_90 and newer; on
  older targets csrc/kvprefetch/l2_prefetch.cuh compiles it to nothing (and the twins' staging
  and programmatic launch are sm_90 code too), so those kernels are stock's. The build still
  runs: it builds what it can.
* ``compile_seconds``: the wall time of compiling some trees' launcher sources, from a measured
  cost per instantiation; ``CONFIRM_OVER_S``: past it, a build asks first where someone can
  answer.

Pure: the archs, counts and core numbers are parameters."""

from __future__ import annotations

from collections.abc import Sequence

from .toolchain import CudaArch, vllm_c_archs

# CPU seconds to compile one paged-attention instantiation (one kernel of one launcher source)
# for one arch, over the four trees main.sh builds (stock and the variants, whose twins and
# unbounded copies add code; 4 trees x 2 sources x 486 instantiations for sm_90 on 2 cores):
# about 1.0 on a quiet machine (issue 42's fresh run: some 33 min of compile), 1.7-1.8 while
# other builds shared the cores (the manifests of the 2026-12-03 run: baseline 1624 s, patched
# 1747 s). An estimate, not a promise: it errs a little long on a quiet machine.
CORE_SECONDS_PER_INSTANTIATION = 1.2
# The kernels-only library's launcher sources (paged_attention_v1.cu, paged_attention_v2.cu).
SOURCES_PER_TREE = 2
# A build estimated longer than this asks first where someone can answer (or needs --yes).
CONFIRM_OVER_S = 600.0

_SM90_ONLY = ("the L2 prefetch (UBLKPF), the launcher's L2 prefetch kernel, and the GQA twins' "
              "staging ring and programmatic launch")


def lacking(archs: Sequence[CudaArch], cuda_version: tuple[int, ...] | None = None
            ) -> str | None:
    """One line saying what the patched trees lack when no arch vLLM compiles for is 9.0 or
    newer; None when the prefetch assembles for one of them."""
    built = vllm_c_archs(archs, cuda_version)
    if any(a.has_bulk_prefetch for a in built):
        return None
    sms = ", ".join(f"sm_{a.sm}" for a in built) or "no arch"
    return (f"--arch {';'.join(a.spec for a in archs)} compiles only for {sms}, below 9.0: the "
            f"patched trees build, but without {_SM90_ONLY} (sm_90 instructions), so their "
            "kernels there are stock's; add 9.0a to --arch for the prefetch")


def compile_seconds(trees: int, kernels_per_source: int, archs: int, workers: int) -> float:
    """Wall seconds to compile ``trees`` trees' launcher sources of ``kernels_per_source``
    instantiations for ``archs`` archs with ``workers`` nvcc at a time (each compiles one
    source on one core, so no more at once than there are sources)."""
    core_s = (trees * SOURCES_PER_TREE * kernels_per_source * max(1, archs)
              * CORE_SECONDS_PER_INSTANTIATION)
    return core_s / max(1, min(workers, trees * SOURCES_PER_TREE))
