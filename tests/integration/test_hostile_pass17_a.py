"""Issue 41, the seventeenth hostile pass (a): the work directory's commands, the issue's
closing fresh pass.

- The sdist's download acted on ``downloads/`` by path: ``tempfile.mkstemp`` made the partial
  there, ``os.chmod``, ``os.replace`` and the final ``unlink`` named it again by path, and a
  cached sdist with the wrong hash, or a killed run's partial, was deleted by path too. So a
  ``downloads/`` swapped for a link to a folder outside after the checks (a ``renameat2``
  swap loop, whoever writes the work directory) had the 10 MB partial made there and the
  user's own ``vllm-0.10.2.tar.gz`` there replaced by the download, or deleted as "tampered".
  The download now streams into ``confine.open_new`` (a new temporary made, and renamed over
  the target, relative to the folder opened from the work directory down without following a
  link), with its hash checked before the rename; the deletions go through
  ``confine.remove_path`` and a descriptor of the folder.

- ``apply``'s stage, ``trees/.<tree>.apply/``, was removed by its name by the next fetch,
  apply, build or clean (``treetxn.recover``), also in a work directory the kit adopted with
  the user's files in it: ``fetch --adopt`` deleted a user's ``trees/.patched.apply/`` and all
  it held, and "rolled back" the tree by a user's ``trees/.baseline.apply/journal.json``. The
  stage is now in the ownership record (kind ``stage``) before it exists; in an adopted
  directory a stage the record does not list is named and left.

- A real ``build``'s preflight compiled doctor's nvcc probe in the work directory's
  ``tmp/doctor-<pid>-<hex>/``, made by path after the check of ``tmp/``; the probe's source and
  nvcc's outputs were written there by path. A ``renameat2`` loop swapping ``tmp/`` for a link
  to a folder outside during ``build --kernels-only`` had that folder made outside and left
  there (1 run of 7). The probe now always compiles in a private folder outside the work
  directory (``ownership.private_dir``), as the build's compilers do.

- verify-kernel's no-device driver stub (``overlay.driverstub.ensure_stub``) made
  ``verify/driver-stub/<key>/`` by path, wrote ``stub.c`` there and had gcc write
  ``libcuda.so.1`` there by path: a ``verify/`` that was a link to a folder outside got all
  three. gcc now works in a private folder, and the two files are written from the work
  directory down (``confine.write_file`` with the work directory as root).

- In a folder adopted with the user's files in it, the download removed the user's
  ``downloads/.download-<pid>-<x>`` as a killed run's partial, found by its name; only a work
  directory the kit created has its partials removed by name now.

- In such a folder, the overlay build's CUDA 12 assembly replaced a user's file at
  ``downloads/cuda-12.4.1/<archive>`` and removed a user's ``toolkits/cuda-12.4.1/`` (no kit
  stamp: "a leftover, the kit's own"); both are named and left now.

- With ``TMPDIR`` inside the work directory, apply (and every step but the build's
  compilers, which the twelfth pass covered) made its private folder there: a watcher that
  renamed ``kvprefetch-apply-*`` and put a link to a folder outside in its place had the scratch
  copies and git's patched files written there, exit 0 (2 runs of 3). Every private folder
  now refuses a system temp inside a work directory the process works in.

- A build manifest is data, but verify-kernel ran the interpreter it names: one naming
  ``/bin/rm`` had it run ``rm <kit>/probe/provenance.py kernels``, deleting the kit's own file
  outside the work directory. Only an interpreter under the work directory's ``envs/`` (no
  link on the way to its folder) is run now; otherwise the tree's probe fails naming it.

Each test fails without its fix (checked with the fix reverted)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvprefetch import upstream
from kvprefetch.errors import FetchError, PatchError
from kvprefetch.sources import download
from kvprefetch.workspace import ownership, treetxn
from kvprefetch.workspace.workdir import Workdir
from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: the outside folder is byte-identical afterwards


def _folder_state(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _swap_for_link(folder: Path, target: Path) -> None:
    """What a swap loop does at the worst moment: the folder becomes a link to ``target``."""
    folder.rename(folder.with_name(folder.name + ".real"))
    folder.symlink_to(target)


# ------------------------------------------------------------------------ 1. the download


def test_a_downloads_folder_swapped_for_a_link_during_the_download_writes_nothing_outside(
        tmp_path: Path, vllm_sdist: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``downloads/`` swapped for a link to a folder outside just after the kit made it
    (between its checks and the download). Before, ``mkstemp`` made the partial in the folder
    outside, the download was written there, and ``os.replace`` put it over the user's own
    ``vllm-0.10.2.tar.gz`` there. Now the temporary is opened relative to the folder opened
    from the work directory down: the link is refused, nothing is written outside."""
    work, mine = tmp_path / "work", tmp_path / "mine"
    (work / "downloads").mkdir(parents=True)
    mine.mkdir()
    (mine / upstream.SDIST_NAME).write_bytes(b"the user's own copy\n")
    before = _folder_state(mine)
    monkeypatch.setattr(download, "locate_sdist", lambda *a, **k: download.IndexFile(
        vllm_sdist.resolve().as_uri(), None))
    real = download._remove_dead_downloads

    def then_swap(*args: object, **kw: object) -> None:
        real(*args, **kw)  # type: ignore[arg-type]
        _swap_for_link(work / "downloads", mine)

    monkeypatch.setattr(download, "_remove_dead_downloads", then_swap)
    with pytest.raises(FetchError):
        download.ensure_sdist(work / "downloads", "http://127.0.0.1:9/simple", root=work)
    assert _folder_state(mine) == before
    assert list((work / "downloads.real").iterdir()) == []  # no partial left either


