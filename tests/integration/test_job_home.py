"""Issue 41's design step after the twenty-fifth hostile pass: each campaign job runs with a
``HOME`` of its own, never the user's.

A job's programs read settings, and run code, from ``HOME``: git (``~/.config/git/config``,
``~/.gitconfig``: ``core.fsmonitor``), ccache (``~/.ccache/ccache.conf``:
``prefix_command``), Python's user site (``~/.local/lib``), pip, matplotlib, triton and
CUDA's JIT cache. sbatch passed the user's ``HOME``, and passes 24 and 25 refused one with the
campaign in or below each such folder as it was found, a list that grew each pass: a campaign
at ``~/.config``, ``~/.config/git`` or ``~/.ccache`` had git's fsmonitor or ccache's
``prefix_command`` run, planted by whoever can write the campaign. Now ``HOME`` is not passed;
each job makes a new folder (0700, in the ``TMPDIR`` it has checked) for it and removes it as it
ends, so nothing of the user's ``HOME``, wherever the campaign is, reaches a job. The one
setting a job needed from there, the package index the user's pip names, travels from submit
as ``PIP_INDEX_URL``.

Slurm is absent here: the job scripts are run by bash as Slurm runs them (from ``/``, with the
environment given), as in passes 20 to 25; the jobs' interpreter is a stub that records what
it sees."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass20_d import _plan, _run
from tests.integration.test_hostile_pass22_d import _dry_run
from tests.integration.test_hostile_pass24_d import git_reads_its_config_there
from tests.integration.test_job_env import _submit_env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _home_stub(tmp_path: Path, repo: Path) -> tuple[Path, Path]:
    """The jobs' "interpreter": it records its HOME and that folder's mode, then runs git in
    ``repo`` (and ccache where installed), as a job's programs do."""
    seen, py = tmp_path / "seen", tmp_path / "python"
    lines = ["#!/bin/bash", f'{{ printf "%s\\n" "$HOME"; stat -c %a -- "$HOME"; }} > {seen}',
             f"git -C {repo} status --porcelain >/dev/null 2>&1 || true"]
    if shutil.which("ccache"):
        lines.append(f"(cd {tmp_path} && ccache cc -c t.c -o t.o) >/dev/null 2>&1 || true")
    py.write_text("\n".join(lines) + "\n")
    py.chmod(0o755)
    (tmp_path / "t.c").write_text("int main(void) { return 0; }\n")
    return seen, py


@pytest.mark.parametrize("below", [".config/git", ".config", ".ccache", ".local/lib/site",
                                   "camp"])
