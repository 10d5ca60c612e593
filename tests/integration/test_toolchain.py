"""kvprefetch.machine.toolchain against real tools: the arch list cross-checked against vLLM's own
CMake function (run by cmake), the machine's real nvcc and cuobjdump, and a stand-in CUDA 12.6
nvcc (a toolkit this machine cannot have), and the gencode flags against torch's own flag builder.
Parsing and flags are in tests/unit/test_toolchain.py."""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError
from kvprefetch.machine.toolchain import (
    VLLM_SUPPORTED_ARCHS_CUDA_12_8,
    check_nvcc_for_arch,
    cuda_home,
    find_cuobjdump,
    find_nvcc,
    gencode_flags,
    nvcc_gpu_archs,
    nvcc_version,
    parse_arch_list,
    vllm_c_archs,
)
from kvprefetch.runner import run

REAL_NVCC = find_nvcc()


needs_nvcc = pytest.mark.skipif(REAL_NVCC is None, reason="no nvcc on this machine")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake on this machine")
@pytest.mark.parametrize("arch_list", [
    "9.0a", "9.0", "8.0;9.0a", "8.0 8.6 9.0+PTX", "7.5;6.1;9.0", "8.6;8.9;9.0;10.0a;12.0",
    "8.7;10.3;12.1",
])
def test_vllm_c_archs_matches_vllms_cmake(tmp_path: Path, arch_list: str,
                                          vllm_tree: Path) -> None:
    """Run vLLM's real ``cuda_archs_loose_intersection`` (cmake/utils.cmake of the 0.10.2
    sdist) and compare. The target list is what ``extract_unique_cuda_archs_ascending`` hands
    it: labels without +PTX, sorted, unique."""
    archs = parse_arch_list(arch_list)
    tgt = sorted({a.label for a in archs}, key=lambda s: (int(s.split(".")[0]),
                                                           int(s.split(".")[1].rstrip("a")), s))
    script = tmp_path / "t.cmake"
    script.write_text(
        "cmake_minimum_required(VERSION 3.20)\n"
        f"include({vllm_tree / 'cmake' / 'utils.cmake'})\n"
        'cuda_archs_loose_intersection(OUT "${SRC}" "${TGT}")\n'
        'message("RESULT=${OUT}")\n')
    done = run(["cmake", f"-DSRC={VLLM_SUPPORTED_ARCHS_CUDA_12_8}", f"-DTGT={';'.join(tgt)}",
                "-P", str(script)], echo=False)
    m = re.search(r"RESULT=(.*)", done.output)
    assert m is not None, done.output
    expected = [x for x in m.group(1).strip().split(";") if x]
    assert [a.label for a in vllm_c_archs(archs)] == expected


@needs_nvcc
def test_real_nvcc_version_matches_toolkit_layout() -> None:
    """The version nvcc prints agrees with the versioned toolkit directory it lives in
    (/usr/local/cuda-13.0 here), an independent source."""
    assert REAL_NVCC is not None
    version = nvcc_version(REAL_NVCC)
    real_root = Path(os.path.realpath(cuda_home() or "/nonexistent"))
    m = re.search(r"cuda-(\d+)\.(\d+)$", str(real_root))
    if m is None:
        pytest.skip(f"toolkit root {real_root} carries no version in its name")
    assert version[:2] == (int(m.group(1)), int(m.group(2)))


@needs_nvcc
def test_real_nvcc_passes_arch_check_for_9_0a() -> None:
    assert REAL_NVCC is not None
    version = nvcc_version(REAL_NVCC)
    supported = nvcc_gpu_archs(REAL_NVCC)
    assert supported is not None and "90" in supported
    warnings_ = check_nvcc_for_arch(version, parse_arch_list("9.0a"), supported)
    if version[:2] >= (12, 8):
        assert warnings_ == ()


def test_fake_cuda_12_6_nvcc_refused(make_fake_tool, nvcc_12_6_text: str,  # type: ignore[no-untyped-def]
                                     base_environ: dict[str, str]) -> None:
    """A fake nvcc: this machine has only CUDA 13.0, no real 12.6 toolkit to run."""
    fake = make_fake_tool("nvcc", nvcc_12_6_text)
    env = dict(base_environ, PATH=f"{fake.parent}{os.pathsep}{base_environ['PATH']}")
    nvcc = find_nvcc(env)
    assert nvcc is not None and nvcc == fake
    version = nvcc_version(nvcc, env)
    assert version == (12, 6, 85)
    with pytest.raises(ConfigError) as exc:
        check_nvcc_for_arch(version, parse_arch_list("9.0a"))
    assert "ptxas" in exc.value.cause and "12.6" in exc.value.cause
    assert "12.8" in (exc.value.fix or "")
    # Not a Hopper build: no FA3 Hopper kernels, so 12.6 only draws the < 12.8 warning.
    assert check_nvcc_for_arch(version, parse_arch_list("8.0"))


def test_find_cuobjdump(base_environ: dict[str, str]) -> None:
    tools = find_cuobjdump(base_environ)
    if tools is None:
        pytest.skip("no cuobjdump in CUDA_HOME, on PATH or in this interpreter's wheels")
    assert tools.cuobjdump.is_file()
    env = tools.environ(base_environ)
    if tools.nvdisasm is not None:
        assert shutil.which("nvdisasm", path=env["PATH"]) is not None
    done = run([str(tools.cuobjdump), "--version"], env=env, echo=False)
    assert "cuobjdump" in done.output


@pytest.mark.parametrize("arch_list", ["9.0a", "8.0;9.0+PTX", "8.6 9.0a+PTX", "Hopper"])
def test_torch_semantics_match_torch(arch_list: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compare with torch's own cpp_extension flag builder (the real thing, torch is here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about numpy on import here
        from torch.utils import cpp_extension
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    theirs = cpp_extension._get_cuda_arch_flags()
    ours = gencode_flags(parse_arch_list(arch_list), vllm_semantics=False)
    assert sorted(ours) == sorted(set(theirs))

