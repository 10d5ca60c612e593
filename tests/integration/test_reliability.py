"""Fault injection (issue 26): the kit as a hostile or unlucky user meets it. Symlinked and
foreign work directories, corrupt state, SIGKILL part-way through fetch, apply and build, a
full disk (a small tmpfs), a read-only work directory and a file that cannot be replaced.

Every case checks the same four things: a clear one-line message with "To fix" and the
family's exit code (no traceback); nothing outside the work directory touched; no user file
lost; and a rerun (after the fault is gone) succeeds. Everything is real: real trees from the
real vLLM 0.10.2 sdist, real git apply, real signals, real mounts (skipped, with the reason,
where this machine does not allow mounting). docs/reliability.md lists the cases."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvprefetch import upstream
from kvprefetch.errors import ConfigError, FetchError, LockError, PatchError
from kvprefetch.runner import run
from kvprefetch.sources.fetch import tree_modifications
from kvprefetch.workspace.workdir import Workdir
from tests.integration.helpers import (
    _kill_session,
    copy_workdir,
    kvprefetch_cli_split,
    seed_downloads,
    tree_bytes,
)

KIT_HEADER = f"{upstream.KIT_HEADER_DIR_IN_TREE}/gqa_twins.cuh"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return kvprefetch_cli_split(*args, env=_env(), timeout=timeout)


def refused(res: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """A clear refusal: the family's exit code, "error: ..." then "To fix: ...", no traceback,
    and every needle in the message."""
    text = res.stderr
    assert res.returncode == code, (res.returncode, text)
    assert "Traceback" not in text and "To fix:" in text, text
    # the message itself (from "error:"), not what a command printed before it: a build's plan
    # names its temporary paths a dozen times, longer under xdist's popen-gwN folders
    assert len(text[text.find("error:"):] if "error:" in text else text) < 4000, text
    for n in needles:
        assert n in text, (n, text)


@pytest.fixture(autouse=True)
def outside(tmp_path: Path) -> Iterator[Path]:
    """A directory outside every work directory, full of files; it must never change (every
    test here checks it; the symlink tests point into it)."""
    d = tmp_path / "outside"
    (d / "patched" / "deep").mkdir(parents=True)
    (d / "patched" / "deep" / "thesis.tex").write_text("three years of work\n")
    (d / "baseline.json").write_text('{"mine": true}\n')
    (d / "notes.txt").write_text("keep me\n")
    before = tree_bytes(d)
    yield d
    assert tree_bytes(d) == before, "something outside the work directory changed"


def _fresh(tmp_path: Path, template: Path, name: str = "work") -> Path:
    return copy_workdir(template, tmp_path / name)


# --------------------------------------------------------------------------- 1. symlinks


def test_clean_never_deletes_or_locks_through_a_symlinked_build_dir(
        fetched_workdir: Path, outside: Path) -> None:
    wd = fetched_workdir
    (wd / "build").symlink_to(outside, target_is_directory=True)
    for args in (("--dry-run",), ()):
        res = cli("clean", "--workdir", str(wd), "--what", "builds", *args)
        assert res.returncode == 0, res.stderr
        assert f"kept {wd / 'build'}: a symlink; clean never follows one" in res.stderr
        assert "removed" not in res.stdout
    res = cli("clean", "--workdir", str(wd), "--what", "all", "--discard-edits")
    assert res.returncode == 0, res.stderr
    assert not (wd / "trees" / "patched").exists()  # the kit's own trees did go
    assert (wd / "build").is_symlink()
    # rerun: the work directory is still usable
    assert cli("fetch", "--workdir", str(wd), "--source", "sdist").returncode == 0


def test_clean_never_deletes_through_a_symlinked_state_dir(fetched_workdir: Path,
                                                           outside: Path, tmp_path: Path) -> None:
    wd = fetched_workdir
    real_state = tmp_path / "state-elsewhere"
    shutil.move(wd / "state", real_state)
    (wd / "state").symlink_to(real_state, target_is_directory=True)
    # the user's own file in the symlinked directory, beside the kit's records
    (real_state / "mine.json").write_text("{}\n")
    (wd / "build").mkdir()
    (wd / "build" / "x").symlink_to(outside, target_is_directory=True)
    res = cli("clean", "--workdir", str(wd), "--what", "all")
    assert res.returncode == 0, res.stderr
    assert (real_state / "mine.json").read_text() == "{}\n"
    assert (real_state / "patched.json").is_file()  # reached through a symlink: kept
    assert f"{wd / 'state'}: a symlink" in res.stderr
    assert f"kept {wd / 'build' / 'x'}: not created by kvprefetch" in res.stderr


def test_a_symlink_inside_a_kit_build_dir_is_unlinked_not_followed(
        fetched_workdir: Path, outside: Path) -> None:
    wd = fetched_workdir
    from kvprefetch.workspace import ownership

    bdir = wd / "build" / "patched"
    bdir.mkdir(parents=True)
    ownership.record(wd, bdir, "build")  # as the builder records the directory it builds in
    (bdir / "k1").mkdir()
    (bdir / "k1" / "link").symlink_to(outside, target_is_directory=True)
    (bdir / "tolink").symlink_to(outside / "patched", target_is_directory=True)
    res = cli("clean", "--workdir", str(wd), "--what", "builds")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"removed {bdir}"
    assert not bdir.exists()


# --------------------------------------------------------------------------- 2. adoption


def test_fetch_refuses_a_non_empty_directory_it_did_not_create(tmp_path: Path, vllm_sdist: Path,
                                                               outside: Path) -> None:
    home = tmp_path / "home"
    for rel in ("notes.txt", "build/mine/x.o", "backup/old/y", "state/foo.json",
                "pristine/z", "trees/draft/a.py"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(f"user file {rel}\n")
    before = tree_bytes(home)
    for dry in ((), ("--dry-run",)):
        res = cli("fetch", "--workdir", str(home), "--source", str(vllm_sdist), *dry)
        refused(res, ConfigError.exit_code, f"--workdir {home} is not empty", "--adopt")
        assert tree_bytes(home) == before

    res = cli("fetch", "--workdir", str(home), "--source", str(vllm_sdist), "--adopt")
    assert res.returncode == 0, res.stderr
    res = cli("clean", "--workdir", str(home), "--what", "all", "--discard-edits")
    assert res.returncode == 0, res.stderr
    after = tree_bytes(home)
    for rel, digest in before.items():
        assert after.get(rel) == digest, f"the user's {rel} was lost"
    for rel in ("build/mine", "backup/old", "state/foo.json", "pristine/z", "trees/draft"):
        assert f"kept {home / rel}: not created by kvprefetch" in res.stderr
    assert not (home / "trees" / "patched").exists()
    res = cli("fetch", "--workdir", str(home), "--source", str(vllm_sdist))  # rerun: tagged now
    assert res.returncode == 0, res.stderr


# --------------------------------------------------------------------------- 3. and 4. apply


def test_apply_never_overwrites_a_user_file_at_a_path_the_patch_adds(
        fetched_workdir: Path) -> None:
    mine = fetched_workdir / "trees" / "patched" / KIT_HEADER
    mine.parent.mkdir(exist_ok=True)
    mine.write_text("// my own grouped kernel\n")
    before = tree_bytes(fetched_workdir / "trees")
    res = cli("apply", "--workdir", str(fetched_workdir))
    refused(res, PatchError.exit_code, f"A {KIT_HEADER}", "left untouched")
    assert mine.read_text() == "// my own grouped kernel\n"
    assert tree_bytes(fetched_workdir / "trees") == before
    mine.rename(fetched_workdir / "mine.cuh")  # the user keeps it elsewhere; rerun
    res = cli("apply", "--workdir", str(fetched_workdir), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["action"] == "applied", res.stderr


def test_apply_never_absorbs_an_edit_into_the_recorded_state(fetched_workdir: Path) -> None:
    wd = Workdir(fetched_workdir)
    edited = wd.tree("patched") / "vllm" / "envs.py"
    edited.write_text(edited.read_text() + "# my experiment\n")
    state_before = wd.state_file("patched").read_bytes()
    res = cli("apply", "--workdir", str(fetched_workdir))
    refused(res, PatchError.exit_code, "M vllm/envs.py", "left untouched")
    assert wd.state_file("patched").read_bytes() == state_before
    assert "# my experiment" in edited.read_text()
    assert tree_modifications(wd, "patched") == ["M vllm/envs.py"]
    res = cli("fetch", "--workdir", str(fetched_workdir), "--source", "sdist")
    refused(res, PatchError.exit_code, "patched: M vllm/envs.py")
    # the edit made after a correct apply is not hidden by diff-upstream --check either
    res = cli("fetch", "--workdir", str(fetched_workdir), "--source", "sdist", "--force")
    assert res.returncode == 0, res.stderr
    assert cli("apply", "--workdir", str(fetched_workdir)).returncode == 0
    assert cli("diff-upstream", "--workdir", str(fetched_workdir), "--check").returncode == 0
    edited.write_text(edited.read_text() + "# after the patch\n")
    res = cli("diff-upstream", "--workdir", str(fetched_workdir), "--check")
    assert res.returncode == 1 and "M vllm/envs.py" in res.stderr and "To fix:" in res.stderr
    backups = list((fetched_workdir / "backup").iterdir())
    assert len(backups) == 1 and "# my experiment" in (backups[0] / "vllm" / "envs.py").read_text()


# --------------------------------------------------------------------------- 5. corrupt state

CORRUPTIONS = {
    "truncated": lambda b: b[: len(b) // 2],
    "empty-object": lambda b: b"{}",
    "list": lambda b: b"[]",
    "nul-bytes": lambda b: b"\0" * 64,
    "wrong-types": lambda b: json.dumps({**json.loads(b), "inventory": "all of it",
                                         "applied": 5}).encode(),
    "foreign": lambda b: json.dumps({**json.loads(b), "tree": "someone-else",
                                     "vllm_version": "0.10.1"}).encode(),
    "directory": None,
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_corrupt_state_file_is_one_clear_error_and_repair_recovers(
        kind: str, tmp_path: Path, fetched_template: Path, outside: Path) -> None:
    work = _fresh(tmp_path, fetched_template)
    sp = work / "state" / "patched.json"
    if kind == "directory":
        sp.unlink()
        (sp / "inner").mkdir(parents=True)
    else:
        corrupt = CORRUPTIONS[kind]
        assert corrupt is not None
        sp.write_bytes(corrupt(sp.read_bytes()))
    trees_before = tree_bytes(work / "trees")
    for args, code in ((("fetch", "--source", "sdist"), PatchError.exit_code),
                       (("apply",), PatchError.exit_code),
                       (("diff-upstream", "--check"), PatchError.exit_code),
                       (("build", "--kernels-only", "--skip-doctor", "--dry-run"),
                        PatchError.exit_code)):
        res = cli(*args[:1], "--workdir", str(work), *args[1:])
        refused(res, code, f"the state file {sp}", "--repair")
    assert tree_bytes(work / "trees") == trees_before
    # clean still works: builds, and trees judged by the ownership record's content hash
    res = cli("clean", "--workdir", str(work), "--what", "builds")
    assert res.returncode == 0, res.stderr
    res = cli("clean", "--workdir", str(work), "--what", "trees", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    assert str(work / "trees" / "patched") in json.loads(res.stdout)["removed"]
    if kind == "directory":
        res = cli("fetch", "--workdir", str(work), "--source", "sdist", "--repair")
        refused(res, FetchError.exit_code, f"{sp} is not a regular file")
        assert (sp / "inner").is_dir()  # not the kit's: not removed
        shutil.rmtree(sp)
    res = cli("fetch", "--workdir", str(work), "--source", "sdist", "--repair")
    assert res.returncode == 0, res.stderr
    assert f"rebuilt {sp}" in res.stderr
    res = cli("apply", "--workdir", str(work), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["action"] == "applied", res.stderr
    assert cli("diff-upstream", "--workdir", str(work), "--check").returncode == 0


def test_repair_never_absorbs_an_edit(fetched_workdir: Path) -> None:
    wd = Workdir(fetched_workdir)
    assert cli("apply", "--workdir", str(fetched_workdir)).returncode == 0
    edited = wd.tree("patched") / "setup.py"
    edited.write_text(edited.read_text() + "# mine\n")
    wd.state_file("patched").write_text("{}")
    res = cli("fetch", "--workdir", str(fetched_workdir), "--source", "sdist", "--repair")
    assert res.returncode == 0, res.stderr
    assert "(the prefetch patch); the tree also differs from that in: M setup.py" in res.stderr
    assert tree_modifications(wd, "patched") == ["M setup.py"]
    res = cli("apply", "--workdir", str(fetched_workdir))
    refused(res, PatchError.exit_code, "M setup.py")


def test_a_directory_in_place_of_a_lock_is_a_lock_error(fetched_workdir: Path) -> None:
    lock = Workdir(fetched_workdir).tree_lock("patched")
    lock.unlink(missing_ok=True)  # (the empty lock file fetch left)
    (lock / "x").mkdir(parents=True)
    for args in (("apply",), ("fetch", "--source", "sdist"), ("clean", "--what", "trees")):
        res = cli(args[0], "--workdir", str(fetched_workdir), *args[1:])
        refused(res, LockError.exit_code, f"cannot take the lock {lock}: it is a directory")
    assert (lock / "x").is_dir()
    shutil.rmtree(lock)
    assert cli("apply", "--workdir", str(fetched_workdir)).returncode == 0


def test_a_corrupt_ownership_record_stops_clean_with_a_message(fetched_workdir: Path) -> None:
    from kvprefetch.workspace import ownership

    (fetched_workdir / ownership.OWNED_FILE).write_text("[1, 2")
    before = tree_bytes(fetched_workdir / "trees")
    res = cli("clean", "--workdir", str(fetched_workdir), "--what", "all")
    refused(res, ConfigError.exit_code, f"the ownership record {fetched_workdir}")
    assert tree_bytes(fetched_workdir / "trees") == before


# --------------------------------------------------------------------------- 6. full disk


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs: room for the unpacked sdist (about 40 MB), not for a tree beside it."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], echo=False,
              check=False)
    if res.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): "
                    f"{res.output.strip()}")
    try:
        yield mnt
    finally:
        run(["umount", "-l", str(mnt)], echo=False, check=False)


def _remount(mnt: Path, opts: str) -> None:
    run(["mount", "-o", f"remount,{opts}", str(mnt)], echo=False)


def _debris(work: Path) -> list[str]:
    return sorted(str(p.relative_to(work)) for p in work.rglob("*.tmp-*"))


def test_a_full_disk_during_fetch_is_one_message_and_leaves_nothing(
        small_tmpfs: Path, vllm_sdist: Path, outside: Path) -> None:
    work = small_tmpfs / "work"
    for _ in range(2):  # a retry on the still-full disk leaks nothing either
        res = cli("fetch", "--workdir", str(work), "--source", str(vllm_sdist))
        refused(res, FetchError.exit_code, "No space left on device")
        assert _debris(work) == []
        assert not list((work / "trees").glob(".*"))
        assert not (work / "trees" / "baseline").exists()
    _remount(small_tmpfs, "size=256m")
    res = cli("fetch", "--workdir", str(work), "--source", str(vllm_sdist), "--json")
    assert res.returncode == 0, res.stderr
    assert [t["action"] for t in json.loads(res.stdout)["trees"]] == ["created", "created"]


def test_a_read_only_work_directory_is_one_message(small_tmpfs: Path, fetched_template: Path,
                                                    outside: Path) -> None:
    _remount(small_tmpfs, "size=256m")
    work = small_tmpfs / "work"
    shutil.copytree(fetched_template, work, symlinks=True)  # no hard links across devices
    _remount(small_tmpfs, "ro")
    try:
        before = tree_bytes(work)
        refused(cli("apply", "--workdir", str(work)), PatchError.exit_code,
                "Read-only file system")
        refused(cli("fetch", "--workdir", str(work), "--source", "sdist", "--force",
                    "--extra-tree", "x"), FetchError.exit_code, "Read-only file system")
        refused(cli("clean", "--workdir", str(work), "--what", "all"), ConfigError.exit_code,
                "Read-only file system")
        assert tree_bytes(work) == before
    finally:
        _remount(small_tmpfs, "rw")
    assert cli("apply", "--workdir", str(work)).returncode == 0


def test_a_file_that_cannot_be_replaced_rolls_the_whole_apply_back(fetched_workdir: Path) -> None:
    """git apply used to be trusted after a failed write (2 of 3 files patched, "success").
    A read-only bind mount over one of the files makes that write fail for real."""
    tree = fetched_workdir / "trees" / "patched"
    target = tree / "csrc" / "attention" / "paged_attention_v2.cu"
    res = run(["mount", "--bind", str(target), str(target)], echo=False, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.output.strip()}")
    try:
        run(["mount", "-o", "remount,bind,ro", str(target)], echo=False)
        before = tree_bytes(fetched_workdir)
        res = cli("apply", "--workdir", str(fetched_workdir))
        refused(res, PatchError.exit_code, str(target))
        after = tree_bytes(fetched_workdir)
        assert after == before, sorted(k for k in after if after.get(k) != before.get(k))
    finally:
        run(["umount", str(target)], echo=False, check=False)
    res = cli("apply", "--workdir", str(fetched_workdir), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["action"] == "applied", res.stderr


# --------------------------------------------------------------------------- 7. SIGKILL


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvprefetch", *args], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _kill_after(proc: subprocess.Popen, delay: float,
                when: Callable[[], bool] | None = None) -> bool:
    """SIGKILL the run (its whole session) after ``delay`` s, or as soon as ``when()`` is true;
    True when it was still running."""
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < (delay if when is None else 60):
        if when is not None and when():
            break
        time.sleep(0.002)
    alive = proc.poll() is None
    _kill_session(proc.pid)
    proc.wait()
    return alive


def _consistent(work: Path, applied: bool) -> None:
    """After the rerun: trees as recorded, fetch sees nothing to do, diff-upstream agrees."""
    wd = Workdir(work)
    for n in ("baseline", "patched"):
        assert tree_modifications(wd, n) == [], n
    res = cli("fetch", "--workdir", str(work), "--source", "sdist", "--json")
    assert res.returncode == 0, res.stderr
    assert [t["action"] for t in json.loads(res.stdout)["trees"]] == ["unchanged", "unchanged"]
    if applied:
        assert cli("diff-upstream", "--workdir", str(work), "--check").returncode == 0
    assert _debris(work) == [] and not (work / "trees" / ".patched.apply").exists()


# delays cover python's start, the checks, staging and the renames of one apply (~1 s here);
# the triggered kills land exactly when its staging starts, when its journal is written, and
# right after the first file of the tree changed, and right after the kit's header appeared
# (patched files written, state not yet: the window that used to leave a stuck tree)
APPLY_KILLS = [("delay", 0.4), ("delay", 0.7), ("delay", 1.0), ("delay", 1.3),
               ("stage", ".patched.apply"), ("journal", ".patched.apply/journal.json"),
               ("first-write", upstream.ATTENTION_HEADER), ("kit-header", KIT_HEADER)]


@pytest.mark.parametrize(("how", "at"), APPLY_KILLS, ids=[f"{h}-{a}" for h, a in APPLY_KILLS])
def test_sigkill_during_apply_then_rerun(how: str, at: float | str, tmp_path: Path,
                                         fetched_template: Path, outside: Path) -> None:
    work = _fresh(tmp_path, fetched_template)
    tree = work / "trees" / "patched"
    first = (tree / upstream.ATTENTION_HEADER).stat()
    proc = _start("apply", "--workdir", str(work))
    if how == "delay":
        _kill_after(proc, float(at))
    elif how == "first-write":
        def changed() -> bool:
            try:
                st = (tree / str(at)).stat()
            except FileNotFoundError:
                return True
            return (st.st_ino, st.st_mtime_ns, st.st_size) != \
                (first.st_ino, first.st_mtime_ns, first.st_size)
        assert _kill_after(proc, 0, changed), "apply finished before it was killed"
    elif how == "kit-header":
        assert _kill_after(proc, 0, (tree / str(at)).exists), "apply finished before the kill"
    else:
        _kill_after(proc, 0, (tree.parent / str(at)).exists)
    # whatever the kill interrupted, every command agrees about the tree afterwards
    res = cli("apply", "--workdir", str(work), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["action"] in ("applied", "already-applied")
    _consistent(work, applied=True)


FETCH_KILLS = [0.8, 1.6, 2.4, 3.2]


@pytest.mark.parametrize("delay", FETCH_KILLS)
def test_sigkill_during_fetch_then_rerun(delay: float, tmp_path: Path, vllm_sdist: Path,
                                         outside: Path) -> None:
    work = tmp_path / "work"
    seed_downloads(work, vllm_sdist)
    _kill_after(_start("fetch", "--workdir", str(work), "--source", "sdist"), delay)
    res = cli("fetch", "--workdir", str(work), "--source", "sdist")
    assert res.returncode == 0, res.stderr
    _consistent(work, applied=False)


def test_clean_removes_the_orphans_of_a_killed_fetch(tmp_path: Path, vllm_sdist: Path) -> None:
    work = tmp_path / "work"
    seed_downloads(work, vllm_sdist)
    proc = _start("fetch", "--workdir", str(work), "--source", "sdist")
    # kill while the first tree is being copied: its temporary directory is the orphan
    orphan = None
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 60 and orphan is None:
        orphan = next(iter((work / "trees").glob(".baseline.tmp-*")), None) \
            if (work / "trees").is_dir() else None
        time.sleep(0.005)
    assert orphan is not None, "fetch finished before its first tree was copied"
    _kill_after(proc, 0)
    assert orphan.exists()
    res = cli("clean", "--workdir", str(work), "--what", "builds")
    assert res.returncode == 0, res.stderr
    assert f"removed {orphan}" in res.stdout
    assert _debris(work) == [] and not orphan.exists()
    assert cli("fetch", "--workdir", str(work), "--source", "sdist").returncode == 0


BUILD_KILLS = [1.5, 4.0]


@pytest.mark.parametrize("delay", BUILD_KILLS)
def test_sigkill_during_build_leaves_trees_and_locks_usable(
        delay: float, tmp_path: Path, fetched_template: Path, outside: Path) -> None:
    """The build is killed early (environment, probe, first compile); finishing a real
    compile after a kill is the session build's job (conftest.kernels_build)."""
    work = _fresh(tmp_path, fetched_template)
    assert cli("apply", "--workdir", str(work)).returncode == 0
    _kill_after(_start("build", "--workdir", str(work), "--kernels-only", "--skip-doctor",
                       "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes", "fp16"),
                delay)
    res = cli("apply", "--workdir", str(work), "--json")  # the tree lock was released
    assert res.returncode == 0 and json.loads(res.stdout)["action"] == "already-applied"
    _consistent(work, applied=True)
    res = cli("clean", "--workdir", str(work), "--what", "builds")
    assert res.returncode == 0, res.stderr
    assert [p for p in work.glob("build/*") if p.is_dir()] == []


