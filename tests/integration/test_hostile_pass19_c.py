"""Issue 41, the nineteenth hostile pass (tester c: every command, option and input, for
tracebacks, hangs, wrong messages and wrong writes). Each test fails without its fix (checked by
reverting ``src`` and running it):

- The sdist download (and the CUDA 12 assembly's) said "check the network and run the command
  again" for every OSError, the ones that only writing the local file raises too: a full work
  directory (``No space left on device``), a read-only one (``slurm prepare`` on a campaign
  mounted read-only), a quota or the file-size limit (``ulimit -f``). The rerun fails the same
  way. Now such a failure names the download folder and gives the disk's fix
  (``oserrors.local_write_failure``); the network's fix stays for the network.
- Every lock (the work directory's, a tree's, a campaign's) is opened by its name in its
  folder's descriptor, so on a read-only (or full) file system the message named only that
  name and the fix the caller's folder: "apply failed: tree-patched.lock: Read-only file
  system / To fix: . is on a file system mounted read-only" (apply, fetch, clean, build,
  slurm plan/submit/resubmit: 7 commands, 1 run each). Now the lock's whole path and its
  folder are named.
- A ``TMPDIR`` inside the work directory is refused (the twelfth, seventeenth and eighteenth
  passes), but by path only: the same folder under another name, a bind mount of the work
  directory elsewhere (a container's view of it, a second mount point), passed, and apply made
  its ``git apply`` folder and doctor its compile probe in the work directory, where whoever
  writes it can swap them for a link to a folder outside (the seventeenth and eighteenth
  passes' attack). Now a folder above the temp folder that is the work directory by device
  and inode is refused too (``mounts.within``; 1 run each of apply and doctor).
- A whole number past a float's range (400 digits) was an ``OverflowError`` traceback wherever
  the kit took it for a float: the integer options checked against a ``Bound``
  (``bench decode --steps/--requests/--repeats``, the eighteenth pass's ceilings, and, since the
  fourth pass, ``bench e2e``'s counts and ``bench ncu``'s launch counts: ``math.isfinite`` of
  the integer), a README timings block's ``wall_s`` (``report --readme``), and an earlier build
  manifest's ``seconds`` (the build's progress line; the seventeenth pass fixed ``1e999`` there,
  not an integer). Now the options are usage errors naming the range, the timing file is named
  as holding no timing, and the manifest gives no estimate (found by the driver, 6 runs, and by
  reading for the same pattern).
- ``export-header -o`` into the work directory it reads replaced, with exit 0, whatever was at
  that name: the ownership record, a state record, the work directory's tag, the pristine
  copy's header (a careless ``-o``; 5 runs by hand), and left a work directory that fetch and
  clean refuse ("the ownership record ... is corrupt"). Now an -o inside the work directory is
  refused, naming it (exit 4), and nothing there changes.
- ``fetch --repo-url`` with bytes that are no UTF-8 (a shell argument, escaped) had git echo them
  in its error, which GitPython decodes strictly: a ``UnicodeDecodeError`` traceback (the
  driver, 1 run); so did any git message that is no UTF-8 (a server's ``remote:`` lines). Now
  such a URL is refused before git runs, and git's undecodable message is one FetchError.
- ``vmm bench --batches/--contexts`` had no ceiling: a 400-digit size was an OverflowError
  traceback in the plan (the driver, 2 runs). Now above 2**31 - 1 is a usage error, as
  ``bench kernel``'s sizes are.
- ``report`` of a sampled run (``bench kernel --sample``) whose step records a launch of
  10**9 or a 400-digit number of sequences searched every count up to it in the twin rule's
  mirror (``policy.more_waves_for_some``): a hang (the in-process fuzzer of every numeric leaf
  of six committed results with 400-digit integers, 1 run of 1,144). Now a launch of more than
  gridDim.y's 65535 sequences is a field not what kvprefetch writes (exit 7), naming the file.
"""

from __future__ import annotations

import http.server
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kvprefetch.errors import FetchError, PatchError
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes

