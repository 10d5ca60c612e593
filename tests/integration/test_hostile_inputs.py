"""Issue 41, a second hostile pass: inputs that still gave a traceback, a hang, or reached
past what the kit owns. One test per case of the pass, each failing on the code before it
(2a0c303):

- C6b-f: a build manifest with a field of the wrong type (``head_sizes: ["x"]``, ``5``), nested
  200k deep, a FIFO, or a symlink to /dev/zero, read by ``bench kernel|decode --dry-run``
  (ValueError, TypeError, RecursionError tracebacks; a hang; memory filled);
- F6: ``PIP_INDEX_URL='not a url'`` (``--index-url`` was refused, the environment's was not);
- B7: ``--sample-max-kv nan|inf|1e999`` (ValueError / OverflowError tracebacks);
- C4b: an apply journal's saved copy ``old/<rel>`` that is a symlink (to /dev/zero: the disk
  filled; to an outside file: its content went into the tree) or a FIFO;
- N6b/N8: a newline in ``--tree-define`` went raw into build.ninja (a new ninja rule);
- A1/A2: ``fetch --adopt`` deleted a user's files named like the kit's temporaries, and
  truncated a user's ``.lock`` files.

Every refusal is checked with ``refused`` (the family's exit code, "To fix", no traceback);
the autouse ``outside`` fixture (shared with test_reliability.py) checks that a folder outside
the work directory is byte-identical afterwards."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvprefetch import upstream
from kvprefetch.errors import BenchError, ConfigError, LockError, PatchError
from tests.integration.helpers import kvprefetch_cli_split, tree_bytes
from tests.integration.test_reliability import _env, cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

DEEP = "[" * 200_000 + "]" * 200_000
KERNEL_DRY = ("bench", "kernel", "--dry-run", "--batch", "1", "--context", "512")


def _manifest(wd: Path, **fields: object) -> Path:
    """build/baseline/k1/manifest.json as `build --kernels-only` writes it, with ``fields``
    replaced, beside a placeholder library."""
    d = wd / "build" / "baseline" / "k1"
    d.mkdir(parents=True)
    (d / "lib.so").write_bytes(b"not really a library")
    doc = {"tree": "baseline", "variant": "baseline", "namespace": "kvprefetch_baseline",
           "so_path": "lib.so", "so_sha256": hashlib.sha256(b"not really a library").hexdigest(),
           "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["auto"], **fields}
    (d / "manifest.json").write_text(json.dumps(doc))
    return d / "manifest.json"


# ------------------------------------------------------------------ C6b-f: build manifests


@pytest.mark.parametrize(("fields", "needle"), [
    ({"head_sizes": ["x"]}, "'head_sizes' is not a list of whole numbers"),
    ({"head_sizes": 5}, "'head_sizes' is not a list of whole numbers"),
    ({"block_sizes": [True]}, "'block_sizes' is not a list of whole numbers"),
    ({"kv_dtypes": [1]}, "'kv_dtypes' is not a list of strings"),
    ({"so_path": ["lib.so"]}, "'so_path' is not a string"),
    ({"tree": {"a": 1}}, "'tree' is not a string"),
], ids=["head-sizes-strings", "head-sizes-a-number", "block-sizes-bools", "kv-dtypes-numbers",
        "so-path-a-list", "tree-an-object"])
@pytest.mark.parametrize("command", ["kernel", "decode"])
def test_a_build_manifest_with_a_field_of_the_wrong_type_is_one_message_naming_it(
        tmp_path: Path, fields: dict, needle: str, command: str) -> None:
    wd = tmp_path / "w"
    manifest = _manifest(wd, **fields)
    argv = (KERNEL_DRY if command == "kernel" else
            ("bench", "decode", "--dry-run", "--batch", "1", "--context", "1k", "--layers", "1"))
    res = cli(*argv, "--workdir", str(wd), "--out", str(tmp_path / "o"), timeout=120)
    refused(res, BenchError.exit_code, str(manifest), needle, "kvprefetch build --kernels-only",
            "move that build folder")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["nested-200k", "fifo", "dev-zero", "folder"])
def test_an_unreadable_build_manifest_is_skipped_like_one_that_is_not_json(
        tmp_path: Path, kind: str) -> None:
    """find_builds skips a manifest it cannot read as JSON (as it always skipped one that is
    not JSON): no traceback, no hang on a FIFO, no /dev/zero read into memory; the valid
    build of another tree is still found."""
    wd = tmp_path / "w"
    manifest = _manifest(wd)
    manifest.unlink()
    if kind == "nested-200k":
        manifest.write_text(DEEP)
    elif kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "dev-zero":
        manifest.symlink_to("/dev/zero")
    else:
        manifest.mkdir()
    good = wd / "build" / "patched" / "k2"
    shutil.copytree(manifest.parent.parent / "k1", good, symlinks=True,
                    ignore=shutil.ignore_patterns("manifest.json"))
    (good / "manifest.json").write_text(json.dumps({
        "tree": "patched", "variant": "patched", "namespace": "kvprefetch_patched",
        "so_path": "lib.so", "so_sha256": hashlib.sha256(b"not really a library").hexdigest(),
        "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["auto"]}))
    res = cli(*KERNEL_DRY, "--workdir", str(wd), "--out", str(tmp_path / "o"), "--json",
              timeout=60)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    plan = json.loads(res.stdout)
    assert [b["tree"] for b in plan["variants"]] == ["patched"], plan["variants"]


def test_read_manifest_refuses_an_unreadable_manifest_with_one_message(tmp_path: Path) -> None:
    from kvprefetch.kernels.ops import read_manifest

    manifest = _manifest(tmp_path)
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(BenchError, match="not a regular file") as info:
        read_manifest(manifest)
    assert str(manifest) in str(info.value) and "To fix:" in str(info.value)
    manifest.unlink()
    manifest.write_text(DEEP)
    with pytest.raises(BenchError, match="nested too deep"):
        read_manifest(manifest)
    manifest.write_text("[1]")
    with pytest.raises(BenchError, match="not a JSON object"):
        read_manifest(manifest)


# ------------------------------------------------------------------------ F6: PIP_INDEX_URL


@pytest.mark.parametrize("url", ["not a url", "ftp://example.org/simple", "http://"])
def test_a_pip_index_url_that_is_no_url_is_refused_like_the_option(tmp_path: Path,
                                                                   url: str) -> None:
    env = {**_env(), "PIP_INDEX_URL": url}
    res = kvprefetch_cli_split("fetch", "--source", "sdist", "--workdir", str(tmp_path / "w"),
                               env=env, timeout=120)
    refused(res, ConfigError.exit_code, f"PIP_INDEX_URL {url!r} is not an http://",
            "set PIP_INDEX_URL")
    assert not (tmp_path / "w" / "downloads" / upstream.SDIST_NAME).exists()


# ------------------------------------------------------------------------ B7: --sample-max-kv


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "1e30", "2000000g"])
def test_a_sample_max_kv_that_is_not_a_finite_size_is_a_usage_error(tmp_path: Path,
                                                                    value: str) -> None:
    res = cli("bench", "kernel", "--dry-run", "--sample", "5", "--sample-max-kv", value,
              "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "o"), timeout=120)
    refused(res, ConfigError.exit_code, f"--sample-max-kv '{value}'", "write it like 4g")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------- C4b: the journal's stage


def _pending_apply(wd: Path) -> tuple[Path, Path]:
    """An interrupted apply to ``patched`` whose journal says one tree file went from another
    content ("before") to what it holds now ("after"): a rollback copies ``old/<rel>`` back.
    Returns (the stage's saved copy, the tree file)."""
    rel = upstream.PAGED_ATTENTION_SOURCES[0]
    target = wd / "trees" / "patched" / rel
    stage = wd / "trees" / ".patched.apply"
    (stage / "old" / rel).parent.mkdir(parents=True)
    (stage / "journal.json").write_text(json.dumps({
        "tree": "patched", "state": {"not": "the state"},
        "files": [{"rel": rel, "before": "0" * 64,
                   "after": hashlib.sha256(target.read_bytes()).hexdigest()}]}))
    return stage / "old" / rel, target


@pytest.mark.parametrize("kind", ["symlink-outside", "symlink-dev-zero", "fifo", "folder"])
def test_a_journal_stage_copy_that_is_not_a_regular_file_makes_the_journal_corrupt(
        fetched_workdir: Path, outside: Path, kind: str) -> None:
    wd = fetched_workdir
    saved, target = _pending_apply(wd)
    if kind == "symlink-outside":
        saved.symlink_to(outside / "notes.txt")
    elif kind == "symlink-dev-zero":
        saved.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(saved)
    else:
        saved.mkdir()
    trees = tree_bytes(wd / "trees" / "patched")
    res = cli("apply", "--workdir", str(wd), timeout=120)
    refused(res, PatchError.exit_code, "journal.json is corrupt", str(saved),
            "not a regular file")
    assert tree_bytes(wd / "trees" / "patched") == trees
    assert not list(target.parent.glob(f".{target.name}.restore-*"))


def test_a_rollback_whose_copy_fails_leaves_no_partial_restore_file(
        fetched_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy of a saved file back into the tree fails half-way (disk full): the partial
    ``.<name>.restore-<pid>`` is removed, and the tree file is as it was."""
    from kvprefetch.workspace import treetxn
    from kvprefetch.workspace.workdir import Workdir

    wd = fetched_workdir
    saved, target = _pending_apply(wd)
    saved.write_text("the content before the apply\n")
    before = target.read_bytes()

    def full_after_the_bytes(fd: int, mode: int) -> None:  # the copy's bytes are written
        raise OSError(28, "No space left on device")

    # the copy back goes through confine.write_file since the ninth pass (a temporary beside
    # the file, then a rename): it fails after writing the bytes, before the rename
    monkeypatch.setattr(treetxn.confine.os, "fchmod", full_after_the_bytes)
    with pytest.raises(OSError, match="No space left"):
        treetxn.recover(Workdir(wd), "patched")
    assert target.read_bytes() == before
    assert not list(target.parent.glob(f".{target.name}.restore-*"))
    assert not list(target.parent.glob(f".{target.name}.tmp-*"))


# ------------------------------------------------------------- N6b/N8: build.ninja values


@pytest.mark.parametrize("define", ["patched:X=1\nrule pwn\n  command = touch /tmp/pwned",
                                    "patched:X=1\rY", "patched:X=\x1b[2J", "patched:X=1\tY"],
                         ids=["newline", "cr", "escape", "tab"])
def test_a_tree_define_with_a_control_character_is_refused(tmp_path: Path,
                                                            define: str) -> None:
    res = cli("build", "--dry-run", "--workdir", str(tmp_path / "w"), "--tree-define", define,
              timeout=120)
    refused(res, ConfigError.exit_code, "--tree-define", "holds a control character")
    assert "rule pwn" not in res.stdout


def test_build_ninja_never_holds_a_value_with_a_newline(tmp_path: Path) -> None:
    """The last line of defence: a path or flag from the environment (CXX, a torch include
    path) with a newline is refused by ninja_text, never written raw into build.ninja."""
    from kvprefetch.builds.library import ninja_text

    ok: dict[str, Any] = {
        "nvcc": Path("/usr/local/cuda/bin/nvcc"), "cxx": "g++",
        "cu_sources": [tmp_path / "a.cu"], "cpp_source": tmp_path / "b.cpp",
        "nvcc_flags": ["-O2"], "cxx_flags": ["-O2"], "link_flags": ["-shared"],
        "output": tmp_path / "lib.so"}
    assert "rule nvcc" in ninja_text(**ok)
    for key, bad in (("cxx", "g++\nrule pwn"), ("nvcc_flags", ["-DX=1\nrule pwn"]),
                     ("link_flags", ["-L/x\n"]), ("cu_sources", [tmp_path / "a\nb.cu"]),
                     ("output", tmp_path / "lib\n.so")):
        with pytest.raises(ConfigError, match="control character"):
            ninja_text(**{**ok, key: bad})


# ------------------------------------------------------------------- A1/A2: fetch --adopt


USER_TEMPS = (".kvprefetch-owned.json.tmp-abc123-999999999",
              "state/.baseline.json.tmp-abc123-999999999",
              "state/.patched.json.tmp-1-999999999")


def test_adoption_never_deletes_a_user_file_named_like_a_kit_temporary(
        tmp_path: Path, vllm_sdist: Path) -> None:
    home = tmp_path / "home"
    for rel in USER_TEMPS:
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(f"my file {rel}\n")
    res = cli("fetch", "--workdir", str(home), "--source", str(vllm_sdist), "--adopt")
    assert res.returncode == 0, res.stderr
    for rel in USER_TEMPS:
        assert (home / rel).read_text() == f"my file {rel}\n", rel
    # and the next commands, which remove orphans and recover trees, leave them too
    for argv in (("apply",), ("clean", "--what", "builds")):
        res = cli(argv[0], "--workdir", str(home), *argv[1:])
        assert res.returncode == 0, res.stderr
        for rel in USER_TEMPS:
            assert (home / rel).read_text() == f"my file {rel}\n", (argv, rel)


def test_adoption_never_truncates_a_user_lock_file(tmp_path: Path, vllm_sdist: Path) -> None:
    """A file named like the kit's lock that holds something else than a pid is not the kit's:
    the kit refuses to take it as a lock (LockError) and leaves it byte-identical."""
    for rel in (".lock", ".locks/tree-baseline.lock"):
        home = tmp_path / rel.replace("/", "_")
        (home / rel).parent.mkdir(parents=True)
        (home / rel).write_text("my notes on locksmithing\n")
        res = cli("fetch", "--workdir", str(home), "--source", str(vllm_sdist), "--adopt")
        refused(res, LockError.exit_code, str(home / rel), "kvprefetch did not write")
        assert (home / rel).read_text() == "my notes on locksmithing\n"


def test_a_lock_left_by_a_killed_run_is_still_taken(fetched_workdir: Path) -> None:
    """What the kit's lock file holds after a killed run (its marker and pid) is the kit's:
    taken again. (A bare pid, what kits before the marker left, is refused since the third
    pass: test_hostile_pass3.test_a_lock_file_of_digits_is_refused_never_emptied.)"""
    (fetched_workdir / ".locks" / "tree-patched.lock").write_text("kvprefetch-lock pid 3999999\n")
    res = cli("apply", "--workdir", str(fetched_workdir))
    assert res.returncode == 0, res.stderr
