"""`kvprefetch verify-kernel --no-gpu` on the REAL kernels-only builds of both trees (the session
fixture ``kernels_build``, shared with test_kernels_build): each env's own python loads its own
library, the SASS has UBLKPF in every patched sm_90 kernel and none in the baseline, the GPU
check is "not checked" (never passed) -- and deliberately crossed setups are caught.

The crossed setups are made in place inside try/finally blocks that restore the patched env
byte for byte (copying the work directory is not an option: venv interpreters are symlinks and
the envs' .pth files hold absolute paths)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kvprefetch.errors import VerifyError
from kvprefetch.hashing import sha256_file
from kvprefetch.kernels.selection import Selection
from tests.integration.helpers import kvprefetch_cli_split, tree_bytes

pytestmark = pytest.mark.slow  # needs the session's real build (minutes, once per run)

TREES = ("baseline", "patched")
KERNELS = 2 * Selection((128,), (16,), ("fp16", "fp32")).kernel_count()  # v1 + v2 launchers
# The `prefetch` variant's prologue goes into the fp16 v2 kernels of this selection (block-sparse
# or not: policy.prefetches_in), its launch bound into the fp16 v1 kernels
# (policy.min_blocks); the fp32 kernels stay instruction-identical to stock.
PREFETCHING = 2
CHANGED = PREFETCHING + 2


def _verify(workdir: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    res = kvprefetch_cli_split("verify-kernel", "--workdir", str(workdir), "--no-gpu", *extra,
                               env=env)
    data = json.loads(res.stdout) if "--json" in extra else {}
    return res.returncode, data, res.stdout + res.stderr


def _manifest(workdir: Path, tree: str) -> dict[str, Any]:
    (path,) = workdir.glob(f"build/{tree}/*/manifest.json")
    m: dict[str, Any] = json.loads(path.read_text())
    return m


def _checks(data: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["name"], c["tree"]): c for c in data["checks"]}


@pytest.fixture(scope="module")
def built(kernels_build) -> Path:
    assert kernels_build.resumed["returncode"] == 0, kernels_build.resumed["stderr"][-3000:]
    return kernels_build.workdir.resolve()


@pytest.fixture(scope="module")
def verified(built: Path) -> tuple[int, dict[str, Any], str]:
    return _verify(built, "--json")


def test_verify_passes_with_the_gpu_check_not_checked(built: Path,
                                                      verified: tuple[int, dict, str]) -> None:
    rc, data, out = verified
    assert rc == 0, out[-4000:]
    assert data["passed"] is True
    checks = _checks(data)
    for tree in TREES:
        for name in ("interpreter inside its env", "loads its own library",
                     "library matches the build manifest", "library was compiled from this tree",
                     "UBLKPF in SASS"):
            assert checks[(name, tree)]["status"] == "pass", checks[(name, tree)]
    assert checks[("environments load different libraries", "all")]["status"] == "pass"
    # the prefetch's asm must not cost the K/V loads their read-only path (.CONSTANT loads)
    ro = checks[("K/V loads keep the read-only path", "patched")]
    assert ro["status"] == "pass", ro
    counts = data["sass"]["patched"]["readonly_loads"]
    assert counts["kernels"] == CHANGED and counts["kernels_with_fewer"] == 0
    same = checks[("attention kernels identical to stock", "patched")]
    assert same["status"] == "pass", same
    assert same["detail"].startswith(f"the {KERNELS - CHANGED} kernels prefetch leaves stock "
                                     f"compared, 0 differ; of the {CHANGED} it changes, 0 "
                                     "identical to stock"), same
    # the prologue's own block_table reads add a few; none of stock's are lost
    assert counts["total"] >= counts["stock_total"] > 0
    # the launch bound is in the binary: on the two fp16 v1 kernels, on nothing else
    bounds = checks[("launch bounds where the rule puts them", "patched")]
    assert bounds["status"] == "pass", bounds
    assert bounds["detail"].startswith(f"{KERNELS} attention kernels, 2 declared __launch_bounds__")
    # the v1 unit holds no prologue state; the v2 unit's sits beside its prologue kernels
    mod = checks[("modules hold only what their kernels use", "patched")]
    assert mod["status"] == "pass", mod
    assert "a user __constant__ bank in 0 (stock: 0); prologue state in 1" in mod["detail"]
    gpu = checks[("bitwise-equal outputs on the GPU", "all")]
    assert gpu["status"] == "not checked" and "--no-gpu" in gpu["detail"]
    assert {c["status"] for c in data["checks"]} == {"pass", "not checked"}
    # the report on disk is the same verdict
    on_disk = json.loads((built / "verify" / "report.json").read_text())
    assert on_disk["passed"] is True and on_disk["checks"] == data["checks"]


def test_each_env_loads_its_own_library(built: Path, verified: tuple[int, dict, str]) -> None:
    _, data, _ = verified
    loaded = {}
    for tree in TREES:
        probe = data["envs"][tree]
        m = _manifest(built, tree)
        env_dir = built / "envs" / tree
        assert probe["prefix"] == str(env_dir)
        assert not probe["cwd"].startswith(str(built))  # probed from a neutral directory
        k = probe["kernels"]
        assert k["so_file"] == os.path.realpath(m["so_path"])
        assert Path(k["so_file"]).is_relative_to(env_dir)
        assert k["so_sha256"] == m["so_sha256"] == sha256_file(k["so_file"])
        assert k["so_file"] in probe["mapped"]  # really mapped into the process
        assert k["namespace"] == f"kvprefetch_{tree}"
        assert k["compiled_build_info"]["tree"] == tree
        assert k["compiled_build_info"]["key"] == m["key"]
        assert sorted(k["ops"]) == ["paged_attention_v1", "paged_attention_v2"]
        assert any("libtorch" in p for p in probe["mapped"])
        loaded[tree] = (k["so_file"], k["so_sha256"])
    assert loaded["baseline"][0] != loaded["patched"][0]
    assert loaded["baseline"][1] != loaded["patched"][1]


def test_sass_ublkpf_counts(verified: tuple[int, dict, str]) -> None:
    _, data, _ = verified
    base, patched = data["sass"]["baseline"], data["sass"]["patched"]
    assert base["kernels"] == patched["kernels"] == KERNELS
    assert base["with_prefetch"] == 0 and base["problems"] == []
    assert all(r["ublkpf_max"] == 0 for r in base["table"])
    assert patched["with_prefetch"] == patched["prefetching_kernels"] == PREFETCHING
    assert patched["problems"] == []
    # per (arch, head, block, dtype, cache) row: the fp16 v2 kernels carry >= 2, the v1 kernels
    # and every fp32 kernel 0
    rows = {r["dtype"]: r for r in patched["table"]}
    assert sorted(rows) == ["fp16", "fp32"]
    assert all((r["head_size"], r["block_size"], r["arch"]) == (128, 16, "sm_90")
               for r in rows.values())
    assert rows["fp16"]["ublkpf_max"] >= 2 and rows["fp16"]["ublkpf_min"] == 0
    assert rows["fp32"]["ublkpf_max"] == 0


def test_text_verdict_lists_not_checked(built: Path) -> None:
    """The summary: the verdict on the first line of stdout, the GPU check among the not
    checked, the report's path on the last; the tables only in the report and with --verbose."""
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    res = kvprefetch_cli_split("verify-kernel", "--workdir", str(built), "--no-gpu", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("kvprefetch verify-kernel: PASSED"), res.stdout
    assert re.search(r"bitwise-equal outputs on the GPU( \(x\d\))? \[all\]: skipped \(--no-gpu\)",
                     res.stdout), res.stdout
    assert lines[-1].startswith(f"full report: {built / 'verify' / 'report.txt'}")
    assert "UBLKPF min" not in res.stdout and "XFORMERS a vLLM run" not in res.stdout
    assert "probed patched" in res.stderr                  # progress, on stderr
    assert "UBLKPF min" in (built / "verify" / "report.txt").read_text()
    rc, _, out = _verify(built, "--verbose")
    assert rc == 0 and "UBLKPF min" in out and "NOT CHECKED" in out


@contextmanager
def _restored(env_dir: Path) -> Iterator[None]:
    """Snapshot ``env_dir`` (a real copy kept aside), and put it back byte for byte after."""
    before = tree_bytes(env_dir)
    saved = env_dir.parent.parent / f".saved-{env_dir.name}"
    shutil.rmtree(saved, ignore_errors=True)
    shutil.copytree(env_dir, saved, symlinks=True)
    try:
        yield
    finally:
        shutil.rmtree(env_dir)
        shutil.copytree(saved, env_dir, symlinks=True)
        shutil.rmtree(saved)
        assert tree_bytes(env_dir) == before


def test_patched_env_pointed_at_the_baseline_library_is_caught(built: Path) -> None:
    """The patched env's kvprefetch_kernels package replaced by a copy of the baseline env's
    (what two editable installs sharing files do): verify fails, naming what is wrong."""
    pkg = {t: Path(_manifest(built, t)["so_path"]).parent for t in TREES}
    with _restored(built / "envs" / "patched"):
        shutil.rmtree(pkg["patched"])
        shutil.copytree(pkg["baseline"], pkg["patched"])
        rc, data, out = _verify(built, "--json")
    assert rc == VerifyError.exit_code, out[-3000:]
    assert data["passed"] is False
    checks = _checks(data)
    failed = {k for k, c in checks.items() if c["status"] == "fail"}
    assert ("library matches the build manifest", "patched") in failed
    assert ("library was compiled from this tree", "patched") in failed
    assert "tree=baseline" in checks[("library was compiled from this tree", "patched")]["detail"]
    assert ("UBLKPF in SASS", "patched") in failed
    assert "0 UBLKPF (expected >= 2" in checks[("UBLKPF in SASS", "patched")]["detail"]
    assert ("environments load different libraries", "all") in failed  # same bytes twice
    assert not any(t == "baseline" for _, t in failed)  # the baseline itself is fine


def test_both_envs_sharing_one_library_file_is_caught(built: Path) -> None:
    """The patched env's _C.so is a symlink to the baseline env's: one file loaded twice."""
    so = {t: Path(_manifest(built, t)["so_path"]) for t in TREES}
    with _restored(built / "envs" / "patched"):
        so["patched"].unlink()
        so["patched"].symlink_to(so["baseline"])
        rc, data, out = _verify(built, "--json")
    assert rc == VerifyError.exit_code, out[-3000:]
    checks = _checks(data)
    shared = checks[("environments load different libraries", "all")]
    assert shared["status"] == "fail"
    assert shared["detail"].count(str(so["baseline"])) == 2  # both resolve to the same file
    assert checks[("loads its own library", "patched")]["status"] == "fail"


def test_gpu_identity_runs_once_per_forced_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_gpu runs kvprefetch.verify.numerics with KVPREFETCH_GQA set to the named twin, keeps
    each pass's data under that twin, and turns a failed, crashed or GPU-less pass into FAIL /
    FAIL / not checked. The identity run itself needs a GPU and built trees, so it is replaced here
    by a recorder (the H200 runs the real one: docs/results/.../24-twins/verify.json)."""
    from kvprefetch.kernels.policy import TWIN_SHAPES
    from kvprefetch.verify import kernel as v

    seen: list[dict[str, str] | None] = []
    answers = {None: {"status": "passed", "checked": 98, "failed": 0},
               "4x2": {"status": "failed", "checked": 98, "failed": 3},
               "2x2": None, "2x4": {"status": "not checked", "reason": "no GPU"}}

    def fake_identity_run(workdir, trees, extra_env):
        seen.append(extra_env)
        twin = (extra_env or {}).get("KVPREFETCH_GQA")
        data = answers.get(twin, {"status": "passed", "checked": 98, "failed": 0})
        return data, "exit 1: boom"

    monkeypatch.setattr(v, "_identity_run", fake_identity_run)
    rep = v.VerifyReport("unused")
    v.check_gpu(rep, Path("unused"), ["baseline", "patched"], no_gpu=False)
    for g, s, _ in TWIN_SHAPES:
        v.check_gpu(rep, Path("unused"), ["baseline", "patched"], no_gpu=False, twin=f"{g}x{s}")
    assert seen == [None] + [{"KVPREFETCH_GQA": f"{g}x{s}"} for g, s, _ in TWIN_SHAPES]
    status = {c.name: c.status for c in rep.checks}
    assert status == {
        "bitwise-equal outputs on the GPU": "pass",
        "bitwise-equal outputs on the GPU, twin 4x1 forced (KVPREFETCH_GQA=4x1)": "pass",
        "bitwise-equal outputs on the GPU, twin 4x2 forced (KVPREFETCH_GQA=4x2)": "fail",
        "bitwise-equal outputs on the GPU, twin 2x2 forced (KVPREFETCH_GQA=2x2)": "fail",
        "bitwise-equal outputs on the GPU, twin 2x4 forced (KVPREFETCH_GQA=2x4)": "not checked"}
    assert "crashed (exit 1: boom)" in rep.checks[3].detail
    assert set(rep.gpu_twins) == {"4x1", "4x2", "2x4"} and rep.gpu is not None
    assert rep.to_dict()["gpu_twins"]["4x2"]["failed"] == 3
    assert not rep.passed
