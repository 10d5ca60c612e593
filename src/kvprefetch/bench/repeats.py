"""Repeated ``bench kernel`` runs read together (``kvprefetch report --repeats``).

One run's spread is over rounds inside one process; it cannot tell a small, real loss from a
bias of that process (which library loaded first, where the driver placed the code). So the
question is asked across runs: is a variant slower than stock *in every run*? With a
``control`` variant in the runs (stock rebuilt through the same pipeline, whose kernels are
instruction-identical to the baseline's), each run also measures A/A ratios; their largest
distance from 1.000 over all shapes and runs is the benchmark's resolution (the A/A band), and a
variant whose median is below 1 - band in every run has lost beyond it.

The combined document (``kind: repeats``) keeps, per shape and variant, each run's median
speedup and the run-to-run range; per variant, each run's geometric mean. It is rendered by
``report.render_markdown`` like every other result document."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ..errors import BenchError
from .render import ctx as _ctx
from .render import geomean, row_mode, shape_key
from .render import md_table as _table
from .schema import (
    SCHEMA_VERSION,
    Document,
    KernelDocument,
    RepeatsDocument,
    RepeatsRow,
    RepeatsSummary,
    RepeatsVariant,
    ShapeRow,
    is_kernel,
)

SCHEMA = SCHEMA_VERSION
RowKey = tuple[str, str, str, str, int, int, int, str]  # mode, then render.shape_key


def _shape_key(r: ShapeRow) -> RowKey:
    return (row_mode(r), *shape_key(r))


def _runs_table(docs: Sequence[KernelDocument]
                ) -> tuple[list[str], list[RowKey], list[dict[RowKey, ShapeRow]]]:
    if len(docs) < 2:
        raise BenchError("--repeats needs at least two bench kernel runs",
                         "pass every repeat's JSON, e.g. repeat-1.json repeat-2.json ...")
    bases = {d["meta"]["baseline"] for d in docs}
    variants = [[v["name"] for v in d["meta"]["variants"] if v["name"] != d["meta"]["baseline"]]
                for d in docs]
    if len(bases) != 1 or any(v != variants[0] for v in variants):
        raise BenchError("the runs do not compare the same variants against the same baseline",
                         "combine only runs made with the same --variant list")
    by_run = [{_shape_key(r): r for r in d["results"] if not r.get("error")} for d in docs]
    keys = [k for k in (_shape_key(r) for r in docs[0]["results"] if not r.get("error"))
            if all(k in run for run in by_run)]
    if not keys:
        raise BenchError("the runs have no measured shape in common",
                         "combine runs of the same matrix (same --batch/--context/--preset)")
    return variants[0], keys, by_run


def combine(docs: Sequence[Document], control: str | None = "control",
            sources: Sequence[str] = ()) -> RepeatsDocument:
    """The ``repeats`` document for runs of the same shapes and variants. ``control`` names the
    A/A variant if the runs carry one (ignored when they do not)."""
    kernels = [d for d in docs if is_kernel(d)]
    if len(docs) >= 2 and len(kernels) != len(docs):
        raise BenchError("--repeats reads bench kernel documents only",
                         "pass the JSON files written by `kvprefetch bench kernel`")
    names, keys, by_run = _runs_table(kernels)
    ctl = control if control in names else None
    band = (max(abs(_median(run[k], ctl) - 1.0) for run in by_run for k in keys)
            if ctl else None)
    rows: list[RepeatsRow] = []
    for key in keys:
        runs = [run[key] for run in by_run]
        row: RepeatsRow = {
            "mode": key[0], "preset": key[1], "dtype": key[2], "kv_cache_dtype": key[3],
            "block_size": key[4], "batch": key[5], "context": key[6], "kernel": key[7],
            "bitwise_equal_every_run": all(r.get("bitwise_equal") for r in runs),
            "baseline_us": [r["variants"][kernels[0]["meta"]["baseline"]]["time_us"]["median"]
                            for r in runs],
            "variants": {}}
        for n in names:
            meds = [_median(r, n) for r in runs]
            v: RepeatsVariant = {"run_medians": meds, "median": statistics.median(meds),
                                 "min": min(meds), "max": max(meds),
                                 "slower_every_run": all(m < 1.0 for m in meds)}
            if band is not None and n != ctl:
                v["loss_beyond_aa"] = all(m < 1.0 - band for m in meds)
            row["variants"][n] = v
        rows.append(row)
    summary: list[RepeatsSummary] = []
    for n in names:
        per_run = [geomean(_median(run[k], n) for k in keys)
                   for run in by_run]
        vs = [r["variants"][n] for r in rows]
        worst = min(rows, key=lambda r: r["variants"][n]["median"])
        summary.append({
            "variant": n, "shapes": len(rows), "geomean_per_run": per_run,
            "geomean_of_medians": geomean(v["median"] for v in vs),
            "worst": {"batch": worst["batch"], "context": worst["context"],
                      "median": worst["variants"][n]["median"]},
            "slower_every_run": sum(v["slower_every_run"] for v in vs),
            "loss_beyond_aa": (sum(v.get("loss_beyond_aa", False) for v in vs)
                               if band is not None and n != ctl else None)})
    return {"kind": "repeats", "schema": SCHEMA,
            "meta": {"runs": len(kernels), "sources": list(sources), "baseline":
                     kernels[0]["meta"]["baseline"], "variants": names, "control": ctl,
                     "aa_band": band,
                     "started": [d["meta"]["started"] for d in kernels],
                     "device": kernels[0]["meta"]["device"],
                     "command": kernels[0]["meta"].get("command")},
            "summary": summary, "results": rows}


def _median(r: ShapeRow, name: str) -> float:
    """Variant ``name``'s median speedup in the measured row ``r`` (a null speedup, which only
    the baseline has, is refused as unreadable)."""
    s = r["variants"][name]["speedup"]
    if s is None:
        raise TypeError(f"{name} has no speedup in {r['label']}")
    return s["median"]


def repeats_markdown(doc: RepeatsDocument) -> str:
    meta = doc["meta"]
    ctl = meta.get("control")
    n_runs = meta["runs"]
    lines = [f"# bench kernel, {n_runs} runs: {', '.join(meta['variants'])} vs {meta['baseline']}",
             "", f"- device: {meta['device']['name']}; runs started {', '.join(meta['started'])}"]
    if meta.get("sources"):
        lines.append(f"- files: {', '.join(meta['sources'])}")
    if command := meta.get("command"):
        lines.append(f"- first run's command: `{' '.join(command)}`")
    lines += ["", ("Speedup = stock time / variant time; each cell is the per-run medians "
                   "(each over that run's paired rounds), then their range. **slower every run**: "
                   "the median is below 1.000 in all runs.")
              + (f" **A/A band** ±{meta['aa_band']:.3f}: the largest distance of `{ctl}` (stock "
                 "rebuilt, kernels instruction-identical) from 1.000 over every shape and run. "
                 "**loss beyond A/A**: the median is below 1 - band in all runs." if ctl else ""),
              "",
              "## Summary", ""]
    head = ["variant", "shapes", "geomean per run", "geomean of medians", "worst (median)",
            "slower every run"] + (["loss beyond A/A"] if ctl else [])
    lines += _table(head, [
        [s["variant"], s["shapes"], " ".join(f"{g:.3f}" for g in s["geomean_per_run"]),
         f"{s['geomean_of_medians']:.3f}x",
         f"{s['worst']['median']:.3f}x (b{s['worst']['batch']} {_ctx(s['worst']['context'])})",
         s["slower_every_run"]]
        + ([("-" if s["loss_beyond_aa"] is None else s["loss_beyond_aa"])]
           if ctl else []) for s in doc["summary"]])
    lines += ["", "## Per shape", ""]
    configs = {(r["preset"], r["dtype"], r["kv_cache_dtype"], r["block_size"])
               for r in doc["results"]}
    several = len(configs) > 1
    head = (["config"] if several else []) + ["mode", "batch", "context", "kernel",
                                              "stock us (per run)"]
    for n in meta["variants"]:
        head.append(f"{n}: per run [range]")
    head.append("bitwise equal")
    rows = []
    for r in doc["results"]:
        config = [f"{r['preset']} {r['dtype']}/{r['kv_cache_dtype']} blk{r['block_size']}"]
        cells = (config if several else []) + [r["mode"], r["batch"], _ctx(r["context"]),
                                               r["kernel"],
                                               " ".join(f"{t:.1f}" for t in r["baseline_us"])]
        for n in meta["variants"]:
            v = r["variants"][n]
            flag = (" **slower every run**" if v["slower_every_run"] else "") + \
                   (" **loss beyond A/A**" if v.get("loss_beyond_aa") else "")
            cells.append(" ".join(f"{m:.3f}" for m in v["run_medians"])
                         + f" [{v['min']:.3f}-{v['max']:.3f}]{flag}")
        cells.append("yes" if r["bitwise_equal_every_run"] else "NO")
        rows.append(cells)
    lines += _table(head, rows)
    return "\n".join(lines) + "\n"
