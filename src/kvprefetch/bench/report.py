"""Rendering any benchmark or identity JSON document (``kind``: kernel, ncu, e2e, identity, and
through their own modules repeats, decode and sample) as markdown and as a PNG plot, and
writing a result's outputs. Markdown is pure string building; matplotlib is imported lazily
(and with the Agg backend) only when a plot is asked for. Reading a document lives in
``documents``, the README's blocks in ``readme_blocks``."""

# NOTE: at the ~500-line mark: the kinds without a report module of their own (kernel, ncu, e2e,
# identity) and the one dispatch table; decode and sample render in decode_report/sample_report.

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

from ..errors import BenchError
from ..workspace.confine import ensure_dir, write_file
from .decode_report import decode_markdown, decode_png
from .plan import check_output_name
from .render import MAX_BARS, MAX_CELLS, MAX_PANELS, geomean, plain, row_mode, shape_key
from .render import ctx as _ctx
from .render import md_table as _table
from .render import pyplot as _pyplot
from .render import save_figure as _save
from .schema import (
    Document,
    E2EDocument,
    IdentityDocument,
    KernelLike,
    NcuDocument,
    RepeatsDocument,
    SampleDocument,
    ShapeRow,
    Stats,
)
from .vllm_call import describe_call, doc_call

# ----------------------------------------------------------------------------- kernel


class ShapePoint(TypedDict):
    batch: int
    context: int
    speedup: float


class KernelSummary(TypedDict):
    """One group and variant of a kernel result's summary table (``kernel_summary``)."""

    mode: str
    preset: str
    dtype: str
    kv_cache_dtype: str
    block_size: int
    variant: str
    shapes: int
    geomean_speedup: float | None
    worst: ShapePoint
    best: ShapePoint
    slower_median: int
    slower_beyond_spread: int
    all_bitwise_equal: bool


class L2Bound(TypedDict):
    """One shape's L2-resident bound in one resident mode (``l2_ceiling``)."""

    preset: str
    batch: int
    context: int
    kernel: str
    bytes_per_layer: int
    resident: str
    cold_us: float
    resident_us: float
    bound: float
    variant_bound: dict[str, float]


def kernel_groups(doc: KernelLike) -> dict[tuple[str, ...], list[ShapeRow]]:
    """Results grouped by (mode and timing, preset, dtype, kv_cache_dtype, block_size), in file
    order."""
    groups: dict[tuple[str, ...], list[ShapeRow]] = {}
    for r in doc["results"]:
        key = (row_mode(r), r["preset"], r["dtype"], r["kv_cache_dtype"], str(r["block_size"]))
        groups.setdefault(key, []).append(r)
    return groups


def kernel_summary(doc: KernelLike) -> list[KernelSummary]:
    """Per group and variant: geometric-mean speedup, worst and best shape, shapes slower than
    stock (median < 1) and shapes slower beyond the spread (max of per-round ratios < 1)."""
    base = doc["meta"]["baseline"]
    out: list[KernelSummary] = []
    for key, rows in kernel_groups(doc).items():
        names = [v["name"] for v in doc["meta"]["variants"] if v["name"] != base]
        for name in names:
            sp = [(r, _speedup(r, name)) for r in rows
                  if not r.get("error") and name in r["variants"]]
            meds = [s["median"] for _, s in sp]
            if not meds:
                continue
            worst = min(sp, key=lambda t: t[1]["median"])
            best = max(sp, key=lambda t: t[1]["median"])
            out.append({
                "mode": key[0], "preset": key[1], "dtype": key[2], "kv_cache_dtype": key[3],
                "block_size": int(key[4]), "variant": name, "shapes": len(meds),
                "geomean_speedup": geomean(meds),
                "worst": {"batch": worst[0]["batch"], "context": worst[0]["context"],
                          "speedup": worst[1]["median"]},
                "best": {"batch": best[0]["batch"], "context": best[0]["context"],
                         "speedup": best[1]["median"]},
                "slower_median": sum(1 for m in meds if m < 1.0),
                "slower_beyond_spread": sum(1 for _, s in sp if s["max"] < 1.0),
                "all_bitwise_equal": all(r.get("bitwise_equal") for r, _ in sp),
            })
    return out


