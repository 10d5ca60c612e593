"""Issue 41, the twelfth hostile pass (tester w: the acts by path the eleventh pass's sweep
listed and nobody had attacked). Each test fails without its fix (checked by reverting ``src``
and running it).

Where a test calls the kit's function in this process instead of the CLI (the environment's
creation), it says so: the CLI would go on to compile for minutes after it, and the act under
test is the same function. The racing process (the swap loop) is a real process, the files
are real. The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import tree_bytes
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

# renameat2(RENAME_EXCHANGE) flips a folder and a link to the outside (pass 11 t's swapper)
_SWAPPER = r'''
import ctypes, os, sys, time
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
    time.sleep(0.001)
    exchange()
    time.sleep(0.001)
os.unlink(link)
'''


def _work(tmp_path: Path) -> Path:
    """A work directory with an ownership record (the kit's own, written by the kit)."""
    from kvprefetch.workspace import ownership

    work = tmp_path / "work"
    (work / "envs").mkdir(parents=True)
    ownership.record(work, work / "state" / "baseline.json", "state")
    return work


def _venv(path: Path):  # type: ignore[no-untyped-def]
    from kvprefetch.machine.envs import VenvEnv

    return VenvEnv(path, python=sys.executable, system_site_packages=True, with_pip=False)


def test_a_users_folder_named_like_an_env_temporary_is_kept(tmp_path: Path) -> None:
    """Environment creation removed every ``envs/<tree>.tmp-*`` as "debris", whatever it was:
    a user's ``envs/baseline.tmp-mine/notes.txt`` was deleted by a kernels-only ``build``
    (seen with the CLI). Now only a temporary the ownership record names as a dead run's goes;
    the user's folder stays. (``VenvEnv.create`` is called as the build calls it.)"""
    from kvprefetch.workspace import ownership

    work = _work(tmp_path)
    mine = work / "envs" / "baseline.tmp-mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    dead = work / "envs" / "baseline.tmp-999999"  # a killed creation's, recorded
    (dead / "bin").mkdir(parents=True)
    ownership.record(work, dead, "tmp", pid=999999)
    env = _venv(work / "envs" / "baseline").create(owner=work)
    assert env.exists()
    assert (mine / "notes.txt").read_text() == "my notes\n"
    assert not dead.exists()
    assert "envs/baseline.tmp-999999" not in ownership.entries(work)


def test_env_creation_under_a_swap_loop_on_envs_acts_on_nothing_outside(
        tmp_path: Path) -> None:
    """``envs/`` swapped for a link to a folder outside and back while environments are made:
    the creation looked for a killed run's stamp, removed the half-made env, the temporaries
    and the stamp, made the folder, ran venv and renamed by path, so the outside folder's own
    ``<tree>/`` (beside a ``.<tree>.creating``) was deleted in 3 runs of 11 of the CLI. Now the
    kit removes, renames and writes relative to folders opened without following a link, and
    venv builds in a private folder outside the work directory: each creation succeeds or is
    refused, and nothing outside changes (a folder outside holding them).
    (``VenvEnv.create`` is called here, 12 environments, as the build calls it.)"""
    from kvprefetch.errors import KvprefetchError, LockError

    work = _work(tmp_path)
    outside = tmp_path / "victim"
    outside.mkdir()
    names = [f"t{i}" for i in range(12)]
    for n in names:  # what a swapped-in envs/ shows the creation: a stamp and a "half-made" env
        (outside / f".{n}.creating").write_text('{"pid": 1}\n')
        (outside / n).mkdir()
        (outside / n / "keep.txt").write_text("the user's\n")
        (outside / f"{n}.tmp-1").mkdir()
        (outside / f"{n}.tmp-1" / "keep.txt").write_text("the user's\n")
    before = tree_bytes(outside)
    stop = tmp_path / "stop-swapping"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(work / "envs"),
                                str(outside), str(stop)], stdout=subprocess.PIPE, text=True)
    made = refused = 0
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        for n in names:
            for _ in range(400):  # a lock refused (envs/ a link at that moment) is no try
                try:
                    _venv(work / "envs" / n).create(owner=work)
                    made += 1
                except LockError:
                    time.sleep(0.005)
                    continue
                except (KvprefetchError, OSError):
                    refused += 1
                break
    finally:
        stop.touch()
        swapper.wait(timeout=30)
        if swapper.stdout is not None:
            swapper.stdout.close()
    assert swapper.returncode == 0, "the swap loop stopped early"
    assert tree_bytes(outside) == before, "the creation acted on the folder outside"
    assert made + refused == len(names), (made, refused)
    assert os.path.isdir(work / "envs") and not os.path.islink(work / "envs")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# --------------------------------------------------------------------------- deps archives
