"""Issue 41, the thirty-first hostile pass (tester c: adoption and repair, the kit's checkout,
forged builds, README blocks). Each test fails without its fix (checked by reverting ``src``
and running it):

- **verify-kernel ran a program a manifest named outside the environments.** Since the
  seventeenth pass the provenance probe asks ``verify.manifests.python_problem`` before it runs
  the interpreter a build manifest names, but the overlay checks (``overlay.verify
  .check_overlay``, for a manifest of mode ``overlay``) ran its ``env.python`` unchecked: a
  manifest naming ``/usr/bin/touch`` had verify-kernel run ``touch <kit>/probe/overlay.py``, a
  file of the kit's own checkout outside the work directory (``/bin/rm`` would have deleted
  it). Every probe of a manifest's environment now asks ``manifests.python_refused`` first.
- **build ended in a KeyError traceback** on a manifest that records the plan's key (printed by
  ``build --dry-run``) and no ``so_path``: ``builds.plan.manifest_matches`` called it up to
  date, and ``sequence.skip_if_up_to_date`` read the library it names. A manifest whose
  library fields are absent or not text is now corrupt: it matches nothing, the tree is built
  again.
- **A wrong-way message:** a manifest whose ``tree`` is no tree name (``../x``) had
  verify-kernel say "--tree '../x' is not a tree name / To fix: pick a name such as patched",
  though no ``--tree`` was given; it now names the manifest (``manifests.check_manifest``).
- **bench e2e ran a program a verify report named** (found by this pass, fixed by the lead):
  the environments' pythons of ``<workdir>/verify/report.json`` (or ``--verify-report``) were
  checked for their type only, and ``/tmp/x/evil`` in the report was run. Each must now be one
  of the work directory's own environments (``python_problem``); ``--env NAME=PYTHON`` is the
  user's own instruction, as before.

Nothing is mocked: the CLI runs for real on manifests written as a forger would; the build's
up-to-date check gets a plain namespace for its plan, as test_hostile_pass19_a's does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False)


def _builds(work: Path, **patched: object) -> None:
    """Kernels-only build manifests of baseline and patched (a library of a few bytes each);
    ``patched`` overrides fields of patched's."""
    for tree in ("baseline", "patched"):
        folder = work / "build" / tree / "k1"
        folder.mkdir(parents=True)
        (folder / f"kvprefetch_{tree}_C.so").write_bytes(b"\x7fELF forged")
        m = {"tree": tree, "variant": tree, "namespace": f"kvprefetch_{tree}",
             "so_path": f"kvprefetch_{tree}_C.so", "so_sha256": "00", "head_sizes": [128],
             "block_sizes": [16], "kv_dtypes": ["fp16"], "mode": "kernels-only"}
        if tree == "patched":
            m.update(patched)
        (folder / "manifest.json").write_text(json.dumps(m))


def test_verify_kernel_runs_no_overlay_interpreter_from_outside_the_envs(
        tmp_path: Path, outside: Path) -> None:
    work = tmp_path / "work"
    site = work / "envs" / "patched" / "lib" / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "kvprefetch_kernels").mkdir()
    # where the no-driver stub looks for vLLM's _C (any ELF shared library will do)
    shutil.copyfile(sys.executable if not Path("/lib/x86_64-linux-gnu/libz.so.1").exists()
                    else "/lib/x86_64-linux-gnu/libz.so.1", site / "vllm" / "_C.abi3.so")
    (site / "kvprefetch_kernels" / "k.so").write_bytes(b"\x7fELF forged")
    marker = tmp_path / "ran"
    program = tmp_path / "not-an-env-python"  # outside envs/: the kit must never run it
    program.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\n")
    program.chmod(0o755)
    _builds(work, mode="overlay", env={"python": str(program)},
            so_path=str(site / "kvprefetch_kernels" / "k.so"))
    res = _cli("verify-kernel", "--workdir", str(work), "--no-gpu")
    assert "Traceback" not in res.stderr, res.stderr
    assert not marker.exists(), f"verify-kernel ran {program}: {marker.read_text()}"
    assert "runs no program a record names outside its environments" in res.stdout + res.stderr


def test_build_calls_a_manifest_without_its_library_not_up_to_date(tmp_path: Path) -> None:
    from kvprefetch.builds.plan import manifest_matches
    from kvprefetch.builds.sequence import TreeOutcome, skip_if_up_to_date

    work = tmp_path / "work"
    tp = types.SimpleNamespace(
        tree="patched", key="k", build_dir=str(work / "build" / "patched" / "k"),
        env_path=str(work / "envs" / "patched"), source_tree=str(work / "trees" / "patched"))
    Path(tp.build_dir).mkdir(parents=True)
    for forged in ({"key": "k", "outputs": []},
                   {"key": "k", "outputs": [], "so_path": ["x"], "so_sha256": "00"},
                   {"key": "k", "outputs": [], "so_path": "x.so", "so_sha256": 5}):
        (Path(tp.build_dir) / "manifest.json").write_text(json.dumps(forged))
        assert manifest_matches(tp) is None, forged  # type: ignore[arg-type]
        assert not skip_if_up_to_date(tp, False, TreeOutcome("patched"))  # type: ignore[arg-type]
    # what every mode writes: up to date
    (Path(tp.build_dir) / "manifest.json").write_text(json.dumps(
        {"key": "k", "outputs": [], "so_path": "x.so", "so_sha256": "00"}))
    assert skip_if_up_to_date(tp, False, TreeOutcome("patched"))  # type: ignore[arg-type]


def test_verify_kernel_names_the_manifest_of_a_bad_tree_name(tmp_path: Path,
                                                            outside: Path) -> None:
    work = tmp_path / "work"
    _builds(work, tree="../x")
    res = _cli("verify-kernel", "--workdir", str(work), "--no-gpu")
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert "--tree" not in res.stderr and "manifest.json is corrupt" in res.stderr, res.stderr
    assert str(work / "build" / "patched" / "k1" / "manifest.json") in res.stderr


def test_bench_e2e_runs_no_python_a_verify_report_names_outside_the_envs(
        tmp_path: Path, outside: Path) -> None:
    """A verify report that passed, naming ``<tmp>/x/evil`` (a script that leaves a marker) as
    both environments' python: `bench e2e` ran it before any benchmark. It is refused now, and
    the marker never appears."""
    (tmp_path / "x").mkdir()
    evil = tmp_path / "x" / "evil"
    evil.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\nexit 1\n")
    evil.chmod(0o755)
    work = tmp_path / "work"
    (work / "verify").mkdir(parents=True)
    (work / "verify" / "report.json").write_text(json.dumps(
        {"passed": True, "envs": {"baseline": {"python": str(evil)},
                                  "patched": {"executable": str(evil)}}}))
    res = _cli("bench", "e2e", "--workdir", str(work), "--out", str(tmp_path / "out"))
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert "runs no program a record names outside its environments" in res.stderr, res.stderr
    assert not (tmp_path / "ran").exists(), "bench e2e ran the report's python"
