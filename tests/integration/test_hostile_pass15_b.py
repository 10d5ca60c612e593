"""Issue 41, the fifteenth hostile pass (tester b: campaigns, job scripts, reports and
outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``write_new`` (verify's report, every exit record) made its temporary with ``mktemp`` and
  opened it again by name with bash's ``<>`` (O_CREAT, links followed), then checked by name
  that the open file was that one. A program watching ``results/`` (inotify sees the new name
  at once) that put a dangling link there had ``<>`` create a file outside the campaign
  (22 runs of 30 with a real inotify watcher); one that put a link to a file outside and then,
  between the check's two ``stat``\\ s, a hard link to the same file at the name passed the
  check: the report was written over that file's first bytes, its mode changed, exit 0
  (12 runs of 30). Now one ``dd`` makes, opens and writes the temporary with
  O_CREAT|O_EXCL|O_NOFOLLOW at a name ``mktemp -u`` drew and nothing made before it: the open
  follows no link and opens nothing already there.
- A build job's scratch spelled through a link in the campaign (``--scratch '$PWD/scr'``, ``scr``
  a link to a folder outside) resolved outside, so the job's check passed, and the job then
  worked through the link by name: its fetch, build and exit ``rm -rf`` went wherever the link
  pointed at the time, and ``mkdir -p`` made the missing folders of ``$PWD/scr/sub`` behind the
  link before any check. A node TMPDIR in a bind mount of the campaign passed too. Now a scratch
  any folder of whose path, as spelled or as resolved, is the campaign's own folder (device and
  inode) is refused before anything is made, and the job works by the resolved path.
- An sbatch that printed something other than a job id had its whole output, repr'd, become
  the error message: 20 MB of it from one that printed 20 MB. Now the message shows its last
  line, escaped and cut to 200 characters.
- ``report`` stopped by a signal ("stopped by SIGTERM") was then killed by the next signal of
  a storm during the interpreter's teardown (38 of 40 storms): the fourteenth pass blocks the
  stop signals at exit, but only in the main thread, and numpy's OpenBLAS worker thread, which
  ``report``'s plots start, took the signal under its default action. Now they are also
  ignored at exit, which holds for every thread, so the first signal's status stands.
- The bench job's script run with an array task id past the array's end (sent by hand with
  another ``--array``) failed with bash's "BATCHES[...]: unbound variable", and with a leading
  zero (``08``, octal to bash) with "value too great for base"; neither said what to do. Now
  the task is checked first and named with a fix.
- The verify job whose ``verify-kernel`` failed before printing its report put an empty
  ``results/verify.json`` in place of the previous run's report. Now an empty input leaves the
  file as it was, and the job's status is still the command's own.

The watcher is a bash DEBUG trap that does, before each command of the function, what an
inotify watcher would do with what it can see in ``results/`` (it reads no variable of the
job's shell); everything else, the function the kit writes into each job script and the
files, is real."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvprefetch.slurm.shell import WRITE_NEW_SH
from tests.integration.helpers import signal_until_exit
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_FUNC = "\n".join(WRITE_NEW_SH)


def _write_new(target: Path, debug_trap: str) -> subprocess.CompletedProcess[str]:
    """``echo data | write_new TARGET`` in bash, with ``debug_trap`` run before each simple
    command (``set -T`` carries the trap into the function's subshells)."""
    script = (f"{_FUNC}\nset -T\ntrap {shlex.quote(debug_trap)} DEBUG\n"
              f"echo data | write_new {shlex.quote(str(target))}\n")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          check=False)


def _watcher(results: Path, seen: Path, plant: str) -> str:
    """The first time a new regular file ``*.tmp-*`` is in ``results/``, replace it by what
    ``plant`` makes at ``$f`` (once: ``seen`` records it)."""
    return (f'for f in {shlex.quote(str(results))}/*.tmp-*; do '
            f'if [ -f "$f" ] && [ ! -L "$f" ] && [ ! -e {shlex.quote(str(seen))} ]; then '
            f': > {shlex.quote(str(seen))}; rm -f -- "$f"; {plant}; fi; done')


