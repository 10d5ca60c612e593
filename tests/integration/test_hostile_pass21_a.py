"""Issue 41, the twenty-first hostile pass, tester a (the work directory's commands).

- **A mount made while clean removes a folder** (``confine._remove_tree``). The twentieth pass
  made ``remove_path`` walk the folder for mount points before it removed it
  (``confine.refuse_mounts``), but the removal itself was ``shutil.rmtree``, which follows no
  link yet walks into any mount point it meets: a folder of elsewhere bind-mounted below a
  kit-made build folder *after* that walk (``clean --what builds`` of a build folder of 30,000
  files, a loop mounting a folder outside at each of 40 empty sub-folders once the first file
  was gone) was emptied, outside the work directory, and clean ended with "x: Device or
  resource busy / check the path and its file system" (1 run of 1 by hand with the loop; the
  earlier runs mounted too late or too early). Now the removal is a descriptor walk that checks
  each folder's mount once it is open (a mount made on a folder already open does not cover
  what its descriptor reaches), and refuses naming the mount point and ``umount`` (3 of 3 with
  the loop). The test stands the race in without a loop: the mount is made right after the
  check.
- **A user's own tree in an adopted work directory stopped every build**
  (``builds.plan.default_trees``). ``build`` (and ``--dry-run``) read the state of every folder
  of ``trees/`` beyond baseline and patched to find patched extra trees; in a work directory
  adopted with the user's ``trees/mine/`` and ``state/mine.json`` (their own record, any
  content) it stopped with "the state file state/mine.json is not kvprefetch's record ... To
  fix: run `kvprefetch fetch --repair`", which leaves a tree the kit did not make alone, so
  the advice changed nothing and no build could run there (1 of 1 adopted directories; a
  wrong-way message). Now, in an adopted work directory, only trees the ownership record lists
  are read; the user's are left alone.
- **A folder 1,500 levels deep** (``hashing.walk``, ``confine._folders``). Python 3.11's
  ``os.walk`` and ``os.fwalk`` call themselves once per level: such a folder in a tree made
  ``fetch``, ``apply``, ``fetch --repair`` and ``clean --what trees --discard-edits`` end in a
  ``RecursionError`` traceback (exit 1; 4 of 4), and one 3,000 levels deep in a kit-made build
  folder did the same to ``clean --what builds`` through the mount check (1 of 1). Now the walks
  keep their own stack: the tree is inventoried, the folders removed, exit 0.
- **fetch --repair claimed a user's tree in an adopted work directory**
  (``repair._refuse_a_users_tree``). With the user's own ``trees/baseline/`` and
  ``state/baseline.json`` there, ``fetch --adopt`` stopped with "the state file ... is not
  kvprefetch's record ... To fix: run `kvprefetch fetch --repair`"; the repair then overwrote
  their state file and recorded their folder as the kit's tree, and ``clean --what all
  --discard-edits`` removed it with their file in it (1 of 1 by hand; user files lost inside).
  Now the repair refuses a tree the ownership record does not list in an adopted work
  directory, naming it and saying to move it out; clean keeps both.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass20_a import _kv
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes


def test_a_mount_made_while_a_folder_is_removed_is_never_deleted_across(
        tmp_path: Path, outside: Path, mounts: list[Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch.errors import ConfigError
    from kvprefetch.workspace import confine

    root = tmp_path / "work"
    doomed = root / "build" / "patched"
    (doomed / "cache" / "x").mkdir(parents=True)
    (doomed / "kvprefetch_patched_C.so").write_bytes(b"built")
    real_check = confine.refuse_mounts

    def check_then_mount(dfd: int, path: Path, family: type) -> None:
        real_check(dfd, path, family)  # nothing mounted yet: the check passes
        at = doomed / "cache" / "x"
        res = subprocess.run(["mount", "--bind", str(outside), str(at)], capture_output=True,
                             text=True, check=False)
        if res.returncode != 0:
            pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")
        mounts.append(at)

    monkeypatch.setattr(confine, "refuse_mounts", check_then_mount)
    with pytest.raises(ConfigError) as err:
        confine.remove_path(root, doomed)
    assert f"{doomed / 'cache' / 'x'} is a mount point" in str(err.value), err.value
    assert "umount" in err.value.fix, err.value.fix
    # the outside fixture checks that everything mounted there is still there


def test_a_users_own_tree_in_an_adopted_work_directory_is_not_read_by_build(
        fetched_workdir: Path) -> None:
    from kvprefetch.builds.plan import default_trees
    from kvprefetch.workspace.workdir import TAG_FILE, Workdir

    wd = fetched_workdir
    (wd / TAG_FILE).write_text("adopted by kvprefetch\n")
    (wd / "trees" / "mine").mkdir()
    (wd / "trees" / "mine" / "notes.txt").write_text("my own tree\n")
    (wd / "state" / "mine.json").write_text('{"mine": true}\n')
    assert default_trees(Workdir(wd)) == ("baseline", "patched")
    assert (wd / "state" / "mine.json").read_text() == '{"mine": true}\n'


def _deep(top: Path, levels: int) -> None:
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY)
    for _ in range(levels):  # by descriptors: the path would pass PATH_MAX
        os.mkdir("a", dir_fd=fd)
        nfd = os.open("a", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)


def test_a_folder_thousands_of_levels_deep_is_no_traceback(
        fetched_workdir: Path, tmp_path: Path) -> None:
    wd = fetched_workdir
    _deep(wd / "trees" / "patched" / "deep", 1500)
    _deep(wd / "build" / "patched", 1500)
    own = wd / ".kvprefetch-owned.json"
    record = json.loads(own.read_text())
    record["paths"]["build/patched"] = {"kind": "build"}
    own.write_text(json.dumps(record))
    for args in (["fetch", "--repair"], ["clean", "--what", "all", "--discard-edits"]):
        res = _kv(tmp_path, *args, "--workdir", str(wd))
        assert "Traceback" not in res.stderr, res.stderr[-2000:]
        assert res.returncode == 0, (args, res.returncode, res.stderr[-2000:])
    assert not (wd / "build" / "patched").exists()
    assert not (wd / "trees" / "patched").exists()


def test_fetch_repair_never_claims_a_users_tree_in_an_adopted_work_directory(
        fetched_workdir: Path, tmp_path: Path) -> None:
    from kvprefetch.workspace.workdir import TAG_FILE

    wd = fetched_workdir
    (wd / TAG_FILE).write_text("adopted by kvprefetch\n")
    own = wd / ".kvprefetch-owned.json"
    record = json.loads(own.read_text())
    for rel in ("trees/baseline", "state/baseline.json"):
        del record["paths"][rel]
    own.write_text(json.dumps(record))
    subprocess.run(["rm", "-rf", str(wd / "trees" / "baseline")], check=True)
    (wd / "trees" / "baseline").mkdir()
    (wd / "trees" / "baseline" / "thesis.tex").write_text("three years of work\n")
    (wd / "state" / "baseline.json").write_text('{"mine": true}\n')
    res = _kv(tmp_path, "fetch", "--repair", "--workdir", str(wd))
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.returncode == 3 and "To fix:" in res.stderr, (res.returncode, res.stderr)
    assert f"{wd / 'trees' / 'baseline'} is not a tree kvprefetch made here" in res.stderr
    res = _kv(tmp_path, "clean", "--what", "all", "--discard-edits", "--workdir", str(wd))
    assert res.returncode == 0, res.stderr
    assert (wd / "trees" / "baseline" / "thesis.tex").read_text() == "three years of work\n"
    assert (wd / "state" / "baseline.json").read_text() == '{"mine": true}\n'
