"""Issue 41, the thirty-eighth hostile pass (tester c: the last session's new code read as an
attacker, and every option of every command fuzzed from click's own tree). Each test fails
without its fix (checked by reverting ``src`` and running it):

- **A legitimate use refused since the links check.** ``workspace/foreign.links_on_the_way``
  (every link on the way to a named ``--workdir`` or campaign) joined ``os.getcwd()`` to the
  path even when it was absolute: in a working folder deleted after the shell entered it,
  ``clean --workdir /abs/wd`` and ``slurm status /abs/camp`` were refused with "the current
  folder no longer exists ... cd into an existing folder", which they ran without before the
  check. An absolute path now asks nothing of the working folder.
- **``diff-upstream --check`` said "pristine" of a modified tree.** Files added to a tree that
  the patch never touches left its diff empty, and the check said "check: tree 'patched' is
  pristine (no patch applied)" (exit 1, no "To fix") of a tree that ``apply`` then refused as
  carrying an unknown modification. The tree's record is now compared first; a pristine tree
  is a failure with its fix.

Nothing is mocked: the CLI runs as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _in_a_deleted_folder(tmp_path: Path, args: str) -> subprocess.CompletedProcess:
    gone = tmp_path / "gone"
    gone.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    return subprocess.run(
        ["bash", "-c", f'cd "$1" && rmdir "$1" && exec "$2" -m kvprefetch {args}', "-",
         str(gone), sys.executable], env=env, capture_output=True, text=True, timeout=120,
        check=False)


def test_an_absolute_workdir_or_campaign_needs_no_working_folder(fetched_workdir: Path,
                                                                  tmp_path: Path) -> None:
    res = _in_a_deleted_folder(tmp_path, f"clean --workdir {fetched_workdir} --dry-run")
    assert res.returncode == 0, res.stderr
    assert "cd into an existing folder" not in res.stderr, res.stderr
    camp = tmp_path / "camp"
    assert cli("slurm", "plan", str(camp), "--stand-in", timeout=120).returncode == 0
    res = _in_a_deleted_folder(tmp_path, f"slurm status {camp}")
    assert "Traceback" not in res.stderr and "cd into an existing folder" not in res.stderr, \
        res.stderr
    assert "has not been submitted" in res.stderr, res.stderr
    # a relative one still needs it, and says so
    res = _in_a_deleted_folder(tmp_path, "clean --workdir wd --dry-run")
    refused(res, 2, "cd into an existing folder")


def test_diff_upstream_check_names_files_added_to_an_unpatched_tree(fetched_workdir: Path,
                                                                     outside: Path) -> None:
    wd = fetched_workdir
    (wd / "trees" / "patched" / "notes.md").write_text("mine\n")
    res = cli("diff-upstream", "--workdir", str(wd), "--tree", "patched", "--check")
    assert res.returncode == 1, res.stderr
    assert "is pristine" not in res.stderr, res.stderr
    assert "differs from what kvprefetch recorded" in res.stderr and "notes.md" in res.stderr, \
        res.stderr
    assert "To fix:" in res.stderr
    # a pristine tree fails the check with its fix
    res = cli("diff-upstream", "--workdir", str(wd), "--tree", "baseline", "--check")
    assert res.returncode == 1, res.stderr
    assert "is pristine" in res.stderr and "To fix:" in res.stderr, res.stderr
