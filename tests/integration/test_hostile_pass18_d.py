"""Issue 41, the eighteenth hostile pass (d): the work directory's commands, re-attacking the
seventeenth pass's changes and the commands it did not try.

- ``diff-upstream``, ``export-header`` and ``apply`` read the pristine header
  (``patching.pristine_text``) by path twice: hashed (``sha256_file``), then read again whole
  (``Path.read_text``). A ``renameat2`` loop exchanging ``pristine/sdist/.../
  attention_kernels.cuh`` with a FIFO in the work directory hung ``diff-upstream`` for good
  (2 runs of 15, killed by a 15 s timeout), and a file exchanged for other text between the
  two reads was taken as pristine. Each candidate is now read once, bounded and never
  blocking (``reading.read_limited``), and the bytes hashed are the bytes used.

- ``Workdir.is_adopted`` read the work directory's tag ``.kvprefetch-workdir`` whole by path:
  a sparse 15 TB file there (whoever writes the work directory) was a ``MemoryError``
  traceback in ``fetch`` and ``clean`` (2 of 2). It is read bounded now; a tag that cannot be
  read so is taken as adopted (the side on which the kit removes less).

- ``workdir.write_json_atomic`` compared what is there with what it writes by reading the
  file whole by path (the ownership record, manifests, the verify report, campaign.json): a
  sparse 15 TB file there was a ``MemoryError`` traceback (reached here by calling it; a swap
  loop against the ownership record did not win the window between its read and its write in
  8 runs). It reads at most the new text's size now, never blocking.

- A cached sdist (``downloads/vllm-0.10.2.tar.gz``) or CUDA 12 archive
  (``downloads/cuda-12.4.1/<archive>``) was hashed whole whatever its size: a sparse 15 TB
  file there had ``fetch`` (and ``fetch --force``) hash zeros for hours (killed by a 30 s
  timeout, 2 of 2). A file of another size than the pinned one is not it and is never read
  now (``hashing.sha256_file_of_size``, its size taken from the descriptor it is read by).

- The CUDA 12 assembly hashed each archive by path (``_download``), then opened it again by
  path to unpack it (``_members``: ``read_bytes``, ``zipfile.ZipFile(path)``): a swap loop
  exchanging ``downloads/cuda-12.4.1/<wheel>`` with a FIFO hung it for good (3 runs of 3, a
  stand-in part; faulthandler showed ``zipfile``'s open), and an archive exchanged for
  another had that one's files put into the toolkit. It is read once now, bounded and never
  blocking, and the bytes hashed are the bytes unpacked; a change in between is a FetchError.

- ``fetch`` hashed the cached sdist by path (``ensure_sdist``), then ``tarfile`` opened it
  again by path to unpack the pristine copy: the sdist exchanged for a FIFO in between blocked
  that open for good (a swap loop during ``fetch`` with ``pristine/`` gone: 1 run of 6 timed
  out at 20 s; not seen again in 16 runs with the fix under a faulthandler, so that timeout may
  have been the load; the open's block is shown deterministically here). The sdist is read
  once now, bounded and never blocking, and the bytes hashed are the bytes unpacked.

- ``kvprefetch doctor --workdir W`` with ``TMPDIR`` inside W (here a link into W's tmp/, a
  careless user) made its compile probe's private folder in W: doctor makes no ``Workdir``, so
  ``confine.trusted_roots`` did not name W, and the read-only probe passed no ``outside``. A
  watcher that renamed ``kvprefetch-doctor-*`` and put a link to a folder outside in its place
  had nvcc (a stand-in on PATH) write ``probe.o`` there (1 run of 1). doctor now refuses such a
  TMPDIR for its probe as a build does (exit 2, the TMPDIR message with its To fix).

Each test fails without its fix (checked with the fix reverted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvprefetch.workspace.workdir import TAG_FILE, write_json_atomic
from tests.integration.test_reliability import cli, outside

__all__ = ["outside"]  # the autouse fixture: the outside folder is byte-identical afterwards

_SRC = str(Path(__file__).resolve().parents[2] / "src")

# Run in a child with a timeout: without the fix it blocks for good opening a FIFO.
# sha256_file is wrapped so that, right after the pristine header is hashed, the header is
# exchanged for a FIFO (what a swap loop does at the worst moment, made deterministic).
_SWAP_AFTER_HASH = r"""
import os, sys
from pathlib import Path
from kvprefetch import upstream
from kvprefetch.sources import patching
from kvprefetch.workspace.workdir import Workdir

