"""Issue 41, the twenty-third hostile pass (tester c: every command, option, input and
environment value, for tracebacks, hangs, wrong messages and wrong writes). Each test fails
without its fix (checked by reverting ``src`` and running it):

- ``slurm plan --scratch``, ``--source`` or ``--python`` naming a path whose name is not UTF-8
  (``$'/scratch/\\xff'``, a folder a latin-1 machine made), or a ``PATH`` entry that is not,
  passed every check and was a ``UnicodeEncodeError`` traceback half-way through writing the
  scripts (the campaign folder left with one script). Such a value is now refused before
  anything is written, naming the option (``slurm/values.check_utf8``).
- ``export-header --variant launch`` (or ``control``) said "the launch patch does not apply to
  pristine v0.10.2 / To fix: reinstall kvprefetch from a clean checkout" (exit 4) on a clean
  checkout: those variants change only the launchers, so there is no header patch, and ``git
  apply`` of no file read its standard input (/dev/null) and failed. Their header is stock, as
  the caveat the command prints says; it is now written (exit 0) with that caveat.
- ``build --kernels-only`` in a work directory whose name is not UTF-8 (``$'w\xff'``, which
  fetch, apply and the dry run take) was a ``UnicodeEncodeError`` traceback: first at the log's
  first line (the command as it ran, ``runner.open_log``), then at the narrowed sources, whose
  header names their path (``confine.write_file``). Both now write such a byte as itself, as
  the console does (``surrogateescape``). nvcc itself then fails on such a path (left open).
  The same strict encoding sent ``report --repeats`` the wrong way: result files whose names
  are not UTF-8 were "a field the report reads is missing or not what kvprefetch writes
  (UnicodeEncodeError ...) / To fix: pass a JSON file written by kvprefetch bench or verify,
  unedited", for unedited files.
- ``fetch --source DIR`` where DIR holds a file whose name is not UTF-8 (a stray
  ``csrc/n\xff.cu`` beside an unpacked sdist) was a ``UnicodeEncodeError`` traceback in the
  source's digest (``hashing.manifest_digest``); it is now the usual "not the complete vLLM
  v0.10.2 source" (exit 3).
- Under ``ulimit -f 0``, ``diff-upstream``, ``export-header``, ``build`` and ``doctor`` said
  "No usable temporary directory found in [...] / To fix: check the path and its file
  system, then rerun" (Python's temp folder search writes a 4-byte file in each): no path named,
  and no check of a folder fixes it. The message now names the file-size limit and its fix
  (``oserrors.describe``).
- ``export-header -o`` (and every file the kit writes) to a legal name of 236 to 255 bytes
  failed with "use a shorter path: Linux takes at most 4095 bytes in a whole path and 255 in
  one name": the kit's own temporary, ``.<name>.tmp-<hex>-<pid>``, was the name too long. The
  temporary's name is now cut to fit (``confine.open_new``).
- With ``PYTHONIOENCODING=utf-16`` in the user's shell, ``build --kernels-only`` (its dry run
  too) said "<python> did not answer the torch probe as a Python interpreter with torch does /
  To fix: pass --torch-from ... an interpreter that has a CUDA build of torch", of the kit's own
  interpreter, which has one: the probe printed its record in UTF-16. The probe's output is now
  asked for in UTF-8 (``torch_probe.probe_torch``).
- ``fetch --index-url`` (or ``PIP_INDEX_URL``) holding a byte that is not UTF-8 said "cannot
  reach the package index ...: UnicodeEncodeError / To fix: check the network": the URL is
  refused as no URL now (``download.check_index_url``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **extra: str | bytes) -> dict[str | bytes, str | bytes]:
    env: dict[str | bytes, str | bytes] = {
        k: v for k, v in os.environ.items()
        if k not in ("KVPREFETCH_WORKDIR", "KVPREFETCH_CAMPAIGN")}
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path))
    env.update(extra)
    return env


def _kit(tmp_path: Path, *args: str | bytes,
         **extra: str | bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args],
                          env=_env(tmp_path, **extra),  # type: ignore[arg-type]
                          capture_output=True, text=True, errors="replace", timeout=120,
                          check=False)


@pytest.mark.parametrize("option", ["--scratch", "--source", "--python", "PATH"])
def test_a_path_that_is_not_utf8_is_refused_by_slurm_plan_not_a_traceback(tmp_path: Path,
                                                                          option: str) -> None:
    odd = os.fsencode(tmp_path) + b"/odd\xff"
    os.mkdir(odd)
    if option == "--python":  # an interpreter under that name
        odd += b"/python"
        os.symlink(sys.executable, odd)
    campaign = tmp_path / "camp"
    args: list[str | bytes] = ["slurm", "plan", str(campaign), "--stand-in", "--no-gpu"]
    extra: dict[str, str | bytes] = {}
    if option == "PATH":
        extra["PATH"] = odd + b":" + os.fsencode(os.environ.get("PATH", "/usr/bin:/bin"))
    else:
        args += [option, odd]
    res = _kit(tmp_path, *args, **extra)
    assert "Traceback" not in res.stderr, res.stderr  # without the fix: UnicodeEncodeError
    assert res.returncode == 2, res.stderr
    assert "is not UTF-8 text" in res.stderr and option in res.stderr, res.stderr
    assert "To fix" in res.stderr
    assert not campaign.exists() or not any((campaign / "scripts").iterdir())


def test_a_log_and_a_file_naming_a_path_that_is_not_utf8_are_written(tmp_path: Path) -> None:
    from kvprefetch.runner import run
    from kvprefetch.workspace.confine import write_file, write_if_changed

    odd = Path(os.fsdecode(os.fsencode(tmp_path) + b"/w\xff"))
    odd.mkdir()
    log = odd / "logs" / "01-step.log"
    # without the fix: UnicodeEncodeError writing the command line into the log
    run(["/bin/echo", str(odd / "x")], log=log, echo=False)
    assert os.fsencode(odd / "x") in log.read_bytes()
    text = f"// Generated by kvprefetch from {odd / 'src.cu'}\n"
    write_file(odd / "a.cu", text)  # without the fix: UnicodeEncodeError
    assert write_if_changed(odd / "b.cu", text)
    for name in ("a.cu", "b.cu"):
        assert (odd / name).read_bytes() == text.encode("utf-8", "surrogateescape")
    assert not write_if_changed(odd / "b.cu", text)  # the same bytes: not written again


def test_report_repeats_of_results_whose_names_are_not_utf8_is_written(tmp_path: Path) -> None:
    result = _REPO / "docs" / "results" / "2026-11-29-h200-l2-bound" / "matrix-aliased.json"
    odd = os.fsencode(tmp_path) + b"/r\xff.json"
    with open(odd, "wb") as f:
        f.write(result.read_bytes())
    out = tmp_path / "out"
    res = _kit(tmp_path, "report", "--repeats", "runs", odd, odd, "--out", str(out),
               "--formats", "md")
    # without the fix: exit 7, "a field the report reads is missing ... (UnicodeEncodeError"
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "UnicodeEncodeError" not in res.stderr
    assert b"r\xff.json" in (out / "runs.md").read_bytes()


def test_a_source_folder_holding_a_name_that_is_not_utf8_is_refused_not_a_traceback(
        tmp_path: Path, vllm_sdist: Path) -> None:
    import tarfile

    with tarfile.open(vllm_sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    source = tmp_path / "src" / "vllm-0.10.2"
    with open(os.fsencode(source) + b"/csrc/n\xff.cu", "wb"):
        pass
    res = _kit(tmp_path, "fetch", "--workdir", str(tmp_path / "work"), "--source", str(source))
    assert "Traceback" not in res.stderr, res.stderr  # without the fix: UnicodeEncodeError
    assert res.returncode == 3, res.stderr
    assert "not the complete vLLM v0.10.2 source" in res.stderr and "To fix" in res.stderr


def test_no_usable_temp_folder_under_a_file_size_limit_names_the_limit(
        tmp_path: Path, fetched_workdir: Path) -> None:
    import resource

    def no_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))

    res = subprocess.run([sys.executable, "-m", "kvprefetch", "export-header", "--workdir",
                          str(fetched_workdir), "-o", str(tmp_path / "h.cuh")],
                         env=_env(tmp_path), capture_output=True, text=True,  # type: ignore[arg-type]
                         timeout=120, check=False, preexec_fn=no_files)
    assert res.returncode == 4 and "Traceback" not in res.stderr, res.stderr
    # without the fix: "To fix: check the path and its file system, then rerun"
    assert "ulimit -f" in res.stderr and "check the path" not in res.stderr, res.stderr


@pytest.mark.parametrize("length", [240, 255])
def test_a_file_of_a_legal_long_name_is_written(tmp_path: Path, fetched_workdir: Path,
                                                length: int) -> None:
    out = tmp_path / "out" / ("h" * (length - 4) + ".cuh")
    res = _kit(tmp_path, "export-header", "--workdir", str(fetched_workdir), "-o", str(out))
    # without the fix: exit 4, "use a shorter path: ... 255 in one name of it"
    assert res.returncode == 0, res.stderr
    assert out.is_file() and os.listdir(out.parent) == [out.name]


def test_a_users_pythonioencoding_never_makes_the_torch_probe_unreadable(
        tmp_path: Path, fetched_workdir: Path) -> None:
    assert _kit(tmp_path, "apply", "--workdir", str(fetched_workdir)).returncode == 0
    res = _kit(tmp_path, "build", "--workdir", str(fetched_workdir), "--dry-run",
               "--kernels-only", PYTHONIOENCODING="utf-16")
    # without the fix: exit 5, "did not answer the torch probe as a Python interpreter"
    assert res.returncode == 0, res.stderr
    assert "torch probe" not in res.stderr.replace("\x00", "")


def test_a_users_pythonioencoding_never_makes_the_environment_probe_unreadable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch.machine.envs import VenvEnv

    env_path = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_path)], check=True,
                   timeout=120)
    monkeypatch.setenv("PYTHONIOENCODING", "utf-16")  # the user's shell, as build inherits it
    info = VenvEnv(env_path).info()  # without the fix: "did not answer the environment probe"
    assert os.path.realpath(info["prefix"]) == os.path.realpath(env_path)


@pytest.mark.parametrize("where", ["--index-url", "PIP_INDEX_URL"])
def test_an_index_url_that_is_not_utf8_is_refused_not_blamed_on_the_network(
        tmp_path: Path, where: str) -> None:
    url = b"http://127.0.0.1:9/\xff/simple"
    args: list[str | bytes] = ["fetch", "--workdir", str(tmp_path / "w"), "--source", "sdist"]
    extra: dict[str, str | bytes] = {}
    if where == "PIP_INDEX_URL":
        extra["PIP_INDEX_URL"] = url
    else:
        args += ["--index-url", url]
    res = _kit(tmp_path, *args, **extra)
    # without the fix: exit 3, "cannot reach the package index ... check the network"
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "check the network" not in res.stderr and where in res.stderr, res.stderr


@pytest.mark.parametrize("variant", ["launch", "control"])
def test_export_header_of_a_launcher_only_variant_writes_the_stock_header(
        tmp_path: Path, fetched_workdir: Path, variant: str) -> None:
    out = tmp_path / "out" / "attention_kernels.cuh"
    res = _kit(tmp_path, "export-header", "--workdir", str(fetched_workdir), "--variant",
               variant, "-o", str(out))
    # without the fix: exit 4, "does not apply to pristine v0.10.2 ... reinstall kvprefetch"
    assert res.returncode == 0, res.stderr
    assert "reinstall" not in res.stderr and "header is stock" in res.stderr, res.stderr
    stock = _kit(tmp_path, "export-header", "--workdir", str(fetched_workdir), "--variant",
                 "prefetch", "-o", str(tmp_path / "prefetch.cuh"))
    assert stock.returncode == 0, stock.stderr
    text = out.read_text()
    assert "#include \"kvprefetch/" not in text and text != (tmp_path / "prefetch.cuh").read_text()
    assert "paged_attention_kernel" in text
