"""The report blocks (`<!-- report RESULT.json summary|shapes|attribution -->`, `<!-- report
RUN_FOLDER seeds|decode -->`) of the README, docs/design.md, docs/sampled-benchmark.md and
docs/tuning-log.md, and the README's command table (`<!-- commands -->`), are what
`kvprefetch report --readme` renders from the committed result JSON and the commands' help, not
text typed by hand: CI regenerates them and fails on any difference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprefetch.bench.readme_blocks import README_BLOCK, refresh_blocks
from kvprefetch.cli import main
from kvprefetch.cli.report import COMMANDS_BLOCK, refresh_commands
from kvprefetch.timings import TIMINGS_BLOCK, load_timings, refresh_timings

ROOT = Path(__file__).resolve().parents[2]


def _stage(tmp_path: Path, paths: list[str]) -> None:
    """Copy the committed results (files or run folders) a README copy in ``tmp_path`` names."""
    for path in paths:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / path).is_dir():
            shutil.copytree(ROOT / path, tmp_path / path, dirs_exist_ok=True)
        else:
            shutil.copy(ROOT / path, tmp_path / path)


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md", "docs/sampled-benchmark.md",
                                 "docs/tuning-log.md"])
def test_report_blocks_are_regenerated_from_their_json(doc: str) -> None:
    path = ROOT / doc
    text = path.read_text()
    blocks = README_BLOCK.findall(text)
    assert blocks, f"{doc} has no report block"
    for _, block_path, kind, _, _ in blocks:
        # a `seeds` block names a run's folder, `twins`, `bounds` and `host` a folder or one
        # result, every other block one result
        target = path.parent / block_path
        if kind in ("seeds", "decode"):
            assert target.is_dir(), block_path
        elif kind in ("twins", "bounds", "host"):
            assert target.exists(), block_path
        else:
            assert target.is_file(), block_path
    new, changed = refresh_blocks(text, path.parent)
    assert changed == [] and new == text


def test_decode_block_counts_each_point_of_the_folder(tmp_path: Path) -> None:
    """A `decode` block is one row per model and context over every decode-*.json[.gz] of a run's
    folder: its points are the fixed points of those results (serving traces left out), its
    count below 0.99x and its worst are patched's own ratios there, and a point that is not
    bitwise equal turns the row's last column to NO."""
    import gzip

    from kvprefetch.bench.decode_report import decode_points_table
    from kvprefetch.bench.documents import load_document
    from kvprefetch.bench.readme_blocks import decode_block
    from kvprefetch.errors import BenchError

    run = ROOT / "docs/results/2026-12-03-h200-vllm-call-decode"
    docs = [load_document(f) for f in sorted(run.glob("decode-*.json.gz"))]
    lines = decode_points_table(docs)
    rows = {(c[1].strip(), int(c[2])): c for c in (line.split("|") for line in lines[2:])}
    for doc in docs:
        pts = [r for r in doc["results"] if r.get("status") == "ok" and not r.get("requests")]
        for ctx in {r["context"] for r in pts}:
            mine = [r["trees"]["patched"]["ratio"]["median"] for r in pts if r["context"] == ctx]
            row = rows[(doc["meta"]["model"]["name"], ctx)]
            assert int(row[3]) == len(mine)
            assert int(row[8]) == sum(1 for x in mine if x < 0.99)
            assert row[6].strip().startswith(f"{min(mine):.3f}x")
    assert decode_block(run).splitlines() == lines
    # one step not bitwise equal: the row says so
    doc = docs[0]
    doc["results"][0]["trees"]["patched"]["bitwise_equal"] = False
    bad = tmp_path / "decode-bad.json.gz"
    with gzip.open(bad, "wt") as f:
        json.dump(doc, f)
    assert any(line.endswith("| NO |") for line in decode_block(tmp_path).splitlines())
    with pytest.raises(BenchError, match="holds no decode"):
        decode_block(tmp_path / "empty")


def test_readme_timings_are_rendered_from_their_provenance_file() -> None:
    """The README's times come from a committed timing file (issue 42), rendered, not typed."""
    text = (ROOT / "README.md").read_text()
    blocks = TIMINGS_BLOCK.findall(text)
    assert blocks, "the README has no <!-- timings --> block"
    for _, path, _, _ in blocks:
        doc = load_timings(ROOT / path)
        assert any("scripts/main.sh" in r["command"] for r in doc["runs"])
        assert any("scripts/test.sh" in r["command"] for r in doc["runs"])
    new, changed = refresh_timings(text, ROOT)
    assert changed == [] and new == text