def _speedup(r: ShapeRow, name: str) -> Stats:
    """Variant ``name``'s speedup in the measured row ``r`` (only the baseline has none: a
    document with a null one there is refused as unreadable, not skipped)."""
    s = r["variants"][name]["speedup"]
    if s is None:
        raise TypeError(f"{name} has no speedup in {r['label']}")
    return s


def kernel_markdown(doc: KernelLike) -> str:
    meta = doc["meta"]
    dev = meta["device"]
    base = meta["baseline"]
    names = [v["name"] for v in meta["variants"] if v["name"] != base]
    lines = [f"# bench kernel: {', '.join(names)} vs {base}", "",
             (f"- device: {dev['name']} ({dev.get('sm_count')} SMs, L2 "
              f"{dev['l2_bytes'] / 2**20:.0f} MiB), torch {dev.get('torch')}, "
              f"CUDA {dev.get('cuda')}"),
             (f"- copy bandwidth (read+write, same run): "
              f"{meta['copy_bw_bytes_per_s'] / 1e12:.2f} TB/s"),
             f"- started {meta['started']}, {meta.get('seconds', '?')} s",
             f"- call: {describe_call(doc_call(doc))}"]
    for v in meta["variants"]:
        lines.append(f"- {v['name']}: `{v.get('so_sha256', 'in-process')}`")
    if meta.get("command"):
        lines.append(f"- command: `{' '.join(meta['command'])}`")
    if (matrix := meta.get("matrix")) and matrix.get("name"):
        lines.append(f"- matrix: {matrix['name']}")
    if meta.get("aborted"):
        lines.append(f"- **run stopped early**, CUDA context lost at {meta['aborted']}")
    if meta.get("not_measured"):
        lines.append(f"- not measured: {len(meta['not_measured'])} shape(s); status and reason in "
                     "the tables below")
    if (meta.get("kit") or {}).get("commit"):
        lines.append(f"- kit commit: `{meta['kit']['commit']}`")
    if dev.get("stand_in"):
        lines.append(f"- **CPU stand-in, nothing timed**: {dev['stand_in']}")
    merge = meta.get("merge")
    if merge:
        lines.append(f"- merged from {len(merge['shards'])} shard(s): "
                     + ", ".join(f"{s['file']} ({s['rows']} rows)" for s in merge["shards"]))
        for d in merge.get("forced") or []:
            lines.append(f"- **merged with --force-merge although** {d}")
    lines += ["", ("Time is per decode call (one layer). Speedup = stock time / variant time, "
                   "paired per round: median [min-max] over rounds. BW = fewest bytes moved / "
                   "median time, as a fraction of the copy bandwidth."), "", "## Summary", ""]
    summ = kernel_summary(doc)
    lines += _table(
        ["mode", "preset", "dtype", "block", "variant", "shapes", "geomean speedup", "worst",
         "best", "slower (median)", "slower beyond spread", "bitwise equal"],
        [[s["mode"], s["preset"], s["dtype"] + ("" if s["kv_cache_dtype"] == "auto"
                                               else "/" + s["kv_cache_dtype"]),
          s["block_size"], s["variant"], s["shapes"], f"{s['geomean_speedup']:.3f}x",
          f"{s['worst']['speedup']:.3f}x (b{s['worst']['batch']} {_ctx(s['worst']['context'])})",
          f"{s['best']['speedup']:.3f}x (b{s['best']['batch']} {_ctx(s['best']['context'])})",
          s["slower_median"], s["slower_beyond_spread"], "yes" if s["all_bitwise_equal"] else "NO"]
         for s in summ])
    for key, rows in kernel_groups(doc).items():
        mode, preset, dtype, kv, block = key
        lines += ["", (f"## {preset}, {dtype}{'' if kv == 'auto' else '/' + kv}, block {block}, "
                  f"{mode}"), ""]
        headers = ["batch", "context", "kernel", "layers", f"{base} us [p25-p75]", f"{base} BW"]
        for n in names:
            headers += [f"{n} speedup [min-max]", f"{n} BW"]
        headers.append("bitwise equal")
        table_rows = []
        for r in rows:
            if r.get("error"):  # status is absent in documents from before it existed
                table_rows.append([r["batch"], _ctx(r["context"]), r["kernel"], "-",
                                   f"{r.get('status', 'skipped')}: {r['error']}"]
                                  + [""] * (2 * len(names) + 2))
                continue
            b = r["variants"][base]
            cells = [r["batch"], _ctx(r["context"]), r["kernel"] + ("*" if r["kernel_forced"]
                                                                    else ""),
                     plan["layers"] if (plan := r.get("plan")) else "-",
                     (f"{b['time_us']['median']:.1f} [{b['time_us']['p25']:.1f}-"
                     f"{b['time_us']['p75']:.1f}]"), f"{b['bw_fraction']:.0%}"]
            for n in names:
                res = r["variants"].get(n)
                s = res["speedup"] if res else None
                cells += [f"{s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]" if s else "-",
                          f"{res['bw_fraction']:.0%}" if res else "-"]
            cells.append("yes" if r.get("bitwise_equal") else "NO")
            table_rows.append(cells)
        lines += _table(headers, table_rows)
    ceiling = l2_ceiling(doc)
    if ceiling:
        lines += ["", "## L2-resident bound", "",
                  ("The same shape with every KV load an L2 hit: the most any L2 prefetch could "
                   "give. `hot` replays one layer (only where that layer's KV fits the L2); "
                   "`aliased` points the block tables into a pool that fits "
                   "`--alias-l2-fraction` of the L2, 0.25 by default (any shape; its BW above "
                   "is of bytes read from the L2). `stock cold/resident` "
                   "bounds a prefetch added to stock's code; `stock cold / <variant> resident` "
                   "bounds that variant's code (its code generation included) with a perfect "
                   "prefetch."), ""]
        lines += _table(["preset", "batch", "context", "kernel", "KV per layer", "resident",
                         "stock cold us", "stock resident us", "stock cold/resident"]
                        + [f"stock cold / {n} resident" for n in names],
                        [[c["preset"], c["batch"], _ctx(c["context"]), c["kernel"],
                          f"{c['bytes_per_layer'] / 2**20:.0f} MiB", c["resident"],
                          f"{c['cold_us']:.1f}", f"{c['resident_us']:.1f}", f"{c['bound']:.3f}x"]
                         + [f"{c['variant_bound'][n]:.3f}x" if n in c["variant_bound"] else "-"
                            for n in names] for c in ceiling])
        lines += ["", "Geometric mean of the bound over the shapes above, per resident mode:", ""]
        lines += _table(["resident", "shapes", "stock cold/resident"]
                        + [f"stock cold / {n} resident" for n in names],
                        [[m, len(cs), f"{geomean(c['bound'] for c in cs):.3f}x"]
                         + [_geomean_cell([c["variant_bound"].get(n) for c in cs]) for n in names]
                         for m, cs in _by_resident(ceiling).items()])
    lines += ["", "`*` = kernel forced with --force-kernel; otherwise vLLM's own v1/v2 choice."]
    return "\n".join(lines) + "\n"


