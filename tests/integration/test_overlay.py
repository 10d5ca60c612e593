"""`kvprefetch build --mode overlay` for real, then `verify-kernel`, on this CPU machine.

What is real: the released ``vllm==0.10.2`` wheel with ``torch==2.8.0`` and
``xformers==0.0.32.post1`` installed from the package index into two uv environments
(baseline, patched), the trees' real attention sources compiled with the machine's nvcc
against each environment's torch, the plugin wheel installed with uv, and vLLM's own
``load_general_plugins()`` running it in each environment and in a spawned child.

What is not, and why: there is no GPU here, so nothing is launched. vLLM's ``_C.abi3.so`` needs
``libcuda.so.1`` to load at all, and this machine has no NVIDIA driver, so verify-kernel gives
the probe processes a generated no-device stand-in (overlay/driverstub.py: the two driver
functions ``_C`` imports, each returning CUDA_ERROR_NO_DEVICE). The dispatch calls are made with
CPU tensors under the CUDA dispatch key, with the routed library's probe switch on, so its
launchers count the call and return before touching a device. The GPU test machine cannot run
vLLM at all (no network, and the 436 MB wheel plus its torch exceed what a call may carry), so
the GPU half -- kernels launched by vLLM, graph capture, outputs -- is left to a user's GPU box
(`kvprefetch bench e2e`).

Downloads: uv's cache (UV_CACHE_DIR, else $KVPREFETCH_TEST_CACHE/uv, else uv's default
~/.cache/uv) keeps the ~4 GB of wheels between runs; the second environment hard-links from it.
No CUDA 12 toolkit is installed here and PyPI has no CUDA 12 compiler, so the build assembles
CUDA 12.4.1 into the work directory from pinned package archives (overlay/cuda12.py: Debian's
nvidia-cuda-toolkit .deb and PyPI's cu12 header wheels, about 113 MB), and compiles with it: the
same major version as the environments' torch, with no --allow-cuda-mismatch."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import (
    _STEERING_VARS,
    SDIST_CACHE_ENV,
    kvprefetch_cli,
    kvprefetch_cli_split,
)

pytestmark = pytest.mark.slow

TREES = ("baseline", "patched")
ROUTE = "vLLM's paged_attention_v1/v2 route to this tree's library"
SPAWN = "routing holds in a spawned worker process"
OFF = "KVPREFETCH_OVERLAY=off keeps vLLM's own kernels"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _STEERING_VARS and k != "KVPREFETCH_WORKDIR"}
    if "UV_CACHE_DIR" not in env and os.environ.get(SDIST_CACHE_ENV):
        env["UV_CACHE_DIR"] = str(Path(os.environ[SDIST_CACHE_ENV]) / "uv")
    # uv installed into the kit's venv (pyproject extra "test") when not on PATH
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _has_cuda12(env: dict[str, str]) -> bool:
    from kvprefetch.machine.toolchain import nvcc_version
    from kvprefetch.overlay.toolkit import candidate_roots

    return any(nvcc_version(r / "bin" / "nvcc", env)[0] == 12 for r, _ in candidate_roots(env))


@pytest.fixture(scope="module")
def overlay(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            fetched_template: Path) -> Iterator[dict[str, Any]]:
    """The two-tree overlay build and its verify-kernel, once for the module. Its ~10 GB (two
    envs, each vLLM 0.10.2 with torch 2.8.0) go when the module's tests pass, as a passing
    test's tmp_path does (pyproject's retention policy); kept to read when one failed."""
    failed_before = request.session.testsfailed
    result = _overlay_build(tmp_path_factory, fetched_template)
    yield result
    if request.session.testsfailed == failed_before:
        shutil.rmtree(result["workdir"].parent, ignore_errors=True)


def _overlay_build(tmp_path_factory: pytest.TempPathFactory,
                   fetched_template: Path) -> dict[str, Any]:
    from kvprefetch.doctor.estimates import GIB, overlay_disk_gb, shares_one_install

    wd = tmp_path_factory.mktemp("overlay") / "work"
    env = _env()
    # The build's own preflight refuses a disk that cannot hold it (test_doctor tests that
    # refusal); a CI machine short of that disk cannot run these tests at all, and says so.
    shared, why = shares_one_install("uv", wd.parent, env)
    need, free = overlay_disk_gb(len(TREES), shared), shutil.disk_usage(wd.parent).free / GIB
    if free < need:
        pytest.skip(f"this machine cannot hold an overlay build: {free:.1f} GiB free at "
                    f"{wd.parent}, {need:.0f} GiB needed ({why})")
    shutil.copytree(fetched_template, wd, symlinks=True)
    res = kvprefetch_cli("apply", "--workdir", str(wd))
    assert res.returncode == 0, res.output
    argv = ["build", "--workdir", str(wd), "--mode", "overlay", "--arch", "9.0a",
            "--env-backend", "uv", "--trees", ",".join(TREES), "--head-sizes", "128",
            "--block-sizes", "16", "--kv-dtypes", "fp16"]
    t0 = time.monotonic()
    build = kvprefetch_cli_split(*argv, env=env, timeout=1800)
    took = time.monotonic() - t0
    t1 = time.monotonic()
    ver = kvprefetch_cli_split("verify-kernel", "--workdir", str(wd), "--json", env=env,
                               timeout=1200)
    return {"workdir": wd.resolve(), "env": env, "argv": argv, "build": build,
            "build_seconds": took, "verify": ver, "verify_seconds": time.monotonic() - t1}


def _checks(stdout: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["name"], c["tree"]): c for c in json.loads(stdout)["checks"]}


def _manifest(wd: Path, tree: str) -> dict[str, Any]:
    (path,) = wd.glob(f"build/{tree}/*/manifest.json")
    m: dict[str, Any] = json.loads(path.read_text())
    return m


def test_build_installs_vllm_and_the_plugin(overlay: dict[str, Any]) -> None:
    b = overlay["build"]
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-4000:]
    wd = overlay["workdir"]
    for tree in TREES:
        m = _manifest(wd, tree)
        assert m["mode"] == "overlay" and m["tree"] == tree
        assert m["installed"]["vllm"] == "0.10.2" and m["installed"]["torch"].startswith("2.8.0")
        assert m["installed"]["xformers"] == "0.0.32.post1"
        assert m["toolchain"]["torch_cuda"] == "12.8"
        assert m["toolchain"]["matches_torch_major"] is True
        assert m["toolchain"]["nvcc_version"].startswith("12.")
        if not _has_cuda12(overlay["env"]):
            # compiled with the toolkit assembled into the work directory, from pinned archives
            assert m["toolchain"]["cuda_home"] == str(wd / "toolkits" / "cuda-12.4.1")
            assert "assembled from pinned package archives" in m["toolchain"]["source"]
        assert m["toolchain"]["cudart"].endswith("libcudart.so.12")
        env = Path(m["env"]["path"])
        # beside the kernels-only env envs/<tree>, so either mode can follow the other
        assert env == wd / "envs" / f"{tree}-vllm"
        assert Path(m["so_path"]).is_relative_to(env)
        eps = list(env.glob("lib/python*/site-packages/kvprefetch_vllm_overlay-*.dist-info/"
                            "entry_points.txt"))
        assert eps and "kvprefetch = kvprefetch_overlay:register" in eps[0].read_text()
        cfg = json.loads(next(env.glob("lib/python*/site-packages/kvprefetch_overlay/"
                                       "overlay.json")).read_text())
        assert cfg["library"] == m["so_path"] and cfg["tree"] == tree


def test_verify_passes_with_routing_proven_in_each_env(overlay: dict[str, Any]) -> None:
    v = overlay["verify"]
    assert v.returncode == 0, v.stdout[-6000:] + v.stderr[-3000:]
    data = json.loads(v.stdout)
    checks = _checks(v.stdout)
    for tree in TREES:
        for name in (ROUTE, SPAWN, OFF, "UBLKPF in SASS", "library matches the build manifest"):
            assert checks[(name, tree)]["status"] == "pass", checks[(name, tree)]
        on = data["overlay"][tree]["on"]
        # vLLM's own loader ran the plugin, in this process and in the spawned child
        assert on["load_general_plugins"] == "ok" and on["plugin_state"]["routed"]
        assert on["child"]["load_general_plugins"] == "ok"
        assert on["child"]["pid"] != on["pid"]
        m = _manifest(overlay["workdir"], tree)
        for proc in (on, on["child"]):
            assert proc["routed_library"]["sha256"] == m["so_sha256"]
            assert proc["hits"] == [2, 2]
            assert {c[0] for c in proc["calls"]} == {
                "vllm._custom_ops.paged_attention_v1", "vllm._custom_ops.paged_attention_v2",
                "torch.ops._C.paged_attention_v1", "torch.ops._C.paged_attention_v2"}
        # before load_general_plugins() the child's dispatcher held vLLM's kernels
        assert all("torch_bindings.cpp" in s["registered_at"]
                   for s in on["child"]["before_plugins"].values())
        off = data["overlay"][tree]["off"]
        assert all("torch_bindings.cpp" in s["registered_at"] for s in off["dispatch"].values())
    # two environments, two different libraries
    assert checks[("environments load different libraries", "all")]["status"] == "pass"
    stub = data["overlay"]["patched"]["driver_stub"]
    if stub is not None:  # no NVIDIA driver here: what was not checked is said
        assert checks[("routed kernels run under vLLM on a GPU", "patched")]["status"] == \
            "not checked"


def test_bench_e2e_runs_vllm_bench_throughput_in_the_verified_envs(
        overlay: dict[str, Any]) -> None:
    """After verify passed, `bench e2e` plans `vllm bench throughput` (V0 + XFORMERS, dummy
    weights) with each overlay env's own python. Only the plan: running it needs a GPU."""
    wd, env = overlay["workdir"], overlay["env"]
    res = kvprefetch_cli_split("bench", "e2e", "--workdir", str(wd), "--dry-run", "--json",
                               "--max-num-seqs", "8", "--repeats", "1", env=env)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["refusal"] is None
    assert plan["environment"] == {"VLLM_USE_V1": "0", "VLLM_ATTENTION_BACKEND": "XFORMERS"}
    pythons = {run[0] for run in plan["runs"]}
    assert pythons == {_manifest(wd, t)["env"]["python"] for t in TREES}
    for run in plan["runs"]:
        assert run[1:6] == ["-I", "-m", "vllm.entrypoints.cli.main", "bench", "throughput"]
        assert run[run.index("--load-format") + 1] == "dummy"


