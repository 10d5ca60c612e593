"""Issue 41, the ninth hostile pass (area B): the kit's own files altered. Each test fails
without its fix (checked with the fixes stashed):

- the pass-8 check of a kit patch was not git's reading of it: an added line ``++ b/../x``
  (``+++ b/../x`` in the diff) was taken by ``patched_paths`` for a file to copy, so ``apply``
  copied a file outside the work directory over another; a hunk line holding a form feed
  (Python's ``splitlines`` ends a line there, git does not) or a hunk header with Arabic-Indic
  digits (Python's ``\\d``) hid a second section from the check that made a symlink in the
  scratch copy: ``apply`` wrote a kit header through it, outside the work directory, or
  installed a file from outside as the patched source, and ``export-header`` wrote a file from
  outside as the header. A kit patch is now read as git reads it, and only the lines
  ``git diff`` writes for an in-place change are allowed (``upstream._parse_patch``); after
  ``git apply`` the scratch copy must hold only the patched files (``_git_made_only``);
- ``csrc/kvprefetch_ops.cpp`` / ``kvprefetch_route.cpp`` (read by the builds, not through
  ``kit_headers``): a FIFO hung ``build --dry-run``, a link to /dev/zero filled memory, a link
  out was hashed and compiled; ``csrc/kvprefetch/`` a symlinked folder was read and installed;
- an altered ``rules.inc`` was a ValueError traceback from ``bench kernel --dry-run``.

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import copy_workdir, kit_copy, run_kit
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_REPO = Path(__file__).resolve().parents[2]
_X = "csrc/attention/attention_kernels.cuh"
_RULES_IN_TREE = "csrc/attention/kvprefetch/rules.inc"




def _refused(res: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "To fix:" in res.stderr, res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr


def _header_patch(kit: Path) -> Path:
    return kit / "patches" / "v0.10.2" / "prefetch" / "attention_kernels.cuh.patch"


def _link_section(target: Path) -> str:
    """A section creating csrc/attention/kvprefetch/rules.inc as a symlink to ``target`` (no
    ---/+++ lines: git takes the name from the diff --git line)."""
    return (f"diff --git a/{_RULES_IN_TREE} b/{_RULES_IN_TREE}\nnew file mode 120000\n"
            f"@@ -0,0 +1 @@\n+{target}\n\\ No newline at end of file\n")


def _hidden_by_formfeed(original: str) -> str:
    """A last hunk whose added line holds a form feed: one line for git, two for splitlines,
    the second a hunk header that swallowed the rest of the file."""
    return (original + "@@ -668,3 +669,4 @@\n #undef MAX\n #undef MIN\n #undef DIVIDE_ROUND_UP\n"
            "+//\x0c@@ -1,999 +1,999 @@\n")


def _hidden_by_arabic_digits(original: str) -> str:
    """A line git skips (not a valid hunk header) that Python's \\d read as 999 lines."""
    return original + "junk\n@@ -1,\u0669\u0669\u0669 +1,\u0669\u0669\u0669 @@\n"


@pytest.mark.parametrize("hide", ["formfeed", "arabic-digits"])
def test_a_section_hidden_from_the_patch_check_writes_nothing_outside(
        tmp_path: Path, fetched_template: Path, outside: Path, hide: str) -> None:
    """apply wrote the kit's rules.inc through a symlink that a hidden section made in its
    scratch copy: a file outside the work directory overwritten, and apply exit 0."""
    kit = kit_copy(tmp_path)
    wd = copy_workdir(fetched_template, tmp_path / "work")
    victim = outside / "notes.txt"
    before = victim.read_bytes()
    p = _header_patch(kit)
    text = p.read_text()
    text = _hidden_by_formfeed(text) if hide == "formfeed" else _hidden_by_arabic_digits(text)
    p.write_text(text + _link_section(victim))
    for args in (["apply", "--dry-run"], ["apply"], ["diff-upstream", "--check"],
                 ["export-header", "-o", str(tmp_path / "h.cuh")]):
        _refused(run_kit(kit, *args, "--workdir", str(wd)), 4, "attention_kernels.cuh.patch")
    assert victim.read_bytes() == before
    assert not os.path.lexists(wd / "trees" / "patched" / _RULES_IN_TREE)
    assert not (tmp_path / "h.cuh").exists()


