"""`kvprefetch build`: the plan (kernels-only and full), bad input refused with nothing
half-written, and -- the slow integration test -- one REAL kernels-only build of both trees
(nvcc, sm_90, narrowed set) that is killed mid-compile, resumed, and then found up to date.

The slow tests share the session fixture ``kernels_build`` (tests/conftest.py), which test_verify
uses too, so the whole run compiles once (about 5 minutes on 2 cores)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvprefetch.hashing import sha256_file
from kvprefetch.kernels.selection import Selection
from kvprefetch.sources.fetch import tree_modifications
from kvprefetch.sources.patching import apply_patch, patch_sha256
from kvprefetch.workspace.workdir import Workdir
from tests.integration.helpers import (
    NARROW_BUILD_ARGS,
    copy_workdir,
    kvprefetch_cli_split,
    tree_bytes,
)

TREES = ("baseline", "patched")
NARROW = Selection((128,), (16,), ("fp16", "fp32"))
SM90 = "-gencode=arch=compute_90,code=sm_90"


@pytest.fixture(scope="module")
def applied_workdir(tmp_path_factory: pytest.TempPathFactory, fetched_template: Path) -> Path:
    """One fetched + applied work directory shared by the plan and refusal tests below: each
    of them proves it changed nothing (byte inventory before/after), so sharing is safe."""
    wd = tmp_path_factory.mktemp("applied") / "work"
    copy_workdir(fetched_template, wd)
    apply_patch(wd, "prefetch")
    return wd


@pytest.fixture
def private_applied_workdir(fetched_workdir: Path) -> Path:
    apply_patch(fetched_workdir, "prefetch")
    return fetched_workdir


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_LOCATION",
                        "PYTHONPATH", "KVPREFETCH_WORKDIR")}
    env.update(extra)
    return env


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


# --------------------------------------------------------------------------- the plan


def test_kernels_only_dry_run_json_is_the_exact_plan(applied_workdir: Path) -> None:
    before = tree_bytes(applied_workdir)
    res = kvprefetch_cli_split("build", "--workdir", str(applied_workdir), "--dry-run", "--json",
                               *NARROW_BUILD_ARGS, env=_clean_env())
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["mode"] == "kernels-only"
    assert plan["arch_list"] == "9.0a"
    assert plan["gencode"] == [SM90]  # vLLM builds _C for plain sm_90 even for 9.0a
    assert plan["selection"]["kernels_per_source"] == NARROW.kernel_count() == 4
    assert [t["tree"] for t in plan["trees"]] == list(TREES)
    assert plan["up_to_date"] == []  # nothing built yet
    by = {t["tree"]: t for t in plan["trees"]}
    assert by["baseline"]["variant"] is None and by["baseline"]["patch_sha256"] is None
    assert by["patched"]["variant"] == "prefetch"
    assert by["patched"]["patch_sha256"] == patch_sha256("prefetch")
    assert by["baseline"]["key"] != by["patched"]["key"]
    for name, t in by.items():
        assert t["source_tree"] == str(applied_workdir.resolve() / "trees" / name)
        assert t["env_path"] == str(applied_workdir.resolve() / "envs" / name)
        assert t["python"] == t["env_path"] + "/bin/python"
        assert t["namespace"] == f"kvprefetch_{name}"
        assert t["env_set"]["TORCH_CUDA_ARCH_LIST"] == "9.0a"
        assert t["env_set"]["MAX_JOBS"] == str(plan["jobs"])
        for var in ("PYTHONPATH", "PYTHONHOME", "VLLM_USE_PRECOMPILED",
                    "VLLM_PRECOMPILED_WHEEL_LOCATION"):
            assert var in t["env_unset"]
        steps = {s["name"]: s for s in t["steps"]}
        assert list(steps) == ["create-env", "probe-torch", "write-sources", "compile",
                               "install", "manifest"]
        assert steps["compile"]["argv"] == ["ninja", "-C", t["build_dir"], "-j", str(plan["jobs"])]
        nvcc_cmd = steps["compile"]["description"]
        assert SM90 in nvcc_cmd and "-std=c++20" in nvcc_cmd  # torch >= 2.10 headers need C++20
        assert f"-DKVPREFETCH_NAMESPACE=kvprefetch_{name}" in nvcc_cmd
        assert f"-I{t['source_tree']}/csrc/attention" in nvcc_cmd  # the tree's own headers
        assert t["outputs"][0] == f"{t['build_dir']}/kvprefetch_{name}_C.so"
        assert t["log_dir"] == t["build_dir"] + "/logs"
    # a dry run changes nothing: no env, no build dir, not one byte
    assert tree_bytes(applied_workdir) == before


def _full_plan(workdir: Path, *extra: str, path_prepend: Path | None = None) -> dict:
    env = _clean_env()
    if path_prepend is not None:
        env["PATH"] = f"{path_prepend}{os.pathsep}{env['PATH']}"
    res = kvprefetch_cli_split("build", "--workdir", str(workdir), "--mode", "full",
                               "--dry-run", "--json", "--skip-doctor", *extra, env=env)
    assert res.returncode == 0, res.stderr
    plan: dict = json.loads(res.stdout)
    return plan


def test_full_mode_dry_run_json_commands_and_environment(applied_workdir: Path,
                                                         make_fake_tool) -> None:
    # ccache is not installed on this machine; the plan only looks it up on PATH (it is never
    # run in a dry run), so a stand-in executable named ccache is enough to show what the plan
    # does when a user has one.
    fake_ccache = make_fake_tool("ccache", "ccache version 4.8")
    before = tree_bytes(applied_workdir)
    plan = _full_plan(applied_workdir, "--arch", "8.0;9.0a", "--jobs", "3",
                      path_prepend=fake_ccache.parent)
    assert plan["mode"] == "full" and plan["arch_list"] == "8.0;9.0a"
    wd = applied_workdir.resolve()
    for t in plan["trees"]:
        tree = str(wd / "trees" / t["tree"])
        py = str(wd / "envs" / t["tree"] / "bin" / "python")
        assert t["python"] == py
        env_set = t["env_set"]
        assert env_set["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0a"
        assert env_set["SETUPTOOLS_SCM_PRETEND_VERSION"] == "0.10.2"
        assert env_set["MAX_JOBS"] == "3"
        assert env_set["CCACHE_NOHASHDIR"] == "true"
        assert env_set["CCACHE_DIR"] == str(wd / "ccache")  # one cache shared by both trees
        assert "VLLM_USE_PRECOMPILED" in t["env_unset"]
        assert "VLLM_PRECOMPILED_WHEEL_LOCATION" in t["env_unset"]
        assert "VLLM_USE_PRECOMPILED" not in env_set
        steps = {s["name"]: s for s in t["steps"]}
        assert steps["build-requirements"]["argv"] == [py, "-m", "pip", "install", "-r",
                                                       "requirements/build.txt"]
        assert steps["cuda-requirements"]["argv"] == [py, "-m", "pip", "install", "-r",
                                                      "requirements/cuda.txt"]
        assert steps["build-requirements"]["cwd"] == tree == steps["build"]["cwd"]
        assert steps["build"]["argv"] == [py, "-m", "pip", "install", "--no-build-isolation",
                                          "-v", "-e", "."]
        assert steps["ccache-zero"]["argv"] == [str(fake_ccache), "--zero-stats"]
        assert steps["ccache-stats"]["argv"] == [str(fake_ccache), "--show-stats"]
        names = list(steps)
        assert names.index("ccache-zero") < names.index("build") < names.index("ccache-stats")
        # the requirement files named in the plan are the tree's real ones: torch 2.8.0 pinned,
        # xformers (the V0 XFORMERS path) in cuda.txt
        assert "torch==2.8.0" in Path(tree, "requirements/build.txt").read_text()
        assert "xformers" in Path(tree, "requirements/cuda.txt").read_text()
    assert tree_bytes(applied_workdir) == before


def test_full_mode_plan_variants(applied_workdir: Path, tmp_path: Path) -> None:
    deps = tmp_path / "deps"
    for d in ("cutlass", "flash-attention", "FlashMLA"):
        (deps / d).mkdir(parents=True)
    plan = _full_plan(applied_workdir, "--no-editable", "--deps-dir", str(deps))
    for t in plan["trees"]:
        build = next(s for s in t["steps"] if s["name"] == "build")
        assert build["argv"][-1] == "." and "-e" not in build["argv"]
        assert t["env_set"]["VLLM_CUTLASS_SRC_DIR"] == str((deps / "cutlass").resolve())
        assert t["env_set"]["VLLM_FLASH_ATTN_SRC_DIR"] == str((deps / "flash-attention").resolve())
        assert t["env_set"]["FLASH_MLA_SRC_DIR"] == str((deps / "FlashMLA").resolve())
        if "ccache" not in " ".join(" ".join(s["argv"]) for s in t["steps"]):
            assert "CCACHE_NOHASHDIR" not in t["env_set"]  # no compiler cache, no cache vars
    (deps / "FlashMLA").rmdir()
    res = kvprefetch_cli_split("build", "--workdir", str(applied_workdir), "--mode", "full",
                               "--dry-run", "--skip-doctor", "--deps-dir", str(deps),
                               env=_clean_env())
    assert res.returncode == 2
    assert "FlashMLA" in res.stderr and "To fix:" in res.stderr


# --------------------------------------------------------------------------- refusals


def test_full_mode_refused_by_the_preflight_with_nothing_written(applied_workdir: Path) -> None:
    """This machine cannot do a full build (GitHub unreachable, cmake 3.25 < 3.26.1, CUDA 13
    rather than 12.8): the doctor refuses before any environment exists."""
    before = tree_bytes(applied_workdir)
    res = kvprefetch_cli_split("build", "--workdir", str(applied_workdir), "--mode", "full",
                               "--arch", "9.0a", env=_clean_env(), timeout=300)
    assert res.returncode != 0
    assert res.stderr.lstrip().startswith("error: preflight"), res.stderr
    assert "To fix" in res.stderr
    assert not (applied_workdir / "envs").exists()
    assert not list(applied_workdir.glob("build/*/*"))
    assert tree_bytes(applied_workdir) == before


def test_bad_arch_is_a_config_error_with_nothing_changed(applied_workdir: Path) -> None:
    before = tree_bytes(applied_workdir)
    res = kvprefetch_cli_split("build", "--workdir", str(applied_workdir), "--kernels-only",
                               "--arch", "9.0x", env=_clean_env())
    assert res.returncode == 2
    lines = _error_lines(res.stderr)
    assert lines[0].startswith("error: ") and "9.0x" in lines[0]
    assert lines[1].startswith("To fix: ")
    assert len(lines) == 2, res.stderr
    assert tree_bytes(applied_workdir) == before


@pytest.mark.parametrize(("var", "value"), [("VLLM_USE_PRECOMPILED", "1"),
                                       ("VLLM_PRECOMPILED_WHEEL_LOCATION", "/tmp/vllm.whl")])
def test_precompiled_vllm_is_refused(applied_workdir: Path, var: str, value: str) -> None:
    before = tree_bytes(applied_workdir)
    res = kvprefetch_cli_split("build", "--workdir", str(applied_workdir), "--kernels-only",
                               env=_clean_env(**{var: value}))
    assert res.returncode == 2
    assert f"{var}={value}" in res.stderr
    assert "To fix: unset" in res.stderr
    assert tree_bytes(applied_workdir) == before


@pytest.mark.parametrize("tree", ["patched", "baseline"])
def test_tree_edited_after_apply_is_refused_with_the_edit_kept(private_applied_workdir: Path,
                                                                tree: str) -> None:
    """A hand edit to a tree's sources after fetch/apply would be compiled under the recorded
    sources' key and labelled with them: the build names the file and the fix, and leaves the
    edit and everything else in place; undoing the edit makes the same build plannable."""
    header = private_applied_workdir / "trees" / tree / "csrc/attention/attention_kernels.cuh"
    original = header.read_bytes()
    header.write_bytes(original + b"// a local experiment\n")
    before = tree_bytes(private_applied_workdir)
    res = kvprefetch_cli_split("build", "--workdir", str(private_applied_workdir), "--dry-run",
                               *NARROW_BUILD_ARGS, env=_clean_env())
    assert res.returncode == 2, res.stderr
    lines = _error_lines(res.stderr)
    assert lines[0] == (f"error: the {tree!r} tree was edited after kvprefetch recorded it "
                        "(M csrc/attention/attention_kernels.cuh): its build would be labelled "
                        "with sources it does not hold"), res.stderr
    assert lines[1].startswith("To fix: restore it with `kvprefetch fetch --force`")
    reapply = "`kvprefetch apply --variant prefetch --tree patched`"
    assert (reapply in lines[1]) == (tree == "patched")
    assert tree_bytes(private_applied_workdir) == before
    header.write_bytes(original)
    # A file added under csrc/ is not counted (a full build generates Marlin sources there, and
    # a new file is compiled only through a changed one): the same build is plannable.
    added = private_applied_workdir / "trees" / tree / "csrc" / "generated_by_a_build.cu"
    added.write_text("// generated\n")
    ok = kvprefetch_cli_split("build", "--workdir", str(private_applied_workdir), "--dry-run",
                              *NARROW_BUILD_ARGS, env=_clean_env())
    assert ok.returncode == 0, ok.stderr


def test_concurrent_build_of_the_same_tree_is_refused(private_applied_workdir: Path) -> None:
    """Another process (this test, through fcntl) holds the trees' build locks: the build
    refuses, naming the holder, and creates no environment and compiles nothing."""
    fds = []
    try:
        for tree in TREES:
            lock = private_applied_workdir / "build" / tree / ".lock"
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.pwrite(fd, f"kvprefetch-lock pid {os.getpid()}".encode(), 0)  # as the kit writes
            fds.append(fd)
        res = kvprefetch_cli_split("build", "--workdir", str(private_applied_workdir),
                                   "--skip-doctor", *NARROW_BUILD_ARGS, env=_clean_env(),
                                   timeout=300)
    finally:
        for fd in fds:
            os.close(fd)
    assert res.returncode != 0
    for tree in TREES:
        assert (f"another kvprefetch process (pid {os.getpid()}) is already working on the "
                f"{tree} build") in res.stderr, res.stderr
    assert "To fix" in res.stderr
    assert not (private_applied_workdir / "envs").exists()
    assert not list(private_applied_workdir.glob("build/*/*/*.o"))


@pytest.mark.parametrize("mode", ["kernels-only", "overlay"])
def test_a_build_of_any_mode_holds_the_tree_lock_while_it_works(
        private_applied_workdir: Path, mode: str, tmp_path: Path) -> None:
    """While a build of either mode holds its build lock (making the environment, installing,
    compiling), it holds the tree's own lock too, the one `apply`, `fetch` and `clean` take, so
    no sources change under it. The overlay build took only the build lock (issue 45). Seen
    from outside, as `apply` would: this test's flock on the tree lock must be refused."""
    wd = private_applied_workdir
    build_lock = wd / "build" / "patched" / ".lock"
    log = (tmp_path / "build.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, "-m", "kvprefetch", "build", "--workdir", str(wd), "--skip-doctor",
         "--mode", mode, "--trees", "patched", "--arch", "9.0a", "--head-sizes", "128",
         "--block-sizes", "16", "--kv-dtypes", "fp16"],
        env=_clean_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    marker = f"kvprefetch-lock pid {child.pid}"  # what the kit writes into a lock it holds
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            if build_lock.exists() and build_lock.read_text().strip() == marker:
                break
            time.sleep(0.05)
        assert child.poll() is None, (tmp_path / "build.log").read_text()
        assert build_lock.read_text().strip() == marker, "the build never took its lock"
        fd = os.open(wd / ".locks" / "tree-patched.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        log.close()


# --------------------------------------------------------------------------- the real build


@pytest.mark.slow
def test_interrupted_build_was_killed_mid_compile(kernels_build) -> None:
    i = kernels_build.interrupted
    assert not i["finished_by_itself"], i["log"][-3000:]
    assert i["returncode"] == -signal.SIGKILL
    assert i["compiling_seconds"] is not None, "the kill must land while compiling"
    assert not any(p.endswith("_C.so") for p in i["objects"])  # nothing was linked yet


@pytest.mark.slow
def test_kill_left_both_trees_and_envs_intact(kernels_build) -> None:
    ak = kernels_build.after_kill
    assert ak["tree_modifications"] == {"baseline": [], "patched": []}
    assert ak["manifests"] == []  # nothing claims to be built
    for tree, py in ak["env_python"].items():
        assert py["exists"] and py["returncode"] == 0, py
        assert py["prefix"] == str(kernels_build.workdir.resolve() / "envs" / tree)


@pytest.mark.slow
def test_rerun_completes_with_manifests_and_own_libraries(kernels_build) -> None:
    r = kernels_build.resumed
    assert r["returncode"] == 0, r["stderr"][-4000:]
    # ninja's [n/N], with the time elapsed and an estimate of the time left
    assert re.search(r"\[(baseline|patched)\] compiling \[\d+/\d+\] \d+:\d\d elapsed, ",
                     r["stderr"])
    wd = kernels_build.workdir.resolve()
    shas = {}
    for tree in TREES:
        manifests = list(wd.glob(f"build/{tree}/*/manifest.json"))
        assert len(manifests) == 1
        m = json.loads(manifests[0].read_text())
        assert m["tree"] == tree and m["mode"] == "kernels-only"
        assert m["variant"] == ("stock" if tree == "baseline" else "prefetch")
        # the patch the tree carries, as `apply` recorded it (csrc/ may have moved on since)
        applied = (Workdir(wd).read_state(tree) or {}).get("applied") or {}
        assert m["inputs"]["patch_sha256"] == applied.get("patch_sha256")
        assert (m["inputs"]["patch_sha256"] is None) == (tree == "baseline")
        assert m["inputs"]["gencode"] == [SM90]
        assert ((m["head_sizes"], m["block_sizes"], m["kv_dtypes"])
                == ([128], [16], ["fp16", "fp32"]))
        assert m["env"]["path"] == str(wd / "envs" / tree)
        installed = Path(m["so_path"])
        assert installed.is_relative_to(wd / "envs" / tree)  # inside its own env
        assert installed.name == "_C.so" and installed.parent.name == "kvprefetch_kernels"
        assert sha256_file(installed) == m["so_sha256"]
        for out in m["outputs"]:
            assert sha256_file(out["path"]) == out["sha256"]
        assert Path(m["build_so_path"]).parent == manifests[0].parent
        # the narrowed launcher copies were generated from this tree's own sources
        for src in m["inputs"]["sources"]:
            first = Path(src).read_text().splitlines()[0]
            assert f"Generated by kvprefetch from {wd / 'trees' / tree}/csrc/attention/" in first
        shas[tree] = m["so_sha256"]
        # the env's own python imports its own package (not the other env's)
        py = wd / "envs" / tree / "bin" / "python"
        code = "import kvprefetch_kernels as k, sys; print(k.SO_PATH); print(sys.prefix)"
        out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd="/",
                             check=True).stdout.split()
        assert out == [str(installed), str(wd / "envs" / tree)]
    assert shas["baseline"] != shas["patched"]
    # the build never touched the sources
    assert {t: tree_modifications(Workdir(wd), t) for t in TREES} == {"baseline": [], "patched": []}


