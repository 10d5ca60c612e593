"""Tests for kvprefetch.doctor and the ``doctor`` command: real nvcc compiles, real tools and a
real local HTTP server; fakes only for what this machine cannot have (a CUDA 12.6 toolkit, a
GPU, a full disk, an unreachable GitHub when it happens to be reachable)."""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvprefetch.cli.doctor import doctor
from kvprefetch.doctor.estimates import GIB
from kvprefetch.doctor.preflight import run_doctor
from kvprefetch.doctor.probes import DoctorProbes, check_url
from kvprefetch.errors import ConfigError
from kvprefetch.machine.toolchain import find_cuobjdump, find_nvcc
from kvprefetch.runner import run, which

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this machine")


def offline(_env: Mapping[str, str]) -> tuple[bool, str]:
    return False, "simulated: github.com unreachable"


def never_called(_env: Mapping[str, str]) -> tuple[bool, str]:
    raise AssertionError("the network must not be probed here")


@needs_nvcc
def test_kernels_only_preflight_passes_with_real_nvcc(tmp_path: Path,
                                                       base_environ: dict[str, str]) -> None:
    rep = run_doctor("9.0a", env=base_environ, workdir=tmp_path, mode="kernels-only",
                     probes=DoctorProbes(network=never_called))
    assert rep.ok, [c for c in rep.checks if c.status == "fail"]
    nvcc, comp = rep.check("nvcc"), rep.check("nvcc-compile")
    assert nvcc.status in ("ok", "warn")
    assert comp.status == "ok" and "sm_90" in comp.detail
    if find_cuobjdump(base_environ) is not None:
        assert re.search(r"SASS holds [1-9]\d* UBLKPF", comp.detail)
    assert rep.check("cmake").status == "skip"
    assert rep.check("network").status == "skip"
    rep.raise_if_failed()  # does not raise


@needs_nvcc
def test_mixed_arch_list_compiles_both_guard_paths(tmp_path: Path,
                                                   base_environ: dict[str, str]) -> None:
    rep = run_doctor("8.0;9.0a", env=base_environ, workdir=tmp_path, mode="kernels-only")
    comp = rep.check("nvcc-compile")
    assert comp.status == "ok", comp
    assert "sm_80" in comp.detail and "sm_90" in comp.detail


@needs_nvcc
def test_pre_hopper_only_warns(tmp_path: Path, base_environ: dict[str, str]) -> None:
    comp = run_doctor("8.0", env=base_environ, workdir=tmp_path,
                      mode="kernels-only").check("nvcc-compile")
    assert comp.status == "warn" and "9.0a" in (comp.fix or "")


def test_fake_cuda_12_6_nvcc_is_refused(tmp_path: Path, base_environ: dict[str, str],
                                        make_fake_tool, nvcc_12_6_text: str) -> None:  # type: ignore[no-untyped-def]
    """A fake nvcc: there is no real CUDA 12.6 toolkit on this machine (it has 13.0)."""
    fake = make_fake_tool("nvcc", nvcc_12_6_text)
    env = dict(base_environ, PATH=f"{fake.parent}{os.pathsep}{base_environ['PATH']}")
    rep = run_doctor("9.0a", env=env, workdir=tmp_path, mode="kernels-only")
    nvcc = rep.check("nvcc")
    assert nvcc.status == "fail"
    assert "12.6" in nvcc.detail and "ptxas" in nvcc.detail and str(fake) in nvcc.detail
    assert rep.check("nvcc-compile").status == "skip"
    with pytest.raises(ConfigError) as exc:
        rep.raise_if_failed()
    msg = exc.value.message
    assert "ptxas" in msg and "To fix:" in msg and "12.8" in msg.split("To fix:")[1]


