"""Issue 41, the nineteenth hostile pass (tester b: campaigns, job scripts, reports and
outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- A job inherits the submitter's environment (sbatch's ``--export=ALL``), its ``TMPDIR``
  included, and the kit makes its private folders in that system temp folder
  (``ownership.private_dir``: the sdist's unpack, ``git apply``, the compilers' temporaries),
  where the programs it runs write by path. A build job whose scratch was the node's
  ``$SLURM_TMPDIR`` (outside the campaign, so the scratch check passed), submitted with
  ``TMPDIR=<campaign>/tmp``, made ``kvprefetch-sdist-*`` in the campaign; a watcher that
  renamed it and put a link to a folder outside in its place had tarfile unpack the whole
  vLLM sdist (3,063 files) there (1 run of 1). The build's own check of ``TMPDIR`` knows only
  the work directory, not the campaign; the other jobs checked nothing.

  Now every job, before it runs anything of the kit, refuses a ``TMPDIR``, ``TEMP`` or
  ``TMP`` that is in the campaign or reaches it through a link or ``//`` (exit 2 with a fix,
  recorded as the job's end).
- ``slurm plan --scratch`` is put into the build script inside double quotes so that the job's
  shell expands ``$VAR``; the check refused ``$(`` and backquotes but took any other
  expansion. ``${x:=${z:-$}(cmd)}${x@P}`` builds ``$(cmd)`` at run time and expands it as a
  prompt, which runs it: the build job ran ``touch`` on a file outside (1 run of 1);
  ``${`` alone or ``${x:-'}`` made a script ``bash -n`` refuses (every line after it read in
  the wrong quoting). Now ``$`` may only start ``$NAME`` or ``${NAME}`` (exit 2 with a fix).
- The bench job's stand-in (and ``bench kernel``'s load of a build) hashed each build's library
  before anything else, whatever its size: a 15 TB sparse file at the campaign's
  ``work/envs/<tree>/.../_C.so`` kept the job hashing zeros for hours (a hang until the time
  limit; 1 run of 1, killed at 20 s). Now a library past 4 GiB (``hashing.MAX_LIBRARY_BYTES``:
  no shared library's code reaches 2 GiB) is named, never read (exit 7).
- A campaign's ``work/`` swapped for a link to a folder outside after ``slurm prepare`` and
  ``slurm publish`` checked it (a ``renameat2`` loop exchanging it with a link): prepare
  resolved the path and made the folder the link named the work directory, its tag and
  ownership record written there (1 run of 15); publish's acts, confined from ``work/`` down,
  opened ``work/`` itself following the link, and made ``build/``, ``envs/`` and a published
  environment's copy there (3 runs of 70). Now prepare never resolves ``work/``, and
  ``confine`` opens a root's own last part ``O_NOFOLLOW`` too (the command line resolved a
  root the user named through a link, so a link there now was swapped in): refused, with a fix.
- The verify job runs ``verify-kernel --workdir <campaign>/work``, and the command line follows
  a ``--workdir`` that is a link once (a location the user names is trusted): a ``work/``
  swapped for a link to a folder outside after ``slurm submit`` checked it had the verify job
  write ``verify/report.json`` and ``report.txt`` there (1 run of 1), and verify-kernel's own
  ``workdir.resolve()`` did the same when the swap came after the command line's check (under
  a swap loop, 1 run of 20). Now a campaign's ``work`` link is refused at the command line,
  and verify-kernel resolves only the folders above its work directory.
- The build job's scratch check follows each link on the way one hop at a time and walks up
  every target it meets (the fifteenth and sixteenth passes): a user's scratch through a link
  to a campaign link ``l0``, and 40 links in the campaign each pointing at the next spelled
  ``.../l1/..`` 190 times (4096 characters), had the check walk about 35,000 folders, two
  forks each: the job spent more than 10 minutes before its refusal (1 run of 1, killed at
  600 s). Now a check takes at most 2000 steps, and past them the scratch is refused.

Slurm is absent: the job scripts are run by bash as Slurm runs them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"


def _plan(tmp_path: Path, camp: Path, python: str = sys.executable) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH="/usr/bin:/bin")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--batch", "1", "--python", python], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def _run(tmp_path: Path, camp: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    job_env = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin", **env}
    return subprocess.run(["bash", str(camp / "scripts" / script)], env=job_env,
                          capture_output=True, text=True, timeout=120, check=False, cwd="/")


def _swap_private_folders(folder: Path, target: Path, stop: threading.Event) -> None:
    """The attacker who can write the campaign: each new ``kvprefetch-*`` folder in it is
    renamed aside and a link to ``target`` put at its name."""
    while not stop.is_set():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for n in names:
            p = folder / n
            if n.startswith("kvprefetch-") and not n.endswith(".aside") and not p.is_symlink():
                try:
                    p.rename(folder / f"{n}.aside")
                    p.symlink_to(target, target_is_directory=True)
                except OSError:
                    pass


def test_a_build_jobs_private_folders_never_go_into_a_tmpdir_in_the_campaign(
        tmp_path: Path, outside: Path, vllm_sdist: Path) -> None:
    """The build job with the node's ``SLURM_TMPDIR`` for its scratch and a ``TMPDIR`` in the
    campaign, under a watcher swapping the kit's private folders there for links outside:
    nothing of the sdist lands outside; the job refuses the TMPDIR and records exit 2."""
    camp, node = tmp_path / "camp", tmp_path / "node"
    node.mkdir()
    _plan(tmp_path, camp)
    shutil.copyfile(vllm_sdist, camp / "cache" / vllm_sdist.name)
    (camp / "tmp").mkdir()
    stop = threading.Event()
    watcher = threading.Thread(target=_swap_private_folders, args=(camp / "tmp", outside, stop))
    watcher.start()
    try:
        res = _run(tmp_path, camp, "10-build-baseline.sbatch", SLURM_TMPDIR=str(node),
                   TMPDIR=str(camp / "tmp"))
    finally:
        stop.set()
        watcher.join()
    assert not (outside / "vllm-0.10.2").exists(), "the sdist was unpacked outside the campaign"
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"refusing to run: TMPDIR={camp / 'tmp'} is in the campaign" in res.stderr, res.stderr
    assert "To fix: submit the campaign with TMPDIR set to a folder outside it" in res.stderr
    assert (camp / "logs" / "build-baseline-7.exit").read_text() == "2\n"
    assert list(node.iterdir()) == [], "the build job made its scratch before refusing"


@pytest.mark.parametrize(("var", "value"), [
    ("TMPDIR", "{camp}/tmp"), ("TMPDIR", "/{camp}"), ("TMPDIR", "{alias}/camp/logs/t"),
    ("HOME", "{camp}/results"), ("HOME", "{camp}"),
])
def test_every_job_refuses_a_temp_folder_in_the_campaign(
        tmp_path: Path, var: str, value: str) -> None:
    """Each job (here prepare, verify, bench, merge) refuses TMPDIR (TEMP and TMP, refused here
    before, never reach a job now) in the campaign, by its name, ``//`` or a link, before its
    interpreter runs; one outside it is kept and the job runs. A HOME in the campaign never
    reaches the interpreter: each job runs with a HOME of its own."""
    camp, seen = tmp_path / "camp", tmp_path / "seen"
    (tmp_path / "alias").symlink_to(tmp_path)
    py = tmp_path / "python"  # the jobs' "interpreter": it says it ran, and with which TMPDIR
    py.write_text(f'#!/bin/sh\nprintf "%s\\n" "${{{var}}}" >> {seen}\n')
    py.chmod(0o755)
    _plan(tmp_path, camp, python=str(py))
    bad = value.format(camp=camp, alias=tmp_path / "alias")
    good = str(tmp_path / "node-tmp")
    for script in ("00-prepare.sbatch", "20-verify.sbatch", "30-bench.sbatch",
                   "40-merge.sbatch"):
        task = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0"} \
            if script.startswith("30") else {}
        res = _run(tmp_path, camp, script, **task, **{var: bad})
        if var == "HOME":
            # no longer passed: each job makes its own HOME (shell.PRIVATE_HOME_SH), so a HOME
            # in the campaign never reaches the kit (issue 41, after the twenty-fifth pass)
            assert res.returncode == 0, (script, res.stdout + res.stderr)
            own = seen.read_text().splitlines()[-1]
            assert own != bad and "/kvprefetch-home." in own, own
            seen.unlink()
            continue
        assert res.returncode == 2, (script, res.stdout + res.stderr)
        assert f"refusing to run: {var}={bad} is in the campaign" in res.stderr, res.stderr
        assert not seen.exists(), f"{script} ran the kit with {var}={bad}"
        res = _run(tmp_path, camp, script, **task, **{var: good})
        assert res.returncode == 0, (script, res.stdout + res.stderr)
        assert seen.read_text().splitlines()[-1] == good
        seen.unlink()


@pytest.mark.parametrize("scratch", [
    "{node}/${{x:=${{z:-$}}(touch {bad})}}${{x@P}}", "{node}/${{", "{node}/${{x:-'}}",
    "{node}/${{HOME:?}}", "{node}/$[1]",
])
def test_a_scratch_whose_expansion_is_more_than_a_variable_is_refused_at_the_plan(
        tmp_path: Path, outside: Path, scratch: str) -> None:
    """A ``--scratch`` that runs a command, or breaks the script's quoting, when the build
    job's shell expands it is refused by ``slurm plan``; ``$NAME`` and ``${NAME}`` still pass."""
    camp, node, bad = tmp_path / "camp", tmp_path / "node", outside / "ran-by-the-job"
    node.mkdir()
    scratch = scratch.format(node=node, bad=bad)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH="/usr/bin:/bin")
    plan = [sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp), "--stand-in",
            "--batch", "1", "--python", "/bin/true", "--scratch"]
    res = subprocess.run([*plan, scratch], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    if res.returncode == 0:  # as before the fix: what the build job's shell makes of it
        script = camp / "scripts" / "10-build-baseline.sbatch"
        parse = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                               check=False)
        assert parse.returncode == 0, f"plan wrote a script bash cannot parse: {parse.stderr}"
        _run(tmp_path, camp, "10-build-baseline.sbatch")
        assert not bad.exists(), "the build job ran a command the --scratch value built"
    assert res.returncode == 2, res.stdout + res.stderr
    assert "uses $ for more than naming a variable" in res.stderr and "To fix" in res.stderr
    assert not camp.exists()
    for good in (f"{node}/$USER/kvp", f"{node}/${{USER}}-kvp"):
        res = subprocess.run([*plan, good], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        shutil.rmtree(camp)


def _published_campaign(tmp_path: Path) -> Path:
    """A stand-in campaign whose two builds (fake, as a build job leaves them) are published
    into its work/ by ``slurm publish``."""
    from tests.unit.test_slurm import _fake_scratch_build

    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH="/usr/bin:/bin")
    for i, tree in enumerate(("baseline", "patched")):
        _fake_scratch_build(tmp_path / f"scratch-{tree}", tree)
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "publish", str(camp),
                              "--tree", tree, "--scratch", str(tmp_path / f"scratch-{tree}")],
                             env={**env, "SLURM_JOB_ID": str(10 + i)}, capture_output=True,
                             text=True, timeout=60, check=False)
        assert res.returncode == 0, res.stderr
    return camp


