"""Issue 41, the fourteenth hostile pass (tester y: Slurm campaigns, reports and output
folders). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``write_new`` (verify's report, every exit record) opened its ``mktemp`` temporary by name
  with ``<>``, which follows a link: a link put at the temporary's name between ``mktemp`` and
  the open (a program that watches the folder, inotify, sees the new name at once) had the job
  write over the start of a file outside the campaign, ``chmod`` it, and rename the link into
  place as the report, exit 0. A hard link to a file outside put at the name did the same. Now
  what was opened must be the file at that name, with that one name, or the write is refused.
- ``--scratch`` in the campaign (refused from the thirteenth pass: a swap of its folder had a
  build job build and ``rm -rf`` outside) was refused only as typed: ``/x/../camp/s`` and
  ``//camp/s`` were planned, and ``$PWD/s``, a relative ``$SLURM_JOB_ID`` or a node TMPDIR in
  the campaign put the job's scratch there. Now the plan compares the normalised path, and the
  build job checks the folder its shell resolved before it makes or runs anything.
- A scratch base that cannot be a folder (a FIFO at the node's TMPDIR) failed the job with
  mkdir's "File exists" alone; now it is named with a fix.

The interleavings are forced with a bash DEBUG trap that does what the other process would do
at the one moment it must (as ``test_hostile_pass13_c``); everything else, the function the kit
writes into each job script and the files, is real."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from kvprefetch.slurm.shell import WRITE_NEW_SH
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_FUNC = "\n".join(WRITE_NEW_SH)


def _write_new(target: Path, debug_trap: str) -> subprocess.CompletedProcess[str]:
    """``echo data | write_new TARGET`` in bash, with ``debug_trap`` run before each simple
    command of the function's subshell (``set -T`` carries the trap into it)."""
    script = (f"{_FUNC}\nset -T\ntrap {shlex.quote(debug_trap)} DEBUG\n"
              f"echo data | write_new {shlex.quote(str(target))}\n")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          check=False)


@pytest.mark.parametrize("plant", ["ln -s", "ln"])
def test_write_new_never_writes_through_a_link_put_at_its_temporary(
        tmp_path: Path, outside: Path, plant: str) -> None:
    """Just before the temporary is opened, it is replaced by a symbolic link (or a hard link)
    to a file outside the campaign: the report was written over that file's first bytes and the
    link renamed into place as ``verify.json``, exit 0. Now the write is refused naming the
    temporary, and nothing is left in ``results/``."""
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    victim = outside / "notes.txt"
    # the step that opens the temporary: bash's `<>` before the fifteenth pass, `dd` since
    trap = (f'if [ -z "${{PLANTED:-}}" ] && '
            f'[[ $BASH_COMMAND == "exec 3"* || $BASH_COMMAND == "dd of="* ]]; then '
            f'PLANTED=1; rm -f -- "$tmp"; {plant} -- {shlex.quote(str(victim))} "$tmp"; fi')
    res = _write_new(results / "verify.json", trap)
    assert victim.read_text() == "keep me\n", "written outside the campaign"
    assert res.returncode != 0, res
    assert "refusing to write" in res.stderr and "new file of its own" in res.stderr, res.stderr
    assert list(results.iterdir()) == []


def _kit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"), TMPDIR=str(tmp_path))
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("spelling", ["{tmp}/x/../camp/scr", "/{tmp}/camp/scr", "{tmp}/./camp"])
def test_a_scratch_in_the_campaign_by_another_spelling_is_refused_at_the_plan(
        tmp_path: Path, spelling: str) -> None:
    """``--scratch`` in the campaign was refused as typed only: ``/x/../camp/scr``, ``//camp``
    and ``/./camp`` named the campaign and were planned (the thirteenth pass's refusal, which
    keeps a swap of the scratch's folder from having the job build and ``rm -rf`` outside)."""
    camp = tmp_path / "camp"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--scratch",
               spelling.format(tmp=tmp_path))
    assert res.returncode == 2, res
    assert "inside the campaign" in res.stderr and "To fix" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert not (camp / "campaign.json").exists()


@pytest.mark.parametrize(("scratch", "env"), [("$PWD/scr", {}), ("$SLURM_JOB_ID", {}),
                                         ("node", {"SLURM_TMPDIR": "{camp}/tmp"})])
def test_a_scratch_the_jobs_shell_puts_in_the_campaign_is_refused_by_the_job(
        tmp_path: Path, scratch: str, env: dict[str, str]) -> None:
    """A scratch whose folder only the job's shell knows: ``$PWD/scr`` (the job starts in the
    campaign), a relative ``$SLURM_JOB_ID``, a node TMPDIR set in the campaign. The plan took
    them, and the build job made its scratch in the campaign and ran ``fetch --workdir`` there.
    Now the job refuses before it makes or runs anything. The build script is run by bash as
    Slurm runs it (``SLURM_JOB_ID`` set), with ``--python`` a stand-in that logs each command
    the job runs with it (no real build is needed to see where the job would work)."""
    import os

    camp = tmp_path / "camp"
    ran = tmp_path / "ran.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {ran}\n')
    fake.chmod(0o755)
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--scratch", scratch,
               "--python", str(fake))
    assert res.returncode == 0, res.stderr
    job_env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    job_env.update({k: v.format(camp=camp) for k, v in env.items()}, SLURM_JOB_ID="7")
    res = subprocess.run(["bash", str(camp / "scripts" / "10-build-baseline.sbatch")],
                         env=job_env, capture_output=True, text=True, timeout=60, check=False)
    assert not ran.exists(), f"the build job ran the kit with its scratch in the campaign: " \
                             f"{ran.read_text()}"
    assert res.returncode == 2, res
    assert "refusing to build in" in res.stderr and "To fix" in res.stderr, res.stderr
    assert (camp / "logs" / "build-baseline-7.exit").read_text() == "2\n"
    assert not list(camp.rglob("kvprefetch-camp-build-*"))


def test_a_scratch_base_that_cannot_be_a_folder_is_named_with_a_fix(tmp_path: Path) -> None:
    """The node's TMPDIR (where ``--scratch node`` puts the build's folder) is a FIFO: the job
    failed with mkdir's "cannot create directory ...: File exists" alone. Now it says what the
    path is and what to do (exit 2), and runs nothing."""
    import os

    camp = tmp_path / "camp"
    ran = tmp_path / "ran.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {ran}\n')
    fake.chmod(0o755)
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--python", str(fake))
    assert res.returncode == 0, res.stderr
    os.mkfifo(tmp_path / "fifo")
    job_env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    job_env.update(SLURM_JOB_ID="8", SLURM_TMPDIR=str(tmp_path / "fifo"))
    res = subprocess.run(["bash", str(camp / "scripts" / "10-build-baseline.sbatch")],
                         env=job_env, capture_output=True, text=True, timeout=60, check=False)
    assert not ran.exists(), ran.read_text()
    assert res.returncode == 2, res
    assert "cannot be made a folder" in res.stderr and "To fix" in res.stderr, res.stderr
