"""Issue 41, the thirty-third hostile pass (tester a: the issue's six classes replayed by a
careless user, on the commands later passes touched least). Each test fails without its fix
(checked by reverting ``src`` and running it):

- **apply of another variant to a patched tree sent the user the wrong way.** ``apply
  --variant launch --tree patched`` on a tree the kit had patched with ``prefetch`` said "To
  fix: restore it with `kvprefetch fetch --force`, then `kvprefetch apply --variant launch`";
  but ``fetch --force`` replaces only an *edited* tree, so it answered "patched unchanged" and
  the same apply was refused again, forever (and the second command, without ``--tree``, names
  another tree). The message now gives the commands that do make the tree again, and they are
  run here as the user would.
- **a tree without its state record sent apply's user round in a circle.** With
  ``state/patched.json`` gone (a half-deleted work directory), ``apply`` said "there is no
  kvprefetch tree named 'patched' ... To fix: run `kvprefetch fetch` first", and ``fetch``
  refused the tree as "not made by kvprefetch" with "local modifications", though the kit had
  made it (its ownership record lists it) and ``fetch --repair`` records it again. Both now
  name the missing record and ``fetch --repair``.

Nothing is mocked: the CLI runs for real on a work directory fetched from the real sdist."""

from __future__ import annotations

from pathlib import Path

from tests.integration.helpers import kvprefetch_cli_split
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _fix_commands(stderr: str) -> list[str]:
    """The commands of the message's first way to fix (before any "(or ...)")."""
    fix = next(line for line in stderr.splitlines() if line.startswith("To fix:"))
    return [part.split("`", 1)[0] for part in fix.split(" (or ")[0].split("`kvprefetch ")[1:]]


def test_applying_another_variant_to_a_patched_tree_names_commands_that_work(
        fetched_workdir: Path) -> None:
    wd = str(fetched_workdir)
    assert kvprefetch_cli_split("apply", "--workdir", wd).returncode == 0
    res = kvprefetch_cli_split("apply", "--workdir", wd, "--variant", "launch",
                               "--tree", "patched")
    assert res.returncode == 4, res.stderr
    assert "carries the prefetch variant" in res.stderr
    commands = _fix_commands(res.stderr)
    # the first way the message gives, run as written and in order, ends in the patched tree
    # carrying the launch variant (was: `fetch --force` said "unchanged", and the apply it
    # named then looked for a tree 'launch')
    assert commands, res.stderr
    for cmd in commands:
        args = cmd.split() + ["--workdir", wd] + (["--source", "sdist"]
                                                  if cmd.startswith("fetch") else [])
        done = kvprefetch_cli_split(*args)
        assert done.returncode == 0, (cmd, done.stdout, done.stderr)
    assert "patched: applied launch" in done.stdout


def _run_fix(stderr: str, wd: str) -> str:
    out = ""
    for cmd in _fix_commands(stderr):
        args = cmd.split() + ["--workdir", wd] + (["--source", "sdist"]
                                                  if cmd.startswith("fetch") else [])
        done = kvprefetch_cli_split(*args)
        assert done.returncode == 0, (cmd, done.stdout, done.stderr)
        out += done.stdout + done.stderr
    return out


def test_a_tree_without_its_state_record_is_named_so_and_repair_is_offered(
        fetched_workdir: Path) -> None:
    wd = str(fetched_workdir)
    (fetched_workdir / "state" / "patched.json").unlink()
    res = kvprefetch_cli_split("apply", "--workdir", wd)
    assert res.returncode == 4, res.stderr
    assert "has no state record" in res.stderr, res.stderr
    _run_fix(res.stderr, wd)  # was: `fetch`, refused ("local modifications ... --force")
    assert (fetched_workdir / "state" / "patched.json").is_file()
    done = kvprefetch_cli_split("apply", "--workdir", wd)
    assert done.returncode == 0, done.stderr
    (fetched_workdir / "state" / "patched.json").unlink()
    res = kvprefetch_cli_split("fetch", "--workdir", wd, "--source", "sdist")
    assert res.returncode == 4, res.stderr
    assert "not made by kvprefetch" not in res.stderr
    assert "has no state record (`kvprefetch fetch --repair` records it again)" in res.stderr
