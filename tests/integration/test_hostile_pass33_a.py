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
