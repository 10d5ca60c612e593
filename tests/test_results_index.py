"""docs/results.md is what `kvprefetch report --index docs/results` renders from each run's
provenance.json and the result JSON it names: regenerating it gives the committed file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprefetch.bench.index import PROVENANCE, find_runs, index_markdown
from kvprefetch.cli import main

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
INDEX = ROOT / "docs" / "results.md"


def test_results_index_is_regenerated_from_the_runs() -> None:
    assert index_markdown(RESULTS, INDEX) == INDEX.read_text()


def test_every_run_folder_has_provenance_and_links_resolve() -> None:
    runs = find_runs(RESULTS)
    for r in runs:
        assert len(r.tree) == 40 and r.commit and r.command, r.path
        assert f"]({Path('results') / r.path.relative_to(RESULTS)}/)" in INDEX.read_text()
    # every top-level run folder is indexed (a campaign folder through its runs)
    indexed = {r.path.relative_to(RESULTS).parts[0] for r in runs}
    assert indexed == {p.name for p in RESULTS.iterdir() if p.is_dir()}


def test_check_finds_a_stale_index_and_rewrites_it(tmp_path: Path) -> None:
    """A figure in a run's result changed without the index: --check fails, naming the fix;
    --index rewrites it; --check then passes."""
    src = RESULTS / "2026-12-01-h200-default-matrix"
    runs = tmp_path / "results"
    shutil.copytree(src, runs / src.name)
    out = tmp_path / "results.md"
    runner = CliRunner()
    res = runner.invoke(main, ["report", "--index", str(runs), "--out", str(out)])
    assert res.exit_code == 0, res.output
    first = out.read_text()
    assert "](results/2026-12-01-h200-default-matrix/)" in first
    prov = json.loads((runs / src.name / PROVENANCE).read_text())
    prov["headline"] = {"result": "default-matrix.json", "variant": "seed"}
    (runs / src.name / PROVENANCE).write_text(json.dumps(prov))
    res = runner.invoke(main, ["report", "--index", str(runs), "--out", str(out), "--check",
                               "--json"])
    assert res.exit_code != 0
    assert json.loads(res.stdout)["changed"] is True
    assert "kvprefetch report --index" in res.output
    assert out.read_text() == first  # --check changed nothing
    res = runner.invoke(main, ["report", "--index", str(runs), "--out", str(out)])
    assert res.exit_code == 0 and "seed 0.922x geomean" in out.read_text()


def test_a_run_without_its_fields_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / PROVENANCE).write_text(json.dumps({"title": "x"}))
    res = CliRunner().invoke(main, ["report", "--index", str(tmp_path)])
    assert res.exit_code != 0 and "lacks" in res.output and "To fix" in res.output


def test_report_writes_to_the_current_directory_by_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rendering a committed result leaves its folder untouched unless --out names it."""
    src = RESULTS / "2026-11-30-h200-prefetch-repeat" / "55-twin-split" / "dtype-bf16.json"
    before = sorted(p.name for p in src.parent.iterdir())
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["report", str(src), "--formats", "md"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in src.parent.iterdir()) == before
    assert (tmp_path / "dtype-bf16.md").is_file()
