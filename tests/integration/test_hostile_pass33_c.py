"""Issue 41, the thirty-third hostile pass (tester c: every file the kit writes where the user
points it). Each test fails without its fix (checked by reverting ``src`` and running it):

- **Nsight Compute wrote its CSV through a link planted in the work directory.** ``bench ncu``
  gave ncu ``--log-file <out>/ncu-N-TREE.csv``, and ncu writes that file by path, following a
  symlink there and writing into a hard link's file: ``bench/ncu-1-baseline.csv`` planted as a
  link (of either kind) to a file outside the work directory had that file overwritten with
  ncu's CSV. ncu now writes into a private folder (``ownership.private_dir``, as ``git apply``
  and the compilers do), and the kit copies the CSV into ``<out>`` with ``confine.write_file``.
  No Nsight Compute here: the test's stand-in writes by path as ncu does (a shell ``>``).
- **The same for vLLM's result in ``bench e2e``**: vLLM writes ``--output-json`` by path, and
  a link (or hard link) planted at ``bench/e2e/runs/<env>-seqs<M>-r<R>.json`` had the file
  outside it names overwritten with the run's result. vLLM now writes into a private folder,
  and the kit copies the result into place. No vLLM here: pass 23 b's stand-in writes by path.
- **An output folder through a link and ``..`` made a folder nobody named.** ``confine
  .make_dirs`` folded ``..`` away by name (``os.path.abspath``) before it made the folders, where
  the kernel (and every later open) follows the link first: ``report --out L/../new`` (or
  ``export-header -o L/../new/x.cuh``, ``bench --out``, ``vmm bench --out``), with ``L`` a link to
  a folder elsewhere, made ``./new`` in the current folder (or, with more ``..``, in a folder
  above it: outside every folder the user named), then failed with "L/../new is a link to
  nothing, not a folder", which it is not. The folders are now made as ``mkdir -p`` makes them:
  the path as typed, ``..`` the kernel's.

Nothing else is mocked: the CLI runs for real on folders and links made here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass31_b import _env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

RESULT = (Path(__file__).resolve().parents[2] / "docs" / "results" / "2026-12-01-h200-decode"
          / "decode-qwen2.5-7b.json")


def _cli(tmp_path: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], cwd=cwd,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("dots", [1, 2])
def test_an_out_folder_through_a_link_and_dotdot_makes_no_folder_by_name(
        tmp_path: Path, dots: int) -> None:
    if not RESULT.is_file():
        pytest.skip(f"no committed result at {RESULT}")
    here = tmp_path / "a" / "here"
    there = tmp_path / "b" / "there" / "deep"
    here.mkdir(parents=True)
    there.mkdir(parents=True)
    (here / "L").symlink_to(there, target_is_directory=True)
    out = "L/" + "../" * dots + "new"
    res = _cli(tmp_path, here, "report", str(RESULT), "--out", out, "--formats", "md")
    text = res.stdout + res.stderr
    # without the fix: exit 7, "L/../new is a link to nothing, not a folder", and a folder
    # `new` made by name beside L (or in its parent), which nobody named
    assert res.returncode == 0, text
    assert "Traceback" not in text, text
    by_name = here.parent if dots == 2 else here
    assert not (by_name / "new").exists(), text
    # the folder the path names, as the kernel (and `mkdir -p`, `ls`) reads it
    meant = there.parent if dots == 1 else there.parent.parent
    assert (meant / "new" / "decode-qwen2.5-7b.md").is_file(), text


def _writing_ncu(tmp_path: Path) -> Path:
    """A stand-in for Nsight Compute (none on this machine): like ncu, it writes its CSV by the
    path ``--log-file`` names (a shell redirection, which follows a link there)."""
    ncu = tmp_path / "bin" / "writingncu"
    ncu.parent.mkdir(parents=True, exist_ok=True)
    ncu.write_text(
        "#!/bin/bash\n"
        'while [ $# -gt 0 ]; do [ "$1" = --log-file ] && f=$2; shift; done\n'
        "printf '%s\\n' '\"ID\",\"Process ID\",\"Kernel Name\",\"gpu__time_duration.sum\"' "
        "'\"\",\"\",\"\",\"ns\"' '\"0\",\"1\",\"paged_attention_v1_kernel\",\"1000\"' > \"$f\"\n")
    ncu.chmod(0o755)
    return ncu


@pytest.mark.parametrize("plant", ["symlink", "hardlink"])
def test_ncus_csv_is_never_written_through_a_link_planted_in_the_bench_folder(
        tmp_path: Path, outside: Path, plant: str) -> None:
    from tests.integration.test_hostile_pass10_r import _published_workdir

    wd = _published_workdir(tmp_path)
    (wd / "bench").mkdir()
    csv = wd / "bench" / "ncu-1-baseline.csv"
    if plant == "symlink":
        csv.symlink_to(outside / "notes.txt")
    else:
        csv.hardlink_to(outside / "notes.txt")
    res = _cli(tmp_path, tmp_path, "bench", "ncu", "--workdir", str(wd), "--ncu",
               str(_writing_ncu(tmp_path)), "--shape", "1x1k", "--formats", "json")
    text = res.stdout + res.stderr
    # without the fix: ncu's CSV written into notes.txt outside, through the planted link
    assert "Traceback" not in text, text
    assert (outside / "notes.txt").read_text() == "keep me\n"
    if plant == "symlink":  # refused, as every file the kit writes
        assert res.returncode == 7 and "is a symlink" in text and "To fix" in text, text
        return
    assert res.returncode == 0, text
    # ncu's CSV kept where it was before, now a file of its own
    assert csv.stat().st_nlink == 1, text
    assert "paged_attention_v1_kernel" in csv.read_text(), text


@pytest.mark.parametrize("plant", ["symlink", "hardlink"])
def test_vllms_result_is_never_written_through_a_link_planted_in_the_runs_folder(
        tmp_path: Path, outside: Path, plant: str) -> None:
    import json

    from tests.integration.test_hostile_pass23_b import _fake_vllm_python

    wd = tmp_path / "work"
    (wd / "verify").mkdir(parents=True)
    # a stand-in for an environment's vLLM (none here): like vLLM, it writes --output-json by
    # path (a shell `>`, which follows a link there)
    py = str(_fake_vllm_python(wd / "envs" / "baseline"))
    (wd / "verify" / "report.json").write_text(json.dumps({
        "passed": True, "envs": {"baseline": {"python": py}, "patched": {"python": py}}}))
    first = _cli(tmp_path, tmp_path, "bench", "e2e", "--workdir", str(wd), "--max-num-seqs",
                 "1", "--repeats", "1", "--formats", "json")
    assert first.returncode == 0, first.stdout + first.stderr
    results = sorted(p for p in wd.rglob("*.json") if "seqs" in p.name)
    assert results, list(wd.rglob("*"))
    target = results[0]
    target.unlink()
    if plant == "symlink":
        target.symlink_to(outside / "notes.txt")
    else:
        target.hardlink_to(outside / "notes.txt")
    res = _cli(tmp_path, tmp_path, "bench", "e2e", "--workdir", str(wd), "--max-num-seqs", "1",
               "--repeats", "1", "--formats", "json")
    text = res.stdout + res.stderr
    # without the fix: vLLM's result written into notes.txt outside, through the planted link
    assert "Traceback" not in text, text
    assert (outside / "notes.txt").read_text() == "keep me\n"
    if plant == "symlink":  # refused, as every file the kit writes
        assert res.returncode == 7 and "is a symlink" in text and "To fix" in text, text
        return
    assert res.returncode == 0, text
    assert target.stat().st_nlink == 1 and "tokens_per_second" in target.read_text(), text
