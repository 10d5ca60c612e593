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
- A wrong-way message: ``fetch`` into a file system out of inodes (a tmpfs of 600) said "fetch
  into W failed: shared_fused_moe.py: No space left on device / To fix: free space on that
  file system (`df -h .`)": the trees come in through descriptors, so the failed name is bare,
  and ``.`` is the caller's folder, on another file system; and ``df -h`` shows free space
  where the inodes ran out. The fix names the work directory, and ``df -i`` beside ``df -h``
  (``sources/fetch._fetch_into`` passes ``where``; ``oserrors``' ENOSPC fix).
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


def locale_env(tmp_path: Path, locales: Path, name: str) -> dict[bytes, bytes]:
    """The kit's environment (``_env``) under the locale ``name`` compiled into ``locales``,
    as bytes, with no other locale or Python encoding setting."""
    env = {k.encode(): v.encode() for k, v in _env(tmp_path).items()
           if not k.startswith("LC_") and k not in ("LANG", "LANGUAGE", "PYTHONUTF8",
                                                    "PYTHONIOENCODING")}
    return env | {b"LOCPATH": os.fsencode(locales), b"LC_ALL": name.encode()}


@pytest.mark.parametrize("command", [("clean", "--dry-run", "--workdir"), ("slurm", "status"),
                                     ("fetch", "--dry-run", "--workdir")],
                         ids=["clean", "slurm-status", "fetch"])
def test_a_path_an_euc_jp_locale_cannot_encode_back_is_one_message(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    locales = _euc_jp_locale(tmp_path)
    folder = os.fsencode(tmp_path) + b"/w\xc3\xa9\xe6\x97\xa5"  # "wé日" in UTF-8
    os.mkdir(folder)
    env = locale_env(tmp_path, locales, "ja_JP.EUC-JP")
    res = subprocess.run([os.fsencode(sys.executable), b"-m", b"kvprefetch",
                          *(c.encode() for c in command), folder + b"/work"],
                         env=env, capture_output=True, timeout=120, check=False)
    err = res.stderr.decode("euc_jp", "replace")
    # without the fix: exit 1, UnicodeEncodeError: 'euc_jp' codec can't encode character '\x97'
    assert "Traceback" not in err, err
    assert res.returncode in (2, 3), err
    assert "euc_jp" in err and "To fix: run kvprefetch under a UTF-8 locale" in err, err
    assert os.listdir(folder) == []


def test_a_work_directory_out_of_inodes_is_named_with_df_i_not_the_callers_folder(
        tmp_path: Path, vllm_sdist: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400m,nr_inodes=600", "tmpfs",
                       str(disk)], check=False, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        work = disk / "w"
        caller = tmp_path / "caller"
        caller.mkdir()
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--workdir", str(work),
                              "--source", str(vllm_sdist)], env=_env(tmp_path), cwd=caller,
                             capture_output=True, text=True, errors="replace", timeout=300,
                             check=False)
        left = sorted(p.name for p in (work / "trees").iterdir()) \
            if (work / "trees").is_dir() else []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    assert "No space left on device" in res.stderr, res.stderr
    # without the fix: "To fix: free space on that file system (`df -h .`)"
    assert "`df -h .`" not in res.stderr, res.stderr
    assert f"`df -h {work}`" in res.stderr and f"`df -i {work}`" in res.stderr, res.stderr
    assert left == [] and os.listdir(caller) == []
