"""Issue 41, the thirty-sixth hostile pass (tester b: files the kit reads back that no fuzz had
covered, and the environment of the programs it runs). Each test fails without its fix
(checked by reverting ``src`` and running it):

- **An ncu CSV with a field past the csv module's limit was a traceback.** ``bench ncu`` reads
  the CSV Nsight Compute wrote, and a cell longer than 131,072 characters (a kernel name, a
  metric) made Python's ``csv`` raise ``_csv.Error: field larger than field limit``, which is
  no ValueError: ``bench.ncu._launches`` named the other malformed shapes only. It is now one
  BenchError naming the CSV, as a short row is.
- **A SHA256SUMS in ``--deps-dir`` listing an archive by a path sent the user the wrong way.**
  ``cutlass-/../../../x/pwn.tar.gz`` passed ``sources.deps.find_archives`` (it starts with
  ``cutlass-`` and ends with ``.tar.gz``): ``build --mode full --dry-run`` planned
  ``VLLM_CUTLASS_SRC_DIR`` outside the work directory without a word, and the real build's
  unpack refused it as a corrupt record of the work directory with "`kvprefetch fetch --repair`
  rebuilds the work directory's records", which mends no SHA256SUMS. A listed name with a
  folder in it is now a ConfigError naming SHA256SUMS, dry run and build alike.
- **git's protocol policy in the environment was blamed on the URL and the network.** With
  ``GIT_PROTOCOL_FROM_USER=0`` (or ``GIT_ALLOW_PROTOCOL`` without ``file``, or
  ``protocol.file.allow=never`` through ``GIT_CONFIG_*``), ``fetch --source DIR`` of a local
  clone failed with git's "transport 'file' not allowed" and "To fix: check the URL and the
  network", which neither fixes. ``sources.gitpython.clone_fix`` now names the policy and the
  variables, and unsetting them (what it says) works.
- **A verify cache entry whose GQA twin held ``{}`` or a list was a traceback.** The cache
  (``<workdir>/verify/cache/<sha256>.json``) is data in the work directory, and its digest is
  recomputed by whoever edits it; ``verify.facts`` checked the types of every fact but a
  twin's template arguments, so ``verify-kernel`` ended in ``KeyError: 'staged'`` (an empty
  object) or ``TypeError: unhashable type: 'list'`` (a list for ``kv_cache``) in its twin
  check. A twin's fields are now typed as a kernel's are: such an entry is a miss,
  recomputed and rewritten. Run on the session's real kernels-only build (``kernels_build``);
  the pass showed it failing without the fix on a narrowed real build of its own.

Nothing else is mocked: the CLI runs for real on folders made here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass31_b import _env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=180,
                          check=False)


def _ncu_writing(tmp_path: Path, name: str) -> Path:
    """A stand-in for Nsight Compute (none here) whose CSV has a kernel name of ``name``
    characters: longer than the csv module reads in one field."""
    ncu = tmp_path / "bin" / "longncu"
    ncu.parent.mkdir(parents=True, exist_ok=True)
    ncu.write_text(
        "#!/bin/bash\n"
        'while [ $# -gt 0 ]; do [ "$1" = --log-file ] && f=$2; shift; done\n'
        "{ printf '%s\\n' '\"ID\",\"Process ID\",\"Kernel Name\",\"gpu__time_duration.sum\"' "
        "'\"\",\"\",\"\",\"ns\"'; printf '\"0\",\"1\",\"paged_attention_v1_kernel'; "
        f"head -c {name} /dev/zero | tr '\\0' x; printf '\",\"1000\"\\n'; }} > \"$f\"\n")
    ncu.chmod(0o755)
    return ncu


def test_an_ncu_csv_with_a_field_past_the_csv_limit_is_one_message(tmp_path: Path) -> None:
    from tests.integration.test_hostile_pass10_r import _published_workdir

    wd = _published_workdir(tmp_path)
    res = _cli(tmp_path, "bench", "ncu", "--workdir", str(wd), "--ncu",
               str(_ncu_writing(tmp_path, "200000")), "--shape", "1x1k", "--formats", "json")
    text = res.stdout + res.stderr
    # without the fix: `_csv.Error: field larger than field limit (131072)`, a traceback
    assert "Traceback" not in text, text[-2000:]
    assert res.returncode == 7, text[-2000:]
    assert "ncu's CSV" in text and "malformed" in text and "To fix" in text, text[-2000:]


def test_a_sha256sums_listing_a_path_is_named_by_the_dry_run(tmp_path: Path,
                                                              fetched_workdir: Path) -> None:
    import hashlib
    import tarfile

    deps = tmp_path / "a" / "b" / "deps"
    (deps / "cutlass-").mkdir(parents=True)
    lines = []
    for name in ("cutlass", "flash-attention", "FlashMLA"):
        archive = deps / f"{name}-0123456789ab.tar.gz"
        with tarfile.open(archive, "w:gz") as tf:
            tf.add(deps / "cutlass-", arcname=archive.name[:-len(".tar.gz")])
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        listed = archive.name if name != "cutlass" else "cutlass-/../../../pwn.tar.gz"
        lines.append(f"{digest}  {listed}\n")
    (tmp_path / "pwn.tar.gz").write_bytes((deps / "cutlass-0123456789ab.tar.gz").read_bytes())
    (deps / "SHA256SUMS").write_text("".join(lines))
    res = _cli(tmp_path, "build", "--workdir", str(fetched_workdir), "--mode", "full",
               "--deps-dir", str(deps), "--trees", "baseline", "--skip-doctor", "--dry-run")
    text = res.stdout + res.stderr
    # without the fix: exit 0, VLLM_CUTLASS_SRC_DIR planned outside the work directory (and
    # the real build's refusal sent the user to `fetch --repair`)
    assert "Traceback" not in text, text[-2000:]
    assert res.returncode == 2, text[-2000:]
    assert "SHA256SUMS lists 'cutlass-/../../../pwn.tar.gz'" in text, text[-2000:]
    assert "To fix: list each archive by its own name" in text, text[-2000:]
    assert "fetch --repair" not in text, text[-2000:]


def test_git_refusing_the_transport_names_the_policy_not_the_network(
        tmp_path: Path, vllm_git_repo: tuple[Path, str]) -> None:
    repo, sha = vllm_git_repo
    wd = tmp_path / "work"
    args = ("fetch", "--workdir", str(wd), "--source", str(repo), "--allow-commit", sha)
    env = dict(_env(tmp_path), GIT_PROTOCOL_FROM_USER="0")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text[-2000:]
    assert res.returncode == 3 and "not allowed" in text, text[-2000:]
    # without the fix: "To fix: check the URL and the network, or use --source sdist"
    assert "check the URL and the network" not in text, text[-2000:]
    assert "protocol policy" in text and "GIT_PROTOCOL_FROM_USER" in text, text[-2000:]
    # what it says works: without the variable the same fetch succeeds
    res = _cli(tmp_path, *args)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]


def forge_twin(workdir: Path, twin: object) -> list[Path]:
    """Add a GQA twin with these template arguments to every verify cache entry of
    ``workdir``, its digest recomputed as whoever edits the work directory can."""
    import json

    from kvprefetch.verify.facts import _digest

    forged = []
    for entry in sorted((workdir / "verify" / "cache").glob("*.json")):
        data = json.loads(entry.read_text())
        data["payload"]["sass"]["twins"].append(["sm_90a", "forged_twin", [twin, 1, 1]])
        data["digest"] = _digest(data["payload"])
        entry.write_text(json.dumps(data))
        forged.append(entry)
    return forged


FORGED_TWINS = [{}, {"version": "v2", "dtype": "fp16", "kv_cache": [], "head_size": 128,
                     "block_size": 16, "group": 4, "split": 1, "staged": False, "fused": False}]


def verify_with_forged_twins(workdir: Path) -> list[str]:
    """verify-kernel --no-gpu after each forged twin; the problems found (empty: none)."""
    import shutil

    cache = workdir / "verify" / "cache"
    problems = []
    first = _cli(workdir.parent, "verify-kernel", "--workdir", str(workdir), "--no-gpu")
    assert first.returncode == 0, (first.stdout + first.stderr)[-2000:]
    kept = workdir.parent / "cache-as-verified"
    shutil.copytree(cache, kept)
    try:
        for twin in FORGED_TWINS:
            assert forge_twin(workdir, twin), "verify-kernel cached nothing"
            res = _cli(workdir.parent, "verify-kernel", "--workdir", str(workdir), "--no-gpu")
            text = res.stdout + res.stderr
            # without the fix: KeyError: 'staged' / TypeError: unhashable type: 'list'
            if "Traceback" in text or res.returncode != 0:
                problems.append(f"{twin!r}: exit {res.returncode}: {text[-800:]}")
            elif "from the cache" in text:
                problems.append(f"{twin!r}: the forged entry was taken: {text[-800:]}")
            shutil.rmtree(cache)
            shutil.copytree(kept, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copytree(kept, cache)
        shutil.rmtree(kept)
    return problems


@pytest.mark.slow  # needs the session's real build (minutes, once per run)
def test_a_verify_cache_entry_with_a_twin_of_the_wrong_shape_is_a_miss(kernels_build) -> None:
    assert kernels_build.resumed["returncode"] == 0, kernels_build.resumed["stderr"][-3000:]
    assert verify_with_forged_twins(kernels_build.workdir.resolve()) == []
