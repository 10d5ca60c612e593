"""Issue 41, the twenty-third hostile pass, tester a (the work directory's commands). Each
test fails without its fix (checked by reverting ``src`` and running it):

- **Bits kept from a file in the work directory** (``confine.safe_bits``). The kit keeps a
  file's permission bits where it rewrites one (``open_new``'s ``exact=True``: an apply's
  rollback from its stage, the library installed from a build folder, a build's outputs
  copied back, a user's ``-o`` file), and kept them whole: set-user-ID, set-group-ID, sticky
  and world-write too, which ``fchmod`` takes as given (the umask, world-write added, does not
  apply to it). A stage ``trees/.patched.apply/`` planted by whoever writes the work
  directory, with a journal and an ``old/`` copy of mode 6777, had the next ``fetch``'s
  recovery write that copy into the tree as a set-user-ID, set-group-ID, world-writable
  program owned by the user who ran the kit (as root here: a set-user-ID root program of the
  writer's choosing, a way out of the work directory; 1 run of 1 by hand). The threat model
  says the kit makes nothing world-writable. ``copy_tree`` did the same: a file of
  ``pristine/`` set to mode 6777 (its content still the pinned one) came into a new tree
  (``fetch --only extra``) set-user-ID and world-writable. Now every file ``open_new`` writes
  and ``copy_tree`` copies drops those bits.
- **A vLLM planted in bench e2e's output folder was imported** (``bench/e2e.py``,
  ``PYTHON_ISOLATED``). ``bench e2e`` checks that each environment imports vllm with
  ``python -c`` in ``<out>/e2e`` and runs ``python -m vllm.entrypoints.cli.main`` in
  ``<out>/e2e/runs``; both put that folder first on ``sys.path``, and ``--out`` is
  ``<workdir>/bench`` by default. A ``vllm/__init__.py`` planted there (by whoever writes the
  work directory) ran in place of the environment's vLLM, with ``--env`` pythons of the user's
  outside the work directory too, and passed the import check (1 run by hand, with a
  verify report saying passed: no GPU here). Now the environments' pythons run with ``-I``
  (isolated: no working folder on ``sys.path``): the check says the environment cannot import
  vllm.
- **clean on an overlayfs work directory** (``confine.rename_path``; a message). clean renames
  each folder aside before it removes it; an overlayfs (a container image's layer, mounted
  without ``redirect_dir``) refuses to rename a folder of its lower layer with EXDEV, and clean
  said "Invalid cross-device link / To fix: the two paths are on different mounts ...: unmount
  the one in the way (`umount PATH`)": there is no such mount, and every clean failed the same
  way (1 run by hand). Now the error names the file system and says to remove the folder by
  hand or keep the work directory on a volume.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass20_a import _env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes

HEADER = "csrc/attention/attention_kernels.cuh"


def _kv(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_rollback_never_writes_a_set_user_id_or_world_writable_file(
        fetched_workdir: Path, tmp_path: Path) -> None:
    wd = fetched_workdir
    target = wd / "trees" / "patched" / HEADER
    stage = wd / "trees" / ".patched.apply"
    planted = b"#!/bin/sh\necho the writer's program\n"
    old = stage / "old" / HEADER
    old.parent.mkdir(parents=True)
    old.write_bytes(planted)
    os.chmod(old, 0o6777)
    (stage / "journal.json").write_text(json.dumps({
        "tree": "patched", "state": {"not": "the record"},
        "files": [{"rel": HEADER, "before": _sha(planted),
                   "after": _sha(target.read_bytes())}]}))
    res = _kv(tmp_path, "fetch", "--workdir", str(wd))
    assert "Traceback" not in res.stderr, res.stderr
    assert target.read_bytes() == planted  # rolled back (then refused as an edit)
    assert not stage.exists()
    mode = stat.S_IMODE(target.lstat().st_mode)
    assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH), oct(mode)


def test_a_tree_copied_from_pristine_is_never_set_user_id_or_world_writable(
        fetched_workdir: Path, tmp_path: Path, vllm_sdist: Path) -> None:
    wd = fetched_workdir
    src = wd / "pristine" / "sdist" / "setup.py"
    data = src.read_bytes()  # pristine/ is hard-linked to the session's template: a copy
    src.unlink()
    src.write_bytes(data)
    os.chmod(src, 0o6777)
    res = _kv(tmp_path, "fetch", "--source", str(vllm_sdist), "--only", "extra",
              "--workdir", str(wd))
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 0, res.stderr
    mode = stat.S_IMODE((wd / "trees" / "extra" / "setup.py").lstat().st_mode)
    assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH), oct(mode)


def test_bench_e2e_never_imports_a_vllm_planted_in_its_output_folder(
        fetched_workdir: Path, tmp_path: Path) -> None:
    wd = fetched_workdir
    (wd / "verify").mkdir()
    py = sys.executable  # an environment of the user's, outside the work directory, no vLLM
    (wd / "verify" / "report.json").write_text(json.dumps(
        {"passed": True, "envs": {"baseline": {"python": py}, "patched": {"python": py}}}))
    marker = tmp_path / "ran"
    out = wd / "bench"  # the default --out: in the work directory
    for folder in (out / "e2e", out / "e2e" / "runs"):  # the check's cwd, the runs'
        (folder / "vllm").mkdir(parents=True)
        (folder / "vllm" / "__init__.py").write_text(
            f"open({str(marker)!r}, 'a').write('planted vllm imported\\n')\n"
            "__version__ = '0.10.2'\n")
    res = _kv(tmp_path, "bench", "e2e", "--workdir", str(wd), "--env", f"baseline={py}",
              "--env", f"patched={py}", "--max-num-seqs", "8", "--repeats", "1")
    assert "Traceback" not in res.stderr, res.stderr
    assert not marker.exists(), marker.read_text()
    assert res.returncode != 0 and "cannot import vllm" in res.stderr, res.stderr


def test_clean_on_an_overlayfs_names_the_file_system_not_a_mount_in_the_way(
        fetched_workdir: Path, tmp_path: Path) -> None:
    layers = {n: tmp_path / n for n in ("upper", "ovwork", "merged")}
    for d in layers.values():
        d.mkdir()
    options = (f"lowerdir={fetched_workdir},upperdir={layers['upper']},"
               f"workdir={layers['ovwork']},redirect_dir=off")
    res = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options,
                          str(layers["merged"])], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount an overlayfs here (needs root): {res.stderr.strip()}")
    try:
        wd = layers["merged"]  # a work directory in a container image's layer
        res = _kv(tmp_path, "clean", "--what", "all", "--discard-edits", "--workdir", str(wd))
        assert "Traceback" not in res.stderr, res.stderr
        assert res.returncode == 2 and "overlayfs" in res.stderr \
            and "rm -rf" in res.stderr and "umount" not in res.stderr, res.stderr
    finally:
        subprocess.run(["umount", str(layers["merged"])], check=False)
