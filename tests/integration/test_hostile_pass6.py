"""Issue 41, the sixth hostile pass: what still wrote outside the work directory, or gave a
traceback or a wrong-way message. Each test fails without its fix (checked with the fixes
stashed):

- ``TMPDIR`` empty, relative, a FIFO or a file: the kit handed it to nvcc as it was, and nvcc
  builds its temporaries' names by plain concatenation; ``TMPDIR= kvprefetch build --dry-run``
  (doctor's compile probe) left about 2.5 MB of ``/tmpxft_*`` files in ``/``, and a FIFO or a
  file made doctor say "use a CUDA toolkit >= 12.8". Now ``runner.run`` refuses a child
  ``TMPDIR`` that is not an absolute path to a writable directory, naming it;
- a verify cache entry (``verify/cache/<sha256>.json``) with its digest recomputed over fields
  of the wrong type: a count of ``Infinity`` was an OverflowError traceback, and a count of
  text, a head size that is a list, a flag that is text or a kernel list that is a string was a
  cache hit handed to the checks. Now every field must have its type, or the entry is a miss;
- ``slurm submit`` killed (or its sbatch failing) part-way: the next submit said "already
  submitted ... resubmit a failed job", naming only the jobs sent, never the ones that were
  not. Now it names the jobs not sent, the ``squeue`` check for one sent but not recorded, and
  the ``resubmit`` of each, in order;
- ``export-header -o``, ``report --out`` and ``slurm plan`` on a read-only file system: "To
  fix: pass a writable --workdir" (an option ``report`` and ``slurm plan`` do not have), and
  the path named was the bare temporary (``.x.cuh.tmp-…``), no folder. Now the full path, and
  a fix naming the read-only folder and every option that chooses one.

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvprefetch.errors import SlurmError
from tests.integration.helpers import kvprefetch_cli_split, tree_bytes
from tests.integration.test_reliability import _env, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                 if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def _root_tmpxft() -> set[str]:
    return {n for n in os.listdir("/") if n.startswith("tmpxft")}


@pytest.mark.skipif(_NVCC is None, reason="doctor's compile probe needs nvcc")
@pytest.mark.parametrize("kind", ["empty", "relative", "fifo", "file"])
def test_a_tmpdir_that_is_no_writable_folder_is_refused_before_nvcc_runs(
        tmp_path: Path, kind: str) -> None:
    """An empty TMPDIR made nvcc write its temporaries into / during a dry run."""
    value = {"empty": "", "relative": "tmp", "fifo": str(tmp_path / "fifo"),
             "file": str(tmp_path / "file")}[kind]
    if kind == "fifo":
        os.mkfifo(value)
    if kind == "file":
        Path(value).write_text("x\n")
    (tmp_path / "cwd").mkdir()
    before = _root_tmpxft()
    env = {**_env(), "TMPDIR": value}
    for args in (["doctor"], ["build", "--dry-run"]):
        res = kvprefetch_cli_split(*args, "--workdir", str(tmp_path / "wd"), env=env,
                                   cwd=tmp_path / "cwd", timeout=300)
        refused(res, 2, f"TMPDIR={value!r}", "unset TMPDIR")
    assert _root_tmpxft() <= before, "nvcc wrote its temporaries into /"
    assert list((tmp_path / "cwd").iterdir()) == []


# a twin's template arguments as verify records them (facts._TWIN_TYPES: an entry whose twin
# lacks them is a miss since the thirty-sixth pass, so the entry as written would be no hit)
_TWIN = {"version": "v2", "dtype": "fp16", "kv_cache": "auto", "head_size": 128,
         "block_size": 16, "group": 4, "split": 512, "staged": True, "fused": False}


def _cache_entry() -> tuple[Any, dict[str, Any], dict[str, str | None]]:
    from kvprefetch.verify import facts
    from kvprefetch.verify.cubin import Module
    from kvprefetch.verify.sass import KernelSass

    key = ("sm_90", "_Z1f")
    sass = facts.SassFacts((KernelSass("sm_90", "_Z1f", "v1", "fp16", "auto", 128, 16, False,
                                       3, 0),),
                           {key: "ab"}, {key: 1}, {key: (_TWIN, 1, 2)}, {key: (True, False)},
                           {key: 1})
    elf = facts.ElfFacts((Module("sm_90", ("_Z1f",), True, ("s",), (("_Z1f", 128),)),))
    tools: dict[str, str | None] = {"cuobjdump": "12.8"}
    entry = json.loads(json.dumps(facts.entry(facts.LibraryFacts("a" * 64, sass, elf), tools)))
    return facts, entry, tools


@pytest.mark.parametrize(("where", "value"), [
    (("sass", "readonly", 0, 2), float("inf")),
    (("sass", "twins", 0, 2, 1), float("inf")),
    (("elf", "modules", 0, "max_threads"), [["k", float("inf")]]),
    (("sass", "kernels", 0, "ublkpf"), "many"),
    (("sass", "kernels", 0, "head_size"), [1]),
    (("sass", "kernels", 0, "block_sparse"), "no"),
    (("sass", "pdl", 0, 2), "ab"),
    (("elf", "modules", 0, "kernels"), "abc"),
    (("elf", "modules", 0, "constant_bank"), "no"),
    (("sass_error",), 5),
])
def test_a_verify_cache_entry_with_a_recomputed_digest_and_a_wrong_type_is_a_miss(
        tmp_path: Path, where: tuple[Any, ...], value: Any) -> None:
    facts, entry, tools = _cache_entry()
    (tmp_path / f"{'a' * 64}.json").write_text(json.dumps(entry))
    assert facts.load_cached(tmp_path, "a" * 64, tools) is not None  # the entry as written
    node = entry["payload"]
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    entry["digest"] = facts._digest(entry["payload"])
    (tmp_path / f"{'a' * 64}.json").write_text(json.dumps(entry))
    assert facts.load_cached(tmp_path, "a" * 64, tools) is None


def test_a_submit_stopped_part_way_names_the_jobs_never_sent(tmp_path: Path) -> None:
    """A submit killed after its fourth sbatch: rerun, it named only the four jobs sent."""
    camp = tmp_path / "camp"
    res = kvprefetch_cli_split("slurm", "plan", str(camp), "--source", "sdist", "--python",
                               "/bin/true", env=_env(), timeout=60)
    assert res.returncode == 0, res.stderr
    fake = tmp_path / "bin"
    fake.mkdir()
    count = tmp_path / "n"
    (fake / "sbatch").write_text(  # the fifth call fails, as a kill there would leave it
        f"#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 100); n=$((n+1)); echo $n > {count}\n"
        f"echo \"$*\" >> {tmp_path}/sbatch.log\n[ $n -eq 105 ] && exit 1\necho $n\n")
    # resubmit asks the controller whether each prerequisite has completed; a machine without
    # Slurm has no scontrol (a fresh one failed here: the suite's real-Slurm test installs it
    # only later), so the jobs sent are still pending, as they would be right after a submit
    (fake / "scontrol").write_text('#!/bin/sh\necho "JobId=$4 JobName=x JobState=PENDING '
                                   'ExitCode=0:0 Reason=Dependency"\n')
    for tool in ("sbatch", "scontrol"):
        (fake / tool).chmod(0o755)
    env = {**_env(), "PATH": f"{fake}:{os.environ['PATH']}"}
    res = kvprefetch_cli_split("slurm", "submit", str(camp), env=env, timeout=60)
    assert res.returncode == SlurmError.exit_code, res.stderr
    res = kvprefetch_cli_split("slurm", "submit", str(camp), env=env, timeout=60)
    refused(res, SlurmError.exit_code, "stopped part-way", "bench, merge not", "squeue",
            f"kvprefetch slurm resubmit {camp} bench")
    for job in ("bench", "merge"):  # the fix it names works
        res = kvprefetch_cli_split("slurm", "resubmit", str(camp), job, env=env, timeout=60)
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "sbatch.log").read_text().splitlines()[-1].endswith("40-merge.sbatch")
    res = kvprefetch_cli_split("slurm", "submit", str(camp), env=env, timeout=60)
    refused(res, SlurmError.exit_code, "already submitted")


def test_a_read_only_output_folder_is_named_with_the_right_fix(
        tmp_path: Path, fetched_template: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(ro)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        (ro / "out").mkdir()
        (tmp_path / "r.json").write_text('{"kind": "nothing"}\n')
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        before = tree_bytes(ro)
        for args in (["export-header", "--workdir", str(fetched_template), "-o",
                      str(ro / "out" / "x.cuh")],
                     ["slurm", "plan", str(ro / "out" / "camp"), "--source", "sdist"]):
            res = kvprefetch_cli_split(*args, env=_env(), timeout=120)
            refused(res, res.returncode, "Read-only file system", f"{ro / 'out'}",
                    "-o/--out or campaign folder")
            assert "pass a writable --workdir" not in res.stderr
        assert tree_bytes(ro) == before
    finally:
        subprocess.run(["umount", str(ro)], check=False)