# --------------------------------------------------------------------------- weak points


def _flock_holders() -> set[int]:
    """Pids holding a flock (from /proc/locks)."""
    out = set()
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if len(f) > 4 and f[1] == "FLOCK" and f[4].isdigit():
            out.add(int(f[4]))
    return out


def test_apply_fetch_clean_and_build_share_the_tree_lock(fetched_workdir: Path) -> None:
    """A real `apply` is stopped (SIGSTOP) right after it took its first lock; fetch --force,
    clean and build must then be refused, not move or delete the tree under it."""
    wd = Workdir(fetched_workdir)
    edited = wd.tree("patched") / "setup.py"
    edited.write_text(edited.read_text() + "# mine\n")
    before = tree_bytes(fetched_workdir / "trees")
    proc = _start("apply", "--workdir", str(fetched_workdir))
    try:
        t0 = time.monotonic()
        while proc.pid not in _flock_holders() and time.monotonic() - t0 < 30 \
                and proc.poll() is None:
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGSTOP)
        assert proc.poll() is None, "apply finished before it could be stopped"
        for args in (("fetch", "--source", "sdist", "--force"), ("clean", "--what", "trees"),
                     ("build", "--kernels-only", "--skip-doctor", "--trees", "patched")):
            res = cli(args[0], "--workdir", str(fetched_workdir), *args[1:])
            refused(res, LockError.exit_code, f"pid {proc.pid}")
        assert tree_bytes(fetched_workdir / "trees") == before
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=60)
    assert "# mine" in edited.read_text()  # apply refused the edited tree; nothing lost
    assert cli("fetch", "--workdir", str(fetched_workdir), "--source", "sdist",
               "--force").returncode == 0
    assert cli("apply", "--workdir", str(fetched_workdir)).returncode == 0