_REPO = Path(__file__).resolve().parents[2]
SDIST_NAME = "vllm-0.10.2.tar.gz"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path))
    return env


class _Index:
    """An index on 127.0.0.1 whose vllm page links the sdist at ``/sdist/``, served as
    ``size`` bytes of zeros (the download fails before its hash matters)."""

    def __init__(self, size: int) -> None:
        page = f'<a href="/sdist/{SDIST_NAME}">{SDIST_NAME}</a>'.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                if self.path.startswith("/vllm/"):
                    self.wfile.write(page)
                    return
                try:
                    for _ in range(size >> 16):
                        self.wfile.write(b"\0" * (1 << 16))
                except OSError:  # the kit stopped reading
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _small_files() -> None:
    """The child may write files of at most 1 MiB (``ulimit -f 1024``): the 4 MiB download
    fails on this machine's side (EFBIG; Python ignores SIGXFSZ), as on a full disk."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_a_download_that_fails_on_the_local_disk_is_not_blamed_on_the_network(
        tmp_path: Path) -> None:
    index = _Index(4 << 20)
    wd = tmp_path / "wd"
    try:
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--source", "sdist",
                              "--workdir", str(wd), "--index-url", index.url],
                             env=_env(tmp_path), capture_output=True, text=True, timeout=60,
                             check=False, preexec_fn=_small_files)
    finally:
        index.close()
    text = res.stderr
    assert res.returncode == FetchError.exit_code, (res.returncode, text)
    assert "Traceback" not in text and "To fix:" in text, text
    assert "check the network" not in text, text
    assert "file-size limit" in text and str(wd / "downloads") in text, text
    assert not any((wd / "downloads").iterdir())


@pytest.fixture
def read_only_campaign(tmp_path: Path) -> Any:
    """A campaign planned on a small tmpfs, then remounted read-only (needs root, as
    test_reliability's read-only work directory does)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    try:
        camp = mnt / "camp"
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                              "--no-gpu"], env=_env(tmp_path), capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        yield camp
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("command", [["slurm", "submit"], ["slurm", "plan"],
                                     ["slurm", "resubmit", "{camp}", "bench"]])
def test_a_lock_on_a_read_only_file_system_is_named_by_its_whole_path(
        tmp_path: Path, read_only_campaign: Path, command: list[str]) -> None:
    camp = read_only_campaign
    args = [a.format(camp=camp) for a in command]
    if "{camp}" not in command:
        args.append(str(camp))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=_env(tmp_path),
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    text = res.stderr
    assert res.returncode == 2 and "Traceback" not in text and "To fix:" in text, text
    assert f"{camp}/.kvprefetch-campaign.lock: Read-only file system" in text, text
    assert f"To fix: {camp} is on a file system mounted read-only" in text, text


_FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "Cuda compilation tools, release 12.8, V12.8.93"; exit 0
fi
o=""
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && o="$2"; shift; done
echo "out=$o" >> "$NVCC_LOG"
[ -n "$o" ] && echo obj > "$o"
exit 0
"""


@pytest.fixture
def work_alias(fetched_workdir: Path, tmp_path: Path) -> Any:
    """The work directory bind-mounted at another path (needs root, as test_reliability's
    tmpfs)."""
    alias = tmp_path / "alias"
    alias.mkdir()
    res = subprocess.run(["mount", "--bind", str(fetched_workdir), str(alias)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")
    try:
        yield alias
    finally:
        subprocess.run(["umount", "-l", str(alias)], check=False)


def run_with_tmpdir(tmp_path: Path, command: str, workdir: Path,
                    tmpdir: Path) -> subprocess.CompletedProcess[str]:
    """``kvprefetch COMMAND --workdir WORKDIR`` (doctor or apply) with ``TMPDIR`` and a fake
    nvcc on PATH that logs what it compiles: asserts the kit refused the TMPDIR as inside the
    work directory before nvcc compiled anything, with a fix and no traceback."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text(_FAKE_NVCC)
    (bin_dir / "nvcc").chmod(0o755)
    log = tmp_path / "nvcc.log"
    env = {**_env(tmp_path), "TMPDIR": str(tmpdir), "NVCC_LOG": str(log),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    args = ["--arch", "9.0a"] if command == "doctor" else []
    res = subprocess.run([sys.executable, "-m", "kvprefetch", command, "--workdir",
                          str(workdir), *args], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    text = res.stderr
    assert "Traceback" not in text, text
    assert "probe.o" not in (log.read_text() if log.exists() else "")
    assert res.returncode != 0 and "(TMPDIR) is inside the work directory" in text \
        and "To fix:" in text, text
    return res


@pytest.mark.parametrize("command", ["doctor", "apply"])
def test_a_tmpdir_in_the_work_directory_under_another_mount_is_refused(
        fetched_workdir: Path, work_alias: Path, tmp_path: Path, command: str) -> None:
    (fetched_workdir / "tmp").mkdir()
    run_with_tmpdir(tmp_path, command, fetched_workdir, work_alias / "tmp")
    assert not list((fetched_workdir / "tmp").iterdir())  # nothing made in the work directory


_HUGE = "9" * 400  # a whole number no float holds


@pytest.mark.parametrize("command", [("decode", "--steps"), ("decode", "--requests"),
                                     ("decode", "--repeats"), ("e2e", "--repeats"),
                                     ("e2e", "--input-len"), ("ncu", "--launch-count")])
def test_a_whole_number_past_a_floats_range_is_a_usage_error_not_a_traceback(
        tmp_path: Path, command: tuple[str, str]) -> None:
    sub, option = command
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "bench", sub, "--workdir",
                          str(tmp_path / "wd"), "--out", str(tmp_path / "out"), option, _HUGE,
                          "--dry-run"], env=_env(tmp_path), capture_output=True, text=True,
                         timeout=120, check=False)
    text = res.stderr
    assert "Traceback" not in text and "OverflowError" not in text, text
    assert res.returncode == 2 and f"Invalid value for '{option}'" in text \
        and "To fix:" in text, text
    assert not (tmp_path / "out").exists() and not (tmp_path / "wd").exists()


def test_a_timings_block_with_a_wall_time_past_a_floats_range_is_a_bad_timing(
        tmp_path: Path) -> None:
    runs = [{"what": "w", "command": "c", "commit": "abc", "how": "h", "exit": 0,
             "wall_s": 12345, "source": "s"}]
    text = json.dumps({"machine": "m", "runs": runs}).replace("12345", _HUGE)
    (tmp_path / "t.json").write_text(text)
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- timings t.json -->\nold\n<!-- /timings -->\n")
    before = readme.read_bytes()
    for check in ([], ["--check"]):
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "report", "--readme",
                              str(readme), *check], env=_env(tmp_path), capture_output=True,
                             text=True, timeout=120, check=False)
        out = res.stderr
        assert "Traceback" not in out and "OverflowError" not in out, out
        assert res.returncode != 0 and "wall_s is not what a timing holds" in out \
            and str(tmp_path / "t.json") in out and "To fix:" in out, out
    assert readme.read_bytes() == before


def test_an_earlier_build_manifest_of_a_duration_past_a_floats_range_is_no_duration(
        tmp_path: Path) -> None:
    from kvprefetch.machine.progress import previous_seconds

    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "manifest.json").write_text(
        '{"seconds": ' + _HUGE + ', "head_sizes": null, "block_sizes": null, '
        '"kv_dtypes": null}')
    assert previous_seconds(tmp_path, {}) is None


@pytest.mark.parametrize("name", [".kvprefetch-owned.json",
                                  "pristine/sdist/csrc/attention/attention_kernels.cuh",
                                  "trees/../state/patched.json"])
def test_export_header_never_writes_into_the_work_directory_it_reads(
        fetched_workdir: Path, tmp_path: Path, name: str) -> None:
    from tests.integration.helpers import tree_bytes

    before = tree_bytes(fetched_workdir)
    target = fetched_workdir / name
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "export-header", "--workdir",
                          str(fetched_workdir), "-o", str(target)], env=_env(tmp_path),
                         capture_output=True, text=True, timeout=120, check=False)
    text = res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == PatchError.exit_code and "To fix:" in text \
        and f"it is inside the work directory {fetched_workdir}" in text, text
    assert tree_bytes(fetched_workdir) == before