RESIDENT_MODES = ("hot", "aliased")


def l2_ceiling(doc: KernelLike) -> list[L2Bound]:
    """Each shape measured cold and in a resident mode (hot where its one-layer KV fits the L2;
    aliased at any size): stock's cold/resident time ratio (the most an L2 prefetch could give
    stock's code) and, per variant, stock cold over that variant's resident time. One row per
    (shape, resident mode), hot first."""
    base = doc["meta"]["baseline"]
    l2 = doc["meta"]["device"]["l2_bytes"]
    resident = {(r["mode"], shape_key(r)): r for r in doc["results"]
                if r["mode"] in RESIDENT_MODES and not r.get("error")}
    out: list[L2Bound] = []
    for mode in RESIDENT_MODES:
        for r in doc["results"]:
            h = resident.get((mode, shape_key(r)))
            plan = r.get("plan")
            if r["mode"] != "cold" or r.get("error") or h is None or not plan:
                continue
            per_layer = plan["bytes_per_layer"]
            if mode == "hot" and per_layer > l2:
                continue
            cold_us = r["variants"][base]["time_us"]["median"]
            res_us = h["variants"][base]["time_us"]["median"]
            out.append({"preset": r["preset"], "batch": r["batch"], "context": r["context"],
                        "kernel": r["kernel"], "bytes_per_layer": per_layer, "resident": mode,
                        "cold_us": cold_us, "resident_us": res_us, "bound": cold_us / res_us,
                        "variant_bound": {n: cold_us / v["time_us"]["median"]
                                          for n, v in h["variants"].items() if n != base}})
    return out


