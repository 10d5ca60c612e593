"""Issue 41, the thirty-second hostile pass (tester a: every program the kit runs that a record
names). Each test fails without its fix (checked by reverting ``src`` and running it):

- **bench loaded a library a build manifest named outside the work directory.** The
  kernels-only manifests under ``build/*/*/`` (``kernels.ops.find_builds``) were checked for
  their fields' types, and their ``so_path`` (absolute, or ``../..`` from the manifest's
  folder) was loaded as it stood: a manifest naming ``/tmp/x/evil.so`` with its sha256 had
  ``bench kernel`` (and ``bench decode``, ``bench ncu``, ``vmm``, which find builds the same
  way) ``torch.ops.load_library`` it, running its constructors. The library must now be a
  file of the work directory (real paths: a link out of it is outside).
- **verify-kernel had nm load a library a manifest named, as a plugin.** The no-driver stub
  (``overlay.driverstub.ensure_stub``) ran ``nm -D --undefined-only <vllm/_C*.so>`` beside an
  overlay manifest's ``so_path``, as it stood and from the user's working folder: a relative
  ``so_path`` of ``--plugin=/x/a/b/c.so`` made it ``nm --plugin=/x/a/vllm/_C.abi3.so`` (with
  that relative folder in the working folder, the work directory here), and nm loaded that
  library from outside the work directory. nm now gets an absolute path and runs from ``/``.

Nothing is mocked: the CLI runs for real on manifests written as a forger would, and the
"evil" libraries are real shared objects (gcc) whose constructor leaves a marker."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False, cwd=cwd)


def _evil_library(folder: Path, marker: Path, name: str = "evil.so") -> Path:
    """A shared library whose constructor writes ``marker`` (it runs when anything loads it)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to make a shared library")
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "evil.c"
    src.write_text("#include <stdio.h>\n__attribute__((constructor)) static void f(void) {"
                   f" FILE *x = fopen({json.dumps(str(marker))}, \"w\");"
                   " if (x) { fputs(\"ran\\n\", x); fclose(x); } }\n")
    so = folder / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    src.unlink()
    return so


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "dotdot"])
def test_bench_kernel_loads_no_library_a_manifest_names_outside_the_work_dir(
        tmp_path: Path, outside: Path, relative: bool) -> None:
    pytest.importorskip("torch")
    marker = tmp_path / "ran"
    evil = _evil_library(tmp_path / "elsewhere", marker)
    work = tmp_path / "work"
    folder = work / "build" / "baseline" / "k1"
    folder.mkdir(parents=True)
    so_path = os.path.relpath(evil, folder) if relative else str(evil)
    (folder / "manifest.json").write_text(json.dumps({
        "tree": "baseline", "variant": "stock", "namespace": "kvprefetch_baseline",
        "so_path": so_path, "so_sha256": hashlib.sha256(evil.read_bytes()).hexdigest(),
        "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["auto"]}))
    res = _cli("bench", "kernel", "--workdir", str(work), "--out", str(work / "res"))
    assert "Traceback" not in res.stderr, res.stderr
    assert not marker.exists(), f"bench kernel loaded {evil}, which a manifest named"
    assert res.returncode != 0
    assert "outside the work directory" in res.stderr and "manifest.json is corrupt" in res.stderr


def test_verify_kernel_has_nm_load_no_plugin_a_manifest_names(tmp_path: Path,
                                                             outside: Path) -> None:
    from kvprefetch.overlay.driverstub import driver_loadable

    if driver_loadable():
        pytest.skip("an NVIDIA driver is loadable here: verify-kernel builds no driver stub")
    if shutil.which("nm") is None:
        pytest.skip("needs nm")
    marker = tmp_path / "ran"
    plugin_dir = tmp_path / "elsewhere" / "a"
    _evil_library(plugin_dir / "vllm", marker, "_C.abi3.so")
    work = tmp_path / "work"
    elf = "/lib/x86_64-linux-gnu/libz.so.1"
    elf = elf if Path(elf).exists() else sys.executable
    # what the glob beside the forged so_path finds, relative to the working folder (the work
    # directory, which the forger writes), and the file nm reads when it is given no file
    planted = Path(str(work / "--plugin=") + str(plugin_dir)) / "vllm"
    planted.mkdir(parents=True)
    shutil.copyfile(elf, planted / "_C.abi3.so")
    shutil.copyfile(elf, work / "a.out")
    for tree in ("baseline", "patched"):
        env = work / "envs" / tree
        (env / "bin").mkdir(parents=True)
        (env / "bin" / "python").write_text("#!/bin/sh\necho '{}'\n")  # the env's own code
        (env / "bin" / "python").chmod(0o755)
        folder = work / "build" / tree / "k1"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({
            "tree": tree, "variant": "stock" if tree == "baseline" else "prefetch",
            "namespace": f"kvprefetch_{tree}", "so_path": f"--plugin={plugin_dir}/b/c.so",
            "so_sha256": "00", "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["fp16"],
            "mode": "overlay", "env": {"path": str(env)}}))
    res = _cli("verify-kernel", "--workdir", str(work), "--no-gpu", cwd=work)
    assert "Traceback" not in res.stderr, res.stderr
    assert not marker.exists(), "nm loaded a plugin a build manifest named"


def test_a_build_folder_linked_to_a_larger_disk_is_still_the_work_directorys(
        tmp_path: Path) -> None:
    """``build/`` a link to a folder elsewhere (a user's larger disk, which the build builds
    through, docs/reliability.md's Limits): its libraries are found, not called outside the
    work directory (the lead's amendment of the fix above, which refused them)."""
    from kvprefetch.kernels.ops import find_builds

    disk = tmp_path / "big-disk" / "build"
    folder = disk / "baseline" / "k1"
    folder.mkdir(parents=True)
    so = folder / "lib.so"
    so.write_bytes(b"\x7fELF not loaded here")
    work = tmp_path / "work"
    work.mkdir()
    (work / "build").symlink_to(disk)
    (folder / "manifest.json").write_text(json.dumps({
        "tree": "baseline", "variant": "stock", "namespace": "kvprefetch_baseline",
        "so_path": str(work / "build" / "baseline" / "k1" / "lib.so"),
        "so_sha256": hashlib.sha256(so.read_bytes()).hexdigest(),
        "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["auto"]}))
    assert [b.tree for b in find_builds(work)] == ["baseline"]
