"""Issue 41, class 6 ("smaller, same spirit") and the "every writer" rule: dry runs and
read-only commands write nothing; a killed ``clean`` leaves nothing that needs ``--force``;
tamper detection sees ``_version.py``, a nested ``build/``, a ``.so`` and a new symlink;
messages that sent the user the wrong way; and every file the kit writes goes through
``confine.write_file``. Each test failed on the code before its change (checked with
``PYTHONPATH`` at an export of that commit). docs/reliability.md lists them.

Like test_hostile.py, every case checks that a folder outside the work directory is
byte-identical afterwards (the autouse ``outside`` fixture of test_reliability.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError, FetchError, LockError, PatchError
from kvprefetch.hashing import source_manifest
from tests.integration.helpers import copy_workdir, tree_bytes
from tests.integration.test_reliability import (
    _consistent,
    _debris,
    _kill_after,
    _remount,
    _start,
    cli,
    outside,
    refused,
    small_tmpfs,
)

__all__ = ["outside", "small_tmpfs"]  # fixtures: the outside folder, a real tmpfs

OWNED = ".kvprefetch-owned.json"


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (root included) with its type, mode, mtime and content: a
    write, a rename, a new or removed entry, even a rewrite with the same bytes, all show."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in ["", *dirnames, *filenames]:
            p = Path(dirpath, name) if name else Path(dirpath)
            if not name and p != root and p.name in dirnames:
                continue
            st = os.lstat(p)
            key = p.relative_to(root).as_posix()
            if stat.S_ISREG(st.st_mode):
                what: object = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(p)
            else:
                what = None
            out[key] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_mtime_ns, st.st_size, what)
    return out


def _changed(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


# --------------------------------------------------------------- 1. dry runs write nothing

READ_ONLY_COMMANDS = [
    ("fetch", "--dry-run", "--source", "sdist"),
    ("fetch", "--dry-run", "--source", "sdist", "--force", "--extra-tree", "x"),
    ("apply", "--dry-run"),
    ("build", "--dry-run", "--kernels-only", "--arch", "9.0a", "--head-sizes", "128"),
    ("clean", "--dry-run", "--what", "all", "--discard-edits"),
    ("diff-upstream",),
    ("diff-upstream", "--check"),
    ("doctor", "--kernels-only", "--arch", "9.0a"),
]


def test_dry_runs_and_read_only_commands_write_nothing(small_tmpfs: Path,
                                                       fetched_template: Path) -> None:
    """`build --dry-run` rewrote the ownership record and compiled doctor's nvcc probe in the
    work directory's tmp/; `doctor` and `diff-upstream --check` did the same, and
    `apply --dry-run` wrote its pid into the tree's lock. Each read-only command runs twice:
    on the work directory as it is (nothing may change, not even an mtime), then with the
    tmpfs remounted read-only (root ignores file modes, a read-only mount it cannot)."""
    _remount(small_tmpfs, "size=4g")  # a limit, not an allocation: doctor's disk check passes
    work = small_tmpfs / "work"
    shutil.copytree(fetched_template, work, symlinks=True)
    assert cli("apply", "--workdir", str(work)).returncode == 0
    before = _snapshot(work)
    for argv in READ_ONLY_COMMANDS:
        res = cli(argv[0], "--workdir", str(work), *argv[1:])
        assert res.returncode == 0, (argv, res.stderr)
        assert _changed(before, _snapshot(work)) == [], argv
    _remount(small_tmpfs, "ro")
    try:
        for argv in READ_ONLY_COMMANDS:
            if argv[0] == "doctor":
                # doctor's answer on a read-only disk is that no build can write there (its
                # disk line, with its own fix), not a pass; it still writes nothing
                res = cli(argv[0], "--workdir", str(work), *argv[1:], "--json")
                assert res.returncode == 2, (argv, res.stderr)
                disk = [c for c in json.loads(res.stdout)["checks"] if c["name"] == "disk"]
                assert "read-only file system" in disk[0]["detail"], disk
                continue
            res = cli(argv[0], "--workdir", str(work), *argv[1:])
            assert res.returncode == 0, (argv, res.stderr)
        # a new work directory is not even created by a dry run
        res = cli("fetch", "--workdir", str(small_tmpfs / "new"), "--dry-run", "--source", "sdist")
        assert res.returncode == 0, res.stderr
    finally:
        _remount(small_tmpfs, "rw")
    assert _changed(before, _snapshot(work)) == []
    assert not (small_tmpfs / "new").exists()


# ------------------------------------------------------- 3. tamper detection sees everything

def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


# each makes one change to a tree and returns the path to remove to undo it (None: restore)
TAMPERS = {
    # an edited file the sdist ships, which the inventory skipped by name
    "version-py": lambda t: (t / "vllm" / "_version.py").write_text("__version__ = 'x'\n") and None,
    # a build/ folder below the top level (only the top-level one is a build's output)
    "nested-build": lambda t: _write(t / "csrc" / "build" / "x.cu", b"evil\n").parent,
    "shared-object": lambda t: _write(t / "vllm" / "evil.so", b"\x7fELF evil"),
    "object-file": lambda t: _write(t / "csrc" / "evil.o", b"\x7fELF evil"),
    "bare-pyc": lambda t: _write(t / "vllm" / "envs.pyc", b"evil"),
    "file-symlink": lambda t: (t / "vllm" / "link.py").symlink_to("/etc/hostname")
    or t / "vllm" / "link.py",
    "folder-symlink": lambda t: (t / "csrc" / "linked").symlink_to(
        t.parent.parent.parent / "outside", target_is_directory=True) or t / "csrc" / "linked",
    "fifo": lambda t: os.mkfifo(t / "vllm" / "pipe") or t / "vllm" / "pipe",
}


def test_tamper_detection_sees_version_py_nested_build_so_and_symlinks(
        fetched_workdir: Path) -> None:
    """An edited vllm/_version.py, a csrc/build/ folder, a .so, a .o, a .pyc outside
    __pycache__, a new symlink (to a file or a folder) and a FIFO were all skipped by the
    inventory, so fetch, apply, clean and diff-upstream called the tree unchanged. Python's
    bytecode cache is still left out, and the kit never copies one into a tree."""
    wd = fetched_workdir
    tree = wd / "trees" / "baseline"
    assert not list(tree.rglob("__pycache__"))  # the sdist ships one; fetch leaves it out
    (tree / "vllm" / "__pycache__").mkdir()
    (tree / "vllm" / "__pycache__" / "envs.cpython-311.pyc").write_bytes(b"python's cache")
    res = cli("fetch", "--workdir", str(wd), "--source", "sdist", "--json")
    assert res.returncode == 0, res.stderr  # Python's cache is not an edit
    pristine = source_manifest(tree)  # never opens the FIFO (tree_bytes would block on it)
    for name, tamper in TAMPERS.items():
        made = tamper(tree)
        res = cli("fetch", "--workdir", str(wd), "--source", "sdist")
        refused(res, PatchError.exit_code, "local modifications")
        changed = _changed_paths(pristine, source_manifest(tree))
        for rel in changed:
            assert rel.split("/")[-1] in res.stderr or rel in res.stderr, (name, res.stderr)
        res = cli("clean", "--workdir", str(wd), "--what", "trees", "--dry-run", "--json")
        kept = {k["path"]: k["reason"] for k in json.loads(res.stdout)["kept"]}
        assert kept.get(str(tree), "").startswith("edited since"), (name, kept)
        if made is not None and made.is_dir() and not made.is_symlink():
            shutil.rmtree(made)
        elif made is not None:
            made.unlink()
        else:
            shutil.copy2(wd / "pristine" / "sdist" / "vllm" / "_version.py",
                         tree / "vllm" / "_version.py")
        assert source_manifest(tree) == pristine, name
    # the patched tree: apply and diff-upstream --check see a symlinked folder too
    patched = wd / "trees" / "patched"
    (patched / "vllm" / "linked").symlink_to(wd.parent / "outside", target_is_directory=True)
    refused(cli("apply", "--workdir", str(wd)), PatchError.exit_code,
            "A vllm/linked (a symlink")
    (patched / "vllm" / "linked").unlink()
    assert cli("apply", "--workdir", str(wd)).returncode == 0
    (patched / "vllm" / "_version.py").write_text("__version__ = 'evil'\n")
    res = cli("diff-upstream", "--workdir", str(wd), "--check")
    assert res.returncode == 1 and "M vllm/_version.py" in res.stderr, res.stderr


def _changed_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def test_a_tree_recorded_by_the_first_inventory_rules_is_still_unchanged(
        fetched_workdir: Path) -> None:
    """A state record made before the inventory counted _version.py and symlinks has no
    "inventory_rules": it is compared under the old rules (no tree of an existing work
    directory turns "modified"), and `fetch --repair` records it under the new ones."""
    wd = fetched_workdir
    for name in ("baseline", "patched"):
        sp = wd / "state" / f"{name}.json"
        state = json.loads(sp.read_text())
        del state["inventory_rules"]
        state["inventory"].pop("vllm/_version.py")
        sp.write_text(json.dumps(state))
    res = cli("fetch", "--workdir", str(wd), "--source", "sdist", "--json")
    assert res.returncode == 0, res.stderr
    assert [t["action"] for t in json.loads(res.stdout)["trees"]] == ["unchanged", "unchanged"]
    assert cli("apply", "--workdir", str(wd)).returncode == 0
    assert cli("fetch", "--workdir", str(wd), "--source", "sdist", "--repair").returncode == 0
    state = json.loads((wd / "state" / "patched.json").read_text())
    assert state["inventory_rules"] == 2 and "vllm/_version.py" in state["inventory"]
    assert json.loads((wd / "state" / "patched.json").read_text())["applied"] is not None


# ------------------------------------------------------ 2. a killed clean needs no --force

CLEAN_KILLS = [0.5, 0.9, 1.4, "removing"]


@pytest.mark.parametrize("at", CLEAN_KILLS, ids=[str(a) for a in CLEAN_KILLS])
def test_sigkill_during_clean_then_fetch_and_clean_need_no_force(
        at: float | str, tmp_path: Path, fetched_template: Path) -> None:
    """`clean --what all` killed while it deletes: a tree deleted half-way used to stay in
    place, recorded, so fetch refused it ("local modifications", --force) and clean kept it
    ("edited"). Now each directory is renamed to a recorded temporary before it is deleted:
    whatever the kill interrupted, the next fetch and clean finish the job on their own."""
    work = copy_workdir(fetched_template, tmp_path / "work")
    proc = _start("clean", "--workdir", str(work), "--what", "all")
    trees = work / "trees"

    def deleting() -> bool:  # the new code's temporary, or (old code) a tree losing files
        return bool(list(trees.glob(".*.tmp-*"))) or not all(
            (trees / n / "setup.py").exists() and (trees / n / "vllm" / "envs.py").exists()
            for n in ("baseline", "patched"))

    _kill_after(proc, 0 if at == "removing" else float(at),
                deleting if at == "removing" else None)
    # a kill can also land while the ownership record is rewritten (write_file's temporary
    # beside it: "." + the record's name + ".tmp-<hex>-<pid>", a pid no process has here, yet
    # one a process could have: at most ownership.PID_MAX); one such leftover is planted so
    # that every case checks its removal
    (work / "..kvprefetch-owned.json.tmp-abcdef-4000000").write_text("{}")
    res = cli("fetch", "--workdir", str(work), "--source", "sdist", "--json")
    assert res.returncode == 0, res.stderr
    _consistent(work, applied=False)
    res = cli("clean", "--workdir", str(work), "--what", "all", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kept"] == [], res.stdout
    for d in ("trees", "pristine", "state"):
        assert not (work / d).is_dir() or list((work / d).iterdir()) == [], d
    assert _debris(work) == []


# ------------------------------------------------- 4. messages that sent the user the wrong way


def test_a_symlinked_work_directory_is_one_directory_for_every_command(
        fetched_workdir: Path, tmp_path: Path) -> None:
    """fetch and clean refused a work directory reached through a symlink and said to remove
    its `.lock` (there was nothing wrong with it), while apply went through the link. The
    location the user names is trusted: the link is followed once, and every command then
    acts (and locks) in the real directory."""
    link = tmp_path / "link"
    link.symlink_to(fetched_workdir, target_is_directory=True)
    res = cli("fetch", "--workdir", str(link), "--source", "sdist", "--json")
    assert res.returncode == 0, res.stderr
    assert [t["path"] for t in json.loads(res.stdout)["trees"]] == [
        str(fetched_workdir / "trees" / n) for n in ("baseline", "patched")]
    assert cli("apply", "--workdir", str(link)).returncode == 0
    res = cli("clean", "--workdir", str(link), "--what", "all")
    assert res.returncode == 0, res.stderr
    assert not (fetched_workdir / "trees" / "patched").exists()
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == [
        "link", "outside", "work"]


def test_a_fifo_or_a_symlinked_folder_in_place_of_a_lock_is_named(fetched_workdir: Path,
                                                                   tmp_path: Path) -> None:
    """A FIFO where a lock goes said "apply failed: Invalid argument" (flock on a FIFO); a
    symlinked folder holding locks said to remove the lock file, which was not the problem."""
    wd = fetched_workdir
    lock = wd / ".locks" / "tree-patched.lock"
    lock.unlink(missing_ok=True)
    os.mkfifo(lock)
    for argv in (("apply",), ("fetch", "--source", "sdist"), ("clean", "--what", "trees")):
        res = cli(argv[0], "--workdir", str(wd), *argv[1:], timeout=60)
        refused(res, LockError.exit_code, f"cannot take the lock {lock}: it is a FIFO",
                f"remove or move away {lock}")
    lock.unlink()
    (wd / ".lock").unlink(missing_ok=True)
    os.mkfifo(wd / ".lock")
    refused(cli("clean", "--workdir", str(wd), timeout=60), LockError.exit_code,
            f"{wd / '.lock'}: it is a FIFO")
    (wd / ".lock").unlink()
    shutil.move(wd / ".locks", tmp_path / "locks-elsewhere")
    (wd / ".locks").symlink_to(tmp_path / "locks-elsewhere", target_is_directory=True)
    refused(cli("apply", "--workdir", str(wd)), LockError.exit_code,
            f"the folder holding it, {wd / '.locks'}, is a symlink",
            f"replace the symlink {wd / '.locks'} by a real directory")
    (wd / ".locks").unlink()
    assert cli("apply", "--workdir", str(wd)).returncode == 0


def test_a_symlinked_folder_inside_a_tree_is_named_and_its_fix_works(
        fetched_workdir: Path, tmp_path: Path) -> None:
    """With csrc/attention/kvprefetch/ (where apply puts the kit's headers) a symlink to a
    folder elsewhere, apply said "changed while apply ran ... rerun `kvprefetch apply`",
    and every rerun said it again. Now the link is a difference of the tree, named as a
    symlink before anything is written; moving it away, as the message says, fixes it."""
    wd = fetched_workdir
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = wd / "trees" / "patched" / "csrc" / "attention" / "kvprefetch"
    link.symlink_to(elsewhere, target_is_directory=True)
    for _ in range(2):
        refused(cli("apply", "--workdir", str(wd)), PatchError.exit_code,
                f"A csrc/attention/kvprefetch (a symlink -> {elsewhere})",
                "keep your changes elsewhere")
    assert list(elsewhere.iterdir()) == []
    link.unlink()
    res = cli("apply", "--workdir", str(wd), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["action"] == "applied", res.stderr


def test_fetch_repair_works_after_the_ownership_record_is_moved_aside(
        fetched_workdir: Path, tmp_path: Path, vllm_sdist: Path) -> None:
    """A corrupt ownership record says: move it away, `kvprefetch fetch --repair` records the
    trees again. --repair then stopped at "pristine/sdist exists but kvprefetch did not create
    it". Now it records the pristine copy again once it is verified in full, and clean can
    remove everything once more."""
    wd = fetched_workdir
    data = json.loads((wd / OWNED).read_text())
    data["paths"]["../victim"] = {"kind": "build"}
    (wd / OWNED).write_text(json.dumps(data))
    refused(cli("clean", "--workdir", str(wd)), ConfigError.exit_code, "is corrupt",
            "move it away; `kvprefetch fetch --repair`")
    shutil.move(wd / OWNED, tmp_path / "owned-aside.json")
    res = cli("fetch", "--workdir", str(wd), "--source", str(vllm_sdist), "--repair")
    assert res.returncode == 0, res.stderr
    assert f"recorded {wd / 'pristine' / 'sdist'} again" in res.stderr
    res = cli("clean", "--workdir", str(wd), "--what", "all", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["kept"] == [] and str(wd / "pristine" / "sdist") in out["removed"], out
    # an edited pristine copy is not recorded again: it stays the user's, and is named
    res = cli("fetch", "--workdir", str(wd), "--source", str(vllm_sdist))
    assert res.returncode == 0, res.stderr
    (wd / OWNED).unlink()
    (wd / "pristine" / "sdist" / "setup.py").write_text("# edited\n")
    refused(cli("fetch", "--workdir", str(wd), "--source", str(vllm_sdist), "--repair"),
            FetchError.exit_code, f"{wd / 'pristine' / 'sdist'} exists but kvprefetch did not")


# ------------------------------------------- 5. every file the kit writes goes through confine

# the modules that write into a work directory, --out or a campaign folder (globs, so that a
# module moving between these packages stays scanned)
WRITERS = ["builds/*.py", "builds/modes/*.py", "machine/*.py", "overlay/*.py", "verify/*.py",
           "vmm/*.py", "cli/*.py", "cli/bench/*.py", "bench/*.py",
           "slurm/*.py", "sources/patching.py", "timings.py"]
RAW_WRITE = re.compile(r"\.write_(text|bytes)\(|json\.dump\(|\bopen\([^)]*[\"'][wx]b?[\"']")


def test_every_file_the_kit_writes_goes_through_confine(
        fetched_workdir: Path, tmp_path: Path, outside: Path) -> None:
    """write_text, open(..., "w") and tmp + os.replace wrote through a symlinked folder (an
    exported header, the verify report, an environment's marker, a narrowed source, the CUDA
    12 download); timings.json was read without a limit. Now each goes through
    confine.write_file / open_new / write_if_changed and read_limited."""
    import kvprefetch

    pkg = Path(kvprefetch.__file__).parent
    modules = sorted({p for g in WRITERS for p in pkg.glob(g)})
    assert len(modules) > 20 and pkg / "timings.py" in modules, modules
    raw = [f"{m.relative_to(pkg)}:{i}: {line.strip()}" for m in modules
           for i, line in enumerate(m.read_text().splitlines(), 1) if RAW_WRITE.search(line)]
    assert raw == [], raw
    # export-header -o into a symlinked folder: refused, nothing written behind the link
    linked = tmp_path / "linked"
    linked.symlink_to(outside, target_is_directory=True)
    before = tree_bytes(outside)
    res = cli("export-header", "--workdir", str(fetched_workdir), "-o",
              str(linked / "attention_kernels.cuh"))
    refused(res, PatchError.exit_code, f"refusing to write into {linked}: it is a symlink")
    # a narrowed kernels-only source into a symlinked build folder: refused the same way
    from kvprefetch.builds.library import write_if_changed
    from kvprefetch.errors import BuildError

    with pytest.raises(BuildError, match="is a symlink"):
        write_if_changed(linked / "paged_attention_v1.cu", "// narrowed\n")
    assert tree_bytes(outside) == before
    # a timings file nested too deep, or a FIFO: one ConfigError, no traceback, no hang
    from kvprefetch.timings import load_timings

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ConfigError, match="cannot read the timing file"):
        load_timings(deep)
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_timings(tmp_path / "fifo.json")