def _by_resident(ceiling: list[L2Bound]) -> dict[str, list[L2Bound]]:
    groups: dict[str, list[L2Bound]] = {}
    for c in ceiling:
        groups.setdefault(c["resident"], []).append(c)
    return groups


def _geomean_cell(values: list[float | None]) -> str:
    """The geometric mean when every shape has a value, else '-'."""
    if not values or any(v is None for v in values):
        return "-"
    return f"{geomean(v for v in values if v is not None):.3f}x"


def kernel_png(doc: KernelLike, path: Path) -> Path:
    """Speedup heatmaps (batch x context), one row per group, one column per variant."""
    plt = _pyplot()
    from matplotlib.colors import TwoSlopeNorm

    base = doc["meta"]["baseline"]
    all_names = [v["name"] for v in doc["meta"]["variants"] if v["name"] != base]
    all_groups = [(k, rs) for k, rs in kernel_groups(doc).items()]
    # a bounded figure: one panel per group and variant drew 600 groups of a 1 MB result for
    # 150 s in 1.5 GB, and a 64 MiB one would run for hours (issue 41, the twenty-second
    # hostile pass). The markdown lists every group; the figure shows the first ones.
    names = all_names[:MAX_PANELS]
    groups = all_groups[:max(1, MAX_PANELS // max(1, len(names)))]
    fig, axes = plt.subplots(len(groups), len(names), squeeze=False,
                             figsize=(4.8 * len(names), 3.8 * len(groups)))
    if len(groups) < len(all_groups) or len(names) < len(all_names):
        fig.suptitle(f"the first {len(groups)} of {len(all_groups)} groups and {len(names)} of "
                     f"{len(all_names)} variants (the markdown lists them all)", fontsize=9)
    for gi, (key, rows) in enumerate(groups):
        batches = sorted({r["batch"] for r in rows})
        ctxs = sorted({r["context"] for r in rows})
        for vi, name in enumerate(names):
            ax = axes[gi][vi]
            grid = [[math.nan] * len(ctxs) for _ in batches]
            for r in rows:
                v = r["variants"].get(name) if not r.get("error") else None
                s = v["speedup"] if v else None
                if s:
                    grid[batches.index(r["batch"])][ctxs.index(r["context"])] = s["median"]
            vals = [v for row in grid for v in row if not math.isnan(v)] or [1.0]
            span = max(0.05, max(abs(v - 1.0) for v in vals))
            im = ax.imshow(grid, cmap="RdYlGn", aspect="auto",
                           norm=TwoSlopeNorm(vcenter=1.0, vmin=1.0 - span, vmax=1.0 + span))
            for i in range(len(batches) if len(batches) * len(ctxs) <= MAX_CELLS else 0):
                for j in range(len(ctxs)):
                    if not math.isnan(grid[i][j]):
                        ax.text(j, i, f"{grid[i][j]:.2f}", ha="center", va="center", fontsize=8)
            ax.set_xticks(range(len(ctxs)), [_ctx(c) for c in ctxs])
            ax.set_yticks(range(len(batches)), [str(b) for b in batches])
            ax.set_xlabel("context")
            ax.set_ylabel("batch")
            ax.set_title(plain(f"{name} / {base}\n{key[1]} {key[2]} blk{key[4]} {key[0]}"),
                         fontsize=9)
            fig.colorbar(im, ax=ax, fraction=0.046)
    return _save(fig, path)


# ----------------------------------------------------------------------------- ncu


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def ncu_markdown(doc: NcuDocument) -> str:
    meta = doc["meta"]
    o = meta["options"]
    lines = [f"# bench ncu: {', '.join(meta['variants'])}", "",
             (f"- recipe: application replay, --cache-control all, --clock-control none, "
             f"-k {o['kernel_regex']}, --launch-skip {o['launch_skip']}, --launch-count "
             f"{o['launch_count']}"), f"- started {meta['started']}", ""]
    for s in doc["shapes"]:
        lines += [f"## {s['label']}", ""]
        rows = []
        for variant, summaries in s["variants"].items():
            for k in summaries:
                d = next((x for x in s["deltas"].get(variant, []) if x["kernel"] == k["kernel"]),
                         None)
                rows.append([
                    k["kernel"], variant, k["launches"],
                    _fmt(k.get("time") and k["time"] / 1e3, ".2f"),
                    _fmt(d and d["speedup"], ".3f"),
                    _fmt(k.get("dram_read") and k["dram_read"] / 1e6, ".2f"),
                    _fmt(d and d["dram_read"]["change"], ".3f"),
                    _fmt(k.get("l2_hit"), ".1f"), _fmt(d and d["l2_hit"]["change"], "+.1f"),
                    _fmt(k.get("long_sb_stall"), ".1f"),
                    _fmt(d and d["long_sb_stall"]["change"], "+.1f"),
                    _fmt(k.get("sm_throughput"), ".1f"),
                ])
        lines += _table(["kernel", "variant", "launches", "time us", "speedup", "DRAM read MB",
                         "DRAM ratio", "L2 hit %", "L2 hit Δpt", "long-sb stall %",
                         "stall Δpt", "SM throughput %"], rows)
        lines.append("")
    return "\n".join(lines)


def ncu_png(doc: NcuDocument, path: Path) -> Path:
    plt = _pyplot()
    labels, series = [], {}  # type: ignore[var-annotated]
    for s in doc["shapes"]:
        for variant, rows in s["deltas"].items():
            for d in rows:
                lab = f"{s['label']}\n{d['kernel']}"
                if lab not in labels:
                    labels.append(lab)
                series.setdefault(variant, {})[lab] = d["speedup"]
    # bounded as kernel_png's panels: a bar group per shape and kernel drew 1,500 shapes of a
    # 3 MB result for 59 s in 1.9 GB (issue 41, the twenty-second hostile pass); a bar per
    # variant, 2,000 variants of one shape for 94 s (the twenty-fifth)
    shown, n_series = labels[:MAX_BARS], len(series)
    series = dict(list(series.items())[:MAX_PANELS])
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(shown)), 4))
    if len(shown) < len(labels) or len(series) < n_series:
        ax.set_title(f"the first {len(shown)} of {len(labels)} kernels of the shapes and "
                     f"{len(series)} of {n_series} variants (the markdown lists them all)",
                     fontsize=9)
    labels = shown
    width = 0.8 / max(1, len(series))
    for i, (variant, vals) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))],
               [vals.get(lab) or 0 for lab in labels], width, label=plain(variant))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))],
                  [plain(lab) for lab in labels], fontsize=6)
    ax.set_ylabel("ncu time speedup vs baseline")
    ax.legend()
    return _save(fig, path)


