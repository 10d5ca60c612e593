"""Issue 41, the thirty-first hostile pass (tester b: every option of fetch, clean, report, vmm,
verify-kernel, bench decode/e2e/ncu and every slurm subcommand, fuzzed with hostile values).
Each test fails without its fix (checked by reverting ``src`` and running it):

- **An output name of 251 to 255 bytes was taken, and its outputs then failed with the wrong
  fix.** ``bench kernel/decode/ncu/e2e --name NAME`` and ``report --repeats NAME`` write
  ``NAME.json``/``.md``/``.png``; ``plan.check_output_name`` refused folders and control
  characters but not a name whose ``NAME.json`` is past Linux's 255 bytes in one name. Such a
  name passed the command line (and a bench run's dry run); writing the first output said "File
  name too long / To fix: use a shorter path ... (the --workdir, -o/--out or campaign folder
  that named it)", which the folder was not (a bench run had measured first). The same for
  ``report FILE`` whose name, less ``.json``, is past 250 bytes. Now the name is refused where
  it is given: a usage error naming the option (or, for ``report FILE``, the input to
  rename), before anything runs or is written.
- **``slurm plan --python /proc/self/exe`` was planned.** The plan checked that ``--python`` is
  an absolute path to an executable file here, where ``/proc/self/exe`` is the kit's own
  Python; in the job the same name is the job's bash, so every job ran ``bash -m kvprefetch
  ...``, which said only "kvprefetch: kvprefetch: Is a directory" (exit 126, no fix). The same
  for ``/proc/<pid>/exe`` (another process, or none, on the node) and ``/dev/stdin`` (a link
  into ``/proc``). ``values.check_python`` now refuses a ``--python`` reached through
  ``/proc``, by its name or any link on the way.
- **A ``file://`` package index in pip's own layout was refused with the wrong fix.** ``fetch
  --index-url file:///mirror/simple/`` (or ``PIP_INDEX_URL``) read the project page
  ``.../simple/vllm/`` as a file; in the layout pip and uv read (and doctor calls reachable),
  that is a folder holding ``index.html``, so fetch said "is not a regular file (a FIFO,
  device, socket or folder) / To fix: use PyPI or a faithful mirror", which the mirror was.
  Now a folder's ``index.html`` is the page (``download._file_page``), opened as before: a FIFO
  there is still refused, never waited on.
- **``slurm plan --source /dev/null`` (or a FIFO, a socket) was planned**, and the prepare job
  then said "--source /dev/null is not there (as the jobs see the filesystem) / To fix: put the
  sdist or clone on a filesystem every node mounts", which it was. ``fetch --source`` names such
  a path for what it is; now ``values.check_source`` does the same at plan (and on every load of
  the campaign: the prepare job names a source that became one since).

Nothing is mocked: the real CLI in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli_split
from tests.integration.test_reliability import outside
from tests.unit.test_repeats import three_runs

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPREFETCH")}
    env.update(PYTHONPATH=SRC, TMPDIR=str(tmp_path))
    return env


def _runs(tmp_path: Path) -> list[str]:
    files = []
    for i, d in enumerate(three_runs()):
        f = tmp_path / f"run-{i}.json"
        f.write_text(json.dumps(d))
        files.append(str(f))
    return files


@pytest.mark.parametrize("length", [251, 255])
def test_a_repeats_name_past_one_names_bytes_is_a_usage_error(tmp_path: Path,
                                                               length: int) -> None:
    files = _runs(tmp_path)
    out = tmp_path / "out"
    res = kvprefetch_cli_split("report", "--repeats", "r" * length, "--formats", "md",
                               "--out", str(out), *files, env=_env(tmp_path), cwd=tmp_path)
    text = res.stdout + res.stderr
    # without the fix: exit 7, "File name too long / To fix: use a shorter path ... (the
    # --workdir, -o/--out or campaign folder that named it)"
    assert res.returncode == 2, text
    assert "--repeats" in text and "too long a name" in text and "To fix" in text, text
    assert "Traceback" not in text and "shorter path" not in text, text
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())
    # 250 bytes (250.json is 255) is a legal name, written as asked
    ok = kvprefetch_cli_split("report", "--repeats", "r" * 250, "--formats", "md",
                              "--out", str(out), *files, env=_env(tmp_path), cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (out / ("r" * 250 + ".json")).is_file()


@pytest.mark.parametrize("command", ["kernel", "decode", "ncu", "e2e"])
def test_a_bench_name_past_one_names_bytes_is_refused_before_the_run(tmp_path: Path,
                                                                     command: str) -> None:
    name = "n" * 252
    res = kvprefetch_cli_split("bench", command, "--workdir", str(tmp_path / "none"),
                               "--dry-run", "--name", name, "--out", str(tmp_path / "o"),
                               env=_env(tmp_path), cwd=tmp_path, timeout=120)
    text = res.stdout + res.stderr
    # without the fix the dry run took it (exit 0 or another refusal), and a real run
    # measured, then failed on writing <name>.json with "use a shorter path"
    assert res.returncode == 2, text
    assert "--name" in text and "too long a name" in text and "Traceback" not in text, text
    assert not (tmp_path / "o").exists()


def test_a_result_file_whose_name_is_too_long_for_its_outputs_is_named(tmp_path: Path) -> None:
    src = tmp_path / ("x" * 254)  # no .json: its outputs would be x*254.md / .png
    src.write_text(json.dumps(three_runs()[0]))
    out = tmp_path / "out"
    res = kvprefetch_cli_split("report", str(src), "--out", str(out), env=_env(tmp_path),
                               cwd=tmp_path)
    text = res.stdout + res.stderr
    # without the fix: "File name too long / To fix: use a shorter path ... -o/--out ..."
    assert res.returncode != 0 and "Traceback" not in text, text
    assert "rename the result file" in text and "shorter path" not in text, text
    assert not out.exists() or not any(out.iterdir())



@pytest.mark.parametrize("python", ["/proc/self/exe", "/dev/stdin", "/proc/{pid}/exe"],
                         ids=["self-exe", "dev-stdin", "pid-exe"])
def test_a_python_reached_through_proc_is_refused_at_plan(tmp_path: Path, python: str) -> None:
    camp = tmp_path / "camp"
    py = python.format(pid=os.getpid())
    with open(sys.executable, "rb") as stdin:  # /dev/stdin: a regular, executable file here
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                              "--stand-in", "--batch", "1", "--python", py],
                             env=_env(tmp_path), stdin=stdin, capture_output=True, text=True,
                             timeout=120, check=False, cwd=tmp_path)
    text = res.stdout + res.stderr
    # without the fix: exit 0, and the job ran its own bash as python ("Is a directory")
    assert res.returncode == 2, text
    assert "through /proc" in text and "To fix" in text and "Traceback" not in text, text
    assert not camp.exists()
    # the interpreter by its own path is planned as before
    ok = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                         "--stand-in", "--batch", "1", "--python", sys.executable],
                        env=_env(tmp_path), capture_output=True, text=True, timeout=120,
                        check=False, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def _file_index(root: Path, sdist: Path) -> str:
    """A local simple index in pip's layout: ``simple/vllm/index.html`` linking to the sdist."""
    from kvprefetch import upstream

    (root / "simple" / "vllm").mkdir(parents=True)
    (root / "simple" / "vllm" / "index.html").write_text(
        f'<a href="file://{sdist}#sha256={upstream.SDIST_SHA256}">{upstream.SDIST_NAME}</a>\n')
    return f"file://{root}/simple/"


