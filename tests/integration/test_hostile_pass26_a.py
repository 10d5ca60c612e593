"""Issue 41, the twenty-sixth hostile pass, tester a (the work directory's commands: pass 25's
own fixes attacked, the kit started inside the work directory). Each test fails without its fix
(checked by reverting ``src`` and running it):

- **A program planted in the work directory ran when the kit was started there with a
  relative ``PATH`` entry** (``runner.which``, ``runner.run``, ``sources.fetch._gitpython``).
  The seventh pass made ``runner.which`` look a relative entry (``.``, empty, ``bin``) up from
  the kit's own folder; the twenty-fourth made every child start in ``/`` because the kit's
  folder is often the work directory (``cd W && kvprefetch ... --workdir .``). Together: with a
  careless trailing ``:`` (``PATH=$PATH:$UNSET``), ``doctor --workdir .`` ran a
  ``nvidia-smi`` and a ``cuobjdump`` planted in ``W`` (the host has none), 2 of 2 by hand;
  with a leading one (``PATH=:$PATH``), ``fetch --source git`` ran a planted ``git``: five
  times, GitPython's own ``git version`` at import (before pass 25's refresh) and the clone.
  Relative entries are now left out, of the look-up and of each child's ``PATH`` (the job
  side has left them out since the seventeenth pass), and GitPython's import is given the
  absolute ``git``; the kit's own PATH loses them at start-up too (``runner.
  leave_out_relative_path``), for what runs in its process: the build manifest's
  ``platform.platform()`` ran a planted ``uname -p``.
- **A module planted in the work directory was imported by ``cd W && python -m kvprefetch``**
  (``__main__``): ``-m`` puts the working folder first on ``sys.path``; a ``click.py`` there ran
  (then a traceback). The entry is dropped before the command line is imported.
- **A traceback**: a ``click.py`` on PYTHONPATH that has no ``Group`` ("AttributeError: module
  'click' has no attribute 'Group'", raised on the kit's own line, so pass 10's rule for a
  module raising on import did not see it); the module an AttributeError or ImportError names
  is now the one at fault (``errors.third_party_origin``).
- **A hang**: ``fetch --source DIR`` (or ``--repo-url file://DIR``) of a clone whose
  ``.git/HEAD``, ``.git/config`` or ``.git/packed-refs`` is a FIFO, or a link to one:
  ``git clone`` waited for ever (the kit's own FIFO check walks the source's files, not its git
  folder). The git folder is now walked first (``sources.fetch._check_local_repo``).
- **A wrong-way message**: ``GIT_PYTHON_GIT_EXECUTABLE`` naming no git (``/bin/false``) was
  "the module git raised ImportError / To fix: repair or reinstall it"; a missing one now
  names the variable, not PATH (``sources.fetch._gitpython``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.test_hostile_pass20_a import _env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes


def _kv(tmp_path: Path, *args: str, env: dict[str, str],
        cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def _plant(folder: Path, marker: Path, *names: str) -> None:
    for name in names:
        prog = folder / name
        prog.write_text(f"#!/bin/sh\necho \"{name} $*\" >> {marker}\n")
        prog.chmod(0o755)


def test_a_program_planted_where_the_kit_starts_never_runs(tmp_path: Path) -> None:
    wd = tmp_path / "work"  # the kit started inside its work directory: `--workdir .`
    wd.mkdir()
    marker = tmp_path / "planted-ran"
    _plant(wd, marker, "git", "nvidia-smi", "cuobjdump", "ssh")
    repo = tmp_path / "repo"  # a local repository without the tag: the clone is refused
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    env = _env(tmp_path)
    absolute = os.pathsep.join(e for e in env["PATH"].split(os.pathsep) if os.path.isabs(e))
    for path, args in ((":" + absolute, ("fetch", "--source", "git", "--repo-url", str(repo))),
                       (absolute + ":", ("doctor",))):
        adopt = ("--adopt",) if args[0] == "fetch" else ()
        res = _kv(tmp_path, *args, *adopt, "--workdir", ".", env=dict(env, PATH=path), cwd=wd)
        assert "Traceback" not in res.stderr, res.stderr
        assert not marker.exists(), f"{args}: ran {marker.read_text()!r}"


def test_a_git_python_executable_that_is_no_git_is_named(tmp_path: Path) -> None:
    """``GIT_PYTHON_GIT_EXECUTABLE=/bin/false``: "the module git raised ImportError / To fix:
    repair or reinstall it" sent the user to reinstall GitPython."""
    env = dict(_env(tmp_path), GIT_PYTHON_GIT_EXECUTABLE="/bin/false")
    res = _kv(tmp_path, "fetch", "--source", "git", "--workdir", str(tmp_path / "work"),
              env=env, cwd=tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert "GIT_PYTHON_GIT_EXECUTABLE='/bin/false'" in res.stderr, res.stderr
    assert "reinstall" not in res.stderr and "To fix: point GIT_PYTHON_GIT_EXECUTABLE" in \
        res.stderr, res.stderr


def test_what_the_kit_runs_in_its_own_process_finds_no_program_in_its_folder(
        tmp_path: Path) -> None:
    """A kernels-only build's manifest records ``platform.platform()``, which runs ``uname
    -p`` by its bare name on this process's own PATH: with ``cd W`` and ``PATH=:$PATH`` a
    ``uname`` planted in the work directory ran. The build is minutes of nvcc, so this starts
    the kit's command line as ``kvprefetch`` does (``cli.run``, its start-up included) and then
    makes the manifest's call in the same process."""
    wd = tmp_path / "work"
    wd.mkdir()
    marker = tmp_path / "planted-ran"
    _plant(wd, marker, "uname")
    code = ("import platform, sys\nfrom kvprefetch import cli\nsys.argv = ['kvprefetch', "
            "'--help']\ntry:\n    cli.run()\nexcept SystemExit:\n    pass\n"
            "print(platform.platform())\n")
    env = dict(_env(tmp_path), PATH=":" + os.environ["PATH"])
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=wd, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0 and "Linux" in res.stdout, res.stdout + res.stderr
    assert not marker.exists(), marker.read_text()


def test_python_m_kvprefetch_in_the_work_directory_imports_nothing_from_it(
        tmp_path: Path) -> None:
    """``cd W && python -m kvprefetch ...``: ``-m`` puts the working folder first on
    ``sys.path``, and a ``click.py`` planted there ran at the command line's import (then an
    AttributeError traceback)."""
    wd = tmp_path / "work"
    wd.mkdir()
    marker = tmp_path / "planted-ran"
    for name in ("click", "git", "rich"):
        (wd / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name}')\n")
    res = _kv(tmp_path, "--help", env=_env(tmp_path), cwd=wd)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert not marker.exists(), marker.read_text()


def test_a_module_on_pythonpath_without_what_the_kit_uses_is_one_message(
        tmp_path: Path) -> None:
    """A ``click.py`` on PYTHONPATH that imports fine but has no ``Group``: "AttributeError:
    module 'click' has no attribute 'Group'", a traceback (pass 10 made one that raises on
    import a message)."""
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "click.py").write_text("pass\n")
    env = _env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(planted)
    res = _kv(tmp_path, "--help", env=env, cwd=tmp_path)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode != 0 and f"click ({planted / 'click.py'})" in res.stderr, res.stderr
    assert "To fix" in res.stderr


def test_a_fifo_in_a_local_repository_is_named_not_waited_on(tmp_path: Path) -> None:
    """``fetch --source DIR`` (or ``--repo-url file://DIR``) of a clone whose ``.git/HEAD`` or
    ``.git/config`` is a FIFO, or a link to one: ``git clone`` waited on it for ever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for n, (name, how) in enumerate((("HEAD", "path"), ("config", "url"),
                                     ("packed-refs", "link"))):
        repo = tmp_path / f"repo{n}"
        (repo / ".git" / "refs").mkdir(parents=True)
        if how == "link":
            (repo / ".git" / name).symlink_to(fifo)
        else:
            os.mkfifo(repo / ".git" / name)
        args = (("--source", str(repo)) if how != "url"
                else ("--source", "git", "--repo-url", f"file://{repo}"))
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", *args, "--workdir",
                              str(tmp_path / f"work{n}")], env=_env(tmp_path),
                             capture_output=True, text=True, timeout=30, check=False)
        assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
        assert f"{repo / '.git' / name}, which is a FIFO" in res.stderr, res.stderr
