"""Issue 41, the eleventh hostile pass (tester t: campaigns end to end on a real one-node Slurm,
Debian's slurm-wlm 22.05 with its own munged, slurmctld and slurmd, set up by hand as
``tests/integration/test_slurm.py``'s fixture does). Each test fails without its fix (checked by
reverting ``src`` and running it):

- Slurm opens each job's ``--output`` itself, by path, following links, truncating: links
  planted at the next job ids' names in ``logs/`` (``prepare-2.out``, ...; the ids are
  sequential) had the real Slurm overwrite three files outside the campaign with the jobs'
  output. Each submit and resubmit then sent its jobs' output into a folder of its own it had
  just made (``logs/sbatch-<time>-<random>/``); now Slurm's output is ``/dev/null`` and the
  job writes its own log (``slurm/joblog.py``).

The tests here run the kit for real; where they need Slurm they use a fake ``sbatch`` on PATH
that does what the real one was seen to do (each test says which part), so they run without
root and daemons. The autouse ``outside`` fixture checks that a folder outside the campaign is
byte-identical afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_REPO = Path(__file__).resolve().parents[2]

# A fake sbatch that handles --output as slurmstepd does (seen on the real Slurm of this pass):
# the job's output file is the command line's --output, else the script's `#SBATCH --output`,
# with %j (%A_%a for an array task) replaced by the id, opened by path (links followed) and
# truncated; the id is the next of a counter; nothing of the job itself is run.
_SBATCH = r'''#!/usr/bin/env python3
import fcntl, re, sys
from pathlib import Path
counter = Path(sys.argv[0]).parent.parent / "sbatch-counter"
with open(counter.with_suffix(".lock"), "w") as lock:  # two sbatch at once take two ids
    fcntl.flock(lock, fcntl.LOCK_EX)
    n = int(counter.read_text()) + 1 if counter.exists() else 101
    counter.write_text(str(n))
args, script = sys.argv[1:-1], Path(sys.argv[-1])
out = next((a.split("=", 1)[1] for a in args if a.startswith("--output=")), None)
lines = script.read_text().splitlines()
if out is None:
    out = next(l.split("=", 1)[1] for l in lines if l.startswith("#SBATCH --output="))
arrays = [a.split("=", 1)[1] for a in args if a.startswith("--array=")] or \
    [l.split("=", 1)[1] for l in lines if l.startswith("#SBATCH --array=")]
tasks = [str(t) for t in range(int(arrays[0].split("-")[0]), int(arrays[0].split("-")[-1]) + 1)] \
    if arrays else [None]
for t in tasks:
    path = out.replace("%A", str(n)).replace("%a", t or "").replace("%j", str(n))
    with open(path, "w") as f:
        f.write(f"output of job {n}\n")
print(f"{n};cluster")
'''


def _fake_slurm(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(_SBATCH)
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "JobId=$4 JobState=PENDING '
                                      'Reason=Dependency ExitCode=0:0"\n')
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    return bin_dir


def _kit(tmp_path: Path, *args: str,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(_env(), PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), **(env or {}))
    env["PATH"] = f"{tmp_path / 'bin'}:{env.get('PATH', '')}"
    try:
        return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kvprefetch {args!r} hung")


def test_slurms_own_output_never_goes_through_a_link_planted_at_the_next_job_id(
        tmp_path: Path, outside: Path) -> None:
    """Links planted at ``logs/<job>-<id>.out`` for the ids Slurm gives next (101..130, every
    job, both bench tasks), pointing at files outside, then ``submit`` and a ``resubmit`` of one
    bench task: Slurm (here the fake sbatch, which opens --output as the real slurmstepd did)
    wrote the jobs' output through them. Now Slurm's output is /dev/null, and the planted links
    are left as they are."""
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1,8")
    assert res.returncode == 0, res.stderr
    logs = camp / "logs"
    planted = []
    for i in range(101, 131):
        for job in ("prepare", "build-baseline", "build-patched", "verify", "merge"):
            planted.append(logs / f"{job}-{i}.out")
            planted[-1].symlink_to(outside / "notes.txt")
        for t in (0, 1):
            planted.append(logs / f"bench-{i}_{t}.out")
            planted[-1].symlink_to(outside / "patched" / "deep" / "thesis.tex")
    for args in (("submit", str(camp)), ("resubmit", str(camp), "bench", "--task", "1")):
        res = _kit(tmp_path, "slurm", *args)
        assert res.returncode == 0, res.stderr
        assert "Traceback" not in res.stderr
    assert all(p.is_symlink() for p in planted)
    rec = json.loads((camp / "campaign.json").read_text())
    outputs = [a for subs in rec["submitted"].values() for s in subs for a in s["argv"]
               if a.startswith("--output=")]
    # Slurm's own output is /dev/null since the job writes its own log (slurm/joblog.py; a
    # fresh folder per submission, this pass's first answer, could still be swapped: the
    # twenty-fifth pass); tests/integration/test_job_log.py starts the jobs themselves
    assert len(outputs) == 7 and set(outputs) == {"--output=/dev/null"}, outputs


# scontrol -o show job, as the real Slurm 22.05 answered after `scancel` of build-patched: only
# verify is DependencyNeverSatisfied, bench and merge stay PENDING (Dependency) for ever
_SCONTROL_AFTER_A_CANCEL = r'''#!/bin/bash
case "$4" in
101) echo "JobId=101 JobState=COMPLETED Reason=None Dependency=(null) ExitCode=0:0";;
102) echo "JobId=102 JobState=COMPLETED Reason=None Dependency=(null) ExitCode=0:0";;
103) echo "JobId=103 JobState=CANCELLED Reason=None Dependency=(null) ExitCode=0:15";;
104) echo "JobId=104 JobState=PENDING Reason=DependencyNeverSatisfied" \
       "Dependency=afterok:102(unfulfilled),afterok:103(failed) ExitCode=0:0";;
105) echo "JobId=105 ArrayJobId=105 ArrayTaskId=0-1 JobState=PENDING Reason=Dependency" \
       "Dependency=afterok:104(unfulfilled) ExitCode=0:0";;
106) echo "JobId=106 JobState=PENDING Reason=Dependency" \
       "Dependency=afterok:105_*(unfulfilled) ExitCode=0:0";;
*) echo "slurm_load_jobs error: Invalid job id specified"; exit 1;;
esac
'''


def test_status_wait_ends_when_the_next_stages_can_never_run(tmp_path: Path) -> None:
    """A build cancelled (``scancel``) on the real Slurm: verify is DependencyNeverSatisfied
    (NEVER), but bench and merge, waiting on verify and bench, stay PENDING (Dependency) for
    ever, and ``status --wait`` waited out its whole ``--timeout`` (an hour by default) to say
    "wait longer". Now a job pending on one that will not complete is NEVER, and the wait ends
    at once (exit 10) naming it. The fake scontrol prints the real one's lines (its
    ``Dependency`` field included) for the six jobs."""
    import time

    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    for args in (("plan", str(camp), "--stand-in", "--batch", "1,8"), ("submit", str(camp))):
        res = _kit(tmp_path, "slurm", *args)
        assert res.returncode == 0, res.stderr
    (tmp_path / "bin" / "scontrol").write_text(_SCONTROL_AFTER_A_CANCEL)
    t0 = time.monotonic()
    res = _kit(tmp_path, "slurm", "status", str(camp), "--wait", "--timeout", "40", "--json")
    took = time.monotonic() - t0
    assert "Traceback" not in res.stderr
    assert res.returncode == 10, res.stderr
    assert took < 20, f"waited {took:.0f} s for jobs that can never run: {res.stderr}"
    states = {s["job"]: s for s in json.loads(res.stdout)}
    assert {j: s["state"] for j, s in states.items()} == {
        "prepare": "COMPLETED", "build-baseline": "COMPLETED", "build-patched": "CANCELLED",
        "verify": "NEVER", "bench": "NEVER", "merge": "NEVER"}
    assert "verify 104" in states["bench"]["reason"], states["bench"]
    assert "not completed" in res.stderr and "resubmit" in res.stderr


def test_a_controller_that_does_not_answer_is_asked_once_per_round(tmp_path: Path) -> None:
    """The controller stopped (``scontrol shutdown slurmctld`` on the real Slurm): each
    ``scontrol show job`` tries for 18 s there before "Unable to contact slurm controller", one
    job after another, so ``status`` of six jobs took 108 s and ``status --wait --timeout 5``
    as long. Now the first failure makes the round's other jobs UNKNOWN without asking: the
    fake scontrol takes 3 s per call (the real one's 18 s, shortened) and counts its calls."""
    import time

    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    for args in (("plan", str(camp), "--stand-in", "--batch", "1,8"), ("submit", str(camp))):
        res = _kit(tmp_path, "slurm", *args)
        assert res.returncode == 0, res.stderr
    calls = tmp_path / "scontrol-calls"
    (tmp_path / "bin" / "scontrol").write_text(
        f'#!/bin/bash\necho "$4" >> {calls}\nsleep 3\n'
        'echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"\n'
        "exit 1\n")
    t0 = time.monotonic()
    res = _kit(tmp_path, "slurm", "status", str(camp), "--wait", "--timeout", "1", "--json")
    took = time.monotonic() - t0
    assert "Traceback" not in res.stderr
    assert res.returncode == 10, res.stderr
    assert "still not done" in res.stderr and "Unable to contact" in res.stderr
    assert calls.read_text().split() == ["101"], calls.read_text()
    assert took < 12, f"{took:.0f} s"
    res = _kit(tmp_path, "slurm", "status", str(camp), "--json")
    assert res.returncode == 0, res.stderr
    states = json.loads(res.stdout)
    assert [s["state"] for s in states] == ["UNKNOWN"] * 6, states
    assert "not asked" in states[-1]["reason"], states[-1]


def test_two_submits_at_once_send_the_campaign_once(tmp_path: Path) -> None:
    """Two ``slurm submit`` of one campaign started together: on the real Slurm both read "not
    submitted" and sent all six jobs (4 races of 4), each job then ran twice, and the record
    saved last lost the other's ids. A submit started while another waited for its sbatch was
    told that sbatch "stopped before its job id was recorded" (it had not stopped). Now the
    campaign's lock lets one through and refuses the other, naming it. The fake sbatch counts
    its calls and takes 1 s each, so the submits overlap."""
    import time

    _fake_slurm(tmp_path)
    slow = tmp_path / "bin" / "sbatch"
    slow.write_text(_SBATCH.replace("import fcntl, re, sys",
                                    "import fcntl, re, sys, time; time.sleep(1)"))
    env = dict(_env(), PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path))
    env["PATH"] = f"{tmp_path / 'bin'}:{env.get('PATH', '')}"
    counter = tmp_path / "sbatch-counter"
    for n in range(3):
        camp = tmp_path / f"camp{n}"
        res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1")
        assert res.returncode == 0, res.stderr
        before = int(counter.read_text()) if counter.exists() else 100
        # both start their submit at the same moment (a busy wait to a shared time)
        start = time.time() + 2
        code = ("import runpy, sys, time\nwhile time.time() < float(sys.argv[1]): pass\n"
                "sys.argv = ['kvprefetch', 'slurm', 'submit', sys.argv[2]]\n"
                "runpy.run_module('kvprefetch', run_name='__main__')")
        procs = [subprocess.Popen([sys.executable, "-c", code, str(start), str(camp)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert not any("Traceback" in e for _, e in outs), outs
        assert sorted(p.returncode for p in procs) in ([0, 8], [0, 10]), outs
        assert int(counter.read_text()) - before == 6, f"race {n}: {outs}"  # 6 jobs, once
        rec = json.loads((camp / "campaign.json").read_text())
        assert len(rec["submitted"]) == 6 and "sending" not in rec, rec
    # one started while the other waits for its first sbatch: refused as "another kvprefetch"
    camp = tmp_path / "camp-late"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1").returncode == 0
    first = subprocess.Popen([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while "sending" not in (camp / "campaign.json").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    first.communicate(timeout=120)
    assert first.returncode == 0
    assert res.returncode == 8, res.stderr
    assert f"another kvprefetch process (pid {first.pid})" in res.stderr, res.stderr


def test_status_after_a_submit_killed_as_sbatch_answered_names_the_unanswered_job(
        tmp_path: Path) -> None:
    """``submit`` SIGKILLed right after the real sbatch answered (a wrapper that kills its
    parent): Slurm holds the prepare job, the record only the "sending" of it. ``submit`` then
    says to look with squeue and resubmit, but ``status`` said "has not been submitted. To
    fix: run `kvprefetch slurm submit`", a fix that submit refuses. Now status names the
    unanswered sbatch and the same way out. The fake sbatch is this file's; the kill is
    real."""
    _fake_slurm(tmp_path)
    sbatch = tmp_path / "bin" / "sbatch"
    sbatch.rename(tmp_path / "bin" / "sbatch-real")
    sbatch.write_text(f'#!/bin/bash\n{tmp_path / "bin" / "sbatch-real"} "$@"\n'
                      'kill -KILL $PPID\n')
    sbatch.chmod(0o755)
    camp = tmp_path / "camp"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in").returncode == 0
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode == -9, (res.returncode, res.stderr)
    for args in (("submit", str(camp)), ("status", str(camp)), ("status", str(camp), "--wait")):
        res = _kit(tmp_path, "slurm", *args)
        assert res.returncode == 10 and "Traceback" not in res.stderr, res.stderr
        assert "stopped before its job id was recorded" in res.stderr, (args, res.stderr)
        assert "squeue --me --name kvp-camp-prepare" in res.stderr, res.stderr
        assert "run `kvprefetch slurm submit" not in res.stderr, res.stderr


def test_a_moved_campaigns_fix_is_one_that_works(tmp_path: Path) -> None:
    """A campaign folder renamed between ``plan`` and ``submit``: refused, as it must be (its
    scripts ``cd`` to the planned path), but the fix said "plan the campaign again in this
    folder", and that plan was refused by the same check, for ever. Now the fix says to move
    it back (or plan into a new folder); done, the submit goes through."""
    _fake_slurm(tmp_path)
    camp, moved = tmp_path / "camp", tmp_path / "camp-renamed"
    plan = ("--stand-in", "--batch", "1")
    assert _kit(tmp_path, "slurm", "plan", str(camp), *plan).returncode == 0
    camp.rename(moved)
    for args in (("submit", str(moved)), ("plan", str(moved), *plan)):
        res = _kit(tmp_path, "slurm", *args)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert "was moved" in res.stderr and "plan the campaign again in this folder" \
            not in res.stderr, res.stderr
        assert f"move the folder back to '{camp}'" in res.stderr, res.stderr
    moved.rename(camp)
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode == 0, res.stderr


_SCONTROL_AFTER_A_RESUBMIT = r'''#!/bin/bash
case "$4" in
104) echo "JobId=104 JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=1:0";;
105) echo "JobId=105 ArrayJobId=105 ArrayTaskId=0-1 JobState=PENDING" \
       "Reason=DependencyNeverSatisfied Dependency=afterok:104(failed) ExitCode=0:0";;
108) echo "JobId=109 ArrayJobId=108 ArrayTaskId=1 JobState=COMPLETED Reason=None ExitCode=0:0"
     echo "JobId=108 ArrayJobId=108 ArrayTaskId=0 JobState=COMPLETED Reason=None ExitCode=0:0";;
*) echo "JobId=$4 JobState=COMPLETED Reason=None Dependency=(null) ExitCode=0:0";;
esac
'''


def test_a_whole_job_sent_again_replaces_its_pending_array_record(tmp_path: Path) -> None:
    """On the real Slurm a pending array is one record (``138_0-1``, ArrayTaskId=0-1). After a
    failed verify, ``resubmit verify`` then ``resubmit bench`` ran everything to the end, yet
    ``status --wait`` said "not completed: bench 138_0-1 NEVER" (exit 10; before it, PENDING:
    a wait to its timeout): the new tasks' rows ``_0`` and ``_1`` never replaced the old
    range. Now a whole job sent again replaces every row of the earlier submission. The fake
    scontrol prints the real one's lines."""
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    for args in (("plan", str(camp), "--stand-in", "--batch", "1,8"), ("submit", str(camp)),
                 ("resubmit", str(camp), "verify"), ("resubmit", str(camp), "bench")):
        res = _kit(tmp_path, "slurm", *args)
        assert res.returncode == 0, res.stderr
    (tmp_path / "bin" / "scontrol").write_text(_SCONTROL_AFTER_A_RESUBMIT)
    res = _kit(tmp_path, "slurm", "status", str(camp), "--wait", "--timeout", "20", "--json")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    bench = sorted((s["id"], s["state"]) for s in json.loads(res.stdout) if s["job"] == "bench")
    assert bench == [("108_0", "COMPLETED"), ("108_1", "COMPLETED")], bench


_SWAPPER = r'''
import ctypes, os, sys, time
# renameat2(RENAME_EXCHANGE): the folder and a link to the outside trade places atomically, so
# the folder is never missing (a plain rename-and-link swap left a moment where publish made
# the folder anew, and the swapping then jammed)
libc = ctypes.CDLL(None, use_errno=True)
folder, target, stop = sys.argv[1], sys.argv[2], sys.argv[3]
link = folder + ".swap"
os.symlink(target, link)
def exchange():
    if libc.renameat2(-100, folder.encode(), -100, link.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
print("ready", flush=True)
while not os.path.exists(stop):
    exchange()
    time.sleep(0.0002)
    exchange()
    time.sleep(0.0002)
os.unlink(link)
'''


@pytest.mark.parametrize("swapped", ["envs", "build/patched"])
def test_publish_under_a_swap_loop_writes_nothing_outside(tmp_path: Path, outside: Path,
                                                          swapped: str) -> None:
    """``slurm publish`` while another process swaps a folder of ``work/`` (``envs`` or
    ``build/<tree>``) for a link to a folder outside and back, over and over: publish copied
    with ``shutil.copytree`` and renamed by path, and a real build's publish wrote 136 files
    and folders outside in 60 runs (and left copies in the campaign). Now every folder is made,
    every file written and every rename done relative to folders opened without following a
    link: each run publishes or is refused, and nothing outside changes (the ``outside``
    fixture). The publishes are 40 runs of the CLI, of an env and a build of 150 files each; the
    build is the unit tests' fake scratch build."""
    import os
    import time

    from kvprefetch.slurm.publish import publish_build
    from tests.unit.test_slurm import _fake_scratch_build

    _fake_slurm(tmp_path)
    camp, scratch = tmp_path / "camp", tmp_path / "scratch"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in").returncode == 0
    bdir = _fake_scratch_build(scratch, "patched")
    site = scratch / "envs" / "patched" / "lib" / "python3.11" / "site-packages"
    for i in range(150):  # a copy long enough for the swaps to meet it, as a real env's is
        (site / f"module{i}.py").write_text("x = 1\n" * 50)
        (bdir / "logs" / f"step{i}.log").write_text("log\n" * 50)
    publish_build(scratch, camp / "work", "patched", label="1")  # work/envs, work/build made
    stop = tmp_path / "stop-swapping"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(camp / "work" / swapped),
                                str(outside), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        refused = 0
        t0 = time.monotonic()
        for i in range(40):
            res = _kit(tmp_path, "slurm", "publish", str(camp), "--tree", "patched",
                       "--scratch", str(scratch), env={"SLURM_JOB_ID": str(100 + i)})
            assert "Traceback" not in res.stderr, res.stderr
            refused += res.returncode != 0
            if time.monotonic() - t0 > 40:
                break
    finally:
        stop.touch()
        swapper.wait(timeout=30)
        if swapper.stdout is not None:
            swapper.stdout.close()
    assert refused, "the swaps never met a publish: the test proves nothing"
    assert not [p for p in outside.rglob("*") if "publish" in p.name or p.name == "manifest.json"]
    assert os.path.isdir(camp / "work" / swapped) and not os.path.islink(camp / "work" / swapped)


def test_a_job_scripts_write_new_under_a_swap_loop_writes_nothing_outside(
        tmp_path: Path, outside: Path) -> None:
    """The job scripts' ``write_new`` (verify's ``results/verify.json``, every exit record in
    ``logs/``) checked that the folder is no link, then wrote its temporary and renamed it by
    path: under a loop swapping ``results/`` for a link to a folder outside and back, 300
    writes left 49 temporaries there (and the rename could have replaced a ``verify.json``
    there). Now it writes in the folder its subshell has entered (``cd -P``, the physical path
    checked): each write lands in ``results/`` or is refused. The function is taken from a
    script the kit wrote and run by bash, as the job runs it."""
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in").returncode == 0
    script = (camp / "scripts" / "20-verify.sbatch").read_text().splitlines()
    start = script.index("write_new() {")
    func = "\n".join(script[start:script.index("}", start) + 1])
    target = camp / "results" / "verify.json"
    loop = (f"{func}\nok=0\nfor i in $(seq 300); do\n"
            f"  echo '{{\"i\": '$i'}}' | write_new {target} 2>/dev/null && ok=$((ok+1))\n"
            "done\necho $ok\n")
    stop = tmp_path / "stop-swapping"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(camp / "results"),
                                str(outside), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        res = subprocess.run(["bash", "-c", loop], capture_output=True, text=True, timeout=120,
                             check=False)
    finally:
        stop.touch()
        swapper.wait(timeout=30)
        if swapper.stdout is not None:
            swapper.stdout.close()
    assert 0 < int(res.stdout.strip()) < 300, res  # some written, some refused: they met
    assert not [p for p in outside.iterdir() if p.name.startswith("verify.json")]
    assert json.loads(target.read_text())["i"] > 0


def test_a_cancelled_build_job_removes_its_scratch_and_records_its_end(tmp_path: Path) -> None:
    """``scancel`` (and a time limit) send SIGTERM to every process of the job. The script's
    EXIT trap then recorded the exit status of the command that was running, so a command that
    ends with status 0 on SIGTERM left the record "0": a cancelled build read back as COMPLETED
    once the controller forgot it. Now the scripts trap SIGTERM as ``exit 143``: the scratch is
    removed and 143 recorded whatever the command returned. The script is the kit's, run by
    bash as Slurm runs it; its interpreter is a stand-in that sleeps in ``fetch`` and exits 0
    (the kit's own commands exit 143 on SIGTERM, so the record was 143 with them); the SIGTERM
    goes to the whole process group, as slurmstepd sends it."""
    import os
    import signal
    import time

    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/bash\ncase " $* " in *" fetch "*) sleep 60;; esac\nexit 0\n')
    fake_python.chmod(0o755)
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--scratch",
               str(tmp_path / "scratch"), "--python", str(fake_python))
    assert res.returncode == 0, res.stderr
    proc = subprocess.Popen(["bash", str(camp / "scripts" / "10-build-patched.sbatch")],
                            env=dict(_env(), SLURM_JOB_ID="4242"), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scratch = tmp_path / "scratch" / "kvprefetch-camp-build-patched-4242"
    deadline = time.monotonic() + 30
    while not scratch.is_dir():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.5)  # in fetch
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    assert not scratch.exists()
    assert (camp / "logs" / "build-patched-4242.exit").read_text() == "143\n"
