"""The report of a sampled run (``bench kernel --sample``, a document of kind ``sample``): per
timing (CUDA-graph replay, eager) and variant, the distribution of the per-step ratios to stock,
the worst steps with their shapes, the A/A band from the ``control`` tree, each large step's
fraction of the copy bandwidth, and the attribution of the geomean to mechanisms when the
ablation trees ran. Pure functions over the JSON document (tested on synthetic numbers);
matplotlib only for the PNG.

A step's ratio is its median over rounds of the paired per-round ratio stock time / variant
time (``bench/kernel.py``): > 1 means the variant is faster.

Where a step is explained by the launcher's rule (its Python statement in kernels/policy.py), the
rule is given the launch the kernel saw (bench/vllm_call.py ``row_launch``: under vLLM's call a
graph step's padded batch and capture length), never the step's real values; a document made
before the kit recorded launches was made with the exact call, whose launch is the step itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .kernel import quantile
from .render import geomean
from .render import md_table as _table
from .render import pyplot as _pyplot
from .render import save_figure as _save
from .vllm_call import describe_call, doc_call, row_launch

CONTROL = "control"
# The ablation chain, each tree adding one mechanism to the one before (docs/sampled-benchmark.md
# says what each difference does and does not isolate).
ATTRIBUTION_CHAIN = ("baseline", "launch", "gqa_off", "patched")
MECHANISMS = {
    ("baseline", "launch"): "launcher L2 prefetch kernel (attention kernels untouched)",
    ("launch", "gqa_off"): "launch bounds + code generation + in-kernel prefetch, "
                           "with the prefetch variant's L2-kernel policy",
    ("gqa_off", "patched"): "GQA twins (the launcher's auto choice)",
    ("baseline", "gqa_off"): "launch bounds + code generation + all prefetch (no twins)",
    ("baseline", "patched"): "everything",
}
LARGE_KV_BYTES = 256 << 20
# A step is host-bound when stock's eager time per call is at least this many times its time
# under graph replay: the host path then paces back-to-back calls, so a variant's extra eager
# time per call over stock's is its extra host time (its GPU time being hidden behind it).
HOST_BOUND = 1.3
WORST = 10
TARGET_STEP = 0.99


def timings(doc: dict[str, Any]) -> list[str]:
    """The timings present, graph first."""
    present = {r.get("timing", "graph") for r in doc["results"]}
    return [t for t in ("graph", "eager") if t in present]


def variant_names(doc: dict[str, Any]) -> list[str]:
    """Every variant but the baseline, in the run's order."""
    base = doc["meta"]["baseline"]
    return [v["name"] for v in doc["meta"]["variants"] if v["name"] != base]


def headline(doc: dict[str, Any]) -> str | None:
    """The variant the distribution is about: ``patched`` when it ran, else the first variant
    that is not the A/A control."""
    names = variant_names(doc)
    if "patched" in names:
        return "patched"
    return next((n for n in names if n != CONTROL), None)


def measured(doc: dict[str, Any], timing: str) -> list[tuple[int, dict[str, Any]]]:
    """(step index, row) of the measured rows of one timing: the row's ``step``, or in a
    document made before rows recorded it, the row's index among its timing's rows (they were
    in step order, every step in every timing)."""
    rows = [r for r in doc["results"] if r.get("timing", "graph") == timing]
    return [(r.get("step", i), r) for i, r in enumerate(rows) if r["status"] == "measured"]


def step_ratio(row: dict[str, Any], name: str) -> float | None:
    v = row["variants"].get(name)
    return v["speedup"]["median"] if v and v.get("speedup") else None


def ratio_stats(values: Sequence[float]) -> dict[str, Any]:
    """min, p5 (linear interpolation between closest ranks), median, geomean, max, how many
    below 1 and below the per-step target (0.99)."""
    s = sorted(values)
    if not s:
        return {"n": 0}
    return {"n": len(s), "min": s[0], "p5": quantile(s, 0.05), "median": quantile(s, 0.5),
            "geomean": geomean(s), "max": s[-1], "below_1": sum(1 for v in s if v < 1.0),
            "below_target": sum(1 for v in s if v < TARGET_STEP)}