# ----------------------------------------------------------------------------- e2e


def e2e_markdown(doc: E2EDocument) -> str:
    meta = doc["meta"]
    lines = [(f"# bench e2e: vllm bench throughput, {meta['input_len']} in / {meta['output_len']} "
             f"out, {meta['repeats']} repeats"), "",
             f"- environment: {', '.join(f'{k}={v}' for k, v in meta['environment'].items())}",
             f"- model: {meta['model_dir']} (--load-format dummy), dtype {meta['dtype']}",
             f"- started {meta['started']}", ""]
    rows = []
    for r in doc["rows"]:
        for env, e in r["envs"].items():
            t, o, sp = e["tokens_per_second"], e["output_tokens_per_second"], e.get("speedup")
            rows.append([r["max_num_seqs"], r["num_prompts"], env,
                         f"{t['median']:.0f} [{t['min']:.0f}-{t['max']:.0f}]",
                         f"{o['median']:.0f}",
                         f"{sp['median']:.3f} [{sp['min']:.3f}-{sp['max']:.3f}]" if sp else "-"])
    lines += _table(["max-num-seqs", "prompts", "env", "tokens/s median [min-max]",
                     "output tokens/s", "speedup [min-max]"], rows)
    return "\n".join(lines) + "\n"


def e2e_png(doc: E2EDocument, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    envs = [e["name"] for e in doc["meta"]["envs"]]
    if len(envs) > MAX_PANELS:  # a line per environment, bounded as ncu_png's variants
        ax.set_title(f"the first {MAX_PANELS} of {len(envs)} environments (the markdown "
                     "lists them all)", fontsize=9)
    for env in envs[:MAX_PANELS]:
        xs = [r["max_num_seqs"] for r in doc["rows"] if env in r["envs"]]
        ys = [r["envs"][env]["tokens_per_second"]["median"] for r in doc["rows"]
              if env in r["envs"]]
        ax.plot(xs, ys, marker="o", label=plain(env))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("--max-num-seqs")
    ax.set_ylabel("tokens/s (median)")
    ax.legend()
    return _save(fig, path)


# ----------------------------------------------------------------------------- identity


def identity_markdown(doc: IdentityDocument) -> str:
    lines = [f"# numerical identity: {doc['status']}", "",
             f"- variants: {', '.join(doc['variants'])} on {doc['device']}",
             (f"- checked {doc['checked']}, failed {doc['failed']}, not checked "
             f"{doc['not_checked']}")]
    if doc.get("reason"):
        lines.append(f"- reason: {doc['reason']}")
    for dt, e in doc.get("max_rel_err", {}).items():
        lines.append(f"- worst relative error {dt}: {e:.2e} (tolerance "
                     f"{doc['tolerances'].get(dt, float('nan')):.0e})")
    lines.append("")
    lines += _table(["case", "kernel", "vLLM picks", "status", "bitwise equal", "rel err", "notes"],
                    [[r["label"], r["kernel"], r["vllm_choice"], r["status"],
                      {True: "yes", False: "NO", None: "-"}[r["bitwise_equal"]],
                      ", ".join(f"{k} {v:.1e}" for k, v in r["rel_err"].items()),
                      "; ".join(r["problems"])] for r in doc["rows"]])
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- dispatch

def _repeats_markdown(doc: RepeatsDocument) -> str:
    from .repeats import repeats_markdown

    return repeats_markdown(doc)


def _sample_markdown(doc: SampleDocument) -> str:
    from .sample_report import sample_markdown

    return sample_markdown(doc)


def _sample_png(doc: SampleDocument, path: Path) -> Path:
    from .sample_report import sample_png

    return sample_png(doc, path)


# kind -> renderer; each takes its kind's document (load_document checked the kind)
_MARKDOWN: dict[str, Callable[[Any], str]] = {
    "kernel": kernel_markdown, "ncu": ncu_markdown, "e2e": e2e_markdown,
    "identity": identity_markdown, "repeats": _repeats_markdown,
    "decode": decode_markdown, "sample": _sample_markdown}
_PNG: dict[str, Callable[[Any, Path], Path]] = {
    "kernel": kernel_png, "ncu": ncu_png, "e2e": e2e_png, "decode": decode_png,
    "sample": _sample_png}


# C0 and C1 controls, DEL and Unicode's line and paragraph separators: in a result's text field
# (a model's or a device's name) they broke the report's lines and reached the terminal with
# --print (issue 41, the eighth hostile pass). Shown escaped, as Python's repr shows them.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _printable(value: Any) -> Any:
    """``value`` with every string's control characters written as escapes (``\\n``, ``\\x1b``)."""
    if isinstance(value, str):
        return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], value)
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def render_markdown(doc: Document) -> str:
    return str(_MARKDOWN[doc["kind"]](_printable(doc)))