def test_a_tampered_cached_sdist_swapped_for_a_link_deletes_nothing_outside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit's cached sdist has the wrong hash (it is deleted as tampered), and
    ``downloads/`` becomes a link to a folder outside while it is hashed. Before, the unlink
    by path deleted the user's ``vllm-0.10.2.tar.gz`` in that folder. Now the removal is made
    from the work directory down: the link is refused."""
    work, mine = tmp_path / "work", tmp_path / "mine"
    (work / "downloads").mkdir(parents=True)
    (work / "downloads" / upstream.SDIST_NAME).write_bytes(b"not the sdist\n")
    mine.mkdir()
    (mine / upstream.SDIST_NAME).write_bytes(b"the user's own copy\n")
    before = _folder_state(mine)
    real = download.sha256_file

    def then_swap(path: Path) -> str:
        digest = real(path)
        _swap_for_link(work / "downloads", mine)
        return digest

    monkeypatch.setattr(download, "sha256_file", then_swap)
    with pytest.raises(FetchError):
        download.ensure_sdist(work / "downloads", "http://127.0.0.1:9/simple", root=work)
    assert _folder_state(mine) == before


# ------------------------------------------------------------- 2. doctor's probe in a real build


def test_the_compile_probe_of_a_real_build_makes_nothing_behind_a_swapped_tmp(
        tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The work directory's ``tmp/`` becomes a link to a folder outside just after the probe's
    folder is recorded, before it is made (what a swap loop won in 1 run of 7 real builds).
    Before, ``mkdir`` by path made ``doctor-<pid>-<hex>/`` outside and the probe's source was
    written into it. Now the probe's folder is a private one outside the work directory,
    which nothing that writes the work directory can reach."""
    import tempfile

    from kvprefetch.doctor import tools
    from kvprefetch.workspace.workdir import TAG_FILE

    work = tmp_path / "work"
    (work / "tmp").mkdir(parents=True)
    (work / TAG_FILE).write_text("created by kvprefetch\n")
    (tmp_path / "temp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    real = ownership.record

    def then_swap(root: Path, path: Path, kind: str, **info: object) -> None:
        real(root, path, kind, **info)
        if kind == "tmp" and path.parent == work / "tmp":
            _swap_for_link(work / "tmp", outside)

    monkeypatch.setattr(ownership, "record", then_swap)
    with tools._scratch(work, read_only=False) as d:
        (d / "probe.cu").write_text("__global__ void k() {}\n")
        assert not str(d.resolve()).startswith(str(work.resolve()) + "/")
    assert os.listdir(tmp_path / "temp") == []  # removed on the way out


# ------------------------------------------------------------- 3. the stage in an adopted folder


def test_an_adopted_users_folder_named_like_an_apply_stage_is_kept(
        tmp_path: Path, vllm_sdist: Path) -> None:
    """A folder of the user's adopted by ``fetch --adopt`` holds ``trees/.patched.apply/``
    (notes) and ``trees/.baseline.apply/journal.json``. Before, the fetch removed both (as an
    interrupted apply's stage; the second "rolled back" its tree), exit 0. Now it names them
    and stops (exit 4), both kept; moved away, the fetch works, and an apply's own stage (in
    the ownership record) is still recovered in the adopted directory."""
    work = tmp_path / "work"
    notes = work / "trees" / ".patched.apply" / "notes.md"
    journal = work / "trees" / ".baseline.apply" / "journal.json"
    for path, text in ((notes, "my notes\n"), (journal, '{"files": [], "state": {}}\n')):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    res = cli("fetch", "--adopt", "--source", str(vllm_sdist), "--workdir", str(work))
    refused(res, 4, ".apply", "not the stage of an apply kvprefetch made")
    assert notes.read_text() == "my notes\n"
    assert journal.read_text() == '{"files": [], "state": {}}\n'

    for path in (notes, journal):
        path.parent.rename(tmp_path / path.parent.name)
    res = cli("fetch", "--adopt", "--source", str(vllm_sdist), "--workdir", str(work))
    assert res.returncode == 0, res.stderr
    # an apply killed after making its stage (recorded), before its journal: recovered
    stage = treetxn.stage_dir(Workdir(work), "patched")
    ownership.record(work, stage, "stage")
    stage.mkdir()
    res = cli("apply", "--workdir", str(work))
    assert res.returncode == 0, res.stderr
    assert not os.path.lexists(stage)
    assert str(stage.relative_to(work)) not in ownership.entries(work)


def test_a_recorded_stage_that_was_never_made_is_forgotten(tmp_path: Path) -> None:
    """An apply killed between recording its stage and making it leaves an entry for a path
    that is not there: the next recovery forgets it (in-process; no CLI needed)."""
    work = tmp_path / "work"
    (work / "trees" / "patched").mkdir(parents=True)
    stage = treetxn.stage_dir(Workdir(work), "patched")
    ownership.record(work, stage, "stage")
    assert treetxn.recover(Workdir(work), "patched") is None
    assert ownership.entries(work) == {}
    stage.write_text("x")
    with pytest.raises(PatchError):  # a file in its place is still no stage
        treetxn.recover(Workdir(work), "patched")


# ---------------------------------------------------- 4. verify-kernel's no-device driver stub


@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("nm")), reason="needs gcc and nm")
def test_the_driver_stub_is_never_built_through_a_linked_verify_folder(
        tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify-kernel on a machine without an NVIDIA driver builds a no-device ``libcuda.so.1``
    for an overlay env in ``<workdir>/verify/driver-stub/<key>/``. Before, it made that folder,
    wrote ``stub.c`` and had gcc write the library by path, so a ``verify/`` that was a link to
    a folder outside (planted, or swapped in) got all three. Now gcc works in a private folder
    and the results are written from the work directory down, never through a link: the link
    is refused, nothing is made outside."""
    import _ssl  # any shared library serves as the env's vllm/_C for nm

    from kvprefetch.errors import VerifyError
    from kvprefetch.overlay import driverstub
    from kvprefetch.verify import kernel

    work = tmp_path / "work"
    site = work / "envs" / "patched" / "site"
    (site / "vllm").mkdir(parents=True)
    shutil.copyfile(_ssl.__file__, site / "vllm" / "_C.abi3.so")
    (work / "verify").symlink_to(outside)
    monkeypatch.setattr(driverstub, "driver_loadable", lambda: False)
    manifest = {"so_path": str(site / "kvprefetch_kernels" / "_C.so"), "tree": "patched"}
    with pytest.raises(VerifyError, match="symlink"):
        kernel._driver_stub(Workdir(work), manifest)


def test_a_users_file_named_like_a_partial_download_in_an_adopted_folder_is_kept(
        tmp_path: Path, vllm_sdist: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An adopted folder holds the user's ``downloads/.download-2147483646-mine`` (a pid no
    process has). Before, the fetch's download removed it as a killed run's partial download,
    found by its name. Now only a work directory the kit created has its partials removed by
    name (as for the records' own temporaries, ``ownership.stale_writes``)."""
    from kvprefetch.sources import fetch

    work = tmp_path / "work"
    (work / "downloads").mkdir(parents=True)
    mine = work / "downloads" / ".download-2147483646-mine"
    mine.write_text("mine\n")
    (work / "notes.txt").write_text("the user's\n")
    monkeypatch.setattr(download, "locate_sdist", lambda *a, **k: download.IndexFile(
        vllm_sdist.resolve().as_uri(), None))
    fetch.fetch_trees(work, source="sdist", adopt=True)
    assert mine.read_text() == "mine\n"
    assert (work / "downloads" / upstream.SDIST_NAME).is_file()


# ----------------------------------------------- 5. the CUDA 12 toolkit in an adopted folder


@pytest.mark.parametrize("users", ["download", "toolkit"])
def test_an_adopted_users_cuda_files_at_the_toolkits_names_are_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, users: str) -> None:
    """A folder adopted with the user's files in it holds, at the names the overlay build's
    CUDA 12 assembly uses, the user's ``downloads/cuda-12.4.1/<archive>`` (not the pinned
    file) or the user's own ``toolkits/cuda-12.4.1/`` (no kit stamp). Before, the download
    replaced the first and the assembly removed the second ("a leftover: the kit's own").
    Now each is named and left, with its fix."""
    from kvprefetch.overlay import cuda12
    from kvprefetch.workspace.workdir import TAG_FILE
    from tests.unit.test_cuda12 import synthetic_parts

    parts = synthetic_parts(tmp_path)
    monkeypatch.setattr(cuda12, "PARTS", tuple(parts))
    work = tmp_path / "work"
    work.mkdir()
    (work / TAG_FILE).write_text("adopted by kvprefetch\n")
    mine = (work / "downloads" / f"cuda-{cuda12.RELEASE}" / parts[0].filename
            if users == "download" else
            work / "toolkits" / f"cuda-{cuda12.RELEASE}" / "bin" / "mytool")
    mine.parent.mkdir(parents=True)
    mine.write_text("the user's\n")
    with pytest.raises(FetchError, match="kvprefetch did not"):
        cuda12.ensure_cuda12(work)
    assert mine.read_text() == "the user's\n"


