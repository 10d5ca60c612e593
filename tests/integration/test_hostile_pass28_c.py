"""Issue 41, the twenty-eighth hostile pass (tester c: the process around every command: resource
limits, the system temp folder, file systems, the environment). Each test fails without its fix
(checked by reverting ``src`` and running it):

- **A user's ``GIT_WORK_TREE`` had ``fetch`` check vLLM out into that folder.** GitPython hands
  git the kit's whole environment: ``GIT_WORK_TREE=$HOME`` (a dotfiles setup's) with ``fetch
  --source DIR`` wrote the clone's 3,436 files into it, outside the work directory, over the
  user's files of the same names (exit 3, "the module git raised ValueError"), and a
  ``GIT_INDEX_FILE`` had git write its index there (exit 0); a ``GIT_OBJECT_DIRECTORY`` failed
  the clone as "check the URL and the network". Now the names that say where a repository, its
  work tree, index and objects are leave ``os.environ`` while GitPython runs
  (``sources/gitpython.py``, ``repo_env_cleared``; 1 run of 1 each).
- **A record read under ``ulimit -v`` was a MemoryError traceback.** ``reading.read_limited``
  read ``limit + 1`` bytes at once, and Python sets aside the whole 64 MiB for a record of a
  few hundred bytes: ``clean``, ``apply``, ``fetch``, ``diff-upstream``, ``build --dry-run``
  all ended in a traceback under ``ulimit -v 90000`` (and anything lower that lets Python
  start). Now it reads in 1 MiB pieces.
- **A limit a child met sent the user to the wrong fix.** Under ``ulimit -f 300`` doctor's
  probe (cc1plus killed by SIGXFSZ, "File size limit exceeded") said "use a CUDA toolkit >=
  12.8", under ``ulimit -v`` ("catastrophic error: out of memory") the same, under ``ulimit -s
  96`` (nvcc's "Segmentation fault") the same, and under ``ulimit -v 200000`` the build's torch
  probe ("libtorch_cpu.so: failed to map segment") said "install a CUDA build of torch" where
  torch is installed. Now ``oserrors.child_limit_fix`` names the limit and how to raise it.
- **A full system temp folder was named as ``t``.** ``diff-upstream --check`` with a ``TMPDIR``
  of one free inode said "t: No space left on device / To fix: ... `df -h .` ... or write to a
  larger one (the --workdir ...)": ``confine.ensure_dir`` made each folder relative to its
  parent's descriptor, and the error named the last part only, which the scratch check could
  not place. Now it names the whole folder, and the fix is the system temp folder's.

Nothing is mocked: the limits are real ``setrlimit`` calls in the child, the full temp folder a
real tmpfs (skipped where no tmpfs can be mounted), the git variables real."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvprefetch.machine.toolchain import find_nvcc
from kvprefetch.runner import run
from tests.integration.helpers import tree_bytes
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["PYTHONPATH"] = SRC
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env.setdefault("TMPDIR", str(tmp))
    env.update(extra)
    return env


def _kv(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
        limits: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args],
                          env=env or _env(tmp_path), capture_output=True, text=True,
                          timeout=300, check=False, preexec_fn=limits, cwd=_cwd(tmp_path))


def _cwd(tmp_path: Path) -> Path:
    """An empty folder of the test's to start in (``/`` may hold another test's planted
    ``json/``, which ``python -c`` would import)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return cwd