def test_a_hunk_line_that_reads_as_a_file_name_is_content_not_a_file_to_copy(
        tmp_path: Path, fetched_template: Path) -> None:
    """An added line "++ b/../../../../outside/notes.txt" ("+++ b/..." in the diff, inside a
    hunk): patched_paths took it for a file, and apply copied tree/<that> over
    <scratch>/t/<that>, a file outside the work directory overwritten by another from
    outside. It is a line of C now, as git reads it; no file outside is touched."""
    kit = kit_copy(tmp_path)
    wd = copy_workdir(fetched_template, tmp_path / "a" / "work")
    victim = tmp_path / "a" / "outside" / "notes.txt"  # where <scratch>/t/../../../../ lands
    victim.parent.mkdir()
    victim.write_text("the user's own notes\n")
    source = tmp_path / "outside" / "notes.txt"  # where <tree>/../../../../ lands: the
    assert source.is_file()  # autouse fixture's folder, checked byte for byte afterwards
    p = _header_patch(kit)
    text = p.read_text()
    assert "@@ -25,6 +25,7 @@" in text
    text = text.replace("@@ -25,6 +25,7 @@", "@@ -25,6 +25,8 @@", 1).replace(
        ' #include "../cuda_compat.h"\n',
        ' #include "../cuda_compat.h"\n+++ b/../../../../outside/notes.txt\n', 1)
    p.write_text(text)
    res = run_kit(kit, "apply", "--workdir", str(wd))
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "the user's own notes\n"
    assert "++ b/../../../../outside/notes.txt" in (wd / "trees" / "patched" / _X).read_text()


@pytest.mark.parametrize("body", [
    "crlf", "index-mode-120000", "bom",
    f"diff --git a/{_X} b/csrc/attention/paged_attention_v1.cu\n",
    f"--- a/{_X}\n+++ b/{_X}\n@@ -1 +1 @@\n-a\n+b\n",
    "@@ -25,\uff16 +25,7 @@"], ids=["crlf", "index-mode-120000", "bom", "names-disagree",
                                    "no-diff-git", "fullwidth-digit"])
def test_a_kit_patch_git_would_read_otherwise_is_one_patch_error(
        tmp_path: Path, fetched_template: Path, outside: Path, body: str) -> None:
    """Patches the pass-8 check let through (CRLF lines, an index line's mode, a BOM, the two
    names of diff --git disagreeing, a section without its diff --git line, a hunk header
    with a full-width digit): now one PatchError naming the file, before git runs."""
    kit = kit_copy(tmp_path)
    wd = copy_workdir(fetched_template, tmp_path / "work")
    p = _header_patch(kit)
    text = p.read_text()
    lines = text.split("\n")
    if body == "crlf":
        text = text.replace("\n", "\r\n")
    elif body == "index-mode-120000":
        text = text.replace(lines[1], lines[1].replace("100644", "120000"))
    elif body == "bom":
        text = "\ufeff" + text
    elif body.startswith("diff --git"):
        text = body + "\n".join(lines[2:])
    elif body.startswith("@@"):
        text = text.replace("@@ -25,6 +25,7 @@", body, 1)
    else:
        text = body
    p.write_text(text)
    _refused(run_kit(kit, "apply", "--dry-run", "--workdir", str(wd)), 4,
             "attention_kernels.cuh.patch")