def render_png(doc: Document, path: Path) -> Path | None:
    """The plot for this kind (None for kinds without one, e.g. identity)."""
    fn = _PNG.get(doc["kind"])
    return fn(_printable(doc), path) if fn else None


def write_outputs(doc: Document, out_dir: Path, name: str,
                  formats: Sequence[str] = ("json", "md", "png")) -> list[Path]:
    """Write ``<name>.json``, ``<name>.md`` and ``<name>.png`` (as asked) under ``out_dir``."""
    check_output_name(name)  # a plain file name: nothing outside out_dir, whoever calls
    # rendered before anything is written: a document the markdown cannot be made of leaves
    # no half set of outputs behind
    md = render_markdown(doc) if "md" in formats else None
    # the rule of `export-header -o` (confine.write_file without a root): the folder the user
    # names (and the files in it) must not be a symlink, its ancestors may be; a planted link,
    # a device node or a FIFO in the output's place is refused, nothing is written behind it
    ensure_dir(out_dir, family=BenchError)
    written = []
    if "json" in formats:
        p = out_dir / f"{name}.json"
        write_file(p, json.dumps(doc, indent=1) + "\n", family=BenchError)
        written.append(p)
    if md is not None:
        p = out_dir / f"{name}.md"
        write_file(p, md, family=BenchError)
        written.append(p)
    if "png" in formats:
        png = render_png(doc, out_dir / f"{name}.png")
        if png is not None:
            written.append(png)
    return written