def test_no_nvcc_is_a_clear_failure(tmp_path: Path, base_environ: dict[str, str]) -> None:
    # PATH keeps the host compiler and git but no nvcc; /usr/local/cuda exists on this machine,
    # so the fallback toolkit roots are emptied to model one without any CUDA toolkit.
    path = os.pathsep.join(d for d in ("/usr/bin", "/bin")
                           if not Path(d, "nvcc").exists())
    env = dict(base_environ, PATH=path)
    rep = run_doctor("9.0a", env=env, workdir=tmp_path, mode="kernels-only",
                     probes=DoctorProbes(cuda_roots=()))
    nvcc = rep.check("nvcc")
    assert nvcc.status == "fail" and "nvcc not found" in nvcc.detail
    assert "CUDA_HOME" in (nvcc.fix or "")
    assert rep.check("cuda-home").status == "fail"
    with pytest.raises(ConfigError) as exc:
        rep.raise_if_failed()
    assert "nvcc" in exc.value.cause and "To fix:" in exc.value.message


def test_precompiled_is_refused(tmp_path: Path, base_environ: dict[str, str]) -> None:
    env = dict(base_environ, VLLM_USE_PRECOMPILED="1")
    rep = run_doctor("9.0a", env=env, workdir=tmp_path, mode="kernels-only")
    assert rep.check("precompiled").status == "fail"
    with pytest.raises(ConfigError) as exc:
        rep.raise_if_failed()
    assert "VLLM_USE_PRECOMPILED=1" in exc.value.cause and "unset" in (exc.value.fix or "")


def test_bad_arch_fails_with_fix(tmp_path: Path, base_environ: dict[str, str]) -> None:
    rep = run_doctor("9.0x", env=base_environ, workdir=tmp_path, mode="kernels-only")
    arch = rep.check("arch")
    assert arch.status == "fail" and "'9.0x'" in arch.detail and "9.0a" in (arch.fix or "")
    assert rep.check("nvcc-compile").status == "skip"


def test_simulated_full_disk(tmp_path: Path, base_environ: dict[str, str]) -> None:
    rep = run_doctor("9.0a", env=base_environ, workdir=tmp_path, mode="kernels-only",
                     probes=DoctorProbes(disk_free=lambda p: 0.3 * GIB))
    # below the kernels-only estimate (0.5 GB: doctor.estimates.DISK_ESTIMATE_GB)
    disk = rep.check("disk")
    assert disk.status == "fail" and "0.3 GiB free" in disk.detail
    assert "--workdir" in (disk.fix or "")
    with pytest.raises(ConfigError, match="disk"):
        rep.raise_if_failed()