def distribution(doc: dict[str, Any], timing: str) -> dict[str, dict[str, Any]]:
    """Per variant, the statistics of its per-step ratios."""
    rows = measured(doc, timing)
    out = {}
    for n in variant_names(doc):
        vals = [x for _, r in rows if (x := step_ratio(r, n)) is not None]
        out[n] = ratio_stats(vals)
    return out


def worst_steps(doc: dict[str, Any], timing: str, name: str,
                k: int = WORST) -> list[dict[str, Any]]:
    """The ``k`` steps with the lowest ratio of ``name``: index, label, shape, ratio and its
    spread over rounds, KV bytes, and where the A/A control ran, its ratio on that step."""
    rows = [(i, r, x) for i, r in measured(doc, timing) if (x := step_ratio(r, name)) is not None]
    rows.sort(key=lambda t: t[2])
    out = []
    for i, r, x in rows[:k]:
        sp = r["variants"][name]["speedup"]
        lens = r.get("seq_lens") or [r["context"]] * r["batch"]
        out.append({"step": i, "label": r["label"], "family": r.get("family", "uniform"),
                    "preset": r["preset"], "batch": r["batch"], "max_len": r["context"],
                    "mean_len": sum(lens) / len(lens), "kernel": r["kernel"],
                    "kv_bytes": r.get("kv_bytes"), "ratio": x, "min": sp["min"],
                    "max": sp["max"], "control": step_ratio(r, CONTROL)})
    return out


def aa_band(doc: dict[str, Any], timing: str) -> dict[str, Any] | None:
    """The A/A band: the distribution of the control tree's per-step ratios (stock rebuilt
    through the same pipeline). A variant's step ratio inside [p5, p95] of it is within the
    benchmark's resolution; ``None`` when control did not run."""
    vals = [x for _, r in measured(doc, timing) if (x := step_ratio(r, CONTROL)) is not None]
    if not vals:
        return None
    s = sorted(vals)
    return {**ratio_stats(s), "p95": quantile(s, 0.95)}


def large_steps(doc: dict[str, Any], timing: str,
                threshold: int = LARGE_KV_BYTES) -> list[dict[str, Any]]:
    """Steps whose KV is at least ``threshold`` bytes: per variant (stock included) the achieved
    bandwidth (fewest bytes moved over the median time) as a fraction of the copy bandwidth
    measured in the same run."""
    out = []
    for i, r in measured(doc, timing):
        if (r.get("kv_bytes") or 0) >= threshold:
            out.append({"step": i, "label": r["label"], "kv_bytes": r["kv_bytes"],
                        "bw": {n: v["bw_fraction"] for n, v in r["variants"].items()}})
    return out


def attribution(doc: dict[str, Any], timing: str) -> list[dict[str, Any]]:
    """What each mechanism is worth on the sample: for each consecutive pair (a, b) of the
    ablation chain among the trees that ran, the geometric mean over the steps every tree of the
    chain measured of b's ratio over a's (stock's ratio being 1), i.e. of time_a / time_b; and
    the A/A control's geomean on the same steps. The chain's steps multiply to the last tree's
    geomean."""
    names = set(variant_names(doc)) | {doc["meta"]["baseline"]}
    chain = [n for n in ATTRIBUTION_CHAIN if n in names]
    if len(chain) < 2:
        return []
    base = doc["meta"]["baseline"]

    def ratio(r: dict[str, Any], n: str) -> float | None:
        return 1.0 if n == base else step_ratio(r, n)

    rows = [r for _, r in measured(doc, timing) if all(ratio(r, n) for n in chain)]
    out = []
    for a, b in itertools.pairwise(chain):
        steps = [ratio(r, b) / ratio(r, a) for r in rows]  # type: ignore[operator]
        out.append({"from": a, "to": b, "mechanism": MECHANISMS.get((a, b), f"{a} -> {b}"),
                    "steps": len(steps), "geomean": geomean(steps),
                    "worse": sum(1 for x in steps if x < 1.0)})
    ctl = [x for r in rows if (x := step_ratio(r, CONTROL)) is not None]
    if ctl:
        out.append({"from": base, "to": CONTROL, "mechanism": "none (A/A: the benchmark's "
                    "resolution)", "steps": len(ctl), "geomean": geomean(ctl),
                    "worse": sum(1 for x in ctl if x < 1.0)})
    return out