def test_the_scratch_copy_must_hold_only_the_patched_files(
        tmp_path: Path, fetched_template: Path, outside: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The second line, should the check ever miss a section: with the check replaced by the
    pass-8 one's verdict on a hidden section (accepted), apply refuses what git made in its
    scratch copy (a symlink) and writes nothing through it."""
    from kvprefetch import upstream
    from kvprefetch.errors import PatchError
    from kvprefetch.sources import patching

    kit = kit_copy(tmp_path)
    wd = copy_workdir(fetched_template, tmp_path / "work")
    victim = outside / "notes.txt"
    before = victim.read_bytes()
    p = _header_patch(kit)
    p.write_text(p.read_text() + _link_section(victim))
    monkeypatch.setattr(upstream, "kit_root", lambda: kit)
    real = upstream._parse_patch
    monkeypatch.setattr(upstream, "_parse_patch",
                        lambda text: real(text.split(f"diff --git a/{_RULES_IN_TREE}")[0]))
    with pytest.raises(PatchError, match="patch made csrc/attention/kvprefetch"):
        patching.apply_patch(wd, "prefetch")
    with pytest.raises(PatchError, match="patch made csrc/attention/kvprefetch"):
        patching.export_header(wd, tmp_path / "h.cuh")
    assert victim.read_bytes() == before
    assert not os.path.lexists(wd / "trees" / "patched" / _RULES_IN_TREE)


@pytest.mark.parametrize("kind", ["fifo", "link", "folder"])
@pytest.mark.parametrize("name", ["kvprefetch_ops.cpp", "kvprefetch_route.cpp"])
def test_an_altered_kit_source_is_one_build_error(
        tmp_path: Path, fetched_template: Path, outside: Path, kind: str, name: str) -> None:
    """csrc/kvprefetch_ops.cpp a FIFO hung `build --dry-run` (kernels-only); a link out was
    hashed, and compiled by a real build; a folder was "Is a directory ... check the path and
    its file system" (kernels-only) or "3: Is a directory" (overlay)."""
    kit = kit_copy(tmp_path)
    wd = copy_workdir(fetched_template, tmp_path / "work")
    assert run_kit(kit, "apply", "--workdir", str(wd)).returncode == 0
    src = kit / "csrc" / name
    src.unlink()
    if kind == "fifo":
        os.mkfifo(src)
    elif kind == "link":
        src.symlink_to(outside / "notes.txt")
    else:
        src.mkdir()
    modes = ["overlay"] if name == "kvprefetch_route.cpp" else ["kernels-only", "overlay"]
    for mode in modes:
        _refused(run_kit(kit, "build", "--mode", mode, "--dry-run", "--workdir", str(wd),
                      timeout=60), 5, f"the kit's source {src}")
    assert not (wd / "build").exists()


def test_a_symlinked_kit_header_folder_is_never_read(
        tmp_path: Path, fetched_template: Path, outside: Path) -> None:
    """csrc/kvprefetch a symlink to a folder elsewhere: its headers (each a regular file) were
    read and installed into the tree."""
    kit = kit_copy(tmp_path)
    wd = copy_workdir(fetched_template, tmp_path / "work")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(kit / "csrc" / "kvprefetch", elsewhere)
    (elsewhere / "paper.cuh").write_text("// not the kit's\n")
    shutil.rmtree(kit / "csrc" / "kvprefetch")
    (kit / "csrc" / "kvprefetch").symlink_to(elsewhere)
    for args in (["apply"], ["export-header", "-o", str(tmp_path / "h.cuh")]):
        _refused(run_kit(kit, *args, "--workdir", str(wd)), 4, "is a symlink")
    assert not os.path.lexists(wd / "trees" / "patched" / "csrc" / "attention" / "kvprefetch")


@pytest.mark.parametrize("kind", ["empty", "other-table", "fifo"])
def test_an_altered_rules_table_is_one_error_not_a_traceback(
        tmp_path: Path, outside: Path, kind: str) -> None:
    """rules.inc empty or another table: a ValueError traceback from `bench kernel --dry-run`;
    a FIFO: "rules.inc was not found", with "check the path and its file system"."""
    kit = kit_copy(tmp_path)
    r = kit / "csrc" / "kvprefetch" / "rules.inc"
    r.unlink()
    if kind == "fifo":
        os.mkfifo(r)
    else:
        r.write_text("" if kind == "empty" else "KVP_RULE(kNothing, 1)\n")
    res = run_kit(kit, "bench", "kernel", "--dry-run", timeout=60)
    _refused(res, 4, "rules.inc")
