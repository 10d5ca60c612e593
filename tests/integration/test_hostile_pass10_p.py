"""Issue 41, the tenth hostile pass (p): the ninth pass's own mechanisms attacked (signals and
the stop of the kit's children, the third-party exception catch). Each test fails without its
fix (checked with the fixes taken out of src/):

- a module named like a standard one (``json``, ``shlex``) or ``click``, planted on PYTHONPATH
  (which comes before the standard library) and raising, was a traceback, where a ``torch``
  was one message (``errors.third_party_origin`` went by the module's name alone);
- ``runner.stop_children`` signalled a child by its number even once that child had been
  reaped (its ``wait`` returned in a worker thread, or in ``_stop``'s poll) and still listed:
  the number may name another program by then, and every process below that number was
  signalled too (SIGKILL at a second interrupt). It now signals through pidfds;
- a second signal while the first one's cleanups ran raised again in the middle of one (a
  temporary beside a user's file, a scratch folder in the system temp folder): it now
  SIGKILLs the children and lets the cleanups finish; a third one raises;
- a child stopped (Ctrl-Z, SIGSTOP to it) when the kit was stopped never saw its SIGINT until
  the 10 s grace ended in SIGKILL (no cleanup of its own): it now gets SIGCONT after it;
- children that inherited SIGINT ignored (the kit a ``&`` job of a script) ignored the stop's
  SIGINT the same way: they now get SIGTERM;
- SIGQUIT, SIGUSR1, SIGXCPU (and the other signals whose default ends a process) left a
  temporary beside the user's README as SIGTERM did before the ninth pass;
- ``slurm resubmit JOB --task 4`` replaced the unanswered record of task 3; a ``sending`` naming
  no job of the campaign left submit refusing for ever;
- ``umask 277``/``777`` made folders the kit could not write into itself.

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass9_a import _env9, _finish, _start, _wait_for
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("module", "argv"), [
    ("json", ["fetch", "--dry-run", "--workdir", "wd"]),
    ("shlex", ["clean", "--dry-run", "--workdir", "wd"]),
    ("click", ["fetch", "--dry-run", "--workdir", "wd"]),
])
def test_a_planted_module_named_like_a_standard_one_is_one_message(
        tmp_path: Path, module: str, argv: list[str]) -> None:
    """A ``json.py`` (``shlex.py``, ``click.py``) raising on import, put first by PYTHONPATH:
    a RuntimeError traceback (json, shlex: the name is a standard module's, so the catch took
    it for the standard library's own; click: raised while the command line imported)."""
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / f"{module}.py").write_text(f"raise RuntimeError('planted {module}')\n")
    env = _env9(tmp_path, PYTHONPATH=f"{plant}{os.pathsep}{_REPO / 'src'}")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", *argv], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode not in (0, 1), (res.returncode, res.stderr)
    assert f"the module {module} ({plant / module}.py) raised RuntimeError" in res.stderr
    assert "To fix:" in res.stderr
    # --debug keeps the traceback, and the real standard library's errors stay tracebacks
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "--debug", *argv], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" in res.stderr, res.stderr


_REAPED = '''
import signal, subprocess, sys, time
from kvprefetch import proctree, runner

stranger = subprocess.Popen(["sleep", "60"])  # another program, not started by runner
proc = subprocess.Popen(["true"])
if isinstance(runner._LIVE, dict):
    runner._LIVE[proc] = proctree.pidfd_of(proc.pid)  # what runner.run records
else:
    runner._LIVE.add(proc)
proc.wait()  # reaped (a worker thread's wait returned), not yet taken off the list
proc.pid = stranger.pid  # the system gave its number to another program
runner.stop_children(*([signal.SIGKILL] if "sig" in sys.argv else []))
time.sleep(0.3)
print("alive" if stranger.poll() is None else f"killed {stranger.returncode}")
stranger.kill()
'''