def test_clean_keeps_backups_and_edited_trees_without_discard_edits(
        fetched_workdir: Path) -> None:
    wd = Workdir(fetched_workdir)
    edited = wd.tree("baseline") / "setup.py"
    edited.write_text(edited.read_text() + "# mine\n")
    assert cli("fetch", "--workdir", str(fetched_workdir), "--source", "sdist",
               "--force").returncode == 0
    (backup,) = (fetched_workdir / "backup").iterdir()
    edited.write_text(edited.read_text() + "# again\n")
    res = cli("clean", "--workdir", str(fetched_workdir), "--what", "trees", "--json")
    assert res.returncode == 0, res.stderr
    kept = {k["path"]: k["reason"] for k in json.loads(res.stdout)["kept"]}
    assert "--discard-edits" in kept[str(backup)]
    assert "M setup.py" in kept[str(wd.tree("baseline"))]
    assert "# mine" in (backup / "setup.py").read_text() and "# again" in edited.read_text()
    assert not wd.tree("patched").exists()  # the unedited tree went
    res = cli("clean", "--workdir", str(fetched_workdir), "--what", "trees", "--discard-edits")
    assert res.returncode == 0, res.stderr
    assert not backup.exists() and not wd.tree("baseline").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (("fetch", "--allow-commit", "5"), "not a full 40-digit"),
    (("fetch", "--repo-url", "ext::sh -c touch% /tmp/kvprefetch-pwned"),
     "refusing a git transport"),
    (("fetch", "--repo-url", "fd::17"), "refusing a git transport"),
    (("fetch", "--extra-tree", "../x"), "is not a tree name"),
    (("apply", "--tree", "../../x"), "is not a tree name"),
    (("diff-upstream", "--tree", "../x"), "is not a tree name"),
    (("build", "--kernels-only", "--skip-doctor", "--trees", "baseline,../../x"),
     "is not a tree name"),
])
def test_hostile_inputs_are_refused_at_the_edge(args: tuple[str, ...], needle: str,
                                                shared_workdir: Path) -> None:
    before = tree_bytes(shared_workdir)
    res = cli(args[0], "--workdir", str(shared_workdir), *args[1:])
    refused(res, ConfigError.exit_code, needle)
    assert tree_bytes(shared_workdir) == before
    assert not Path("/tmp/kvprefetch-pwned").exists()


