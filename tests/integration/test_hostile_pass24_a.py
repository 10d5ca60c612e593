"""Issue 41, the twenty-fourth hostile pass, tester a (the work directory's commands). Each
test fails without its fix (checked by reverting ``src`` and running it):

- **Python children imported from the caller's folder** (``runner.NEUTRAL_CWD``). ``python -c``
  and ``python -m`` put their working folder first on ``sys.path``, and the kit started several
  Pythons in its own working folder, which is the user's: with the installed ``kvprefetch``
  command run in the work directory (``--workdir .``), a ``json/`` and a ``sysconfig/`` planted
  there by whoever writes the work directory ran in the kit's *own* interpreter (outside the
  work directory) when ``build --kernels-only`` probed it before making an environment, and a
  ``pip/`` ran when ``fetch`` asked pip for its index (no sdist in ``downloads/``) (2 of 2 by
  hand, each planted module writing a file outside). The same held for ``python -m venv`` and
  ``ensurepip`` (an environment's creation), an environment's own probe, ``verify-kernel``'s
  disassembly worker and identity pass (``python -m kvprefetch.verify.facts`` /
  ``.numerics``: a planted ``kvprefetch/`` package ran in their place) and ``bench ncu``'s
  target. Each now runs in ``/`` (or in its private folder), its paths absolute.
- **uv's cache written outside through a ``uv.toml`` in the work directory** (the same rule).
  uv reads ``uv.toml`` from its working folder: one planted in the work directory naming a
  ``cache-dir`` outside had ``uv venv`` (an environment of ``--env-backend uv``) create and
  fill uv's cache there (1 of 1 by hand with the real uv; ``uv pip install`` does the same).
  The overlay build's ``uv pip install`` steps and doctor's ``uv cache dir`` now run in ``/``
  too (those two are not in a test: the install downloads vLLM and torch, gigabytes).
- **Wrong-way messages on files and folders this user may not read** (``oserrors.describe``,
  ``confine._open_folder``; as a user who is not root, or root without ``CAP_DAC_OVERRIDE``).
  A tree file of mode 0222 or 0000 made ``apply``, ``fetch`` and ``clean --discard-edits`` say
  "README.md: Permission denied / To fix: make trees/patched writable for this user": the
  folder was writable, the file was not readable, and the rerun failed the same way. A folder
  of mode 0000 in a tree made ``clean --what trees --discard-edits`` say "benchmarks:
  Permission denied / To fix: make . writable" (the descriptor walk's bare name), naming
  neither the folder nor what to change; ``apply``, ``fetch`` and ``fetch --repair`` listed its
  files as deleted ("carries an unknown modification: D benchmarks/README.md, ...") and sent
  the user to move the tree to backup/ (``hashing.walk`` skipped a folder it could not list;
  the inventories now raise). Now each names the file or folder and ``chmod u+r``
  / ``u+rx``. The tests drop root's ``CAP_DAC_OVERRIDE`` and ``CAP_DAC_READ_SEARCH``
  (``setpriv --bounding-set``), as a user's run has neither.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.test_hostile_pass20_a import _env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes

_SRC = Path(__file__).resolve().parents[2] / "src"

_PLANT = "import os\nopen({marker!r}, 'w').write('ran')\n"

_DRIVER = """
import sys
sys.path.insert(0, {src!r})
from pathlib import Path
from kvprefetch.machine.envs import VenvEnv, _base_python_info
from kvprefetch.sources.download import configured_index_url
from kvprefetch.verify.kernel import _identity_run, _Library, _library_facts

env = {{k: v for k, v in __import__('os').environ.items() if k != 'PIP_INDEX_URL'}}
failed = []
for step in (lambda: configured_index_url(env), lambda: _base_python_info(sys.executable),
             lambda: VenvEnv({venv!r}, with_pip=True).create(),
             lambda: _library_facts(_Library({lib!r}, '0' * 64), Path({cache!r}),
                                    {{'cuobjdump': None}}),
             lambda: _identity_run(Path({work!r}), ['baseline'], None)):
    try:  # each step on its own: one planted module's failure hides none of the others
        step()
    except Exception as exc:
        failed.append(repr(exc)[:300])
