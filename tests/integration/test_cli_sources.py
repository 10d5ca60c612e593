"""The source commands as a user runs them (fetch -> apply -> diff-upstream -> export-header,
all --json), the error format (cause + "To fix", exit code per family, tracebacks only with
--debug), and `clean` removing only what kvprefetch created and tagged."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvprefetch import __version__, upstream
from kvprefetch.errors import ConfigError, PatchError
from kvprefetch.hashing import sha256_file
from kvprefetch.sources.patching import inline_kit_headers
from tests.integration.helpers import kvprefetch_cli_split, seed_downloads, tree_bytes


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env.update(extra)
    return env


def test_readme_flow_with_workdir_from_the_environment(tmp_path: Path, vllm_sdist: Path) -> None:
    work = tmp_path / "work"
    seed_downloads(work, vllm_sdist)
    env = _env(KVPREFETCH_WORKDIR=str(work))

    def cli(*args: str) -> dict:
        res = kvprefetch_cli_split(*args, env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        data: dict = json.loads(res.stdout)  # stdout is pure JSON; progress went to stderr
        return data

    fetched = cli("fetch", "--source", "sdist", "--json")
    assert Path(fetched["workdir"]) == work
    assert [t["action"] for t in fetched["trees"]] == ["created", "created"]
    applied = cli("apply", "--json")
    assert applied["action"] == "applied" and applied["path"] == str(work / "trees" / "patched")
    diff = cli("diff-upstream", "--json")
    assert diff["additive"] is True and diff["tree"] == "patched"
    assert upstream.ATTENTION_HEADER in [f["path"] for f in diff["files"]]
    exported = cli("export-header", "--json")
    # the default output is csrc/attention_kernels.cuh relative to where the user runs it
    assert exported["output"] == "csrc/attention_kernels.cuh"
    out = tmp_path / "csrc" / "attention_kernels.cuh"
    assert exported["sha256"] == sha256_file(out)
    # the generated drop-in equals the patched tree's header with the helper inlined
    tree_header = (work / "trees" / "patched" / upstream.ATTENTION_HEADER).read_text()
    (include,) = [ln for ln in tree_header.splitlines(keepends=True)
                  if ln.startswith('#include "kvprefetch/prefetch.cuh"')]
    inlined = "".join(inline_kit_headers(include))
    assert inlined.startswith("// ---- begin kvprefetch csrc/kvprefetch/prefetch.cuh (inlined)")
    assert out.read_text().replace(inlined, include) == tree_header


def test_errors_are_cause_then_fix_with_family_exit_codes(tmp_path: Path) -> None:
    res = kvprefetch_cli_split("apply", "--workdir", str(tmp_path / "none"), env=_env())
    assert res.returncode == PatchError.exit_code
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("error: there is no kvprefetch tree named 'patched'")
    assert lines[-1].startswith("To fix: run `kvprefetch fetch`")
    assert "Traceback" not in res.stderr
    res = kvprefetch_cli_split("--debug", "apply", "--workdir", str(tmp_path / "none"), env=_env())
    assert res.returncode != 0
    assert "Traceback" in res.stderr and "PatchError" in res.stderr
    res = kvprefetch_cli_split("fetch", "--workdir", str(tmp_path / "w"), "--source",
                               str(tmp_path / "missing"), env=_env())
    assert res.returncode == ConfigError.exit_code
    assert "no such file or directory" in res.stderr and "To fix:" in res.stderr
    assert not (tmp_path / "w" / "trees").exists()


def test_version() -> None:
    res = kvprefetch_cli_split("--version", env=_env())
    assert res.returncode == 0 and res.stdout.strip() == f"kvprefetch, version {__version__}"


# --------------------------------------------------------------------------- clean


def _record_build(workdir: Path, tree: str) -> Path:
    """A build directory recorded as the kit's own, exactly as the builder records it when it
    starts a build (sequence.tree_locks); compiling one for real is test_kernels_build's job."""
    from kvprefetch.workspace import ownership

    bdir = workdir / "build" / tree
    bdir.mkdir(parents=True, exist_ok=True)
    ownership.record(workdir, bdir, "build")
    return bdir


