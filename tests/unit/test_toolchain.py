"""Tests for kvprefetch.machine.toolchain: arch parsing, gencode flags, nvcc discovery in a PATH
and the version gate. Real cmake, nvcc and cuobjdump, and the cross-check of the flags against
torch's own flag builder, are in tests/integration/test_toolchain.py (the unit layer has no
torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError
from kvprefetch.machine.toolchain import (
    CudaArch,
    check_nvcc_for_arch,
    cuda_home,
    default_jobs,
    find_nvcc,
    format_arch_list,
    gencode_flags,
    parse_arch_list,
    parse_nvcc_version,
)

# --------------------------------------------------------------------------- parsing

@pytest.mark.parametrize(("text", "expected"), [
    ("9.0a", [(9, 0, "a", False)]),
    ("8.0;9.0a", [(8, 0, "", False), (9, 0, "a", False)]),
    ("8.0 8.6 9.0+PTX", [(8, 0, "", False), (8, 6, "", False), (9, 0, "", True)]),
    ("8.0,9.0", [(8, 0, "", False), (9, 0, "", False)]),
    (" 9.0a ; 9.0a ", [(9, 0, "a", False)]),
    ("Hopper", [(9, 0, "", True)]),
    ("10.0a;12.0", [(10, 0, "a", False), (12, 0, "", False)]),
])
def test_parse_arch_list_good(text: str, expected: list[tuple[int, int, str, bool]]) -> None:
    got = parse_arch_list(text)
    assert [(a.major, a.minor, a.suffix, a.ptx) for a in got] == expected
    assert parse_arch_list(format_arch_list(got)) == got  # round trip


def test_arch_properties() -> None:
    a, b = parse_arch_list("9.0a;8.6+PTX")
    assert (a.sm, a.digits, a.label, a.spec) == ("90a", "90", "9.0a", "9.0a")
    assert (b.sm, b.label, b.spec) == ("86", "8.6", "8.6+PTX")
    assert a.has_bulk_prefetch and not b.has_bulk_prefetch
    assert a.base == CudaArch(9, 0)


@pytest.mark.parametrize("text", ["9.0x", "abc", "", "   ", "8.0a", "9.1", "90", "9.0;;x"])
def test_parse_arch_list_bad(text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arch_list(text)
    msg = exc.value.message
    assert "To fix:" in msg
    cause = msg.split("To fix:")[0]
    assert cause.strip()  # a one-line cause before the fix
    assert "9.0a" in msg.split("To fix:")[1]  # the fix names a valid example


def test_bad_arch_message_names_the_token() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arch_list("8.0;9.0x")
    assert "'9.0x'" in exc.value.cause and "\n" not in exc.value.cause


# --------------------------------------------------------------------------- gencode

def test_gencode_vllm_semantics_drops_a_and_ptx() -> None:
    assert gencode_flags(parse_arch_list("9.0a")) == ["-gencode=arch=compute_90,code=sm_90"]
    assert gencode_flags(parse_arch_list("8.0;9.0a;9.0+PTX")) == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"]


def test_gencode_torch_semantics() -> None:
    flags = gencode_flags(parse_arch_list("9.0a;8.0+PTX"), vllm_semantics=False)
    assert flags == ["-gencode=arch=compute_90a,code=sm_90a",
                     "-gencode=arch=compute_80,code=sm_80",
                     "-gencode=arch=compute_80,code=compute_80"]


def test_gencode_nothing_supported_is_an_error() -> None:
    with pytest.raises(ConfigError) as exc:
        gencode_flags(parse_arch_list("6.1"))
    assert "To fix:" in exc.value.message
    # With an older nvcc vLLM's list stops at 9.0, so 12.0 vanishes too.
    with pytest.raises(ConfigError):
        gencode_flags(parse_arch_list("12.0"), cuda_version=(12, 6, 0))
    assert gencode_flags(parse_arch_list("12.0")) == ["-gencode=arch=compute_120,code=sm_120"]


# --------------------------------------------------------------------------- nvcc

def test_parse_nvcc_version(nvcc_12_6_text: str) -> None:
    assert parse_nvcc_version(nvcc_12_6_text) == (12, 6, 85)
    assert parse_nvcc_version("Cuda compilation tools, release 12.8, V12.8.93") == (12, 8, 93)
    assert parse_nvcc_version("release 11.8") == (11, 8, 0)
    with pytest.raises(ConfigError):
        parse_nvcc_version("command not found")


def test_version_gates() -> None:
    with pytest.raises(ConfigError) as exc:
        check_nvcc_for_arch((11, 8, 89), parse_arch_list("9.0"))
    assert "PTX ISA 8.0" in exc.value.cause
    assert check_nvcc_for_arch((12, 4, 1), parse_arch_list("9.0a"))  # warns
    assert check_nvcc_for_arch((12, 8, 93), parse_arch_list("9.0a")) == ()
    with pytest.raises(ConfigError) as exc:
        check_nvcc_for_arch((13, 0, 88), parse_arch_list("7.0;9.0"), frozenset({"75", "90"}))
    assert "7.0" in exc.value.cause


def test_no_nvcc_anywhere(base_environ: dict[str, str], tmp_path: Path) -> None:
    # /usr/local/cuda exists here, so the fallback roots are emptied to model a machine without
    # any toolkit; PATH keeps only directories without nvcc.
    env = dict(base_environ, PATH=str(tmp_path))
    assert find_nvcc(env, fallback_roots=()) is None
    assert cuda_home(env, fallback_roots=()) is None
    # An explicit CUDA_HOME without nvcc is not silently bypassed.
    env["CUDA_HOME"] = str(tmp_path)
    assert find_nvcc(env) is None
    assert cuda_home(env) == tmp_path


def test_cuda_home_skips_wrapper_script(base_environ: dict[str, str], tmp_path: Path) -> None:
    """/usr/local/bin/nvcc here is a shell wrapper; torch's rule (dirname of dirname) would say
    CUDA_HOME=/usr/local. Ours must not return a directory that is no toolkit."""
    home = cuda_home(base_environ)
    if home is not None:
        assert (home / "bin" / "nvcc").is_file()
        assert (home / "include" / "cuda_runtime.h").is_file()


# --------------------------------------------------------------------------- jobs

@pytest.mark.parametrize(("cores", "mem", "archs", "expected"), [
    (2, 24.0, 1, (2, 1)),       # this CI machine: cores bound
    (16, 128.0, 1, (16, 1)),    # the H200 box: cores bound
    (64, 64.0, 1, (13, 1)),     # memory bound: (64 - 2) / 4.5
    (8, 4.0, 1, (1, 1)),        # tiny box: never zero
    (32, 256.0, 3, (32, 3)),    # several archs: nvcc threads split targets
])
def test_default_jobs(cores: int, mem: float, archs: int, expected: tuple[int, int]) -> None:
    assert default_jobs(cores, mem, n_archs=archs) == expected
