"""Issue 41, the forty-third hostile pass (tester a: the record kinds and work-directory
folders pass 42's fuzz did not reach). Each test fails without its fix (checked by reverting
``src`` and running it):

- **A tree without its attention header was "unknown", or "nothing was fetched there yet".**
  ``diff-upstream`` (and ``--check``) on a tree whose ``csrc/attention/attention_kernels.cuh``
  is deleted, or whose ``csrc/attention`` is a symlink to a folder elsewhere, called the tree
  unknown and offered ``fetch --extra-tree`` (or ``fetch``), which refuses the edited tree.
  It now names the tree and the missing file, with ``fetch --force``
  (``sources/upstream_diff.diff_upstream``).
- **An apply's journal linked to a file outside was read through the link.** A
  ``trees/.patched.apply/journal.json`` that is a symlink to a file outside the work directory
  was followed and parsed by every ``apply``, ``fetch`` and ``clean``, and the error blamed a
  missing field (``unreadable ('files')``); a state record linked so is refused. It is now a
  corrupt journal naming the link (``workspace/treetxn.recover``).
- **A build was planned in trees behind a symlinked ``trees/``.** With ``trees/`` a link to a
  folder outside, the trees were hashed through the link, found "unchanged", and ``build``
  planned its steps there (full mode runs the tree's ``setup.py`` and writes ``build/``,
  ``.deps/`` and ``*.egg-info`` into it by path: outside the work directory). ``build`` now
  refuses a tree with a symlink on its way (``builds/plan.tree_variant``); shown with
  ``--dry-run``, a real full build being a download."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvprefetch import upstream
from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


@pytest.mark.parametrize("how", ["deleted", "folder linked elsewhere"])
@pytest.mark.parametrize("check", [False, True])
def test_a_tree_without_its_header_is_named_not_called_unknown(
        fetched_workdir: Path, outside: Path, how: str, check: bool) -> None:
    work = fetched_workdir
    header = work / "trees" / "patched" / upstream.ATTENTION_HEADER
    if how == "deleted":
        header.unlink()
    else:
        folder = header.parent
        os.rename(folder, work / "aside")
        folder.symlink_to(outside / "patched")
    res = cli("diff-upstream", "--workdir", str(work), *(["--check"] if check else []))
    refused(res, 4, "trees/patched has no csrc/attention/attention_kernels.cuh",
            "fetch --force")
    assert "unknown tree" not in res.stderr and "nothing was fetched" not in res.stderr


def test_an_apply_journal_that_is_a_symlink_is_not_read_through(fetched_workdir: Path,
                                                               outside: Path) -> None:
    work = fetched_workdir
    stage = work / "trees" / ".patched.apply"
    stage.mkdir()
    (stage / "journal.json").symlink_to(outside / "baseline.json")
    for args in (("apply", "--variant", "prefetch"), ("fetch",), ("clean", "--what", "all")):
        res = cli(*args, "--workdir", str(work))
        refused(res, 4, "journal.json is corrupt: it is a symlink", "move")
        assert "unreadable" not in res.stderr
    assert (stage / "journal.json").is_symlink()


@pytest.mark.parametrize("mode", ["full", "kernels-only"])
def test_a_build_in_trees_behind_a_symlink_is_refused(fetched_workdir: Path, tmp_path: Path,
                                                      mode: str) -> None:
    work = fetched_workdir
    elsewhere = tmp_path / "elsewhere"
    os.rename(work / "trees", elsewhere)
    (work / "trees").symlink_to(elsewhere)
    res = cli("build", "--dry-run", "--mode", mode, "--arch", "9.0a", "--skip-doctor",
              "--trees", "baseline", "--workdir", str(work))
    refused(res, 2, "lies behind the symlink", "never builds (writes) through one")
