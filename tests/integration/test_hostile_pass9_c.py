"""Issue 41, the ninth hostile pass (C): what someone who can write the work directory or a
campaign folder can plant there that earlier passes did not try: hard links at the files the
kit writes in place, and a folder swapped for a symlink while ``apply`` stages its files. Each
test fails without its fix (checked with the fixes stashed):

- a lock file (``.locks/tree-<name>.lock``, ``.lock``) hard-linked to an empty file outside:
  every command that took the lock wrote ``kvprefetch-lock pid N`` into that file and emptied
  it again (its mtime changed); a lock with more than one link is now refused (exit 8);
- a build log hard-linked to a file outside: the build appended its commands' output to it;
  ``runner.open_log`` refuses a log with more than one link, and a build refuses its build
  folder holding any such file before it writes anything (ninja's own files, the compilers'
  objects and the logs are written in place);
- ``slurm prepare`` with ``cache/vllm-0.10.2.tar.gz`` hard-linked to the user's copy of the
  sdist elsewhere: prepare made that copy read-only (``chmod a-w`` through the link); now it
  refuses, naming the link and the copy to make instead;
- ``apply``'s stage ``trees/.<tree>.apply`` swapped for a symlink to a folder outside while it
  copied the files in (a loop of swaps won 2 runs out of 6): ``shutil.copy2`` wrote the staged
  files and made folders behind the link. Every stage write, tree read and move is now relative
  to folders opened ``O_NOFOLLOW`` from the work directory down (``confine.write_file``,
  ``read_file``, ``move_file``, ``ensure_dir``).

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards; the victims of the hard links are checked by their own stat."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI of this checkout (PYTHONPATH at its src: pytest's environment drops it)."""
    env = dict(_env(), PYTHONPATH=str(_REPO / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "kvprefetch", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the build's ninja and nvcc too
        out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, -9, out, err + "\n(timed out)")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _refused(res: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert res.returncode == code, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and "To fix:" in res.stderr, res.stderr
    for n in needles:
        assert n in res.stderr, (n, res.stderr)


def _stat(p: Path) -> tuple[int, int, int, bytes]:
    st = os.stat(p)
    return st.st_mode, st.st_size, st.st_mtime_ns, p.read_bytes()


def _victim(tmp_path: Path, name: str, data: bytes = b"") -> Path:
    v = tmp_path / "victim" / name
    v.parent.mkdir(exist_ok=True)
    v.write_bytes(data)
    os.utime(v, ns=(1_000_000_000, 1_000_000_000))  # an old mtime: any write shows
    return v


def test_a_hard_linked_lock_file_is_refused_and_the_file_elsewhere_untouched(
        tmp_path: Path, fetched_workdir: Path) -> None:
    """A lock file hard-linked to an empty file outside: apply, fetch and clean wrote the
    marker into it and emptied it (its mtime changed). Now refused, exit 8, naming the links."""
    wd = fetched_workdir
    for lock, cmd in ((".locks/tree-patched.lock", ("apply", "--variant", "prefetch")),
                      (".lock", ("fetch",)), (".lock", ("clean", "--what", "all")),
                      (".locks/tree-patched.lock", ("fetch", "--force"))):
        victim = _victim(tmp_path, "empty")
        before = _stat(victim)
        (wd / lock).unlink(missing_ok=True)
        os.link(victim, wd / lock)
        res = _run(*cmd, "--workdir", str(wd))
        _refused(res, 8, "hard links", lock.rsplit("/", 1)[-1])
        assert _stat(victim) == before, (cmd, "the file outside was written through the lock")
        (wd / lock).unlink()
    assert _run("apply", "--workdir", str(wd)).returncode == 0  # the plain lock works again


def test_a_hard_linked_log_is_never_appended_to(tmp_path: Path) -> None:
    """runner.run appended a command's output to a log hard-linked to a file outside."""
    from kvprefetch.errors import ConfigError
    from kvprefetch.runner import run

    victim = _victim(tmp_path, "notes.txt", b"the user's notes\n")
    before = _stat(victim)
    log = tmp_path / "work" / "build" / "logs" / "01-step.log"
    log.parent.mkdir(parents=True)
    os.link(victim, log)
    with pytest.raises(ConfigError, match="hard links"):
        run(["echo", "pwned"], log=log, echo=False)
    assert _stat(victim) == before


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the kernels-only build needs nvcc")
def test_a_build_refuses_a_hard_linked_file_in_its_build_folder(
        tmp_path: Path, fetched_workdir: Path) -> None:
    """A build log hard-linked to a file outside: the build appended its probe's output to it
    (then compiled for minutes). Now the build refuses the folder before writing anything."""
    wd = fetched_workdir
    assert _run("apply", "--workdir", str(wd)).returncode == 0
    plan = _run("build", "--workdir", str(wd), "--trees", "baseline", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    logs = next(line.split("logs:", 1)[1].strip() for line in plan.stdout.splitlines()
                if line.strip().startswith("logs:"))
    victim = _victim(tmp_path, "notes.txt", b"the user's notes\n")
    before = _stat(victim)
    Path(logs).mkdir(parents=True)
    os.link(victim, Path(logs) / "02-probe-torch.log")
    res = _run("build", "--workdir", str(wd), "--trees", "baseline", timeout=90)
    assert _stat(victim) == before, "the build wrote the file outside through its log"
    assert "hard links" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (wd / "envs" / "baseline").exists()  # refused before anything was made


def test_slurm_prepare_never_chmods_a_hard_linked_cached_sdist(
        tmp_path: Path, vllm_sdist: Path) -> None:
    """prepare made the cached sdist read-only: through a hard link, the user's own copy
    elsewhere became mode 444. Now refused (exit 3), the copy's mode kept."""
    camp = tmp_path / "camp"
    res = _run("slurm", "plan", str(camp), "--stand-in", "--no-gpu")
    assert res.returncode == 0, res.stderr
    victim = _victim(tmp_path, "vllm-0.10.2.tar.gz", vllm_sdist.read_bytes())
    os.chmod(victim, 0o644)
    before = _stat(victim)
    os.link(victim, camp / "cache" / "vllm-0.10.2.tar.gz")
    res = _run("slurm", "prepare", str(camp))
    _refused(res, 3, "hard links", "cp --remove-destination")
    assert _stat(victim) == before, "prepare chmodded the file outside through the link"
    (camp / "cache" / "vllm-0.10.2.tar.gz").unlink()
    shutil.copy(victim, camp / "cache" / "vllm-0.10.2.tar.gz")  # the copy the fix names
    assert _run("slurm", "prepare", str(camp)).returncode == 0


def test_an_apply_stage_swapped_for_a_link_writes_nothing_outside(
        tmp_path: Path, fetched_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage swapped for a symlink to a folder outside after apply created it (here, at
    the moment it hashes the tree's first file, which a loop of swaps hits within a few runs):
    shutil.copy2 wrote the old copies and the next files behind the link. Now one PatchError,
    nothing outside, the tree unchanged."""
    from kvprefetch.errors import PatchError
    from kvprefetch.hashing import sha256_file
    from kvprefetch.workspace import treetxn
    from kvprefetch.workspace.workdir import Workdir

    wd = Workdir(fetched_workdir)
    tree = wd.tree("patched")
    rels = ["csrc/attention/attention_kernels.cuh", "csrc/attention/paged_attention_v1.cu",
            "csrc/attention/paged_attention_v2.cu"]
    before = {r: sha256_file(tree / r) for r in rels}
    src = tmp_path / "new"
    changes = {}
    for r in rels:
        (src / r).parent.mkdir(parents=True, exist_ok=True)
        (src / r).write_text(f"// the new {r}\n")
        changes[r] = src / r
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    stage = treetxn.stage_dir(wd, "patched")
    real_hash = treetxn._hash

    def swap_then_hash(p: Path) -> str | None:
        if stage.is_dir() and not stage.is_symlink():
            stage.rename(stage.with_name("moved-stage"))
            stage.symlink_to(elsewhere)
        return real_hash(p)

    monkeypatch.setattr(treetxn, "_hash", swap_then_hash)
    with pytest.raises(Exception) as info:  # noqa: PT011 (checked below, after the folder)
        treetxn.commit(wd, "patched", changes, {"tree": "patched"}, lambda: None)
    assert list(elsewhere.iterdir()) == [], "apply wrote its stage behind the link"
    assert isinstance(info.value, PatchError) and "symlink" in str(info.value), info.value
    assert {r: sha256_file(tree / r) for r in rels} == before


@pytest.mark.parametrize("rel", ["trees/." + "a" * 300 + ".tmp-99999",
                                 "/".join(["d" * 200] * 25) + ".tmp-99999"],
                         ids=["name-over-NAME_MAX", "path-over-PATH_MAX"])
def test_an_ownership_entry_longer_than_a_path_can_be_is_a_corrupt_record(
        fetched_workdir: Path, rel: str) -> None:
    """An ownership entry whose name no file can have (a part over 255 bytes): clean stopped
    with "File name too long ... check the path and its file system", which sends the user to
    the file system, not the record; one over PATH_MAX was "removed" though it never was.
    Now the record is corrupt (exit 2), with the record's fix, and nothing is removed."""
    import json

    wd = fetched_workdir
    record = wd / ".kvprefetch-owned.json"
    data = json.loads(record.read_text())
    data["paths"][rel] = {"kind": "tmp", "pid": 99999}
    record.write_text(json.dumps(data))
    res = _run("clean", "--what", "all", "--discard-edits", "--workdir", str(wd))
    _refused(res, 2, "is corrupt", "longer than a path can be", "--repair")
    assert (wd / "trees" / "patched").is_dir() and (wd / "trees" / "baseline").is_dir()


def test_a_fetch_temporary_swapped_for_a_link_gets_nothing_written_behind_it(
        tmp_path: Path, fetched_workdir: Path) -> None:
    """``fetch --force`` copies the pristine source into ``trees/.<tree>.tmp-<pid>``; a loop
    that swaps that folder for a symlink to a folder outside as soon as it appears (here a
    thread of the test) had shutil.copytree write the tree's files there (2 runs out of 2 by
    hand; the copy takes about a second, so the loop wins it). Now the copy is made relative to
    folders opened O_NOFOLLOW (confine.copy_tree): one FetchError, nothing outside."""
    import glob
    import threading

    wd = fetched_workdir
    with open(wd / "trees" / "patched" / "setup.py", "a") as f:
        f.write("# an edit: fetch --force moves the tree to backup/ and copies it again\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    stop = threading.Event()
    swaps = []

    def swap() -> None:
        while not stop.is_set():
            for tmp in glob.glob(str(wd / "trees" / ".*.tmp-*")):
                try:
                    if os.path.isdir(tmp) and not os.path.islink(tmp):
                        os.rename(tmp, tmp + ".moved")
                        os.symlink(elsewhere, tmp)
                        swaps.append(tmp)
                except OSError:
                    pass

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    try:
        res = _run("fetch", "--force", "--workdir", str(wd))
    finally:
        stop.set()
        t.join()
    assert swaps, "the copy ended before the loop saw its temporary"
    assert list(elsewhere.iterdir()) == [], "fetch copied the tree behind the link"
    # which act meets the swap depends on timing: the folder opened O_NOFOLLOW ("became a
    # symlink"), the moment between the loop's rename and its symlink (no such folder), or a
    # folder made from the work directory down that finds the link already there ("is a
    # symlink": a fresh rehearsal of c051c35 met that one)
    _refused(res, 3)
    assert any(m in res.stderr for m in ("became a symlink", "No such file or directory",
                                          "is a symlink")), res.stderr
