"""Issue 41, the twelfth hostile pass (v): what the eleventh pass added.

- A folder at a name the build writes in its build folder (``kvprefetch_baseline_C.so`` here,
  before a real narrowed kernels-only build) was "error: build failed: 5: Is a directory":
  ``ninjadir`` opened it to copy it into ninja's private folder, and ``os.fdopen`` of the
  folder's descriptor failed with the descriptor's number for a name. A link, FIFO or device
  there went through and was refused only by the copy back, after the compile. Now the build
  refuses any of them before ninja starts, naming the folder and the name.

Each test fails without its fix (checked with the fixes reverted)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: the outside folder is byte-identical afterwards


def _ninja_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A work directory with one build folder: a real build.ninja (a shell command for the
    compiler, as in the eleventh pass's test) whose outputs are ``a.o`` and ``lib.so``."""
    work = tmp_path / "work"
    bdir = work / "build" / "baseline" / "k"
    bdir.mkdir(parents=True)
    (bdir / "in.c").write_text("int x;\n")
    (bdir / "build.ninja").write_text(
        "rule cc\n"
        "  command = printf '$out: $in\\n' > $out.d && cat $in > $out.$$$$.tmp"
        " && mv -f $out.$$$$.tmp $out\n"
        "  depfile = $out.d\n  deps = gcc\n"
        "rule link\n  command = cat $in > $out.$$$$.tmp && mv -f $out.$$$$.tmp $out\n"
        f"build a.o: cc {bdir / 'in.c'}\n"
        "build lib.so: link a.o\n")
    return work, bdir


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
@pytest.mark.parametrize("kind", ["folder", "symlink", "fifo"])
def test_a_folder_link_or_fifo_at_an_output_name_is_refused_by_name_before_ninja_runs(
        tmp_path: Path, outside: Path, kind: str) -> None:
    """A folder planted at ``lib.so`` was ``IsADirectoryError: [Errno 21] Is a directory: 5``
    (the CLI: "build failed: 5: Is a directory"); a link to a file outside, or a FIFO, was
    refused only after the compile. Now one BuildError naming the build folder and the name,
    before ninja runs (no ``a.o``), and the planted thing and the file outside are untouched.
    (Real ninja and a real build.ninja; the function the build's compile step calls.)"""
    from kvprefetch.builds import sequence
    from kvprefetch.errors import BuildError

    work, bdir = _ninja_folder(tmp_path)
    planted = bdir / "lib.so"
    if kind == "folder":
        planted.mkdir()
        (planted / "mine").write_text("the user's\n")
    elif kind == "symlink":
        planted.symlink_to(outside / "notes.txt")
    else:
        os.mkfifo(planted)
    with pytest.raises(BuildError) as err:
        sequence.compile_with_progress(
            "baseline", ["ninja", "-C", str(bdir), "-j", "1"], env=dict(os.environ),
            log=bdir / "compile.log", fix="-", started=time.monotonic(),
            build_root=bdir.parent, selection={}, workdir=work)
    text = str(err.value)
    assert str(bdir) in text and "lib.so" in text and "Is a directory" not in text, text
    assert "move" in err.value.fix, err.value.fix
    assert not (bdir / "a.o").exists()  # refused before ninja ran
    if kind == "folder":
        assert (planted / "mine").read_text() == "the user's\n"
    elif kind == "symlink":
        assert planted.is_symlink()
    else:
        assert planted.is_fifo()