def test_a_file_index_in_pips_layout_is_read(tmp_path: Path, vllm_sdist: Path) -> None:
    from kvprefetch import upstream
    from kvprefetch.hashing import sha256_file

    url = _file_index(tmp_path / "mirror", vllm_sdist)
    work = tmp_path / "work"
    res = kvprefetch_cli_split("fetch", "--workdir", str(work), "--source", "sdist",
                               "--index-url", url, "--only", "baseline",
                               env=_env(tmp_path), cwd=tmp_path, timeout=300)
    text = res.stdout + res.stderr
    # without the fix: exit 3, "file://.../simple/vllm/ is not a regular file (a FIFO, device,
    # socket or folder) / To fix: use PyPI or a faithful mirror"
    assert res.returncode == 0, text
    assert sha256_file(work / "downloads" / upstream.SDIST_NAME) == upstream.SDIST_SHA256


def test_a_fifo_at_a_file_indexs_page_is_still_refused(tmp_path: Path, vllm_sdist: Path) -> None:
    from kvprefetch.errors import FetchError
    from kvprefetch.sources.download import ensure_sdist

    url = _file_index(tmp_path / "mirror", vllm_sdist)
    page = tmp_path / "mirror" / "simple" / "vllm" / "index.html"
    page.unlink()
    os.mkfifo(page)
    with pytest.raises(FetchError) as exc:  # not a wait for a writer
        ensure_sdist(tmp_path / "dl", url)
    assert "index.html is not a regular file" in exc.value.cause


@pytest.mark.parametrize("kind", ["dev-null", "fifo"])
def test_plan_refuses_a_source_that_is_no_file_and_no_folder(tmp_path: Path, kind: str) -> None:
    src = "/dev/null" if kind == "dev-null" else str(tmp_path / "fifo")
    if kind == "fifo":
        os.mkfifo(src)
    camp = tmp_path / "camp"
    res = kvprefetch_cli_split("slurm", "plan", str(camp), "--stand-in", "--batch", "1",
                               "--source", src, env=_env(tmp_path), cwd=tmp_path, timeout=120)
    text = res.stdout + res.stderr
    # without the fix: exit 0, and the prepare job said the source "is not there"
    assert res.returncode == 2, text
    assert "neither a vLLM sdist file nor a folder" in text and "To fix" in text, text
    assert not camp.exists()


def test_prepare_names_a_source_that_became_a_fifo(tmp_path: Path) -> None:
    src = tmp_path / "vllm-0.10.2.tar.gz"
    src.write_bytes(b"not yet")
    camp = tmp_path / "camp"
    env = _env(tmp_path)
    plan = kvprefetch_cli_split("slurm", "plan", str(camp), "--stand-in", "--batch", "1",
                                "--source", str(src), env=env, cwd=tmp_path, timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    src.unlink()
    os.mkfifo(src)
    res = kvprefetch_cli_split("slurm", "prepare", str(camp), env={**env, "SLURM_JOB_ID": "7"},
                               cwd=tmp_path, timeout=120)
    text = res.stdout + res.stderr
    # without the fix: "--source ... is not there (as the jobs see the filesystem)"
    assert res.returncode != 0 and "Traceback" not in text, text
    assert "is a FIFO" in text and "not there" not in text, text
