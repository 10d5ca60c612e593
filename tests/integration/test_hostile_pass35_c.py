"""Issue 41, the thirty-fifth hostile pass (tester c: a type-confusion fuzz of every record the
kit reads back, against every command that reads it). Each test fails without its fix (checked
by reverting ``src`` and running it):

- **verify-kernel after ``clean --what envs`` sent the user to check a path the kit made.**
  ``clean --what envs`` removes the environments and keeps ``build/`` (its build manifests);
  verify-kernel then ran the interpreter a manifest names, which is gone, and the OSError ended
  the command: "verify-kernel failed: <workdir>/envs/baseline/bin/python: No such file or
  directory / To fix: check the path and its file system, then rerun" -- no report, and a fix
  that fixes nothing (the path is the kit's own; the environment must be rebuilt). Now
  the probe (``verify.kernel._probe_tree``) asks ``verify.manifests.python_gone`` first, which
  names a missing interpreter as a gone environment, with `kvprefetch build` as the fix; the
  probe is not run and the report is written. (An overlay tree already said "rerun `kvprefetch
  build --mode overlay`" before its probe.)
- **A build manifest with ``"env": null`` or ``"env": {"path": null}`` was a traceback in
  verify-kernel.** ``check_manifest`` allows a null (older manifests lack fields), but
  ``check_provenance`` read ``manifest.get("env", {}).get("path", "")``: ``None.get``
  (AttributeError), and a null ``path`` reached ``os.path.realpath(None)`` (TypeError). Now
  ``verify.manifests.manifest_env``/``manifest_env_path`` read them as "no environment named",
  and the report says the interpreter is not inside it.

Nothing is mocked: the real CLI in a child process. The build manifests are written by hand
(as `build --kernels-only` writes them, with a placeholder library), as pass 31 c's tests do: a
real build takes minutes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass31_c import _cli
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

def _builds(work: Path, **patched: object) -> None:
    """Kernels-only build manifests of baseline and patched as `build --kernels-only` writes
    them (a library of a few bytes each), each naming its environment envs/<tree>;
    ``patched`` overrides fields of patched's."""
    for tree in ("baseline", "patched"):
        folder = work / "build" / tree / "k1"
        folder.mkdir(parents=True)
        (folder / f"kvprefetch_{tree}_C.so").write_bytes(b"\x7fELF forged")
        env = work / "envs" / tree
        m = {"tree": tree, "variant": tree, "namespace": f"kvprefetch_{tree}",
             "so_path": f"kvprefetch_{tree}_C.so", "so_sha256": "00", "head_sizes": [128],
             "block_sizes": [16], "kv_dtypes": ["fp16"], "mode": "kernels-only", "key": "k1",
             "env": {"backend": "venv", "path": str(env), "python": str(env / "bin" / "python")}}
        if tree == "patched":
            m.update(patched)
        (folder / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("env", [None, {"path": None}], ids=["env-null", "env-path-null"])
def test_verify_kernel_reads_a_manifest_with_a_null_env_as_no_environment(
        tmp_path: Path, env: object) -> None:
    work = tmp_path / "work"
    for tree in ("baseline", "patched"):
        python = work / "envs" / tree / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.symlink_to(sys.executable)  # a venv's link to its base interpreter
    if isinstance(env, dict):
        env = {**env, "python": str(python)}
    _builds(work, env=env)
    res = _cli("verify-kernel", "--workdir", str(work), "--no-gpu")
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out
    assert res.returncode == 6, out  # verification failed, the report written
    assert (work / "verify" / "report.json").is_file(), out


def test_verify_kernel_after_clean_envs_says_the_environment_is_gone(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "envs").mkdir(parents=True)  # what `clean --what envs` leaves: no environment
    _builds(work)
    res = _cli("verify-kernel", "--workdir", str(work), "--no-gpu")
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out
    assert "check the path and its file system" not in out, out
    assert "the environment of tree 'baseline' is gone" in out, out
    assert "rebuild the tree with `kvprefetch build`" in out, out
    assert (work / "verify" / "report.json").is_file(), out
