"""Issue 41, the third hostile pass (against d2c73c1): what still reached past the work
directory, gave a traceback or hung, and the three items the second pass left open. Each test
fails on d2c73c1 (the FIFO and /dev/zero cases by hanging or filling memory there), except
``test_a_state_temporary_of_a_killed_run_is_an_orphan_of_the_record``, which guards that the
new way still cleans up after a kill:

- a symlink planted at ``vmm bench``'s temporary ``<out>.tmp``: the report was written into the
  file it pointed at (vmm/ was outside the writer scan);
- ``verify/`` swapped for a symlink: the disassembly worker wrote its cache behind it; a cache
  entry that is a FIFO hung verify-kernel, one nested 100k deep was a RecursionError traceback;
- a build log (``logs/NN-step.log``) that is a symlink: the runner appended through it;
- ``bench --name ../../x`` (kernel, decode, e2e, ncu) put the outputs outside ``--out``;
- a pid of 10^23 in an ownership ``tmp`` entry or a temporary's name: OverflowError traceback;
- ``bench decode`` without a GPU: torch's RuntimeError traceback; ``vmm selftest --ops -5``
  accepted; a Ctrl-C in the first 0.1 s (imports): a KeyboardInterrupt traceback;
- open item (b): a user's ``state/.<tree>.json.tmp-<hex>-<pid>`` in a work directory the kit
  created empty was deleted by name;
- open item (c): a user's ``.lock`` holding only digits was taken for a stale kit lock and
  emptied;
- open item (a): a folder swapped for a symlink between ``check_target`` and the act (the
  rename of ``clean``, the write of a record) moved or wrote outside the work directory.

Every refusal is checked with ``refused``; the autouse ``outside`` fixture checks that a folder
outside the work directory is byte-identical afterwards."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvprefetch
from kvprefetch.errors import ConfigError, LockError
from tests.integration.helpers import tree_bytes
from tests.integration.test_reliability import _env, cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

HUGE = 10**23


# --------------------------------------------------------------- writes through planted links


def test_vmm_bench_never_writes_through_a_link_at_its_temporary(
        tmp_path: Path, outside: Path) -> None:
    """The report's checkpoint went to ``<out>.tmp`` with open("w"): a planted link there had
    the report written into the file it pointed at. Now confine.write_file: the link is left
    alone, the report is a new file beside it."""
    cwd = tmp_path / "run"
    cwd.mkdir()
    (cwd / "vmm-bench.json.tmp").symlink_to(outside / "notes.txt")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "vmm", "bench", "--skip-steps",
                          "--skip-decode", "--out", "vmm-bench.json"], cwd=cwd, env=_env(),
                         capture_output=True, text=True, timeout=300, check=False)
    assert "Traceback" not in res.stderr, res.stderr
    assert (outside / "notes.txt").read_text() == "keep me\n"
    assert json.loads((cwd / "vmm-bench.json").read_text())["argv"]


def test_the_verify_cache_is_never_written_through_a_symlinked_folder(
        tmp_path: Path, outside: Path) -> None:
    """The disassembly worker's cache write made ``verify/cache`` with mkdir -p and wrote a
    temporary there: with ``verify/`` a link, both landed outside. Now written from the work
    directory down with confine (the worker's --root): refused, reported as "not cached"."""
    from kvprefetch.errors import VerifyError
    from kvprefetch.verify.facts import _write_atomic

    wd = tmp_path / "w"
    wd.mkdir()
    (wd / "verify").symlink_to(outside, target_is_directory=True)
    with pytest.raises(VerifyError, match="is a symlink"):
        _write_atomic(wd / "verify" / "cache" / "abc.json", {"x": 1}, root=wd)
    assert not (outside / "cache").exists()


@pytest.mark.parametrize("kind", ["fifo", "nested-100k", "dev-zero"])
def test_a_verify_cache_entry_that_is_not_a_record_is_a_miss_not_a_hang(
        tmp_path: Path, kind: str) -> None:
    """load_cached read the entry with read_text: a FIFO blocked forever, /dev/zero filled
    memory, JSON 100k deep was a RecursionError. Now read_limited: each is a cache miss."""
    from kvprefetch.verify.facts import cache_path, load_cached

    entry = cache_path(tmp_path, "ab" * 32)
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "dev-zero":
        entry.symlink_to("/dev/zero")
    else:
        entry.write_text("[" * 100_000 + "]" * 100_000)
    start = time.monotonic()
    assert load_cached(tmp_path, "ab" * 32, {}) is None
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("planted", ["symlink", "symlinked-folder", "fifo"])
def test_a_command_log_is_never_written_through_a_link_or_into_a_fifo(
        tmp_path: Path, outside: Path, planted: str) -> None:
    """runner.run appended the command's output to ``log`` with open("a"): a link there (or a
    linked logs/ folder) wrote into the file it pointed at, a FIFO hung. Now refused."""
    from kvprefetch.runner import run

    logs = tmp_path / "logs"
    if planted == "symlinked-folder":
        logs.symlink_to(outside, target_is_directory=True)
        log = logs / "notes.txt"
    else:
        logs.mkdir()
        log = logs / "01-step.log"
        if planted == "symlink":
            log.symlink_to(outside / "notes.txt")
        else:
            os.mkfifo(log)
    with pytest.raises(ConfigError, match="refusing to write the log"):
        run(["true"], log=log, echo=False, timeout=30)


@pytest.mark.parametrize("command", [
    ("bench", "kernel", "--dry-run", "--batch", "1", "--context", "512"),
    ("bench", "decode", "--dry-run", "--batch", "1", "--context", "1k", "--layers", "1"),
    ("bench", "e2e", "--dry-run"),
    ("bench", "ncu", "--dry-run"),
], ids=["kernel", "decode", "e2e", "ncu"])
@pytest.mark.parametrize("name", ["../../outside/notes", "a\nb", ""], ids=["dotdot", "newline",
                                                                          "empty"])
def test_bench_name_is_a_file_name_never_a_path(
        tmp_path: Path, command: tuple[str, ...], name: str) -> None:
    """``--name ../../x`` made write_outputs write ``<out>/../../x.json``; a newline went into
    a file name. Now click's usage error (exit 2), from the option itself."""
    res = cli(*command, "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
              "--name", name, timeout=120)
    refused(res, 2, "--name", "is not a file name")


def test_write_outputs_refuses_a_name_with_a_folder(tmp_path: Path, outside: Path) -> None:
    from kvprefetch.bench.report import write_outputs
    from kvprefetch.errors import OptionError

    out = tmp_path / "o"
    with pytest.raises(OptionError, match="not a file name"):
        write_outputs({"kind": "kernel"}, out, f"../{outside.name}/notes", ("json",))
    assert not out.exists()


# ---------------------------------------------------------------------- tracebacks and values


def test_a_pid_no_process_can_have_is_a_corrupt_record_not_a_traceback(
        fetched_workdir: Path) -> None:
    """os.kill(10**23, 0) is an OverflowError: a record's ``tmp`` entry carrying one (its name
    too) was a traceback in clean and fetch. Now such an entry is not the kit's: corrupt."""
    rel = f"tmp/x-{HUGE}-ab"
    owned = fetched_workdir / ".kvprefetch-owned.json"
    doc = json.loads(owned.read_text())
    doc["paths"][rel] = {"kind": "tmp", "pid": HUGE}
    owned.write_text(json.dumps(doc))
    refused(cli("clean", "--workdir", str(fetched_workdir)), ConfigError.exit_code,
            repr(rel), "is not a temporary path of a kvprefetch process")


def test_a_temporary_named_with_a_huge_pid_is_left_alone(fetched_workdir: Path) -> None:
    user = fetched_workdir / f"..kvprefetch-owned.json.tmp-abcdef-{HUGE}"
    user.write_text("mine\n")
    res = cli("clean", "--workdir", str(fetched_workdir))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert user.read_text() == "mine\n"


def test_bench_decode_without_a_gpu_is_one_message(tmp_path: Path) -> None:
    """bench decode reached torch.cuda.get_device_properties without a GPU: a RuntimeError
    traceback. Now the same refusal as bench kernel (require_gpu)."""
    pytest.importorskip("torch")
    import torch

    from kvprefetch.bench.device import require_gpu
    from kvprefetch.errors import BenchError

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal is for machines without one")
    with pytest.raises(BenchError, match="bench decode needs a CUDA GPU"):
        require_gpu("decode")


def test_vmm_selftest_refuses_a_negative_op_count() -> None:
    refused(cli("vmm", "selftest", "--driver", "fake", "--ops", "-5"), 2, "--ops")


def test_a_ctrl_c_while_the_cli_imports_is_one_line(tmp_path: Path) -> None:
    """A SIGINT before click's main runs (the imports of ``python -m kvprefetch``) printed a
    KeyboardInterrupt traceback. Sent at several early moments: never a traceback. Only the
    interpreter's own start-up (site.py and the ``.pth`` files it runs, before ``-m`` imports
    the kit: "Fatal Python error: init_import_site") is out of the kit's reach; a loaded
    machine reaches it at 0.05 s, so the moments go on until two have reached the kit."""
    reached = 0
    for delay in (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2):
        if reached >= 2:
            break
        proc = subprocess.Popen([sys.executable, "-m", "kvprefetch", "clean", "--workdir",
                                 str(tmp_path / "none"), "--dry-run"], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                # the default Ctrl-C, as a terminal gives it (pytest's may differ)
                                preexec_fn=lambda: signal.signal(  # noqa: PLW1509 -- no threads
                                    signal.SIGINT, signal.SIG_DFL))
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if "Fatal Python error: init_import_site" in err or _before_the_kit(err):
            continue  # the interpreter's start-up, before any module of the kit
        reached += 1
        assert "Traceback" not in err, (delay, err)
    assert reached >= 2, "every SIGINT landed in the interpreter's own start-up"


_KIT_SOURCE = str(Path(kvprefetch.__file__).resolve().parent)


def _before_the_kit(err: str) -> bool:
    """A traceback none of whose frames is in the kit: the interrupt landed in ``runpy`` or
    ``importlib`` before ``-m`` ran any module of it (a fresh CI run under load met it)."""
    if "Traceback" not in err:
        return False
    frames = re.findall(r'^  File "([^"]+)"', err, re.MULTILINE)
    return bool(frames) and not any(f.startswith(_KIT_SOURCE) for f in frames)


# ---------------------------------------------- open items (b) and (c) of the second pass


def test_a_user_file_named_like_a_state_temporary_is_never_removed(
        fetched_workdir: Path, vllm_sdist: Path) -> None:
    """In a work directory the kit created empty, ``stale_writes`` removed any
    ``state/.<x>.tmp-<hex>-<pid>`` of a dead pid by its name. A state record's temporary is now
    in the ownership record before it exists; by name the kit removes only its own top-level
    records' temporaries (``..kvprefetch-owned.json.tmp-…``)."""
    user = fetched_workdir / "state" / ".baseline.json.tmp-abcdef-4000000"
    user.write_text("my draft\n")
    kit = fetched_workdir / "..kvprefetch-owned.json.tmp-abcdef-4000000"
    kit.write_text("{}")
    for argv in (("clean",), ("apply",), ("fetch", "--source", str(vllm_sdist)),
                 ("clean", "--what", "builds")):
        res = cli(argv[0], "--workdir", str(fetched_workdir), *argv[1:])
        assert res.returncode == 0, (argv, res.stderr)
        assert user.read_text() == "my draft\n", argv
    assert not kit.exists()


def test_a_state_temporary_of_a_killed_run_is_an_orphan_of_the_record(
        fetched_workdir: Path) -> None:
    """What a run killed while writing a state record leaves: a ``tmp`` entry with its pid
    and the file of that name. The next clean removes it from the record."""
    tmp = fetched_workdir / "state" / ".patched.json.tmp-4000000"
    tmp.write_text("{}")
    owned = fetched_workdir / ".kvprefetch-owned.json"
    doc = json.loads(owned.read_text())
    doc["paths"]["state/.patched.json.tmp-4000000"] = {"kind": "tmp", "pid": 4000000}
    owned.write_text(json.dumps(doc))
    res = cli("clean", "--workdir", str(fetched_workdir))
    assert res.returncode == 0, res.stderr
    assert not tmp.exists()
    assert "state/.patched.json.tmp-4000000" not in json.loads(owned.read_text())["paths"]


@pytest.mark.parametrize("rel", [".lock", ".locks/tree-patched.lock"])
def test_a_lock_file_of_digits_is_refused_never_emptied(fetched_workdir: Path, rel: str) -> None:
    lock = fetched_workdir / rel
    lock.write_text("12345\n")
    refused(cli("clean", "--workdir", str(fetched_workdir), "--what", "all"),
            LockError.exit_code, str(lock), "only digits")
    other = ("apply",) if rel.startswith(".locks/") else ("fetch", "--source", "sdist")
    refused(cli(other[0], "--workdir", str(fetched_workdir), *other[1:]), LockError.exit_code,
            "only digits")
    assert lock.read_text() == "12345\n"


def test_the_kit_lock_carries_its_marker_while_held(fetched_workdir: Path) -> None:
    from kvprefetch.workspace.locks import locked

    lock = fetched_workdir / ".locks" / "tree-patched.lock"
    with locked(lock, "the tree patched"):
        assert lock.read_text() == f"kvprefetch-lock pid {os.getpid()}\n"
        with pytest.raises(LockError, match=rf"pid {os.getpid()}"), \
                locked(lock, "the tree patched"):
            pass
    assert lock.read_text() == ""


# ------------------------------------------------- open item (a): the time-of-check race


def test_a_folder_swapped_for_a_link_after_the_check_moves_nothing_outside(
        fetched_workdir: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ownership.remove`` checked ``build/patched`` with lstat, then renamed it by path: a
    ``build/`` swapped for a link between the two renamed (and then deleted) a folder outside.
    The swap is made deterministic here: right after the check passes, ``build`` becomes a
    link to the outside folder, which has a ``patched/`` of its own."""
    from kvprefetch.errors import KvprefetchError
    from kvprefetch.workspace import confine, ownership

    root = fetched_workdir
    build = root / "build"
    (build / "patched").mkdir(parents=True)
    ownership.record(root, build / "patched", "build")
    real_check = confine.check_target

    def check_then_swap(r: Path, path: Path, **kw: object) -> None:
        # every check made before the swap passes (the real one); the swap follows at once,
        # so that only what the act itself does stands between it and the outside folder
        if build.is_symlink():
            return
        real_check(r, path, **kw)  # type: ignore[arg-type]
        if path == build / "patched":
            build.rename(root / "build.real")
            build.symlink_to(outside, target_is_directory=True)

    monkeypatch.setattr(confine, "check_target", check_then_swap)
    with pytest.raises(KvprefetchError, match="became a symlink"):
        ownership.remove(root, build / "patched")
    assert (root / "build.real" / "patched").is_dir()
    assert (outside / "patched" / "deep" / "thesis.tex").read_text() == "three years of work\n"


def test_a_record_write_never_lands_behind_a_folder_swapped_after_the_check(
        tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch.errors import KvprefetchError
    from kvprefetch.workspace import confine

    root = tmp_path / "w"
    (root / "state").mkdir(parents=True)
    before = tree_bytes(outside)
    state = root / "state"

    def name_then_swap(n: int) -> str:
        # the temporary's name is drawn after every check on the way, just before the write:
        # the swap lands in that window
        state.rename(root / "state.real")
        state.symlink_to(outside, target_is_directory=True)
        return "abcdef"

    monkeypatch.setattr(confine.secrets, "token_hex", name_then_swap)
    with pytest.raises(KvprefetchError, match="became a symlink"):
        confine.write_file(root / "state" / "baseline.json", "{}\n", root=root)
    assert tree_bytes(outside) == before