def test_a_read_only_work_directory_disk_is_named_with_its_own_fix(
        tmp_path: Path, base_environ: dict[str, str]) -> None:
    """A work directory on a tmpfs remounted read-only (a real mount: root only): the disk
    line said "0.3 GiB free ... needs about 0.5 GiB" with a fix about space, or "ok" where the
    read-only disk had room, and nothing said the build could not write there (issue 41, the
    fifteenth hostile pass left it open)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(ro)],
                      check=False, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        rep = run_doctor("9.0a", env=base_environ, workdir=ro / "work", mode="kernels-only",
                         probes=DoctorProbes(disk_free=lambda p: 100 * GIB))
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    disk = rep.check("disk")
    assert disk.status == "fail", disk
    assert "read-only file system" in disk.detail, disk.detail
    assert "remount" in (disk.fix or "") and "--workdir" in (disk.fix or ""), disk.fix
    assert not (ro / "work").exists()


def test_overlay_disk_counts_one_install_where_uv_links_from_its_cache(
        tmp_path: Path, base_environ: dict[str, str]) -> None:
    """The real uv names its cache (``uv cache dir``). With that cache on the work directory's
    disk, the environments hard-link from one install, so 15 GiB free (a simulated free-space
    figure: filling this disk is not possible here) is enough for two environments. Where each
    environment holds its own copy (UV_LINK_MODE=copy, or pip's venv) it is not, nor for uv
    with three environments' worth of copies."""
    env = dict(base_environ, UV_CACHE_DIR=str(tmp_path / "uv-cache"))
    probes = DoctorProbes(disk_free=lambda p: 15 * GIB,
                          index=lambda url, e: (True, "simulated: index reachable"))

    def disk(environ: dict[str, str], backend: str, envs: int = 2) -> Any:
        return run_doctor("9.0a", env=environ, workdir=tmp_path / "work", mode="overlay",
                          probes=probes, env_backend=backend, envs=envs).check("disk")

    shared = disk(env, "uv")
    assert shared.status != "fail", shared.detail
    assert "hard-links" in shared.detail and str(tmp_path / "uv-cache") in shared.detail
    for environ, backend in ((dict(env, UV_LINK_MODE="copy"), "uv"), (env, "venv")):
        copied = disk(environ, backend)
        assert copied.status == "fail" and "--workdir" in (copied.fix or ""), copied.detail
    # one install however many environments link to it
    assert disk(env, "uv", envs=3).status == shared.status


def test_real_free_space_against_a_larger_estimate(tmp_path: Path,
                                                   base_environ: dict[str, str]) -> None:
    """The real free-space query against an estimate 1000 GiB above what this disk has."""
    import shutil

    free_gib = shutil.disk_usage(tmp_path).free / GIB
    probes = DoctorProbes(disk_estimate_gb={"full": free_gib + 1000, "kernels-only": 0.001})
    work = tmp_path / "not" / "yet" / "made"  # measured at its nearest existing parent
    assert run_doctor("9.0a", env=base_environ, workdir=work, mode="full", probes=probes,
                      need_network=False).check("disk").status == "fail"
    assert run_doctor("9.0a", env=base_environ, workdir=work, mode="kernels-only",
                      probes=probes).check("disk").status == "ok"


def test_full_mode_without_network_names_offline_options(tmp_path: Path,
                                                          base_environ: dict[str, str]) -> None:
    rep = run_doctor("9.0a", env=base_environ, workdir=tmp_path, mode="full",
                     probes=DoctorProbes(network=offline))
    net = rep.check("network")
    assert net.status == "fail"
    for name in ("--deps-dir", "VLLM_CUTLASS_SRC_DIR", "VLLM_FLASH_ATTN_SRC_DIR",
                 "FLASH_MLA_SRC_DIR"):
        assert name in (net.fix or "")
    assert not rep.ok


def test_full_mode_with_local_deps_needs_no_network(tmp_path: Path,
                                                    base_environ: dict[str, str]) -> None:
    env = dict(base_environ)
    for var in ("VLLM_CUTLASS_SRC_DIR", "VLLM_FLASH_ATTN_SRC_DIR", "FLASH_MLA_SRC_DIR"):
        (tmp_path / var).mkdir()
        env[var] = str(tmp_path / var)
    rep = run_doctor("9.0a", env=env, workdir=tmp_path, mode="full",
                     probes=DoctorProbes(network=never_called))
    assert rep.check("network").status == "skip"
    env["FLASH_MLA_SRC_DIR"] = str(tmp_path / "missing")
    rep = run_doctor("9.0a", env=env, workdir=tmp_path, mode="full",
                     probes=DoctorProbes(network=offline))
    assert rep.check("deps-dirs").status == "fail"


def test_cmake_version_gate_with_real_cmake(tmp_path: Path, base_environ: dict[str, str]) -> None:
    if which("cmake", base_environ) is None:
        pytest.skip("no cmake here")
    out = run(["cmake", "--version"], env=base_environ, echo=False).output
    m = re.search(r"cmake version (\d+)\.(\d+)\.(\d+)", out)
    assert m is not None
    real = tuple(int(x) for x in m.groups())
    check = run_doctor("9.0a", env=base_environ, workdir=tmp_path, mode="full",
                       need_network=False).check("cmake")
    if real >= (3, 26, 1):
        assert check.status == "ok"
    else:
        assert check.status == "fail" and 'pip install "cmake>=3.26.1"' in (check.fix or "")
        assert ".".join(map(str, real)) in check.detail


@pytest.mark.parametrize(("smi_line", "status"), [
    ("9.0, NVIDIA H200", "ok"),
    ("8.0, NVIDIA A100-SXM4-80GB", "warn"),
])
def test_gpu_compute_capability(tmp_path: Path, base_environ: dict[str, str], make_fake_tool,  # type: ignore[no-untyped-def]
                                smi_line: str, status: str) -> None:
    """A fake nvidia-smi: this machine has no GPU. The parsing and comparison are real."""
    fake = make_fake_tool("nvidia-smi", smi_line)
    env = dict(base_environ, PATH=f"{fake.parent}{os.pathsep}{base_environ['PATH']}")
    gpu = run_doctor("9.0a", env=env, workdir=tmp_path, mode="kernels-only").check("gpu")
    assert gpu.status == status, gpu
    assert smi_line.split(", ")[1] in gpu.detail


def test_no_gpu_is_skipped(tmp_path: Path, base_environ: dict[str, str]) -> None:
    if which("nvidia-smi", base_environ):
        pytest.skip("this machine has nvidia-smi")
    gpu = run_doctor("9.0a", env=base_environ, workdir=tmp_path, mode="kernels-only").check("gpu")
    assert gpu.status == "skip" and "no GPU" in gpu.detail


@pytest.fixture
def local_http() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_check_url_real_server_and_closed_port(local_http: str) -> None:
    ok, detail = check_url(local_http, timeout=5, environ={})
    assert ok and "HTTP" in detail
    with socket.socket() as s:  # a port that nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ok, detail = check_url(f"http://127.0.0.1:{port}/", timeout=2, environ={})
    assert not ok and "unreachable" in detail


@needs_nvcc
def test_doctor_command_json(tmp_path: Path, base_environ: dict[str, str]) -> None:
    runner = CliRunner()
    res = runner.invoke(doctor, ["--kernels-only", "--json", "--workdir", str(tmp_path)],
                        env={k: None for k in ("VLLM_USE_PRECOMPILED", "PYTHONPATH")})
    data = json.loads(res.stdout)
    assert data["mode"] == "kernels-only" and data["arch_list"] == "9.0a"
    assert {c["name"] for c in data["checks"]} >= {"nvcc", "nvcc-compile", "disk", "gpu"}
    assert (res.exit_code == 0) == data["ok"]
    bad = runner.invoke(doctor, ["--kernels-only", "--json", "--workdir", str(tmp_path)],
                        env={"VLLM_USE_PRECOMPILED": "1"})
    data = json.loads(bad.stdout)
    assert bad.exit_code == ConfigError.exit_code and data["ok"] is False
    assert [c["name"] for c in data["checks"] if c["status"] == "fail"] == ["precompiled"]


@needs_nvcc
def test_doctor_command_table(tmp_path: Path) -> None:
    res = CliRunner().invoke(doctor, ["--kernels-only", "--workdir", str(tmp_path)],
                             env={"VLLM_USE_PRECOMPILED": "1"})
    assert res.exit_code == ConfigError.exit_code
    assert "precompiled" in res.stdout and "nvcc-compile" in res.stdout


@needs_nvcc
def test_plain_doctor_checks_the_mode_plain_build_would_build(
        tmp_path: Path, base_environ: dict[str, str]) -> None:
    """`doctor` defaults to `--mode auto`, resolved as `build --mode auto` resolves it
    (choose_mode), and says which mode it checked and why: right after a kernels-only main job
    it no longer fails the full build's checks."""
    from kvprefetch.doctor.mode import choose_mode

    no_gpu = DoctorProbes(network=offline, gpus=lambda _env: [])
    auto = choose_mode("auto", "9.0a", env=base_environ, workdir=tmp_path, probes=no_gpu)
    assert auto.mode == "kernels-only" and auto.reason.startswith("--mode auto: no full build")
    assert "network" in auto.reason and auto.full_report is not None
    assert choose_mode("overlay", "9.0a").reason == "--mode overlay"
    res = CliRunner().invoke(doctor, ["--json", "--workdir", str(tmp_path)],
                             env={k: None for k in ("VLLM_USE_PRECOMPILED", "PYTHONPATH")})
    data = json.loads(res.stdout)
    here = choose_mode("auto", "9.0a", workdir=tmp_path)
    # the reason may quote free disk space, which anything else writing to the disk between
    # the two calls changes: compared with its figures masked
    def masked(reason: str) -> str:
        return re.sub(r"\d+(\.\d+)?", "#", reason)

    assert (data["mode"], masked(data["mode_reason"])) == (here.mode, masked(here.reason))
    table = CliRunner().invoke(doctor, ["--workdir", str(tmp_path)])
    assert f"checking the {here.mode} build (--mode auto: " in table.stderr
