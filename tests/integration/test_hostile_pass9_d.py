"""Issue 41, the ninth hostile pass (tester D: options, environment and input values no earlier
pass tried). Each test fails without its fix (checked with the fixes stashed):

- the standard streams (``kvprefetch.stdio``): a closed stdout made ``--json`` an
  ``AttributeError`` traceback, a closed stderr stopped ``fetch`` silently (exit 1); text the
  stream's encoding lacks (``PYTHONIOENCODING=latin-1`` and a ``€`` in the work directory's
  name, ``PYTHONIOENCODING=utf-8`` and a name that is not UTF-8) was a ``UnicodeEncodeError``
  traceback; ``--help > /dev/full`` a traceback, and a command's stdout on a full device was
  blamed on the work directory ("partial files of this run were removed"); a stderr on a
  full device stopped the command at its first progress line;
- ``bench decode --context ''`` (or blank) was a ``ValueError`` traceback (``max()`` of no
  sizes), ``--batch ''`` planned nothing and said it would run.

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_REPO = Path(__file__).resolve().parents[2]


def _sh(script: str, *args: str | bytes, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """``bash -c script kvprefetch ARGS...``: ``"$@"`` is the kit's command line (this
    worktree's code), so the script can redirect or close its streams."""
    e = dict(_env(), PYTHONPATH=str(_REPO / "src"))
    e.pop("PYTHONIOENCODING", None)
    e.update(env or {})
    argv: list[str | bytes] = ["bash", "-c", script, "kvprefetch", sys.executable, "-m",
                               "kvprefetch", *args]
    try:
        return subprocess.run(argv, env=e, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kvprefetch {args!r} hung")


def _no_traceback(res: subprocess.CompletedProcess[bytes]) -> str:
    text = res.stdout.decode("utf-8", "replace") + res.stderr.decode("utf-8", "replace")
    assert "Traceback" not in text, text
    return text


def test_a_closed_standard_stream_is_no_traceback(tmp_path: Path) -> None:
    """``vmm selftest --json >&-`` (stdout closed): ``emit_json`` wrote to ``sys.stdout``, which
    Python sets to None, an AttributeError traceback. ``fetch --dry-run 2>&-`` (stderr closed):
    its first progress line asked ``None.isatty()``, exit 1 with nothing done and nothing said.
    ``<&-``: stdin closed. Each closed stream is now /dev/null: exit 0."""
    res = _sh('"$@" >&-', "vmm", "selftest", "--driver", "fake", "--ops", "5", "--json")
    _no_traceback(res)
    assert res.returncode == 0, res.stderr
    new = tmp_path / "new-work"
    res = _sh('"$@" 2>&-', "fetch", "--dry-run", "--workdir", str(new))
    assert res.returncode == 0, res.stdout
    assert b"would-create" in res.stdout
    assert not new.exists()
    res = _sh('"$@" <&- >&- 2>&-', "fetch", "--dry-run", "--workdir", str(new))
    assert res.returncode == 0
    res = _sh('"$@" <&-', "vmm", "selftest", "--driver", "fake", "--ops", "5", "--json")
    _no_traceback(res)
    assert res.returncode == 0 and b'"ops"' in res.stdout, res.stderr


def test_text_the_output_encoding_lacks_is_escaped_not_a_traceback(tmp_path: Path) -> None:
    """A work directory named with a ``€`` under ``PYTHONIOENCODING=latin-1``, and one whose
    name is not UTF-8 under ``PYTHONIOENCODING=utf-8``: ``fetch --dry-run`` printed its plan
    with ``click.echo`` and stopped on a UnicodeEncodeError traceback. Now the character is
    escaped (``\\u20ac``), and a byte of a non-UTF-8 name is shown as ``\\xff``
    (``console.escaped``, the twelfth pass: written as itself, a byte from 0x80 to 0x9f is a
    C1 control an 8-bit terminal obeys, and a UTF-8 terminal shows no byte of it anyway)."""
    euro = tmp_path / "w\u20ac"
    res = _sh('"$@"', "fetch", "--dry-run", "--workdir", str(euro),
              env={"PYTHONIOENCODING": "latin-1"})
    _no_traceback(res)
    assert res.returncode == 0, res.stderr
    assert b"w\\u20ac/trees/baseline" in res.stdout, res.stdout
    raw = os.fsencode(tmp_path) + b"/w\xff\xfe"
    res = _sh('"$@"', "fetch", "--dry-run", "--workdir", raw, env={"PYTHONIOENCODING": "utf-8"})
    _no_traceback(res)
    assert res.returncode == 0, res.stderr
    assert os.fsencode(tmp_path) + b"/w\\xff\\xfe/trees/baseline" in res.stdout, res.stdout
    assert not euro.exists() and not Path(os.fsdecode(raw)).exists()


def test_a_stdout_that_cannot_be_written_is_named_as_such(tmp_path: Path) -> None:
    """``--help > /dev/full`` was an OSError traceback; ``fetch --dry-run > /dev/full`` said
    "fetch failed: No space left on device ... write to a larger one (the --workdir, -o/--out
    or campaign folder ...): partial files of this run were removed", sending the user to the
    work directory. ``fetch --dry-run 2> /dev/full`` stopped with exit 1 at its first
    progress line. Now: one message that the output could not be written, and a stderr that
    cannot be written only loses the progress lines."""
    for args, code in ((("--help",), 2), (("fetch", "--dry-run", "--workdir",
                                            str(tmp_path / "w")), 3)):
        res = _sh('"$@" > /dev/full', *args)
        text = _no_traceback(res)
        assert res.returncode == code, text
        assert "cannot write this command's output to its standard output" in text, text
        assert "No space left on device" in text and "To fix:" in text, text
        assert "partial files" not in text and "--workdir" not in text, text
    res = _sh('"$@" 2> /dev/full', "fetch", "--dry-run", "--workdir", str(tmp_path / "w"))
    assert res.returncode == 0, res.stdout
    assert b"would-create" in res.stdout
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("option", ["--context", "--batch"])
@pytest.mark.parametrize("value", ["", " ", ",", "\n"])
def test_bench_decode_refuses_a_list_of_no_sizes(tmp_path: Path, option: str,
                                                 value: str) -> None:
    """``bench decode --dry-run --context ''`` (or blank, or only commas) was a ValueError
    traceback (``max()`` of an empty sequence); ``--batch ''`` planned no workload and said
    it would run. Now a usage error naming the option (exit 2)."""
    res = _sh('"$@"', "bench", "decode", "--dry-run", "--workdir", str(tmp_path / "w"),
              option, value)
    text = _no_traceback(res)
    assert res.returncode == 2, text
    assert option in text and "To fix:" in text, text
    assert not (tmp_path / "w").exists()


def _plant(root: Path, module: str, body: str) -> Path:
    """A package ``module`` under ``root`` (to be put first on PYTHONPATH)."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(body)
    return root


def test_a_module_raising_on_import_or_use_is_one_message(tmp_path: Path) -> None:
    """A ``torch`` on PYTHONPATH raising RuntimeError on import (a broken install, or one
    planted): ``bench kernel`` (``require_torch`` caught only ImportError and OSError) was a
    traceback; a ``torch`` whose every attribute raises made ``vmm selftest`` one; a
    ``matplotlib`` raising on import made ``report`` one, a ``rich`` every dry run's table.
    Now: bench names torch and setup-venv.sh (exit 7); the others name the module and its
    file (the command's family), with ``--debug`` for the traceback."""
    def run(plant: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
        return _sh('"$@"', *args, env={"PYTHONPATH": f"{plant}{os.pathsep}{_REPO / 'src'}"})

    broken = _plant(tmp_path / "p1", "torch", 'raise RuntimeError("planted torch")\n')
    res = run(broken, "bench", "kernel", "--workdir", str(tmp_path / "w"))
    text = _no_traceback(res)
    assert res.returncode == 7 and "needs torch" in text and "planted torch" in text, text

    attr = _plant(tmp_path / "p2", "torch",
                  "def __getattr__(name):\n    raise RuntimeError('planted: ' + name)\n")
    res = run(attr, "vmm", "selftest", "--ops", "5")
    text = _no_traceback(res)
    assert res.returncode == 2, text
    assert f"the module torch ({attr / 'torch' / '__init__.py'}) raised RuntimeError" in text
    assert "To fix:" in text and "--debug" in text, text

    mpl = _plant(tmp_path / "p3", "matplotlib", 'raise RuntimeError("planted mpl")\n')
    result = _REPO / "docs" / "results" / "2026-12-03-h200-vllm-call-decode" / \
        "decode-qwen2.5-7b-8000.json.gz"
    res = run(mpl, "report", str(result), "--out", str(tmp_path / "rep"))
    text = _no_traceback(res)
    assert res.returncode == 2 and "the module matplotlib" in text and "planted mpl" in text
    assert not (tmp_path / "rep" / "decode-qwen2.5-7b-8000.png").exists()

    rich = _plant(tmp_path / "p4", "rich", 'raise RuntimeError("planted rich")\n')
    res = run(rich, "bench", "kernel", "--dry-run", "--workdir", str(tmp_path / "w"))
    text = _no_traceback(res)
    assert res.returncode == 7 and "the module rich" in text, text
    # --debug still shows the traceback (the kit's own bugs are never hidden by this)
    res = run(rich, "--debug", "bench", "kernel", "--dry-run", "--workdir", str(tmp_path / "w"))
    assert b"Traceback" in res.stderr and b"planted rich" in res.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("program", ["/bin/true", "/bin/echo"])
def test_a_torch_from_that_is_no_python_is_named(tmp_path: Path, program: str) -> None:
    """``doctor --smoke --torch-from /bin/true`` (and ``build --torch-from``, which probes the
    same way): the probe's output held no JSON line, an IndexError traceback (a line that
    starts with ``{`` and is not JSON: a JSONDecodeError). Now the smoke-torch check fails
    naming the program and what to pass instead."""
    res = _sh('"$@"', "doctor", "--smoke", "--torch-from", program, "--workdir",
              str(tmp_path / "w"))
    text = _no_traceback(res)
    assert res.returncode == 2, text
    assert f"{program} did not answer the torch probe" in text, text
    assert not (tmp_path / "w").exists()


def test_an_interpreter_answering_a_probe_with_no_record_is_no_traceback(tmp_path: Path) -> None:
    """The environment probe (``machine.envs``: an env's python, or the interpreter whose
    torch a kernels-only env inherits) and verify-kernel's provenance probe read the last
    line of the interpreter's output as JSON: a program printing nothing or ``{oops`` was an
    IndexError or JSONDecodeError traceback. Now a BuildError naming the program, and a
    provenance record carrying the error (what verify-kernel reports as a failed check)."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '{oops'\n")
    fake.chmod(0o755)
    code = (
        "import sys\n"
        "from kvprefetch.errors import BuildError\n"
        "from kvprefetch.machine.envs import _base_python_info\n"
        "from kvprefetch.verify.kernel import probe_env\n"
        "for prog in (sys.argv[1], '/bin/true'):\n"
        "    try:\n"
        "        _base_python_info(prog)\n"
        "    except BuildError as exc:\n"
        "        assert 'did not answer the environment probe' in exc.cause, exc.cause\n"
        "    else:\n"
        "        raise SystemExit('no BuildError')\n"
        "rec = probe_env(sys.argv[1], sys.argv[2], 'provenance')\n"
        "assert 'probe printed no record' in rec['errors'][0], rec\n"
        "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code, str(fake), str(tmp_path)],
                         env=dict(_env(), PYTHONPATH=str(_REPO / "src")), capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr


def test_nothing_the_kit_makes_is_world_writable_under_umask_000(tmp_path: Path) -> None:
    """Under ``umask 000`` ``slurm plan`` made the campaign folder, ``scripts/``, ``logs/``,
    ``results/`` ... 0777 (and ``fetch``/``apply`` the work directory's folders 0777 and the
    patched files 0666): any local user could replace a job script or plant a link. The kit
    now adds world-write to the umask; a stricter umask (077) is kept as it is."""
    loose = tmp_path / "loose"
    res = _sh('umask 000; "$@"', "slurm", "plan", str(loose), "--stand-in")
    _no_traceback(res)
    assert res.returncode == 0, res.stderr
    made = [loose, *loose.rglob("*")]
    assert len(made) > 8
    writable = [str(p) for p in made if p.lstat().st_mode & 0o002]
    assert not writable, writable
    strict = tmp_path / "strict"
    res = _sh('umask 077; "$@"', "slurm", "plan", str(strict), "--stand-in")
    assert res.returncode == 0, res.stderr
    assert all(p.lstat().st_mode & 0o077 == 0 for p in [strict, *strict.rglob("*")]
               if p.is_dir())


def test_a_file_size_limit_is_named_in_the_fix(tmp_path: Path) -> None:
    """Under ``ulimit -f 20`` (20 KiB) ``report`` (its 45 KB PNG; also ``fetch``'s trees) said
    "report failed: File too large / To fix: check the path and its file system": nothing
    named the limit. Now the fix names ``ulimit -f`` and the limit in force; no partial file
    is left."""
    result = _REPO / "docs" / "results" / "2026-12-03-h200-vllm-call-decode" / \
        "decode-qwen2.5-7b-8000.json.gz"
    out = tmp_path / "rep"
    res = _sh('ulimit -f 20; "$@"', "report", str(result), "--out", str(out))
    text = _no_traceback(res)
    assert res.returncode == 2, text
    assert "File too large" in text and "ulimit -f" in text and "20 blocks" in text, text
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


def test_a_uv_cache_dir_that_cannot_be_examined_is_a_check_not_a_failure(tmp_path: Path) -> None:
    """``UV_CACHE_DIR`` 5,000 characters long: ``doctor --mode overlay`` (and ``build --mode
    overlay``'s preflight) stopped with "doctor failed: <path>: File name too long / To fix:
    check the path and its file system", naming no variable. Now the disk check says uv's
    cache cannot be examined, and doctor reports the rest."""
    from kvprefetch.overlay.install import find_uv

    if find_uv() is None:
        pytest.skip("no uv here: the overlay disk check never asks uv for its cache")
    res = _sh('"$@"', "doctor", "--mode", "overlay", "--workdir", str(tmp_path / "w"),
              env={"UV_CACHE_DIR": str(tmp_path / ("A" * 5000))})
    text = _no_traceback(res)
    assert "doctor failed" not in text, text
    # The table wraps its detail cell where the work dir's path length puts the break (CI's
    # fresh run broke "uv's cache / directory"): read the cell's words without the borders.
    words = " ".join(text.replace("│", " ").split())
    assert "uv's cache directory" in words and "cannot be examined" in words, text
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("command", [("export-header", "-o"),
                                     ("vmm", "bench", "--dry-run", "--out")])
def test_an_output_file_option_naming_a_folder_says_so(tmp_path: Path,
                                                       command: tuple[str, ...]) -> None:
    """``export-header -o ''`` said "cannot write .: a directory is in its place / To fix: move
    . away"; ``-o DIR`` (an existing folder) "move DIR away", sending the user to move their
    folder. ``vmm bench --out`` took the same. Now a usage error: name the file to write. (Since
    the twenty-first hostile pass the option reads the value as typed, so ``''`` is said to name
    no file, not to be the folder ``.``.)"""
    folder = tmp_path / "headers"
    folder.mkdir()
    (folder / "mine.txt").write_text("keep\n")
    for value, what in (("", "names no file"), (str(folder), "is a folder")):
        res = _sh('"$@"', *command, value, "--workdir", str(tmp_path / "w")) \
            if command[0] == "export-header" else _sh('"$@"', *command, value)
        text = _no_traceback(res)
        assert res.returncode == 2, text
        assert f"{what}; give the path of the file to write" in text, text
        assert "move" not in text, text
    assert [p.name for p in folder.iterdir()] == ["mine.txt"]


@pytest.mark.parametrize("sub", [("plan", "--stand-in"), ("status",), ("submit", "--dry-run")])
def test_a_campaign_that_is_a_device_or_fifo_is_named(tmp_path: Path, sub: tuple[str, ...]
                                                       ) -> None:
    """``slurm plan /dev/null`` (a FIFO, a device) said "slurm failed: /dev/null/scripts: Not a
    directory / To fix: check the path and its file system"; ``status``/``submit`` "cannot read
    …/campaign.json … plan the campaign again". click's ``file_okay=False`` refuses regular
    files only. Now a usage error: the campaign is not a folder."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in ("/dev/null", str(fifo)):
        res = _sh('"$@"', "slurm", sub[0], target, *sub[1:])
        text = _no_traceback(res)
        assert res.returncode == 2, text
        assert "is not a folder (a device, FIFO or socket)" in text, text
        assert "Not a directory" not in text and "plan the campaign again" not in text, text
