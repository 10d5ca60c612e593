"""Issue 41, the thirteenth hostile pass (b): what the twelfth pass left open, then the command
line's messages.

- ``.publish-<job>`` (and ``.old-<job>``) folders a killed build job left in a campaign's
  ``work/`` were never removed; a later publish of the same tree now removes those of a job
  whose exit record says it has ended, by their exact name shape, never through a link, never
  one of a job that may still run.
- ``nvcc --version`` and ``--list-gpu-arch`` wrote ``tmpxft_*`` files into the user's TMPDIR;
  they now run with a private one.
- The campaign lock's messages said "work directory" for the campaign.
- A third signal during a stop's cleanup broke off the removal of a private folder in the system
  temp (``kvprefetch-apply-*`` left), and TERM, INT, INT exited 130: the first signal decides
  the exit code now, and the folder is removed whatever signals come.
- ``click.echo`` lines printed paths raw: ESC and C1 bytes of a work directory's name reached
  the terminal (``clean``'s "kept" lines, the runner's ``+ command`` echo).

Each test fails without its fix (checked with the fixes reverted)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.test_hostile_pass11_t import _fake_slurm, _kit
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: the outside folder is byte-identical afterwards

_REPO = Path(__file__).resolve().parents[2]


def _kit_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), **extra)
    return env


# ------------------------------------------------------------------ 1. publish's debris


def test_a_publish_removes_the_debris_of_ended_jobs_of_its_tree_only(tmp_path: Path,
                                                                     outside: Path) -> None:
    """Earlier build jobs of ``patched`` killed mid-publish left ``.k1.publish-500``,
    ``.k1.old-500`` and ``envs/.patched.publish-500`` (job 500 has ended: its exit record is in
    ``logs/``), ``.k1.publish-600`` (job 600 has no exit record: it may still run) and a link
    ``.k1.publish-700`` to a folder outside (job 700 ended). The publish of job 800 removes
    500's debris, keeps 600's, the link (the kit never leaves a link there: not its debris;
    what it names untouched), a user's ``.k1.publish-mine`` and another tree's
    ``envs/.other.publish-500``. Before, none was ever
    removed. (Real CLI, the unit tests' fake scratch build, the stand-in plan.)"""
    from tests.unit.test_slurm import _fake_scratch_build

    _fake_slurm(tmp_path)
    camp, scratch = tmp_path / "camp", tmp_path / "scratch"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in").returncode == 0
    _fake_scratch_build(scratch, "patched")
    builds, envs = camp / "work" / "build" / "patched", camp / "work" / "envs"
    for d in (builds / ".k1.publish-500", builds / ".k1.old-500", envs / ".patched.publish-500",
              builds / ".k1.publish-600", builds / ".k1.publish-mine",
              envs / ".other.publish-500"):
        (d / "deep").mkdir(parents=True)
        (d / "deep" / "manifest.json").write_text("{}\n")
    (builds / ".k1.publish-700").symlink_to(outside, target_is_directory=True)
    (camp / "logs").mkdir(exist_ok=True)
    for job in ("500", "700"):
        (camp / "logs" / f"build-patched-{job}.exit").write_text("143\n")

    res = _kit(tmp_path, "slurm", "publish", str(camp), "--tree", "patched",
               "--scratch", str(scratch), env={"SLURM_JOB_ID": "800"})
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert not os.path.lexists(builds / ".k1.publish-500")
    assert not os.path.lexists(builds / ".k1.old-500")
    assert not os.path.lexists(envs / ".patched.publish-500")
    assert os.path.islink(builds / ".k1.publish-700")
    assert (builds / ".k1.publish-600" / "deep" / "manifest.json").is_file()  # may still run
    assert (builds / ".k1.publish-mine" / "deep" / "manifest.json").is_file()  # not the kit's
    assert (envs / ".other.publish-500" / "deep" / "manifest.json").is_file()  # another tree
    assert (builds / "k1" / "manifest.json").is_file()
    assert (outside / "notes.txt").is_file()


# ------------------------------------------------------------------ 2. nvcc's probes


def test_nvccs_version_probes_write_nothing_into_the_users_tmpdir(tmp_path: Path) -> None:
    """``nvcc --version`` and ``nvcc --list-gpu-arch`` write ``tmpxft_*`` files into TMPDIR
    (left there when stopped). A stand-in nvcc (a real script: there is no CUDA toolkit here)
    leaves a ``tmpxft_*`` file in its TMPDIR, as a stopped nvcc does: the user's TMPDIR (the
    environment the kit passes) stays empty, and the private folder is gone afterwards."""
    from kvprefetch.machine import toolchain

    users_tmp = tmp_path / "users-tmp"
    users_tmp.mkdir()
    nvcc = tmp_path / "nvcc"
    nvcc.write_text('#!/bin/sh\n: > "${TMPDIR:-/tmp}/tmpxft_$$_00000000-1"\n'
                    'echo "Cuda compilation tools, release 12.8, V12.8.93"\n'
                    'echo "compute_90"\n')
    nvcc.chmod(0o755)
    env = dict(os.environ, TMPDIR=str(users_tmp))
    assert toolchain.nvcc_version(nvcc, env) == (12, 8, 93)
    assert toolchain.nvcc_gpu_archs(nvcc, env) == frozenset({"90"})
    assert list(users_tmp.iterdir()) == []
    import tempfile
    assert not list(Path(tempfile.gettempdir()).glob("kvprefetch-nvcc-probe-*"))


# ------------------------------------------------------------------ 3. the campaign lock


def test_the_campaign_locks_messages_name_the_campaign(tmp_path: Path) -> None:
    """A file of the user's at the campaign lock's name, then a hard link there: ``submit``
    is refused with a message about the campaign; it said "if no kvprefetch runs on this work
    directory" and "perhaps outside the work directory"."""
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in").returncode == 0
    lock = camp / ".kvprefetch-campaign.lock"
    lock.write_text("mine\n")
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode != 0 and "To fix:" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert "work directory" not in res.stderr and "on this campaign" in res.stderr, res.stderr
    assert lock.read_text() == "mine\n"
    lock.unlink()
    other = tmp_path / "elsewhere"
    other.write_text("")
    os.link(other, lock)
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode != 0 and "To fix:" in res.stderr, res.stderr
    assert "work directory" not in res.stderr and "outside the campaign" in res.stderr, \
        res.stderr
    assert other.read_text() == ""


# ------------------------------------------------------------------ 4. signals in cleanup

_STORMED = r'''
import sys, time
import click
from kvprefetch.cli import COMMANDS, run
from kvprefetch.workspace.ownership import private_dir

@click.command()
@click.argument("count", type=int)
def hold(count):
    with private_dir("apply") as d:
        for i in range(count):
            (d / f"f{i}").write_bytes(b"x")
        print(d, flush=True)
        try:
            time.sleep(60)
        finally:
            print("stopping", flush=True)  # the stop is under way: the removal comes next

COMMANDS["hold"] = "__main__:hold"
sys.argv = ["kvprefetch", "hold", sys.argv[1]]
run()
'''


def test_a_signal_storm_during_cleanup_removes_the_private_folder_and_the_first_signal_decides(
        tmp_path: Path) -> None:
    """TERM, then a run of INTs while the private folder (30,000 files, as ``apply``'s holds a
    copy of the tree's files) is being removed: the third signal broke off tempfile's removal
    and left ``kvprefetch-apply-*`` in the system temp, and the command exited 130. Now the
    folder is gone and the exit is 143, one line, no traceback. The process is the kit's own
    signal handling (the real ``run()``) around ``private_dir``, in one extra command of a
    child process that real signals reach: no kit command holds a private folder long enough
    for a test to aim signals at its removal. (Its first driver called ``_interrupted`` itself,
    without ``run()``'s guard of the interpreter's shutdown, and a late INT killed it: -2 in
    the fresh CI run of 26599e6.)"""
    sys_tmp = tmp_path / "systmp"
    sys_tmp.mkdir()
    # a TERM that lands while the driver is still in its print of the folder (the reader has the
    # line, the write has not returned) stops it before the cleanup this test aims at: tried
    # again with a longer pause before the TERM (sent at once after the line, most TERMs met it)
    for pause in (0.2, 0.5, 1.0, 2.0):
        ended = _storm_the_cleanup(sys_tmp, pause)
        if ended is not None:
            break
    assert ended is not None, "every TERM landed before the driver's sleep"
    returncode, err = ended
    assert "Traceback" not in err, err
    assert not list(sys_tmp.glob("kvprefetch-apply-*")), "the private folder was left"
    assert returncode == 143, (returncode, err)
    assert "stopped by SIGTERM" in err, err


def _storm_the_cleanup(sys_tmp: Path, pause: float) -> tuple[int, str] | None:
    """TERM ``pause`` s after the driver printed its folder, then INTs during its cleanup; the
    exit status and stderr, or None where the TERM came before the driver's sleep."""
    proc = subprocess.Popen([sys.executable, "-c", _STORMED, "30000"], env=_kit_env(sys_tmp),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        folder = Path(proc.stdout.readline().strip())
        assert folder.parent == sys_tmp and folder.is_dir()
        time.sleep(pause)
        proc.send_signal(signal.SIGTERM)
        # the INTs only once the TERM is handled: pending together, Python runs the
        # lower-numbered INT's handler first, and the kit rightly stops for the interrupt
        if proc.stdout.readline().strip() != "stopping":
            proc.communicate(timeout=60)
            return None
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.003)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def test_a_signal_storm_never_hangs_the_stop(tmp_path: Path) -> None:
    """TERM, then a SIGINT every 3 ms for 0.4 s, 12 times: a handler that ran inside
    the previous one's ``stop_children`` (inside ``threading.Event.set``'s lock, which is not
    re-entrant) waited on that lock for ever, and the command hung (1 run in about 10, the
    first of 40 in this pass's loop). Each run now ends within 20 s, with 143 (130 where the
    interrupt was handled first) and no traceback; never killed by a late signal, as the
    driver runs the real ``run()``. (The private folder is still left in about
    1 run of 12 of these storms: found and left open by this pass.) Same driver as the test
    above, real signals."""
    sys_tmp = tmp_path / "systmp"
    sys_tmp.mkdir()
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", _STORMED, "30000"],
                                env=_kit_env(sys_tmp), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            proc.stdout.readline()
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.02)
            deadline = time.monotonic() + 0.4
            while time.monotonic() < deadline and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                time.sleep(0.003)
            try:
                _, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                raise AssertionError("the stop hung under a storm of signals") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        # 130 where the first SIGINT came before the TERM was handled: on a loaded machine
        # (a parallel suite on 2 cores) the child may not run in the 20 ms between them, and
        # the kernel delivers pending signals lowest number first, SIGINT (2) before SIGTERM
        # (15); the kit then stops for the interrupt, as it should (the first fresh parallel
        # rehearsal met it once in 12)
        assert proc.returncode in (143, 130), (proc.returncode, err)
        assert "Traceback" not in err, err


