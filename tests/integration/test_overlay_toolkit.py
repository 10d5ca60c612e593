"""The overlay mode's toolkit choice and its doctor row with this machine's real nvcc (the pure
parts of the overlay mode are in tests/unit/test_overlay.py; the real overlay build in
tests/integration/test_overlay.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError
from kvprefetch.machine.toolchain import nvcc_version
from kvprefetch.overlay import cuda12
from kvprefetch.overlay.toolkit import (
    ASSEMBLED,
    NVCC_WHEEL_NOTE,
    candidate_roots,
    choose_toolkit,
)
from tests.unit.test_cuda12 import synthetic_parts


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
    from kvprefetch.doctor.preflight import run_doctor
    from kvprefetch.doctor.probes import DoctorProbes
    from kvprefetch.overlay.cuda12 import DEBIAN_MIRROR

    probes = DoctorProbes(index=lambda url, env: (True, f"{url} answered HTTP 200"))
    rep = run_doctor("9.0a", env=base_environ, workdir=tmp_path, mode="overlay", probes=probes)
    names = [c.name for c in rep.checks]
    assert "toolkit" in names and "package-index" in names and "network" not in names
    tk = rep.check("toolkit")
    has12 = any(nvcc_version(r / "bin" / "nvcc", base_environ)[0] == 12
                for r, _ in candidate_roots(base_environ))
    if has12:
        assert tk.status == "ok" and "major version" in tk.detail
    else:  # the build would assemble CUDA 12.4.1; doctor says so and where, without downloading
        assert tk.status == "ok" and "assemble CUDA 12.4.1" in tk.detail
        assert str(tmp_path / "toolkits" / "cuda-12.4.1") in tk.detail
        assert not (tmp_path / "toolkits").exists()
        # With the archives' mirror unreachable and no mismatch allowed: a failure naming it.
        down = DoctorProbes(index=lambda url, env: (url != DEBIAN_MIRROR, f"{url}: refused"))
        rep2 = run_doctor("9.0a", env=base_environ, workdir=tmp_path, mode="overlay",
                          probes=down)
        assert rep2.check("toolkit").status == "fail"
        assert DEBIAN_MIRROR in rep2.check("toolkit").detail


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[cuda12.Part]:
    out = synthetic_parts(tmp_path)
    monkeypatch.setattr(cuda12, "PARTS", tuple(out))
    return out


def test_choose_toolkit_assembles_only_when_the_machine_has_no_cuda12(
        tmp_path: Path, parts: list[cuda12.Part], base_environ: dict[str, str]) -> None:
    """No CUDA 12 among the candidates: the assembled toolkit is built and chosen (and matches
    torch's major); an existing assembled toolkit is found without assembling again; an
    explicit --cuda-home is never replaced by it."""
    wd = tmp_path / "work"
    wd.mkdir()
    calls: list[int] = []

    def assemble() -> Path:
        calls.append(1)
        return cuda12.ensure_cuda12(wd)

    tk = choose_toolkit("12.8", base_environ, roots=[], assemble=assemble,
                        assembled=cuda12.toolkit_dir(wd))
    assert tk.matches and tk.version == (12, 4, 131) and ASSEMBLED in tk.source
    assert tk.cuda_home == str(cuda12.toolkit_dir(wd)) and calls == [1]
    again = choose_toolkit("12.8", base_environ, roots=[], assemble=assemble,
                           assembled=cuda12.toolkit_dir(wd))
    assert again.cuda_home == tk.cuda_home and calls == [1]
    with pytest.raises(Exception, match="--cuda-home"):
        choose_toolkit("12.8", base_environ, explicit=str(tmp_path / "none"), roots=[],
                       assemble=assemble, assembled=cuda12.toolkit_dir(wd))
    assert calls == [1]