# ----------------------------------------------- 6. a TMPDIR inside the work directory


def test_apply_refuses_a_tmpdir_inside_the_work_directory(fetched_workdir: Path) -> None:
    """``TMPDIR`` inside the work directory (``export TMPDIR=$PWD/tmp`` in the project). Before,
    apply made its private folder for ``git apply`` there (only the build refused such a
    TMPDIR, the twelfth pass), and a watcher that renamed the folder and put a link to a
    folder outside in its place had the scratch copies and git's patched files written there,
    exit 0 (2 runs of 3). Now every private folder refuses a TMPDIR inside a work directory the
    process works in, with the fix; nothing is written."""
    inside = fetched_workdir / "mytmp"
    inside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env.update(TMPDIR=str(inside), PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "apply", "--workdir",
                          str(fetched_workdir)], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    refused(res, 2, "TMPDIR", "inside the work directory", "export TMPDIR=/tmp")
    assert os.listdir(inside) == []


def test_any_private_folder_refuses_a_tmpdir_inside_a_work_directory_in_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: once a work directory is in use (``Workdir``), a private folder for any
    step (apply's, deps', verify's) refuses a system temp folder inside it."""
    import tempfile

    from kvprefetch.errors import ConfigError

    work = tmp_path / "work"
    (work / "mytmp").mkdir(parents=True)
    Workdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(work / "mytmp"))
    with pytest.raises(ConfigError, match="inside the work directory"), \
            ownership.private_dir("apply"):
        pass
    assert os.listdir(work / "mytmp") == []


