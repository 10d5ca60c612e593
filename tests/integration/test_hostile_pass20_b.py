"""Issue 41, the twentieth hostile pass (tester b: campaigns from the command line, reports and
outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- The nineteenth pass made the command line refuse a campaign's ``work`` link (the verify job
  runs ``verify-kernel --workdir <campaign>/work``, and the command line follows a
  ``--workdir`` link once, a location the user names being trusted). It knew a campaign's
  ``work`` by the ``campaign.json`` beside it. Whoever writes the campaign can move that file
  away as well: with ``campaign.json`` renamed and ``work/`` a link to a folder outside (the
  user's other work directory, with its builds), the verify job followed the link and wrote
  ``verify/report.json`` and ``report.txt`` there, exit 6 (1 run of 1; a dangling
  ``campaign.json`` link the same). Now every job's script exports ``KVPREFETCH_CAMPAIGN``
  (``slurm.campaign.JOB_ENV``), and a job's ``--workdir`` that is a link is refused whatever
  else the campaign holds (exit 2, with a fix).
- The nineteenth pass also made ``confine`` open a root's own last part ``O_NOFOLLOW`` (a
  root the command line resolved cannot be a link unless one was swapped in). A campaign is a
  root, and its argument was not resolved: ``slurm submit LINK`` and ``resubmit LINK``, with
  ``LINK`` the user's own link to the campaign, said a folder "became a symlink ... another
  process is changing the work directory", a race nobody ran, and sent nothing (exit 2; 2 runs
  of 2). Now the campaign argument is followed once at the command line, as ``--workdir`` is.

Slurm is absent: the job scripts are run by bash as Slurm runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass19_b import _published_campaign, _run
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"


def _tree(folder: Path) -> dict[str, bytes | str]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink()
                                         else "link" if p.is_symlink() else "dir")
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("record", ["moved away", "a dangling link"])
def test_the_verify_job_follows_no_work_link_when_campaign_json_is_gone(
        tmp_path: Path, outside: Path, record: str) -> None:
    """The verify job with the campaign's published work/ moved out, a link to it in its place,
    and campaign.json moved away (or a dangling link): nothing is written behind the link, and
    the job names it with a fix."""
    camp = _published_campaign(tmp_path)
    victim = tmp_path / "victim-work"
    (camp / "work").rename(victim)
    (camp / "work").symlink_to(victim, target_is_directory=True)
    (camp / "campaign.json").rename(tmp_path / "campaign.json.aside")
    if record == "a dangling link":
        (camp / "campaign.json").symlink_to(tmp_path / "nowhere")
    before = _tree(victim)
    res = _run(tmp_path, camp, "20-verify.sbatch")
    assert _tree(victim) == before, "the verify job wrote into the folder the link named"
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{camp / 'work'} is a symlink" in res.stderr, res.stderr
    assert "To fix: remove the symlink" in res.stderr
    assert "Traceback" not in res.stdout + res.stderr


def _fake_slurm(tmp_path: Path) -> Path:
    """A folder with an ``sbatch`` that answers increasing job ids and an ``scontrol`` that
    calls every job pending (no Slurm here)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/bash\nf=\"$(dirname \"$0\")/.n\"; n=$(cat \"$f\" 2>/dev/null || echo 100)\n"
        "n=$((n + 1)); echo \"$n\" > \"$f\"; echo \"$n\"\n")
    (bin_dir / "scontrol").write_text(
        "#!/bin/bash\necho \"JobId=$4 JobState=PENDING Reason=None ExitCode=0:0\"\n")
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    return bin_dir


def _kit(tmp_path: Path, *args: str, path: str = "/usr/bin:/bin"
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), HOME=str(tmp_path), PATH=path)
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False, cwd="/")


def test_a_campaign_named_through_the_users_link_is_submitted(tmp_path: Path,
                                                               outside: Path) -> None:
    """``slurm submit`` and ``resubmit`` of a campaign named through the user's own link to
    it: the link is followed once, as a ``--workdir`` link is, and the jobs are sent (was: "a
    folder on the way became a symlink ... another process is changing the work directory",
    exit 2, nothing sent)."""
    camp, link = tmp_path / "camp", tmp_path / "mine"
    bin_dir = _fake_slurm(tmp_path)
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1",
               "--python", sys.executable)
    assert res.returncode == 0, res.stdout + res.stderr
    link.symlink_to(camp, target_is_directory=True)
    path = f"{bin_dir}:/usr/bin:/bin"
    res = _kit(tmp_path, "slurm", "submit", str(link), "--json", path=path)
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads((camp / "campaign.json").read_text())
    assert sorted(rec["submitted"]) == ["bench", "build-baseline", "build-patched", "merge",
                                        "prepare", "verify"]
    res = _kit(tmp_path, "slurm", "resubmit", str(link), "merge", path=path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(json.loads((camp / "campaign.json").read_text())["submitted"]["merge"]) == 2
    assert "Traceback" not in res.stdout + res.stderr