def run_twin_at(doc: dict[str, Any]) -> tuple[tuple[int, int, bool], ...]:
    """The (head size, block size, v1 too) a sampled run had twins at: its ``meta.twin_at``, or
    for a run made before the kit recorded it, the one instantiation the twins had then."""
    from ..kernels.policy import TWIN_AT_BEFORE_LIST

    at = doc["meta"].get("twin_at")
    return (TWIN_AT_BEFORE_LIST if at is None
            else tuple((int(h), int(b), bool(v1)) for h, b, v1 in at))


def run_partial_groups(doc: dict[str, Any]) -> bool:
    """Whether a sampled run's twins took models whose G does not divide the query heads per
    kv head (``meta.twin_partial_groups``; runs made before the kit recorded it did not)."""
    return bool(doc["meta"].get("twin_partial_groups", False))


def run_least_guard(doc: dict[str, Any]) -> bool:
    """Whether a sampled run's `auto` declined twins whose grid could outlast stock's code if
    the other sequences were short (``meta.twin_least_guard``; runs made before the kit
    recorded it checked v1 short chains only)."""
    return bool(doc["meta"].get("twin_least_guard", False))


def run_wave_guard(doc: dict[str, Any]) -> bool:
    """Whether a sampled run's launcher declined the bound and the twins wherever some number
    of long sequences would give them more waves than stock's code (``meta.wave_guard``; runs
    made before it did not)."""
    return bool(doc["meta"].get("wave_guard", False))


def _mirror_pick(doc: dict[str, Any], r: dict[str, Any], sms: int,
                 least_guard: bool) -> tuple[int, int] | None:
    """The twin `auto` runs at sampled step ``r`` of run ``doc`` by the rule's mirror, on ``sms``
    SMs, under the run's partial-group rule and with or without the short-CTA guard."""
    from ..kernels.policy import twin_pick
    from .sample import cache_kind

    launch = row_launch(r)  # the launcher sees the launch, not the step's real values
    return twin_pick(r["num_heads"], r["num_kv_heads"], batch=launch["num_seqs"],
                     context=launch["max_seq_len"], kernel=r["kernel"], sm_count=sms,
                     head_size=r["head_size"], block_size=r["block_size"],
                     dtype=cache_kind(r["kv_cache_dtype"], r["dtype"]),
                     partial_groups=run_partial_groups(doc), least_guard=least_guard,
                     wave_guard=run_wave_guard(doc))


