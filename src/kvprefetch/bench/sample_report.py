"""The report of a sampled run (``bench kernel --sample``, a document of kind ``sample``) as
markdown and a PNG, and the tables the README's blocks show (seeds, twins, bounds, host,
attribution) and the CLI's closing table. The numbers come from ``sample_stats``, the steps the
launcher's rule explains from ``sample_rules``; matplotlib only for the PNG.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .render import MAX_PANELS, geomean, plain
from .render import md_table as _table
from .render import pyplot as _pyplot
from .render import save_figure as _save
from .sample_rules import bound_steps, twin_steps
from .sample_stats import (
    CONTROL,
    HOST_BOUND,
    LARGE_KV_BYTES,
    TARGET_STEP,
    WORST,
    RatioStats,
    aa_band,
    attribution,
    distribution,
    headline,
    host_overhead,
    large_steps,
    measured,
    step_ratio,
    timings,
    variant_names,
    worst_steps,
)
from .schema import SampleDocument
from .stats import quantile
from .vllm_call import describe_call, doc_call


def _grouped(docs: Sequence[SampleDocument], only: str | None,
             steps_of: Callable[[SampleDocument, str], list[dict[str, Any]]],
             key: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The measured steps ``steps_of`` lists, over ``docs`` and their timings (``only`` that
    one), grouped by (timing, the step's ``key``): graph first, then by key."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for doc in docs:
        for t in timings(doc) if only is None else [only]:
            for st in steps_of(doc, t):
                if st["patched"] is not None:
                    groups.setdefault((t, st[key]), []).append(st)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0] != "graph", kv[0][1])))


def twins_table(docs: Sequence[SampleDocument], only: str | None = None) -> list[str]:
    """Over one or more samples, per timing (``only`` that one) and per twin `auto` runs (by the
    rule; apart where a kv head's last group of heads is partial, G not dividing them, and
    where the short-CTA guard declined the twin the rule before it ran): how
    many steps, ``patched``'s ratio over them (min, geomean, max), how many below the
    per-step target, and where ``gqa_off`` ran, the twins' own step (``patched`` over
    ``gqa_off``)."""
    rows = []
    for (t, twin), steps in _grouped(docs, only, twin_steps, "row").items():
        vals = [s["patched"] for s in steps]
        own = [s["patched"] / s["gqa_off"] for s in steps if s["gqa_off"]]
        rows.append([t, twin, len(steps), _x(min(vals)), _x(geomean(vals)), _x(max(vals)),
                     sum(1 for v in vals if v < TARGET_STEP),
                     f"{_x(geomean(own))} ({len(own)})" if own else "-"])
    return _table(["timing", "`auto` runs", "steps", "min", "geomean", "max",
                   f"< {TARGET_STEP}", "over gqa_off (steps)"], rows)


def bounds_table(docs: Sequence[SampleDocument], only: str | None = None) -> list[str]:
    """Over one or more samples, per timing (``only`` that one) and per code the v1 rule runs
    (``bound``, or ``stock``: the unbounded copy): steps, ``patched``'s ratio (min, geomean,
    max), steps below the target, and where ``launch`` and ``gqa_off`` ran, the code's own
    step over stock's kernels (1.000 is stock's code exactly)."""
    rows = []
    for (t, code), steps in _grouped(docs, only, bound_steps, "code").items():
        vals = [st["patched"] for st in steps]
        own = [st["own"] for st in steps if st["own"]]
        rows.append([t, "stock's code" if code == "stock" else "the bounded kernel", len(steps),
                     _x(min(vals)), _x(geomean(vals)), _x(max(vals)),
                     sum(1 for v in vals if v < TARGET_STEP),
                     (f"{_x(min(own))}-{_x(max(own))} ({len(own)})" if own else "-")])
    return _table(["timing", "v1 runs", "steps", "min", "geomean", "max", f"< {TARGET_STEP}",
                   "over launch: min-max (steps)"], rows)


def host_table(docs: Sequence[SampleDocument]) -> list[str]:
    """One row per sample and variant: how many host-bound steps, and the median, p90 and most
    of the variant's extra host time per call over stock's (``control``'s rows are the A/A
    resolution of the same figure)."""
    rows = []
    for doc in docs:
        for n, xs in host_overhead(doc).items():
            s = sorted(xs)
            rows.append([doc["meta"]["sample"]["seed"], n, len(s), f"{quantile(s, 0.5):+.2f}",
                         f"{quantile(s, 0.9):+.2f}", f"{s[-1]:+.2f}"])
    return _table(["seed", "variant", "host-bound steps", "median us/call", "p90 us/call",
                   "max us/call"], rows)


class SampleSummary(RatioStats):
    """One timing and variant's line of the CLI's closing table (``sample_summary``)."""

    timing: str
    variant: str
    all_bitwise_equal: bool


def sample_summary(doc: SampleDocument) -> list[SampleSummary]:
    """One row per timing and variant (the CLI's closing table)."""
    out: list[SampleSummary] = []
    for t in timings(doc):
        rows = measured(doc, t)
        for n, st in distribution(doc, t).items():
            if st["n"]:
                out.append({"timing": t, "variant": n, **st, "all_bitwise_equal": all(
                    r.get("bitwise_equal") for _, r in rows)})
    return out


def seeds_table(docs: Sequence[SampleDocument]) -> list[str]:
    """One row per sample and timing: the headline variant's distribution beside the A/A band,
    so that runs on different seeds read side by side (a README block, ``seeds``)."""
    rows = []
    for doc in docs:
        head = headline(doc)
        if head is None:
            continue
        for t in timings(doc):
            st = distribution(doc, t)[head]
            if not st["n"]:
                continue
            band = aa_band(doc, t)
            equal = all(r.get("bitwise_equal") for _, r in measured(doc, t))
            rows.append([doc["meta"]["sample"]["seed"], t, head, st["n"], _x(st["min"]),
                         _x(st["p5"]), _x(st["median"]), _x(st["geomean"]),
                         st["below_target"],
                         f"{band['p5']:.3f}-{band['p95']:.3f}" if band else "-",
                         "yes" if equal else "NO"])
    return _table(["seed", "timing", "variant", "steps", "min", "p5", "median", "geomean",
                   f"< {TARGET_STEP}", "A/A p5-p95", "bitwise equal"], rows)


def attribution_table(doc: SampleDocument) -> list[str]:
    """The attribution of every timing in one table (a README block, ``attribution``)."""
    return _table(["timing", "from", "to", "mechanism", "steps", "geomean step", "steps worse"],
                  [[t, a["from"], a["to"], a["mechanism"], a["steps"], _x(a["geomean"]),
                    a["worse"]] for t in timings(doc) for a in attribution(doc, t)])


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def sample_markdown(doc: SampleDocument) -> str:
    meta = doc["meta"]
    sample = meta["sample"]
    dev = meta["device"]
    inst = sample["instantiations"]
    names = variant_names(doc)
    lines = [f"# sampled benchmark: {sample['n']} steps, seed {sample['seed']}", "",
             (f"- device: {dev['name']} ({dev.get('sm_count')} SMs, L2 "
              f"{dev['l2_bytes'] / 2**20:.0f} MiB), torch {dev.get('torch')}, "
              f"CUDA {dev.get('cuda')}"),
             (f"- copy bandwidth (read+write, same run): {meta['copy_bw_bytes_per_s'] / 1e12:.2f} "
             "TB/s"),
             f"- started {meta['started']}, {meta.get('seconds', '?')} s",
             f"- call: {describe_call(doc_call(doc))}",
             (f"- drawn within: head sizes {inst['head_sizes']}, "
              f"block sizes {inst['block_sizes']}, "
             f"caches {inst['caches']}; KV per step at most {_mib(sample['max_kv_bytes'])} "
             "(the distribution: docs/sampled-benchmark.md)"),
             (f"- modes: {', '.join(sorted({c['mode'] for c in meta['configs']}))}; timings: "
             f"{', '.join(timings(doc))}")]
    for v in meta["variants"]:
        lines.append(f"- {v['name']}: `{v.get('so_sha256', 'in-process')}`")
    if meta.get("command"):
        lines.append(f"- command: `{' '.join(meta['command'])}`")
    if meta.get("aborted"):
        lines.append(f"- **run stopped early**, CUDA context lost at {meta['aborted']}")
    if meta.get("not_measured"):
        lines.append(f"- not measured: {len(meta['not_measured'])} step(s) (listed at the end)")
    bad = [r["label"] for r in doc["results"]
           if r["status"] == "measured" and not r.get("bitwise_equal")]
    lines.append(f"- bitwise equal to stock: {'every measured step' if not bad else 'NO: '}"
                 + ", ".join(bad))
    lines += ["", ("A step's ratio = stock time / variant time, the median over rounds of the "
              "paired per-round ratio (> 1: faster than stock)."), ""]
    for t in timings(doc):
        lines += [f"## {t}" + (" (CUDA-graph replay)" if t == "graph" else
                               " (back-to-back calls, host path included)"), ""]
        dist = distribution(doc, t)
        band = aa_band(doc, t)
        lines += _table(["variant", "steps", "min", "p5", "median", "geomean", "max",
                         "< 1", f"< {TARGET_STEP}"],
                        [[n, st["n"], _x(st.get("min")), _x(st.get("p5")), _x(st.get("median")),
                          _x(st.get("geomean")), _x(st.get("max")), st.get("below_1", "-"),
                          st.get("below_target", "-")] for n, st in dist.items()])
        if band:
            lines += ["", (f"A/A band ({CONTROL} vs stock, {band['n']} steps): p5-p95 "
                      f"{band['p5']:.3f}-{band['p95']:.3f}, min-max {band['min']:.3f}-"
                      f"{band['max']:.3f}, geomean {band['geomean']:.3f}.")]
        else:
            lines += ["", f"No A/A band: the `{CONTROL}` tree did not run."]
        attr = attribution(doc, t)
        if attr:
            lines += ["", "### Attribution (geomean step from each tree to the next)", ""]
            lines += _table(["from", "to", "mechanism", "steps", "geomean step",
                             "steps worse"],
                            [[a["from"], a["to"], a["mechanism"], a["steps"], _x(a["geomean"]),
                              a["worse"]] for a in attr])
        if twin_steps(doc, t):
            lines += ["", ("### Steps with GQA twins compiled: the twin `auto` runs by its rule "
                      "(none: vLLM's kernel) and what they measured"), ""]
            lines += twins_table([doc], only=t)
        if bound_steps(doc, t):
            lines += ["", ("### v1 steps of a launch-bounded instantiation, no twin: the code "
                      "the launcher runs by its rule and what they measured"), ""]
            lines += bounds_table([doc], only=t)
        head = headline(doc)
        if head:
            lines += ["", f"### Worst {WORST} steps of {head}", ""]
            lines += _table(["step", "shape", "KV", "ratio [min-max]", f"{CONTROL} (A/A)"],
                            [[w["step"], w["label"] + f" (mean len {w['mean_len']:.0f})",
                              _mib(w["kv_bytes"]), (f"{w['ratio']:.3f} [{w['min']:.3f}-"
                              f"{w['max']:.3f}]"), _x(w["control"])]
                             for w in worst_steps(doc, t, head)])
        large = large_steps(doc, t)
        lines += ["", (f"### Steps with KV >= {LARGE_KV_BYTES >> 20} MiB: fraction of copy "
                  f"bandwidth ({len(large)} steps)"), ""]
        if large:
            cols = [doc["meta"]["baseline"], *names]
            lines += _table(["step", "shape", "KV", *cols],
                            [[s["step"], s["label"], _mib(s["kv_bytes"])]
                             + [f"{s['bw'][c]:.0%}" if c in s["bw"] else "-" for c in cols]
                             for s in large])
        lines.append("")
    if host_overhead(doc):
        lines += [(f"## Host time per call over stock (eager steps where stock's eager time is "
                   f"at least {HOST_BOUND}x its graph time)"), ""]
        lines += host_table([doc])
        lines.append("")
    lines += ["## Every step", ""]
    lines += _table(["timing", "step", "shape", "KV", "status"]
                    + [f"{n} ratio" for n in names] + ["bitwise equal"],
                    [[t, i, r["label"], _mib(r.get("kv_bytes")), r["status"]]
                     + [_x(step_ratio(r, n)) for n in names]
                     + ["yes" if r.get("bitwise_equal") else "NO"]
                     for t in timings(doc) for i, r in measured(doc, t)])
    if meta.get("not_measured"):
        lines += ["", "## Not measured", ""]
        lines += _table(["timing", "shape", "status", "reason"],
                        [[r.get("timing", "graph"), r["label"], r["status"], r["reason"]]
                         for r in meta["not_measured"]])
    return "\n".join(lines) + "\n"


def sample_png(doc: SampleDocument, path: Path) -> Path:
    """Per timing: each variant's sorted step ratios (the distribution as a curve), and the
    headline variant's ratio against the step's KV bytes with the A/A band shaded."""
    plt = _pyplot()
    ts = timings(doc) or ["graph"]
    fig, axes = plt.subplots(len(ts), 2, squeeze=False, figsize=(11, 4 * len(ts)))
    head = headline(doc)
    for ti, t in enumerate(ts):
        ax = axes[ti][0]
        rows = measured(doc, t)
        for n in variant_names(doc)[:MAX_PANELS]:  # a line each: bounded as the other figures
            vals = sorted(x for _, r in rows if (x := step_ratio(r, n)) is not None)
            if vals:
                ax.plot([100 * (i + 0.5) / len(vals) for i in range(len(vals))], vals,
                        label=plain(n))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(TARGET_STEP, color="red", linewidth=0.6, linestyle="--")
        ax.set_xlabel("percentile of steps")
        ax.set_ylabel("stock time / variant time")
        ax.set_title(plain(f"{t}: sorted step ratios"), fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[ti][1]
        band = aa_band(doc, t)
        if band:
            ax.axhspan(band["p5"], band["p95"], color="grey", alpha=0.3, label="A/A p5-p95")
        if head:
            pts = [(r.get("kv_bytes") or 1, x) for _, r in rows
                   if (x := step_ratio(r, head)) is not None]
            if pts:
                ax.scatter([p[0] / 2**20 for p in pts], [p[1] for p in pts], s=8, label=plain(head))
        ax.set_xscale("log")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("KV bytes of the step (MiB)")
        ax.set_ylabel("ratio")
        ax.set_title(plain(f"{t}: {head} per step"), fontsize=9)
        ax.legend(fontsize=7)
    return _save(fig, path)
