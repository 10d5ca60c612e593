"""The GPU numerical-identity check that ``verify-kernel`` runs: a prefetch must not change outputs.

Every loaded variant (baseline first, then patched/seed) runs ``paged_attention_v1`` and ``_v2`` on
the same fresh random inputs. A prefetch is only a hint, so each variant's output must be
*bitwise* equal to the baseline's (compared as raw bytes, so NaN payloads and -0.0 count), every
element must be written (outputs are poisoned with NaN first) and the baseline must match a float64
reference within the dtype's tolerance. The cases cover head sizes 64/128/256, block sizes 16/32,
fp16/bf16 with an auto and an fp8 KV cache, and contexts on both sides of v2's 512-token partition
and of v1's 8192 limit. A case whose instantiation a build lacks (per its manifest) is reported
"not checked", never "passed".

Entry points: ``check_identity(ops, ...)`` for loaded ops, ``run_identity(workdir, ...)`` for the
builds on disk, and ``python -m kvprefetch.verify.numerics --workdir DIR --json FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BenchError, ConfigError, VerifyError
from ..kernels.kvinputs import AttnShape, make_inputs
from ..kernels.ops import PagedOps, choose_kernel, forward_decode, load_builds, v2_workspace
from .reference import reference_decode, relative_error

# ||out - ref|| / ||ref|| bounds. The kernel rounds the softmax weights to the compute dtype
# before the V product and the output to the dtype: fp16 lands near 5e-4, bf16 near 4e-3.
TOLERANCES: dict[str, float] = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 1e-4}

PASSED, FAILED, NOT_CHECKED = "passed", "failed", "not checked"
# run_identity's answer where torch sees no GPU (verify-kernel recognises it by this text)
NO_CUDA_DEVICE = "no CUDA device visible to this python"


@dataclass(frozen=True)
class IdentityCase:
    head_size: int
    block_size: int
    dtype: str
    kv_cache_dtype: str
    max_seq_len: int
    num_seqs: int = 3
    num_heads: int = 8
    num_kv_heads: int = 2

    def shape(self) -> AttnShape:
        return AttnShape(num_seqs=self.num_seqs, num_heads=self.num_heads,
                         num_kv_heads=self.num_kv_heads, head_size=self.head_size,
                         block_size=self.block_size, max_seq_len=self.max_seq_len,
                         dtype=self.dtype, kv_cache_dtype=self.kv_cache_dtype)

    @property
    def label(self) -> str:
        return (f"d{self.head_size} b{self.block_size} {self.dtype}/{self.kv_cache_dtype} "
                f"ctx{self.max_seq_len} s{self.num_seqs} h{self.num_heads}/{self.num_kv_heads}")


# One partition; just over one partition; many partitions (vLLM: v2); over v1's 8192 limit.
DEFAULT_CONTEXTS = (200, 513, 1500, 8193)


def default_cases(contexts: Sequence[int] = DEFAULT_CONTEXTS) -> list[IdentityCase]:
    cases: list[IdentityCase] = []
    for head in (64, 128, 256):
        kv_heads = 1 if head == 256 else 2  # d=256 as MQA (gemma-2b), the rest GQA 4:1
        for block in (16, 32):
            for dtype, kv in (("float16", "auto"), ("bfloat16", "auto"),
                              ("float16", "fp8"), ("bfloat16", "fp8")):
                for ctx in contexts:
                    cases.append(IdentityCase(head, block, dtype, kv, ctx, num_kv_heads=kv_heads))
    # A multi-partition context where vLLM still picks v1 (num_seqs * num_heads > 512).
    cases.append(IdentityCase(128, 16, "float16", "auto", 1025, num_seqs=72))
    return cases


@dataclass(frozen=True)
class IdentityRow:
    case: IdentityCase
    kernel: str
    vllm_choice: str
    status: str
    bitwise_equal: bool | None
    rel_err: tuple[tuple[str, float], ...]
    tolerance: float
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self.case, k) for k in self.case.__dataclass_fields__}
        d.update(label=self.case.label, kernel=self.kernel, vllm_choice=self.vllm_choice,
                 status=self.status, bitwise_equal=self.bitwise_equal,
                 rel_err=dict(self.rel_err), tolerance=self.tolerance,
                 problems=list(self.problems))
        return d


@dataclass(frozen=True)
class IdentityReport:
    status: str
    variants: tuple[str, ...]
    device: str
    seed: int
    rows: tuple[IdentityRow, ...]
    reason: str = ""
    builds: tuple[dict[str, Any], ...] = field(default=())
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def count(self, status: str) -> int:
        return sum(1 for r in self.rows if r.status == status)

    def to_dict(self) -> dict[str, Any]:
        worst: dict[str, float] = {}
        for r in self.rows:
            for _, e in r.rel_err:
                worst[r.case.dtype] = max(worst.get(r.case.dtype, 0.0), e)
        return {
            "kind": "identity", "status": self.status, "passed": self.passed,
            "reason": self.reason, "variants": list(self.variants), "device": self.device,
            "seed": self.seed, "seconds": round(self.seconds, 2),
            "checked": self.count(PASSED) + self.count(FAILED), "failed": self.count(FAILED),
            "not_checked": self.count(NOT_CHECKED), "max_rel_err": worst,
            "tolerances": TOLERANCES, "builds": list(self.builds),
            "rows": [r.to_dict() for r in self.rows],
        }


def bytes_equal(a: Any, b: Any) -> bool:
    """Bitwise equality of two tensors of the same dtype and shape (raw bytes, so NaN == NaN
    only when the bits match and -0.0 != +0.0)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def overall_status(rows: Sequence[IdentityRow]) -> str:
    """failed if any row failed; passed if at least one row passed and none failed."""
    if any(r.status == FAILED for r in rows):
        return FAILED
    if any(r.status == PASSED for r in rows):
        return PASSED
    return NOT_CHECKED


