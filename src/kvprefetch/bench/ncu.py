"""``bench ncu``: the paper reproduction's Nsight Compute attribution recipe, per variant, and
its parsing.

The recipe: application replay (kernel replay's memory snapshots ran a
host out of RAM), ``--cache-control all`` (cold caches before every profiled kernel),
``--clock-control none`` (measure the clocks as they are), kernel filter ``regex:paged_attention``,
``--launch-skip``/``--launch-count``, the five metrics below, CSV output.

The profiled program is this module's own target (``python -m kvprefetch.bench.ncu``): it loads
ONE variant's library and runs ``skip + count`` eager decode calls of one shape on inputs drawn
from a fixed seed, so every application-replay pass sees identical launches.

Parsing is pure: ``parse_ncu_csv`` reads either ``--page raw`` (one row per kernel, one column per
metric, then a units row) or ``--page details`` (one row per metric) output, with ncu's
``==PROF==`` lines and the target's own stdout around it; ``aggregate`` averages per kernel
family; ``deltas`` compares variants with the baseline.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BenchError
from .schema import (
    SCHEMA_VERSION,
    MetricChange,
    NcuDelta,
    NcuDocument,
    NcuKernel,
    NcuShape,
    ShapeFields,
)

METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "lts__t_sector_op_read_hit_rate.pct",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
)
SHORT = {
    "gpu__time_duration.sum": "time",
    "dram__bytes_read.sum": "dram_read",
    "lts__t_sector_op_read_hit_rate.pct": "l2_hit",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct": "long_sb_stall",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput",
}
# Percentages compare as differences in points; times and bytes as ratios.
PERCENT_METRICS = frozenset(m for m in METRICS if m.endswith(".pct")
                            or "pct_of_peak" in m)
KERNEL_REGEX = "regex:paged_attention"
# With --print-units base, times are in ns and bytes in bytes; other units are normalised here.
_UNIT_SCALE = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
               "second": 1e9, "s": 1e9, "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9,
               "kibyte": 1024.0, "mibyte": 1024.0 ** 2, "gibyte": 1024.0 ** 3}


@dataclass(frozen=True)
class NcuOptions:
    launch_skip: int = 20
    launch_count: int = 10
    metrics: tuple[str, ...] = METRICS
    kernel_regex: str = KERNEL_REGEX
    ncu: str = "ncu"


def ncu_command(target: Sequence[str], csv_path: Path,
                opts: NcuOptions = NcuOptions()) -> list[str]:
    """The full ncu argv wrapping ``target`` (a python command line)."""
    return [
        opts.ncu, "--replay-mode", "application", "--cache-control", "all",
        "--clock-control", "none", "--target-processes", "all",
        "-k", opts.kernel_regex, "--launch-skip", str(opts.launch_skip),
        "--launch-count", str(opts.launch_count), "--metrics", ",".join(opts.metrics),
        "--csv", "--page", "raw", "--print-units", "base", "--log-file", str(csv_path),
        *target,
    ]


def target_command(python: str, so_path: Path, namespace: str, shape: ShapeFields,
                   launches: int, seed: int = 0) -> list[str]:
    """``python -m kvprefetch.bench.ncu`` with one variant and one shape."""
    return [python, "-m", "kvprefetch.bench.ncu", "--so", str(so_path), "--namespace", namespace,
            "--batch", str(shape["batch"]), "--context", str(shape["context"]),
            "--num-heads", str(shape["num_heads"]), "--num-kv-heads", str(shape["num_kv_heads"]),
            "--head-size", str(shape["head_size"]), "--block-size", str(shape["block_size"]),
            "--dtype", shape["dtype"], "--kv-cache-dtype", shape["kv_cache_dtype"],
            "--kernel", shape["kernel"], "--launches", str(launches), "--seed", str(seed)]


def launches_needed(kernel: str, opts: NcuOptions) -> int:
    """Decode calls the target must make so ncu sees ``skip + count`` matching launches (v2 is
    two matching kernels per call: the partitioned kernel and its reduce), plus a margin."""
    per_call = 2 if kernel == "v2" else 1
    return -(-(opts.launch_skip + opts.launch_count) // per_call) + 2


# ----------------------------------------------------------------------------- parsing

IDENTITY_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
                    "Stream", "Block Size", "Grid Size", "Device", "CC")


def parse_number(text: str) -> float | None:
    """``"1,234.5"`` -> 1234.5; ``"n/a"``, empty -> None."""
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def _scaled(value: float | None, unit: str) -> float | None:
    if value is None:
        return None
    return value * _UNIT_SCALE.get(unit.strip().lower(), 1.0)


@dataclass(frozen=True)
class KernelLaunch:
    id: int
    kernel: str
    grid: str
    block: str
    metrics: tuple[tuple[str, float | None], ...]

    def get(self, metric: str) -> float | None:
        return dict(self.metrics).get(metric)


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV part of ncu's output: from the header line (starting ``"ID",``) on, skipping
    ``==PROF==``/``==WARNING==`` lines and anything the target printed before it."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID","Process ID"')), None)
    if start is None:
        raise BenchError("no ncu CSV table in the output (no '\"ID\",\"Process ID\"' header)",
                         "check the ncu log: the kernel regex matched nothing, or profiling "
                         "is not permitted (ERR_NVGPUCTRPERM)")
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(body))))


def _launches(text: str, path: Path) -> list[KernelSummary]:
    """ncu's table parsed and summed per kernel family; a table that is not ncu's shape (a
    row shorter than its header, an ID that is no number, a column missing) is a BenchError
    naming the file. A short row was an IndexError traceback (issue 41, the seventeenth
    hostile pass: the CSV is ncu's output in the output folder, data like any record). A cell
    past the csv module's field limit raises ``csv.Error``, which is no ValueError: a traceback
    (the thirty-sixth pass)."""
    try:
        return aggregate(parse_ncu_csv(text))
    except (IndexError, KeyError, ValueError, TypeError, csv.Error) as exc:
        raise BenchError(f"ncu's CSV {path} is malformed ({type(exc).__name__}: {exc})",
                         f"read {path.with_suffix('.log')} for ncu's own output; rerun "
                         "bench ncu once ncu writes its table") from None


def _read_csv(path: Path, kept: Path | None = None) -> str:
    """The CSV ncu wrote (``read_limited``: a FIFO planted there hung the read, and a missing
    one was "No such file or directory / check the path": issue 41, the tenth hostile pass).
    ``kept``: where the run keeps it, beside ncu's log (``path`` is in a private folder)."""
    from ..reading import read_limited

    shown = kept or path
    try:
        return read_limited(path).decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        raise BenchError(f"Nsight Compute left no readable CSV ({exc})",
                         f"read {shown.with_suffix('.log')} for ncu's own output, then "
                         "rerun") from None


def parse_ncu_csv(text: str) -> list[KernelLaunch]:
    """Every profiled launch with its metrics, in launch order."""
    rows = _csv_rows(text)
    header, data = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    launches: dict[int, dict[str, Any]] = {}
    if "Metric Name" in col:  # --page details: one row per (launch, metric)
        for r in data:
            lid = int(r[col["ID"]])
            entry = launches.setdefault(lid, {"kernel": r[col["Kernel Name"]],
                                              "grid": r[col["Grid Size"]],
                                              "block": r[col["Block Size"]], "metrics": {}})
            entry["metrics"][r[col["Metric Name"]]] = _scaled(parse_number(r[col["Metric Value"]]),
                                                              r[col["Metric Unit"]])
    else:  # --page raw: header of metric names, then a units row, then one row per launch
        metric_cols = [(i, h) for i, h in enumerate(header) if h not in IDENTITY_COLUMNS]
        units = data[0] if data and not data[0][col["ID"]].strip().isdigit() else None
        for r in data[1:] if units is not None else data:
            lid = int(r[col["ID"]])
            launches[lid] = {
                "kernel": r[col["Kernel Name"]], "grid": r[col.get("Grid Size", 0)],
                "block": r[col.get("Block Size", 0)],
                "metrics": {h: _scaled(parse_number(r[i]), units[i] if units else "")
                            for i, h in metric_cols},
            }
    return [KernelLaunch(lid, e["kernel"], e["grid"], e["block"], tuple(e["metrics"].items()))
            for lid, e in sorted(launches.items())]


_FAMILY = re.compile(r"(paged_attention_v[12](?:_reduce)?_kernel)")


def kernel_family(name: str) -> str:
    """``void vllm::paged_attention_v2_kernel<...>(...)`` -> ``paged_attention_v2_kernel``."""
    m = _FAMILY.search(name)
    return m.group(1) if m else name.split("(")[0].split("<")[0].split()[-1]


@dataclass(frozen=True)
class KernelSummary:
    family: str
    launches: int
    mean: tuple[tuple[str, float], ...]

    def get(self, metric: str) -> float | None:
        return dict(self.mean).get(metric)


def aggregate(launches: Sequence[KernelLaunch]) -> list[KernelSummary]:
    """Mean of each metric per kernel family (launches where ncu gave no value are left out)."""
    groups: dict[str, list[KernelLaunch]] = {}
    for k in launches:
        groups.setdefault(kernel_family(k.kernel), []).append(k)
    out = []
    for fam, ks in groups.items():
        names: list[str] = []
        for k in ks:
            names.extend(m for m, _ in k.metrics if m not in names)
        mean = []
        for m in names:
            vals = [v for v in (k.get(m) for k in ks) if v is not None]
            if vals:
                mean.append((m, sum(vals) / len(vals)))
        out.append(KernelSummary(fam, len(ks), tuple(mean)))
    return sorted(out, key=lambda s: s.family)


def deltas(baseline: Sequence[KernelSummary], variant: Sequence[KernelSummary]) -> list[NcuDelta]:
    """Per kernel family present in both: for each metric, baseline, variant and the change
    (ratio variant/baseline for time and bytes, difference in points for percentages), plus the
    speedup baseline_time / variant_time."""
    base = {s.family: s for s in baseline}
    rows: list[NcuDelta] = []
    for v in variant:
        b = base.get(v.family)
        if b is None:
            continue
        change = {SHORT[m]: _change(m, b.get(m), v.get(m)) for m in METRICS}
        tb, tv = b.get("gpu__time_duration.sum"), v.get("gpu__time_duration.sum")
        rows.append({"kernel": v.family, "launches": [b.launches, v.launches],
                     "time": change["time"], "dram_read": change["dram_read"],
                     "l2_hit": change["l2_hit"], "long_sb_stall": change["long_sb_stall"],
                     "sm_throughput": change["sm_throughput"],
                     "speedup": tb / tv if tb and tv else None})
    return rows


# ----------------------------------------------------------------------------- running


def _change(metric: str, bv: float | None, vv: float | None) -> MetricChange:
    """One metric of a kernel family, baseline and variant, and the change: a difference in
    points for percentages, a ratio otherwise (None where either is missing, or a ratio's
    baseline is 0)."""
    change = None
    if bv is not None and vv is not None:
        if metric in PERCENT_METRICS:
            change = vv - bv
        elif bv:
            change = vv / bv
    return {"baseline": bv, "variant": vv, "change": change}


def summary_dict(s: KernelSummary) -> NcuKernel:
    d: NcuKernel = {"kernel": s.family, "launches": s.launches}
    for m, v in s.mean:  # the metrics ncu reported, under their short names
        name = SHORT.get(m)
        if name == "time":
            d["time"] = v
        elif name == "dram_read":
            d["dram_read"] = v
        elif name == "l2_hit":
            d["l2_hit"] = v
        elif name == "long_sb_stall":
            d["long_sb_stall"] = v
        elif name == "sm_throughput":
            d["sm_throughput"] = v
    return d


def run_ncu_bench(builds: Sequence[Any], shapes: Sequence[Any], out_dir: Path,
                  opts: NcuOptions = NcuOptions(), python: str | None = None,
                  progress: Any = None, command: Sequence[str] = ()) -> NcuDocument:
    """Profile every (shape, variant) with ncu and parse the results. ``builds`` are
    ``ops.BuiltOps`` (baseline first); ``shapes`` are ``matrix.BenchShape``. The raw CSV of each
    run is kept under ``out_dir`` as ``ncu-<shape#>-<tree>.csv``."""
    from ..runner import which

    if which(opts.ncu) is None and not Path(opts.ncu).is_file():
        raise BenchError(f"'{opts.ncu}' (Nsight Compute) is not on PATH",
                         "install Nsight Compute or pass --ncu /path/to/ncu")
    from ..machine.gpu_folders import refuse_foreign_gpu_folders
    from .plan import make_dir

    refuse_foreign_gpu_folders()  # the profiled child's caches, named absolute: it runs in /
    py = python or sys.executable
    py = os.path.abspath(py) if os.sep in py else py
    make_dir(out_dir)  # from the work directory down (bench/ncu's logs too: runner.open_log)
    from ..workspace.confine import root_of
    from ..workspace.ownership import private_dir

    # ncu writes its CSV by the path --log-file names, following a link there: a link (or a
    # hard link) planted at bench/ncu-1-baseline.csv in the work directory had ncu overwrite
    # the file outside it names (issue 41, the thirty-third hostile pass). So ncu writes into
    # a private folder, and the kit copies the CSV to out_dir (confine.write_file: a new file,
    # renamed into place, never written through a link)
    with private_dir("ncu", outside=root_of(out_dir)) as priv:
        return _profile(builds, shapes, out_dir, priv, opts, py, progress or (lambda m: None),
                        command)


def _profile(builds: Sequence[Any], shapes: Sequence[Any], out_dir: Path, priv: Path,
             opts: NcuOptions, py: str, say: Any, command: Sequence[str]) -> NcuDocument:
    import time

    from ..runner import NEUTRAL_CWD, run
    from ..workspace.confine import root_of, write_file

    doc_shapes: list[NcuShape] = []
    for si, shape in enumerate(shapes, 1):
        sd: ShapeFields = shape.to_dict()
        per_variant: dict[str, list[KernelSummary]] = {}
        csvs: dict[str, str] = {}
        for b in builds:
            csv_path = out_dir / f"ncu-{si}-{b.tree}.csv"
            written = priv / csv_path.name  # absolute: ncu runs in NEUTRAL_CWD
            target = target_command(py, Path(os.path.abspath(b.so_path)), b.namespace, sd,
                                    launches_needed(shape.kernel, opts))
            t0 = time.monotonic()
            run(ncu_command(target, written, opts), log=out_dir / f"ncu-{si}-{b.tree}.log",
                cwd=NEUTRAL_CWD)
            text = _read_csv(written, csv_path)
            write_file(csv_path, text, root=root_of(out_dir), family=BenchError)
            per_variant[b.tree] = _launches(text, csv_path)
            csvs[b.tree] = csv_path.name
            say(f"[{si}/{len(shapes)}] {shape.label} {b.tree}: "
                + ", ".join(f"{s.family} {((s.get(METRICS[0]) or 0) / 1e3):.1f} us"
                            for s in per_variant[b.tree])
                + f" ({time.monotonic() - t0:.0f} s)")
        base = builds[0].tree
        doc_shapes.append({
            **sd, "label": shape.label, "csv": csvs,
            "variants": {t: [summary_dict(s) for s in v] for t, v in per_variant.items()},
            "deltas": {t: deltas(per_variant[base], v) for t, v in per_variant.items()
                       if t != base},
        })
    return {"kind": "ncu", "schema": SCHEMA_VERSION,
            "meta": {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "baseline": builds[0].tree, "variants": [b.tree for b in builds],
                     "options": {"launch_skip": opts.launch_skip,
                                 "launch_count": opts.launch_count,
                                 "metrics": list(opts.metrics), "kernel_regex": opts.kernel_regex},
                     "ncu_example": ncu_command(["<target>"], Path("<csv>"), opts),
                     "command": list(command)},
            "shapes": doc_shapes}


# ----------------------------------------------------------------------------- target


def target_main(argv: Sequence[str] | None = None) -> int:
    """The profiled program: one variant, one shape, ``--launches`` eager decode calls."""
    p = argparse.ArgumentParser(prog="python -m kvprefetch.bench.ncu")
    p.add_argument("--so", type=Path, required=True)
    p.add_argument("--namespace", required=True)
    for name in ("batch", "context", "num-heads", "num-kv-heads", "head-size", "block-size",
                 "launches"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--kernel", choices=("v1", "v2"), required=True)
    p.add_argument("--seed", type=int, default=0)
    ns = p.parse_args(argv)

    import torch

    from ..kernels.kvinputs import AttnShape, make_inputs
    from ..kernels.ops import forward_decode, load_library, v2_workspace

    ops = load_library(ns.so, ns.namespace)
    shape = AttnShape(num_seqs=ns.batch, num_heads=ns.num_heads, num_kv_heads=ns.num_kv_heads,
                      head_size=ns.head_size, block_size=ns.block_size, max_seq_len=ns.context,
                      dtype=ns.dtype, kv_cache_dtype=ns.kv_cache_dtype)
    inputs = make_inputs(shape, device="cuda", seed=ns.seed)
    out = torch.empty_like(inputs.query)
    ws = v2_workspace(shape.num_seqs, shape.num_heads, shape.head_size, shape.max_seq_len,
                      out.dtype, out.device) if ns.kernel == "v2" else None
    for _ in range(ns.launches):
        forward_decode(ops, inputs.args(), force=ns.kernel, out=out, workspace=ws)
    torch.cuda.synchronize()
    print(f"kvprefetch ncu target: {ns.launches} {ns.kernel} calls of {ns.namespace}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(target_main())
