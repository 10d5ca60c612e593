"""Issue 41, the eleventh hostile pass (s): what the tenth pass left open.

- ``git apply`` wrote its results by path into ``apply``'s scratch copy inside the work
  directory (``tmp/apply-<pid>-<hex>/t``): a loop flipping the copy's ``csrc/attention`` between
  the folder and a link to a folder outside (500 us / 50 us) had git write the patched files,
  and its ``attention_kernels.cuh~<pid>`` temporaries, behind the link in 2 runs of 20 (git
  checks for a link before it writes, not as it writes). git now runs in a private folder
  outside the work directory (``ownership.private_dir``: mode 0700, a random name in the system
  temp), which nothing that can write only the work directory reaches.
- An ownership entry of a kind the kit never writes was read as "the kit's", with no check of
  where it points; it is now a corrupt record (the ``--repair`` fix), as entries that fail the
  other checks are.
- Files written through ``confine`` were 0644 (scripts 0755) whatever a stricter umask said:
  under ``umask 077`` a campaign's ``campaign.json``, the ownership record and the state
  records were readable by every user. They now get ``mode & ~umask`` (never world-writable,
  never without the owner's own bits); a user's file the kit rewrites keeps its own bits.
- ``slurm prepare`` with its work folder's tag replaced by a link said "add --adopt", an
  option it does not have, and "(no .kvprefetch-workdir)" with the link right there.
- A hard link planted in the build folder while a real build ran (after its one check), at a
  name ninja or a compiler writes in place, was written through: ninja appended its log to a
  file outside through ``.ninja_log``; an object's ``.d`` is truncated and written the same
  way. ninja now runs in a private copy of the build folder (``builds/ninjadir.py``), its
  outputs copied back as new files.
- The install step copied the library into the environment's ``site-packages`` by path: that
  folder swapped for a link after the torch probe (minutes before the install) had the library
  written into the folder it named, and the folder's own ``kvprefetch_kernels/`` renamed aside
  and deleted, exit 0. It now acts through ``confine``.
- A build stopped mid-compile left nvcc's ``tmpxft_*`` files (33 MB) in the system temp: the
  build's commands now get a private ``TMPDIR``, removed when the kit stops.
- ``bench kernel --rounds``, ``--seed`` and ``--max-seq-len-to-capture`` (and ``bench decode``'s
  last two) took 10**20: a seed past torch's 64 bits is its ValueError on the GPU, a capture
  length past int32 is no length vLLM holds.

Each test fails without its fix (checked with the fixes reverted)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.test_reliability import _env, cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: the outside folder is byte-identical afterwards

_REPO = Path(__file__).resolve().parents[2]


def test_git_apply_writes_only_in_a_private_folder_outside_the_work_directory(
        fetched_workdir: Path, monkeypatch: pytest.MonkeyPatch, outside: Path) -> None:
    """Every ``git apply`` that ``apply`` runs (the check, the patch, the reverse check) runs
    in a folder outside the work directory that only its user may enter (0700), gone
    afterwards; the patch is applied. (The kit's runner is wrapped only to see each git's
    folder; the real git runs. A swap race itself is timing, won 2 runs of 20 here with the
    old code: the place git writes is what is checked.)"""
    from kvprefetch.sources import patching

    real_run = patching.run
    seen: list[tuple[Path, int]] = []

    def watched(argv, **kw):  # type: ignore[no-untyped-def]
        if list(argv[:2]) == ["git", "apply"]:
            cwd = Path(kw["cwd"])
            top = cwd.parent  # <folder>/t
            seen.append((top, stat.S_IMODE(os.lstat(top).st_mode)))
        return real_run(argv, **kw)

    monkeypatch.setattr(patching, "run", watched)
    res = patching.apply_patch(fetched_workdir, "prefetch")
    assert res.action == "applied"
    assert len(seen) >= 3, seen
    wd = os.path.realpath(fetched_workdir)
    for top, mode in seen:
        assert not os.path.realpath(top).startswith(wd + os.sep), (top, fetched_workdir)
        assert mode == 0o700, (top, oct(mode))
        assert not os.path.lexists(top), top
    assert not (fetched_workdir / "tmp").exists()


def test_an_ownership_entry_of_a_kind_the_kit_never_writes_is_a_corrupt_record(
        fetched_workdir: Path, outside: Path) -> None:
    """An entry ``{"kind": "future"}`` (or any kind the kit does not write) at
    ``pristine/mine`` was read as the kit's own (``fetch`` removes a pristine copy any entry
    names) and ``clean`` went on: now the record is corrupt, named with the entry, and the
    fix is ``fetch --repair``; nothing is removed, the record is left as it was."""
    rec = fetched_workdir / ".kvprefetch-owned.json"
    data = json.loads(rec.read_text())
    data["paths"]["pristine/mine"] = {"kind": "future", "extra": 1}
    rec.write_text(json.dumps(data))
    (fetched_workdir / "pristine" / "mine").mkdir()
    (fetched_workdir / "pristine" / "mine" / "keep.txt").write_text("mine\n")
    before = rec.read_bytes()
    res = cli("clean", "--workdir", str(fetched_workdir), "--what", "all")
    refused(res, 2, "corrupt", "pristine/mine", "'future'", "--repair")
    assert (fetched_workdir / "pristine" / "mine" / "keep.txt").read_text() == "mine\n"
    assert rec.read_bytes() == before
    assert (fetched_workdir / "trees" / "baseline").is_dir()


def _umask_run(umask: int, *args: str) -> subprocess.CompletedProcess[str]:
    def set_umask() -> None:
        os.umask(umask)

    return subprocess.run([sys.executable, "-m", "kvprefetch", *args],
                          env=dict(_env(), PYTHONPATH=str(_REPO / "src")), capture_output=True,
                          text=True, timeout=120, check=False, preexec_fn=set_umask)


def test_files_the_kit_writes_keep_a_stricter_umask(tmp_path: Path, fetched_workdir: Path,
                                                    outside: Path) -> None:
    """Under ``umask 077``: ``slurm plan``'s ``campaign.json`` is 0600 and its sbatch scripts
    0700 (were 0644 and 0755), ``apply``'s ownership record and state record 0600 (were 0644).
    Under ``umask 022`` they are 0644 and 0755 as before, and under ``umask 000`` still never
    world-writable. A user's file the kit rewrites keeps its own bits (``report --readme``,
    already tested, is not changed by this)."""
    camp = tmp_path / "c077"
    res = _umask_run(0o077, "slurm", "plan", str(camp), "--stand-in")
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE((camp / "campaign.json").stat().st_mode) == 0o600
    scripts = sorted((camp / "scripts").glob("*.sbatch"))
    assert scripts and all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in scripts)
    res = _umask_run(0o077, "apply", "--workdir", str(fetched_workdir), "--variant", "prefetch")
    assert res.returncode == 0, res.stderr
    for p in (fetched_workdir / ".kvprefetch-owned.json",
              fetched_workdir / "state" / "patched.json"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, (p, oct(p.stat().st_mode))
    for umask, file_mode, script_mode in ((0o022, 0o644, 0o755), (0o000, 0o644, 0o755)):
        camp = tmp_path / f"c{umask:03o}"
        res = _umask_run(umask, "slurm", "plan", str(camp), "--stand-in")
        assert res.returncode == 0, res.stderr
        assert stat.S_IMODE((camp / "campaign.json").stat().st_mode) == file_mode
        assert all(stat.S_IMODE(p.stat().st_mode) == script_mode
                   for p in (camp / "scripts").glob("*.sbatch"))


def test_slurm_prepare_with_a_linked_work_tag_names_the_link_and_no_missing_option(
        tmp_path: Path, outside: Path) -> None:
    """``<campaign>/work/.kvprefetch-workdir`` a link to a file outside: prepare refused (right)
    but said "(no .kvprefetch-workdir)" and "add --adopt", which ``slurm prepare`` lacks. Now
    it names the campaign's work folder and the link, and its fix is one prepare can follow;
    the file outside is untouched (the ``outside`` fixture)."""
    sdist = tmp_path / "clone"  # a folder: prepare takes a --source folder as it is
    sdist.mkdir()
    camp = tmp_path / "camp"
    res = cli("slurm", "plan", str(camp), "--stand-in", "--source", str(sdist))
    assert res.returncode == 0, res.stderr
    (camp / "work").mkdir()
    os.symlink(outside / "notes.txt", camp / "work" / ".kvprefetch-workdir")
    res = cli("slurm", "prepare", str(camp))
    refused(res, 2, "campaign's work folder", "symlink", str(outside / "notes.txt"))
    assert "--adopt" not in res.stderr and "--workdir" not in res.stderr, res.stderr


@pytest.mark.parametrize("args", [
    ("bench", "kernel", "--rounds", "100000000000000000000"),
    ("bench", "kernel", "--rounds", "2"),
    ("bench", "kernel", "--seed", "100000000000000000000"),
    ("bench", "kernel", "--seed", "-1"),
    ("bench", "kernel", "--max-seq-len-to-capture", "100000000000000000000"),
    ("bench", "kernel", "--max-seq-len-to-capture", "2147483648"),
    ("bench", "decode", "--seed", "18446744073709551616"),
    ("bench", "decode", "--max-seq-len-to-capture", "100000000000000000000"),
])
def test_bench_seed_rounds_and_capture_length_are_bounded_at_the_command_line(
        fetched_workdir: Path, args: tuple[str, ...]) -> None:
    """A dry run planned 10**20 rounds, a seed torch cannot take (its ValueError only on the
    GPU, mid-run) and a capture length past int32: now click's usage error naming the option
    and its range (exit 2), no traceback."""
    res = cli(*args, "--dry-run", "--workdir", str(fetched_workdir))
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr)
    assert "Traceback" not in res.stderr
    assert f"Invalid value for '{args[2]}'" in res.stderr and "range" in res.stderr, res.stderr


def test_a_private_scratch_is_not_left_in_the_system_temp() -> None:
    """``ownership.private_dir`` removes its folder on the way out, an exception included."""
    from kvprefetch.workspace import ownership

    seen: list[Path] = []

    def fail_inside() -> None:
        with ownership.private_dir("t11") as d:
            seen.append(d)
            (d / "x").write_text("x")
            assert stat.S_IMODE(d.stat().st_mode) == 0o700
            assert Path(tempfile.gettempdir()) in d.parents
            raise RuntimeError

    with pytest.raises(RuntimeError):
        fail_inside()
    assert seen and not seen[0].exists()


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job may inherit it ignored


def _nvcc_env(tmp_path: Path) -> dict[str, str]:
    tmp = tmp_path / "systmp"
    tmp.mkdir()
    env = {**_env(), "PYTHONPATH": str(_REPO / "src"), "TMPDIR": str(tmp)}
    if shutil.which("nvcc") is None:
        env["PATH"] = f"/usr/local/cuda/bin:{env['PATH']}"
    return env


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="needs nvcc for a real build")
def test_a_build_stopped_mid_compile_leaves_nothing_in_the_system_temp(
        tmp_path: Path, fetched_workdir: Path) -> None:
    """A real narrowed kernels-only build, SIGINT to the kit once nvcc has written its
    ``tmpxft_*`` files: they stayed in TMPDIR (33 MB here with the old code; the ninth and
    tenth passes left it open). The build's commands now have a TMPDIR of their own, removed
    when the kit stops: exit 130, the system temp empty, no process of the build left."""
    env = _nvcc_env(tmp_path)
    systmp = Path(env["TMPDIR"])
    p = subprocess.Popen([sys.executable, "-m", "kvprefetch", "build", "--workdir",
                          str(fetched_workdir), "--mode", "kernels-only", "--trees", "baseline",
                          "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes", "fp16",
                          "--jobs", "1", "--skip-doctor"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True,
                         preexec_fn=_sigint_default)  # noqa: PLW1509 (no threads here)
    t0 = time.monotonic()
    while not list(systmp.rglob("tmpxft_*.ii")):
        if p.poll() is not None or time.monotonic() - t0 > 400:
            p.kill()
            pytest.fail(f"nvcc never wrote its temporaries: {p.communicate()[1][-2000:]}")
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGINT)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the build was still running 30 s after SIGINT")
    assert p.returncode == 130 and "Traceback" not in err, (p.returncode, err[-2000:])
    time.sleep(2)  # anything of nvcc's left running would write on
    assert sorted(os.listdir(systmp)) == [], sorted(os.listdir(systmp))[:5]
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)


def test_the_library_install_never_acts_through_a_site_packages_swapped_for_a_link(
        tmp_path: Path) -> None:
    """The install step copied the built library into the environment's site-packages by path
    (rmtree, mkdir, copy2, two renames, rmtree): the environment is in the work directory, and
    its ``site-packages`` swapped for a link to a folder outside after the torch probe (minutes
    before the install; a real build did it here) had the library and its record written
    there, and the folder's own ``kvprefetch_kernels/`` renamed aside and deleted. Now one
    BuildError naming the link; the folder outside is byte-identical. (The function is called
    directly, with a stand-in .so: the compile is not the point.)"""
    import inspect

    from kvprefetch.builds import library
    from kvprefetch.errors import KvprefetchError
    from tests.integration.helpers import tree_bytes

    work = tmp_path / "work"
    lib = work / "envs" / "baseline" / "lib" / "python3.11"
    lib.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "kvprefetch_kernels").mkdir(parents=True)
    (elsewhere / "kvprefetch_kernels" / "mine.py").write_text("the user's own\n")
    (elsewhere / "notes.txt").write_text("keep me\n")
    before = tree_bytes(elsewhere)
    os.symlink(elsewhere, lib / "site-packages")
    so = work / "build" / "baseline" / "k" / "lib_C.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(b"\x7fELF stand-in")
    kw = {"root": work} if "root" in inspect.signature(library.install_into_env).parameters \
        else {}
    with pytest.raises(KvprefetchError) as err:
        library.install_into_env(lib / "site-packages", so, {"tree": "baseline"}, **kw)
    assert "symlink" in str(err.value)
    assert tree_bytes(elsewhere) == before


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_a_hard_link_planted_mid_build_is_never_written_through(tmp_path: Path) -> None:
    """The build checks its folder for hard links once, before it starts; a link planted after
    that, at a name ninja or a compiler writes in place (``.ninja_log``, ``.ninja_deps``, an
    object's ``.d``), had the build write into the file it names: a real narrowed build
    appended ninja's log to a file outside. Now ninja runs in a private copy of the build
    folder and its outputs come back as new files: the files outside are byte-identical, the
    output is in the build folder, and a rerun finds it up to date (mtimes kept). (Real ninja
    and a real build.ninja, with a shell command for the compiler; the links are planted
    after the build's check, which is not run here.)"""
    import inspect

    from kvprefetch.builds import sequence
    from tests.integration.helpers import tree_bytes

    work = tmp_path / "work"
    bdir = work / "build" / "baseline" / "k"
    bdir.mkdir(parents=True)
    (bdir / "in.c").write_text("int x;\n")
    (bdir / "build.ninja").write_text(
        "rule cc\n"
        "  command = printf '$out: $in\\n' > $out.d && cat $in > $out.$$$$.tmp"
        " && mv -f $out.$$$$.tmp $out\n"
        "  depfile = $out.d\n  deps = gcc\n"
        f"build a.o: cc {bdir / 'in.c'}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in (".ninja_log", ".ninja_deps", "a.o.d"):
        (elsewhere / name).write_text(f"the user's {name}\n")
        os.link(elsewhere / name, bdir / name)
    before = tree_bytes(elsewhere)
    kw = {"workdir": work} \
        if "workdir" in inspect.signature(sequence.compile_with_progress).parameters else {}
    log = bdir / "compile.log"
    for _ in range(2):
        sequence.compile_with_progress(
            "baseline", ["ninja", "-C", str(bdir), "-j", "1"], env=dict(os.environ), log=log,
            fix="-", started=time.monotonic(), build_root=bdir.parent, selection={}, **kw)
    assert tree_bytes(elsewhere) == before
    assert (bdir / "a.o").read_text() == "int x;\n"
    assert os.lstat(bdir / ".ninja_log").st_nlink == 1
    assert log.read_text().count("[1/1]") == 1, log.read_text()  # the rerun: no work to do
