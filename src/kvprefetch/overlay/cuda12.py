"""A CUDA 12 compiler for overlay builds on machines that have none, assembled from package
archives, every one pinned by sha256.

Why it is needed: an overlay environment's torch 2.8.0 is built for CUDA 12.8, so the tree's
kernels should be compiled by a CUDA 12 ``nvcc`` (``toolkit.py`` says why the major version
matters). PyPI has no CUDA 12 compiler: the ``nvidia-cuda-nvcc-cu12`` wheels hold ``ptxas``,
``libnvvm`` and the ``crt`` headers, but no ``nvcc``, ``cicc``, ``cudafe++`` or ``fatbinary``.
Debian does publish one: trixie's ``non-free`` ``nvidia-cuda-toolkit`` 12.4.131 is NVIDIA's CUDA
12.4.1 compiler, redistributed. So the kit takes, all from release 12.4.1:

- from that ``.deb``: ``nvcc``, ``cicc``, ``cudafe++``, ``fatbinary``, ``nvlink``, ``ptxas``,
  ``bin2c``, ``cuobjdump``, the link stubs and ``libdevice``;
- from PyPI: ``nvidia-cuda-runtime-cu12`` 12.4.127 (the runtime headers and
  ``libcudart.so.12``), ``nvidia-cuda-nvcc-cu12`` 12.4.131 (the ``crt/`` headers) and
  ``nvidia-cuda-cccl-cu12`` 12.4.127.post1 (libcu++, CUB, Thrust: ``nv/target``);

and lays them out as an ordinary ``CUDA_HOME`` (``bin/``, ``nvvm/``, ``include/``, ``lib64/``)
with an ``nvcc.profile`` of its own, under ``<workdir>/toolkits/cuda-12.4.1``.

What it is not: a whole toolkit. It has no static runtime (``libcudart_static.a``,
``libcudadevrt.a``), so ``nvcc`` cannot link executables with it; the overlay build only compiles
objects with it and links with the host compiler against the environment's own
``libcudart.so.12``. Library headers (cuBLAS, cuSPARSE, ...) that torch's headers include come
from the environment's own ``nvidia-*-cu12`` wheels, as torch's extension builds do.

The ``.deb`` is read with the standard library (an ``ar`` archive holding ``data.tar.xz``); the
format is three fixed-width header fields, so no dependency is worth adding for it."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FetchError
from ..hashing import sha256_file_of_size
from ..oserrors import local_write_failure
from ..sources.download import (
    NETWORK_ERRORS,
    copy_bounded,
    network_error_text,
    open_url,
    pinned_bytes,
)
from ..workspace import ownership
from ..workspace.confine import (
    check_target,
    ensure_dir,
    is_plain_file,
    move_file,
    open_dir,
    open_new,
    remove_path,
    write_file,
)
from ..workspace.locks import locked

RELEASE = "12.4.1"
DEBIAN_MIRROR = os.environ.get("KVPREFETCH_DEBIAN_MIRROR", "https://deb.debian.org/debian")
# Written last into the assembled directory: its presence means the assembly completed.
DONE_FILE = ".kvprefetch-toolkit.json"


@dataclass(frozen=True)
class Part:
    """One pinned archive and what the toolkit takes from it (archive path -> toolkit path;
    a path ending in ``/`` copies a whole directory)."""

    name: str
    filename: str
    url: str          # the .deb's URL; for a wheel, its project on the package index
    sha256: str
    size: int
    take: tuple[tuple[str, str], ...]


_DEB_BIN = "usr/lib/nvidia-cuda-toolkit/bin"
PARTS: tuple[Part, ...] = (
    Part("nvidia-cuda-toolkit (Debian trixie non-free)",
         "nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb",
         f"{DEBIAN_MIRROR}/pool/non-free/n/nvidia-cuda-toolkit/"
         "nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb",
         "cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319", 87240108,
         ((f"{_DEB_BIN}/nvcc", "bin/nvcc"), (f"{_DEB_BIN}/crt/", "bin/crt/"),
          (f"{_DEB_BIN}/cicc", "nvvm/bin/cicc"),
          ("usr/bin/cudafe++", "bin/cudafe++"), ("usr/bin/fatbinary", "bin/fatbinary"),
          ("usr/bin/nvlink", "bin/nvlink"), ("usr/bin/ptxas", "bin/ptxas"),
          ("usr/bin/bin2c", "bin/bin2c"), ("usr/bin/cuobjdump", "bin/cuobjdump"),
          ("usr/bin/nvdisasm", "bin/nvdisasm"),
          ("usr/lib/nvidia-cuda-toolkit/libdevice/", "nvvm/libdevice/"))),
    Part("nvidia-cuda-runtime-cu12 12.4.127",
         "nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl",
         "nvidia-cuda-runtime-cu12",
         "64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5", 883737,
         (("nvidia/cuda_runtime/include/", "include/"),
          ("nvidia/cuda_runtime/lib/libcudart.so.12", "lib64/libcudart.so.12"))),
    Part("nvidia-cuda-nvcc-cu12 12.4.131",
         "nvidia_cuda_nvcc_cu12-12.4.131-py3-none-manylinux2014_x86_64.whl",
         "nvidia-cuda-nvcc-cu12",
         "e4c9a35435c3b0e36c6397c5696334c9ea6650e524736cbd1c5d345ea099bb04", 22265199,
         (("nvidia/cuda_nvcc/include/", "include/"),)),
    Part("nvidia-cuda-cccl-cu12 12.4.127.post1",
         "nvidia_cuda_cccl_cu12-12.4.127.post1-py3-none-manylinux2014_x86_64.whl",
         "nvidia-cuda-cccl-cu12",
         "2027fa5fc75fbee703bf24e8275a40a605cf94a3e8fef8a7187897d49b34facb", 3111329,
         (("nvidia/cuda_cccl/include/", "include/"),)),
)

# The standard layout's profile: nvcc reads it from its own directory (_HERE_).
NVCC_PROFILE = """\
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""