@pytest.mark.slow
def test_third_run_is_up_to_date_without_recompiling(kernels_build) -> None:
    t = kernels_build.third
    assert t["returncode"] == 0, t["stderr"][-3000:]
    for tree in TREES:
        assert f"[{tree}] up to date" in t["stderr"]
    assert "compiling [" not in t["stderr"]
    # and a dry run says so before building anything
    res = kvprefetch_cli_split("build", "--workdir", str(kernels_build.workdir), "--dry-run",
                               *NARROW_BUILD_ARGS, env=_clean_env())
    assert res.returncode == 0, res.stderr
    assert "up to date: baseline, patched; to build: none" in res.stdout
    # one line per skipped tree, none of its steps (issue 42)
    assert res.stdout.count("] up to date: ") == 2 and "ninja" not in res.stdout
    assert t["objects"] == kernels_build.resumed["objects"]  # same files, same mtimes
    assert {Path(p).parts[-3] for p in t["objects"]} == set(TREES)  # every tree's objects
    assert t["seconds"] < kernels_build.resumed["seconds"] / 3


@pytest.mark.slow
def test_build_objects_resumed_not_restarted(kernels_build) -> None:
    """Objects finished before the kill are kept (same mtime) by the rerun; none is half-written."""
    i = kernels_build.interrupted
    before = i["objects"]
    if i["reason"] != "every tree has a finished object":
        pytest.skip(f"the kill landed before every tree had a finished object ({i['reason']})")
    assert {Path(p).parts[-3] for p in before} == set(TREES)
    after = kernels_build.resumed["objects"]
    for path, mtime in before.items():
        assert after.get(path) == mtime, f"{path} was rebuilt after the kill"
    # ninja ran only what was left: fewer edges per tree than the interrupted run had to build
    pattern = r"\[(baseline|patched)\] compiling \[\d+/(\d+)\]"
    progress = re.findall(pattern, kernels_build.resumed["stderr"])
    first = dict(re.findall(pattern, i["log"]))
    assert {t for t, _ in progress} == set(TREES) == set(first), (progress, first)
    assert all(int(total) < int(first[t]) for t, total in progress), (progress, first)
    assert not list(kernels_build.workdir.glob("build/*/*/*.tmp"))