def _limit(which: int, value: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(which, (value, resource.getrlimit(which)[1]))
    return apply


# ------------------------------------------------------------------------------ git's variables


def test_the_users_git_work_tree_and_index_never_receive_the_clone(
        tmp_path: Path, vllm_git_repo: tuple[Path, str], outside: Path) -> None:
    repo, sha = vllm_git_repo
    for name, value in (("GIT_WORK_TREE", outside / "home"),
                        ("GIT_INDEX_FILE", outside / "index"),
                        ("GIT_OBJECT_DIRECTORY", outside / "objects")):
        wd = tmp_path / f"work-{name}"
        res = _kv(tmp_path, "fetch", "--workdir", str(wd), "--source", str(repo),
                  "--allow-commit", sha, env=_env(tmp_path, **{name: str(value)}))
        assert "Traceback" not in res.stderr, res.stderr
        assert not value.exists(), f"{name}: git wrote {value}"
        assert res.returncode == 0, f"{name}: {res.stderr[-1500:]}"
        assert (wd / "trees" / "patched" / "setup.py").is_file()


# ------------------------------------------------------------------------------- ulimit -v


def test_a_record_is_read_under_a_tight_address_space_limit(
        tmp_path: Path, fetched_workdir: Path) -> None:
    """The command's modules imported first, then the limit set 40 MiB above what the process
    maps: a command that reads its records in small pieces fits; one that sets 64 MiB aside
    for each does not."""
    code = (
        "import resource, sys\n"
        "import kvprefetch.cli as c, kvprefetch.cli.build, kvprefetch.workspace.cleaning\n"
        "size = next(int(l.split()[1]) for l in open('/proc/self/status') "
        "if l.startswith('VmSize:')) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + (40 << 20), resource.RLIM_INFINITY))\n"
        "sys.argv = ['kvprefetch', *sys.argv[1:]]\n"
        "c.run()\n")
    for args in (("clean", "--dry-run"), ("apply",)):
        res = subprocess.run([sys.executable, "-c", code, *args, "--workdir",
                              str(fetched_workdir)], env=_env(tmp_path), capture_output=True,
                             text=True, timeout=300, check=False, cwd=_cwd(tmp_path))
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
        assert "MemoryError" not in res.stderr, res.stderr[-3000:]
        assert res.returncode == 0, res.stderr[-1500:]


# ------------------------------------------------------------------ a child meets a limit

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this machine")


@needs_nvcc
@pytest.mark.parametrize(("rlimit", "value", "says"), [
    (resource.RLIMIT_FSIZE, 300 << 10, "ulimit -f"),
    (resource.RLIMIT_AS, 90_000 << 10, "ulimit -v"),
    (resource.RLIMIT_STACK, 96 << 10, "ulimit -s"),
], ids=["fsize", "as", "stack"])
def test_doctors_probe_under_a_limit_names_the_limit(
        tmp_path: Path, fetched_workdir: Path, rlimit: int, value: int, says: str) -> None:
    res = _kv(tmp_path, "doctor", "--workdir", str(fetched_workdir), "--kernels-only",
              "--json", limits=_limit(rlimit, value))
    assert "Traceback" not in res.stderr, res.stderr
    import json

    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    probe = checks["nvcc-compile"]
    assert probe["status"] == "fail", probe
    assert says in probe["fix"], probe
    assert "CUDA toolkit" not in probe["fix"], probe


def test_the_torch_probe_under_ulimit_v_names_the_limit(
        tmp_path: Path, fetched_workdir: Path) -> None:
    pytest.importorskip("torch")
    wd = fetched_workdir
    applied = _kv(tmp_path, "apply", "--workdir", str(wd))
    assert applied.returncode == 0, applied.stderr
    res = _kv(tmp_path, "build", "--workdir", str(wd), "--kernels-only", "--dry-run",
              "--torch-from", sys.executable, limits=_limit(resource.RLIMIT_AS, 200_000 << 10))
    assert "Traceback" not in res.stderr, res.stderr
    if "cannot import torch" not in res.stderr:
        pytest.skip("torch imported under 200 MB here: " + res.stderr[-300:])
    assert "ulimit -v" in res.stderr, res.stderr
    assert "install a CUDA build of torch" not in res.stderr, res.stderr


# ------------------------------------------------------------------ a full system temp folder


@pytest.fixture
def one_inode_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with one free inode: Python's temp folder check (a file made and removed)
    passes, the kit's scratch folder takes the inode, and nothing fits in it."""
    mnt = tmp_path / "full-tmp"
    mnt.mkdir()
    res = run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=3", "tmpfs", str(mnt)],
              echo=False, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.output.strip()}")
    try:
        (mnt / "taken").write_text("")
        yield mnt
    finally:
        run(["umount", "-l", str(mnt)], echo=False, check=False)


def test_a_full_system_temp_folder_is_named_whole(
        tmp_path: Path, fetched_workdir: Path, one_inode_tmpfs: Path) -> None:
    wd = fetched_workdir
    applied = _kv(tmp_path, "apply", "--workdir", str(wd))  # --check then copies the patched files
    assert applied.returncode == 0, applied.stderr
    before = tree_bytes(wd)
    res = _kv(tmp_path, "diff-upstream", "--workdir", str(wd), "--check",
              env=_env(tmp_path, TMPDIR=str(one_inode_tmpfs)))
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode != 0, res.stderr
    error = res.stderr[res.stderr.index("error:"):]
    assert "No space left on device" in error, error
    assert str(one_inode_tmpfs) in error.splitlines()[0], error
    assert "system temp folder" in error and "--workdir" not in error, error
    assert tree_bytes(wd) == before