def test_a_cancelled_verify_job_leaves_no_temporary_of_its_report(tmp_path: Path) -> None:
    """``scancel`` (and a time limit) send SIGTERM to every process of the job. verify's
    report goes through the script's ``write_new`` (a new temporary in ``results/``, renamed
    over ``verify.json``): the SIGTERM ended the subshell that wrote it, with the default
    action, and ``results/verify.json.tmp-<pid>-<n>`` (half a report) stayed for good; a
    resubmitted verify wrote another. Now the subshell removes the temporary it made, and the
    job still records 143. The script is the kit's, run by bash as Slurm runs it; its
    interpreter is a stand-in that prints half a report in ``verify-kernel`` and sleeps; the
    SIGTERM goes to the whole process group, as slurmstepd sends it. A run that is not
    stopped still writes the whole report."""
    import signal
    import subprocess

    from tests.integration.test_hostile_pass11_t import _fake_slurm, _kit
    from tests.integration.test_reliability import _env

    fake_python, stop = tmp_path / "python", tmp_path / "no-sleep"
    # the stand-in's switch is a file: a job passes its programs job_env's names alone
    fake_python.write_text('#!/bin/bash\ncase " $* " in *" verify-kernel "*)\n'
                           f'  echo \'{{"half": \'; [ -e {stop} ] || sleep 60; echo 1}}\n'
                           "esac\nexit 0\n")
    fake_python.chmod(0o755)
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--python", str(fake_python))
    assert res.returncode == 0, res.stderr
    results = camp / "results"

    def job(job_id: str, **env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["bash", str(camp / "scripts" / "20-verify.sbatch")],
                                env=dict(_env(), SLURM_JOB_ID=job_id, **env),
                                start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    proc = job("4343")
    deadline = time.monotonic() + 30
    while not [p for p in results.iterdir() if ".tmp-" in p.name]:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.3)  # the half report is in the temporary
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    assert sorted(p.name for p in results.iterdir()) == []
    assert (camp / "logs" / "verify-4343.exit").read_text() == "143\n"
    stop.touch()
    done = job("4344")
    assert done.wait(timeout=30) == 0
    assert sorted(p.name for p in results.iterdir()) == ["verify.json"]
    assert (results / "verify.json").read_text() == '{"half": \n1}\n'
    assert (camp / "logs" / "verify-4344.exit").read_text() == "0\n"


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_a_tmpdir_inside_the_work_directory_is_refused_for_the_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build's private folders (its commands' ``TMPDIR``, ninja's copy of the build folder)
    are made in the system temp folder, which the user's TMPDIR names. With TMPDIR inside the
    work directory, a loop in the work directory renamed the build's ``TMPDIR`` folder away
    and put a link to a folder outside at its name while a real narrowed build ran: nvcc wrote
    its ``tmpxft_*`` files (51 MB) into the folder outside, and they stayed there. Now the build
    refuses such a TMPDIR before it makes a private folder, naming it. (Here ninja's copy and
    the ``TMPDIR`` folder are asked for directly; the real build was run by hand, it takes
    minutes.)"""
    import tempfile

    from kvprefetch.builds import sequence
    from kvprefetch.errors import KvprefetchError
    from kvprefetch.workspace import ownership

    work, bdir = _ninja_folder(tmp_path)
    inside = work / "mytmp"
    inside.mkdir()
    monkeypatch.setenv("TMPDIR", str(inside))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir reads TMPDIR again
    with pytest.raises(KvprefetchError) as err:
        sequence.compile_with_progress(
            "baseline", ["ninja", "-C", str(bdir), "-j", "1"], env=dict(os.environ),
            log=bdir / "compile.log", fix="-", started=time.monotonic(),
            build_root=bdir.parent, selection={}, workdir=work)
    assert "TMPDIR" in str(err.value) and str(work) in str(err.value), str(err.value)
    assert not (bdir / "a.o").exists() and os.listdir(inside) == []
    with pytest.raises(KvprefetchError), ownership.private_dir("build-baseline", outside=work):
        pass
    assert os.listdir(inside) == []
    # a TMPDIR beside the work directory is fine
    beside = tmp_path / "systmp"
    beside.mkdir()
    monkeypatch.setenv("TMPDIR", str(beside))
    monkeypatch.setattr(tempfile, "tempdir", None)
    with ownership.private_dir("build-baseline", outside=work) as d:
        assert beside in d.parents


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="doctor reaches cuobjdump after nvcc")
def test_doctor_stopped_twice_in_cuobjdump_leaves_nothing_in_the_system_temp(
        tmp_path: Path) -> None:
    """``doctor`` reads the compile probe's SASS with cuobjdump, which writes ``tmpxft_*`` files
    (the cubin it hands to nvdisasm) in TMPDIR: two SIGTERMs in quick succession (the second
    SIGKILLs every child) while it ran left them in the user's system temp (2 of 10 signal
    storms against a real doctor). Now cuobjdump gets the probe's own folder as TMPDIR,
    removed on the way out. cuobjdump is a stand-in on PATH that writes such a file and waits
    (so the stop lands in it every time); nvcc and the rest of doctor are real."""
    import signal
    import subprocess
    import sys

    from tests.integration.test_reliability import _env

    systmp = tmp_path / "systmp"
    systmp.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started = tmp_path / "cuobjdump-started"
    (bin_dir / "cuobjdump").write_text(
        '#!/bin/bash\necho cubin > "$TMPDIR/tmpxft_0000abcd_00000000-0"\n'
        f'touch {started}\nsleep 60\n')
    (bin_dir / "cuobjdump").chmod(0o755)
    env = {k: v for k, v in _env().items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"),
               TMPDIR=str(systmp), PATH=f"{bin_dir}:{env.get('PATH', '')}")
    p = subprocess.Popen([sys.executable, "-m", "kvprefetch", "doctor"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    while not started.exists():
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            pytest.fail(f"doctor never ran cuobjdump: {p.communicate()[1][-1500:]}")
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGTERM)
    time.sleep(0.002)
    os.kill(p.pid, signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143 and "Traceback" not in err, (p.returncode, err[-1500:])
    assert sorted(os.listdir(systmp)) == []
