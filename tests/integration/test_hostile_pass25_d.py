"""Issue 41, the twenty-fifth hostile pass (tester d: the generated job scripts as they run on
a node, a real one-node Slurm under attack, and the jobs' environment allow-list,
``slurm/job_env.py``). Each test fails without its fix (checked by reverting ``src`` and
running it):

- Pass 24 refused a ``HOME`` whose ``.config``, ``.gitconfig``, ``.local``, ``.cache``, ...
  is in or reaches the campaign, but not one with the campaign *below* such a folder, where
  the same programs read their settings by a deeper name: with the campaign at
  ``~/.config/git``, submit and the job passed ``HOME``, and git (each bench task runs it for
  the kit's commit) read the campaign's ``config`` and ran its ``core.fsmonitor`` (shown with
  git on a repository here, 1 run of 1); at ``~/.cache/ccache`` or ``~/.local/lib/...`` the
  same for ccache's settings and Python's user site. And ``~/.ccache``, the folder ccache 4
  prefers to ``~/.cache/ccache`` where it exists, was not on the list at all: with
  ``CXX='ccache g++'`` (a form the kit accepts) and the campaign at ``~/.ccache``, ccache read
  the campaign's ``ccache.conf`` and ran its ``prefix_command`` before each compile (real
  ccache 4.14, 1 run of 1). Fixed first by refusing such a ``HOME``; since replaced by a
  ``HOME`` of each job's own, so that the user's is never read (test_job_home.py, which
  repeats both attacks against a job).
- A job's bash ran under whatever umask Slurm gave it: the one sbatch read, or
  ``SLURM_UMASK`` as the submitting shell set it (sbatch keeps one already set, and passes
  it whatever ``--export`` says, as every ``SLURM_*``), or a hand sbatch's. The kit adds
  world-write to its own umask (``cli.no_world_writable``), but only for itself: under
  ``0000`` the build job's ``mkdir -p`` made the scratch folders outside the campaign 0777,
  its own work directory in there 0777 (any local user could replace the tree it builds, or
  its records, before the kit's first line ran), and every job's exit record 0666 (1 run of
  1, the build script run under ``umask 000``). Now each script takes the kit's rule for its
  own umask as its first command after the re-run, and submit runs sbatch without the
  shell's ``SLURM_UMASK``, so Slurm's own log of each job is made under the kit's umask too
  (shown on a real one-node Slurm 22.05: with ``SLURM_UMASK=0000`` in the submitting shell
  the build job's work directory outside the campaign was 0777, the prepare job's exit record
  and both jobs' Slurm logs 0666).
- ``slurm plan --scratch '$_/x'`` was taken as naming a variable ``_``, which is bash's last
  argument, never the user's: the build job built nowhere, refusing "]/x" as a relative
  folder (wrong-way message, 1 run of 1). Now plan refuses it as it refuses ``$0`` or ``$$``.
- A build job whose scratch folder it could not make (the node's ``TMPDIR`` not writable,
  read-only or full; here ``/sys/kernel``, where nobody may make a folder) said "something is
  already there ... To fix: move <scratch> away", which names nothing there and moves
  nothing (wrong-way message, 1 run of 1). Now it says it cannot be made there, and why.

Slurm is absent in these tests: the job scripts are run by bash as Slurm runs them (from
``/``, with the environment given), as in passes 20 to 24."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass20_d import _SRC, _plan, _run
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def test_a_job_under_umask_000_makes_nothing_world_writable(
        tmp_path: Path, outside: Path) -> None:
    """The build job run as Slurm runs it with ``SLURM_UMASK=0000``: the scratch folders it
    makes (outside the campaign) and its exit record are not world-writable; the owner's
    bits and group's are as the umask gives."""
    camp = tmp_path / "camp"
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--batch", "1", "--python", sys.executable,
                          "--scratch", str(tmp_path / "node" / "new" / "deeper")],
                         env={**os.environ, "PYTHONPATH": str(_SRC), "TMPDIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    (tmp_path / "node").mkdir()
    for script, job in (("10-build-baseline.sbatch", "build-baseline"),
                        ("00-prepare.sbatch", "prepare")):
        res = subprocess.run(["bash", str(camp / "scripts" / script)],
                             env={"HOME": str(tmp_path), "SLURM_JOB_ID": "7",
                                  "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=120, check=False, cwd="/",
                             preexec_fn=lambda: os.umask(0))
        record = camp / "logs" / f"{job}-7.exit"
        assert record.exists(), res.stdout + res.stderr
        assert record.stat().st_mode & 0o777 == 0o664, oct(record.stat().st_mode)
    made = [tmp_path / "node" / "new", tmp_path / "node" / "new" / "deeper"]
    assert all(p.is_dir() for p in made), res.stdout + res.stderr
    assert [oct(p.stat().st_mode & 0o777) for p in made] == ["0o775", "0o775"]


def test_submit_runs_sbatch_without_the_shells_slurm_umask(tmp_path: Path) -> None:
    """sbatch sends a ``SLURM_UMASK`` already set in its environment in place of its own
    umask, and Slurm makes the job's log and runs the job under it: submit leaves it out (the
    sbatch here is a stand-in recording its environment)."""
    from tests.integration.test_hostile_pass21_b import _submit_with

    seen = tmp_path / "sbatch-env"
    res, calls = _submit_with(tmp_path, {"SLURM_UMASK": "0000"}, record_env=seen)
    assert res.returncode == 0, res.stderr
    assert calls.read_text().count("\n") == 6  # every job sent
    assert "SLURM_UMASK" not in seen.read_text()


@pytest.mark.parametrize("scratch", ["$_/x", "${_}/x"])
def test_plan_refuses_bashs_last_argument_as_a_scratch_variable(
        tmp_path: Path, outside: Path, scratch: str) -> None:
    """``$_`` names no variable of the user's: plan refuses it (exit 2, with a fix), as it
    refuses ``$0``; ``$_a`` (a variable) still plans."""
    env = {**os.environ, "PYTHONPATH": str(_SRC), "TMPDIR": str(tmp_path)}
    argv = [sys.executable, "-m", "kvprefetch", "slurm", "plan", "--stand-in", "--batch", "1",
            "--python", sys.executable, "--scratch"]
    res = subprocess.run([*argv, scratch, str(tmp_path / "camp")], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "uses $ for more than naming a variable" in res.stderr, res.stderr
    assert "To fix: pass node" in res.stderr, res.stderr
    assert not (tmp_path / "camp").exists()
    res = subprocess.run([*argv, "$_a/x", str(tmp_path / "camp2")], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_scratch_the_build_job_cannot_make_is_not_called_already_there(
        tmp_path: Path, outside: Path) -> None:
    """The build job with the node's scratch (``SLURM_TMPDIR``, where set) a folder nobody may
    make a folder in (``/sys/kernel``): exit 1, "cannot be made", with a fix; not "already
    there". (``TMPDIR`` is a writable folder: the job makes its own HOME there first, and
    refuses a ``TMPDIR`` where it cannot, test_job_home.py.)"""
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no /sys/kernel here")
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    node = tmp_path / "node"
    node.mkdir()
    res = _run(tmp_path, camp, "10-build-baseline.sbatch", TMPDIR=str(node),
               SLURM_TMPDIR="/sys/kernel")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "something is already there" not in res.stderr, res.stderr
    assert "it cannot be made in /sys/kernel (mkdir said why above" in res.stderr, res.stderr
    assert "To fix: free or make writable /sys/kernel" in res.stderr
    assert (camp / "logs" / "build-baseline-7.exit").read_text() == "1\n"
