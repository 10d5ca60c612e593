"""The overlay mode's toolkit choice and its doctor row with this machine's real nvcc (the pure
parts of the overlay mode are in tests/unit/test_overlay.py; the real overlay build in
tests/integration/test_overlay.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprefetch.build.toolchain import nvcc_version
from kvprefetch.errors import ConfigError
from kvprefetch.overlay.toolkit import NVCC_WHEEL_NOTE, candidate_roots, choose_toolkit


def test_toolkit_choice_with_this_machines_nvcc(base_environ: dict[str, str]) -> None:
    """torch 2.8.0 is built for CUDA 12.8. With the machine's real toolkits: a CUDA 12 one is
    chosen where it exists; otherwise the build is refused with the reason (no CUDA 12 nvcc on
    the index) unless the mismatch is allowed, which is then recorded as such."""
    roots = candidate_roots(base_environ)
    if not roots:
        pytest.skip("no CUDA toolkit on this machine")
    versions = [nvcc_version(r / "bin" / "nvcc", base_environ) for r, _ in roots]
    if any(v[0] == 12 for v in versions):
        tk = choose_toolkit("12.8", base_environ)
        assert tk.matches and tk.version[0] == 12
        return
    with pytest.raises(ConfigError) as exc:
        choose_toolkit("12.8", base_environ)
    assert NVCC_WHEEL_NOTE in exc.value.cause and "--cuda-home" in (exc.value.fix or "")
    tk = choose_toolkit("12.8", base_environ, allow_mismatch=True)
    assert not tk.matches and "--allow-cuda-mismatch" in tk.why
    same = choose_toolkit(f"{versions[0][0]}.0", base_environ)
    assert same.matches and same.version == versions[0]


def test_doctor_overlay_mode_reports_the_toolkit(tmp_path: Path,
                                                 base_environ: dict[str, str]) -> None:
    from kvprefetch.doctor import DoctorProbes, run_doctor

    probes = DoctorProbes(index=lambda url, env: (True, f"{url} answered HTTP 200"))
    rep = run_doctor("9.0a", env=base_environ, workdir=tmp_path, mode="overlay", probes=probes,
                     allow_cuda_mismatch=True)
    names = [c.name for c in rep.checks]
    assert "toolkit" in names and "package-index" in names and "network" not in names
    tk = rep.check("toolkit")
    if tk.status != "skip":
        assert "nvcc" in tk.detail and ("major version" in tk.detail or "mismatch" in tk.detail)
