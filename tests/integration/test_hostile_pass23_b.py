"""Issue 41, the twenty-third hostile pass (tester b: campaigns from the command line, reports
and outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``report --index R --out FILE`` and ``report --readme README.md`` with text that has no UTF-8
  bytes: a lone surrogate from a ``\\ud800``/``\\udcff`` escape in a run's ``provenance.json``
  (its ``gpu``, a headline's ``text``), in a timing file's ``machine``, or a run folder whose
  name is not UTF-8 (read with ``surrogateescape``), ended in a ``UnicodeEncodeError`` traceback
  at ``confine.write_file``'s encode (1 run each). Now ``write_file`` (and ``write_if_changed``)
  name the character and its line with the fix, in the caller's family (exit 7), nothing
  written; since the merge with tester c's fix a ``\\udc80``-``\\udcff`` escape (a byte of a
  name) is written as its byte, and the folder's name with it.
- ``slurm stand-in`` (and every command that finds builds: ``bench kernel``/``ncu``/``decode``,
  ``verify-kernel``, ``slurm publish``) with a kernels-only manifest in ``work/build`` whose
  ``so_path`` is a name past 255 bytes: ``Path.is_file`` raised ENAMETOOLONG, and the command
  line's fix for it was "use a shorter path ... (the --workdir, -o/--out or campaign folder
  that named it)", the user sent to the folder they typed (a wrong-way message; 1 run). Now
  the manifest is named as corrupt with the fix to rebuild or move that build away (exit 7).
- ``bench ncu`` names its files ``ncu-<shape>-<tree>.log``/``.csv`` after each build's
  ``tree``, read from its manifest in ``build/`` as it stood: a manifest whose tree is
  ``../../../../outside/pwn``, with a folder ``bench/ncu-1-..`` made beside it (by whoever can
  write the work directory), had the kit append its log (``runner.open_log`` made the folders
  on the way) and hand ncu a ``--log-file`` in a folder outside the work directory (1 run of 1,
  with a stand-in ncu; the log is the kit's own write). Now a manifest's tree must be a tree
  name (``upstream.TREE_NAME``, the rule ``check_tree_name`` keeps, moved below the kernels
  layer that reads manifests): corrupt, named with the fix, nothing run or written.
- ``bench e2e`` names each run's files ``runs/<env>-seqs<M>-r<R>.json``/``.log`` after the
  environment's name, read from the verify-kernel report in the work directory (the keys of
  its ``envs``): a name ``../../../../outside/pwn`` had the kit make that folder outside, append
  its log there and hand vLLM an ``--output-json`` there (1 run of 1, with a stand-in for an
  environment's python that has vLLM). Now an environment's name from the report must be a
  plain name (``plan.check_output_name``'s rule): the report is malformed, named with the fix
  (exit 7; a dry run says it would refuse), nothing run or written. (A name typed as ``--env
  NAME=PYTHON`` must be one the report covers, so it is held to the same rule.)
- ``slurm status`` while a ``submit`` waits on its first sbatch (a slow controller): the
  record's ``sending`` is what a submit killed there leaves, and status said that sbatch "was
  started ... and stopped before its job id was recorded", its fix to ``scancel`` the job and
  send it and the rest again, while the live submit was about to record it (a wrong-way
  message; 1 run of 1 with a stand-in sbatch that answers after 3 s). Now status takes the
  campaign's lock first when a sending is recorded and nothing yet submitted: a submit at work
  is the lock's message (exit 8, "wait for it to finish"); after it, the record is read anew.
- ``report --readme`` with a ``<!-- report PATH seeds|twins|bounds|host|decode -->`` block
  whose PATH is a name past 255 bytes: ``Path.is_file`` raised ENAMETOOLONG, and the fix was
  "use a shorter path ... (the --workdir, -o/--out or campaign folder that named it)" (a
  wrong-way message; 1 run each). Now the block is named with the path it names (exit 7).
- ``report ./..json`` (and ``./...json``, ``./.json.gz``, a file name with a newline or an
  escape): a report takes its input's name, and ``write_outputs``' check of that name said
  "'.' is not a file name ...; give the folder with --out / To fix: correct the command line",
  where no --out helps (a wrong-way message; 1 run each). Now the input is named with the fix
  to copy or rename it (exit 7), before anything is read or written.
- ``bench e2e`` made its folders with ``mkdir(parents=True)`` and opened its run logs by path
  (the bench commands never recorded the work directory as one, so ``runner.open_log`` did not
  confine them): with ``bench/e2e`` in the work directory a link to a folder outside, the kit
  made ``runs/`` there, appended both runs' logs and had vLLM write its results there; with
  ``models/`` a link, it wrote the dummy model's four files outside (1 run each, with a
  stand-in python). Now the bench plans record the work directory (``output_dir``) and the
  runs make their folders from it down (``plan.make_dir``; ``bench ncu`` too), the model's
  files written from it down: the link is refused (exit 7), nothing outside.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass22_b import _kit
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"
_DOCS = Path(__file__).resolve().parents[2] / "docs"


def _runs(tmp_path: Path) -> Path:
    """One committed run (provenance.json and the kernel result its headline names)."""
    run = tmp_path / "runs" / "2026-12-01-h200-headline"
    run.mkdir(parents=True)
    src = _DOCS / "results" / "2026-12-01-h200-headline"
    for name in ("provenance.json", "default-matrix.json"):
        shutil.copy(src / name, run / name)
    return run


def _edit(path: Path, **fields: object) -> None:
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))  # ensure_ascii: a lone surrogate as its \u escape


@pytest.mark.parametrize("where", ["gpu", "headline"])
def test_an_index_of_text_with_no_utf8_bytes_is_one_message_not_a_traceback(
        tmp_path: Path, where: str) -> None:
    run = _runs(tmp_path)
    if where == "gpu":
        _edit(run / "provenance.json", gpu="H200 \ud800")
    else:
        _edit(run / "provenance.json", headline=[{"text": "fast \udbff"}])
    out = tmp_path / "results.md"
    res = _kit(tmp_path, "report", "--index", str(run.parent), "--out", str(out))
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text, text
    assert "lone surrogate" in text and "To fix: correct that record" in text, text
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_index_of_a_run_folder_whose_name_is_not_utf8_names_it_as_its_bytes(
        tmp_path: Path) -> None:
    """A run folder whose name is the byte 0xff (read with ``surrogateescape``) was the same
    traceback; since the merge with tester c's fix (``confine._encoded``) the index names it by
    its bytes, as every file the kit writes names a path, so its link leads to the folder."""
    run = _runs(tmp_path)
    other = Path(os.fsdecode(bytes(run.parent) + b"/\xff"))
    shutil.copytree(run, other)
    out = tmp_path / "results.md"
    res = _kit(tmp_path, "report", "--index", str(run.parent), "--out", str(out))
    assert res.returncode == 0 and "Traceback" not in res.stdout + res.stderr, res.stderr
    assert b"\xff" in out.read_bytes()


def test_a_readme_of_text_with_no_utf8_bytes_is_one_message_not_a_traceback(
        tmp_path: Path) -> None:
    timings = tmp_path / "t.json"
    shutil.copy(next((_DOCS / "timings").glob("*.json")), timings)
    _edit(timings, machine="H200 \ud800")
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- timings t.json -->\n<!-- /timings -->\n")
    before = readme.read_bytes()
    res = _kit(tmp_path, "report", "--readme", str(readme))
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text, text
    assert "lone surrogate" in text and "(line " in text, text
    assert readme.read_bytes() == before


def test_a_manifest_naming_a_library_no_file_can_be_is_blamed_not_the_campaign(
        tmp_path: Path) -> None:
    from tests.integration.test_hostile_pass19_b import _plan

    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    build = camp / "work" / "build" / "baseline" / "k1"
    build.mkdir(parents=True)
    (build / "manifest.json").write_text(json.dumps({
        "tree": "baseline", "variant": "stock", "namespace": "ns", "so_path": "x" * 300,
        "so_sha256": "0" * 64, "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["fp16"]}))
    res = _kit(tmp_path, "slurm", "stand-in", str(camp), "--task", "0")
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text, text
    assert f"build manifest {build / 'manifest.json'} names the library" in text, text
    assert "shorter path" not in text and "To fix: rebuild the tree" in text, text
    assert not (camp / "results" / "bench-0.json").exists()


def _manifest(build: Path, tree: str) -> None:
    build.mkdir(parents=True)
    (build / "lib.so").write_bytes(b"")
    (build / "manifest.json").write_text(json.dumps({
        "tree": tree, "variant": "stock", "namespace": "ns", "so_path": "lib.so",
        "so_sha256": "0" * 64, "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["fp16"]}))


def test_a_manifests_tree_never_leads_bench_ncus_files_out_of_the_work_directory(
        tmp_path: Path, outside: Path) -> None:
    wd = tmp_path / "work"
    _manifest(wd / "build" / "baseline" / "k", "baseline")
    _manifest(wd / "build" / "evil" / "k", "../../../../outside/pwn")
    (wd / "bench" / "ncu-1-..").mkdir(parents=True)
    ncu = tmp_path / "fakencu"  # writes a CSV of ncu's shape wherever --log-file says
    ncu.write_text(
        "#!/bin/bash\n"
        'while [ $# -gt 0 ]; do [ "$1" = --log-file ] && f=$2; shift; done\n'
        "printf '%s\\n' '\"ID\",\"Process ID\",\"Kernel Name\",\"gpu__time_duration.sum\"' "
        "'\"\",\"\",\"\",\"ns\"' '\"0\",\"1\",\"paged_attention_v2_kernel\",\"1000\"' > \"$f\"\n")
    ncu.chmod(0o755)
    res = _kit(tmp_path, "bench", "ncu", "--workdir", str(wd), "--ncu", str(ncu),
               "--shape", "1x4k")
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text, text
    assert "is corrupt: its tree '../../../../outside/pwn' is not a tree name" in text, text
    assert not (outside / "pwn.log").exists() and not (outside / "pwn.csv").exists()


def _fake_vllm_python(tmp_path: Path) -> Path:
    """A stand-in for an environment's python with vLLM: prints a version, and writes a
    throughput result where --output-json says."""
    py = tmp_path / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/bash\n"
                  '[ "$1" = -I ] && shift  # the kit runs it isolated (bench e2e)\n'
                  'if [ "$1" = -c ]; then echo 0.10.2; exit 0; fi\n'
                  'while [ $# -gt 0 ]; do [ "$1" = --output-json ] && f=$2; shift; done\n'
                  "echo '{\"tokens_per_second\": 100.0, \"num_requests\": 10, "
                  "\"elapsed_time\": 1.0}' > \"$f\"\n")
    py.chmod(0o755)
    return py


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_an_environments_name_never_leads_bench_e2es_files_out_of_the_work_directory(
        tmp_path: Path, outside: Path, dry_run: list[str]) -> None:
    wd = tmp_path / "work"
    (wd / "verify").mkdir(parents=True)
    py = str(_fake_vllm_python(tmp_path))
    (wd / "verify" / "report.json").write_text(json.dumps({
        "passed": True, "envs": {"baseline": {"python": py},
                                 "../../../../outside/pwn": {"python": py}}}))
    res = _kit(tmp_path, "bench", "e2e", "--workdir", str(wd), "--max-num-seqs", "1",
               "--repeats", "1", *dry_run)
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == (0 if dry_run else 7), text
    assert "an environment's name '../../../../outside/pwn' is not a plain name" in text, text
    assert sorted(p.name for p in outside.iterdir()) == ["baseline.json", "notes.txt", "patched"]



def test_status_during_a_submits_first_sbatch_says_to_wait_not_to_send_again(
        tmp_path: Path) -> None:
    from tests.integration.test_hostile_pass19_b import _plan

    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    bin_dir, go = tmp_path / "bin", tmp_path / "go"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(  # answers once the test says so (a slow controller)
        f"#!/bin/bash\nfor i in $(seq 300); do [ -e {go} ] && break; sleep 0.1; done\n"
        "echo $$\n")
    (bin_dir / "sbatch").chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 'JobId=1 JobState=PENDING'\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), HOME=str(tmp_path),
               PATH=f"{bin_dir}:/usr/bin:/bin")
    submit = subprocess.Popen([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp)],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(300):  # until the first sbatch is on its way
            if '"sending"' in (camp / "campaign.json").read_text():
                break
            time.sleep(0.1)
        res = _kit(tmp_path, "slurm", "status", str(camp), env={"PATH": env["PATH"]})
    finally:
        go.touch()
        out, _ = submit.communicate(timeout=60)
    text = res.stdout + res.stderr
    assert res.returncode == 8 and "Traceback" not in text, text
    assert "stopped before its job id was recorded" not in text, text
    assert "is already working on the campaign" in text and "wait for it to finish" in text
    assert submit.returncode == 0, out
    res = _kit(tmp_path, "slurm", "status", str(camp), env={"PATH": env["PATH"]})
    assert res.returncode == 0 and "PENDING" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("kind", ["seeds", "host"])
def test_a_readme_block_naming_a_path_no_file_can_have_is_named(tmp_path: Path,
                                                                  kind: str) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n<!-- report {'x' * 300} {kind} -->\n<!-- /report -->\n")
    res = _kit(tmp_path, "report", "--readme", str(readme))
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text, text
    assert f"the report block `<!-- report {'x' * 80} {kind} -->` names" in text, text
    assert "shorter path" not in text and "To fix: point the block at" in text, text


@pytest.mark.parametrize("name", ["..json", ".json.gz", "a\nb.json"])
def test_an_input_whose_name_gives_no_output_name_is_named_with_a_fix_that_works(
        tmp_path: Path, name: str) -> None:
    src = _DOCS / "results" / "2026-12-01-h200-headline" / "default-matrix.json"
    data = src.read_bytes()
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    for extra in ([], ["--print", "--formats", ""]):
        res = _kit(tmp_path, "report", *extra, "--", f"./{name}")
        text = res.stdout + res.stderr
        assert res.returncode == 7 and "Traceback" not in text, text
        assert "would name its outputs" in text and "--out" not in text, text
        assert "To fix: copy or rename the result file" in text, text
    assert sorted(p.name for p in tmp_path.iterdir() if not p.is_dir()) == [name]


@pytest.mark.parametrize("planted", ["bench/e2e", "models"])
def test_bench_e2e_never_makes_or_writes_through_a_link_in_the_work_directory(
        tmp_path: Path, outside: Path, planted: str) -> None:
    wd = tmp_path / "work"
    (wd / "verify").mkdir(parents=True)
    # in the work directory's envs/, where a verify report's pythons must be (the 31st pass)
    py = str(_fake_vllm_python(wd / "envs" / "baseline"))
    (wd / "verify" / "report.json").write_text(json.dumps({
        "passed": True, "envs": {"baseline": {"python": py}, "patched": {"python": py}}}))
    (wd / planted).parent.mkdir(parents=True, exist_ok=True)
    (wd / planted).symlink_to(outside, target_is_directory=True)
    res = _kit(tmp_path, "bench", "e2e", "--workdir", str(wd), "--max-num-seqs", "1",
               "--repeats", "1")
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text, text
    assert f"{wd / planted} is a symlink" in text, text
