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

# ruff: noqa: N999  (the file name the pass asked for: test_hostile_pass9_<tester>.py)
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
    escaped (``\\u20ac``) and a byte of a non-UTF-8 name written as itself."""
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
    assert raw + b"/trees/baseline" in res.stdout, res.stdout
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