def _overlay_json(wd: Path, tree: str) -> Path:
    env = Path(_manifest(wd, tree)["env"]["path"])
    return next(env.glob("lib/python*/site-packages/kvprefetch_overlay/overlay.json"))


def test_crossed_plugin_fails_verify_and_gates_bench(overlay: dict[str, Any]) -> None:
    """patched's plugin pointed at baseline's library: verify fails naming both sides, and
    bench e2e then refuses to run."""
    wd, env = overlay["workdir"], overlay["env"]
    cfg_path = _overlay_json(wd, "patched")
    saved = cfg_path.read_bytes()
    base_lib = _manifest(wd, "baseline")["so_path"]
    try:
        cfg = json.loads(saved)
        cfg["library"] = base_lib
        cfg_path.write_text(json.dumps(cfg))
        v = kvprefetch_cli_split("verify-kernel", "--workdir", str(wd), "--json", env=env,
                                 timeout=1200)
        assert v.returncode == 6, v.stdout[-3000:]
        row = _checks(v.stdout)[(ROUTE, "patched")]
        assert row["status"] == "fail"
        assert base_lib in row["detail"] and _manifest(wd, "patched")["so_path"] in row["detail"]
        assert "'baseline'" in row["detail"] and "'patched'" in row["detail"]
        assert _checks(v.stdout)[(SPAWN, "patched")]["status"] == "fail"
        assert _checks(v.stdout)[(ROUTE, "baseline")]["status"] == "pass"
        e2e = kvprefetch_cli("bench", "e2e", "--workdir", str(wd), env=env)
        assert e2e.returncode == 7 and "does not say passed" in e2e.output, e2e.output
    finally:
        cfg_path.write_bytes(saved)


