"""The index of committed result runs (``kvprefetch report --index docs/results``).

A run is a folder holding ``provenance.json``: when and where it ran, what it measures, the
commit and git tree id of the files that ran, the exact command, and which result file gives
its headline figure. The headline is computed from that result JSON, never typed, so the index
(``docs/results.md``) is regenerated and diffed like the README's report blocks."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ..errors import BenchError
from ..reading import load_json
from ..workspace.confine import has_control
from .decode_report import decode_summary
from .documents import load_document, reading
from .render import ctx, geomean, md_table
from .report import kernel_summary, l2_ceiling


class Headline(TypedDict, total=False):
    """One headline figure as a run's ``provenance.json`` names it: ``text`` as it is, or
    computed from the ``result`` file (relative to the run's folder) for its ``variant`` (a
    tree of a decode result); ``label`` prefixes it; a kernel result's ``mode`` (cold) and
    ``l2_bound`` (add the aliased L2-resident bound), a sample's ``timings`` (graph, eager)."""

    text: str
    result: str
    variant: str
    label: str
    mode: str
    l2_bound: bool
    timings: list[str]


PROVENANCE = "provenance.json"
_FIELDS = ("title", "date", "gpu", "measures", "commit", "tree", "command", "headline")


@dataclass(frozen=True)
class ResultRun:
    """One committed run: its folder and what its ``provenance.json`` says."""

    path: Path
    title: str
    date: str
    gpu: str
    measures: str
    commit: str
    tree: str
    command: str
    headline: tuple[Headline, ...]  # as written: read by headline() inside reading()


def load_run(folder: Path) -> ResultRun:
    path = folder / PROVENANCE
    fix = f"write {PROVENANCE} as the other runs under docs/results have it"
    try:
        raw = load_json(path, 1 << 20)
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read {path}: {exc}", fix) from exc
    if not isinstance(raw, dict):
        raise BenchError(f"{path} is not a JSON object", fix)
    missing = [f for f in _FIELDS if f not in raw]
    if missing:
        raise BenchError(f"{path} lacks {', '.join(missing)}",
                         f"give every run's {PROVENANCE} the fields {', '.join(_FIELDS)}")
    # text, one line each: they are table cells and list items of the index. A `tree` of 0,
    # true, null or {..} was a TypeError traceback at `tree[:12]`, a `date` of a number one in
    # the sort beside the other runs' text (issue 41, the eighteenth hostile pass)
    bad = [f for f in _FIELDS[:-1] if not isinstance(raw[f], str) or has_control(raw[f])]
    if bad:
        raise BenchError(f"{path}: {', '.join(f'{f} ({_kind(raw[f])})' for f in bad)} "
                         "should be text of one line", fix)
    heads = raw["headline"] if isinstance(raw["headline"], list) else [raw["headline"]]
    return ResultRun(path=folder, title=raw["title"], date=raw["date"], gpu=raw["gpu"],
                     measures=raw["measures"], commit=raw["commit"], tree=raw["tree"],
                     command=raw["command"], headline=tuple(heads))


def _kind(value: object) -> str:
    """A bad provenance value as the message names it: the text escaped and cut, or its type."""
    return repr(value[:60]) if isinstance(value, str) else type(value).__name__


def find_runs(root: Path) -> list[ResultRun]:
    """Every folder under ``root`` with a ``provenance.json``, oldest first (then by path).
    Found by ``hashing.walk`` (its own stack, a symlinked folder never entered), not
    ``Path.rglob``, which calls itself once per level: a folder 1,500 levels deep under
    ``--index DIR`` was a ``RecursionError`` traceback (issue 41, the twenty-second hostile
    pass)."""
    from ..hashing import walk

    found = [Path(here, PROVENANCE) for here, _dirs, files in walk(root) if PROVENANCE in files]
    runs = [load_run(p.parent) for p in sorted(found)]
    if not runs:
        raise BenchError(f"no {PROVENANCE} under {root}",
                         "point --index at the folder of committed runs (docs/results)")
    return sorted(runs, key=lambda r: (r.date, str(r.path)))


def headline(run: ResultRun) -> str:
    """The run's headline figure(s), computed from the result files its provenance names."""
    parts = []
    for spec in run.headline:
        result = spec.get("result") if isinstance(spec, dict) else None
        named = [run.path / result] if isinstance(result, str) else []
        with reading(*named, run.path / PROVENANCE):
            parts.append(_one_headline(run.path, spec))
    return "; ".join(parts)