def test_write_new_never_creates_a_file_through_a_dangling_link_at_its_temporary(
        tmp_path: Path, outside: Path) -> None:
    """As soon as the temporary shows in ``results/`` it is replaced by a link to a name
    outside that does not exist: ``<>`` created that file (empty) outside the campaign before
    the check refused. Now nothing is made outside."""
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    made = outside / "created-by-the-job"
    seen = tmp_path / "seen"
    trap = _watcher(results, seen, f'ln -s -- {shlex.quote(str(made))} "$f"')
    res = _write_new(results / "verify.json", trap)
    assert seen.exists(), "the watcher never saw the temporary: the test proves nothing"
    assert not made.exists() and not made.is_symlink(), f"created outside the campaign: {res}"
    # the outside fixture checks the rest of the folder is unchanged


def test_write_new_never_writes_a_file_outside_that_a_hard_link_swapped_in_names(
        tmp_path: Path, outside: Path) -> None:
    """As soon as the temporary shows, it is replaced by a link to a file outside; when the
    job looks the name up with ``stat``, that link is replaced by a hard link to the same file.
    The check compared the open file's inode and link count with the name's inode and a
    literal 1, so it passed: the report was written over the file outside, exit 0. Now the
    file outside is never opened."""
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    victim = outside / "notes.txt"
    seen = tmp_path / "seen"
    v = shlex.quote(str(victim))
    trap = (_watcher(results, seen, f'ln -s -- {v} "$f"') + "; "
            f'if [[ $BASH_COMMAND == "stat -c"* ]]; then '
            f'for f in {shlex.quote(str(results))}/*.tmp-*; do '
            f'if [ -L "$f" ]; then ln -- {v} "$f.h" && mv -fT -- "$f.h" "$f"; fi; done; fi')
    res = _write_new(results / "verify.json", trap)
    assert seen.exists(), "the watcher never saw the temporary: the test proves nothing"
    assert victim.read_text() == "keep me\n", f"written outside the campaign: {res}"


def _kit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"), TMPDIR=str(tmp_path))
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _plan_with_a_logging_python(tmp_path: Path, *args: str,
                                 stand_in: bool = True) -> tuple[Path, Path]:
    """A campaign (stand-in bench tasks unless ``stand_in`` is False) whose ``--python`` only
    logs each command the job runs with it (no real build is needed to see where the job would
    work)."""
    camp, ran = tmp_path / "camp", tmp_path / "ran.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {shlex.quote(str(ran))}\n')
    fake.chmod(0o755)
    res = _kit(tmp_path, "slurm", "plan", str(camp), *(["--stand-in"] if stand_in else []),
               "--python", str(fake), *args)
    assert res.returncode == 0, res.stderr
    return camp, ran


