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

Slurm is absent: the job scripts are run by bash as Slurm runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_hostile_pass19_b import _published_campaign, _run
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


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