_SLOW_SHUTDOWN = r'''
import sys, threading, time
import click
from kvprefetch.cli import COMMANDS, run

@click.command()
def sleepy():
    # a thread the interpreter joins at exit: its shutdown lasts 1.5 s after the message
    threading.Thread(target=time.sleep, args=(1.5,)).start()
    print("ready", flush=True)
    time.sleep(60)

COMMANDS["sleepy"] = "__main__:sleepy"
sys.argv = ["kvprefetch", "sleepy"]
run()
'''


def test_a_signal_after_a_stops_message_keeps_the_first_signals_exit_status(
        tmp_path: Path) -> None:
    """TERM stops the command ("stopped by SIGTERM", its cleanups run), then INTs arrive while
    the interpreter shuts down (here a thread it joins for 1.5 s): the default action the
    handlers were reset to killed the process by SIGINT, a status that reads as Ctrl-C, where
    the message said SIGTERM. Now the first signal's 143. The kit's real ``run()`` and signal
    handling with one extra command (a sleep): no kit command holds its shutdown open long
    enough to aim at it."""
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_SHUTDOWN], env=_kit_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        line = proc.stderr.readline()
        assert "stopped by SIGTERM" in line, line
        time.sleep(0.1)
        for _ in range(5):
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGINT)
            time.sleep(0.05)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, (proc.returncode, line + err)
    assert "Traceback" not in err and "Exception ignored" not in err, err


