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
- **Another user's link taken as an output or a work directory to load from.** Pass 37 held
  ``--workdir`` and a campaign to the rule "no link on the way that another user owns", but not
  the other paths a user names: ``export-header -o /tmp/shared/out/x.h`` through ``nobody``'s
  ``/tmp/shared/out -> ~/thesis`` wrote ``x.h`` into the folder nobody chose, and ``vmm bench
  --paged-workdir`` (whose builds the kit loads) followed such a link. ``-o``/``--out`` of
  export-header, report, bench and vmm bench, and ``--paged-workdir``, are now refused the
  same way (``cli/common.refuse_foreign_links``); the user's own link is still followed.

- **A campaign or work directory through a file.** ``slurm status F/x`` (F a file) said
  "restore F/x/campaign.json as slurm plan wrote it", and ``build --workdir F/x`` "run
  kvprefetch fetch", which fails the same way; both now say the path goes through a file
  (``cli/common.refuse_a_path_through_a_file``).

Nothing is mocked: the CLI runs as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link another user owns")
def test_an_output_or_paged_workdir_through_another_users_link_is_refused(
        fetched_workdir: Path, tmp_path: Path, outside: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    for name, to in (("out", outside), ("wd", fetched_workdir)):
        (shared / name).symlink_to(to)
        os.lchown(shared / name, NOBODY, NOBODY)
    out = shared / "out"
    runs = [["export-header", "--workdir", str(fetched_workdir), "-o",
             str(out / "patched" / "x.h")],
            ["report", "--out", str(out / "patched"), str(tmp_path / "r.json")],
            ["bench", "decode", "--workdir", str(fetched_workdir), "--out", str(out / "patched"),
             "--dry-run"],
            ["vmm", "bench", "--out", str(out / "v.json"), "--dry-run"],
            ["vmm", "bench", "--paged-workdir", str(shared / "wd"), "--out",
             str(tmp_path / "v.json"), "--dry-run"]]
    (tmp_path / "r.json").write_text("{}")
    for args in runs:
        res = cli(*args, timeout=300)
        refused(res, 2, "is a symlink that belongs to nobody", "realpath")
    assert not (outside / "patched" / "x.h").exists()  # the outside fixture checks the rest
    # report --readme rewrites its file in place: a link of nobody's higher up is refused too
    theirs = tmp_path / "readme-folder"
    (theirs / "docs").mkdir(parents=True)
    text = "# x\n<!-- commands -->\nold\n<!-- /commands -->\n"
    (theirs / "docs" / "R.md").write_text(text)
    (shared / "r").symlink_to(theirs)
    os.lchown(shared / "r", NOBODY, NOBODY)
    refused(cli("report", "--readme", str(shared / "r" / "docs" / "R.md")), 2,
            "is a symlink that belongs to nobody")
    assert (theirs / "docs" / "R.md").read_text() == text
    # a link of the user's own higher up is still followed
    own = tmp_path / "own"
    own.symlink_to(tmp_path / "mine", target_is_directory=True)
    (tmp_path / "mine" / "sub").mkdir(parents=True)
    res = cli("export-header", "--workdir", str(fetched_workdir), "-o", str(own / "sub" / "x.h"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "mine" / "sub" / "x.h").is_file()


def test_a_work_directory_or_campaign_through_a_file_is_named(tmp_path: Path,
                                                             outside: Path) -> None:
    f = tmp_path / "notes.json"
    f.write_text("{}")
    for args in (["slurm", "status", str(f / "x")], ["clean", "--workdir", str(f / "x")]):
        res = cli(*args, timeout=120)
        refused(res, 2, "goes through a file, not a folder")
        assert "restore " not in res.stderr and "kvprefetch fetch" not in res.stderr, res.stderr