def _build_job(camp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The build job's script run by bash as Slurm runs it."""
    job_env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    job_env.update(env)
    return subprocess.run(["bash", str(camp / "scripts" / "10-build-baseline.sbatch")],
                          env=job_env, capture_output=True, text=True, timeout=60, check=False,
                          cwd="/")


def test_a_scratch_through_a_link_in_the_campaign_is_refused_before_anything_is_made(
        tmp_path: Path, outside: Path) -> None:
    """``--scratch '$PWD/scr/sub'`` with ``scr`` a link in the campaign to a folder outside:
    the job made ``sub`` there, resolved it outside, and ran fetch, build and publish through
    the link (exit 0), which whoever writes the campaign could point anywhere meanwhile. Now
    the job refuses (exit 2) before it makes or runs anything."""
    camp, ran = _plan_with_a_logging_python(tmp_path, "--scratch", "$PWD/scr/sub")
    (camp / "scr").symlink_to(outside, target_is_directory=True)
    res = _build_job(camp, SLURM_JOB_ID="7")
    assert not ran.exists(), f"the job ran the kit through the link: {ran.read_text()}"
    assert res.returncode == 2, res
    assert "refusing to build in" in res.stderr and "To fix" in res.stderr, res.stderr
    assert not (outside / "sub").exists(), "mkdir -p made a folder outside the campaign"


def test_a_scratch_through_the_users_link_to_a_link_in_the_campaign_is_refused(
        tmp_path: Path, outside: Path) -> None:
    """A scratch of the user's (``mine``, the user's own link) pointing at a link in the
    campaign (``camp/lnk``, which whoever writes the campaign planted, to a folder outside):
    it resolved outside, no folder of its spelling was the campaign, and the job built in the
    folder ``camp/lnk`` named (the fifteenth pass left it open; the lead's fix). Now each
    link on the way is followed one hop at a time and its target's folders checked too: the
    job refuses (exit 2) before it makes or runs anything. A cycle of links is a scratch that
    cannot be made, and said so."""
    camp, ran = _plan_with_a_logging_python(tmp_path, "--scratch", str(tmp_path / "mine"))
    (camp / "lnk").symlink_to(outside, target_is_directory=True)
    (tmp_path / "mine").symlink_to(camp / "lnk", target_is_directory=True)
    before = sorted(p.name for p in outside.iterdir())
    res = _build_job(camp, SLURM_JOB_ID="11")
    assert not ran.exists(), f"the job ran the kit through the campaign's link: {ran.read_text()}"
    assert res.returncode == 2, res
    assert "refusing to build in" in res.stderr and "To fix" in res.stderr, res.stderr
    assert sorted(p.name for p in outside.iterdir()) == before
    (tmp_path / "mine").unlink()  # a cycle: mine -> loop -> mine
    (tmp_path / "mine").symlink_to(tmp_path / "loop")
    (tmp_path / "loop").symlink_to(tmp_path / "mine")
    res = _build_job(camp, SLURM_JOB_ID="12")
    assert res.returncode == 2 and not ran.exists(), res
    assert "cannot be made a folder" in res.stderr, res.stderr


def test_the_build_job_works_in_its_scratch_by_the_resolved_path(tmp_path: Path) -> None:
    """A scratch of the user's reached through the user's own link outside the campaign is the
    user's to point anywhere, and is used; the job works by the path it resolved and checked,
    so no name on it is one that whoever writes the campaign can change (the fix above)."""
    real = tmp_path / "disk" / "scratch"
    real.mkdir(parents=True)
    (tmp_path / "mine").symlink_to(real, target_is_directory=True)
    camp, ran = _plan_with_a_logging_python(tmp_path, "--scratch", str(tmp_path / "mine"))
    res = _build_job(camp, SLURM_JOB_ID="9")
    assert res.returncode == 0, res
    fetch = ran.read_text().splitlines()[0]
    assert f"--workdir {real}/kvprefetch-camp-build-baseline-9 " in fetch, fetch
    assert list(real.iterdir()) == []  # removed at the job's exit


def test_a_node_tmpdir_in_a_bind_mount_of_the_campaign_is_refused(tmp_path: Path) -> None:
    """The node's TMPDIR in the campaign by another mount of it: the job's check compared
    paths only, so it built in the campaign. Now a folder on the way that is the campaign's
    own (device and inode) is refused."""
    camp, ran = _plan_with_a_logging_python(tmp_path)
    (camp / "tmp").mkdir()
    bound = tmp_path / "bound"
    bound.mkdir()
    if subprocess.run(["mount", "--bind", str(camp), str(bound)], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        res = _build_job(camp, SLURM_JOB_ID="8", SLURM_TMPDIR=str(bound / "tmp"))
    finally:
        subprocess.run(["umount", str(bound)], check=True)
    assert not ran.exists(), f"the job ran the kit in the campaign: {ran.read_text()}"
    assert res.returncode == 2, res
    assert "refusing to build in" in res.stderr and "To fix" in res.stderr, res.stderr
    assert list((camp / "tmp").iterdir()) == []


def test_an_sbatch_that_prints_megabytes_is_one_short_message(tmp_path: Path) -> None:
    """A fake sbatch on PATH prints 2 MB on one line: "sbatch printed 'AAAA…" was the whole of
    it (2 MB on the terminal, 20 MB for 20 MB). Now it is one line of at most a few hundred
    characters, with "To fix", and campaign.json stays readable."""
    camp, _ = _plan_with_a_logging_python(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/bash\nhead -c 2000000 /dev/zero | tr '\\0' A\n"
                                    "printf '\\n'\n")
    (bin_dir / "sbatch").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"), TMPDIR=str(tmp_path),
               PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp)],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[:2000]
    assert "not a job id" in res.stderr and "To fix" in res.stderr, res.stderr[:2000]
    assert len(res.stderr) < 2000, f"{len(res.stderr)} characters of message"
    status = _kit(tmp_path, "slurm", "status", str(camp))
    assert "corrupt" not in status.stderr and "Traceback" not in status.stderr, status.stderr


