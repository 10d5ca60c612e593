"""Issue 41, the twenty-fifth hostile pass (tester c: every command, option, input and
environment value, here the environment the kit's children inherit, odd working folders and
clock games). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``doctor`` (and ``build``'s preflight, which runs the same checks) compiled its prefetch
  probe with nvcc in the caller's working folder. nvcc writes what it names relatively into
  its current folder, and ``NVCC_APPEND_FLAGS=-keep`` (a user's, left from debugging PTX) had
  ``doctor --workdir W`` write the probe's intermediates (``probe.cpp1.ii``, ``probe.cubin``,
  ``probe.cudafe1.cpp``, ... 3.5 MB) into the folder the user ran it from, outside W; run from
  inside W, nvcc wrote them there by path, through any link planted at those names. nvcc and
  cuobjdump now run in the probe's private folder (``doctor/tools.check_compile``).
- A wrong-way message: a stale ``NVCC_APPEND_FLAGS`` or ``NVCC_PREPEND_FLAGS`` that nvcc
  refuses (``--bogus-flag``: "nvcc fatal : Unknown option") failed ``doctor``'s compile probe
  with "To fix: use a CUDA toolkit >= 12.8 whose nvcc supports every --arch you pass"; another
  toolkit fails the same way. The fix now names the variable and its value first.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass24_c import _env


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("from_inside", [False, True], ids=["caller-folder", "work-dir"])
def test_doctor_keeps_nvcc_keep_files_out_of_the_callers_folder(
        tmp_path: Path, from_inside: bool) -> None:
    import json

    work = tmp_path / "w"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.cubin"
    victim.write_bytes(b"user data\n")
    cwd = tmp_path / "caller"
    cwd.mkdir()
    if from_inside:  # run from the work directory, with a link planted at a name nvcc writes
        cwd = work
        (work / "probe.cubin").symlink_to(victim)
    before = sorted(os.listdir(cwd))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "doctor", "--mode",
                          "kernels-only", "--workdir", str(work), "--json"],
                         env=_env(tmp_path, NVCC_APPEND_FLAGS="-keep"), cwd=cwd,
                         capture_output=True, text=True, errors="replace", timeout=300,
                         check=False)
    check = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "nvcc-compile")
    assert check["status"] in ("ok", "warn"), check
    # without the fix: probe.cpp1.ii, probe.cubin, probe.cudafe1.cpp, ... in the caller's
    # folder, and the victim overwritten with nvcc's cubin through the link
    assert sorted(os.listdir(cwd)) == before
    assert victim.read_bytes() == b"user data\n", hashlib.sha256(victim.read_bytes()).hexdigest()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("var", ["NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS"])
def test_doctor_names_nvcc_flags_from_the_environment_when_the_probe_fails(
        tmp_path: Path, var: str) -> None:
    import json

    res = subprocess.run([sys.executable, "-m", "kvprefetch", "doctor", "--mode",
                          "kernels-only", "--workdir", str(tmp_path / "w"), "--json"],
                         env=_env(tmp_path, **{var: "--bogus-flag"}), cwd=tmp_path,
                         capture_output=True, text=True, errors="replace", timeout=300,
                         check=False)
    check = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "nvcc-compile")
    assert check["status"] == "fail" and "--bogus-flag" in check["detail"], check
    # without the fix: "use a CUDA toolkit >= 12.8 whose nvcc supports every --arch you pass"
    assert check["fix"].startswith(f"nvcc adds {var}='--bogus-flag' to every command"), check
