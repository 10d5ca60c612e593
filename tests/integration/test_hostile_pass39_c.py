"""Issue 41, the thirty-ninth hostile pass (tester c): records fuzzed through the real CLI, and
the environment as input.

- ``TMPDIR`` through another user's link: the kit makes its private folders (doctor's probe,
  apply's ``git apply``, the compilers' temporaries) in the system temp folder, and its
  children write there by path. ``TMPDIR=/tmp/shared/tmp`` through ``nobody``'s link to a
  folder of the user's had doctor's nvcc, gcc and as write in the folder nobody chose, a link
  nobody could re-point while they ran: held to the rule every other path to write in follows
  (``foreign.refuse_foreign_temp``), in ``runner.check_child_tmpdir`` (its ``TEMP_CHECK``)
  and ``ownership.private_dir``.
- ``KVPREFETCH_WORKDIR`` (``--workdir``'s variable) naming a FIFO, a path through a file or
  another user's link was reported as ``Invalid value for '--workdir'`` / "correct the command
  line", or ``--workdir X: ...``, to a user whose command line holds no ``--workdir``: the
  message now names the variable, and its fix (set or unset it) works.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli_split
from tests.integration.test_reliability import _env, cli, outside, refused

NOBODY = 65534
__all__ = ["outside"]  # the fixture: nothing outside may change


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link another user owns")
def test_a_tmpdir_through_another_users_link_is_refused(tmp_path: Path, outside: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    (shared / "tmp").symlink_to(outside)
    os.lchown(shared / "tmp", NOBODY, NOBODY)
    env = _env() | {"TMPDIR": str(shared / "tmp")}
    res = kvprefetch_cli_split("doctor", "--workdir", str(tmp_path / "wd"), env=env,
                               timeout=300)
    refused(res, 2, "TMPDIR=", "is a symlink that belongs to nobody", "realpath")
    assert not any(p.name.startswith("kvprefetch-") for p in outside.iterdir())
    # the user's own link is still the user's choice
    own = tmp_path / "own"
    (tmp_path / "mytmp").mkdir()
    own.symlink_to(tmp_path / "mytmp")
    res = kvprefetch_cli_split("doctor", "--workdir", str(tmp_path / "wd"),
                               env=_env() | {"TMPDIR": str(own)}, timeout=300)
    assert "belongs to" not in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_kvprefetch_workdir_is_named_when_it_is_wrong(tmp_path: Path, outside: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for value in (str(fifo), str(outside / "notes.txt" / "wd")):
        res = kvprefetch_cli_split("clean", "--dry-run",
                                   env=_env() | {"KVPREFETCH_WORKDIR": value})
        refused(res, 2, f"KVPREFETCH_WORKDIR={value!r}", "set KVPREFETCH_WORKDIR")
        assert "correct the command line" not in res.stderr, res.stderr
        # the fix works: the variable unset (or --workdir given), the command runs
        wd = tmp_path / "wd"
        res = kvprefetch_cli_split("clean", "--dry-run", "--workdir", str(wd),
                                   env=_env() | {"KVPREFETCH_WORKDIR": value})
        assert "KVPREFETCH_WORKDIR" not in res.stderr and "Traceback" not in res.stderr
    # typed on the command line, the message still names the option
    refused(cli("clean", "--dry-run", "--workdir", str(fifo)), 2, "--workdir", "command line")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link another user owns")
def test_kvprefetch_workdir_through_another_users_link_names_the_variable(
        tmp_path: Path, outside: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "wd").symlink_to(outside)
    os.lchown(shared / "wd", NOBODY, NOBODY)
    res = kvprefetch_cli_split("fetch", "--dry-run",
                               env=_env() | {"KVPREFETCH_WORKDIR": str(shared / "wd")})
    refused(res, 2, "KVPREFETCH_WORKDIR", "is a symlink that belongs to nobody")
    assert "--workdir" not in res.stderr.split("To fix:")[0], res.stderr
