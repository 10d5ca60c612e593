"""Issue 41, the tenth hostile pass (q): the mechanisms the ninth pass added, attacked.

- ``upstream.kit_root`` fell back to the folder above ``site-packages`` (``here.parent.parent``)
  whenever the package had no complete ``data/``: a package installed with ``pip install
  --target /tmp/x`` or copied onto PYTHONPATH read ``csrc/`` and ``patches/`` from the folder
  above it (``/tmp`` for ``/tmp/x``), and ``apply`` installed another user's headers into the
  trees. A checkout is now only ``src/kvprefetch`` beside ``setup.py`` and ``pyproject.toml``,
  and an installed copy with a ``data/`` never falls back.
- ``confine.copy_tree`` read its source by path (``os.walk``, then ``open(dir/name,
  O_NOFOLLOW)``, which follows a link at any folder on the way): a folder of ``pristine/sdist``
  swapped for a link to a folder outside between its listing and its files' opens had the
  files behind the link copied into the tree, and recorded in the tree's state as pristine;
  swapped while its parent was listed, the link itself (to a folder outside) was copied into the
  tree and recorded as pristine (a swap loop against ``fetch`` won both). The source is now read
  relative to folders opened ``O_NOFOLLOW`` from the work directory down, and ``fetch`` checks
  the copy against the pristine copy's verified manifest before it puts the tree in place.

Each test fails without its fix (checked with the fixes reverted)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvprefetch.errors import FetchError
from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: the outside folder is byte-identical afterwards

_REPO = Path(__file__).resolve().parents[2]


def _swap_for_link_on_open(monkeypatch: pytest.MonkeyPatch, name: str, folder: Path,
                           target: Path) -> list[int]:
    """Before the first open (for reading) of a file called ``name``, rename ``folder`` away and
    put a symlink to ``target`` in its place: the moment between a folder's listing and its
    files' opens, reached deterministically."""
    real_open = os.open
    done: list[int] = []

    def hooked(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if os.fspath(path).endswith(name) and not done and not flags & os.O_CREAT:
            done.append(1)
            os.rename(folder, folder.with_name(f".{folder.name}.away"))
            os.symlink(target, folder)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", hooked)
    return done


def test_copy_tree_never_reads_a_file_through_a_source_folder_swapped_for_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outside: Path) -> None:
    """copy_tree listed src/zzz, then opened src/zzz/<file> by path: with src/zzz swapped for a
    link to a folder outside in between, the file outside (same name) was read and copied in.
    Now each file is opened relative to its folder's descriptor: the copy holds the real file."""
    from kvprefetch.workspace import confine

    root = tmp_path / "work"
    (root / "src" / "aaa").mkdir(parents=True)
    (root / "src" / "zzz").mkdir()
    (root / "src" / "aaa" / "a.txt").write_text("a\n")
    (root / "src" / "zzz" / "notes.txt").write_text("the pristine file\n")
    done = _swap_for_link_on_open(monkeypatch, "notes.txt", root / "src" / "zzz", outside)
    confine.copy_tree(root, root / "src", root / "dst")
    monkeypatch.undo()
    assert done, "the swap never happened"
    assert (root / "dst" / "zzz" / "notes.txt").read_text() == "the pristine file\n"


def test_fetch_never_puts_in_place_a_tree_copied_while_its_source_was_swapped(
        fetched_workdir: Path, monkeypatch: pytest.MonkeyPatch, outside: Path) -> None:
    """fetch verified pristine/sdist, then copied it: a folder of it swapped for a link to a
    folder outside while its parent was listed put that link (and the folder renamed away) into
    the new tree, recorded in its state as pristine v0.10.2, and every later fetch called the
    tree unchanged. Now the copy is checked against the verified manifest: one FetchError, no
    tree, no state."""
    from kvprefetch.sources import fetch as fetch_mod
    from kvprefetch.workspace import confine, ownership

    wd = fetched_workdir
    ownership.remove(wd, wd / "trees" / "baseline")
    ownership.remove(wd, wd / "state" / "baseline.json")
    real_copy = confine.copy_tree
    attention = wd / "pristine" / "sdist" / "csrc" / "attention"

    def swapped_copy(root: Path, src: Path, dst: Path, **kw: object) -> None:
        os.rename(attention, attention.with_name(".attention.away"))
        os.symlink(outside, attention)
        try:
            real_copy(root, src, dst, **kw)  # type: ignore[arg-type]
        finally:
            os.unlink(attention)
            os.rename(attention.with_name(".attention.away"), attention)

    monkeypatch.setattr(confine, "copy_tree", swapped_copy)
    with pytest.raises(FetchError, match="differs from the verified pristine copy"):
        fetch_mod.fetch_trees(wd, source="sdist", names=("baseline",))
    monkeypatch.undo()
    assert not os.path.lexists(wd / "trees" / "baseline")
    assert not os.path.lexists(wd / "state" / "baseline.json")
    assert not list((wd / "trees").glob(".baseline.tmp-*"))