def test_a_job_never_reads_the_users_home_wherever_the_campaign_is(
        tmp_path: Path, outside: Path, below: str) -> None:
    """The campaign at ``~/.config/git`` (then ``~/.config``, ``~/.ccache``, Python's user
    site, a plain ``~/camp``), git's ``core.fsmonitor`` and ccache's ``prefix_command``
    planted in it: with the user's ``HOME`` git runs the fsmonitor (what was at stake). Submit
    sends the jobs; the merge job's programs get a ``HOME`` that is a new 0700 folder in the
    node's ``TMPDIR``, not the user's, so neither planted command runs; the folder is gone when
    the job has ended, and the job records its exit."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    home, node = tmp_path / "h", tmp_path / "node"
    camp = home / below
    camp.parent.mkdir(parents=True)
    node.mkdir()
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True,
                   capture_output=True)
    seen, py = _home_stub(tmp_path, tmp_path / "repo")
    _plan(tmp_path, camp, python=str(py))
    ran, prefix_ran = tmp_path / "fsmonitor-ran", tmp_path / "prefix-ran"
    git_folder = {".config/git": camp, ".config": camp / "git"}.get(below)
    if git_folder is not None:
        git_folder.mkdir(exist_ok=True)
        git_reads_its_config_there(tmp_path, home, git_folder)
        ran.unlink()
    if below == ".ccache":
        evil = camp / "evil"
        evil.write_text(f'#!/bin/sh\necho ran >> {prefix_ran}\nexec "$@"\n')
        evil.chmod(0o755)
        (camp / "ccache.conf").write_text(f"prefix_command = {evil}\n")
    res = _dry_run(tmp_path, camp, HOME=str(home))
    assert res.returncode == 0, res.stdout + res.stderr
    res = _run(tmp_path, camp, "40-merge.sbatch", HOME=str(home), TMPDIR=str(node))
    assert res.returncode == 0, res.stdout + res.stderr
    job_home, mode = seen.read_text().splitlines()
    assert Path(job_home).parent == node and job_home != str(home), job_home
    assert Path(job_home).name.startswith("kvprefetch-home."), job_home
    assert mode == "700", mode
    assert not os.path.lexists(job_home), "the job's HOME was left behind"
    assert not ran.exists(), "git ran the fsmonitor planted in the campaign"
    assert not prefix_ran.exists(), "ccache ran the prefix_command planted in the campaign"
    assert (camp / "logs" / "merge-7.exit").read_text() == "0\n"
    assert list(node.iterdir()) == []


def test_a_job_that_cannot_make_its_home_says_where_and_why(
        tmp_path: Path, outside: Path) -> None:
    """A node ``TMPDIR`` where no folder can be made (``/sys/kernel``): the job refuses, exit 2,
    naming the folder and a fix, and records its end."""
    camp = tmp_path / "camp"
    seen, py = _home_stub(tmp_path, tmp_path)
    _plan(tmp_path, camp, python=str(py))
    res = _run(tmp_path, camp, "40-merge.sbatch", TMPDIR="/sys/kernel")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "refusing to run: the job's own HOME could not be made in /sys/kernel" in res.stderr
    assert "To fix: free or make writable /sys/kernel, or submit with TMPDIR" in res.stderr
    assert (camp / "logs" / "merge-7.exit").read_text() == "2\n"
    assert not seen.exists(), "the kit ran without its HOME"


def _env_sbatch(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in sbatch (Slurm is absent here) that notes the PIP_INDEX_URL it was run with
    (sbatch passes it on: job_env.PASSED) and answers a job id."""
    bin_dir, got = tmp_path / "slurm-bin", tmp_path / "index-urls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/bash\nprintf "%s\\n" "${{PIP_INDEX_URL-unset}}" >> {got}\necho 101\n')
    (bin_dir / "sbatch").chmod(0o755)
    return bin_dir, got


def _submit(tmp_path: Path, bin_dir: Path, home: Path, *args: str,
            **extra: str) -> subprocess.CompletedProcess[str]:
    """``kvprefetch slurm ARGS`` with ``HOME=home`` and none of this shell's pip settings."""
    env = {k: v for k, v in _submit_env(tmp_path, bin_dir, HOME=str(home)).items()
           if not k.startswith(("PIP_", "XDG_CONFIG"))}
    return subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", *args], env=env | extra,
                          capture_output=True, text=True, timeout=120, check=False)


def test_submit_sends_the_index_the_users_pip_names(tmp_path: Path, outside: Path) -> None:
    """The user's pip names a mirror in ``~/.config/pip/pip.conf``, which a job's own HOME
    lacks: every sbatch is run with ``PIP_INDEX_URL`` set to it (the prepare job downloads
    from there); a ``PIP_INDEX_URL`` in the shell wins; a pip setting that is no URL is refused
    before any sbatch, naming it, with a fix."""
    camp, home = tmp_path / "camp", tmp_path / "h"
    (home / ".config" / "pip").mkdir(parents=True)
    conf = home / ".config" / "pip" / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n")
    _plan(tmp_path, camp)
    bin_dir, got = _env_sbatch(tmp_path)
    res = _submit(tmp_path, bin_dir, home, "submit", str(camp))
    assert res.returncode == 0, res.stdout + res.stderr
    sent = got.read_text().splitlines()
    assert len(sent) >= 5 and set(sent) == {"https://mirror.example/simple"}, sent
    got.unlink()
    res = _submit(tmp_path, bin_dir, home, "resubmit", str(camp), "prepare",
                  PIP_INDEX_URL="https://shell.example/s")
    assert res.returncode == 0, res.stdout + res.stderr
    assert got.read_text().splitlines() == ["https://shell.example/s"]
    got.unlink()
    conf.write_text("[global]\nindex-url = https://mirror example/simple\n")
    res = _submit(tmp_path, bin_dir, home, "resubmit", str(camp), "prepare")
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out, out
    assert "global.index-url" in out and "To fix" in out, out
    assert not got.exists(), "sbatch was run"
