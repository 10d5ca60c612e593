"""Issue 41, the twentieth hostile pass (tester c: every command, option, input and environment
value, for tracebacks, hangs, wrong messages and wrong writes). Each test fails without its fix
(checked by reverting ``src`` and running it):

- ``bench kernel``/``bench decode``/``bench e2e`` size lists (``--batch``, ``--context``,
  ``--block-size``, ``--max-num-seqs``) had no ceiling, and ``matrix.parse_sizes`` dropped
  duplicates by searching a list, quadratic in the sizes: ``--batch 1,2,...,20000`` kept a dry
  run busy for more than a minute, and twelve such options (the command line takes 2 MB) for
  many minutes (the nineteenth pass had left the lists open at 5,000 sizes, 17 s); a cross
  product of 400 batches by 400 contexts planned 160,000 shapes and printed them all. Now a
  list of more than ``matrix.MAX_SHAPES`` (100,000, the largest ``--sample``'s steps) sizes, or
  a plan of more shapes, is refused at once, naming the ceiling, with a fix (exit 2).
- ``slurm publish`` took a ``SLURM_JOB_ID`` of any number of digits as a job id: 300 digits made
  a logs folder name past 255 bytes, "File name too long" with the fix "use a shorter path",
  which names the campaign, shortened in vain (the environment driver, 3 runs). Slurm's job ids
  are 32-bit: now more than 10 digits (a part) is no Slurm job id, refused as one (exit 10).
- ``slurm plan`` took any number of contexts and presets (its batches are capped at 1000): each
  bench task times its batch at every preset and context, so 101 presets by 1,000 contexts
  planned a campaign whose every bench task would plan 101,000 shapes, refused (since the fix
  above) on the cluster after its wait in the queue. Now the plan refuses it (exit 2), as does
  every command that reads such a campaign.json.
- ``fetch --dry-run --source PATH`` did not look at a local source: an empty folder, or a file
  that is no sdist, was planned "would-create" with exit 0 and a check mark, where the real run
  stops at once (exit 3) (the option driver: a ``--source`` naming a header file, 3 runs). Now
  the dry run checks a local source as the real run does (an sdist's sha256, a folder's files)
  and refuses it with the real run's message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path))
    return env


def _sizes(first: int, last: int, step: int = 1) -> str:
    return ",".join(str(n) for n in range(first, last + 1, step))


# twelve --batch options of 15,000 sizes each (each under the kernel's 128 KiB an argument)
_MANY_BATCHES = [a for i in range(12) for a in ("--batch", _sizes(i * 15000 + 1, (i + 1) * 15000))]
_CROSS = ["--batch", _sizes(1, 400), "--context", _sizes(16, 6400, 16)]


@pytest.mark.parametrize("command", [
    ["bench", "kernel", *_MANY_BATCHES, "--context", "1k"],
    ["bench", "decode", *_MANY_BATCHES, "--context", "1k"],
    ["bench", "kernel", *_CROSS],
    ["bench", "decode", *_CROSS],
], ids=["kernel-many-batches", "decode-many-batches", "kernel-cross", "decode-cross"])
def test_a_bench_plan_of_too_many_sizes_or_shapes_is_refused_at_once(
        tmp_path: Path, command: list[str]) -> None:
    work = tmp_path / "work"  # no work directory is needed to plan a dry run
    start = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-m", "kvprefetch", *command, "--workdir",
                              str(work), "--dry-run"], env=_env(tmp_path), cwd=tmp_path,
                             capture_output=True, text=True, timeout=25, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command[:2]} with {len(command)} arguments still planning after 25 s")
    text = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in text and "To fix" in text, text[-2000:]
    assert "at most 100000" in text, text[-2000:]
    assert time.monotonic() - start < 25


@pytest.mark.parametrize("job_id", ["1" * 300, "1_" + "2" * 300, "12345678901"])
def test_a_slurm_job_id_of_too_many_digits_is_no_job_id(tmp_path: Path, job_id: str) -> None:
    camp, scratch = tmp_path / "camp", tmp_path / "scratch"
    (scratch / "logs").mkdir(parents=True)
    (scratch / "logs" / "build.log").write_text("log\n")
    env = _env(tmp_path)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--no-gpu"], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stderr
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "publish", str(camp),
                          "--tree", "baseline", "--scratch", str(scratch), "--logs-only"],
                         env={**env, "SLURM_JOB_ID": job_id}, capture_output=True, text=True,
                         timeout=60, check=False)
    text = res.stdout + res.stderr
    assert res.returncode == 10 and "Traceback" not in text, text[-2000:]
    assert "is not a Slurm job id" in text and "To fix" in text, text[-2000:]
    assert "shorter path" not in text and not any((camp / "logs").iterdir()), text[-2000:]


def test_a_campaign_whose_bench_tasks_would_plan_too_many_shapes_is_refused_at_the_plan(
        tmp_path: Path) -> None:
    camp = tmp_path / "camp"
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--no-gpu", "--context", _sizes(16, 16000, 16),
                          "--preset", ",".join(["llama-3.1-8b"] * 101)],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=60,
                         check=False)
    text = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in text and "To fix" in text, text[-2000:]
    assert "make 101000 shapes" in text and not camp.exists(), text[-2000:]


@pytest.mark.parametrize("kind", ["empty-folder", "not-an-sdist"])
def test_a_dry_run_refuses_a_local_source_the_real_run_refuses(tmp_path: Path, kind: str) -> None:
    source = tmp_path / "src"
    if kind == "empty-folder":
        source.mkdir()
    else:
        source.write_text("#pragma once\n")
    work = tmp_path / "work"
    runs = {}
    for dry in (["--dry-run"], []):
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--workdir", str(work),
                              "--source", str(source), *dry], env=_env(tmp_path), cwd=tmp_path,
                             capture_output=True, text=True, timeout=60, check=False)
        runs[bool(dry)] = res
        text = res.stdout + res.stderr
        assert res.returncode == 3 and "Traceback" not in text and "To fix" in text, text
        assert "would-create" not in text and not work.exists(), text
    assert runs[True].stderr.splitlines()[-2:] == runs[False].stderr.splitlines()[-2:]