def _run_variant(ops: PagedOps, inputs: Any, kernel: str) -> Any:
    import torch

    args = inputs.args()
    out = torch.full_like(args.query, float("nan"))
    ws = None
    if kernel == "v2":
        s = inputs.shape
        ws = v2_workspace(s.num_seqs, s.num_heads, s.head_size, s.max_seq_len, out.dtype,
                          out.device)
        for t in ws:
            t.fill_(float("nan"))
    output, _ = forward_decode(ops, args, force=kernel, out=out, workspace=ws)
    if output.is_cuda:
        torch.cuda.synchronize(output.device)
    return output


def check_case(ops: Sequence[PagedOps], case: IdentityCase, *, device: Any, seed: int,
               tolerances: dict[str, float] | None = None) -> list[IdentityRow]:
    """Both kernels for one case, on one fresh input set shared by all variants."""
    import torch

    tol = (tolerances or TOLERANCES)[case.dtype]
    choice = choose_kernel(case.max_seq_len, case.num_seqs, case.num_heads)
    lacking = [o.name for o in ops
               if not o.supports(case.head_size, case.block_size, case.kv_cache_dtype, case.dtype)]
    if lacking:
        why = f"instantiation not in build(s): {', '.join(lacking)}"
        return [IdentityRow(case, k, choice, NOT_CHECKED, None, (), tol, (why,))
                for k in ("v1", "v2")]
    inputs = make_inputs(case.shape(), device=device, seed=seed, ragged=True)
    ref = reference_decode(inputs.args(), seq_lens=inputs.seq_lens_list)
    rows = []
    for kernel in ("v1", "v2"):
        problems: list[str] = []
        errs: list[tuple[str, float]] = []
        outs: list[Any] = []
        for o in ops:
            try:
                out = _run_variant(o, inputs, kernel)
            except RuntimeError as exc:  # a launch error from the op, reported per case
                problems.append(f"{o.name}: {str(exc).splitlines()[0]}")
                outs.append(None)
                continue
            outs.append(out)
            if bool(torch.isnan(out).any()):
                problems.append(f"{o.name}: NaN in output (unwritten elements or bad math)")
            err = relative_error(out, ref)
            errs.append((o.name, err))
            if not err <= tol:  # NaN fails here too
                problems.append(f"{o.name}: relative error {err:.2e} > {tol:.0e}")
        base = outs[0]
        equal: bool | None = None
        if base is not None and all(x is not None for x in outs):
            equal = all(bytes_equal(base, x) for x in outs[1:])
            if not equal:
                diff = [o.name for o, x in zip(ops[1:], outs[1:], strict=True)
                        if not bytes_equal(base, x)]
                problems.append(f"not bitwise equal to {ops[0].name}: {', '.join(diff)}")
        status = FAILED if problems else PASSED
        rows.append(IdentityRow(case, kernel, choice, status, equal, tuple(errs), tol,
                                tuple(problems)))
    return rows


