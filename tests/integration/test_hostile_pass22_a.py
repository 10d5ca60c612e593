"""Issue 41, the twenty-second hostile pass, tester a (the work directory's commands). Each
test fails without its fix (checked by reverting ``src`` and running it):

- **A TMPDIR in a bind mount of a sub-folder of the work directory** (``mounts.within``).
  The private folders the kit's programs write into by path (``git apply``'s, doctor's probe,
  the build's) refuse a ``TMPDIR`` inside a work directory, by path and, since the nineteenth
  pass, by the device and inode of the temp folder and each folder above it: that caught a
  bind mount of the work directory itself, not one of a folder *in* it (a container's
  ``-v <workdir>/tmp:/tmp``), whose mount root is a folder of the work directory while its
  path and every folder above it are elsewhere. ``apply`` made its ``git apply`` folder in
  ``<workdir>/downloads/``, and a watcher that swapped it for a link to a vLLM checkout
  outside once the scratch copies were in had git patch the three files there, outside the
  work directory (1 run of 1 by hand, exit 4 after the harm). Now ``within`` also asks the
  mount table which folder of its file system each path shows: the temp folder is refused
  (exit 2) and nothing is made. The same hole let ``export-header -o <alias>/baseline.json``,
  with ``<alias>`` a bind mount of ``<workdir>/state``, replace the tree's state record with
  the header (exit 0; the nineteenth pass refused an ``-o`` into the work directory, and
  through a bind mount of all of it); now refused (exit 4), nothing written.
- **A file bind-mounted in a kit-made folder** (``confine._unlink``). The mount checks of
  ``clean`` (the twentieth and twenty-first passes) look at folders; a *file* of elsewhere
  bind-mounted at ``build/baseline/sub/deeper/target`` was left, and so was what it shows
  (unlink cannot remove a mount point), but clean ended with "target: Device or resource busy /
  To fix: check the path and its file system", naming neither where the file is nor the mount
  (1 run by hand; a message). Now it names the mount point and ``umount``; after that the
  rerun removes the rest.
- **A kit-made folder nested deeper than the open-file limit** (``oserrors``). ``clean``'s
  removal and mount checks (descriptor walks since the twenty-first pass: no link is followed)
  hold one descriptor per level, so a build folder 600 levels deep under ``ulimit -n 128``
  said "Too many open files / To fix: check the path and its file system" (1 run by hand; a
  message), which no check of a path fixes. Now the fix names the limit and ``ulimit -n``;
  with it raised, clean removes the folder.
- **A file bind-mounted at a record's name** (``oserrors``, ``EBUSY``): with a file of
  elsewhere mounted at ``state/patched.json``, apply rolled back and left it, but said
  "Device or resource busy / To fix: check the path and its file system" (1 run by hand; a
  message). Now the fix says a mount is there and to unmount it. The same for a folder of
  elsewhere bind-mounted inside a tree (``EXDEV``): apply said "Invalid cross-device link /
  To fix: check the path and its file system" (1 run by hand).
- **clean on a full disk** (``oserrors.mapped``'s ``where``). clean records each removal
  before it makes it (a few kilobytes), so on a full work directory it frees nothing, and it
  said "No space left on device / To fix: free space on that file system (`df -h .`)": the
  folder the user's shell is in, for a write that named no path (1 run by hand on a full
  200 MB tmpfs; a message). Now the fix names the work directory and says clean needs a
  little space first. The test stands the full disk in for the record's write.
- **apply --tree patched with no such tree** said "To fix: run `kvprefetch fetch` first, or
  pass --tree patched", sending the user back to the option they had typed (an adopted work
  directory of the user's files, 1 run; a message). Now the second half is said only where
  another tree was named.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass19_c import _env, run_with_tmpdir
from tests.integration.test_hostile_pass20_a import _kv, _own
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes


def _bind(src: Path, at: Path, mounts: list[Path]) -> None:
    at.mkdir()
    res = subprocess.run(["mount", "--bind", str(src), str(at)], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")
    mounts.append(at)


@pytest.mark.parametrize("command", ["doctor", "apply"])
def test_a_tmpdir_in_a_bind_mount_of_a_folder_of_the_work_directory_is_refused(
        fetched_workdir: Path, tmp_path: Path, mounts: list[Path], command: str) -> None:
    folder = fetched_workdir / "downloads"  # any folder of it: the attacker can rename there
    alias = tmp_path / "alias"
    _bind(folder, alias, mounts)
    before = sorted(os.listdir(folder))
    run_with_tmpdir(tmp_path, command, fetched_workdir, alias)
    assert sorted(os.listdir(folder)) == before
    state = json.loads((fetched_workdir / "state" / "patched.json").read_text())
    assert state["applied"] is None  # nothing applied through a folder of the work directory


def test_export_header_never_writes_through_a_bind_mount_of_a_folder_of_the_work_directory(
        fetched_workdir: Path, tmp_path: Path, mounts: list[Path]) -> None:
    alias = tmp_path / "alias"
    _bind(fetched_workdir / "state", alias, mounts)
    record = fetched_workdir / "state" / "baseline.json"
    before = record.read_bytes()
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "export-header", "--workdir",
                          str(fetched_workdir), "-o", str(alias / "baseline.json")],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=120,
                         check=False)
    assert "Traceback" not in res.stderr, res.stderr
    assert record.read_bytes() == before
    assert res.returncode == 4 and "inside the work directory" in res.stderr \
        and "To fix:" in res.stderr, res.stderr


def test_a_file_bind_mounted_in_a_kit_folder_is_named_as_a_mount_point(
        fetched_workdir: Path, tmp_path: Path, mounts: list[Path]) -> None:
    wd = fetched_workdir
    deeper = wd / "build" / "baseline" / "sub" / "deeper"
    deeper.mkdir(parents=True)
    (wd / "build" / "baseline" / "a").write_text("the kit's")
    (deeper / "target").write_text("")
    _own(wd, "build/baseline", "build")
    theirs = tmp_path / "theirs.txt"  # a file outside the work directory
    theirs.write_text("precious")
    res = subprocess.run(["mount", "--bind", str(theirs), str(deeper / "target")],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")
    mounts.append(deeper / "target")
    res = _kv(tmp_path, "clean", "--what", "builds", "--workdir", str(wd))
    assert "Traceback" not in res.stderr, res.stderr
    assert theirs.read_text() == "precious"
    [doomed] = (wd / "build").iterdir()  # renamed aside before its removal, as always
    point = doomed / "sub" / "deeper" / "target"
    assert res.returncode == 2 and f"{point} is a mount point" in res.stderr \
        and f"umount {point}" in res.stderr, res.stderr
    subprocess.run(["umount", str(point)], check=True)
    mounts.remove(deeper / "target")
    res = _kv(tmp_path, "clean", "--what", "builds", "--workdir", str(wd))
    assert res.returncode == 0 and not list((wd / "build").iterdir()), res.stderr
    assert theirs.read_text() == "precious"


def test_a_folder_deeper_than_the_open_file_limit_names_the_limit(
        fetched_workdir: Path, tmp_path: Path) -> None:
    wd = fetched_workdir
    (wd / "build").mkdir()
    fd = os.open(wd / "build", os.O_RDONLY)
    for name in ["baseline"] + ["d"] * 300:  # 300 levels: past a limit of 64 open files
        os.mkdir(name, dir_fd=fd)
        sub = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    _own(wd, "build/baseline", "build")

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))

    res = subprocess.run([sys.executable, "-m", "kvprefetch", "clean", "--what", "builds",
                          "--workdir", str(wd)], env=_env(tmp_path), capture_output=True,
                         text=True, timeout=120, check=False, preexec_fn=low_limit)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 2 and "ulimit -n" in res.stderr and "(now 64" in res.stderr, \
        res.stderr
    res = _kv(tmp_path, "clean", "--what", "builds", "--workdir", str(wd))
    assert res.returncode == 0 and not list((wd / "build").iterdir()), res.stderr


def test_apply_of_a_missing_patched_tree_never_says_to_pass_the_tree_it_was_given(
        fetched_workdir: Path, tmp_path: Path) -> None:
    shutil.rmtree(fetched_workdir / "trees" / "patched")
    res = _kv(tmp_path, "apply", "--tree", "patched", "--workdir", str(fetched_workdir))
    assert res.returncode == 4 and "no kvprefetch tree named 'patched'" in res.stderr, \
        res.stderr
    fix = res.stderr.split("To fix:", 1)[1]
    assert "kvprefetch fetch" in fix and "--tree patched" not in fix, res.stderr
    res = _kv(tmp_path, "apply", "--tree", "paper", "--workdir", str(fetched_workdir))
    assert "--with-paper" in res.stderr and "or pass --tree patched" in res.stderr, res.stderr


def test_a_file_bind_mounted_at_a_state_record_is_named_as_a_mount(
        fetched_workdir: Path, tmp_path: Path, mounts: list[Path]) -> None:
    record = fetched_workdir / "state" / "patched.json"
    theirs = tmp_path / "theirs.json"  # a file outside the work directory, at the record's name
    theirs.write_bytes(record.read_bytes())
    before = theirs.read_bytes()
    res = subprocess.run(["mount", "--bind", str(theirs), str(record)], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")
    mounts.append(record)
    res = _kv(tmp_path, "apply", "--tree", "patched", "--workdir", str(fetched_workdir))
    assert "Traceback" not in res.stderr, res.stderr
    assert theirs.read_bytes() == before
    assert res.returncode == 4 and "is mounted at that name" in res.stderr \
        and "umount" in res.stderr, res.stderr


def test_a_folder_bind_mounted_inside_a_tree_is_named_as_a_mount_by_apply(
        fetched_workdir: Path, tmp_path: Path, mounts: list[Path]) -> None:
    inside = fetched_workdir / "trees" / "patched" / "csrc" / "attention"
    theirs = tmp_path / "theirs"  # their copy of the folder, outside the work directory
    shutil.copytree(inside, theirs)
    before = {p.name: p.read_bytes() for p in theirs.iterdir() if p.is_file()}
    res = subprocess.run(["mount", "--bind", str(theirs), str(inside)], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")
    mounts.append(inside)
    res = _kv(tmp_path, "apply", "--tree", "patched", "--workdir", str(fetched_workdir))
    assert "Traceback" not in res.stderr, res.stderr
    assert {p.name: p.read_bytes() for p in theirs.iterdir() if p.is_file()} == before
    assert res.returncode == 4 and "on different mounts" in res.stderr \
        and "umount" in res.stderr, res.stderr


def test_clean_on_a_full_disk_names_the_work_directory_and_why_it_needs_space(
        fetched_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch.errors import ConfigError
    from kvprefetch.workspace import cleaning, ownership

    def full(*_args: object, **_kw: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")  # a descriptor's write: no name

    monkeypatch.setattr(ownership, "write_json_atomic", full)
    with pytest.raises(ConfigError) as err:
        cleaning.clean(fetched_workdir, "all")
    assert f"`df -h {fetched_workdir}`" in err.value.fix, err.value.fix
    assert "clean records each removal" in err.value.fix, err.value.fix
    assert (fetched_workdir / "trees" / "baseline").is_dir()  # nothing half-removed