def _adopted(workdir: Path) -> bool:
    from ..workspace.workdir import Workdir

    return Workdir(workdir).is_adopted()


def toolkit_dir(workdir: Path) -> Path:
    return workdir / "toolkits" / f"cuda-{RELEASE}"


def is_assembled(root: Path) -> bool:
    return (root / DONE_FILE).is_file() and (root / "bin" / "nvcc").is_file()


def deb_data_tar(deb: bytes) -> tarfile.TarFile:
    """The ``data.tar.*`` member of a ``.deb`` (an ``ar`` archive), opened."""
    if not deb.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    pos = 8
    while pos + 60 <= len(deb):
        header = deb[pos:pos + 60]
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        if header[58:60] != b"`\n":
            raise ValueError(f"bad ar member header at byte {pos}")
        body = deb[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise ValueError("data.tar.zst needs zstd, which the standard library lacks")
            return tarfile.open(fileobj=io.BytesIO(body), mode="r:*")
        pos += 60 + size + (size & 1)
    raise ValueError("no data.tar member")


def _members(part: Part, archive: Path) -> dict[str, bytes | None]:
    """Every file of the archive, normalised path -> bytes (None for a directory), from the
    bytes ``download.pinned_bytes`` read and checked."""
    data = pinned_bytes(archive, part.size, part.sha256, part.name,
                        "kvprefetch downloads it again")
    out: dict[str, bytes | None] = {}
    if archive.suffix == ".deb":
        with deb_data_tar(data) as tar:
            for m in tar.getmembers():
                path = m.name.lstrip("./")
                if m.isfile():
                    f = tar.extractfile(m)
                    out[path] = f.read() if f else b""
                elif m.isdir():
                    out[path.rstrip("/") + "/"] = None
    else:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for path in z.namelist():
                out[path] = None if path.endswith("/") else z.read(path)
    return out


def _place(part: Part, archive: Path, root: Path, workdir: Path | None = None) -> None:
    """Write what ``part`` gives the toolkit under ``root``; every file written from the work
    directory ``workdir`` down, never through a folder that is (or became) a symlink."""
    files = _members(part, archive)
    for src, dst in part.take:
        picked = ({p: b for p, b in files.items() if p.startswith(src) and b is not None}
                  if src.endswith("/") else ({src: files[src]} if files.get(src) is not None
                                             else {}))
        if not picked:
            raise FetchError(f"{part.filename} has no {src}",
                             "the pinned archive's layout changed; report this")
        for p, data in picked.items():
            rel = p[len(src):] if src.endswith("/") else ""
            if rel.endswith("__init__.py"):
                continue  # the wheels' namespace markers are not headers
            target = root / dst / rel if src.endswith("/") else root / dst
            assert data is not None
            executable = "bin/" in dst or target.suffix in ("", ".so") or ".so." in target.name
            # the bits given as the file is made: a chmod by path after it followed a link
            write_file(target, data, root=workdir, mode=0o755 if executable else 0o644,
                       family=FetchError)


def part_url(part: Part, index_url: str | None = None) -> str:
    """Where to download ``part``: the .deb's URL, or the wheel's on the configured index."""
    if part.url.startswith(("http://", "https://", "file://")):
        return part.url
    from ..sources.download import configured_index_url, locate_file

    return locate_file(index_url or configured_index_url(), part.url, part.filename,
                       part.sha256, unreachable_fix="pass --cuda-home DIR of a CUDA 12 "
                       "toolkit").url


def _download(part: Part, downloads: Path, opener: Callable[[str], object],
              workdir: Path | None = None) -> Path:
    """The archive in ``downloads``, fetched if absent; its sha256 must be the pinned one."""
    target = downloads / part.filename
    if workdir is not None:
        check_target(workdir, target, what="download into", family=FetchError)
    # a file of another size is never read (a sparse 15 TB file there was hashed for hours)
    if is_plain_file(target) and sha256_file_of_size(target, part.size) == part.sha256:
        return target
    if workdir is not None and os.path.lexists(target) and _adopted(workdir):
        # in a folder adopted with the user's files in it, a file the kit did not download is
        # the user's: it was replaced by the download (issue 41, the seventeenth hostile pass)
        raise FetchError(f"{target} is not the pinned {part.name} (sha256 {part.sha256[:16]}…) "
                         "and kvprefetch did not download it (this work directory was adopted "
                         "with your files in it): it was left as it is",
                         f"move {target} away (or replace it by the pinned file), then rerun")
    url = part_url(part)
    try:
        # streamed into a temporary beside it (confine.open_new), renamed only when whole and
        # of the pinned sha256: never through a symlink, and a failure leaves nothing
        response: Any = opener(url)  # urlopen's response, or a file for file:// URLs
        with response as resp, open_new(target, root=workdir, family=FetchError) as out:
            h = hashlib.sha256()

            def both(chunk: bytes) -> None:
                out.write(chunk)
                h.update(chunk)
            copy_bounded(resp, both, part.size, url)  # a source without end: refused
            if h.hexdigest() != part.sha256:
                raise FetchError(f"{url} has sha256 {h.hexdigest()}, expected {part.sha256}; "
                                 "it was deleted and nothing was unpacked",
                                 "check that the mirror serves the pinned file and rerun")
    except NETWORK_ERRORS as exc:  # an answer that is no HTTP too: the nineteenth pass
        local = local_write_failure(exc, target.parent)
        if local is not None:  # this machine's disk, not the network
            raise FetchError(f"cannot download {part.name} from {url}: {local[0]}",
                             local[1]) from exc
        raise FetchError(f"cannot download {part.name} from {url}: {network_error_text(exc)}",
                         "check the network (deb.debian.org and files.pythonhosted.org must be "
                         "reachable), or pass --cuda-home DIR of a CUDA 12 toolkit") from exc
    return target


def _urlopen(url: str) -> object:
    """A file:// URL a regular file only, never a FIFO or device (``download.open_url``)."""
    return open_url(url)


def ensure_cuda12(workdir: Path, *, say: Callable[[str], None] = lambda _m: None,
                  opener: Callable[[str], object] = _urlopen) -> Path:
    """The assembled toolkit's root under ``workdir``, assembling it once (under a lock, into a
    temporary directory renamed into place, so a killed run leaves an orphan ``clean`` removes
    and never a half-made toolkit)."""
    import json

    root = toolkit_dir(workdir)
    if is_assembled(root):
        return root
    with locked(workdir / ".locks" / "toolkit-cuda12.lock", "the CUDA 12 toolkit", wait=True):
        if is_assembled(root):  # another build assembled it while we waited
            return root
        downloads = workdir / "downloads" / f"cuda-{RELEASE}"
        archives = []
        for part in PARTS:
            say(f"CUDA {RELEASE}: {part.name} ({part.size / 1e6:.0f} MB)")
            archives.append(_download(part, downloads, opener, workdir))
        # every act from the work directory down, relative to folders opened O_NOFOLLOW: a
        # toolkits/ (or the temporary) swapped for a link never has a folder outside written,
        # emptied or replaced (issue 41, the thirteenth hostile pass: mkdir, write, chmod,
        # rmtree and rename by path)
        ensure_dir(root.parent, root=workdir, family=FetchError)
        tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
        with ownership.temporary(workdir, tmp, family=FetchError):
            for part, archive in zip(PARTS, archives, strict=True):
                _place(part, archive, tmp, workdir)
            lib64 = open_dir(tmp / "lib64", root=workdir, what="write into", family=FetchError)
            try:
                os.symlink("libcudart.so.12", "libcudart.so", dir_fd=lib64)
            finally:
                os.close(lib64)
            write_file(tmp / "bin" / "nvcc.profile", NVCC_PROFILE, root=workdir,
                       family=FetchError)
            write_file(tmp / DONE_FILE, json.dumps(
                {"release": RELEASE, "parts": [{"name": p.name, "url": p.url,
                                                "sha256": p.sha256} for p in PARTS]}, indent=1),
                root=workdir, family=FetchError)
            # a leftover without DONE_FILE: the kit's own, replaced; not in a folder adopted with
            # the user's files in it, where one the record does not list is the user's (a
            # user's toolkits/cuda-12.4.1/ was removed: the seventeenth hostile pass)
            if os.path.lexists(root) and _adopted(workdir) and (
                    ownership.owned(workdir, root) or {}).get("kind") != "toolkit":
                raise FetchError(f"{root} is in the way of the CUDA {RELEASE} toolkit "
                                 "kvprefetch assembles, and kvprefetch did not make it (this "
                                 "work directory was adopted with your files in it)",
                                 f"move {root} away (or pass --cuda-home {root} if it is a "
                                 "CUDA 12 toolkit), then rerun")
            remove_path(workdir, root, family=FetchError)
            move_file(workdir, tmp, root, family=FetchError)
        ownership.record(workdir, root, "toolkit", release=RELEASE)
    return root