def _cli(*args: str, pythonpath: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(_env(), PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_package_without_its_data_never_reads_the_kit_from_the_folder_above(
        tmp_path: Path, fetched_workdir: Path) -> None:
    """The package copied (or `pip install --target`ed) to <dir>/site/kvprefetch without its
    data/: kit_root took <dir> for a checkout, and apply installed the headers someone else
    put in <dir>/csrc/kvprefetch into the tree (exit 0). Now one ConfigError (exit 2) naming
    the package, nothing installed."""
    site = tmp_path / "inst" / "site"
    shutil.copytree(_REPO / "src" / "kvprefetch", site / "kvprefetch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(_REPO / "csrc", tmp_path / "inst" / "csrc")
    shutil.copytree(_REPO / "patches", tmp_path / "inst" / "patches")
    planted = tmp_path / "inst" / "csrc" / "kvprefetch" / "prefetch.cuh"
    planted.write_text(planted.read_text() + "// planted by another user\n")
    tree_header = (fetched_workdir / "trees" / "patched" / "csrc" / "attention" / "kvprefetch"
                   / "prefetch.cuh")
    for data in (None, "empty", "patches only"):
        if data is not None:
            (site / "kvprefetch" / "data").mkdir(exist_ok=True)
        if data == "patches only":
            shutil.copytree(_REPO / "patches", site / "kvprefetch" / "data" / "patches")
        res = _cli("apply", "--workdir", str(fetched_workdir), pythonpath=site, cwd=tmp_path)
        assert res.returncode == 2, (data, res.returncode, res.stderr)
        assert "Traceback" not in res.stderr and "To fix:" in res.stderr, res.stderr
        assert str(site / "kvprefetch") in res.stderr, res.stderr
        assert not os.path.lexists(tree_header), data
    # the complete installed copy works
    shutil.copytree(_REPO / "csrc", site / "kvprefetch" / "data" / "csrc")
    res = _cli("apply", "--workdir", str(fetched_workdir), pythonpath=site, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "planted" not in tree_header.read_text()


@pytest.mark.parametrize(("rel", "pid"), [("mine/results.tmp-99999", 99999),
                                          ("tmp/run-4242-results", 4242),
                                          ("trees/baseline/setup.py.tmp-4242", 4242)],
                         ids=["user-folder", "user-scratch-lookalike", "inside-a-tree"])
def test_a_tmp_entry_names_only_a_place_the_kit_makes_temporaries(
        fetched_workdir: Path, rel: str, pid: int) -> None:
    """A ``tmp`` entry could name any path whose name ends in ``.tmp-<pid>``, or
    ``tmp/<anything>-<pid>-<anything>``, anywhere in the work directory: clean removed a user's
    ``mine/results.tmp-99999``, or a user's ``tmp/run-4242-results`` folder with all it held.
    Now such an entry makes the record corrupt (exit 2) and nothing is removed."""
    import json

    wd = fetched_workdir
    victim = wd / rel
    victim.parent.mkdir(parents=True, exist_ok=True)
    if rel.startswith("tmp/"):
        victim.mkdir()
        (victim / "thesis.tex").write_text("three years of work\n")
    else:
        victim.write_text("the user's results\n")
    record = wd / ".kvprefetch-owned.json"
    data = json.loads(record.read_text())
    data["paths"][rel] = {"kind": "tmp", "pid": pid}
    record.write_text(json.dumps(data))
    res = _cli("clean", "--what", "all", "--discard-edits", "--workdir", str(wd),
               pythonpath=_REPO / "src", cwd=wd.parent)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "is corrupt" in res.stderr and "not where kvprefetch makes a temporary" in res.stderr
    assert "Traceback" not in res.stderr and "To fix:" in res.stderr
    assert victim.exists() and (wd / "trees" / "patched").is_dir()


def test_a_users_own_empty_tmp_folder_is_left_where_it_is(fetched_workdir: Path) -> None:
    """apply's scratch folder lives in <workdir>/tmp/, and the step removed tmp/ when it was
    empty afterwards, whoever made it: a user's own (empty) tmp/ was gone after apply. Now only
    a tmp/ the step made itself goes (tests/unit/test_scratch_and_progress.py checks that)."""
    wd = fetched_workdir
    (wd / "tmp").mkdir()
    res = _cli("apply", "--workdir", str(wd), pythonpath=_REPO / "src", cwd=wd.parent)
    assert res.returncode == 0, res.stderr
    assert (wd / "tmp").is_dir() and not list((wd / "tmp").iterdir())


def test_an_apply_scratch_folder_swapped_for_a_link_gets_nothing_written_behind_it(
        fetched_workdir: Path, monkeypatch: pytest.MonkeyPatch, outside: Path) -> None:
    """apply copied the tree's files into its scratch tmp/apply-<pid>-<hex>/t, and the kit's
    headers after git apply, with shutil.copy2/copyfile by path: a scratch folder swapped for a
    link to a folder outside had the headers (and in a swap loop, the tree's files) written
    behind the link. Now every scratch write goes through folders opened O_NOFOLLOW from the
    work directory down: one PatchError, nothing outside, the tree not patched."""
    from kvprefetch import upstream
    from kvprefetch.errors import KvprefetchError
    from kvprefetch.sources import patching

    wd = fetched_workdir
    real = upstream.kit_headers
    swapped: list[Path] = []

    # the scratch is a private folder in the system temp since the eleventh pass: this apply's
    # own, not one an earlier test's SIGKILL left there (a suite run met that one first)
    temp = Path(tempfile.gettempdir())
    earlier = set(temp.glob("kvprefetch-apply-*"))

    def headers():  # type: ignore[no-untyped-def]
        for att in [*wd.glob("tmp/apply-*/t/csrc/attention"),
                    *(d / "t" / "csrc" / "attention"
                      for d in temp.glob("kvprefetch-apply-*") if d not in earlier)]:
            if not swapped and att.is_dir() and not att.is_symlink():
                os.rename(att, att.with_name(".attention.away"))
                os.symlink(outside, att)
                swapped.append(att)
        return real()

    monkeypatch.setattr(upstream, "kit_headers", headers)
    with pytest.raises(KvprefetchError):
        patching.apply_patch(wd, "prefetch")
    monkeypatch.undo()
    assert swapped, "the scratch folder was never swapped"
    assert not (outside / "kvprefetch").exists()
    state = json.loads((wd / "state" / "patched.json").read_text())
    assert state["applied"] is None
