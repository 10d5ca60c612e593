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
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, FetchError
from ..hashing import sha256_file
from ..reading import read_limited
from ..workspace import confine, ownership
from ..workspace.confine import write_file

DEPS_VARS = {"cutlass": "VLLM_CUTLASS_SRC_DIR", "flash-attention": "VLLM_FLASH_ATTN_SRC_DIR",
             "FlashMLA": "FLASH_MLA_SRC_DIR"}
# What a configure reads from each, to tell a usable directory from an empty one.
PROBE_FILES = {"cutlass": "include/cutlass/cutlass.h",
               "flash-attention": "csrc/cutlass/include/cutlass/cutlass.h",
               "FlashMLA": "csrc/cutlass/include/cutlass/cutlass.h"}
SUMS = "SHA256SUMS"
STAMP = ".kvprefetch-sha256"  # in an unpacked folder: the archive's sha256, written last
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
    """``file name -> sha256`` from a ``sha256sum`` listing (a regular file of at most 1 MiB;
    bytes that are not UTF-8 are a ConfigError, not a traceback)."""
    try:
        text = read_limited(path, 1 << 20).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not a sha256sum listing: {exc}", _FIX) from None
    out = {}
    for line in text.splitlines():
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
        if "/" in listed[0]:
            # a name with folders (`cutlass-/../../x.tar.gz`) put the unpacked tree, and the
            # build's VLLM_*_SRC_DIR, outside the work directory: the real build refused it as
            # a corrupt record with `fetch --repair`, which mends no SHA256SUMS, and the dry
            # run planned it (issue 41, the thirty-sixth hostile pass)
            raise ConfigError(f"{sums_path} lists {listed[0]!r} for {name}, not a file name "
                              f"in {deps_dir}", "list each archive by its own name, as "
                              "`sha256sum <name>-<commit12>.tar.gz` run in that folder "
                              "writes it")
        archive = deps_dir / listed[0]
        if not archive.is_file():
            raise ConfigError(f"{archive} is listed in {sums_path} but missing", _FIX)
        out[name] = DepArchive(name, archive, sums[listed[0]],
                               unpack_root / listed[0][: -len(".tar.gz")])
    return out


def unpack(dep: DepArchive, root: Path) -> Path:
    """Check the archive's sha256, then unpack it to ``dep.dest`` (inside the work directory
    ``root``), with a stamp holding the hash: a killed unpack is redone, a finished one kept.

    tarfile writes by path, so the archive is unpacked in a private folder outside the work
    directory (``ownership.private_dir``), then copied into a recorded temporary and moved into
    place relative to folders opened ``O_NOFOLLOW`` (``confine``); only a folder carrying the
    kit's stamp is ever replaced. Issue 41, the twelfth hostile pass: ``deps/`` planted as a
    link to a folder outside had its ``cutlass-<commit>/`` (the user's files in it) deleted and
    the archives unpacked there; an archive member outside its folder was a traceback."""
    confine.check_target(root, dep.dest, what="unpack into", family=FetchError)
    stamp = dep.dest / STAMP
    if os.path.lexists(dep.dest):
        try:
            kept = confine.read_file(root, stamp, limit=256, family=FetchError)
        except (OSError, ValueError):
            raise FetchError(f"{dep.dest} is in the way of unpacking {dep.archive.name}: it "
                             f"has no {STAMP}, so kvprefetch did not unpack it",
                             f"move {dep.dest} away (kvprefetch does not remove what it did "
                             "not make), then rerun") from None
        if kept.decode("utf-8", "replace").strip() == dep.sha256:
            return dep.dest
    got = sha256_file(dep.archive)
    if got != dep.sha256:
        raise FetchError(f"{dep.archive} has sha256 {got}, but SHA256SUMS says {dep.sha256}",
                         "replace the archive with the listed one (it is not unpacked)")
    confine.ensure_dir(dep.dest.parent, root=root, family=FetchError)
    tmp = dep.dest.with_name(f".{dep.dest.name}.tmp-{os.getpid()}")
    with ownership.private_dir("deps") as private:
        try:
            with tarfile.open(dep.archive) as tf:
                _extract(tf, private)
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise FetchError(f"{dep.archive} cannot be unpacked: {exc}",
                             "replace it with the listed archive of the dependency "
                             "(its members must stay inside its one top-level folder)") from None
        inner = private / dep.dest.name
        if inner.is_symlink() or not inner.is_dir():
            raise FetchError(f"{dep.archive} does not hold one top-level directory "
                             f"{dep.dest.name}/", _FIX)
        write_file(inner / STAMP, dep.sha256 + "\n", family=FetchError)
        with ownership.temporary(root, tmp, family=FetchError):
            confine.copy_tree(root, inner, tmp, family=FetchError)
            if os.path.lexists(dep.dest):  # the kit's own, with a stamp of another hash
                confine.remove_path(root, dep.dest, family=FetchError)
            confine.move_file(root, tmp, dep.dest, family=FetchError)
    return dep.dest


def _extract(tf: tarfile.TarFile, dest: Path) -> None:
    """``extractall`` with tarfile's ``data`` filter (Python >= 3.10.12 / 3.11.4: no member
    outside ``dest``, no link out, no device); before it, only folders and regular files with
    plain relative names are taken, the rest refused."""
    if hasattr(tarfile, "data_filter"):
        tf.extractall(dest, filter="data")
        return
    for m in tf.getmembers():  # pragma: no cover (an older Python)
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
            raise tarfile.TarError(f"member {m.name!r} is not a plain file or folder inside "
                                   "the archive's folder")
    tf.extractall(dest)  # pragma: no cover


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
            # not resolved: a deps/ planted as a link would have the unpack step (which reads
            # its folder from here) act behind it (issue 41, the twelfth hostile pass)
            out[var] = os.path.abspath(archives[name].dest)
        elif os.environ.get(var):
            out[var] = os.environ[var]
        else:
            missing.append(f"{p} ({var})")
    if missing:
        raise ConfigError("--deps-dir is missing: " + ", ".join(missing), _FIX)
    return out


def unpack_archives(deps_dir: Path, workdir: Path) -> list[Path]:
    """Unpack whatever ``deps_dir`` holds as archives (nothing for clone directories) into
    ``workdir``/deps; checks that each unpacked tree has what vLLM's configure reads."""
    unpack_root = Path(os.path.abspath(workdir)) / "deps"
    archives = find_archives(deps_dir, unpack_root) or {}
    done = []
    for name, dep in archives.items():
        if (deps_dir / name).is_dir():
            continue
        d = unpack(dep, unpack_root.parent)
        if not (d / PROBE_FILES[name]).is_file():
            raise FetchError(f"{d} has no {PROBE_FILES[name]} (its submodules are not filled in)",
                             _FIX)
        done.append(d)
    return done
