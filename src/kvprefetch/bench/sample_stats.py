"""The numbers of a sampled run (``bench kernel --sample``, a document of kind ``sample``): per
timing (CUDA-graph replay, eager) and variant, the distribution of the per-step ratios to stock,
the worst steps with their shapes, the A/A band from the ``control`` tree, each large step's
fraction of the copy bandwidth, the attribution of the geomean to mechanisms when the ablation
trees ran, and the extra host time per call on host-bound steps. Pure functions over the JSON
document (tested on synthetic numbers); ``sample_report`` renders them.

A step's ratio is its median over rounds of the paired per-round ratio stock time / variant
time (``bench/kernel.py``): > 1 means the variant is faster.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TypedDict

from .render import geomean
from .schema import SampleDocument, ShapeRow
from .stats import quantile

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


class _RatioStatsKeys(TypedDict):
    n: int


class RatioStats(_RatioStatsKeys, total=False):
    """The distribution of per-step ratios (``ratio_stats``; only ``n`` when there are none);
    ``p95`` in the A/A band."""

    min: float
    p5: float
    median: float
    geomean: float | None
    max: float
    below_1: int
    below_target: int
    p95: float


class WorstStep(TypedDict):
    """One of the steps with the lowest ratio (``worst_steps``)."""

    step: int
    label: str
    family: str
    preset: str
    batch: int
    max_len: int
    mean_len: float
    kernel: str
    kv_bytes: int | None
    ratio: float
    min: float
    max: float
    control: float | None


class LargeStep(TypedDict):
    """A step with a large KV (``large_steps``): each variant's bandwidth fraction."""

    step: int
    label: str
    kv_bytes: int
    bw: dict[str, float]


# One link of the ablation chain (``attribution``): "from" is a keyword, hence this form.
Attribution = TypedDict("Attribution", {"from": str, "to": str, "mechanism": str, "steps": int,
                                        "geomean": float | None, "worse": int})


def timings(doc: SampleDocument) -> list[str]:
    """The timings present, graph first."""
    present = {r.get("timing", "graph") for r in doc["results"]}
    return [t for t in ("graph", "eager") if t in present]


def variant_names(doc: SampleDocument) -> list[str]:
    """Every variant but the baseline, in the run's order."""
    base = doc["meta"]["baseline"]
    return [v["name"] for v in doc["meta"]["variants"] if v["name"] != base]


def headline(doc: SampleDocument) -> str | None:
    """The variant the distribution is about: ``patched`` when it ran, else the first variant
    that is not the A/A control."""
    names = variant_names(doc)
    if "patched" in names:
        return "patched"
    return next((n for n in names if n != CONTROL), None)


def measured(doc: SampleDocument, timing: str) -> list[tuple[int, ShapeRow]]:
    """(step index, row) of the measured rows of one timing: the row's ``step``, or in a
    document made before rows recorded it, the row's index among its timing's rows (they were
    in step order, every step in every timing)."""
    rows = [r for r in doc["results"] if r.get("timing", "graph") == timing]
    return [(r.get("step", i), r) for i, r in enumerate(rows) if r["status"] == "measured"]


def step_ratio(row: ShapeRow, name: str) -> float | None:
    v = row["variants"].get(name)
    s = v["speedup"] if v else None
    return s["median"] if s else None


def ratio_stats(values: Sequence[float]) -> RatioStats:
    """min, p5 (linear interpolation between closest ranks), median, geomean, max, how many
    below 1 and below the per-step target (0.99)."""
    s = sorted(values)
    if not s:
        return {"n": 0}
    return {"n": len(s), "min": s[0], "p5": quantile(s, 0.05), "median": quantile(s, 0.5),
            "geomean": geomean(s), "max": s[-1], "below_1": sum(1 for v in s if v < 1.0),
            "below_target": sum(1 for v in s if v < TARGET_STEP)}


def distribution(doc: SampleDocument, timing: str) -> dict[str, RatioStats]:
    """Per variant, the statistics of its per-step ratios."""
    rows = measured(doc, timing)
    out: dict[str, RatioStats] = {}
    for n in variant_names(doc):
        vals = [x for _, r in rows if (x := step_ratio(r, n)) is not None]
        out[n] = ratio_stats(vals)
    return out


def worst_steps(doc: SampleDocument, timing: str, name: str,
                k: int = WORST) -> list[WorstStep]:
    """The ``k`` steps with the lowest ratio of ``name``: index, label, shape, ratio and its
    spread over rounds, KV bytes, and where the A/A control ran, its ratio on that step."""
    rows = [(i, r, x) for i, r in measured(doc, timing) if (x := step_ratio(r, name)) is not None]
    rows.sort(key=lambda t: t[2])
    out: list[WorstStep] = []
    for i, r, x in rows[:k]:
        sp = r["variants"][name]["speedup"]
        if sp is None:  # step_ratio found it: only the baseline has none
            continue
        lens = r.get("seq_lens") or [r["context"]] * r["batch"]
        out.append({"step": i, "label": r["label"], "family": r.get("family", "uniform"),
                    "preset": r["preset"], "batch": r["batch"], "max_len": r["context"],
                    "mean_len": sum(lens) / len(lens), "kernel": r["kernel"],
                    "kv_bytes": r.get("kv_bytes"), "ratio": x, "min": sp["min"],
                    "max": sp["max"], "control": step_ratio(r, CONTROL)})
    return out


def aa_band(doc: SampleDocument, timing: str) -> RatioStats | None:
    """The A/A band: the distribution of the control tree's per-step ratios (stock rebuilt
    through the same pipeline). A variant's step ratio inside [p5, p95] of it is within the
    benchmark's resolution; ``None`` when control did not run."""
    vals = [x for _, r in measured(doc, timing) if (x := step_ratio(r, CONTROL)) is not None]
    if not vals:
        return None
    s = sorted(vals)
    return {**ratio_stats(s), "p95": quantile(s, 0.95)}


def large_steps(doc: SampleDocument, timing: str,
                threshold: int = LARGE_KV_BYTES) -> list[LargeStep]:
    """Steps whose KV is at least ``threshold`` bytes: per variant (stock included) the achieved
    bandwidth (fewest bytes moved over the median time) as a fraction of the copy bandwidth
    measured in the same run."""
    out: list[LargeStep] = []
    for i, r in measured(doc, timing):
        if (kv := r.get("kv_bytes") or 0) >= threshold:
            out.append({"step": i, "label": r["label"], "kv_bytes": kv,
                        "bw": {n: v["bw_fraction"] for n, v in r["variants"].items()}})
    return out


def attribution(doc: SampleDocument, timing: str) -> list[Attribution]:
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

    def ratio(r: ShapeRow, n: str) -> float | None:
        return 1.0 if n == base else step_ratio(r, n)

    rows = [r for _, r in measured(doc, timing) if all(ratio(r, n) for n in chain)]
    out: list[Attribution] = []
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


def host_overhead(doc: SampleDocument) -> dict[str, list[float]]:
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