@pytest.mark.parametrize("second", [False, True])
def test_a_stop_never_signals_the_number_of_a_reaped_child(tmp_path: Path,
                                                           second: bool) -> None:
    """A child reaped while still listed as live, its number now another program's: a stop
    (SIGINT, or SIGKILL at a second interrupt) signalled that program (killed it)."""
    script = tmp_path / "reaped.py"
    script.write_text(_REAPED)
    res = subprocess.run([sys.executable, str(script), *(["sig"] if second else [])],
                         env=_env9(tmp_path), capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "alive", res.stdout


_CLEANUP_COMMAND = '''
import sys, time
from pathlib import Path

import click

import kvprefetch.cli as cli
from kvprefetch.runner import run

PIDS = Path("{pids}")


@click.command()
def slow() -> None:
    """A child that ignores SIGINT (a build step deaf to Ctrl-C), then a cleanup that takes a
    moment (a scratch folder removed, a tree rolled back)."""
    try:
        run(["sh", "-c", "{trap} echo $$ > {pids}/child; while :; do sleep 0.1; done"],
            echo=False)
    finally:
        (PIDS / "cleanup-started").write_text("")
        time.sleep(1.5)
        (PIDS / "cleanup-done").write_text("")


cli.COMMANDS["slow"] = "__main__:slow"
sys.argv = ["kvprefetch", "slow"]
cli.run()
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_lets_the_cleanups_finish(tmp_path: Path, sig: signal.Signals) -> None:
    """A second signal (Ctrl-C pressed twice; Slurm's SIGTERM, then a wrapper's) while the
    first one's cleanup ran raised again in the middle of it, which stopped there:
    ``cleanup-done`` was never written (a temporary beside a user's file, a scratch folder in
    the system temp folder left behind)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "slow.py"
    script.write_text(_CLEANUP_COMMAND.replace("{pids}", str(pids)).replace("{trap}", ""))
    p = _start([sys.executable, str(script)], _env9(tmp_path))
    _wait_for(lambda: (pids / "child").is_file() and (pids / "child").read_text().strip(),
              "the child starts")
    os.kill(p.pid, sig)
    _wait_for(lambda: (pids / "cleanup-started").exists(), "the cleanup starts", 10)
    os.kill(p.pid, sig)  # during the cleanup
    rc, err, _ = _finish(p, 30)
    assert "Traceback" not in err, err
    assert rc == 128 + sig, (rc, err)
    assert (pids / "cleanup-done").exists(), err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_kills_a_child_deaf_to_sigint_at_once(
        tmp_path: Path, sig: signal.Signals) -> None:
    """The first signal sends SIGINT and waits up to 10 s; a second SIGKILLs the children at
    once, the cleanup still runs to its end (a regression check: the old second signal
    raised, which SIGKILLed them too), and a third signal stops that cleanup."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "slow.py"
    script.write_text(_CLEANUP_COMMAND.replace("{pids}", str(pids))
                      .replace("{trap}", "trap '' INT;"))
    p = _start([sys.executable, str(script)], _env9(tmp_path))
    _wait_for(lambda: (pids / "child").is_file() and (pids / "child").read_text().strip(),
              "the child starts")
    child = int((pids / "child").read_text())
    # the child's exit seen through a pidfd: its number may be another process's once reaped
    pidfd = os.pidfd_open(child)
    os.kill(p.pid, sig)
    time.sleep(0.5)
    assert not select.select([pidfd], [], [], 0)[0]  # it ignores SIGINT: the grace runs
    os.kill(p.pid, sig)
    _wait_for(lambda: (pids / "cleanup-started").exists(), "the cleanup starts", 5)
    assert select.select([pidfd], [], [], 5)[0], "the child still runs"
    os.close(pidfd)
    os.kill(p.pid, sig)  # a third: the user insists
    rc, err, secs = _finish(p, 30)
    assert "Traceback" not in err, err
    assert rc == 128 + sig, (rc, err)
    assert not (pids / "cleanup-done").exists()
    assert secs < 5, secs


_STOPPED_CHILD = '''
import sys
import click
import kvprefetch.cli as cli
from kvprefetch.runner import run


@click.command()
def slow() -> None:
    run(["sh", "-c", "trap 'echo cleaned > {pids}/cleaned; exit 1' INT; echo $$ > {pids}/child;"
         " while :; do sleep 0.1; done"], echo=False)


cli.COMMANDS["slow"] = "__main__:slow"
sys.argv = ["kvprefetch", "slow"]
cli.run()
'''


def test_a_stopped_child_gets_its_sigint_at_once(tmp_path: Path) -> None:
    """The kit's child stopped (SIGSTOP to it, or a Ctrl-Z that reached it and not the kit),
    then the kit SIGTERMed: the child's SIGINT stayed pending, and after 10 s it was SIGKILLed
    without running its own cleanup (nvcc's ``tmpxft_*`` removal, ninja's partial outputs)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "slow.py"
    script.write_text(_STOPPED_CHILD.replace("{pids}", str(pids)))
    p = _start([sys.executable, str(script)], _env9(tmp_path))
    _wait_for(lambda: (pids / "child").is_file() and (pids / "child").read_text().strip(),
              "the child starts")
    child = int((pids / "child").read_text())
    os.kill(child, signal.SIGSTOP)
    time.sleep(0.2)
    os.kill(p.pid, signal.SIGTERM)
    rc, err, secs = _finish(p, 30)
    assert rc == 143 and "Traceback" not in err, (rc, err)
    assert (pids / "cleaned").exists(), "the child never ran its own cleanup"
    assert secs < 5, secs


def _campaign_submitted(tmp_path: Path) -> tuple[Path, dict[str, str], Path, dict]:
    """A planned campaign submitted through a fake sbatch (ids 101...) and scontrol."""
    import json

    camp = tmp_path / "camp"
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "sbatch.log"
    (fake / "sbatch").write_text(
        "#!/bin/bash\nn=$(( $(wc -l < " + str(log) + " 2>/dev/null || echo 0) + 101 ))\n"
        f'echo "$n $*" >> {log}\necho $n\n')
    (fake / "scontrol").write_text('#!/bin/bash\necho "JobId=$5 JobState=COMPLETED '
                                   'ExitCode=0:0 Reason=None"\n')
    for f in fake.iterdir():
        f.chmod(0o755)
    env = _env9(tmp_path, PATH=f"{fake}:{os.environ['PATH']}")
    for args in (["plan", str(camp), "--source", "sdist"], ["submit", str(camp)]):
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", *args], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 0, res.stderr
    return camp, env, log, json.loads((camp / "campaign.json").read_text())


def test_an_unanswered_array_task_is_answered_only_by_its_own_resubmit(tmp_path: Path) -> None:
    """``sending`` records bench's array task 3 (a ``resubmit bench --task 3`` stopped during
    its sbatch): ``resubmit bench --task 4`` went through and replaced that record (Slurm may
    hold task 3, and nothing said so any more); the fix named ``resubmit bench`` (the whole
    array, every task again) instead of ``--task 3``."""
    import json

    camp, env, log, rec = _campaign_submitted(tmp_path)
    sent = len(log.read_text().splitlines())
    (camp / "campaign.json").write_text(json.dumps(
        {**rec, "sending": {"job": "bench", "task": 3, "at": "2026-12-04T21:00:00Z"}}))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", *args], env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    for args in (["resubmit", str(camp), "bench", "--task", "4"],
                 ["resubmit", str(camp), "bench"], ["submit", str(camp)]):
        res = cli(*args)
        assert res.returncode == 10, (args, res.returncode, res.stderr)
        assert "Traceback" not in res.stderr, res.stderr
        assert f"`kvprefetch slurm resubmit {camp} bench --task 3`" in res.stderr, res.stderr
    assert len(log.read_text().splitlines()) == sent  # nothing sent
    assert json.loads((camp / "campaign.json").read_text())["sending"]["task"] == 3
    res = cli("resubmit", str(camp), "bench", "--task", "3")
    assert res.returncode == 0, res.stderr
    after = json.loads((camp / "campaign.json").read_text())
    assert "sending" not in after and after["submitted"]["bench"][-1]["task"] == 3


def test_a_sending_record_naming_no_job_of_the_campaign_is_corrupt(tmp_path: Path) -> None:
    """``sending`` hand-edited to a job the campaign does not plan: submit refused for ever,
    its way out an empty list ("then send it and the rest in order: "), and the ``resubmit``
    of that job it implied failed ("has no job")."""
    import json

    camp, env, _, rec = _campaign_submitted(tmp_path)
    (camp / "campaign.json").write_text(json.dumps(
        {**rec, "sending": {"job": "ghost", "task": None, "at": ""}}))
    for args in (["submit", str(camp)], ["resubmit", str(camp), "verify"]):
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", *args], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 2, (args, res.returncode, res.stderr)
        # since the record's own check (campaign.load_record, after the twenty-third pass): a
        # job of nobody's in 'sending' is refused as it is in 'submitted'
        assert "is corrupt: it records a submission of 'ghost', which is no job of its plan" \
            in res.stderr, res.stderr
        assert "To fix: restore campaign.json" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


@pytest.mark.parametrize("umask", [0o277, 0o777])
def test_a_umask_taking_the_owners_own_bits_leaves_the_kit_its_folders(
        tmp_path: Path, umask: int) -> None:
    """``umask 277`` (or 777): the kit made the campaign folder and its ``scripts/`` without
    the owner's write (or any) bit, so a user without root's override got "slurm failed:
    scripts: Permission denied / To fix: make . writable", the current folder blamed, and an
    empty folder left. (As root here the plan goes through: the modes are what is checked.)"""
    camp = tmp_path / "camp"

    def set_umask() -> None:
        os.umask(umask)

    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--source", "sdist"], env=_env9(tmp_path), capture_output=True,
                         text=True, timeout=120, check=False,
                         preexec_fn=set_umask)
    assert res.returncode == 0, res.stderr
    for d in (camp, camp / "scripts", camp / "logs"):
        mode = d.stat().st_mode & 0o777
        assert mode & 0o700 == 0o700, (d, oct(mode))
        assert mode & 0o077 == 0, (d, oct(mode))  # the rest of the umask still masks


@pytest.mark.skipif(__import__("shutil").which("strace") is None,
                    reason="needs strace to hold the write open")
@pytest.mark.parametrize("sig", [signal.SIGQUIT, signal.SIGUSR1, signal.SIGXCPU])
def test_another_ending_signal_mid_write_leaves_no_temporary(tmp_path: Path,
                                                            sig: signal.Signals) -> None:
    """``kill -USR1`` (meant to ask for progress, as dd answers it), Ctrl-backslash's SIGQUIT, a
    CPU limit's SIGXCPU while ``report --readme`` held its temporary beside README.md: the
    default action ended the kit at once and left ``.README.md.tmp-…`` in the user's folder
    (the ninth pass made only SIGTERM and SIGHUP raise)."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(_REPO / "docs", repo / "docs", ignore=shutil.ignore_patterns("*.png"))
    text = (_REPO / "README.md").read_text()
    mark = "<!-- report docs/results/2026-12-03-h200-vllm-call-decode decode -->\n"
    stale = text.replace(mark, mark + "STALE LINE\n", 1)
    (repo / "README.md").write_text(stale)
    p = _start(["strace", "-f", "-o", "/dev/null", "-e", "trace=fchmod",
                "-e", "inject=fchmod:delay_exit=8000000",
                sys.executable, "-m", "kvprefetch", "report", "--readme", "README.md"],
               _env9(tmp_path), cwd=repo)
    _wait_for(lambda: any(n.startswith(".README.md.tmp-") for n in os.listdir(repo)),
              "the temporary beside README.md")
    time.sleep(0.3)
    kit = int(subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True,
                             check=True).stdout.split()[0])
    os.kill(kit, sig)
    rc, err, _ = _finish(p, 60)
    assert "Traceback" not in err, err
    assert rc == 128 + sig and f"stopped by {sig.name}" in err, (rc, err)
    assert sorted(os.listdir(repo)) == ["README.md", "docs"], os.listdir(repo)
    assert (repo / "README.md").read_text() == stale


_DEAF_BY_BIRTH = '''
import sys
import click
import kvprefetch.cli as cli
from kvprefetch.runner import run


@click.command()
def slow() -> None:
    run(["sh", "-c", "trap 'echo cleaned > {pids}/cleaned; exit 1' TERM; echo $$ > {pids}/child;"
         " while :; do sleep 0.1; done"], echo=False)


cli.COMMANDS["slow"] = "__main__:slow"
sys.argv = ["kvprefetch", "slow"]
cli.run()
'''


def _sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_children_that_inherit_sigint_ignored_are_stopped_with_sigterm(tmp_path: Path) -> None:
    """The kit started as a ``&`` job of a script (SIGINT ignored, and so in its children too),
    then SIGTERMed: the stop's SIGINT was ignored, and 10 s later SIGKILL ended the children
    without their own cleanup (nvcc's tmpxft files, ninja's partial outputs)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "slow.py"
    script.write_text(_DEAF_BY_BIRTH.replace("{pids}", str(pids)))
    p = subprocess.Popen([sys.executable, str(script)], env=_env9(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_sigint_ignored)  # noqa: PLW1509 (no threads here)
    _wait_for(lambda: (pids / "child").is_file() and (pids / "child").read_text().strip(),
              "the child starts")
    time.sleep(0.2)
    os.kill(p.pid, signal.SIGTERM)
    rc, err, secs = _finish(p, 30)
    assert rc == 143 and "Traceback" not in err, (rc, err)
    assert (pids / "cleaned").exists(), "the child never ran its own cleanup"
    assert secs < 5, secs
