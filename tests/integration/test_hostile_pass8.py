"""Issue 41, the eighth hostile pass: the kit's own ``patches/`` and ``csrc/kvprefetch/``
altered by the user. Each test fails without its fix (checked with the fixes stashed):

- a variant's diff naming ``../../../../outside/notes.txt``: ``apply`` copied the tree's
  ``tree/<rel>`` to ``<scratch>/t/<rel>`` before ``git apply`` (which refuses such a path) ran,
  so the copy landed outside the work directory, overwriting a file there with another file
  from outside. An absolute path, a rename, a mode change (a symlink), a binary patch, a
  symlinked, FIFO, huge or non-UTF-8 patch file are refused the same way: a kit patch only
  modifies the pinned upstream files in place (``upstream.patch_files``);
- a kit header (``csrc/kvprefetch/*.cuh``) that is a FIFO hung ``apply --dry-run`` (the patch
  hash read it); a symlink there was read and installed into the tree. Each is now a regular
  file of at most 1 MiB, or one PatchError naming it (``upstream.kit_headers``).

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import copy_workdir, kit_copy, run_kit
from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_REPO = Path(__file__).resolve().parents[2]




def _refused(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 4, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and "To fix:" in res.stderr, res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr


_ESCAPE = "../../../../outside/notes.txt"


def test_a_kit_patch_naming_a_path_out_of_the_tree_writes_nothing_outside(
        tmp_path: Path, fetched_template: Path) -> None:
    """apply copied tree/<rel> to its scratch/<rel>: with ``..`` in rel, outside to outside."""
    kit = kit_copy(tmp_path)
    wd = copy_workdir(fetched_template, tmp_path / "a" / "work")
    # beside the work directory: where <scratch>/t/../../../../ lands
    victim = tmp_path / "a" / "outside" / "notes.txt"
    victim.parent.mkdir()
    victim.write_text("the user's own notes\n")
    (kit / "patches" / "v0.10.2" / "prefetch" / "zz.patch").write_text(
        f"diff --git a/{_ESCAPE} b/{_ESCAPE}\n--- a/{_ESCAPE}\n+++ b/{_ESCAPE}\n"
        "@@ -1 +1 @@\n-keep me\n+pwned\n")
    for extra in ([], ["--dry-run"]):
        res = run_kit(kit, "apply", "--workdir", str(wd), "--variant", "prefetch", *extra)
        _refused(res, "zz.patch", "not one of the upstream files")
    assert victim.read_text() == "the user's own notes\n"
    assert sorted(os.listdir(victim.parent)) == ["notes.txt"]
    res = run_kit(kit, "export-header", "--workdir", str(wd), "-o", str(tmp_path / "h.cuh"))
    _refused(res, "zz.patch")


_V1 = "csrc/attention/paged_attention_v1.cu"


@pytest.mark.parametrize("body", [
    "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n",
    (f"diff --git a/{_V1} b/csrc/attention/x\nsimilarity index 100%\n"
     f"rename from {_V1}\nrename to csrc/attention/x\n"),
    f"diff --git a/{_V1} b/{_V1}\nold mode 100644\nnew mode 120000\n",
    f"diff --git a/{_V1} b/{_V1}\nindex 1..2 100644\nGIT binary patch\nliteral 5\nMcmZ?w\n\n",
    None, "fifo", "huge"], ids=["absolute", "rename", "symlink-mode", "binary", "link",
                               "fifo", "huge"])
def test_an_altered_kit_patch_is_one_patch_error(
        tmp_path: Path, fetched_template: Path, outside: Path, body: str | None) -> None:
    kit = kit_copy(tmp_path)
    wd = copy_workdir(fetched_template, tmp_path / "work")
    p = kit / "patches" / "v0.10.2" / "prefetch" / "zz.patch"
    if body is None:
        p.symlink_to(outside / "notes.txt")
    elif body == "fifo":
        os.mkfifo(p)
    elif body == "huge":
        with p.open("wb") as f:
            f.truncate(3 << 20)
    else:
        p.write_text(body)
    for args in (["apply", "--variant", "prefetch", "--dry-run"], ["diff-upstream", "--check"]):
        _refused(run_kit(kit, *args, "--workdir", str(wd)), "zz.patch")


@pytest.mark.parametrize("kind", ["fifo", "link", "huge"])
def test_an_altered_kit_header_is_one_patch_error(
        tmp_path: Path, fetched_template: Path, outside: Path, kind: str) -> None:
    """A FIFO in csrc/kvprefetch/ hung apply --dry-run; a link out was read and installed."""
    kit = kit_copy(tmp_path)
    wd = copy_workdir(fetched_template, tmp_path / "work")
    h = kit / "csrc" / "kvprefetch" / "paper.cuh"
    h.unlink()
    if kind == "fifo":
        os.mkfifo(h)
    elif kind == "link":
        h.symlink_to(outside / "notes.txt")
    else:
        with h.open("wb") as f:
            f.truncate(2 << 20)
    for args in (["apply", "--variant", "prefetch", "--dry-run"],
                 ["export-header", "-o", str(tmp_path / "h.cuh")]):
        _refused(run_kit(kit, *args, "--workdir", str(wd), timeout=60), "paper.cuh")
    assert not (tmp_path / "h.cuh").exists()


_RUN = "docs/results/2026-12-03-h200-vllm-call-decode"


def test_a_result_text_field_reaches_neither_the_report_lines_nor_the_terminal_raw(
        tmp_path: Path) -> None:
    """A model name with a newline and an ANSI escape: ``report --print`` wrote both raw into
    the run's own .md (a new line of markdown) and onto the terminal."""
    import gzip
    import json
    import re

    src = _REPO / _RUN / "decode-llama-3.1-8b-8000.json.gz"
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    doc["meta"]["model"]["name"] = "evil\n# injected\x1b[31m\u2028x"
    result = tmp_path / "in" / "decode-evil.json.gz"
    result.parent.mkdir()
    with gzip.open(result, "wt") as f:
        json.dump(doc, f)
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "report", str(result), "--out",
                          str(out), "--formats", "md", "--print"],
                         env=dict(_env(), PYTHONPATH=str(_REPO / "src")),
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert sorted(os.listdir(out)) == ["decode-evil.md"]  # the name is the file's, not the field's
    md = (out / "decode-evil.md").read_text()
    unprintable = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
    for text in (md, res.stdout):
        assert not unprintable.search(text), text[:300]
        assert "\n# injected" not in text
    assert md.splitlines()[0].startswith("# bench decode: evil\\n# injected\\x1b[31m")