def twin_steps(doc: dict[str, Any], timing: str) -> list[dict[str, Any]]:
    """The steps whose instantiation has GQA twins compiled beside it: which twin `auto` runs
    there by the launcher's rule (its mirror, ``policy.twin_pick``, on this run's SM count;
    "none": vLLM's kernel) and what ``patched`` (and ``gqa_off``, where it ran) measured. The
    rule's prediction beside the measurement, step by step; it is the rule as this kit has it,
    so it describes a run made with the same rules (a run's provenance names its commit), at
    the instantiations the run had twins at (run_twin_at) and for the models it had them for
    (run_partial_groups) and with the guard it had (run_least_guard)."""
    from ..kernels.policy import H200_SMS, twin_shapes
    from .sample import cache_kind

    sms = doc["meta"]["device"].get("sm_count") or H200_SMS
    at = run_twin_at(doc)
    out = []
    keys = ("dtype", "kernel", "kv_cache_dtype", "head_size", "block_size", "num_heads",
            "num_kv_heads")
    for i, r in measured(doc, timing):
        if any(k not in r for k in keys) or not twin_shapes(
                "prefetch", r["kernel"], r["kv_cache_dtype"], r["head_size"], r["block_size"],
                cache_kind(r["kv_cache_dtype"], r["dtype"]), at=at):
            continue
        pick = _mirror_pick(doc, r, sms, run_least_guard(doc))
        twin = f"{pick[0]}x{pick[1]}" if pick else "none"
        partial = pick is not None and (r["num_heads"] // r["num_kv_heads"]) % pick[0] != 0
        row = f"{twin}, last group partial" if partial else twin
        if pick is None and run_least_guard(doc) and _mirror_pick(doc, r, sms, False):
            row = "none: the short-CTA guard declined a twin"
        out.append({"step": i, "label": r["label"], "family": r.get("family", "uniform"),
                    "twin": twin, "row": row,
                    "patched": step_ratio(r, "patched"), "gqa_off": step_ratio(r, "gqa_off")})
    return out


def _grouped(docs: Sequence[dict[str, Any]], only: str | None,
             steps_of: Callable[[dict[str, Any], str], list[dict[str, Any]]],
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


def twins_table(docs: Sequence[dict[str, Any]], only: str | None = None) -> list[str]:
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


def bound_steps(doc: dict[str, Any], timing: str) -> list[dict[str, Any]]:
    """The v1 steps of a launch-bounded instantiation where no twin runs: which code the
    launcher runs by its rule (``policy.v1_code_pick``: the bounded kernel, or stock's
    unbounded copy where the bound would cost a wave) and what ``patched`` measured, and where
    both trees ran, the bound's own step (``gqa_off`` over ``launch``, whose kernels are
    stock's). Like twin_steps, the rule as this kit has it, at the run's twin_at."""
    from ..kernels.policy import H200_SMS, min_blocks, twin_shapes, v1_code_pick
    from .sample import cache_kind

    sms = doc["meta"]["device"].get("sm_count") or H200_SMS
    at = run_twin_at(doc)
    out = []
    keys = ("dtype", "kv_cache_dtype", "head_size", "block_size", "num_heads", "num_kv_heads",
            "batch", "context")
    for i, r in measured(doc, timing):
        if r.get("kernel") != "v1" or any(k not in r for k in keys):
            continue
        inst = ("prefetch", "v1", r["kv_cache_dtype"], r["head_size"], r["block_size"],
                cache_kind(r["kv_cache_dtype"], r["dtype"]))
        if not min_blocks(*inst) or (twin_shapes(*inst, at=at)
                                     and _mirror_pick(doc, r, sms, run_least_guard(doc))):
            continue
        launch, gqa_off = step_ratio(r, "launch"), step_ratio(r, "gqa_off")
        ran = row_launch(r)
        out.append({"step": i, "label": r["label"],
                    "code": v1_code_pick(r["head_size"], ran["num_seqs"], r["num_heads"],
                                         ran["max_seq_len"], sm_count=sms,
                                         wave_guard=run_wave_guard(doc)),
                    "patched": step_ratio(r, "patched"),
                    "own": gqa_off / launch if launch and gqa_off else None})
    return out


def bounds_table(docs: Sequence[dict[str, Any]], only: str | None = None) -> list[str]:
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


def host_overhead(doc: dict[str, Any]) -> dict[str, list[float]]:
    """Per variant, its extra time per call over stock's (us) on the steps where both timings
    ran and stock is host-bound (``HOST_BOUND``): issue 29's host-path budget, measured."""
    if set(timings(doc)) != {"graph", "eager"}:
        return {}
    base = doc["meta"]["baseline"]
    graph = dict(measured(doc, "graph"))
    out: dict[str, list[float]] = {}
    for i, e in measured(doc, "eager"):
        g = graph.get(i)
        if g is None:
            continue
        stock_e = e["variants"][base]["time_us"]["median"]
        if stock_e < HOST_BOUND * g["variants"][base]["time_us"]["median"]:
            continue
        for n, v in e["variants"].items():
            if n != base:
                out.setdefault(n, []).append(v["time_us"]["median"] - stock_e)
    return out


def host_table(docs: Sequence[dict[str, Any]]) -> list[str]:
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


def sample_summary(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per timing and variant (the CLI's closing table)."""
    out = []
    for t in timings(doc):
        rows = measured(doc, t)
        for n, st in distribution(doc, t).items():
            if st["n"]:
                out.append({"timing": t, "variant": n, **st, "all_bitwise_equal": all(
                    r.get("bitwise_equal") for _, r in rows)})
    return out


def seeds_table(docs: Sequence[dict[str, Any]]) -> list[str]:
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


def attribution_table(doc: dict[str, Any]) -> list[str]:
    """The attribution of every timing in one table (a README block, ``attribution``)."""
    return _table(["timing", "from", "to", "mechanism", "steps", "geomean step", "steps worse"],
                  [[t, a["from"], a["to"], a["mechanism"], a["steps"], _x(a["geomean"]),
                    a["worse"]] for t in timings(doc) for a in attribution(doc, t)])


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def sample_markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    sample = meta["sample"]
    dev = meta["device"]
    inst = sample["instantiations"]
    names = variant_names(doc)
    lines = [f"# sampled benchmark: {sample['n']} steps, seed {sample['seed']}", "",
             (f"- device: {dev['name']} ({dev.get('sm_count')} SMs, L2 "
             f"{dev['l2_bytes'] / 2**20:.0f} MiB), torch {dev.get('torch')}, CUDA {dev.get('cuda')}"),
             (f"- copy bandwidth (read+write, same run): {meta['copy_bw_bytes_per_s'] / 1e12:.2f} "
             "TB/s"),
             f"- started {meta['started']}, {meta.get('seconds', '?')} s",
             f"- call: {describe_call(doc_call(doc))}",
             (f"- drawn within: head sizes {inst['head_sizes']}, block sizes {inst['block_sizes']}, "
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


def sample_png(doc: dict[str, Any], path: Path) -> Path:
    """Per timing: each variant's sorted step ratios (the distribution as a curve), and the
    headline variant's ratio against the step's KV bytes with the A/A band shaded."""
    plt = _pyplot()
    ts = timings(doc) or ["graph"]
    fig, axes = plt.subplots(len(ts), 2, squeeze=False, figsize=(11, 4 * len(ts)))
    head = headline(doc)
    for ti, t in enumerate(ts):
        ax = axes[ti][0]
        rows = measured(doc, t)
        for n in variant_names(doc):
            vals = sorted(x for _, r in rows if (x := step_ratio(r, n)) is not None)
            if vals:
                ax.plot([100 * (i + 0.5) / len(vals) for i in range(len(vals))], vals, label=n)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(TARGET_STEP, color="red", linewidth=0.6, linestyle="--")
        ax.set_xlabel("percentile of steps")
        ax.set_ylabel("stock time / variant time")
        ax.set_title(f"{t}: sorted step ratios", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[ti][1]
        band = aa_band(doc, t)
        if band:
            ax.axhspan(band["p5"], band["p95"], color="grey", alpha=0.3, label="A/A p5-p95")
        if head:
            pts = [(r.get("kv_bytes") or 1, x) for _, r in rows
                   if (x := step_ratio(r, head)) is not None]
            if pts:
                ax.scatter([p[0] / 2**20 for p in pts], [p[1] for p in pts], s=8, label=head)
        ax.set_xscale("log")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("KV bytes of the step (MiB)")
        ax.set_ylabel("ratio")
        ax.set_title(f"{t}: {head} per step", fontsize=9)
        ax.legend(fontsize=7)
    return _save(fig, path)
