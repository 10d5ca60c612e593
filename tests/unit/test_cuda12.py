"""overlay/cuda12.py: assembling a CUDA 12 toolkit from pinned archives.

The real archives (113 MB from deb.debian.org and the package index) are used by the slow
overlay test (tests/test_overlay.py), which compiles the trees with the result. Here the
archives are small synthetic ones in the same formats -- a real ``ar`` archive holding a
``data.tar.xz`` and real wheels (zip) -- served from ``file://`` URLs, with their own sha256
pins, so that layout, hashing, locking and failure handling are checked in seconds. How the
assembled toolkit is chosen (its nvcc is run) is in tests/integration/test_overlay_toolkit.py."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from kvprefetch.errors import FetchError
from kvprefetch.overlay import cuda12
from kvprefetch.workspace import ownership


def _ar(members: dict[str, bytes]) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, body in members.items():
        out += (f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}".encode() + b"`\n")
        out += body + (b"\n" if len(body) % 2 else b"")
    return bytes(out)


def _deb(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo("./" + path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return _ar({"debian-binary": b"2.0\n", "control.tar.xz": b"", "data.tar.xz": buf.getvalue()})


def _wheel(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return buf.getvalue()


NVCC = b"#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n"


def synthetic_parts(tmp_path: Path) -> list[cuda12.Part]:
    """Synthetic stand-ins for the pinned archives, served from file:// URLs."""
    src = tmp_path / "archives"
    src.mkdir()
    deb = _deb({"usr/lib/nvidia-cuda-toolkit/bin/nvcc": NVCC,
                "usr/lib/nvidia-cuda-toolkit/bin/crt/link.stub": b"stub",
                "usr/lib/nvidia-cuda-toolkit/bin/cicc": b"cicc",
                "usr/bin/ptxas": b"ptxas", "usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc":
                b"bc", "usr/share/doc/x": b"not taken"})
    whl = _wheel({"nvidia/__init__.py": b"", "nvidia/cuda_runtime/include/__init__.py": b"",
                  "nvidia/cuda_runtime/include/cuda_runtime.h": b"// runtime",
                  "nvidia/cuda_runtime/lib/libcudart.so.12": b"ELF"})
    out = []
    for name, data, take in (
            ("t.deb", deb, (("usr/lib/nvidia-cuda-toolkit/bin/nvcc", "bin/nvcc"),
                            ("usr/lib/nvidia-cuda-toolkit/bin/crt/", "bin/crt/"),
                            ("usr/lib/nvidia-cuda-toolkit/bin/cicc", "nvvm/bin/cicc"),
                            ("usr/bin/ptxas", "bin/ptxas"),
                            ("usr/lib/nvidia-cuda-toolkit/libdevice/", "nvvm/libdevice/"))),
            ("r.whl", whl, (("nvidia/cuda_runtime/include/", "include/"),
                            ("nvidia/cuda_runtime/lib/libcudart.so.12",
                             "lib64/libcudart.so.12")))):
        (src / name).write_bytes(data)
        out.append(cuda12.Part(name, name, (src / name).as_uri(),
                               hashlib.sha256(data).hexdigest(), len(data), take))
    return out


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[cuda12.Part]:
    out = synthetic_parts(tmp_path)
    monkeypatch.setattr(cuda12, "PARTS", tuple(out))
    return out


def test_deb_reader_finds_the_data_member() -> None:
    deb = _deb({"usr/bin/nvcc": b"x"})
    with cuda12.deb_data_tar(deb) as tar:
        assert [m.name for m in tar.getmembers()] == ["./usr/bin/nvcc"]
    with pytest.raises(ValueError, match="not an ar archive"):
        cuda12.deb_data_tar(b"PK\x03\x04")
    with pytest.raises(ValueError, match=r"no data\.tar"):
        cuda12.deb_data_tar(_ar({"debian-binary": b"2.0\n"}))


