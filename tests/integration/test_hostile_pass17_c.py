"""Issue 41, the seventeenth hostile pass (tester c: every command, option and input, for
tracebacks and wrong writes). Each test fails without its fix (checked by reverting ``src``
and running it):

- ``bench e2e`` reads the verify-kernel report (``<workdir>/verify/report.json`` or
  ``--verify-report``), data like every record in the work directory, and took its ``envs`` on
  trust: ``"envs": 5`` (or ``true``) was ``TypeError: 'int' object is not iterable``, a python
  recorded as a number or a list was ``Path()``'s TypeError, both tracebacks in the dry run
  too, and a python with a NUL in it was subprocess's ``ValueError: embedded null byte``
  traceback in the real run. Now such a report is "malformed", named, with a To fix (exit 7;
  a dry run shows the refusal it would make and exits 0, as for any other refusal).
- What a package index serves is trusted for nothing but what the pinned hash checks, yet the
  downloads read it without bound: an index listing the sdist (or a CUDA 12 wheel) by a
  ``file://`` URL at a FIFO hung `fetch` (and the assembly) for good, one at ``/dev/zero``
  read it for ever, and a mirror serving without end had it all written into ``downloads/``
  before the hash check (a full disk); the index page itself was read whole. Now a file://
  source must be a regular file (opened ``O_NONBLOCK``, refused naming it), a download stops
  past the pinned size (``download.copy_bounded``), and the page past 64 MiB.
- Other records read back on trust, each a traceback before and one message with a To fix
  now: an earlier build manifest's ``"seconds": 1e999`` (a build's progress line, OverflowError);
  verify-kernel's build manifests with a ``tree``, ``env`` or ``so_path`` of another type;
  ``slurm publish``'s scratch manifest with an ``env`` that is no object; and the throughput
  result each ``bench e2e`` run's vLLM writes (a field missing, text, a list, a time of 0);
  the table ``bench ncu``'s Nsight Compute writes (a row shorter than its header).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvprefetch.errors import BenchError, FetchError
from tests.integration.test_reliability import _env, cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes

# (the report's envs, the words the message must hold)
MALFORMED_ENVS: dict[str, tuple[Any, str]] = {
    "envs-a-number": (5, "its `envs` is int"),
    "envs-true": (True, "its `envs` is bool"),
    "python-a-number": ({"baseline": {"python": 5}, "patched": {"python": "/bin/true"}},
                        "python is int"),
    "python-a-list": ([{"name": "baseline", "python": ["x"]},
                       {"name": "patched", "python": "/bin/true"}], "python is list"),
    "python-with-a-nul": ({"baseline": {"python": "/bin/true\x00x"},
                           "patched": {"python": "/bin/true"}}, "python is '/bin/true\\x00x'"),
    "name-a-list": ([[1], {"name": "patched", "python": "/bin/true"}], "name is list"),
}


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("case", sorted(MALFORMED_ENVS))
def test_a_verify_report_with_envs_of_the_wrong_type_is_malformed_not_a_traceback(
        tmp_path: Path, case: str, dry_run: bool) -> None:
    envs, needle = MALFORMED_ENVS[case]
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"passed": True, "envs": envs}))
    res = cli("bench", "e2e", "--workdir", str(tmp_path / "wd"), "--out", str(tmp_path / "out"),
              "--model-dir", str(tmp_path), "--verify-report", str(report),
              *(["--dry-run"] if dry_run else []), timeout=60)
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    if dry_run:  # the plan, and the refusal the run would make
        assert res.returncode == 0, text
        assert "would refuse" in text and "is malformed" in text and needle in text, text
    else:
        refused(res, BenchError.exit_code, "is malformed", needle, str(report))


# ----------------------------------------------------------------- what an index serves


class _Index:
    """A simple index on 127.0.0.1 whose vllm page links ``href`` for the sdist; ``/endless``
    serves zeros, ``size`` bytes of them, with no Content-Length."""

    def __init__(self, href: str, size: int = 0) -> None:
        import http.server
        import threading

        page = f'<a href="{href}">{SDIST_NAME}</a>'.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                if self.path.startswith("/vllm/"):
                    self.wfile.write(page)
                    return
                sent = 0
                try:
                    while sent < size:
                        self.wfile.write(b"\0" * (1 << 20))
                        sent += 1 << 20
                except OSError:  # the kit stopped reading: what the fix does
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SDIST_NAME = "vllm-0.10.2.tar.gz"


def test_an_index_listing_a_fifo_by_a_file_url_is_refused_not_a_hang(tmp_path: Path) -> None:
    """The index (remote, trusted for nothing but what the pinned hash checks) may list any
    URL for the sdist. A ``file://`` one was opened and read whole: a FIFO there hung `fetch`
    for good (and ``/dev/zero`` filled memory). Now a file:// source is a regular file or
    refused at once, naming it."""
    fifo = tmp_path / "served" / SDIST_NAME
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    index = _Index(fifo.as_uri())
    try:
        res = cli("fetch", "--source", "sdist", "--workdir", str(tmp_path / "wd"),
                  "--index-url", index.url, timeout=30)
    finally:
        index.close()
    refused(res, FetchError.exit_code, "is not a regular file", str(fifo))
    assert not any((tmp_path / "wd" / "downloads").iterdir())


def test_an_index_serving_without_end_is_cut_at_the_pinned_size(tmp_path: Path) -> None:
    """A mirror that serves more than the pinned sdist's bytes (without end, for a broken or
    hostile one) had all of it written into ``downloads/`` before the hash check: the work
    directory's disk filled. Now the download stops past the pinned size, keeps nothing and
    says so."""
    index = _Index("/endless/" + SDIST_NAME, size=48 << 20)
    try:
        res = cli("fetch", "--source", "sdist", "--workdir", str(tmp_path / "wd"),
                  "--index-url", index.url, timeout=60)
    finally:
        index.close()
    refused(res, FetchError.exit_code, "serves more than the 10908356 bytes")
    assert not any((tmp_path / "wd" / "downloads").iterdir())


def test_a_cuda12_part_at_a_fifo_file_url_is_refused_not_a_hang(tmp_path: Path) -> None:
    """The CUDA 12 assembly's download (its wheels' URLs come from the index too) opened a
    file:// URL with ``open``: a FIFO hung it. Run in a child, so a hang is a timeout."""
    fifo = tmp_path / "fake_cu12-1-py3-none-any.whl"
    os.mkfifo(fifo)
    (tmp_path / "work").mkdir()
    code = f"""
import sys
from pathlib import Path
from kvprefetch.errors import KvprefetchError
from kvprefetch.overlay import cuda12
part = cuda12.Part("fake", {fifo.name!r}, {fifo.as_uri()!r}, "0" * 64, 1000, ())
cuda12.PARTS = (part,)
try:
    cuda12.ensure_cuda12(Path({str(tmp_path / "work")!r}))
except KvprefetchError as exc:
    print(exc.message)
    sys.exit(3)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, env=_env(), check=False)
    assert res.returncode == 3 and "is not a regular file" in res.stdout, res


# ------------------------------------------------------------ a build's earlier manifest


@pytest.mark.parametrize("seconds", ["1e999", '"Infinity"', '"inf"'])
def test_an_earlier_build_manifest_of_infinite_seconds_is_no_duration(
        tmp_path: Path, seconds: str) -> None:
    """A build's progress line estimates from the newest earlier manifest of the tree
    (``build/<tree>/<key>/manifest.json``, data in the work directory): ``"seconds": 1e999``
    (infinity to Python's JSON reader) made every line's ETA ``round(inf)``, an OverflowError
    that ended the build with a traceback at ninja's first progress line. Now a duration that
    is not finite is no duration: the line estimates from the pace."""
    from kvprefetch.machine.progress import CompileProgress, previous_seconds

    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "manifest.json").write_text(
        '{"seconds": ' + seconds + ', "head_sizes": null, "block_sizes": null, '
        '"kv_dtypes": null}')
    expected = previous_seconds(tmp_path, {})
    assert expected is None
    prog = CompileProgress(0.0, expected)
    prog.update(3, 10)
    assert "left (at this pace)" in prog.line(60.0)


# ------------------------------------------------------- verify-kernel's build manifests


@pytest.mark.parametrize(("manifest", "needle"), [
    ({"tree": ["x"]}, "`tree` is list"),
    ({"tree": {"a": 1}}, "`tree` is dict"),
    ({"tree": "baseline", "env": 5}, "`env` is int"),
    ({"tree": "baseline", "env": {"path": ["x"]}}, "`env.path` is list"),
    ({"tree": "baseline", "mode": "kernels-only", "so_path": "a\0b"},
     "`so_path` is text with a NUL"),
    ({"tree": "baseline", "mode": "overlay", "so_path": ["a"]}, "`so_path` is list"),
])
def test_a_build_manifest_with_fields_of_the_wrong_type_is_corrupt_for_verify_kernel(
        tmp_path: Path, manifest: dict[str, Any], needle: str) -> None:
    """verify-kernel read the newest manifest of each tree under ``build/*/*/`` (data in the
    work directory) on trust: a ``tree`` that is a list or an object was ``unhashable type``,
    an ``env`` that is a number ``'int' object has no attribute 'get'``, a ``so_path`` that is
    a list ``Path()``'s TypeError: tracebacks. Now such a manifest is corrupt, named with a To
    fix (exit 6)."""
    for tree, m in (("baseline", manifest), ("patched", {"tree": "patched"})):
        (tmp_path / "build" / tree / "k").mkdir(parents=True)
        (tmp_path / "build" / tree / "k" / "manifest.json").write_text(json.dumps(m))
    res = cli("verify-kernel", "--workdir", str(tmp_path), "--no-gpu", timeout=60)
    refused(res, 6, "build manifest", "is corrupt", needle)


# ---------------------------------------------------------- slurm publish's scratch manifest


@pytest.mark.parametrize("env", [5, "x", ["a"]], ids=["number", "text", "list"])
def test_a_scratch_manifest_whose_env_is_no_object_is_corrupt_for_publish(
        tmp_path: Path, env: Any) -> None:
    """``slurm publish`` read the scratch build's manifest (data the build job left in a
    folder of the user's or the node's) and took its ``env`` for an object:
    ``"env": 5`` was ``'int' object has no attribute 'get'``, a traceback. Now the manifest
    is corrupt, named with a To fix (exit 10)."""
    from kvprefetch.errors import SlurmError

    camp = tmp_path / "camp"
    res = cli("slurm", "plan", str(camp), "--stand-in", "--no-gpu", timeout=60)
    assert res.returncode == 0, res.stderr
    build = tmp_path / "scr" / "build" / "baseline" / "k"
    build.mkdir(parents=True)
    (build / "lib.so").write_bytes(b"")
    (build / "manifest.json").write_text(json.dumps({
        "tree": "baseline", "variant": "baseline", "namespace": "kvprefetch_baseline",
        "so_path": "lib.so", "so_sha256": "ab", "head_sizes": [128], "block_sizes": [16],
        "kv_dtypes": ["auto"], "env": env}))
    res = cli("slurm", "publish", str(camp), "--tree", "baseline",
              "--scratch", str(tmp_path / "scr"), timeout=60)
    refused(res, SlurmError.exit_code, "is corrupt: its `env` is", str(build / "manifest.json"))


# ------------------------------------------------------ what vLLM wrote for bench e2e

_FAKE_PYTHON = """#!/bin/sh
# an environment's python that prints vLLM's version, and as `vllm bench throughput` writes
# $FAKE_JSON to --output-json
prev=""; out=""
for a in "$@"; do [ "$prev" = "--output-json" ] && out="$a"; prev="$a"; done
if [ -n "$out" ]; then printf '%s' "$FAKE_JSON" > "$out"; else echo '{"vllm": "0.10.2"}'; fi
"""


@pytest.mark.parametrize("written", [
    "{}", '{"tokens_per_second": "x", "num_requests": 1, "elapsed_time": 1}',
    '{"tokens_per_second": 1, "num_requests": 1, "elapsed_time": 0}', "[1]"],
    ids=["empty", "text", "zero-time", "list"])
def test_a_throughput_result_vllm_wrote_badly_is_one_message(
        tmp_path: Path, written: str) -> None:
    """``bench e2e`` read each run's ``--output-json`` (written by the environment's vLLM, in
    the output folder) unbounded and on trust: a missing ``tokens_per_second`` was a KeyError,
    text there a ValueError, an elapsed time of 0 a ZeroDivisionError, a list a TypeError: all
    tracebacks. Now the file is read as records are and checked; one message names it and the
    run's log (exit 7)."""
    # in the work directory's envs/, where a verify report's pythons must be (the 31st pass)
    python = tmp_path / "wd" / "envs" / "baseline" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(_FAKE_PYTHON)
    python.chmod(0o755)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"passed": True, "envs": {
        "baseline": {"python": str(python)}, "patched": {"python": str(python)}}}))
    env = dict(_env(), FAKE_JSON=written)
    res = subprocess.run(
        [sys.executable, "-m", "kvprefetch", "bench", "e2e", "--workdir", str(tmp_path / "wd"),
         "--out", str(tmp_path / "out"), "--model-dir", str(tmp_path), "--verify-report",
         str(report), "--max-num-seqs", "8", "--repeats", "1"],
        capture_output=True, text=True, timeout=60, env=env, check=False)
    refused(res, BenchError.exit_code, "vLLM's throughput result", "baseline-seqs8-r0.json",
            "baseline-seqs8-r0.log")