_NAMES = ("cutlass", "flash-attention", "FlashMLA")
_COMMIT = "0123456789ab"


def _member(tf, name: str, data: bytes = b"x", **attrs: object) -> None:  # type: ignore[no-untyped-def]
    import io
    import tarfile

    info = tarfile.TarInfo(name)
    for k, v in attrs.items():
        setattr(info, k, v)
    info.size = len(data) if info.type == tarfile.REGTYPE else 0
    tf.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)


def _deps_dir(tmp_path: Path, extra: dict[str, object] | None = None) -> Path:
    """``--deps-dir`` with three archives of the shape vLLM's deps have (one top-level folder
    holding the header the configure reads) and their ``SHA256SUMS``; ``extra``: one more
    member of cutlass's archive (its name, and TarInfo attributes)."""
    import hashlib
    import tarfile

    d = tmp_path / "D"
    d.mkdir()
    sums = []
    for n in _NAMES:
        top = f"{n}-{_COMMIT}"
        path = d / f"{top}.tar.gz"
        with tarfile.open(path, "w:gz") as tf:
            _member(tf, f"{top}/include/cutlass/cutlass.h")
            _member(tf, f"{top}/csrc/cutlass/include/cutlass/cutlass.h")
            if extra is not None and n == "cutlass":
                attrs = dict(extra)
                _member(tf, str(attrs.pop("name")), **attrs)
        sums.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    (d / "SHA256SUMS").write_text("".join(sums))
    return d


def _unpack(deps: Path, work: Path):  # type: ignore[no-untyped-def]
    """``unpack_archives`` as the build's unpack-deps step calls it (before this pass it took
    the unpack folder, ``work/deps``; now the work directory)."""
    import inspect

    from kvprefetch.sources.deps import unpack_archives

    second = list(inspect.signature(unpack_archives).parameters)[1]
    return unpack_archives(deps, work / "deps" if second == "unpack_root" else work)


def test_deps_unpack_never_acts_through_a_deps_folder_planted_as_a_link(tmp_path: Path) -> None:
    """``work/deps`` a link to a folder outside holding a ``cutlass-<commit>/`` of the user's:
    a full build's unpack step deleted that folder with the user's file in it and unpacked
    the three archives there (seen with the CLI, ``build --mode full --deps-dir``). Now one
    FetchError naming the link; the folder outside is byte-identical. (The step's function is
    called here: the CLI reaches it after making a venv with pip.)"""
    from kvprefetch.errors import KvprefetchError

    deps = _deps_dir(tmp_path)
    work = _work(tmp_path)
    victim = tmp_path / "victim"
    (victim / f"cutlass-{_COMMIT}").mkdir(parents=True)
    (victim / f"cutlass-{_COMMIT}" / "mine.txt").write_text("the user's\n")
    before = tree_bytes(victim)
    os.symlink(victim, work / "deps")
    with pytest.raises(KvprefetchError) as err:
        _unpack(deps, work)
    assert "symlink" in str(err.value)
    assert tree_bytes(victim) == before


