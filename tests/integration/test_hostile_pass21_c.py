"""Issue 41, the twenty-first hostile pass (tester c: every command, option, input and
environment value, for tracebacks, hangs, wrong messages and wrong writes). Each test fails
without its fix (checked by reverting ``src`` and running it):

- A dry run's table drew every row: ``bench decode --dry-run`` of the 100,000 shapes a plan may
  hold (``matrix.MAX_SHAPES``: 20,000 batches by 5 contexts) made its plan in 8 s and then
  drew its table for more than two minutes (killed at 120 s; 20,000 shapes took 58 s). Now a
  table shows its first ``console.MAX_TABLE_ROWS`` (1,000) rows and a line saying how many more
  there are (``--json`` lists them all): a few seconds.
- ``vmm bench``'s ``--batches``/``--contexts`` had no ceiling and kept repeats: 20,000 batches
  (by the 4 default contexts) kept ``vmm bench --dry-run`` planning and drawing past 120 s, and
  20,000 batches by 20,000 contexts (400 million shapes, within the command line's 2 MB) for
  days. Now a repeated size counts once, and more than ``matrix.MAX_SHAPES`` shapes are refused
  at once (exit 2), as bench decode's and bench kernel's are.
- ``report`` wrote its outputs over the result files it read: ``report K1.json K2.json
  --repeats K1 --out DIR`` (K1.json in DIR) replaced the result K1.json with the combined
  document, exit 0; ``--merge`` did the same to an input named merged.json; ``report --index R
  --out R/RUN/provenance.json`` replaced that run's record (or a result its headline names)
  with the index; and ``report A/run.json B/run.json --out R`` wrote R/run.md twice, the first
  run's report lost, both "wrote". Now each is refused before anything is written (exit 7),
  naming the file, with a fix; the inputs are kept byte for byte.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path))
    return env


def _sizes(first: int, last: int) -> str:
    return ",".join(str(n) for n in range(first, last + 1))


def _kit(tmp_path: Path, args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=_env(tmp_path),
                              cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[:2]} with {len(args)} arguments still running after {timeout} s")


def test_a_dry_run_of_the_most_shapes_a_plan_holds_draws_a_bounded_table(
        tmp_path: Path) -> None:
    res = _kit(tmp_path, ["bench", "decode", "--workdir", str(tmp_path / "work"), "--dry-run",
                          "--out", str(tmp_path / "out"), "--batch", _sizes(1, 20000),
                          "--context", "512,1k,2k,4k,8k"], timeout=45)
    text = res.stdout + res.stderr
    assert res.returncode == 0 and "Traceback" not in text, text[-2000:]
    assert "100000 workload(s)" in text and "99000 more rows, not shown" in text, text[-2000:]
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize("lists", [
    ["--batches", _sizes(1, 20000), "--contexts", _sizes(1, 20000)],
    ["--batches", _sizes(1, 21000), "--contexts", "512,1k,4k,16k,32k"],
], ids=["cross", "many-batches"])
def test_vmm_bench_refuses_more_shapes_than_a_bench_plan_holds(
        tmp_path: Path, lists: list[str]) -> None:
    res = _kit(tmp_path, ["vmm", "bench", "--dry-run", "--out", str(tmp_path / "v.json"), *lists],
               timeout=25)
    text = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in text and "To fix" in text, text[-2000:]
    assert "a bench run plans at most 100000" in text, text[-2000:]
    assert not (tmp_path / "v.json").exists()


def test_vmm_bench_plans_a_repeated_size_once(tmp_path: Path) -> None:
    res = _kit(tmp_path, ["vmm", "bench", "--dry-run", "--json", "--out", str(tmp_path / "v.json"),
                          "--batches", "1,1,8,8", "--contexts", "1k,1024"], timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    import json

    shapes = json.loads(res.stdout)["shapes"]
    assert [(s["batch"], s["context"]) for s in shapes] == [(1, 1024), (8, 1024)]


_RESULTS = _REPO / "docs" / "results"
_KERNEL = _RESULTS / "2026-11-29-h200-l2-bound" / "matrix-aliased.json"


@pytest.mark.parametrize("how", ["repeats", "merge", "same-stems"])
def test_report_never_writes_over_a_result_it_reads(tmp_path: Path, how: str) -> None:
    import shutil

    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    (out / "b").mkdir()
    if how == "repeats":
        inputs = [out / "k1.json", out / "k2.json"]
        args = ["--repeats", "k1"]
    elif how == "merge":
        inputs = [out / "merged.json", out / "k2.json"]
        args = ["--merge"]
    else:
        inputs = [out / "a" / "run.json", out / "b" / "run.json"]
        args = ["--formats", "md"]
    for f in inputs:
        shutil.copy(_KERNEL, f)
    if how == "merge":  # two shards of one campaign: the shapes split between them
        import json

        doc = json.loads(_KERNEL.read_text())
        for i, f in enumerate(inputs):
            f.write_text(json.dumps({**doc, "results": doc["results"][i::2]}))
    before = {f: f.read_bytes() for f in inputs}
    res = _kit(tmp_path, ["report", *map(str, inputs), "--out", str(out), *args], timeout=60)
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text and "To fix" in text, text[-2000:]
    assert {f: f.read_bytes() for f in inputs} == before
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == sorted(f.name for f in inputs)


@pytest.mark.parametrize("target", ["provenance.json", "decode-llama-3.1-8b.json"])
def test_report_index_never_writes_over_a_file_it_is_made_of(tmp_path: Path, target: str) -> None:
    import shutil

    root = tmp_path / "results"
    run = root / "2026-12-01-h200-decode"
    shutil.copytree(_RESULTS / run.name, run)
    before = (run / target).read_bytes()
    res = _kit(tmp_path, ["report", "--index", str(root), "--out", str(run / target)],
               timeout=60)
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text and "To fix" in text, text[-2000:]
    assert (run / target).read_bytes() == before