def test_clean_removes_only_what_kvprefetch_created(fetched_workdir: Path) -> None:
    wd = fetched_workdir
    (_record_build(wd, "baseline") / "0123456789abcdef").mkdir()
    # a folder under build/ that kvprefetch did not make: kept (issue 26)
    (wd / "build" / "patched" / "0123456789abcdef").mkdir(parents=True)
    (wd / "build" / "patched" / "0123456789abcdef" / "x.o").write_bytes(b"obj")
    (wd / "envs" / "mine").mkdir(parents=True)  # no kvprefetch marker: not ours
    (wd / "envs" / "mine" / "keep.txt").write_text("keep")
    (wd / "notes.md").write_text("mine too")
    before = tree_bytes(wd)

    res = kvprefetch_cli_split("clean", "--workdir", str(wd), "--what", "all", "--dry-run",
                               "--json", env=_env())
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["dry_run"] is True
    rel = sorted(str(Path(p).relative_to(wd)) for p in data["removed"])
    assert rel == sorted(["build/baseline", "trees/baseline", "trees/patched",
                          "state/baseline.json", "state/patched.json",
                          "pristine/sdist"])
    kept = {str(Path(k["path"]).relative_to(wd)): k["reason"] for k in data["kept"]}
    assert kept["build/patched"] == "not created by kvprefetch"
    assert kept["envs/mine"] == "not created by kvprefetch"
    assert tree_bytes(wd) == before  # a dry run changes nothing, and takes no lock

    res = kvprefetch_cli_split("clean", "--workdir", str(wd), "--what", "all", env=_env())
    assert res.returncode == 0, res.stderr
    assert not (wd / "trees" / "baseline").exists() and not (wd / "pristine" / "sdist").exists()
    assert not (wd / "build" / "baseline").exists()
    assert (wd / "build" / "patched" / "0123456789abcdef" / "x.o").read_bytes() == b"obj"
    assert (wd / "envs" / "mine" / "keep.txt").read_text() == "keep"
    assert (wd / "notes.md").is_file()
    assert sha256_file(wd / "downloads" / upstream.SDIST_NAME) == upstream.SDIST_SHA256


def test_clean_refuses_a_directory_kvprefetch_did_not_create(tmp_path: Path) -> None:
    d = tmp_path / "someone-elses"
    (d / "trees" / "baseline").mkdir(parents=True)
    (d / "build" / "x").mkdir(parents=True)
    before = tree_bytes(d)
    res = kvprefetch_cli_split("clean", "--workdir", str(d), "--what", "all", env=_env())
    assert res.returncode == ConfigError.exit_code
    assert "is not a kvprefetch work directory" in res.stderr and "To fix:" in res.stderr
    assert tree_bytes(d) == before


def test_clean_builds_is_the_default(fetched_workdir: Path) -> None:
    (_record_build(fetched_workdir, "baseline") / "k1").mkdir()
    res = kvprefetch_cli_split("clean", "--workdir", str(fetched_workdir), env=_env())
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"removed {fetched_workdir / 'build' / 'baseline'}"
    assert not (fetched_workdir / "build" / "baseline").exists()
    assert (fetched_workdir / "trees" / "baseline").is_dir()


def test_clean_does_not_pull_a_build_from_under_a_running_build(fetched_workdir: Path) -> None:
    """A build holds build/<tree>/.lock while ninja runs; `clean --what builds` must not delete
    that directory under it (the lock is held here by this test, with fcntl, as the build would)."""
    import fcntl

    bdir = _record_build(fetched_workdir, "patched") / "0123456789abcdef"
    bdir.mkdir()
    (bdir / "paged_attention_v1.cuda.o").write_bytes(b"half a build")
    fd = os.open(fetched_workdir / "build" / "patched" / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, f"kvprefetch-lock pid {os.getpid()}".encode(), 0)  # as the kit writes
        res = kvprefetch_cli_split("clean", "--workdir", str(fetched_workdir), env=_env())
    finally:
        os.close(fd)
    assert (bdir / "paged_attention_v1.cuda.o").is_file(), res.stdout + res.stderr
    assert res.returncode != 0 and "To fix" in res.stderr