def test_assembles_a_cuda_home_once(tmp_path: Path, parts: list[cuda12.Part]) -> None:
    wd = tmp_path / "work"
    wd.mkdir()
    said: list[str] = []
    root = cuda12.ensure_cuda12(wd, say=said.append)
    assert root == wd / "toolkits" / f"cuda-{cuda12.RELEASE}" and cuda12.is_assembled(root)
    assert (root / "bin" / "nvcc").read_bytes() == NVCC
    assert (root / "bin" / "nvcc").stat().st_mode & 0o111
    assert (root / "bin" / "crt" / "link.stub").read_bytes() == b"stub"
    assert (root / "nvvm" / "bin" / "cicc").is_file()
    assert (root / "nvvm" / "libdevice" / "libdevice.10.bc").is_file()
    assert (root / "include" / "cuda_runtime.h").is_file()
    assert not (root / "include" / "__init__.py").exists()  # wheel namespace files dropped
    assert (root / "lib64" / "libcudart.so").resolve() == (root / "lib64" / "libcudart.so.12")
    assert not (root / "share").exists() and not any(root.rglob("x"))  # only what is taken
    assert "$(TOP)/nvvm/libdevice" in (root / "bin" / "nvcc.profile").read_text()
    done = json.loads((root / cuda12.DONE_FILE).read_text())
    assert [p["sha256"] for p in done["parts"]] == [p.sha256 for p in parts]
    assert ownership.owned(wd, root) is not None  # clean may remove it
    assert len(said) == len(parts)
    # The second call neither downloads nor rebuilds.
    for p in parts:
        Path(p.url.removeprefix("file://")).unlink()
    said.clear()
    assert cuda12.ensure_cuda12(wd, say=said.append) == root and said == []


def test_wrong_hash_is_refused_and_nothing_is_placed(tmp_path: Path,
                                                     parts: list[cuda12.Part],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    wd = tmp_path / "work"
    wd.mkdir()
    bad = cuda12.Part(**{**parts[1].__dict__, "sha256": "0" * 64})
    monkeypatch.setattr(cuda12, "PARTS", (parts[0], bad))
    with pytest.raises(FetchError) as exc:
        cuda12.ensure_cuda12(wd)
    assert "expected " + "0" * 64 in exc.value.cause
    assert not (wd / "toolkits" / f"cuda-{cuda12.RELEASE}").exists()
    downloads = wd / "downloads" / f"cuda-{cuda12.RELEASE}"
    assert sorted(p.name for p in downloads.iterdir()) == [parts[0].filename]  # no partial


def test_unreachable_archive_names_the_url_and_the_way_out(tmp_path: Path,
                                                          parts: list[cuda12.Part],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    gone = cuda12.Part(**{**parts[0].__dict__, "url": (tmp_path / "nope.deb").as_uri()})
    monkeypatch.setattr(cuda12, "PARTS", (gone,))
    (tmp_path / "work").mkdir()
    with pytest.raises(FetchError) as exc:
        cuda12.ensure_cuda12(tmp_path / "work")
    assert "nope.deb" in exc.value.cause and "--cuda-home" in (exc.value.fix or "")


def test_a_failed_assembly_leaves_no_toolkit(tmp_path: Path, parts: list[cuda12.Part],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An archive whose layout lacks what is taken: refused, and neither the toolkit nor its
    temporary directory stays behind."""
    odd = cuda12.Part(**{**parts[1].__dict__, "take": (("nvidia/missing/", "include/"),)})
    monkeypatch.setattr(cuda12, "PARTS", (parts[0], odd))
    wd = tmp_path / "work"
    wd.mkdir()
    with pytest.raises(FetchError, match="has no nvidia/missing/"):
        cuda12.ensure_cuda12(wd)
    assert not (wd / "toolkits" / f"cuda-{cuda12.RELEASE}").exists()
    assert not [p for p in (wd / "toolkits").iterdir()]
    assert ownership.orphans(wd) == []
