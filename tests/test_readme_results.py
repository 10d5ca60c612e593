"""The README's H200 results table is the committed raw JSON, not numbers typed in by hand.

Each row of the table under "Results on the H200" names a shape; its columns from run 55
(`prefetch` per run, `whole ring at once`, `launch`, `control`, and stock's time in the median
run) must be what `kvprefetch report --repeats` wrote into
docs/results/2026-11-30-h200-prefetch-repeat/55-twin-split/repeats.json, rounded as printed.
The other columns (`no twin`, `seed`: run 24; the L2-resident bound) are checked against their
own runs' JSON where those runs measured them.

Run 55 timed the shipped build as `patched` and the design whose staged warps request their
whole ring at once (-DKVPREFETCH_TWIN_STAGE_SPLIT=0, repeat run 51's kernels) as `nosplit`."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from kvprefetch.sources import upstream

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "2026-11-30-h200-prefetch-repeat"
ROW = re.compile(r"^\| (\d+) × (\S+) \((v[12])\) \| ([\d.]+) \| (\w+) \| ([\d. ]+) \| ([\d.]+) \| "
                 r"([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$")
GEOMEAN = re.compile(r"^\| \*\*geomean, 20 shapes\*\* \| \| \| \*\*([\d. ]+)\*\* \| ([\d.]+) \| "
                     r"([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$")


def _table() -> tuple[dict[tuple[int, str], re.Match[str]], re.Match[str]]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Results on the H200"):text.index("How to read it")]
    rows = {(int(m[1]), m[2]): m for line in section.splitlines() if (m := ROW.match(line))}
    (geo,) = [m for line in section.splitlines() if (m := GEOMEAN.match(line))]
    return rows, geo


def _ctx(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens >= 1024 else str(tokens)


def _shapes(data: dict) -> dict[tuple[int, str], dict]:
    return {(r["batch"], _ctx(r["context"])): r for r in data["results"]}


def _repeats(run: str) -> dict:
    return json.loads((RESULTS / run / "repeats.json").read_text())


def test_every_shape_of_the_issue_matrix_is_in_the_table() -> None:
    rows, _ = _table()
    assert set(rows) == set(_shapes(_repeats("55-twin-split")))
    assert len(rows) == 20


def test_run_55_columns_are_its_json() -> None:
    rows, geo = _table()
    data = _repeats("55-twin-split")
    shapes = _shapes(data)
    for key, m in rows.items():
        r, v = shapes[key], shapes[key]["variants"]
        assert m[3] == r["kernel"], key
        assert m[4] == f"{sorted(r['baseline_us'])[1]:.1f}", key  # stock: the median run
        assert m[6].split() == [f"{x:.3f}" for x in v["patched"]["run_medians"]], key
        assert [m[7], m[9], m[10]] == [f"{v[n]['median']:.3f}"
                                       for n in ("nosplit", "launch", "control")], key
    summary = {s["variant"]: s for s in data["summary"]}
    assert geo[1].split() == [f"{x:.3f}" for x in summary["patched"]["geomean_per_run"]]
    assert [geo[2], geo[4], geo[5]] == [f"{summary[n]['geomean_of_medians']:.3f}"
                                        for n in ("nosplit", "launch", "control")]


def test_twin_column_is_the_rule_on_the_h200() -> None:
    """`twin (auto)`: what kvprefetch.sources.upstream.twin_pick (the mirror of the launcher's rule)
    picks on the H200 for the shape (Llama-3.1-8B: 32 query heads over 8 kv heads). The GPU test
    test_launcher_prefetch checks that the H200 ran exactly that twin."""
    rows, _ = _table()
    for (batch, ctx), m in rows.items():
        tokens = int(ctx[:-1]) * 1024 if ctx.endswith("k") else int(ctx)
        pick = upstream.twin_pick(32, 8, batch, tokens, m[3])
        assert pick is not None and m[5] == f"{pick[0]}x{pick[1]}", (batch, ctx)


def test_run_24_columns_are_its_json() -> None:
    """`no twin` was run 24's `gqa_off` tree and `seed` its `seed` tree (median of 3 runs)."""
    rows, geo = _table()
    data = _repeats("24-twins")
    shapes = _shapes(data)
    for key, m in rows.items():
        v = shapes[key]["variants"]
        assert m[3] == shapes[key]["kernel"], key
        assert [m[8], m[11]] == [f"{v[n]['median']:.3f}" for n in ("gqa_off", "seed")], key
    summary = {s["variant"]: s for s in data["summary"]}
    assert [geo[3], geo[6]] == [f"{summary[n]['geomean_of_medians']:.3f}"
                                for n in ("gqa_off", "seed")]


def test_l2_resident_bound_is_its_json() -> None:
    """The last column: stock cold / stock `--mode aliased` (every KV load an L2 hit), median
    times from docs/results/2026-11-29-h200-l2-bound/matrix-aliased.json; geomean over 20."""
    rows, geo = _table()
    runs = json.loads((ROOT / "docs" / "results" / "2026-11-29-h200-l2-bound" /
                       "matrix-aliased.json").read_text())["results"]
    stock = {(r["batch"], _ctx(r["context"]), r["mode"]):
             r["variants"]["baseline"]["time_us"]["median"] for r in runs}
    bounds = {key: stock[(*key, "cold")] / stock[(*key, "aliased")] for key in rows}
    for key, m in rows.items():
        assert m[12] == f"{bounds[key]:.2f}", key
    geomean = math.exp(sum(math.log(b) for b in bounds.values()) / len(bounds))
    assert geo[7] == f"{geomean:.2f}"
