"""Issue 41, the thirty-fourth hostile pass (tester c: pass 33's fixes attacked, and ``bench``
end to end with stand-ins for ncu and vLLM). Each test fails without its fix (checked by
reverting ``src`` and running it):

- **A bench ``--out`` through a link and ``..`` inside the work directory split the run in
  two.** ``--out WD/L/../new`` (``L`` a link to a folder elsewhere) is lexically inside the
  work directory, so the confined acts below it (``make_dir``, the logs, the copied CSV and
  vLLM results) folded ``..`` by name and wrote into ``WD/new``, a folder nobody named, while
  the documents (and the programs' working folder) took the path as the kernel reads it:
  ``bench ncu`` left its CSVs and logs in ``WD/new`` and its ``ncu.json``/``ncu.md`` in the
  folder the path names; ``bench e2e`` failed with "No such file or directory / check the
  path and its file system" (vLLM's working folder was not there). ``bench.plan.output_dir``
  now reads the ``..`` of ``--out`` as the kernel does, before anything acts on it (as pass
  33 made ``confine.make_dirs`` do for an output outside every work directory).

Nothing is mocked: no Nsight Compute or vLLM here, so their stand-ins write by path as those
programs do (pass 33 c's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.test_hostile_pass31_b import _env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _cli(tmp_path: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], cwd=cwd,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120,
                          check=False)


def test_bench_e2e_out_through_a_link_and_dotdot_is_one_folder(tmp_path: Path) -> None:
    from tests.integration.test_hostile_pass23_b import _fake_vllm_python

    wd = tmp_path / "work"
    (wd / "verify").mkdir(parents=True)
    py = str(_fake_vllm_python(wd / "envs" / "baseline"))
    (wd / "verify" / "report.json").write_text(json.dumps({
        "passed": True, "envs": {"baseline": {"python": py}, "patched": {"python": py}}}))
    there = tmp_path / "elsewhere" / "deep"
    there.mkdir(parents=True)
    (wd / "L").symlink_to(there, target_is_directory=True)
    res = _cli(tmp_path, tmp_path, "bench", "e2e", "--workdir", str(wd), "--max-num-seqs", "1",
               "--repeats", "1", "--formats", "json", "--out", str(wd / "L" / ".." / "new"))
    text = res.stdout + res.stderr
    # without the fix: exit 7, "No such file or directory / check the path", and WD/new made
    assert "Traceback" not in text, text
    assert res.returncode == 0, text
    assert not (wd / "new").exists(), text
    meant = there.parent / "new"  # the folder the path names, as the kernel reads it
    assert (meant / "e2e.json").is_file(), text
    assert sorted(p.name for p in (meant / "e2e" / "runs").glob("*.json")) == [
        "baseline-seqs1-r0.json", "patched-seqs1-r0.json"], text


def test_bench_ncu_out_through_a_link_and_dotdot_is_one_folder(tmp_path: Path) -> None:
    from tests.integration.test_hostile_pass10_r import _published_workdir
    from tests.integration.test_hostile_pass33_c import _writing_ncu

    wd = _published_workdir(tmp_path)
    there = tmp_path / "elsewhere" / "deep"
    there.mkdir(parents=True)
    (wd / "L").symlink_to(there, target_is_directory=True)
    res = _cli(tmp_path, wd, "bench", "ncu", "--workdir", str(wd), "--ncu",
               str(_writing_ncu(tmp_path)), "--shape", "1x1k", "--formats", "json",
               "--out", "L/../new")
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == 0, text
    # without the fix: the CSVs and logs in WD/new (nobody named it), ncu.json beside L's target
    assert not (wd / "new").exists(), text
    meant = there.parent / "new"
    assert sorted(p.name for p in meant.iterdir()) == [
        "ncu-1-baseline.csv", "ncu-1-baseline.log", "ncu-1-patched.csv", "ncu-1-patched.log",
        "ncu.json"], text
