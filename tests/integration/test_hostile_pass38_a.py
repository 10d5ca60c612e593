"""Issue 41, the thirty-eighth hostile pass (tester a: the original pass again, case by case,
one step past each). Each test fails without its fix (checked by reverting ``src`` and running
it):

- **A fix that did not work: an apply killed part-way, then a file it had replaced edited.**
  The next ``fetch`` said "changed while an interrupted apply was pending ... To fix: keep what
  you need from the tree, then `kvprefetch fetch --force`"; but every fetch, ``--force``
  included, recovers the stage first, and ``fetch --force`` met the same error, for ever. The
  fix now names the stage to move out first (``workspace/treetxn._restore``).
- **A wrong cause: ``pristine/`` a link from the start** (a user who moved the pristine copy
  to a larger disk). A ``fetch`` that makes a tree from it said "a folder on the way became a
  symlink or stopped being a folder while kvprefetch worked (another process is changing the
  work directory)": no other process ran. A copy's source inside the work directory is now
  checked before the walk, and the link is named as one (``workspace/confine.copy_tree``).
  Nothing behind the link was ever read into a tree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

KERNELS = "csrc/attention/attention_kernels.cuh"

# A real apply, killed (os._exit) after its journal is written and the tree's file replaced,
# before its state record: the window test_reliability's SIGKILL cases aim at, made certain.
_KILLED_APPLY = """
import os, sys
from pathlib import Path
from kvprefetch.workspace import treetxn
from kvprefetch.workspace.workdir import Workdir
wd = Workdir(Path(sys.argv[1]))
new = Path(sys.argv[2])
treetxn.commit(wd, "patched", {sys.argv[3]: new}, {"tree": "patched", "x": 1},
               verify=lambda: os._exit(9))
"""


def test_a_file_edited_after_a_killed_apply_names_a_fix_that_works(
        fetched_workdir: Path, tmp_path: Path) -> None:
    wd = fetched_workdir
    new = tmp_path / "new.cuh"
    new.write_text("// the patched kernel\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    res = subprocess.run([sys.executable, "-c", _KILLED_APPLY, str(wd), str(new), KERNELS],
                         check=False, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 9, res.stderr
    stage = wd / "trees" / ".patched.apply"
    assert (stage / "journal.json").is_file()
    tree_file = wd / "trees" / "patched" / KERNELS
    tree_file.write_text("// the user's own edit, made after the apply was killed\n")

    res = cli("fetch", "--source", "sdist", "--workdir", str(wd))
    refused(res, 4, "changed while an interrupted apply was pending", str(stage))
    # the fix, done as told: the stage moved out of the work directory, then fetch --force
    fix = res.stderr[res.stderr.index("To fix:"):]
    assert re.search(rf"move {re.escape(str(stage))}\b", fix), fix
    shutil.move(str(stage), str(tmp_path / "stage-kept"))
    res = cli("fetch", "--force", "--source", "sdist", "--workdir", str(wd))
    assert res.returncode == 0, res.stderr
    kept = list((wd / "backup").rglob("attention_kernels.cuh"))
    assert any("the user's own edit" in p.read_text() for p in kept), kept


def test_a_pristine_folder_linked_elsewhere_is_named_as_a_link_not_a_race(
        fetched_workdir: Path, tmp_path: Path) -> None:
    wd = fetched_workdir
    moved = tmp_path / "bigdisk" / "pristine"
    moved.parent.mkdir()
    shutil.move(str(wd / "pristine"), str(moved))
    (wd / "pristine").symlink_to(moved, target_is_directory=True)
    shutil.rmtree(wd / "trees" / "patched")  # a tree to make again, from pristine/
    res = cli("fetch", "--source", "sdist", "--workdir", str(wd))
    refused(res, 3, f"{wd / 'pristine'} is a symlink",
            f"replace the symlink {wd / 'pristine'} by a real directory")
    assert "became a symlink" not in res.stderr and "another process" not in res.stderr, \
        res.stderr
    assert not (wd / "trees" / "patched").exists()
