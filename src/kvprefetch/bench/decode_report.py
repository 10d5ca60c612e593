"""Markdown and PNG of a ``bench decode`` result: per workload each tree's decode tokens/s, its
ratio to stock (median and range over interleaved rounds), step latency, attention's share of
the step's kernel time, and whether every step's logits matched stock's bit for bit."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from .render import MAX_BARS, MAX_PANELS, geomean, md_table, plain, pyplot, save_figure
from .schema import DecodeDocument, DecodeRow, Stats


class DecodeSummary(TypedDict):
    """One non-baseline tree's line of a decode result's summary (``decode_summary``)."""

    tree: str
    workloads: int
    geomean: float | None
    worst: tuple[float, str]  # (ratio, workload)
    best: tuple[float, str]
    bitwise_equal: bool


def decode_summary(doc: DecodeDocument) -> list[DecodeSummary]:
    """Per non-baseline tree: workloads measured, geomean ratio, worst and best ratio (with
    their workload), and whether every workload was bitwise equal."""
    base = doc["meta"]["baseline"]
    rows = [r for r in doc["results"] if r.get("status") == "ok"]
    out: list[DecodeSummary] = []
    for tree in doc["meta"]["trees"]:
        if tree == base:
            continue
        pts = [(_ratio(r, tree)["median"], r["label"]) for r in rows
               if tree in r["trees"]]
        if not pts:
            continue
        out.append({"tree": tree, "workloads": len(pts), "geomean": geomean(p for p, _ in pts),
                    "worst": min(pts), "best": max(pts),
                    "bitwise_equal": all(r["trees"][tree]["bitwise_equal"] for r in rows
                                         if tree in r["trees"])})
    return out


def _ratio(r: DecodeRow, tree: str) -> Stats:
    """Tree ``tree``'s tokens/s ratio to stock in the measured row ``r`` (only the baseline has
    none: a null one elsewhere is refused as unreadable)."""
    q = r["trees"][tree]["ratio"]
    if q is None:
        raise TypeError(f"{tree} has no ratio in {r['label']}")
    return q


def decode_points_table(docs: Sequence[DecodeDocument], target: float = 0.99) -> list[str]:
    """One markdown table over several `bench decode` results (a run's folder): per model and
    context, the fixed points measured, how many ran from a CUDA graph, ``patched``'s tokens/s
    ratio over them (geomean, worst and best with their batch), how many fall below
    ``target``, the A/A band of ``control`` where it ran (min-max), and whether every step was
    bitwise equal. Serving traces are left out: they have no single context."""
    groups: dict[tuple[str, int], list[DecodeRow]] = {}
    for doc in docs:
        name = doc["meta"]["model"]["name"]
        for r in doc["results"]:
            if r.get("status") == "ok" and not r.get("requests") and "patched" in r["trees"]:
                groups.setdefault((name, int(r["context"])), []).append(r)
    rows = []
    for (name, ctx), pts in groups.items():
        ratio = [(_ratio(r, "patched")["median"], r["batch"]) for r in pts]
        ctl = [_ratio(r, "control")["median"] for r in pts if "control" in r["trees"]]
        graph = sum(1 for r in pts if r.get("graph_steps", 0) == r.get("steps_run", -1))
        worst, best = min(ratio), max(ratio)
        rows.append([name, ctx, len(pts), graph, f"{geomean(x for x, _ in ratio):.3f}x",
                     f"{worst[0]:.3f}x (b{worst[1]})", f"{best[0]:.3f}x (b{best[1]})",
                     sum(1 for x, _ in ratio if x < target),
                     f"{min(ctl):.3f}-{max(ctl):.3f}" if ctl else "-",
                     "yes" if all(r["trees"][t]["bitwise_equal"] for r in pts
                                  for t in ("patched", "control") if t in r["trees"]) else "NO"])
    return md_table(["model", "context", "points", "from a graph", "geomean", "worst", "best",
                     f"< {target}", "A/A (control)", "bitwise equal"], rows)


def decode_markdown(doc: DecodeDocument) -> str:
    meta = doc["meta"]
    m, cfg, dev = meta["model"], meta["config"], meta["device"]
    base = meta["baseline"]
    others = [t for t in meta["trees"] if t != base]
    lines = [f"# bench decode: {m['name']}, {', '.join(others)} vs {base}", "",
             (f"- device: {dev['name']} ({dev.get('sm_count')} SMs), torch {dev.get('torch')}, "
              f"CUDA {dev.get('cuda')}"),
             (f"- model: {m['name']} ({m['source']}): {m['layers']} layers, hidden "
              f"{m['hidden']}, {m['num_heads']} query / {m['num_kv_heads']} kv heads of "
              f"{m['head_dim']}, intermediate {m['intermediate']}, vocab {m['vocab']}, "
              f"{m['dtype']}, random weights"),
             "- steps: " + ("eager (enforce_eager)" if cfg["eager"] else
                            "CUDA graphs per batch bucket, captured with max_seq_len "
                            f"{cfg.get('max_seq_len_to_capture', 8192)} (vLLM V0); steps with "
                            "a longer sequence or a larger batch eager"),
             (f"- {cfg['repeats']} interleaved rounds; started {meta['started']}, "
              f"{meta.get('seconds', '?')} s")]
    if command := meta.get("command"):
        lines.append(f"- command: `{' '.join(command)}`")
    lines += ["", ("Tokens/s = decode tokens (padding excluded) / summed step time (CUDA events, "
                   "input copy + step). Ratio = stock time / tree time per round: median "
                   "[min-max]. Attention = attention kernels' share of the step's kernel time. "
                   "Bitwise: every step's logits equal stock's in every round."), "",
              "## Summary", ""]
    lines += md_table(
        ["tree", "workloads", "geomean ratio", "worst", "best", "bitwise equal"],
        [[s["tree"], s["workloads"], f"{s['geomean']:.3f}x",
          f"{s['worst'][0]:.3f}x ({s['worst'][1]})", f"{s['best'][0]:.3f}x ({s['best'][1]})",
          "yes" if s["bitwise_equal"] else "NO"] for s in decode_summary(doc)])
    lines += ["", "## Workloads", ""]
    head = ["workload", "steps (v1/v2, graph)", f"{base} tok/s", f"{base} p50/p99 ms",
            f"{base} attention"]
    for t in others:
        head += [f"{t} tok/s", f"{t} ratio [min-max]", f"{t} p50/p99 ms", f"{t} attention",
                 "bitwise"]
    rows: list[list[str | None]] = []
    for r in doc["results"]:
        if r.get("status") != "ok":
            rows.append([r["label"], r.get("reason", r.get("status"))] + [""] * (len(head) - 2))
            continue
        k = r["kernels"]
        row: list[str | None] = [
            r["label"], f"{r['steps_run']} ({k['v1']}/{k['v2']}, {r['graph_steps']})"]
        for t in [base, *others]:
            e = r["trees"][t]
            share = "-" if e["attention_share"] is None else f"{100 * e['attention_share']:.0f}%"
            lat = f"{e['step_ms']['p50']:.2f}/{e['step_ms']['p99']:.2f}"
            if t == base:
                row += [f"{e['tokens_per_s']:.0f}", lat, share]
            else:
                q = _ratio(r, t)
                row += [f"{e['tokens_per_s']:.0f}",
                        f"{q['median']:.3f} [{q['min']:.3f}-{q['max']:.3f}]", lat, share,
                        "yes" if e["bitwise_equal"] else "NO"]
        rows.append(row)
    lines += md_table(head, rows)
    return "\n".join(lines) + "\n"


def decode_png(doc: DecodeDocument, path: Path) -> Path:
    plt = pyplot()
    base = doc["meta"]["baseline"]
    all_others = [t for t in doc["meta"]["trees"] if t != base]
    all_rows = [r for r in doc["results"] if r.get("status") == "ok"]
    # bounded as report.py's figures: a bar group per shape drew 3,000 shapes of a 5 MB result
    # for 37 s, one 0.9 inch wider each (issue 41, the twenty-fifth pass)
    others, rows = all_others[:MAX_PANELS], all_rows[:MAX_BARS]
    cut = len(rows) < len(all_rows) or len(others) < len(all_others)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 4))
    if cut:
        ax.set_title(f"the first {len(rows)} of {len(all_rows)} shapes and {len(others)} of "
                     f"{len(all_others)} trees (the markdown lists them all)", fontsize=9)
    width = 0.8 / max(len(others), 1)
    for i, t in enumerate(others):
        xs = [j + i * width for j in range(len(rows))]
        ys = [_ratio(r, t)["median"] for r in rows]
        lo = [y - _ratio(r, t)["min"] for y, r in zip(ys, rows, strict=True)]
        hi = [_ratio(r, t)["max"] - y for y, r in zip(ys, rows, strict=True)]
        ax.bar(xs, ys, width, yerr=[lo, hi], label=plain(t))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))],
                  [plain(r["label"]).replace("serve ", "serve\n") for r in rows], rotation=30,
                  ha="right", fontsize=7)
    ax.set_ylabel(plain(f"decode tokens/s over {base}"))
    if not cut:
        ax.set_title(plain(f"bench decode: {doc['meta']['model']['name']}"))
    ax.legend()
    return save_figure(fig, path)
