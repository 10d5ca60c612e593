"""Issue 41, the thirty-sixth hostile pass (tester a: races, swaps and stops). Each test fails
without its fix (checked by reverting ``src`` and running it):

- **Another user's folder taken after all, by a race.** The thirty-fifth pass refused a new
  work directory or campaign that another user had made first, but looked before the
  ``mkdir -p`` only: ``nobody`` making and removing ``/tmp/st/camp`` in a loop won 1 ``slurm
  plan`` of 12 (the plan said it was written, into nobody's folder). The folder is now looked
  at again once it is there (``workspace/foreign.make_own_folder``).
- **A stopped ``fetch`` of a git repository left its half-made clone in the system temp
  folder.** GitPython's ``git clone`` is no child of ``runner.run``, so no stop reached it: the
  kit removed its private folder while git still checked files out into it (5 runs of 6 with
  SIGTERM 1.1 to 1.6 s in; INT and HUP too). It is now stopped and waited for first
  (``runner.stop_others``).
- **Two first plans of one campaign at once** took no lock (only a campaign already planned
  had one): both said "planned", and the campaign held the record of one and a job script of
  the other (a bench array of 6 tasks for a plan of 2 batches, 1 race in 12). The first plan
  now takes the campaign's lock too (``cli/slurm.plan``, ``slurm/folder.new_campaign_folder``).

What held (no test needed): renameat2 swap loops (``trees/<t>``, ``trees``, ``state``,
``state/<t>.json``, ``downloads``, ``pristine``, ``.locks``, ``.kvprefetch-owned.json``,
``trees/.patched.apply``) during ``clean --what all --discard-edits``, ``apply`` and ``fetch
--force``; INT, TERM, HUP, KILL at 0.3 to 3 s into ``fetch --source DIR`` (a git clone) and
``verify-kernel --no-gpu`` without a build; two commands at once (``fetch --force`` and ``clean
--what all``, ``apply`` and ``diff-upstream --check``, ``clean`` and ``apply``, ``fetch
--repair`` and ``apply``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder "
                                "another user owns (chown)")

# The real command line, with another user's ``mkdir`` landing just after the kit's first look
# at the folder (``refuse_foreign`` on a folder not there yet): the race's window, made certain.
_RACED_CLI = f"""
import os, sys
from pathlib import Path
import kvprefetch.workspace.foreign as foreign
first = foreign.refuse_foreign
def raced(folder, what):
    first(folder, what)
    if not os.path.lexists(folder):  # another user's mkdir wins the race
        os.mkdir(folder, 0o777)
        os.chown(folder, {NOBODY}, {NOBODY})
foreign.refuse_foreign = raced
sys.argv[0] = "kvprefetch"
from kvprefetch.__main__ import main
main()
"""


def _raced_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _RACED_CLI, *args], capture_output=True,
                          text=True, timeout=300, check=False, cwd="/")


@needs_root
def test_a_folder_another_user_makes_during_the_check_is_not_taken(
        tmp_path: Path, vllm_sdist: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    camp, work = shared / "camp", shared / "work"
    res = _raced_cli("slurm", "plan", "--stand-in", "--no-gpu", str(camp))
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "belongs to nobody" in out and "Traceback" not in out, out
    assert list(camp.iterdir()) == []  # nothing of the kit's in their folder
    res = _raced_cli("fetch", "--workdir", str(work), "--source", str(vllm_sdist))
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "belongs to nobody" in out and "Traceback" not in out, out
    assert list(work.iterdir()) == []  # and their folder is theirs still: not removed
    # no race: a folder of one's own is made and taken as before
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", "--stand-in",
                          "--no-gpu", str(shared / "mine")], capture_output=True, text=True,
                         timeout=300, check=False, cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr


def _clone_files(temp: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(temp))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_fetch_from_git_stopped_mid_checkout_leaves_nothing_in_the_temp_folder(
        tmp_path: Path, vllm_git_repo: tuple[Path, str], signum: int) -> None:
    repo, sha = vllm_git_repo
    temp = tmp_path / "systemp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    left = []
    for i in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvprefetch", "fetch", "--workdir", str(tmp_path / f"w{i}"),
             "--source", str(repo), "--allow-commit", sha], env=env, cwd="/",
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        # the stop comes once git checks files out into the clone (its objects are in)
        while proc.poll() is None and time.monotonic() < deadline:
            clones = list(temp.glob("kvprefetch-clone-*/vllm"))
            if clones and _clone_files(clones[0]) - _clone_files(clones[0] / ".git") > 20:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the fetch ended before its checkout was seen"
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode in (-signum, 128 + signum), out
        assert "Traceback" not in out, out
        time.sleep(0.5)  # anything still writing would show now
        left += [str(p) for p in temp.iterdir()]
    assert left == [], f"left in the system temp folder: {left}"


# The real command line, slowed down between the job scripts and the record (campaign.json):
# a second plan started then finds the first one's scripts and no record, every time.
_SLOW_RECORD_CLI = """
import sys, time
import kvprefetch.slurm.folder as folder
save = folder.save_record
def slow(*args, **kwargs):
    time.sleep(3)
    return save(*args, **kwargs)
folder.save_record = slow
sys.argv[0] = "kvprefetch"
from kvprefetch.__main__ import main
main()
"""


def test_two_first_plans_of_one_campaign_never_mix_their_scripts(tmp_path: Path) -> None:
    plan = ["slurm", "plan", "--stand-in", "--no-gpu"]
    camp = tmp_path / "camp"
    first = subprocess.Popen([sys.executable, "-c", _SLOW_RECORD_CLI, *plan, str(camp),
                              "--batch", "1,2,3,4,5,6"], cwd="/", stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (camp / "scripts" / "40-merge.sbatch").exists() and first.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.poll() is None, "the first plan ended before its scripts were seen"
    second = subprocess.run([sys.executable, "-m", "kvprefetch", *plan, str(camp), "--batch",
                             "1,2"], cwd="/", capture_output=True, text=True, timeout=300,
                            check=False)
    out = second.stdout + second.stderr
    # refused by the lock the first one holds (exit 8, naming it), never "not empty, plan
    # into a new folder" nor "a script not written by plan": both plans were the kit's
    assert second.returncode == 8, out
    assert "is already working on the campaign" in out and "Traceback" not in out, out
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    record = json.loads((camp / "campaign.json").read_text())["plan"]
    assert record["bench"]["batches"] == [1, 2, 3, 4, 5, 6]
    assert "--array=0-5" in (camp / "scripts" / "30-bench.sbatch").read_text()
    # and the next plan, once the first is done, plans the campaign again (the lock was let go)
    again = subprocess.run([sys.executable, "-m", "kvprefetch", *plan, str(camp), "--batch",
                            "1,2"], cwd="/", capture_output=True, text=True, timeout=300,
                           check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "--array=0-1" in (camp / "scripts" / "30-bench.sbatch").read_text()