def _run_bounded(argv: list[str], env: dict[str, str], seconds: float) -> tuple[int, str]:
    """``argv`` in a session of its own, killed whole (the kit under bash included) past
    ``seconds``: a hang fails the test and leaves no process of it behind."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True, cwd="/")
    try:
        out, _ = p.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"{argv[-1]} was still running after {seconds} s")
    return p.returncode, out


def test_a_huge_sparse_library_in_the_campaign_is_refused_not_hashed_for_hours(
        tmp_path: Path) -> None:
    """The bench job's stand-in and a direct ``load_build`` of a build whose library is a 15 TB
    sparse file: one message naming it, at once."""
    camp = _published_campaign(tmp_path)
    so = next((camp / "work" / "envs" / "baseline").rglob("_C.so"))
    so.unlink()
    with open(so, "wb") as f:
        f.truncate(15 << 40)
    env = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "7",
           "SLURM_ARRAY_TASK_ID": "0", "PATH": "/usr/bin:/bin"}
    rc, out = _run_bounded(["bash", str(camp / "scripts" / "30-bench.sbatch")], env, 20)
    assert rc == 7, out
    assert f"cannot hash {so}" in out and "not read" in out and "To fix" in out, out
    assert "Traceback" not in out, out
    load = ("from pathlib import Path; from kvprefetch.kernels.ops import find_builds, load_build;"
            f"load_build(next(b for b in find_builds(Path({str(camp / 'work')!r}), ['baseline'])))")
    rc, out = _run_bounded([sys.executable, "-c", load],
                           {**env, "PYTHONPATH": str(_SRC)}, 20)
    assert rc != 0 and f"cannot hash {so}" in out and "not read" in out, out


def _swap_after(monkeypatch: pytest.MonkeyPatch, module: object, name: str, work: Path,
                outside: Path) -> None:
    """``module.name`` (a check of ``work``) runs, then ``work`` is swapped for a link to
    ``outside``: the race a swap loop wins, made certain."""
    check = getattr(module, name)

    def check_then_swap(*args: object, **kwargs: object) -> object:
        result = check(*args, **kwargs)
        work.rename(work.with_name("work.aside"))
        work.symlink_to(outside, target_is_directory=True)
        return result

    monkeypatch.setattr(module, name, check_then_swap)


def test_slurm_prepare_never_makes_a_work_directory_behind_a_work_folder_swapped_after_its_check(
        tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch.errors import KvprefetchError
    from kvprefetch.slurm import prepare as prep
    from kvprefetch.slurm.cluster import load

    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    (camp / "work").mkdir(exist_ok=True)
    c, _ = load(camp)
    victim = tmp_path / "victim"  # empty, as the work folder was: prepare would take it
    victim.mkdir()
    monkeypatch.setattr(prep, "source_cache", lambda c: ("sdist", False))  # no download
    _swap_after(monkeypatch, prep, "check_workdir", camp / "work", victim)
    with pytest.raises(KvprefetchError) as err:
        prep.prepare(c)
    assert list(victim.iterdir()) == [], "the work directory was made outside the campaign"
    assert "symlink" in err.value.message and err.value.fix, err.value.message


def test_slurm_publish_writes_nothing_behind_a_work_folder_swapped_after_its_check(
        tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch.errors import KvprefetchError
    from kvprefetch.slurm import publish as pub
    from tests.unit.test_slurm import _fake_scratch_build

    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    (camp / "work").mkdir(exist_ok=True)
    _fake_scratch_build(tmp_path / "scratch", "baseline")
    _swap_after(monkeypatch, pub, "_refuse_link", camp / "work", outside)
    with pytest.raises(KvprefetchError) as err:
        pub.publish_build(tmp_path / "scratch", camp / "work", "baseline", label="7",
                          logs=camp / "logs")
    assert "symlink" in err.value.message and err.value.fix, err.value.message
    assert sorted(p.name for p in outside.iterdir()) == ["baseline.json", "notes.txt",
                                                          "patched"], "published outside"


def test_the_verify_job_writes_nothing_behind_a_work_folder_swapped_for_a_link(
        tmp_path: Path, outside: Path) -> None:
    """The verify job (and verify-kernel called past the command line's check) with the
    campaign's published work/ moved out and a link to it in its place: nothing is written
    there, and the job names the link."""
    from kvprefetch.errors import KvprefetchError
    from kvprefetch.verify.kernel import verify

    camp = _published_campaign(tmp_path)
    victim = tmp_path / "victim-work"
    (camp / "work").rename(victim)
    (camp / "work").symlink_to(victim, target_is_directory=True)
    before = sorted(str(p.relative_to(victim)) for p in victim.rglob("*"))
    res = _run(tmp_path, camp, "20-verify.sbatch")
    after = sorted(str(p.relative_to(victim)) for p in victim.rglob("*"))
    assert after == before, "the verify job wrote into the folder the link named"
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{camp / 'work'} is a symlink in the campaign" in res.stderr, res.stderr
    assert "To fix: remove the symlink" in res.stderr
    with pytest.raises(KvprefetchError):  # as after a swap past the command line's check
        verify(camp / "work", no_gpu=True, jobs=1)
    after = sorted(str(p.relative_to(victim)) for p in victim.rglob("*"))
    assert after == before, "verify-kernel wrote into the folder the link named"


def test_a_scratch_behind_a_maze_of_campaign_links_is_refused_within_seconds(
        tmp_path: Path) -> None:
    camp, node, mine = tmp_path / "camp", tmp_path / "node", tmp_path / "mine"
    node.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH="/usr/bin:/bin")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--batch", "1", "--python", "/bin/echo", "--scratch",
                          str(mine / "s")], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stderr
    reps = (4000 - 10) // len(f"{camp}/l10/..")  # each target as long as a link can be
    for i in range(39):
        target = f"{camp}/l{i + 1}/.." * reps + f"/l{i + 1}"
        (camp / f"l{i}").symlink_to(target[:4095])
    (camp / "l39").symlink_to(node)
    mine.symlink_to(camp / "l0")
    rc, out = _run_bounded(["bash", str(camp / "scripts" / "10-build-baseline.sbatch")],
                           {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"},
                           90)
    assert rc == 2, out
    assert "took more than 2000 steps" in out and "refusing to build in" in out, out
    assert list(node.iterdir()) == []