@pytest.mark.parametrize("opt", ["--jobs=-1", "--nvcc-threads=-5", "--jobs=0"])
def test_counts_are_validated(opt: str, shared_workdir: Path) -> None:
    res = cli("build", "--workdir", str(shared_workdir), "--kernels-only", "--skip-doctor",
              "--dry-run", opt)
    assert res.returncode == 2 and "Invalid value" in res.stderr and "Traceback" not in res.stderr


@pytest.fixture(scope="module")
def shared_workdir(tmp_path_factory: pytest.TempPathFactory, fetched_template: Path) -> Path:
    return copy_workdir(fetched_template, tmp_path_factory.mktemp("rel") / "work")


def test_a_partial_or_mislabelled_source_directory_is_refused(tmp_path: Path,
                                                              fetched_template: Path) -> None:
    pristine = fetched_template / "pristine" / "sdist"
    partial = tmp_path / "three-files"
    for rel in upstream.PRISTINE_SHA256:
        (partial / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pristine / rel, partial / rel)
    labelled = tmp_path / "vllm-0.10.1"
    shutil.copytree(pristine, labelled)
    pkg = labelled / "PKG-INFO"
    pkg.write_text(pkg.read_text().replace("Version: 0.10.2", "Version: 0.10.1", 1))
    for src in (partial, labelled):
        work = tmp_path / f"work-{src.name}"
        res = cli("fetch", "--workdir", str(work), "--source", str(src))
        refused(res, FetchError.exit_code, "is not the complete vLLM v0.10.2 source")
        assert not (work / "trees").exists()
    res = cli("fetch", "--workdir", str(tmp_path / "w"), "--source", str(pristine))  # rerun
    assert res.returncode == 0, res.stderr


def test_an_edited_pristine_copy_is_not_copied_into_new_trees(fetched_workdir: Path) -> None:
    setup = fetched_workdir / "pristine" / "sdist" / "setup.py"
    text = setup.read_text()
    setup.unlink()  # pristine/ is hard-linked to the session's template: write a new file
    setup.write_text(text + "# poisoned\n")
    res = cli("fetch", "--workdir", str(fetched_workdir), "--source", "sdist",
              "--extra-tree", "exp")
    refused(res, FetchError.exit_code, "was changed after kvprefetch verified it")
    assert not (fetched_workdir / "trees" / "exp").exists()
    shutil.move(fetched_workdir / "pristine" / "sdist", fetched_workdir / "poisoned")  # the fix
    res = cli("fetch", "--workdir", str(fetched_workdir), "--source", "sdist",
              "--extra-tree", "exp")
    assert res.returncode == 0, res.stderr
    assert "# poisoned" not in (fetched_workdir / "trees" / "exp" / "setup.py").read_text()
