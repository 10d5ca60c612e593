"""Issue 41, the twenty-ninth hostile pass, tester a (the work directory's commands and git:
pass 28's git fixes attacked, forged build manifests, swaps during ``fetch --only``). Each
test fails without its fix (checked by reverting ``src`` and running it):

- **A wrong-way message**: verify-kernel on a machine without an NVIDIA driver builds a
  no-device ``libcuda.so.1`` from the driver imports of the overlay environment's
  ``vllm/_C*.so``, found two folders above a build manifest's ``so_path``. A manifest naming a
  folder where that file is a FIFO, empty or not ELF stopped with "cannot read the imports of
  ...: /To fix: install binutils (nm)", with nm installed (a missing nm is runner's own "not
  found on the PATH"). It now names the file and what it is, and says to rebuild the overlay
  environment or move its build folder out of build/ (``overlay.driverstub.ensure_stub``).
- **A wrong-way message**: ``fetch --source DIR`` of a repository another user owns: git
  refuses it ("detected dubious ownership", ``safe.directory``) and the kit said "check the URL
  and the network", which neither fixes. It now says the repository is another user's and to
  add it to ``safe.directory`` as git's message names it, if trusted
  (``sources.gitpython.clone_fix``).
- **A wrong-way message**: a git configuration git cannot read (a ``~/.gitconfig`` line it
  cannot parse, a ``GIT_CONFIG_COUNT`` without its ``GIT_CONFIG_KEY_0``, a
  ``GIT_CONFIG_GLOBAL`` naming a folder) made ``fetch --source DIR`` say "install git or put
  its folder on PATH" (GitPython's ``git version`` at import failed) or "check the URL and the
  network" (the clone failed). Both now say git cannot read its configuration, which its
  message names (``sources.gitpython._config_broken``).
- **Not outside, a record lost** (found under a swap loop): ``fetch --only patched --force``
  while ``trees/`` was swapped for a link to a folder outside (5 runs, 3 of them) failed as
  it should ("a folder on the way became a symlink"), but ``ownership.temporary`` then
  forgot its temporary though it could not remove it behind the link: ``trees/.patched.tmp-PID``
  stayed, and ``clean --what all --discard-edits`` kept it as "not created by kvprefetch". It
  now stays recorded, as a killed run's is, for the next fetch or clean to remove.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvprefetch.errors import VerifyError
from kvprefetch.overlay.driverstub import ensure_stub
from tests.integration.test_hostile_pass20_a import _env


@pytest.mark.parametrize("kind", ["fifo", "empty", "not-elf"])
def test_a_driver_stub_from_a_file_that_is_no_library_is_not_told_to_install_binutils(
        tmp_path: Path, kind: str) -> None:
    site = tmp_path / "site" / "vllm"
    site.mkdir(parents=True)
    lib = site / "_C.abi3.so"
    if kind == "fifo":
        os.mkfifo(lib)
    else:
        lib.write_bytes(b"" if kind == "empty" else b"not an ELF file\n")
    wd = tmp_path / "work"
    wd.mkdir()
    with pytest.raises(VerifyError) as caught:
        ensure_stub(lib, wd / "verify" / "driver-stub", root=wd)
    err = caught.value
    assert "binutils" not in err.fix and "kvprefetch build --mode overlay" in err.fix, err
    assert str(lib) in err.cause, err
    if kind == "fifo":
        assert "FIFO" in err.cause, err
    assert not (wd / "verify").exists()


def _tagged_repo(repo: Path) -> Path:
    repo.mkdir()
    (repo / "f").write_text("x\n")
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    for args in (["init", "-q"], ["add", "f"], ["commit", "-qm", "x"], ["tag", "v0.10.2"]):
        subprocess.run([*git, *args], check=True, capture_output=True,
                       env={k: v for k, v in os.environ.items() if not k.startswith("GIT_")})
    return repo


def _fetch(tmp_path: Path, repo: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--source", str(repo),
                           "--workdir", str(tmp_path / "work")], env={**_env(tmp_path), **env},
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_repository_another_user_owns_is_named_as_such(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the repository to another user")
    repo = _tagged_repo(tmp_path / "repo")
    for dirpath, dirnames, filenames in os.walk(repo):
        for name in [*dirnames, *filenames, "."]:
            os.chown(os.path.join(dirpath, name), 4321, 4321, follow_symlinks=False)
    res = _fetch(tmp_path, repo)
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    assert "dubious ownership" in res.stderr, res.stderr
    fix = res.stderr.split("To fix:", 1)[1]
    assert "safe.directory" in fix and "network" not in fix, res.stderr


@pytest.mark.parametrize("env", [
    {"GIT_CONFIG_GLOBAL": "bad.cfg"},  # git version (GitPython's import) fails: "install git"
    {"GIT_CONFIG_COUNT": "1"},         # the clone fails: "check the URL and the network"
    {"GIT_CONFIG_GLOBAL": "."},        # a folder
], ids=["bad-line", "count-without-key", "folder"])
def test_a_git_configuration_git_cannot_read_is_named_as_such(
        tmp_path: Path, env: dict[str, str]) -> None:
    repo = _tagged_repo(tmp_path / "repo")
    (tmp_path / "bad.cfg").write_text("[core\n")
    env = {k: str(tmp_path / v) if k == "GIT_CONFIG_GLOBAL" else v for k, v in env.items()}
    res = _fetch(tmp_path, repo, **env)
    assert res.returncode in (2, 3) and "Traceback" not in res.stderr, res.stderr
    fix = res.stderr.split("To fix:", 1)[1]
    assert "configuration" in fix and "install git" not in fix and "network" not in fix, \
        res.stderr
    assert not (tmp_path / "work" / "pristine").exists()


def test_a_temporary_behind_a_swapped_link_stays_recorded_as_the_kits(tmp_path: Path) -> None:
    """The race of ``fetch --only patched --force`` under a loop swapping ``trees/`` for a link,
    made deterministic: the temporary is made, ``trees/`` becomes a link as the copy fails, so
    the kit cannot remove it. It used to forget it anyway, and ``clean`` then kept
    ``trees/.patched.tmp-PID`` for good as "not created by kvprefetch"."""
    from kvprefetch.errors import FetchError
    from kvprefetch.workspace import ownership
    from kvprefetch.workspace.workdir import Workdir

    wd = tmp_path / "work"
    Workdir(wd).ensure()
    (wd / "trees").mkdir()
    (tmp_path / "outside").mkdir()
    tmp = wd / "trees" / f".patched.tmp-{os.getpid()}"
    def copy_that_meets_the_swap() -> None:
        with ownership.temporary(wd, tmp, family=FetchError):
            (tmp / "f").parent.mkdir()
            (wd / "trees").rename(wd / "real-trees")  # the swap loop's move ...
            (wd / "trees").symlink_to(tmp_path / "outside")
            raise FetchError("a folder on the way became a symlink", "rerun")

    with pytest.raises(FetchError):
        copy_that_meets_the_swap()
    assert list((tmp_path / "outside").iterdir()) == []
    (wd / "trees").unlink()
    (wd / "real-trees").rename(wd / "trees")  # ... and its move back
    assert tmp.is_dir()
    assert ownership.owned(wd, tmp) is not None, "the kit's temporary was forgotten"