def test_an_edited_time_is_found_and_regenerated(tmp_path: Path) -> None:
    """A time typed over in a copy of the README fails `report --readme --check`, naming the
    timing file; `report --readme` puts the file's figure back."""
    text = (ROOT / "README.md").read_text()
    m = next(TIMINGS_BLOCK.finditer(text))
    row = m[3].splitlines()[2]
    cells = row.split(" | ")
    edited = row.replace(f" | {cells[2]} | ", " | 1.0 min | ", 1)
    assert edited != row
    copy = tmp_path / "README.md"
    copy.write_text(text.replace(row, edited, 1))
    _stage(tmp_path, [p for _, p, _, _, _ in README_BLOCK.findall(text)] + [m[2]])
    runner = CliRunner()
    res = runner.invoke(main, ["report", "--readme", str(copy), "--check", "--json"])
    assert res.exit_code != 0 and json.loads(res.stdout)["changed"] == [m[2]]
    res = runner.invoke(main, ["report", "--readme", str(copy)])
    assert res.exit_code == 0, res.output
    assert copy.read_text() == text


def test_readme_command_table_is_generated_from_the_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert COMMANDS_BLOCK.search(text), "the README has no <!-- commands --> block"
    new, changed = refresh_commands(text)
    assert changed == [] and new == text


def test_check_finds_an_edited_figure_and_readme_fixes_it(tmp_path: Path) -> None:
    """A figure typed over in a copy of the README fails `--check` (exit code of the bench
    family, the block named); `--readme` rewrites it to the JSON's, touching nothing else."""
    text = (ROOT / "README.md").read_text()
    m = next(README_BLOCK.finditer(text))
    first_row = m[4].splitlines()[2]
    edited_row = first_row.replace("|", "| 9.999x |", 1)
    copy = tmp_path / "README.md"
    copy.write_text(text.replace(first_row, edited_row, 1))
    _stage(tmp_path, [p for _, p, _, _, _ in README_BLOCK.findall(text)]
           + [p for _, p, _, _ in TIMINGS_BLOCK.findall(text)])
    runner = CliRunner()
    res = runner.invoke(main, ["report", "--readme", str(copy), "--check", "--json"])
    assert res.exit_code != 0
    assert json.loads(res.stdout)["changed"] == [m[2]]
    assert "kvprefetch report --readme" in res.output
    assert copy.read_text() != text  # --check changed nothing
    res = runner.invoke(main, ["report", "--readme", str(copy)])
    assert res.exit_code == 0, res.output
    assert copy.read_text() == text


def test_sample_blocks_name_what_is_missing(tmp_path: Path) -> None:
    """A `seeds` block over a folder without sampled runs, and an `attribution` block over a
    sample whose ablation trees did not run, fail with the cause and the fix; the committed
    fresh-seed run renders one row per seed and timing."""
    from kvprefetch.bench.readme_blocks import sample_block
    from kvprefetch.errors import BenchError

    for kind in ("seeds", "twins", "host"):
        with pytest.raises(BenchError, match="holds no sample"):
            sample_block(tmp_path, kind)
    run = ROOT / "docs" / "results" / "2026-12-01-h200-sample-fresh"
    with pytest.raises(BenchError, match="the ablation trees did not run"):
        sample_block(run / "sample-12011758.json.gz", "attribution")
    rows = sample_block(run, "seeds").splitlines()[2:]
    assert {(r.split(" | ")[0].lstrip("| "), r.split(" | ")[1]) for r in rows} == {
        (seed, timing) for seed in ("12011758", "12011759", "12011760")
        for timing in ("graph", "eager")}


def test_twins_block_puts_the_rule_beside_the_measurement() -> None:
    """The `twins` block of the fresh-seed run: every step with twins compiled is counted once
    per timing under the twin the launcher's rule (its mirror) runs there, and the steps that
    ran a twin were all faster than stock (the rule's purpose); `none` holds the rest."""
    from kvprefetch.bench.documents import load_document
    from kvprefetch.bench.sample_rules import twin_steps
    from kvprefetch.bench.sample_stats import timings

    run = ROOT / "docs" / "results" / "2026-12-01-h200-sample-fresh"
    docs = [load_document(p) for p in sorted(run.glob("sample-*.json.gz"))]
    steps = [s for d in docs for t in timings(d) for s in twin_steps(d, t)]
    assert steps and {s["twin"] for s in steps} <= {"4x1", "4x2", "2x2", "2x4", "none"}
    ran = [s for s in steps if s["twin"] != "none"]
    assert ran and all(s["patched"] > 1.0 for s in ran)
    # v1 steps run only the chain-safe twins
    assert all(s["twin"] in ("2x2", "2x4") for s in ran if " v1" in s["label"])


