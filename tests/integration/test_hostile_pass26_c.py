"""Issue 41, the twenty-sixth hostile pass (tester c: every command, option, input and
environment value, here non-UTF-8 locales, the environment the kit reads, file systems that
lie and interrupted output). Each test fails without its fix (checked by reverting ``src`` and
running it):

- Under a locale whose codec is one of the CJK ones (``LC_ALL=ja_JP.EUC-JP``; Shift_JIS, GBK
  and Big5 behave alike), Python decodes a command-line path of UTF-8 bytes
  (``/tmp/wé日/work``) into characters that codec cannot encode again ('\\x97' from the byte
  0x97), and the first system call naming it raised ``UnicodeEncodeError``: a traceback from
  click's path check in every command given such a ``--workdir``, campaign or ``--out``
  (fetch, apply, clean, doctor, report, slurm status, ...). Now one message naming the locale's
  encoding, with "To fix: run under a UTF-8 locale" (``oserrors.unencodable``, rendered by
  the command line as the other OS failures).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass24_c import _env


def _euc_jp_locale(tmp_path: Path) -> Path:
    """A ja_JP.EUC-JP locale compiled into tmp_path (no system locale is changed)."""
    localedef = shutil.which("localedef")
    if localedef is None:
        pytest.skip("needs localedef to compile an EUC-JP locale")
    where = tmp_path / "locales"
    where.mkdir()
    res = subprocess.run([localedef, "-i", "ja_JP", "-f", "EUC-JP", str(where / "ja_JP.EUC-JP")],
                         capture_output=True, text=True, check=False, timeout=60)
    if not (where / "ja_JP.EUC-JP").is_dir():
        pytest.skip(f"localedef could not compile ja_JP.EUC-JP: {res.stderr[-300:]}")
    return where


@pytest.mark.parametrize("command", [("clean", "--dry-run", "--workdir"), ("slurm", "status"),
                                     ("fetch", "--dry-run", "--workdir")],
                         ids=["clean", "slurm-status", "fetch"])
def test_a_path_an_euc_jp_locale_cannot_encode_back_is_one_message(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    locales = _euc_jp_locale(tmp_path)
    folder = os.fsencode(tmp_path) + b"/w\xc3\xa9\xe6\x97\xa5"  # "wé日" in UTF-8
    os.mkdir(folder)
    env = {k.encode(): v.encode() for k, v in _env(tmp_path).items()
           if not k.startswith("LC_") and k not in ("LANG", "LANGUAGE", "PYTHONUTF8",
                                                    "PYTHONIOENCODING")}
    env.update({b"LOCPATH": os.fsencode(locales), b"LC_ALL": b"ja_JP.EUC-JP"})
    res = subprocess.run([os.fsencode(sys.executable), b"-m", b"kvprefetch",
                          *(c.encode() for c in command), folder + b"/work"],
                         env=env, capture_output=True, timeout=120, check=False)
    err = res.stderr.decode("euc_jp", "replace")
    # without the fix: exit 1, UnicodeEncodeError: 'euc_jp' codec can't encode character '\x97'
    assert "Traceback" not in err, err
    assert res.returncode in (2, 3), err
    assert "euc_jp" in err and "To fix: run kvprefetch under a UTF-8 locale" in err, err
    assert os.listdir(folder) == []
