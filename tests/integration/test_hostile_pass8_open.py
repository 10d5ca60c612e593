"""Issue 41: what the eighth hostile pass (and the sixth) found and left open, now closed. Each
test fails without its fix (checked with the fixes stashed):

- ``bench decode --layers`` above the model's layer count was planned as that many layers
  (``qwen2.5-7b`` has 28; ``--layers 33`` planned "33 layers, 16.4 GiB");
- a size past an int32 (``--context 99999999999999999999k``) was planned by ``slurm plan`` and
  ``bench kernel --dry-run``: 1.02e23 tokens, a length no vLLM call holds;
- ``--formats ,,,`` made ``report`` write nothing (and a bench run would measure for nothing);
- ``report`` of a result whose numbers are 1e308 or Infinity printed numpy's RuntimeWarnings
  with paths into matplotlib's own files;
- ``fetch --dry-run --workdir FILE/sub`` said it would create the trees; the real run fails.

Every case runs the kit of this checkout as a child (``PYTHONPATH`` set: pytest's base
environment drops it) and checks that a folder outside is unchanged (the autouse fixture)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_REPO = Path(__file__).resolve().parents[2]
_DECODE = _REPO / "docs/results/2026-12-03-h200-vllm-call-decode/decode-qwen2.5-7b-8000.json.gz"
_HUGE = "99999999999999999999k"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(_env(), PYTHONPATH=str(_REPO / "src"))
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def _refused(res: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "To fix:" in res.stderr, res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr


def test_bench_decode_refuses_more_layers_than_the_model_has(tmp_path: Path) -> None:
    """Planned as given before: a decode run of layers the model does not have."""
    res = _run("bench", "decode", "--dry-run", "--preset", "qwen2.5-7b", "--layers", "29",
               cwd=tmp_path)
    _refused(res, 2, "--layers 29", "28 layers", "from 1 to 28")
    # a preset that runs a few of its model's layers takes up to the model's count
    res = _run("bench", "decode", "--dry-run", "--preset", "llama-3-70b-tp8", "--layers", "81",
               cwd=tmp_path)
    _refused(res, 2, "80 layers")
    for preset, layers in (("qwen2.5-7b", "28"), ("llama-3-70b-tp8", "80")):
        res = _run("bench", "decode", "--dry-run", "--preset", preset, "--layers", layers,
                   cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4,
                                  "intermediate_size": 128, "num_hidden_layers": 2,
                                  "vocab_size": 100}))
    res = _run("bench", "decode", "--dry-run", "--config", str(config), "--layers", "3",
               cwd=tmp_path)
    _refused(res, 2, "2 layers")
    assert not list(tmp_path.glob("results*")), "a refused dry run wrote results"


@pytest.mark.parametrize("command", [
    ("bench", "kernel", "--dry-run", "--context", _HUGE),
    ("bench", "kernel", "--dry-run", "--batch", "4294967296"),
    ("bench", "decode", "--dry-run", "--context", _HUGE),
    ("slurm", "plan", "camp", "--dry-run", "--context", _HUGE),
], ids=["kernel-context", "kernel-batch", "decode-context", "slurm-plan"])
def test_a_size_past_an_int32_is_refused_not_planned(tmp_path: Path,
                                                     command: tuple[str, ...]) -> None:
    """``99999999999999999999k`` was planned as 1.02e23 tokens by bench kernel and slurm plan."""
    res = _run(*command, cwd=tmp_path)
    assert res.returncode in (2, 3), (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "To fix:" in res.stderr, res.stderr
    assert "2147483647" in res.stderr, res.stderr
    assert not (tmp_path / "camp").exists()
    # the largest int32 is still a size (the kernel limits then skip what vLLM cannot launch)
    res = _run("bench", "kernel", "--dry-run", "--batch", "1", "--context", "2147483647",
               cwd=tmp_path)
    assert res.returncode == 0, res.stderr


def test_formats_that_name_no_format_are_refused(tmp_path: Path) -> None:
    """``report --formats ,,,`` wrote nothing and said so; a bench run would have measured for
    nothing. ``--print`` alone (print the markdown, write no file) stays a way to read one."""
    out = tmp_path / "out"
    for formats in (",,,", "", " , "):
        res = _run("report", str(_DECODE), "--out", str(out), "--formats", formats, cwd=tmp_path)
        _refused(res, 2, "--formats", "names no format")
        res = _run("bench", "decode", "--dry-run", "--formats", formats, cwd=tmp_path)
        _refused(res, 2, "--formats", "names no format")
    assert not out.exists()
    res = _run("report", str(_DECODE), "--out", str(out), "--formats", ",", "--print",
               cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "| batch" in res.stdout or "|" in res.stdout
    assert not out.exists() or not any(out.iterdir())


def _with_numbers(value: float, path: Path) -> Path:
    """The committed decode result with every float field set to ``value``."""
    def walk(x: object) -> object:
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return value if isinstance(x, float) else x

    with gzip.open(_DECODE, "rt") as f:
        path.write_text(json.dumps(walk(json.load(f))))
    return path


@pytest.mark.parametrize("value", [1e308, float("inf")], ids=["1e308", "Infinity"])
def test_report_of_numbers_at_the_float_limit_prints_no_matplotlib_warning(
        tmp_path: Path, value: float) -> None:
    """numpy's overflow warnings from matplotlib's tick and transform code, naming
    matplotlib's files, were printed on stderr; the plot and the table are still written."""
    pytest.importorskip("matplotlib", reason="the `plot` extra (matplotlib) is not installed; "
                        "scripts/test.sh installs it")
    doc = _with_numbers(value, tmp_path / "r.json")
    res = _run("report", str(doc), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr and "matplotlib" not in res.stderr, res.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r.md", "r.png"]


def test_fetch_dry_run_refuses_a_workdir_under_a_file_as_the_real_run_does(
        tmp_path: Path) -> None:
    """``fetch --dry-run --workdir FILE/sub`` listed the trees it "would create"."""
    (tmp_path / "afile").write_text("the user's file\n")
    for extra in (["--dry-run"], ["--source", "sdist"]):
        res = _run("fetch", "--workdir", "afile/sub/w", *extra, cwd=tmp_path)
        _refused(res, 2, "afile/sub/w", "goes through a file")  # pass 38 c names it at the option
    assert (tmp_path / "afile").read_text() == "the user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "outside"]


@pytest.mark.parametrize("command", [
    ("build", "--dry-run", "--jobs"),
    ("build", "--dry-run", "--nvcc-threads"),
    ("bench", "decode", "--dry-run", "--max-model-len"),
    ("bench", "kernel", "--dry-run", "--max-model-len"),
    ("verify-kernel", "--jobs"),
], ids=["build-jobs", "nvcc-threads", "decode-max-model-len", "kernel-max-model-len",
        "verify-jobs"])
def test_a_count_past_an_int32_is_a_usage_error(tmp_path: Path,
                                                command: tuple[str, ...]) -> None:
    """The ninth pass (D): 10**30 was taken by these counts (ninja's -j, nvcc's --threads,
    vLLM's max_model_len and a pool's size are C ints) and planned."""
    res = _run(*command, str(10**30), "--workdir", str(tmp_path / "w"), cwd=tmp_path)
    _refused(res, 2, "2147483647")
    assert not (tmp_path / "w").exists()