wd = Workdir(Path(sys.argv[1]))
real = patching.sha256_file
def hashed_then_swapped(p):
    h = real(p)
    if str(p).endswith(upstream.ATTENTION_HEADER) and "pristine" in str(p):
        os.rename(p, str(p) + ".real")
        os.mkfifo(p)
    return h
patching.sha256_file = hashed_then_swapped
text = patching.pristine_text(wd)
print("ok", len(text))
"""


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = _SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_a_pristine_header_swapped_for_a_fifo_after_its_hash_never_hangs(
        fetched_workdir: Path) -> None:
    header = fetched_workdir / "pristine" / "sdist" / "csrc" / "attention" / \
        "attention_kernels.cuh"
    assert header.is_file()
    try:
        res = subprocess.run([sys.executable, "-c", _SWAP_AFTER_HASH, str(fetched_workdir)],
                             capture_output=True, text=True, timeout=20, env=_child_env(),
                             check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("pristine_text hung on a header swapped for a FIFO after its hash")
    assert res.returncode == 0 and res.stdout.startswith("ok"), res.stderr
    assert "Traceback" not in res.stderr


def test_a_huge_sparse_work_directory_tag_is_no_traceback(fetched_workdir: Path) -> None:
    tag = fetched_workdir / TAG_FILE
    try:
        os.truncate(tag, 15 << 40)  # sparse: no disk used
    except OSError as exc:
        pytest.skip(f"this file system has no 15 TB sparse files: {exc}")
    for args in (("fetch", "--workdir", str(fetched_workdir)),
                 ("clean", "--workdir", str(fetched_workdir), "--what", "builds")):
        res = cli(*args, timeout=120)
        assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr, res.stderr
        assert res.returncode == 0, (args, res.stderr)
    assert os.path.getsize(tag) == 15 << 40  # the tag is data: left as it is


def test_write_json_atomic_over_a_huge_sparse_file_is_no_traceback(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    target = root / "record.json"
    target.touch()
    try:
        os.truncate(target, 15 << 40)
    except OSError as exc:
        pytest.skip(f"this file system has no 15 TB sparse files: {exc}")
    write_json_atomic(target, {"paths": {}}, root=root)
    assert target.read_text() == '{\n  "paths": {}\n}\n'


def test_a_huge_sparse_cached_sdist_is_refused_without_being_read(fetched_workdir: Path) -> None:
    from kvprefetch import upstream
    from tests.integration.test_reliability import refused

    cached = fetched_workdir / "downloads" / upstream.SDIST_NAME
    assert cached.is_file()
    cached.unlink()  # a hard link to the session's template (copy_workdir): never truncated
    cached.touch()
    try:
        os.truncate(cached, 15 << 40)
    except OSError as exc:
        pytest.skip(f"this file system has no 15 TB sparse files: {exc}")
    try:
        res = cli("fetch", "--workdir", str(fetched_workdir), timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("fetch hashed a 15 TB sparse cached sdist")
    refused(res, 3, "16492674416640 bytes")


_CUDA12_SPARSE = r"""
import os, sys
from pathlib import Path
from kvprefetch.errors import FetchError
from kvprefetch.overlay import cuda12

work = Path(sys.argv[1])
part = cuda12.PARTS[0]  # the .deb, at a direct URL: no index is asked
downloads = work / "downloads" / f"cuda-{cuda12.RELEASE}"
downloads.mkdir(parents=True)
(downloads / part.filename).touch()
os.truncate(downloads / part.filename, 15 << 40)

def offline(url):
    raise OSError("offline (the test)")

try:
    cuda12._download(part, downloads, offline, work)
except FetchError as exc:
    print("refused:", exc)
"""


def test_a_huge_sparse_cuda12_archive_is_never_read(tmp_path: Path) -> None:
    from kvprefetch.workspace.workdir import TAG_FILE

    work = tmp_path / "work"
    work.mkdir()
    (work / TAG_FILE).write_text("created by kvprefetch\n")
    try:
        res = subprocess.run([sys.executable, "-c", _CUDA12_SPARSE, str(work)],
                             capture_output=True, text=True, timeout=30, env=_child_env(),
                             check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the CUDA 12 assembly hashed a 15 TB sparse archive")
    assert res.returncode == 0 and "refused: cannot download" in res.stdout, res.stderr


# A stand-in wheel part; after its hash is checked, the archive is exchanged for a FIFO (or for
# another archive): what a swap loop did at the worst moment, made deterministic.
_CUDA12_SWAP = r"""
import hashlib, io, os, sys, zipfile
from pathlib import Path
from kvprefetch.errors import FetchError
from kvprefetch.overlay import cuda12