# ----------------------------------------------- 7. a program named by a build manifest


def test_verify_kernel_runs_no_interpreter_a_manifest_names_outside_the_envs(
        tmp_path: Path, fetched_workdir: Path) -> None:
    """Build manifests are data. Two forged ones (``build/<tree>/k1/manifest.json``) name as
    the env's python a program outside the work directory. Before, verify-kernel ran it with
    the probe's arguments: with ``/bin/rm`` it deleted the kit's own
    ``kvprefetch/probe/provenance.py`` (here, a script that leaves a mark). Now only an
    interpreter under the work directory's ``envs/`` is run; the tree's probe fails, naming
    the manifest."""
    from kvprefetch.verify import kernel

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fake = elsewhere / "python"
    fake.write_text(f"#!/bin/sh\necho ran > {elsewhere / 'ran'}\n")
    fake.chmod(0o755)
    for tree in ("baseline", "patched"):
        d = fetched_workdir / "build" / tree / "k1"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps(
            {"tree": tree, "mode": "kernels-only", "key": "k1", "so_path": "/nonexistent",
             "env": {"python": str(fake), "path": str(elsewhere)}}))
    rep = kernel.verify(fetched_workdir, no_gpu=True, jobs=1)
    assert not (elsewhere / "ran").exists()
    assert "outside" in json.dumps(rep.to_dict())