def check_identity(ops: Sequence[PagedOps], *, cases: Sequence[IdentityCase] | None = None,
                   device: Any = "cuda", seed: int = 0,
                   tolerances: dict[str, float] | None = None,
                   progress: Callable[[str], None] | None = None) -> IdentityReport:
    """Run every case on every variant; ``ops[0]`` is the reference build for bitwise equality."""
    if not ops:
        raise VerifyError("no kernel builds to compare", "run `kvprefetch build --kernels-only`")
    t0 = time.monotonic()
    rows: list[IdentityRow] = []
    for i, case in enumerate(cases if cases is not None else default_cases()):
        case_rows = check_case(ops, case, device=device, seed=seed + i, tolerances=tolerances)
        rows.extend(case_rows)
        if progress is not None:
            progress(f"[{i + 1}] {case.label}: "
                     + ", ".join(f"{r.kernel} {r.status}" for r in case_rows))
    return IdentityReport(
        status=overall_status(rows), variants=tuple(o.name for o in ops),
        device=_device_name(device),
        seed=seed, rows=tuple(rows), builds=tuple(o.build.to_dict() for o in ops if o.build),
        seconds=time.monotonic() - t0,
    )


def _device_name(device: Any) -> str:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    return dev.type


def not_checked(reason: str, variants: Sequence[str] = ()) -> IdentityReport:
    return IdentityReport(status=NOT_CHECKED, variants=tuple(variants), device="none", seed=0,
                          rows=(), reason=reason)


def run_identity(workdir: Path, *, trees: Sequence[str] | None = None, seed: int = 0,
                 cases: Sequence[IdentityCase] | None = None,
                 progress: Callable[[str], None] | None = None) -> IdentityReport:
    """What ``verify-kernel`` calls: load every kernels-only build under ``workdir`` (baseline
    first) into this process and check them. Without a GPU the report says "not checked"."""
    import torch

    from ..machine.gpu_folders import refuse_foreign_gpu_folders

    if not torch.cuda.is_available():
        return not_checked(f"{NO_CUDA_DEVICE} (torch.cuda.is_available() is False)")
    refuse_foreign_gpu_folders()  # before a kernel loads: the caches CUDA writes by path
    ops = load_builds(workdir, trees)
    if ops[0].name != "baseline":
        raise VerifyError(f"no baseline build among {[o.name for o in ops]}",
                          "build the baseline tree with `kvprefetch build --kernels-only`")
    if len(ops) < 2:
        raise VerifyError("only the baseline build was found; nothing to compare it with",
                          "build the patched tree too")
    return check_identity(ops, cases=cases, seed=seed, progress=progress)


def format_report(report: IdentityReport) -> str:
    lines = [(f"numerical identity: {report.status.upper()}  variants={','.join(report.variants)}"
             f"  device={report.device}")]
    if report.reason:
        lines.append(f"  reason: {report.reason}")
    d = report.to_dict()
    lines.append(f"  checked {d['checked']}, failed {d['failed']}, not checked "
                 f"{d['not_checked']}; worst relative error by dtype: "
                 + ", ".join(f"{k} {v:.2e}" for k, v in d["max_rel_err"].items()))
    for r in report.rows:
        if r.status != PASSED:
            lines.append(f"  {r.status:11s} {r.case.label} {r.kernel}: {'; '.join(r.problems)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvprefetch.verify.numerics", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("kvprefetch-work"))
    p.add_argument("--tree", action="append", dest="trees",
                   help="limit to these trees (repeatable; default: every build found)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, dest="json_path", help="write the report here")
    ns = p.parse_args(argv)
    try:
        report = run_identity(ns.workdir, trees=ns.trees, seed=ns.seed,
                              progress=lambda m: print(m, file=sys.stderr, flush=True))
    except (BenchError, VerifyError) as exc:
        report = not_checked(exc.message)
        print(exc.message, file=sys.stderr)
        code = exc.exit_code
    else:
        code = 0 if report.passed else (VerifyError.exit_code if report.status == FAILED
                                         else ConfigError.exit_code)
    print(format_report(report))
    if ns.json_path:  # confine.write_file: never through a planted link (issue 41)
        from ..workspace.confine import write_file

        write_file(ns.json_path, json.dumps(report.to_dict(), indent=2) + "\n",
                   family=VerifyError)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