# ------------------------------------------------------------------ 5. escaped output

_HOSTILE = "w\x1b]0;pwned\x07\u009bx"  # an OSC title sequence, then a C1 CSI


def _no_raw_control(data: bytes) -> None:
    assert b"\x1b" not in data and b"\x07" not in data and b"\xc2\x9b" not in data, data


def test_clean_prints_a_work_directory_named_with_esc_and_c1_escaped(tmp_path: Path) -> None:
    """A work directory whose name holds ESC, BEL and a C1 byte, with a link under ``build/``
    that ``clean`` keeps: its "kept <path>: ..." line (a ``click.echo``) wrote the name raw,
    so the terminal obeyed it. Now the name is shown as ``\\x1b`` and ``\\x9b``."""
    from kvprefetch.workspace.workdir import Workdir

    work = tmp_path / _HOSTILE
    Workdir(work).ensure()
    (work / "build").mkdir()
    (work / "build" / "lnk").symlink_to(tmp_path)
    for args in (("--dry-run",), ()):
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "clean", "--what", "all",
                              "--workdir", str(work), *args], env=_kit_env(tmp_path),
                             capture_output=True, timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        _no_raw_control(res.stdout + res.stderr)
        assert b"w\\x1b]0;pwned\\x07\\x9bx/build/lnk" in res.stderr, res.stderr


