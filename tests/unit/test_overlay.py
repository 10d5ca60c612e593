"""The overlay mode's pure parts and its plan, without installing vLLM: the plugin wheel,
the toolkit choice (refusals; with this machine's real nvcc in
tests/integration/test_overlay_toolkit.py), the symbol-list parsers behind the driver
stub and the libcudart check, and the routing verdict on recorded probe reports."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError
from kvprefetch.overlay.driverstub import driver_imports, stub_source
from kvprefetch.overlay.install import cudart_imports, install_argv, link_against
from kvprefetch.overlay.plugin import ENTRY_GROUP, TEMPLATE, write_plugin_wheel
from kvprefetch.overlay.toolkit import choose_toolkit
from kvprefetch.overlay.verify import routing_problems


def test_plugin_wheel_registers_the_entry_point(tmp_path: Path) -> None:
    cfg = {"tree": "patched", "namespace": "kvprefetch_patched", "library": "/x/_C.so"}
    whl = write_plugin_wheel(tmp_path, cfg)
    again = write_plugin_wheel(tmp_path / "again", cfg)
    assert whl.read_bytes() == again.read_bytes()  # deterministic
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert z.read(info).decode() == (f"[{ENTRY_GROUP}]\n"
                                          "kvprefetch = kvprefetch_overlay:register\n")
        assert json.loads(z.read("kvprefetch_overlay/overlay.json")) == cfg
        assert z.read("kvprefetch_overlay/__init__.py") == TEMPLATE.read_bytes()
        record = z.read(next(n for n in names if n.endswith("/RECORD"))).decode()
        for line in record.splitlines():
            path, digest, size = line.rsplit(",", 2)
            if not digest:
                continue
            data = z.read(path)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data)


def test_plugin_never_imports_kvprefetch() -> None:
    """The plugin runs in vLLM's environments, which do not have kvprefetch."""
    text = TEMPLATE.read_text()
    assert "import kvprefetch" not in text and "from kvprefetch" not in text