def test_deps_unpack_never_removes_a_folder_it_did_not_unpack(tmp_path: Path) -> None:
    """A ``work/deps/cutlass-<commit>/`` without the kit's stamp (the user's own) was removed
    to make room; now it is named as in the way, and kept."""
    from kvprefetch.errors import KvprefetchError

    deps = _deps_dir(tmp_path)
    work = _work(tmp_path)
    mine = work / "deps" / f"cutlass-{_COMMIT}"
    mine.mkdir(parents=True)
    (mine / "mine.txt").write_text("the user's\n")
    with pytest.raises(KvprefetchError) as err:
        _unpack(deps, work)
    assert "in the way" in str(err.value) and "To fix" not in err.value.cause
    assert (mine / "mine.txt").read_text() == "the user's\n"
    # and a clean unpack, then a second one that keeps it
    mine_moved = tmp_path / "moved"
    mine.rename(mine_moved)
    done = _unpack(deps, work)
    assert len(done) == 3 and all((p / ".kvprefetch-sha256").is_file() for p in done)
    assert _unpack(deps, work) == done
    assert not [p for p in (work / "deps").iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("member", [
    {"name": f"cutlass-{_COMMIT}/../../escaped"},
    {"name": f"cutlass-{_COMMIT}/out", "type": b"2", "linkname": "/etc/passwd"},
    {"name": f"cutlass-{_COMMIT}/hard", "type": b"1", "linkname": "../../victim/x"},
    {"name": f"cutlass-{_COMMIT}/null", "type": b"3", "devmajor": 1, "devminor": 3},
], ids=["dotdot", "symlink-out", "hardlink-out", "device"])
def test_a_hostile_deps_archive_is_one_fetch_error(tmp_path: Path,
                                                   member: dict[str, object]) -> None:
    """An archive listed in ``SHA256SUMS`` (the user's) with a member outside its folder, a
    link out, a hard link to outside or a device: tarfile's ``data`` filter refused it, but
    its ``OutsideDestinationError`` (and the rest) went up as a traceback (seen with the CLI).
    Now one FetchError naming the archive; nothing is unpacked into ``deps/``. (An absolute
    member the filter makes relative, so it lands in the private folder beside the archive's
    own, and is left there: not a case here.)"""
    from kvprefetch.errors import FetchError

    deps = _deps_dir(tmp_path, member)
    work = _work(tmp_path)
    with pytest.raises(FetchError) as err:
        _unpack(deps, work)
    assert "cutlass" in str(err.value)
    assert not (tmp_path / "escaped").exists()
    assert not (work / "deps").exists() or not list((work / "deps").iterdir())


# --------------------------------------------------------------------------- small items
@pytest.mark.parametrize("tail", ["garbage", "cut"])
def test_a_gzipped_result_with_bytes_after_it_or_cut_short_is_refused(tmp_path: Path,
                                                                     tail: str) -> None:
    """A ``.json.gz`` result with bytes after its gzip stream, or its stream cut before the
    CRC (the JSON inside whole): ``report`` read it as a good result (the eleventh pass left
    it open). Now one BenchError naming the file and what is wrong, exit 7, no report."""
    import gzip
    import json

    from kvprefetch.errors import BenchError
    from tests.integration.test_reliability import cli, refused
    from tests.unit.test_report import kernel_doc

    good = gzip.compress(json.dumps(kernel_doc()).encode())
    path = tmp_path / "r.json.gz"
    path.write_bytes(good + b"not gzip at all" if tail == "garbage" else good[:-6])
    res = cli("report", str(path), "--formats", "md", "--out", str(tmp_path / "out"),
              timeout=120)
    refused(res, BenchError.exit_code, "r.json.gz",
            "follow its gzip stream" if tail == "garbage" else "cut short")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("args", [("clean", "--dry-run"), ("doctor",), ("fetch", "--dry-run")],
                         ids=["clean-error", "doctor-table", "fetch-lines"])
def test_a_path_with_an_escape_sequence_never_reaches_the_terminal_raw(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    """A work directory named with an OSC sequence (retitles the terminal) and a CSI one
    (clears it): ``clean``'s error, ``doctor``'s table and ``fetch --dry-run``'s lines printed
    them raw (click strips only colour sequences, and only off a terminal: the OSC went through
    even into a pipe; the eleventh pass left it open). Now every control character is shown
    escaped, ``\\x1b``, and the rest of the path as it is."""
    from tests.integration.test_reliability import _env

    work = tmp_path / "w\x1b]0;pwned\x07x\x1b[2J"
    res = subprocess.run([sys.executable, "-m", "kvprefetch", *args, "--workdir", str(work)],
                         capture_output=True, timeout=300, env=_env(), check=False,
                         cwd=tmp_path)
    out = res.stdout + res.stderr
    assert b"Traceback" not in out, out
    assert b"\x1b" not in out and b"\x07" not in out, out
    shown = b"w\\x1b]0;pwned\\x07x\\x1b[2J"
    if args == ("doctor",):
        # The table folds a path longer than its detail column onto the next lines, at a point
        # the temporary folder's length decides (CI's fresh run broke it mid-name): read the
        # detail column's pieces, row after row, without their padding.
        cells = [line.split("│".encode())[3] for line in out.splitlines()
                 if line.count("│".encode()) == 5]
        assert shown in b"".join(b"".join(cell.split()) for cell in cells), out
    else:
        assert shown in out, out


def test_a_link_planted_at_a_build_jobs_scratch_name_is_named_with_its_fix(
        tmp_path: Path) -> None:
    """A link planted at the next build job's scratch name
    (``<scratch>/kvprefetch-<campaign>-build-<tree>-<id>``, the ids are sequential) failed the
    job with ``mkdir: ... File exists`` alone (the eleventh pass left it open). Now the job
    says what is in the way and the way out (move it, ``slurm resubmit``); nothing is made
    behind the link. The script the kit wrote is run by bash, as Slurm runs it, with the job id
    Slurm would give in the environment."""
    from tests.integration.test_reliability import _env

    camp = tmp_path / "camp"
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--scratch", str(tmp_path / "scratch"), "--stand-in"],
                         capture_output=True,
                         text=True, timeout=120, env=_env(), check=False)
    assert res.returncode == 0, res.stderr
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "scratch").mkdir()
    planted = tmp_path / "scratch" / "kvprefetch-camp-build-baseline-55"
    os.symlink(victim, planted)
    job = subprocess.run(["bash", str(camp / "scripts" / "10-build-baseline.sbatch")],
                         capture_output=True, text=True, timeout=120, check=False,
                         env={**_env(), "SLURM_JOB_ID": "55"})
    assert job.returncode != 0
    assert "something is already there" in job.stderr, job.stderr
    assert f"kvprefetch slurm resubmit {camp} build-baseline" in job.stderr, job.stderr
    assert list(victim.iterdir()) == [] and planted.is_symlink()