def test_the_runners_command_echo_escapes_a_path(tmp_path: Path) -> None:
    """The ``+ command`` line the runner prints before a child (``echo=True``, as the builds
    and ``fetch --source git`` run theirs) wrote a program's path raw. A real child, a script
    in a folder named with ESC and C1 bytes; the child itself runs as named."""
    folder = tmp_path / _HOSTILE
    folder.mkdir()
    prog = folder / "tool"
    prog.write_text("#!/bin/sh\necho ran\n")
    prog.chmod(0o755)
    code = ("import sys; from kvprefetch.runner import run; "
            "print(run([sys.argv[1]], echo=True).output.strip())")
    res = subprocess.run([sys.executable, "-c", code, str(prog)], env=_kit_env(tmp_path),
                         capture_output=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == b"ran"
    _no_raw_control(res.stderr)
    assert b"\\x1b]0;pwned\\x07\\x9bx/tool" in res.stderr, res.stderr


def test_a_usage_errors_quoted_value_is_escaped(tmp_path: Path) -> None:
    """``fetch --source VALUE``: the option's check quotes the value back in a usage error
    ("Invalid value for '--source': --source VALUE: no such file or directory"), which click
    printed raw (found by this pass's sweep of 21 commands). Now escaped, exit 2, with "To
    fix"."""
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--workdir",
                          str(tmp_path / "w"), "--source", _HOSTILE], env=_kit_env(tmp_path),
                         capture_output=True, timeout=60, check=False)
    assert res.returncode == 2, res.stderr
    _no_raw_control(res.stdout + res.stderr)
    assert b"To fix:" in res.stderr and b"w\\x1b]0;pwned\\x07\\x9bx" in res.stderr, res.stderr