print('driver done', failed)
"""


def test_no_python_the_kit_starts_imports_from_the_callers_folder(tmp_path: Path) -> None:
    work = tmp_path / "work"   # the caller's folder: a work directory run as `--workdir .`
    work.mkdir()
    planted = ("json", "sysconfig", "pip", "venv", "ensurepip", "kvprefetch")
    for name in planted:
        (work / name).mkdir()
        for f in ("__init__.py", "__main__.py"):
            (work / name / f).write_text(_PLANT.format(marker=str(tmp_path / f"ran-{name}")))
    (work / "kvprefetch" / "verify").mkdir()
    (work / "kvprefetch" / "verify" / "__init__.py").write_text("")
    for mod in ("facts", "numerics"):
        (work / "kvprefetch" / "verify" / f"{mod}.py").write_text(
            _PLANT.format(marker=str(tmp_path / f"ran-kvprefetch.verify.{mod}")))
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"not a library")
    driver = tmp_path / "driver" / "drive.py"   # run by path: its folder, not work/, on sys.path
    driver.parent.mkdir()
    driver.write_text(_DRIVER.format(src=str(_SRC), venv=str(tmp_path / "env"), lib=str(lib),
                                     cache=str(tmp_path / "cache" / "facts"),
                                     work=str(work)))
    env = _env(tmp_path)
    env.pop("PYTHONPATH", None)
    res = subprocess.run([sys.executable, str(driver)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    ran = sorted(p.name for p in tmp_path.glob("ran-*"))
    assert ran == [], f"planted modules ran: {ran}\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
    assert res.returncode == 0 and "driver done []" in res.stdout, res.stdout + res.stderr
    assert (tmp_path / "env" / "bin" / "pip").exists()  # ensurepip really ran


def test_a_relative_program_path_still_runs_when_the_child_runs_in_the_neutral_folder(
        tmp_path: Path) -> None:
    """The runner resolves a relative program path (``bin/tool``) from the caller's folder,
    now that Python children run in a neutral folder (``/``, and since the twenty-seventh pass a
    new empty folder of their own)."""
    from kvprefetch.runner import NEUTRAL_CWD, run

    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "tool"
    tool.write_text("#!/bin/sh\npwd\n")
    tool.chmod(0o755)
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        res = run(["bin/tool"], cwd=NEUTRAL_CWD, echo=False)
    finally:
        os.chdir(here)
    assert "kvprefetch-cwd-" in Path(res.output.strip()).name  # not the caller's, nor /


def test_a_uv_environment_never_reads_a_uv_toml_in_the_callers_folder(tmp_path: Path,
                                                                       outside: Path) -> None:
    """uv reads ``uv.toml`` from its working folder: one planted in the work directory (the
    kit run as ``--workdir .``) naming a ``cache-dir`` outside had ``uv venv`` (``build
    --env-backend uv``) write uv's cache there (1 of 1 by hand, with the real uv)."""
    from kvprefetch.overlay.install import find_uv

    uv = find_uv()
    if uv is None:
        import pytest
        pytest.skip("uv is not installed")
    work = tmp_path / "work"
    work.mkdir()
    victim = outside / "uv-cache"
    (work / "uv.toml").write_text(f'cache-dir = "{victim}"\n')
    driver = tmp_path / "driver" / "drive.py"
    driver.parent.mkdir()
    driver.write_text(
        f"import sys\nsys.path.insert(0, {str(_SRC)!r})\n"
        "from kvprefetch.machine.envs import UvEnv\n"
        f"UvEnv({str(tmp_path / 'env')!r}, python=sys.executable, uv={uv!r}).create()\n"
        "print('driver done')\n")
    env = _env(tmp_path)
    env.pop("PYTHONPATH", None)
    env["UV_OFFLINE"] = "1"
    res = subprocess.run([sys.executable, str(driver)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert not victim.exists(), "uv wrote its cache where the work directory's uv.toml said"
    assert res.returncode == 0 and "driver done" in res.stdout, res.stdout + res.stderr


def _as_user(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The kit run by root without the capabilities that read past a file's mode bits, as a
    user who is not root runs it."""
    import shutil

    import pytest

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE")
    return subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                           sys.executable, "-m", "kvprefetch", *args], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300, check=False)


def test_an_unreadable_tree_file_is_named_with_chmod_u_r_not_its_folder_writable(
        fetched_workdir: Path, tmp_path: Path) -> None:
    wd = fetched_workdir
    readme = wd / "trees" / "patched" / "README.md"
    readme.chmod(0o222)
    for args in (("apply",), ("clean", "--what", "trees", "--discard-edits")):
        res = _as_user(tmp_path, *args, "--workdir", str(wd))
        assert "Traceback" not in res.stderr, res.stderr
        assert res.returncode != 0, res.stdout + res.stderr
        assert f"make the file {readme} readable" in res.stderr, res.stderr
        assert "writable" not in res.stderr, res.stderr
    readme.chmod(0o644)
    res = _as_user(tmp_path, "apply", "--workdir", str(wd))
    assert res.returncode == 0, res.stdout + res.stderr


def test_an_unreadable_tree_folder_is_named_whole_by_apply_and_clean(fetched_workdir: Path,
                                                           tmp_path: Path) -> None:
    wd = fetched_workdir
    folder = wd / "trees" / "patched" / "benchmarks"
    folder.chmod(0)
    res = _as_user(tmp_path, "apply", "--workdir", str(wd))  # not "D benchmarks/...: edited"
    assert "Traceback" not in res.stderr, res.stderr
    assert f"make the folder {folder} readable and searchable" in res.stderr, res.stderr
    res = _as_user(tmp_path, "clean", "--what", "trees", "--discard-edits", "--workdir",
                   str(wd))
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode != 0
    assert f"make the folder {folder} readable and searchable" in res.stderr, res.stderr
    folder.chmod(0o755)
    res = _as_user(tmp_path, "clean", "--what", "trees", "--discard-edits", "--workdir",
                   str(wd))
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (wd / "trees" / "patched").exists()
