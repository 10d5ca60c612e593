"""The folders the CUDA driver and torch write by path once a command starts CUDA
(``machine/gpu_folders``): the driver's just-in-time cache (``CUDA_CACHE_PATH``, else
``~/.nv/ComputeCache``) and torch's kernel cache (``PYTORCH_KERNEL_CACHE_PATH``, else
``$XDG_CACHE_HOME/torch/kernels`` or ``~/.cache/torch/kernels``). Issue 41: the forty-first
hostile pass left them unchecked; another user's link there would have the caches written in
the folder the link chose, as matplotlib's font cache was.

This machine has no GPU, so the CUDA driver cannot be made to write here. ``bench ncu`` is the
command whose GPU work runs in a child, and it runs through the real CLI with a stand-in for
Nsight Compute (none here) that does what the driver does under a profiled program: it makes
``$CUDA_CACHE_PATH`` and writes a file in it, read from the folder the child runs in (``/``).
That stand-in is the one thing mocked. The rules of the list itself are checked directly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

NOBODY = 65534
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _caching_ncu(tmp_path: Path) -> Path:
    """A stand-in for ncu: it records the folder its child's driver would cache in (from the
    folder it runs in, as the driver reads a relative one), makes that folder and writes a
    file there, as the driver does when it compiles PTX; then it writes its CSV where
    ``--log-file`` says, as pass 33 c's stand-in does."""
    ncu = tmp_path / "bin" / "cachingncu"
    ncu.parent.mkdir(parents=True, exist_ok=True)
    ncu.write_text(
        "#!/bin/bash\n"
        'while [ $# -gt 0 ]; do [ "$1" = --log-file ] && f=$2; shift; done\n'
        f'realpath -m "$CUDA_CACHE_PATH" > {tmp_path}/cache-seen\n'
        'case "$CUDA_CACHE_PATH" in /*) mkdir -p "$CUDA_CACHE_PATH" && '
        'echo jit > "$CUDA_CACHE_PATH/index";; esac\n'
        "printf '%s\\n' '\"ID\",\"Process ID\",\"Kernel Name\",\"gpu__time_duration.sum\"' "
        "'\"\",\"\",\"\",\"ns\"' '\"0\",\"1\",\"paged_attention_v1_kernel\",\"1000\"' > \"$f\"\n")
    ncu.chmod(0o755)
    return ncu


def _bench_ncu(tmp_path: Path, cache: str) -> subprocess.CompletedProcess[str]:
    from tests.integration.test_hostile_pass10_r import _published_workdir

    wd = _published_workdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPREFETCH")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.update(PYTHONPATH=SRC, TMPDIR=str(tmp_path / "tmp"), CUDA_CACHE_PATH=cache)
    return subprocess.run([sys.executable, "-m", "kvprefetch", "bench", "ncu", "--workdir",
                           str(wd), "--ncu", str(_caching_ncu(tmp_path)), "--shape", "1x1k",
                           "--formats", "json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link another user owns")
def test_a_gpu_cache_through_another_users_link_is_refused(tmp_path: Path,
                                                           outside: Path) -> None:
    """``CUDA_CACHE_PATH=/tmp/theirs/cache``, ``nobody``'s link to a folder of the user's:
    without the check the profiled child's driver made its cache in the folder the link chose
    (``outside/patched/index``); now ``bench ncu`` is refused before ncu runs."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    (shared / "cache").symlink_to(outside / "patched")
    os.lchown(shared / "cache", NOBODY, NOBODY)
    res = _bench_ncu(tmp_path, str(shared / "cache"))
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    assert not (outside / "patched" / "index").exists(), text  # the fixture checks it too
    assert res.returncode == 2, text
    assert "the GPU's cache folder" in text and "CUDA_CACHE_PATH=" in text, text
    assert "belongs to nobody" in text and "To fix: set CUDA_CACHE_PATH" in text, text
    assert not (tmp_path / "cache-seen").exists(), "ncu ran"


def test_a_relative_gpu_cache_is_made_where_the_user_is(tmp_path: Path) -> None:
    """``CUDA_CACHE_PATH=jitcache`` from the user's folder: the profiled child runs in ``/``,
    where its driver would have made ``/jitcache``; the kit names it absolute from the user's
    folder, for its own process and every child."""
    res = _bench_ncu(tmp_path, "jitcache")
    text = res.stdout + res.stderr
    assert res.returncode == 0, text
    assert (tmp_path / "cache-seen").read_text().strip() == str(tmp_path / "jitcache"), text
    assert (tmp_path / "jitcache" / "index").is_file(), text


def test_the_gpu_folders_follow_the_driver_and_torch(tmp_path: Path) -> None:
    """Which folders are named, by which variable, and the switches that turn each cache off."""
    from kvprefetch.machine.gpu_folders import gpu_folders

    home = str(tmp_path / "home")
    assert gpu_folders({"HOME": home}) == [
        ("HOME", Path(home, ".nv", "ComputeCache")),
        ("HOME", Path(home, ".cache", "torch", "kernels"))]
    assert gpu_folders({"HOME": home, "CUDA_CACHE_PATH": "/c", "XDG_CACHE_HOME": "/x"}) == [
        ("CUDA_CACHE_PATH", Path("/c")), ("XDG_CACHE_HOME", Path("/x/torch/kernels"))]
    assert gpu_folders({"HOME": home, "PYTORCH_KERNEL_CACHE_PATH": "/k",
                        "XDG_CACHE_HOME": "/x"})[1] == ("PYTORCH_KERNEL_CACHE_PATH", Path("/k"))
    assert gpu_folders({"HOME": home, "CUDA_CACHE_DISABLE": "1",
                        "USE_PYTORCH_KERNEL_CACHE": "0"}) == []


def test_bench_e2e_checks_the_gpu_folders_of_vllm(tmp_path: Path) -> None:
    """vLLM's process starts CUDA too: ``bench e2e``'s list holds the driver's and torch's
    caches, absolute ones only (a relative one lies in the run's own folder)."""
    from kvprefetch.bench.e2e_folders import vllm_folders

    folders = vllm_folders({"HOME": str(tmp_path), "CUDA_CACHE_PATH": "/c",
                            "PYTORCH_KERNEL_CACHE_PATH": "rel"})
    assert ("CUDA_CACHE_PATH", Path("/c")) in folders
    assert all(folder.is_absolute() for _, folder in folders)
