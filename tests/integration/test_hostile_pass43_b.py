"""Issue 41, the forty-third hostile pass (tester b: the forty-second pass's new code as an
attacker). Each test fails without its fix (checked by reverting ``src`` and running it):

- **A kept clone's refs read by GitPython's ``dereference_recursive``.** The work directory's
  ``pristine/git/.git`` is data. A ref that is a FIFO blocked a plain ``fetch`` for ever; a
  ``packed-refs`` of a kind GitPython does not know raised a TypeError blamed on the git
  module ("repair or reinstall it"); a ``packed-refs`` linked to a FIFO outside the work
  directory was opened through the link (and blocked); ``pristine`` linked to a folder
  outside had that folder's clone's HEAD read and taken. The refs are now read by the kit
  (``sources/gitpython.head``, ``confine.read_file`` from the work directory down: no link,
  FIFO or device, a size limit).
- **A default ACL above a new work directory.** ``setfacl -m d:u:nobody:rwx`` on the folder
  above (its access ACL giving nobody no write) passed pass 42's ACL rule, and every folder
  ``fetch`` made took nobody's rwx (``foreign._refuse_foreign_above`` reads the default ACL of
  the deepest existing folder too)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from kvprefetch import upstream
from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _planted_clone(work: Path) -> Path:
    """``pristine/git`` as a clone the ownership record lists, HEAD naming refs/heads/main;
    returns its ``.git``."""
    clone = work / "pristine" / "git"
    (clone / "csrc" / "attention").mkdir(parents=True)
    shutil.copy(work / "pristine" / "sdist" / upstream.ATTENTION_HEADER,
                clone / upstream.ATTENTION_HEADER)
    subprocess.run(["git", "-C", str(clone), "init", "-q"], check=True, capture_output=True)
    (clone / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    record = work / ".kvprefetch-owned.json"
    owned = json.loads(record.read_text())
    owned["paths"]["pristine/git"] = {"kind": "pristine", "digest": "0" * 64}
    record.write_text(json.dumps(owned))
    return clone / ".git"


def test_a_fifo_ref_does_not_block_fetch(fetched_workdir: Path) -> None:
    git_dir = _planted_clone(fetched_workdir)
    os.mkfifo(git_dir / "refs" / "heads" / "main")
    res = cli("fetch", "--workdir", str(fetched_workdir), timeout=60)
    refused(res, 3, "cannot be read", "not a regular file")


def test_packed_refs_of_an_unknown_kind_is_named_as_the_clone(fetched_workdir: Path) -> None:
    git_dir = _planted_clone(fetched_workdir)
    (git_dir / "packed-refs").write_text("# pack-refs with: sorted\n")
    res = cli("fetch", "--workdir", str(fetched_workdir), timeout=60)
    refused(res, 3, "the HEAD of the clone", "refs/heads/main does not exist")
    assert "TypeError" not in res.stderr and "reinstall" not in res.stderr, res.stderr


def test_packed_refs_linked_outside_is_not_followed(fetched_workdir: Path,
                                                    outside: Path) -> None:
    git_dir = _planted_clone(fetched_workdir)
    fifo = outside.parent / "their-fifo"
    os.mkfifo(fifo)
    (git_dir / "packed-refs").symlink_to(fifo)
    res = cli("fetch", "--workdir", str(fetched_workdir), timeout=60)
    refused(res, 3, "cannot be read", "is a symlink")


def test_pristine_linked_outside_is_not_read_through(fetched_workdir: Path,
                                                    tmp_path: Path) -> None:
    """``pristine`` swapped for a link to a folder outside holding a clone at the tag: fetch
    read that clone's HEAD through the link and went on ("unchanged")."""
    git_dir = _planted_clone(fetched_workdir)
    (git_dir / "HEAD").write_text(upstream.GIT_COMMIT_PREFIX.ljust(40, "0") + "\n")
    elsewhere = tmp_path / "elsewhere"
    (fetched_workdir / "pristine").rename(elsewhere)
    (fetched_workdir / "pristine").symlink_to(elsewhere)
    res = cli("fetch", "--workdir", str(fetched_workdir), timeout=60)
    refused(res, 3, "cannot be read", "is a symlink")


def test_a_kept_clone_at_the_tag_still_reads(fetched_workdir: Path) -> None:
    git_dir = _planted_clone(fetched_workdir)
    commit = upstream.GIT_COMMIT_PREFIX.ljust(40, "0")
    (git_dir / "packed-refs").write_text(f"# pack-refs with: peeled fully-peeled sorted\n"
                                         f"{commit} refs/heads/main\n")
    res = cli("fetch", "--workdir", str(fetched_workdir), timeout=120)
    assert res.returncode == 0, res.stderr
    assert commit in res.stdout, res.stdout


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A POSIX ACL xattr (version 2): (tag, perm, id) entries, in the kernel's order."""
    import struct

    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_a_default_acl_above_a_new_workdir_is_refused(tmp_path: Path,
                                                       vllm_sdist: Path) -> None:
    """``setfacl -m u:nobody:x -m d:u:nobody:rwx`` on the folder above: its access ACL gives
    nobody no write, so the rule of pass 42 passed it, but every folder ``fetch`` made below
    took nobody's rwx as its own ACL (the umask is not applied under a default ACL)."""
    import pytest

    above = tmp_path / "shared"
    above.mkdir()
    undef, nobody = 0xFFFFFFFF, 65534
    try:
        os.setxattr(above, "system.posix_acl_access",
                    _acl((1, 7, undef), (2, 1, nobody), (4, 5, undef), (0x10, 5, undef),
                         (0x20, 5, undef)))
        os.setxattr(above, "system.posix_acl_default",
                    _acl((1, 7, undef), (2, 7, nobody), (4, 5, undef), (0x10, 7, undef),
                         (0x20, 5, undef)))
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs here: {exc}")
    # the session's sdist (conftest's vllm_sdist: $KVPREFETCH_TEST_CACHE where set, else
    # downloaded once); CI sets no cache, and os.environ's KeyError failed it there
    res = cli("fetch", "--workdir", str(above / "w"), "--source", str(vllm_sdist), timeout=120)
    refused(res, 2, "default ACL lets another user write")
    assert not (above / "w").exists()