def _one_headline(folder: Path, spec: Headline) -> str:
    if "text" in spec:
        return str(spec["text"])
    try:
        doc = load_document(folder / spec["result"])
    except BenchError as exc:
        # its fix was load_document's "pass a JSON file written by kvprefetch bench": the index
        # was passed a folder, and the run's provenance.json named the file (issue 41, the
        # twenty-fourth hostile pass)
        raise BenchError(f"{folder / PROVENANCE}'s headline names the result "
                         f"{str(spec['result'])[:200]!r}: {exc.cause}",
                         f"name in {folder / PROVENANCE} (its headline's `result`) a result "
                         "file of that run, as kvprefetch bench wrote it") from None
    variant = spec["variant"]
    prefix = f"{spec['label']}: " if spec.get("label") else ""
    if doc["kind"] == "kernel":
        rows = [s for s in kernel_summary(doc)
                if s["variant"] == variant and s["mode"] == spec.get("mode", "cold")]
        if not rows:
            raise BenchError(f"{folder / spec['result']} has no {variant} summary",
                             f"name a variant of that result in {folder / PROVENANCE}")
        s = rows[0]
        text = (f"{variant} {s['geomean_speedup']:.3f}x geomean over {s['shapes']} shapes, "
                f"worst {s['worst']['speedup']:.3f}x (b{s['worst']['batch']} "
                f"{ctx(s['worst']['context'])})")
        if spec.get("l2_bound"):
            aliased = [c["bound"] for c in l2_ceiling(doc) if c["resident"] == "aliased"]
            bound = geomean(aliased)
            if bound is not None:
                text += f"; L2-resident bound on stock {bound:.2f}x"
        return prefix + text
    if doc["kind"] == "repeats":
        rep = next((x for x in doc["summary"] if x["variant"] == variant), None)
        if rep is None:
            raise BenchError(f"{folder / spec['result']} has no {variant} summary",
                             f"name a variant of that result in {folder / PROVENANCE}")
        if None in rep["geomean_per_run"]:
            raise TypeError("a run has no geometric mean")
        runs = [g for g in rep["geomean_per_run"] if g is not None]
        return (f"{prefix}{variant} {min(runs):.3f}-{max(runs):.3f}x geomean over "
                f"{rep['shapes']} shapes in {len(runs)} runs, worst {rep['worst']['median']:.3f}x "
                f"(b{rep['worst']['batch']} {ctx(rep['worst']['context'])})")
    if doc["kind"] == "decode":
        dec = next((x for x in decode_summary(doc) if x["tree"] == variant), None)
        if dec is None:
            raise BenchError(f"{folder / spec['result']} has no {variant} tree",
                             f"name a tree of that result in {folder / PROVENANCE}")
        return (f"{prefix}{variant} {dec['geomean']:.3f}x tokens/s geomean over "
                f"{dec['workloads']} workloads ({dec['worst'][0]:.3f}-{dec['best'][0]:.3f}x)")
    if doc["kind"] == "sample":
        from .sample_stats import distribution

        parts = []
        for timing in spec.get("timings", ("graph", "eager")):
            d = distribution(doc, timing).get(variant)
            if d:
                parts.append(f"{timing} {d['geomean']:.3f}x geomean, p5 {d['p5']:.3f}x, "
                             f"min {d['min']:.3f}x over {d['n']} steps")
        if not parts:
            raise BenchError(f"{folder / spec['result']} has no {variant} steps",
                             f"name a variant of that result in {folder / PROVENANCE}")
        return f"{prefix}{variant} " + "; ".join(parts)
    raise BenchError(f"{folder / spec['result']}: no headline for kind {doc['kind']}",
                     "give the headline as {\"text\": ...} for this kind")


def index_markdown(root: Path, out: Path) -> str:
    """``docs/results.md``: one row per run under ``root``, links relative to ``out``."""
    runs = find_runs(root)
    try:  # the folders resolved once, every row's link from the same place
        base = Path(out).resolve().parent
        resolved = [r.path.resolve() for r in runs]
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        # realpath read a part as a link, then found no link there to read: a folder on the
        # way swapped back and forth by another process. It said "report failed: .../a:
        # Invalid argument / To fix: check the path and its file system", which named no
        # cause (issue 41, the fortieth hostile pass: nobody's folder and link swapped above
        # --out)
        raise BenchError(f"cannot tell where {exc.filename} leads: it stopped being a symlink "
                         "while kvprefetch read it (another process is changing the folders on "
                         "the way)", "stop whatever else renames that folder, or write the "
                         "index under folders only you or root own, then rerun") from None
    rows = []
    for r, path in zip(runs, resolved, strict=True):
        link = Path(os.path.relpath(path, base)).as_posix()
        rows.append([r.date, f"[{r.path.relative_to(root).as_posix()}]({link}/)", r.gpu,
                     r.measures, headline(r), f"`{r.commit}`"])
    lines = ["# Committed results", "",
             ("Generated by `kvprefetch report --index docs/results --out docs/results.md` from "
             f"each run's `{PROVENANCE}` (commit, git tree id of the files that ran, exact "
             "command) and the result JSON it names; `tests/unit/test_results_index.py` "
             "regenerates it and fails on any difference. Each run folder keeps the result JSON, "
             "its markdown and plots, and a README on how to read it; the bulky raw files and the "
             "exploration runs behind [tuning-log.md](tuning-log.md) are in git history "
             "(`git show 601b0ae:docs/results/`)."), ""]
    lines += md_table(["date", "run", "GPU", "what it measures", "headline", "commit"], rows)
    lines += ["", ("Commands, as each ran at its commit (`git checkout COMMIT` to rerun one as it "
                   "ran):"), ""]
    for r in runs:
        lines.append(f"- `{r.path.relative_to(root).as_posix()}` (tree `{r.tree[:12]}`): "
                     f"`{r.command}`")
    return "\n".join(lines) + "\n"
