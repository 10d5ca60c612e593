"""vLLM 0.10.2's three FetchContent dependencies given locally (``build --deps-dir D``), so a full
build needs no GitHub: either recursive clones ``D/cutlass``, ``D/flash-attention``,
``D/FlashMLA``, or hash-listed archives of them (``<name>-<commit prefix>.tar.gz`` plus
``SHA256SUMS``; the project's machines keep a copy in ``shared/deps/``), which are checked
against ``SHA256SUMS`` and unpacked once into ``<workdir>/deps/`` (each archive holds one
top-level directory named like the archive).

vLLM reads them from ``VLLM_CUTLASS_SRC_DIR``, ``VLLM_FLASH_ATTN_SRC_DIR`` and
``FLASH_MLA_SRC_DIR`` (research notes, section 2b)."""

from __future__ import annotations

import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, FetchError
from ..hashing import sha256_file

DEPS_VARS = {"cutlass": "VLLM_CUTLASS_SRC_DIR", "flash-attention": "VLLM_FLASH_ATTN_SRC_DIR",
             "FlashMLA": "FLASH_MLA_SRC_DIR"}
# What a configure reads from each, to tell a usable directory from an empty one.
PROBE_FILES = {"cutlass": "include/cutlass/cutlass.h",
               "flash-attention": "csrc/cutlass/include/cutlass/cutlass.h",
               "FlashMLA": "csrc/cutlass/include/cutlass/cutlass.h"}
SUMS = "SHA256SUMS"
_FIX = ("give --deps-dir a folder with recursive clones cutlass/ (NVIDIA, v4.0.0), "
        "flash-attention/ (vllm-project, ee4d25bd) and FlashMLA/ (vllm-project, a757314c), or "
        "with <name>-<commit12>.tar.gz archives of them plus SHA256SUMS (docs/building.md, "
        "'Offline full builds')")


@dataclass(frozen=True)
class DepArchive:
    name: str          # cutlass, flash-attention, FlashMLA
    archive: Path
    sha256: str        # from SHA256SUMS
    dest: Path         # where it is (to be) unpacked


def read_sums(path: Path) -> dict[str, str]:
    """``file name -> sha256`` from a ``sha256sum`` listing."""
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[1].lstrip("*")] = parts[0].lower()
    return out


def find_archives(deps_dir: Path, unpack_root: Path) -> dict[str, DepArchive] | None:
    """The three archives listed in ``deps_dir/SHA256SUMS``; None when ``deps_dir`` holds no
    such listing. A listed archive that is missing, or a name without exactly one archive, is a
    ConfigError."""
    sums_path = deps_dir / SUMS
    if not sums_path.is_file():
        return None
    sums = read_sums(sums_path)
    out = {}
    for name in DEPS_VARS:
        listed = sorted(f for f in sums if f.startswith(f"{name}-") and f.endswith(".tar.gz"))
        if len(listed) != 1:
            raise ConfigError(f"{sums_path} lists {len(listed)} archives for {name} "
                              f"({', '.join(listed) or 'none'})", _FIX)
        archive = deps_dir / listed[0]
        if not archive.is_file():
            raise ConfigError(f"{archive} is listed in {sums_path} but missing", _FIX)
        out[name] = DepArchive(name, archive, sums[listed[0]],
                               unpack_root / listed[0][: -len(".tar.gz")])
    return out


def unpack(dep: DepArchive) -> Path:
    """Check the archive's sha256, then unpack it to ``dep.dest`` (through a temp dir renamed
    into place, with a stamp holding the hash: a killed unpack is redone, a finished one kept)."""
    stamp = dep.dest / ".kvprefetch-sha256"
    if stamp.is_file() and stamp.read_text().strip() == dep.sha256:
        return dep.dest
    got = sha256_file(dep.archive)
    if got != dep.sha256:
        raise FetchError(f"{dep.archive} has sha256 {got}, but SHA256SUMS says {dep.sha256}",
                         "replace the archive with the listed one (it is not unpacked)")
    tmp = dep.dest.with_name(f".{dep.dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(dep.archive) as tf:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tf.extractall(tmp, filter="data")
        else:  # pragma: no cover
            tf.extractall(tmp)  # the archive's sha256 was checked above
    inner = tmp / dep.dest.name
    if not inner.is_dir():
        raise FetchError(f"{dep.archive} does not hold one top-level directory "
                         f"{dep.dest.name}/", _FIX)
    (inner / ".kvprefetch-sha256").write_text(dep.sha256 + "\n")
    shutil.rmtree(dep.dest, ignore_errors=True)
    os.rename(inner, dep.dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dep.dest


def deps_env(deps_dir: Path, unpack_root: Path) -> dict[str, str]:
    """The three variables for ``deps_dir``: clone directories as they are, or where the
    archives are unpacked (``unpack_archives`` does it). An unset one may come from the
    environment; anything else missing is a ConfigError naming it."""
    archives = find_archives(deps_dir, unpack_root)
    out: dict[str, str] = {}
    missing = []
    for name, var in DEPS_VARS.items():
        p = deps_dir / name
        if p.is_dir():
            out[var] = str(p.resolve())
        elif archives is not None:
            out[var] = str(archives[name].dest.resolve())
        elif os.environ.get(var):
            out[var] = os.environ[var]
        else:
            missing.append(f"{p} ({var})")
    if missing:
        raise ConfigError("--deps-dir is missing: " + ", ".join(missing), _FIX)
    return out


def unpack_archives(deps_dir: Path, unpack_root: Path) -> list[Path]:
    """Unpack whatever ``deps_dir`` holds as archives (nothing for clone directories); checks
    that each unpacked tree has what vLLM's configure reads."""
    archives = find_archives(deps_dir, unpack_root) or {}
    done = []
    for name, dep in archives.items():
        if (deps_dir / name).is_dir():
            continue
        d = unpack(dep)
        if not (d / PROBE_FILES[name]).is_file():
            raise FetchError(f"{d} has no {PROBE_FILES[name]} (its submodules are not filled in)",
                             _FIX)
        done.append(d)
    return done