_TEARDOWN_WITH_A_THREAD = r"""
import sys, threading, time
import click
from kvprefetch.cli import COMMANDS, run

class _SlowTeardown:
    def __del__(self):
        # runs when the interpreter tears __main__ down, after it reset the signal handlers
        print("teardown", file=sys.stderr, flush=True)
        time.sleep(1.5)

_keep = _SlowTeardown()

@click.command()
def sleepy():
    # a thread that blocks no signal, as numpy's OpenBLAS worker (report's plots import it)
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(60)

COMMANDS["sleepy"] = "__main__:sleepy"
sys.argv = ["kvprefetch", "sleepy"]
run()
"""


def test_a_signal_during_the_teardown_of_a_stopped_command_with_a_thread_keeps_the_status(
        tmp_path: Path) -> None:
    """TERM stops the command, then INTs arrive while the interpreter tears its modules down,
    with a second thread alive (numpy's OpenBLAS worker in ``report``): the main thread blocked
    them, the other thread took one under the default action, and the process was killed by
    SIGINT (-2) after "stopped by SIGTERM". Now 143. The kit's real ``run()`` with a sleeping
    command and an object whose ``__del__`` holds the teardown open (as the fourteenth pass's
    test of the main thread alone)."""
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"), TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", _TEARDOWN_WITH_A_THREAD], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        line = proc.stderr.readline()
        assert "stopped by SIGTERM" in line, line
        teardown = proc.stderr.readline()
        assert "teardown" in teardown, teardown
        err = signal_until_exit(proc, [signal.SIGINT] * 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, (proc.returncode, line + teardown + err)
    assert "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize("task", ["99", "08"])
def test_a_bench_task_id_that_is_no_task_of_the_campaign_is_named_with_a_fix(
        tmp_path: Path, task: str) -> None:
    """The (real, not stand-in) bench job's script run as an array task past the array's end,
    or with a leading zero: bash's own error without a fix (exit 1). Now exit 2, the task named
    with the way to send the job, and nothing run."""
    camp, ran = _plan_with_a_logging_python(tmp_path, stand_in=False)
    job_env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    job_env.update(SLURM_JOB_ID="5", SLURM_ARRAY_JOB_ID="5", SLURM_ARRAY_TASK_ID=task)
    res = subprocess.run(["bash", str(camp / "scripts" / "30-bench.sbatch")], env=job_env,
                         capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert not ran.exists(), ran.read_text()
    assert res.returncode == 2, res
    assert f"array task id '{task}'" in res.stderr and "To fix" in res.stderr, res.stderr


def test_a_verify_job_that_printed_nothing_keeps_the_earlier_report(tmp_path: Path) -> None:
    """``verify-kernel`` stops with an error before its report (exit 3, nothing on stdout): the
    job replaced ``results/verify.json`` by an empty file. Now the earlier report stays, the
    job still ends with 3, and its exit record says 3."""
    camp = tmp_path / "camp"
    fake = tmp_path / "python"
    fake.write_text("#!/bin/bash\necho 'cannot verify' >&2\nexit 3\n")
    fake.chmod(0o755)
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--no-gpu",
               "--python", str(fake))
    assert res.returncode == 0, res.stderr
    report = camp / "results" / "verify.json"
    report.write_text('{"earlier": true}\n')
    job_env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    job_env.update(SLURM_JOB_ID="9")
    res = subprocess.run(["bash", str(camp / "scripts" / "20-verify.sbatch")], env=job_env,
                         capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert res.returncode == 3, res
    assert report.read_text() == '{"earlier": true}\n', "the earlier report was replaced"
    assert (camp / "logs" / "verify-9.exit").read_text() == "3\n"
    assert sorted(p.name for p in report.parent.iterdir()) == ["verify.json"]