def test_explicit_cuda_home_without_nvcc_is_refused(tmp_path: Path,
                                                     base_environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as exc:
        choose_toolkit("12.8", base_environ, explicit=str(tmp_path), roots=[])
    assert str(tmp_path) in exc.value.cause


def test_symbol_parsers() -> None:
    nm = ("                 U cuPointerGetAttribute\n"
          "                 U cuTensorMapEncodeTiled\n"
          "                 U cudaGetLastError@libcudart.so.12\n"
          "                 U __cudaRegisterFatBinary@libcudart.so.12\n"
          "                 U _ZN3c105ErrorC1Ev\n")
    assert driver_imports(nm) == ["cuPointerGetAttribute", "cuTensorMapEncodeTiled"]
    assert cudart_imports(nm) == {"cudaGetLastError": "libcudart.so.12",
                                  "__cudaRegisterFatBinary": "libcudart.so.12"}
    src = stub_source(["cuA", "cuB"])
    assert "int cuA(void) { return 100; }" in src and "int cuB(void)" in src


def test_link_against_the_envs_cudart(tmp_path: Path) -> None:
    cudart = tmp_path / "libcudart.so.12"
    flags = ["-shared", "-L/t/lib", "-L/cuda/lib64", "-ltorch", "-lcudart"]
    out = link_against(flags, cudart, Path("/cuda"))
    assert "-lcudart" not in out and "-L/cuda/lib64" not in out and str(cudart) in out
    assert link_against(flags, None, Path("/cuda")) == flags


def test_install_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    # uv reads the file the user names (UV_CONFIG_FILE) itself; with none named and none found,
    # it is told to read none (machine/uvconfig.py: never a uv.toml above its folder)
    monkeypatch.setenv("UV_CONFIG_FILE", "/k/uv.toml")
    assert install_argv("uv", "/e/bin/python", "/k/uv", "vllm==0.10.2") == (
        "/k/uv", "pip", "install", "--python", "/e/bin/python", "vllm==0.10.2")
    for name in ("UV_CONFIG_FILE", "UV_NO_CONFIG", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent-home")
    monkeypatch.setenv("XDG_CONFIG_DIRS", "/nonexistent-xdg")
    if not Path("/etc/uv/uv.toml").is_file():
        assert install_argv("uv", "/e/bin/python", "/k/uv", "a") == (
            "/k/uv", "--no-config", "pip", "install", "--python", "/e/bin/python", "a")
    assert install_argv("venv", "/e/bin/python", None, "a") == (
        "/e/bin/python", "-m", "pip", "install", "a")
    with pytest.raises(ConfigError):
        install_argv("uv", "/e/bin/python", None, "a")


MANIFEST = {"so_path": "/w/envs/patched/site/kvprefetch_kernels/_C.so", "so_sha256": "a" * 64,
            "key": "k-patched"}


def _probe(lib_path: str, sha: str, tree: str, key: str) -> dict:
    site = "kvprefetch-overlay:" + lib_path
    return {"entry_point": "kvprefetch_overlay:register", "load_general_plugins": "ok",
            "plugin_state": {"routed": True, "mode": "on"}, "plugin_log_errors": [],
            "routed_library": {"path": lib_path, "sha256": sha,
                               "build_info": {"tree": tree, "key": key}},
            "mapped": [lib_path],
            "dispatch": {op: {"registered_at": site} for op in
                         ("paged_attention_v1", "paged_attention_v2")},
            "hits": [2, 2], "calls": [["x", "returned"]] * 4}


def test_routing_verdict() -> None:
    good = _probe(MANIFEST["so_path"], "a" * 64, "patched", "k-patched")
    assert routing_problems("patched", MANIFEST, good) == []
    crossed = _probe("/w/envs/baseline/site/kvprefetch_kernels/_C.so", "b" * 64, "baseline",
                     "k-baseline")
    (msg,) = routing_problems("patched", MANIFEST, crossed)
    assert "/w/envs/baseline/" in msg and MANIFEST["so_path"] in msg
    assert "'baseline'" in msg and "'patched'" in msg
    broken = dict(good, plugin_state={"routed": False, "mode": "on",
                                      "error": "FileNotFoundError: gone"},
                  routed_library=None, hits=None)
    assert any("failed to load" in p and "gone" in p
               for p in routing_problems("patched", MANIFEST, broken))
    filtered = dict(good, vllm_plugins_env="lora_filesystem_resolver")
    assert any("VLLM_PLUGINS" in p for p in routing_problems("patched", MANIFEST, filtered))
    missed = dict(good, hits=[1, 2])
    assert any("did not all reach" in p for p in routing_problems("patched", MANIFEST, missed))


def test_doctor_names_the_toolkit_libraries_a_full_configure_needs(
        tmp_path: Path, base_environ: dict[str, str]) -> None:
    """A full build's configure needs libcuda.so (a driver or the toolkit's stub) and
    libnvrtc.so. Checked on a toolkit-shaped directory with and without them (the files'
    presence is all the check reads), and on this machine's real toolkit."""
    from kvprefetch.doctor.probes import DoctorProbes
    from kvprefetch.doctor.tools import check_cuda_libs

    home = tmp_path / "cuda"
    (home / "lib64" / "stubs").mkdir(parents=True)
    env = dict(base_environ, CUDA_HOME=str(home))
    bad = check_cuda_libs(env, DoctorProbes())
    assert bad.status == "fail" and "libcuda.so" in bad.detail and "libnvrtc.so" in bad.detail
    assert "cuda-driver-dev" in (bad.fix or "") and "nvrtc" in (bad.fix or "")
    (home / "lib64" / "stubs" / "libcuda.so").write_bytes(b"")
    (home / "lib64" / "libnvrtc.so").write_bytes(b"")
    assert check_cuda_libs(env, DoctorProbes()).status == "ok"
    real = check_cuda_libs(base_environ, DoctorProbes())
    assert real.status in ("ok", "fail", "skip")