def test_bounds_block_puts_the_v1_rule_beside_the_measurement() -> None:
    """The `bounds` block of the attribution seed that followed the v1 wave rule: each v1 step
    of a bounded instantiation without a twin counted under the code the rule runs there;
    where the rule runs stock's unbounded copy, the step measures as stock's kernels do
    (`gqa_off` over `launch` within the A/A band), and the block takes a single result."""
    from kvprefetch.bench.documents import load_document
    from kvprefetch.bench.readme_blocks import sample_block
    from kvprefetch.bench.sample_rules import bound_steps
    from kvprefetch.bench.vllm_call import row_launch
    from kvprefetch.kernels import policy

    path = ROOT / "docs/results/2026-12-01-h200-sample-v1-waves/sample-12012038.json.gz"
    doc = load_document(path)
    steps = bound_steps(doc, "graph")
    codes = {s["code"] for s in steps}
    assert codes == {"bound", "stock"}
    stock = [s for s in steps if s["code"] == "stock"]
    assert stock and all(0.99 <= s["own"] <= 1.01 for s in stock)
    rows = {r["label"]: r for r in doc["results"] if r["timing"] == "graph"}
    for s in steps:
        r = rows[s["label"]]
        ran = row_launch(r)  # the launch the launcher saw (this run's call: exact)
        wants = policy.legacy_stock_v1_wins(ran["num_seqs"] * r["num_heads"], 132,
                                            *policy.H200_V1_CTAS[r["head_size"]],
                                            -(-ran["max_seq_len"] // 16))
        assert (s["code"] == "stock") == wants, s["label"]
    lines = sample_block(path, "bounds").splitlines()
    assert lines[0].startswith("| timing | v1 runs |") and len(lines) == 2 + 2 * len(codes)


def test_host_block_reads_host_bound_steps_only() -> None:
    """The host-path figure pairs each step's eager and graph rows and keeps the steps where
    stock's eager time is at least HOST_BOUND times its graph time: on seed 29 (before the
    eager change) every variant with the launcher's L2 kernel paid microseconds per call, on
    the fresh seeds the shipped launcher is within 1 us of stock's at the median."""
    from kvprefetch.bench.documents import load_document
    from kvprefetch.bench.sample_stats import HOST_BOUND, host_overhead, measured

    before = load_document(ROOT / "docs/results/2026-12-01-h200-sample/sample-29.json.gz")
    got = host_overhead(before)
    graph = dict(measured(before, "graph"))
    bound = [i for i, e in measured(before, "eager") if i in graph
             and e["variants"]["baseline"]["time_us"]["median"]
             >= HOST_BOUND * graph[i]["variants"]["baseline"]["time_us"]["median"]]
    assert len(got["patched"]) == len(bound) > 0
    assert sorted(got["launch"])[len(bound) // 2] > 2.0  # the fork, launch and join
    fresh = load_document(
        ROOT / "docs/results/2026-12-01-h200-sample-fresh/sample-12011760.json.gz")
    after = sorted(host_overhead(fresh)["patched"])
    assert after[len(after) // 2] < 1.0


def test_a_compressed_result_renders_under_its_run_name(tmp_path: Path) -> None:
    """`kvprefetch report RUN.json.gz` writes RUN.md, as RUN.json would (not RUN.json.md)."""
    src = ROOT / "docs/results/2026-12-01-h200-sample-fresh/sample-12011758.json.gz"
    res = CliRunner().invoke(main, ["report", str(src), "--out", str(tmp_path), "--formats",
                                    "md", "--json"])
    assert res.exit_code == 0, res.output
    assert [p.name for p in tmp_path.iterdir()] == ["sample-12011758.md"]
    assert "## Host time per call over stock" in (tmp_path / "sample-12011758.md").read_text()


def test_the_timings_table_shows_the_last_run_of_each_command() -> None:
    """The README shows what a reader runs today: the last run of each command, in the file's
    order, and how many earlier runs the file keeps (its table had grown to 30 rows)."""
    from kvprefetch.timings import timings_table

    def run(command: str, wall_s: float) -> dict[str, object]:
        return {"what": command, "command": command, "commit": "abcdef1", "how": "here",
                "exit": 0, "wall_s": wall_s, "source": "test"}

    doc = {"machine": "two cores", "runs": [run("a", 60), run("b", 70), run("a", 80)]}
    lines = timings_table(doc).splitlines()
    assert [line.split(" | ")[2] for line in lines[2:4]] == ["70 s", "80 s"]
    assert lines[4] == ""
    assert lines[5] == ("The last run of each command. The file keeps 1 earlier run of these "
                        "commands. Machine: two cores.")
    assert timings_table({**doc, "runs": doc["runs"][:2]}).splitlines()[-1] == (
        "The last run of each command. Machine: two cores.")