def test_export_header_never_writes_into_the_work_directory_through_a_bind_mount(
        fetched_workdir: Path, work_alias: Path, tmp_path: Path) -> None:
    """The same -o through a bind mount of the work directory elsewhere: its real path is not
    the work directory's, so the path comparison alone let it overwrite the ownership record
    (the nineteenth pass left it open; the lead closed it by device and inode)."""
    from tests.integration.helpers import tree_bytes

    before = tree_bytes(fetched_workdir)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "export-header", "--workdir",
                          str(fetched_workdir), "-o", str(work_alias / ".kvprefetch-owned.json")],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=120,
                         check=False)
    text = res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == PatchError.exit_code and "To fix:" in text \
        and "it is inside the work directory" in text, text
    assert tree_bytes(fetched_workdir) == before


_FAKE_GIT = """#!/bin/sh
if [ "$1" = "version" ] || [ "$1" = "--version" ]; then echo "git version 2.40.1"; exit 0; fi
printf 'remote: \\377\\376 not utf-8\\n' >&2
exit 128
"""


@pytest.mark.parametrize("case", ["url-not-utf8", "git-message-not-utf8"])
def test_a_repo_url_or_git_message_that_is_no_utf8_is_one_message(
        tmp_path: Path, case: str) -> None:
    env = _env(tmp_path)
    url: str | bytes = "https://example.invalid/vllm.git"
    if case == "url-not-utf8":
        url = b"\xff\xfe-bad-\x80"
    else:  # a git whose error is no UTF-8
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "git").write_text(_FAKE_GIT)
        (bin_dir / "git").chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        env["GIT_PYTHON_GIT_EXECUTABLE"] = str(bin_dir / "git")
    args: list[str | bytes] = [sys.executable, "-m", "kvprefetch", "fetch", "--source", "git",
                               "--workdir", str(tmp_path / "wd"), "--repo-url", url]
    res = subprocess.run(args, env=env, capture_output=True, timeout=120, check=False)
    text = res.stderr.decode("utf-8", "replace")
    assert "Traceback" not in text and "UnicodeDecodeError" not in text, text
    assert res.returncode in (2, 3) and "To fix:" in text, (res.returncode, text)
    assert ("not printable UTF-8 text" if case == "url-not-utf8"
            else "message is not UTF-8 text") in text, text


@pytest.mark.parametrize("option", ["--batches", "--contexts"])
def test_a_vmm_size_past_an_int32_is_a_usage_error(tmp_path: Path, option: str) -> None:
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "vmm", "bench", "--dry-run",
                          "--out", str(tmp_path / "v.json"), option, _HUGE],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=120,
                         check=False)
    text = res.stderr
    assert "Traceback" not in text and "OverflowError" not in text, text
    assert res.returncode == 2 and "is above 2147483647" in text and "To fix:" in text, text


_SAMPLE = _REPO / "docs/results/2026-12-03-h200-sample-vllm-call/sample-12031450.json.gz"


@pytest.mark.parametrize("num_seqs", ["1000000000", _HUGE])
def test_a_sampled_step_with_a_launch_of_too_many_sequences_never_hangs_report(
        tmp_path: Path, num_seqs: str) -> None:
    import gzip

    doc = json.loads(gzip.decompress(_SAMPLE.read_bytes()))
    mark = 1.2345678901234567e-300  # a number json writes once, replaced by the text
    doc["results"][1]["launch"]["num_seqs"] = mark
    result = tmp_path / "sample.json"
    result.write_text(json.dumps(doc).replace(repr(mark), num_seqs))
    try:
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "report", str(result),
                              "--out", str(tmp_path / "out")], env=_env(tmp_path),
                             capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("report searched a launch of too many sequences for ever")
    text = res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == 7 and "sequences, not 1 to 65535" in text and str(result) in text \
        and "To fix:" in text, text
