"""Issue 41, the thirty-eighth hostile pass (tester b: writers of outputs under swaps, as
another user who can write only the campaign; stops of the writers; PID 1 and subreapers).
Each test fails without its fix (checked by reverting ``src`` and running it):

- **``slurm publish`` hashed its copy by path.** After copying a build into the campaign's
  ``work/envs/.<tree>.publish-<job>``, it re-hashed the library there with ``sha256_file``,
  which follows links and reads a file of any size. Another user who can write the campaign
  (``nobody`` in a 0777 ``work/envs``) swapped the copy for a folder of theirs as soon as it
  appeared: with a 200 GB sparse ``_C.so`` the publish hashed zeros until its time limit (a
  hang, 30 s of 30 s by hand), and with ``_C.so`` a link the hash read any file of the system
  and printed its digest. The copy is now hashed through ``confine.sha256_in`` (opened from the
  work directory down with ``O_NOFOLLOW``, at most the 4 GiB any library can have), and its
  ``build.json`` read through ``confine.read_file``. The other user's swap is played here by a
  wrapper of ``copy_tree`` in the CLI's own process (the race, deterministic).
- **A process the kit did not start was stopped when the kit was a subreaper.** A wrapper that
  sets ``PR_SET_CHILD_SUBREAPER`` and then ``exec``\\ s the kit (the attribute survives
  ``execve``; PID 1 of a namespace is the same) hands the kit every orphan below it: a helper the
  wrapper started before the kit, ending while ``fetch --source git`` cloned, left its own
  child to the kit, and the failed clone's cleanup (``runner.stop_others``) sent it SIGTERM as
  if it were git's. ``runner.others_stopped`` now spares every process that was there before
  the clone started, wherever it hangs now.

Nothing else is mocked: the CLI runs for real on folders made here."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from tests.integration.test_reliability import _env, cli
from tests.unit.test_slurm import _fake_scratch_build

_SWAP = textwrap.dedent("""
    import os, runpy, sys
    from pathlib import Path
    import kvprefetch.slurm.publish as pub
    original, target = pub.copy_tree, sys.argv.pop(1)
    def copy_tree(root, src, dst, **kw):
        original(root, src, dst, **kw)
        so = dst / "lib/python3.11/site-packages/kvprefetch_kernels/_C.so"
        if so.exists():  # the other user's swap, as soon as the copy is there
            so.unlink()
            so.symlink_to(target)
    pub.copy_tree = copy_tree
    sys.argv[0] = "kvprefetch"
    runpy.run_module("kvprefetch", run_name="__main__")
""")


def test_publish_never_hashes_its_copy_through_a_link(tmp_path: Path) -> None:
    camp = tmp_path / "camp"
    res = cli("slurm", "plan", str(camp), "--source", "sdist")
    assert res.returncode == 0, res.stderr
    scratch = tmp_path / "scratch"
    _fake_scratch_build(scratch, "patched")
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(b"root's own secret\n")
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    res = subprocess.run([sys.executable, "-c", _SWAP, str(secret), "slurm", "publish",
                          str(camp), "--tree", "patched", "--scratch", str(scratch)],
                         env=_env(), capture_output=True, text=True, timeout=300, check=False)
    text = res.stdout + res.stderr
    assert res.returncode == 10, text
    assert "Traceback" not in text and "To fix:" in text, text
    assert "_C.so" in text and "symlink" in text, text
    assert digest not in text, text  # the file outside was never read
    assert not (camp / "work" / "envs" / "patched").exists()
    assert secret.read_bytes() == b"root's own secret\n"


_WRAPPER = textwrap.dedent("""
    import ctypes, os, subprocess, sys
    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # CHILD_SUBREAPER
    flag, log, py = sys.argv[1], sys.argv[2], sys.argv[3]
    # the wrapper's helper, started before the kit: its child outlives it
    subprocess.Popen(["sh", "-c", f'"{py}" -c "$0" & while [ ! -e "{flag}" ]; do sleep 0.05; done',
                      "import os, signal, time\\n"
                      "def h(s, f):\\n"
                      f"    open({log!r}, 'a').write(signal.Signals(s).name)\\n"
                      "    os._exit(0)\\n"
                      "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\\n"
                      "    signal.signal(s, h)\\n"
                      f"open({log + '.pid'!r}, 'w').write(str(os.getpid()))\\n"
                      "time.sleep(600)\\n"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # the kit's pipes
    while not os.path.exists(log + ".pid"):
        pass
    os.execv(py, [py, "-m", "kvprefetch", *sys.argv[4:]])
""")


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_a_fetch_under_a_subreaper_stops_no_process_it_did_not_start(tmp_path: Path) -> None:
    flag, log = tmp_path / "helper-may-end", tmp_path / "orphan.log"
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    kit: list[int] = []

    def serve() -> None:
        # git connects (the clone is under way): the helper ends, its child becomes the kit's,
        # then the connection closes and the clone fails
        conn, _ = srv.accept()
        flag.write_text("")
        orphan = int((tmp_path / "orphan.log.pid").read_text())
        end = time.monotonic() + 30
        while _ppid(orphan) != kit[0] and time.monotonic() < end:
            time.sleep(0.02)
        conn.close()

    serving = threading.Thread(target=serve, daemon=True)
    serving.start()
    proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, str(flag), str(log), sys.executable,
                             "fetch", "--workdir", str(tmp_path / "wd"), "--source", "git",
                             "--repo-url", f"http://127.0.0.1:{port}/vllm.git"],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    kit.append(proc.pid)
    orphan = None
    try:
        _, err = proc.communicate(timeout=120)
        orphan = int((tmp_path / "orphan.log.pid").read_text())
        assert proc.returncode == 3, err
        assert "Traceback" not in err and "git clone" in err and "To fix:" in err, err
        time.sleep(0.5)
        assert not log.exists(), log.read_text()  # no stop signal reached it
        os.kill(orphan, 0)  # still running
    finally:
        proc.kill()
        if orphan is None and (tmp_path / "orphan.log.pid").exists():
            orphan = int((tmp_path / "orphan.log.pid").read_text())
        if orphan is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)
        srv.close()