def test_broken_plugin_fails_verify(overlay: dict[str, Any]) -> None:
    """A plugin whose module cannot be imported: vLLM only logs that (and would serve its stock
    kernels), so verify's routing check must fail, naming the failure. (Checked with verify's
    own probe and verdict on the patched env alone; the full command is exercised above.)"""
    from kvprefetch.overlay.driverstub import driver_loadable, ensure_stub
    from kvprefetch.overlay.verify import probe_overlay, routing_problems

    wd = overlay["workdir"]
    m = _manifest(wd, "patched")
    init = _overlay_json(wd, "patched").with_name("__init__.py")
    saved = init.read_bytes()
    stub = None
    if not driver_loadable():
        site = Path(m["so_path"]).parent.parent
        stub, _ = ensure_stub(next(site.glob("vllm/_C*.so")), wd / "verify" / "driver-stub")
    try:
        init.write_text(saved.decode() + "\nraise ImportError('deliberately broken')\n")
        probe = probe_overlay(m["env"]["python"], child=False, stub_dir=stub)
        problems = routing_problems("patched", m, probe)
        assert any("failed to load" in p and "deliberately broken" in p for p in problems), \
            problems
        # what vLLM was left with: its own kernels
        assert all("torch_bindings.cpp" in s["registered_at"]
                   for s in probe["dispatch"].values())
    finally:
        init.write_bytes(saved)