def test_a_publish_refused_mid_rename_puts_the_previous_build_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``slurm publish`` of a resubmitted build moves the published env aside
    (``.<tree>.old-<job>``), then renames the new one into place. When that second rename was
    refused (a folder swapped for a link at that moment, which a swap loop reaches only now and
    then), the previous env stayed moved aside and ``envs/<tree>`` was missing until a rerun
    (the eleventh pass left it open). Now it is put back. The refusal is forced here by making
    the kit's confined rename raise for the new copy (a race cannot be hit on demand); the
    files and the publish are real."""
    from kvprefetch.errors import SlurmError
    from kvprefetch.slurm import publish
    from tests.unit.test_slurm import _fake_scratch_build

    dest = tmp_path / "camp" / "work"
    _fake_scratch_build(tmp_path / "job-7", "patched")
    publish.publish_build(tmp_path / "job-7", dest, "patched", label="7")
    before = tree_bytes(dest / "envs" / "patched")
    _fake_scratch_build(tmp_path / "job-8", "patched", payload=b"new lib")
    real = publish.rename_path

    def refuse_the_new_copy(root: Path, path: Path, new_name: str, **kw: object) -> Path:
        if ".publish-" in path.name:
            raise SlurmError(f"refusing to move {path}: raced", "rerun")
        return real(root, path, new_name, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(publish, "rename_path", refuse_the_new_copy)
    with pytest.raises(SlurmError):
        publish.publish_build(tmp_path / "job-8", dest, "patched", label="8")
    assert tree_bytes(dest / "envs" / "patched") == before
    assert not [p for p in (dest / "envs").iterdir() if ".old-" in p.name]


def test_a_build_lock_in_a_symlinked_envs_folder_names_the_link_not_another_build(
        tmp_path: Path, fetched_workdir: Path) -> None:
    """``envs/`` a symlink: each environment's lock is refused naming the link, but the build
    replaced that lock's own fix by "wait for the other build to finish" (seen in the swap-loop
    runs of this pass). Now the link's fix reaches the user; the folder behind it is left."""
    from kvprefetch.errors import LockError
    from tests.integration.test_reliability import cli, refused

    work = fetched_workdir
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, work / "envs")
    res = cli("build", "--workdir", str(work), "--kernels-only", "--trees", "baseline",
              "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes", "fp16", "--jobs",
              "1", "--env-backend", "venv", timeout=300)
    refused(res, LockError.exit_code, "is a symlink")
    assert "wait for the other build" not in res.stderr, res.stderr
    assert f"replace the symlink {work / 'envs'}" in res.stderr, res.stderr
    assert list(elsewhere.iterdir()) == []