work, what = Path(sys.argv[1]), sys.argv[2]
def wheel(text):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("nvidia/x/include/a.h", text)
    return buf.getvalue()
data = wheel("int pinned;\n")
part = cuda12.Part("stand-in", "x.whl", "file:///nonexistent", hashlib.sha256(data).hexdigest(),
                   len(data), (("nvidia/x/include/", "include/"),))
downloads = work / "downloads" / f"cuda-{cuda12.RELEASE}"
downloads.mkdir(parents=True)
(downloads / part.filename).write_bytes(data)
real = cuda12.sha256_file_of_size
def hashed_then_swapped(p, size):
    h = real(p, size)
    os.rename(p, str(p) + ".real")
    if what == "fifo":
        os.mkfifo(p)
    else:
        Path(p).write_bytes(wheel("int other;\n"))
    return h
cuda12.sha256_file_of_size = hashed_then_swapped
def offline(url):
    raise OSError("offline (the test)")
archive = cuda12._download(part, downloads, offline, work)
try:
    print("members:", cuda12._members(part, archive))
except FetchError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("what", ["fifo", "other"])
def test_a_cuda12_archive_exchanged_after_its_hash_is_never_unpacked(tmp_path: Path,
                                                                     what: str) -> None:
    from kvprefetch.workspace.workdir import TAG_FILE

    work = tmp_path / "work"
    work.mkdir()
    (work / TAG_FILE).write_text("created by kvprefetch\n")
    try:
        res = subprocess.run([sys.executable, "-c", _CUDA12_SWAP, str(work), what],
                             capture_output=True, text=True, timeout=20, env=_child_env(),
                             check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the CUDA 12 assembly hung opening an archive exchanged for a FIFO")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("refused:") and "other" not in res.stdout, res.stdout


# After ensure_sdist has checked the cached sdist, it is exchanged for a FIFO, then fetch
# unpacks it (pristine/ is gone, so fetch makes it again from the sdist).
_SDIST_SWAP = r"""
import os, sys
from pathlib import Path
from kvprefetch.errors import FetchError
from kvprefetch.sources import fetch

work = Path(sys.argv[1])
real = fetch.ensure_sdist
def checked_then_swapped(*args, **kwargs):
    path = real(*args, **kwargs)
    os.rename(path, str(path) + ".real")
    os.mkfifo(path)
    return path
fetch.ensure_sdist = checked_then_swapped
try:
    fetch.fetch_trees(work, source="sdist")
    print("fetched")
except FetchError as exc:
    print("refused:", exc)
"""


def test_a_cached_sdist_exchanged_for_a_fifo_after_its_check_never_hangs_fetch(
        fetched_workdir: Path) -> None:
    import shutil

    shutil.rmtree(fetched_workdir / "pristine")
    try:
        res = subprocess.run([sys.executable, "-c", _SDIST_SWAP, str(fetched_workdir)],
                             capture_output=True, text=True, timeout=30, env=_child_env(),
                             check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("fetch hung opening a cached sdist exchanged for a FIFO after its check")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("refused: cannot read"), res.stdout


_FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "Cuda compilation tools, release 12.8, V12.8.93"; exit 0
fi
o=""
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && o="$2"; shift; done
echo "out=$o tmp=$TMPDIR" >> "$NVCC_LOG"
[ -n "$o" ] && echo obj > "$o"
exit 0
"""


def test_doctor_never_puts_its_compile_probe_in_a_tmpdir_inside_the_work_directory(
        fetched_workdir: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text(_FAKE_NVCC)
    (bin_dir / "nvcc").chmod(0o755)
    (fetched_workdir / "tmp").mkdir()
    link = tmp_path / "tmp-link"  # TMPDIR a link into the work directory
    link.symlink_to(fetched_workdir / "tmp")
    log = tmp_path / "nvcc.log"
    env = {**_child_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "TMPDIR": str(link), "NVCC_LOG": str(log), "HOME": str(tmp_path)}
    env.pop("KVPREFETCH_WORKDIR", None)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "doctor", "--workdir",
                          str(fetched_workdir), "--arch", "9.0a"], capture_output=True,
                         text=True, timeout=120, env=env, check=False)
    assert "Traceback" not in res.stderr, res.stderr
    runs = log.read_text() if log.exists() else ""
    assert "probe.o" not in runs, runs  # the probe never compiled in the work directory
    assert res.returncode == 2 and "(TMPDIR) is inside the work directory" in res.stderr \
        and "To fix:" in res.stderr, res.stderr
    assert not list((fetched_workdir / "tmp").iterdir())