# ------------------------------------------------------------- what ncu wrote for bench ncu

_FAKE_NCU = """#!/bin/sh
# Nsight Compute as bench ncu runs it: its table, with a row shorter than the header
prev=""; out=""
for a in "$@"; do [ "$prev" = "--log-file" ] && out="$a"; prev="$a"; done
printf '%s\\n%s\\n%s\\n' '"ID","Process ID","Kernel Name","gpu__time_duration.sum"' \\
    '"","","","nsecond"' '"0","1"' > "$out"
"""


def test_an_ncu_table_with_a_short_row_is_one_message(tmp_path: Path) -> None:
    """``bench ncu`` parsed the CSV Nsight Compute left in the output folder on trust: a row
    shorter than the header was an IndexError traceback. Now a table that is not ncu's shape
    is one message naming it and ncu's log (exit 7)."""
    wd = tmp_path / "wd"
    for tree in ("baseline", "patched"):
        build = wd / "build" / tree / "k"
        build.mkdir(parents=True)
        (build / "lib.so").write_bytes(b"")
        (build / "manifest.json").write_text(json.dumps({
            "tree": tree, "variant": tree, "namespace": f"kvprefetch_{tree}",
            "so_path": "lib.so", "so_sha256": "ab", "head_sizes": [128], "block_sizes": [16],
            "kv_dtypes": ["auto"]}))
    ncu = tmp_path / "ncu"
    ncu.write_text(_FAKE_NCU)
    ncu.chmod(0o755)
    res = cli("bench", "ncu", "--workdir", str(wd), "--ncu", str(ncu), "--out",
              str(tmp_path / "out"), "--shape", "1x1k", timeout=60)
    refused(res, BenchError.exit_code, "ncu-1-baseline.csv is malformed", "ncu-1-baseline.log")
