"""Issue 41, the twenty-fifth hostile pass (tester b: campaigns from the command line, reports
and outputs; this pass: matplotlib with hostile text and settings). Each test fails without its
fix (checked by reverting ``src`` and running it):

- ``report RESULT.json`` run in a folder holding a ``matplotlibrc`` (a campaign's
  ``results/``, where the jobs and whoever can write the campaign put files): matplotlib reads
  ``matplotlibrc`` from the current folder first, and its ``figure.hooks: mod:fn`` made every
  figure import ``mod`` and call ``fn`` (a module planted beside it ran: code taken from the
  campaign; ``text.usetex: True`` had latex run on every label; 1 run each). Now the figures are
  drawn with matplotlib's own defaults (``render.pyplot`` calls ``rcdefaults``), whatever
  matplotlibrc the folder, ``$MATPLOTLIBRC``, ``$MPLCONFIGDIR`` or ``~/.config`` holds.
- ``report`` of a result whose names hold two ``$`` (a ``bench decode`` model named after its
  folder, ``models/$\\frac{$/config.json``; a variant, shape or environment name): matplotlib
  read the title or label as mathtext and the PNG failed "a field the report reads is missing or
  not what kvprefetch writes (ValueError: ... ParseSyntaxException) / To fix: pass a JSON file
  written by kvprefetch bench or verify, unedited", the file being unedited (a wrong-way
  message; 2,000 nested ``x^{`` a RecursionError told the same; 1 run each). Now every name
  from a result is drawn as plain text (``render.plain``), the PNG written.
- ``report`` of a result with a name of 100,000 combining accents (a variant; the same for a
  model, a shape label, an environment): the figure's layout ran for more than six minutes and
  was killed for memory (200,000 letters: 40 s; 50,000 tabs: 34 s; a hang; 1 run each). Now a
  name is drawn cut to ``render.MAX_LABEL_CHARS`` characters and ``MAX_LABEL_LINES`` lines, the
  markdown keeping it whole.
- ``report`` of a ``bench decode`` result of 3,000 shapes (5 MB): one bar group per shape, the
  figure 0.9 inch wider each, 37 s (10,000 shapes ran past five minutes; past 72,000 pixels
  Agg refuses the figure; a hang). Pass 22 bounded kernel_png and ncu_png, not decode_png. Now
  it draws the first ``MAX_BARS`` shapes and ``MAX_PANELS`` trees, saying so; the markdown
  lists them all.
- ``report`` of a ``bench ncu`` result of one shape and 2,000 variants (3 MB): a bar and a
  legend entry per variant, 94 s (a hang). Now ncu_png draws the first ``MAX_PANELS``
  variants (e2e_png the first environments, sample_png the first variants), saying so.
- ``slurm status`` (and ``--wait``, ``resubmit``'s look) with a stand-in ``scontrol`` that
  prints without end (``yes``; 3 GB on one line without a newline): the kit kept every
  character for the query's whole minute, and a line without end was read whole; under
  ``ulimit -v`` 3 GB it ended in a ``MemoryError`` traceback after 63 s (1 run each). Now a run
  with a timeout reads a line at most ``runner.LINE_BYTES`` at a time and stops the child (and
  all below it) past ``runner.MAX_TIMED_OUTPUT`` characters: the job is UNKNOWN, its reason
  that scontrol was stopped, in a second.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass24_b import _kit
from tests.integration.test_reliability import outside
from tests.unit.test_report import ncu_doc

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

pytest.importorskip("matplotlib")

_DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"
_KERNEL = _DOCS / "2026-12-01-h200-headline" / "default-matrix.json"
_DECODE = _DOCS / "2026-12-01-h200-decode" / "decode-qwen2.5-7b.json"


@pytest.mark.parametrize("rc", ["figure.hooks: plantedmod:hook", "text.usetex: True"])
def test_a_matplotlibrc_in_the_current_folder_is_never_read(tmp_path: Path, rc: str) -> None:
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    shutil.copy(_KERNEL, results / "r.json")
    marker = tmp_path / "planted-ran"
    (results / "matplotlibrc").write_text(rc + "\n")
    (results / "plantedmod.py").write_text(
        f"open({str(marker)!r}, 'w').close()\ndef hook(fig):\n    pass\n")
    bin_ = tmp_path / "bin"  # a latex that says it ran (and fails), wherever one is installed
    bin_.mkdir()
    (bin_ / "latex").write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\nexit 1\n")
    (bin_ / "latex").chmod(0o755)
    (tmp_path / "mpl").mkdir()
    proc = _kit(results, "report", "r.json", "--out", "out",
                env={"MPLCONFIGDIR": str(tmp_path / "mpl"),
                     "PATH": f"{bin_}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()
    assert (results / "out" / "r.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("name", ["$\\frac{$", "$\\sqrt[$", "a$1_$b",
                                  "$" + "x^{" * 2000 + "x" + "}" * 2000 + "$"])
@pytest.mark.parametrize("kind", ["kernel", "decode"])
def test_a_name_with_dollars_is_drawn_as_text_not_mathtext(tmp_path: Path, name: str,
                                                           kind: str) -> None:
    doc = json.loads((_KERNEL if kind == "kernel" else _DECODE).read_text())
    if kind == "kernel":
        text = json.dumps(doc).replace('"patched"', json.dumps(name))
    else:
        doc["meta"]["model"]["name"] = name
        text = json.dumps(doc)
    (tmp_path / "r.json").write_text(text)
    (tmp_path / "mpl").mkdir()
    proc = _kit(tmp_path, "report", "r.json", "--out", "out",
                env={"MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "out" / "r.png").read_bytes().startswith(b"\x89PNG")


def test_a_name_of_100000_combining_accents_is_drawn_cut_in_seconds(tmp_path: Path) -> None:
    text = json.dumps(json.loads(_KERNEL.read_text())).replace(
        '"patched"', json.dumps("a" + "\u0301" * 100_000))
    (tmp_path / "r.json").write_text(text)
    (tmp_path / "mpl").mkdir()
    proc = _kit(tmp_path, "report", "r.json", "--out", "out", timeout=40,
                env={"MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "r.png").read_bytes().startswith(b"\x89PNG")
    assert "\u0301" * 100_000 in (tmp_path / "out" / "r.md").read_text()  # the markdown: whole


def test_a_decode_figure_of_many_shapes_is_bounded(tmp_path: Path) -> None:
    doc = json.loads(_DECODE.read_text())
    row = doc["results"][0]
    doc["results"] = [dict(row, batch=i + 1, label=f"b{i + 1} x 1k") for i in range(500)]
    (tmp_path / "r.json").write_text(json.dumps(doc))
    (tmp_path / "mpl").mkdir()
    proc = _kit(tmp_path, "report", "r.json", "--out", "out",
                env={"MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert proc.returncode == 0, proc.stderr
    png = (tmp_path / "out" / "r.png").read_bytes()
    width = int.from_bytes(png[16:20], "big")  # the IHDR chunk's width
    assert width < 110 * (0.9 * 48 + 2) + 200, width  # 48 bar groups at 110 dpi, not 500
    assert "b500 x 1k" in (tmp_path / "out" / "r.md").read_text()


def test_an_ncu_figure_of_many_variants_is_bounded(tmp_path: Path) -> None:
    doc = ncu_doc()
    shape = doc["shapes"][0]
    names = [f"v{i}" for i in range(2000)]
    doc["meta"]["variants"] = ["baseline", *names]
    shape["variants"].update({n: shape["variants"]["patched"] for n in names})
    shape["deltas"] = {n: shape["deltas"]["patched"] for n in names}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    (tmp_path / "mpl").mkdir()
    proc = _kit(tmp_path, "report", "r.json", "--out", "out", timeout=45,
                env={"MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "r.png").read_bytes().startswith(b"\x89PNG")
    assert "v1999" in (tmp_path / "out" / "r.md").read_text()


@pytest.mark.parametrize("scontrol", ["exec yes 'JobId=1 JobState=RUNNING'",
                                      "head -c 3000000000 /dev/zero | tr '\\0' x"])
def test_status_stops_an_scontrol_that_prints_without_end(tmp_path: Path,
                                                          scontrol: str) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in (("sbatch", "echo $$"), ("squeue", "exit 0"), ("scontrol", scontrol)):
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"),
               TMPDIR=str(tmp_path), HOME=str(tmp_path), PATH=f"{bin_}:/usr/bin:/bin")
    kit = [sys.executable, "-m", "kvprefetch", "slurm"]
    camp = tmp_path / "camp"
    for args in (["plan", str(camp), "--stand-in", "--batch", "1", "--python", sys.executable],
                 ["submit", str(camp)]):
        done = subprocess.run([*kit, *args], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr

    def limit() -> None:  # what a login node's limits do to a process that fills memory
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    proc = subprocess.run([*kit, "status", str(camp)], env=env, capture_output=True, text=True,
                          timeout=40, check=False, preexec_fn=limit)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "stopped by the kit" in proc.stdout
