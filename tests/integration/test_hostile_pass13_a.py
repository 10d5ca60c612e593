"""Issue 41, the thirteenth hostile pass, tester a: the acts by path the twelfth pass left open in
the overlay and full-smoke builds (``full_smoke``'s ``rmtree``/``copytree`` and toolkit view,
``cuda12``'s download, assembly and ``rmtree``, the plugin wheel, pip into the overlay env) and
the build folder itself. Each case plants a link to a victim folder outside the work directory
and checks, with real files and real processes, that nothing outside changes."""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvprefetch.errors import BuildError, KvprefetchError
from tests.integration.helpers import kvprefetch_cli


def _snapshot(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``root`` (links not followed): kind, size, sha256 of files."""
    out: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = os.lstat(p)
            if p.is_symlink():
                out[str(p)] = ("link", 0, os.readlink(p))
            elif p.is_file():
                out[str(p)] = ("file", st.st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[str(p)] = ("dir", 0, "")
    return out


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "src").mkdir(parents=True)
    (victim / "src" / "precious.txt").write_text("the user's own\n")
    (victim / "cuda" / "bin").mkdir(parents=True)
    (victim / "cuda" / "bin" / "mine").write_text("mine\n")
    (victim / "wheel.tmp").write_text("a user's file\n")
    return victim


def test_a_build_folder_planted_as_a_link_gets_no_logs_or_sources_outside(
        fetched_workdir: Path, tmp_path: Path) -> None:
    """A link planted at ``build/<tree>/<key>`` (the key is printed by ``--dry-run``) pointing
    at a folder outside: the build made ``logs/`` there by path and wrote the create-env and
    probe logs and the copied ``paged_attention_v1/v2.cu`` into it before a later step refused
    the link (issue 41, the thirteenth hostile pass). Now the logs folder is made from the work
    directory down and the link is refused first; nothing outside changes. A real CLI build,
    refused before anything compiles."""
    if not Path("/usr/local/bin/nvcc").exists() and not os.environ.get("CUDA_HOME"):
        pytest.skip("a kernels-only plan needs an nvcc")
    victim = _victim(tmp_path)
    args = ("build", "--workdir", str(fetched_workdir), "--kernels-only", "--trees", "baseline",
            "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes", "fp16", "--jobs", "1")
    dry = kvprefetch_cli(*args, "--dry-run", timeout=300)
    m = re.search(r"logs: (\S+)/logs", dry.output)
    assert dry.returncode == 0 and m, dry.output
    bdir = Path(m.group(1))
    bdir.parent.mkdir(parents=True, exist_ok=True)
    bdir.symlink_to(victim)
    before = _snapshot(victim)
    res = kvprefetch_cli(*args, timeout=300)
    assert "Traceback" not in res.output, res.output
    assert res.returncode != 0, res.output
    assert "symlink" in res.output and "To fix" in res.output, res.output
    assert _snapshot(victim) == before
    assert bdir.is_symlink() and os.readlink(bdir) == str(victim)


def _small_tree(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    tree = root / "trees" / "baseline"
    (tree / "csrc" / "attention").mkdir(parents=True)
    for i in range(30):
        (tree / "csrc" / "attention" / f"f{i}.cu").write_text(f"// {i}\n" * 50)
    (tree / "setup.py").write_text("# setup\n")
    return root


@pytest.mark.parametrize("planted", ["full-smoke", "full-smoke/src"])
def test_the_smoke_tree_copy_through_a_planted_link_touches_nothing_outside(
        tmp_path: Path, planted: str) -> None:
    """``full_smoke.copy_tree`` removed the old copy with ``shutil.rmtree(dest)`` and made the
    new one with ``shutil.copytree`` by path: with ``build/<tree>/full-smoke`` planted as a
    link to a folder outside, the rmtree emptied the outside ``src/`` (the user's file lost)
    and the copy wrote the tree there. Now both act relative to folders opened ``O_NOFOLLOW``
    from the work directory down: refused with a cause and a fix, nothing outside changes.
    Called directly: the smoke's earlier steps need a torch 2.8.0 environment and CMake 3.26,
    which this machine lacks."""
    from kvprefetch.builds.full_smoke import copy_tree

    root = _small_tree(tmp_path)
    victim = _victim(tmp_path)
    link = root / "build" / "baseline" / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim if planted == "full-smoke" else victim / "src")
    before = _snapshot(victim)
    dest = root / "build" / "baseline" / "full-smoke" / "src"
    with pytest.raises(KvprefetchError) as info:
        copy_tree(root, root / "trees" / "baseline", dest, "0" * 64)
    assert "symlink" in str(info.value)
    assert _snapshot(victim) == before


def test_the_smoke_tree_copy_under_a_swap_loop_writes_nothing_outside(tmp_path: Path) -> None:
    """``full-smoke/`` swapped for a link to a folder outside and back (renameat2
    RENAME_EXCHANGE, the eleventh pass's swapper) while the smoke's tree copy is made again and
    again: each copy completes or is refused, and nothing is written into or removed from the
    folder outside."""
    from kvprefetch.builds.full_smoke import copy_tree
    from tests.integration.test_hostile_pass11_t import _SWAPPER

    root = _small_tree(tmp_path)
    victim = _victim(tmp_path)
    bdir = root / "build" / "baseline" / "full-smoke"
    bdir.mkdir(parents=True)
    before = _snapshot(victim)
    stop = tmp_path / "stop"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(bdir), str(victim),
                                str(stop)], stdout=subprocess.PIPE, text=True)
    refused = 0
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        for i in range(40):
            try:
                copy_tree(root, root / "trees" / "baseline", bdir / "src", f"{i:064d}")
            except KvprefetchError:
                refused += 1
            except OSError:
                refused += 1  # a folder gone between two acts: named by the CLI's handler
    finally:
        stop.touch()
        swapper.wait(timeout=30)
        if swapper.stdout is not None:
            swapper.stdout.close()
    assert refused, "the swaps never met a copy: the test proves nothing"
    assert _snapshot(victim) == before


def _fake_toolkit(tmp_path: Path) -> tuple[Path, Path]:
    tk = tmp_path / "tk"
    (tk / "bin").mkdir(parents=True)
    (tk / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (tk / "nvvm").mkdir()
    (tk / "include").mkdir()
    (tk / "include" / "cuda_runtime.h").write_text("")
    (tk / "lib64").mkdir()
    (tk / "lib64" / "libcudart.so.12").write_text("")
    site = tmp_path / "site"
    (site / "nvidia").mkdir(parents=True)
    return tk, site


def test_the_toolkit_view_through_a_planted_link_touches_nothing_outside(
        tmp_path: Path) -> None:
    """``make_toolkit_view`` ran ``shutil.rmtree(view)`` and made its folders and links by
    path: with ``full-smoke`` planted as a link to a folder outside, the outside ``cuda/`` (a
    user's folder) was removed and the view made there. Now the view is made in a private
    folder and brought in through ``confine``: refused, nothing outside changes. Called
    directly, as above."""
    from kvprefetch.builds.full_smoke import make_toolkit_view

    root = tmp_path / "work"
    root.mkdir()
    tk, site = _fake_toolkit(tmp_path)
    victim = _victim(tmp_path)
    (root / "build" / "baseline").mkdir(parents=True)
    (root / "build" / "baseline" / "full-smoke").symlink_to(victim)
    before = _snapshot(victim)
    with pytest.raises(BuildError, match="symlink"):
        make_toolkit_view(root, root / "build" / "baseline" / "full-smoke" / "cuda", tk, site)
    assert _snapshot(victim) == before


def test_the_cuda12_download_through_a_planted_link_writes_nothing_outside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cuda12.ensure_cuda12`` streamed each archive into ``downloads/cuda-12.4.1/`` with
    ``open_new`` given no work directory: with ``downloads`` planted as a link to a folder
    outside, the folder was made there and the archive written into it. Now the download is
    checked from the work directory down: refused, nothing outside changes. The pinned parts
    (87 MB from Debian, wheels from the index) are replaced by one small wheel of known
    sha256 served by a file:// URL: the network is the one thing not used."""
    from kvprefetch.overlay import cuda12

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("nvidia/cuda_runtime/include/cuda_runtime.h", "// h\n")
    wheel = tmp_path / "served" / "fake_cu12-1-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(buf.getvalue())
    part = cuda12.Part("fake", wheel.name, wheel.as_uri(),
                       hashlib.sha256(buf.getvalue()).hexdigest(), len(buf.getvalue()),
                       (("nvidia/cuda_runtime/include/", "include/"),))
    monkeypatch.setattr(cuda12, "PARTS", (part,))
    root = tmp_path / "work"
    root.mkdir()
    victim = _victim(tmp_path)
    (root / "downloads").symlink_to(victim)
    before = _snapshot(victim)
    with pytest.raises(KvprefetchError, match="symlink"):
        cuda12.ensure_cuda12(root)
    assert _snapshot(victim) == before


def test_the_plugin_wheel_never_writes_through_a_planted_temporary(tmp_path: Path) -> None:
    """``write_plugin_wheel`` wrote ``<wheel>.tmp`` with ``zipfile`` by path: a link planted
    at that name in ``build/<tree>/<key>/plugin/`` had the user's file it named truncated and
    filled with the wheel. Now the wheel is made in memory and written by ``confine``
    (a temporary of its own, ``O_EXCL | O_NOFOLLOW``): the file outside is untouched and the
    wheel is whole."""
    from kvprefetch.overlay.plugin import DIST_NAME, VERSION, write_plugin_wheel

    root = tmp_path / "work"
    plugin = root / "build" / "baseline" / "k" / "plugin"
    plugin.mkdir(parents=True)
    victim = _victim(tmp_path)
    whl_name = f"{DIST_NAME}-{VERSION}-py3-none-any.whl"
    (plugin / f"{whl_name}.tmp").symlink_to(victim / "wheel.tmp")
    before = _snapshot(victim)
    whl = write_plugin_wheel(plugin, {"tree": "baseline"}, root=root)
    assert _snapshot(victim) == before
    assert zipfile.ZipFile(whl).testzip() is None and not whl.is_symlink()


def test_pip_into_an_overlay_env_with_a_linked_site_packages_is_refused(
        tmp_path: Path) -> None:
    """The overlay's install steps run pip (or uv) into the tree's environment, and pip writes
    the environment by path: with ``envs/<tree>/lib`` swapped for a link to a folder outside
    after the environment was made, a real ``pip install`` of the plugin wheel wrote the
    package into the folder outside. pip's own writes cannot be made relative to a descriptor,
    so the kit now refuses, just before pip starts, an environment whose folder, ``bin/`` or
    ``site-packages`` inside the work directory is or passes a link. A real venv with pip and
    real pip; the tree's run is a stand-in (an overlay build needs 9 GB of wheels)."""
    from kvprefetch.builds.modes.overlay import OverlayTree
    from kvprefetch.builds.plan import Step
    from kvprefetch.machine.envs import make_env
    from kvprefetch.overlay.plugin import write_plugin_wheel

    root = tmp_path / "work"
    envp = root / "envs" / "baseline"
    envp.parent.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", str(envp)], check=True, timeout=180)
    env = make_env("venv", envp, python=sys.executable)
    site = env.site_packages()  # asked of the env's python before the swap
    victim = _victim(tmp_path)
    os.rename(envp / "lib", victim / "lib")
    (envp / "lib").symlink_to(victim / "lib")
    before = _snapshot(victim)
    whl = write_plugin_wheel(root / "build" / "baseline" / "k" / "plugin", {"tree": "b"},
                             root=root)
    run_ = SimpleNamespace(plan=SimpleNamespace(workdir=str(root)), need_env=lambda: env,
                           child={k: v for k, v in os.environ.items()
                                  if not k.startswith("PYTHON")},
                           inputs=SimpleNamespace(overlay=None))
    steps = OverlayTree(run_)  # type: ignore[arg-type]
    step = Step("install-plugin", (str(env.python), "-m", "pip", "install", "--no-deps",
                                   "--no-index", "--force-reinstall", str(whl)), "")
    with pytest.raises(BuildError, match="symlink") as info:
        steps.install_plugin(step, tmp_path / "install.log")
    assert info.value.fix
    assert site.parent.parent.name == "lib"
    assert _snapshot(victim) == before


def test_a_build_folder_root_planted_as_a_link_gets_no_lock_outside(
        fetched_workdir: Path, tmp_path: Path) -> None:
    """``build/`` planted as a link to a folder outside: the build's lock
    ``build/<tree>/.lock`` was taken by path, so its folder ``<tree>/`` and the lock file were
    made outside before the build was refused (a real overlay build showed it; a kernels-only
    build takes the same lock). Now the lock's folder is made, and the lock opened, from the
    work directory down: refused with a cause and a fix, nothing outside changes."""
    victim = _victim(tmp_path)
    (fetched_workdir / "build").symlink_to(victim)
    before = _snapshot(victim)
    res = kvprefetch_cli("build", "--workdir", str(fetched_workdir), "--kernels-only",
                         "--trees", "baseline", "--head-sizes", "128", "--block-sizes", "16",
                         "--kv-dtypes", "fp16", "--jobs", "1", timeout=300)
    assert "Traceback" not in res.output, res.output
    assert res.returncode != 0 and "symlink" in res.output and "To fix" in res.output, \
        res.output
    assert _snapshot(victim) == before


def test_clean_never_reports_removing_an_orphan_behind_a_planted_link(
        fetched_workdir: Path, tmp_path: Path) -> None:
    """An ownership record's ``tmp`` entry of a dead run (``toolkits/.cuda-12.4.1.tmp-<pid>``,
    what a killed toolkit assembly leaves) while ``toolkits/`` is a link to a folder outside
    holding a file of that name: clean rightly left the file alone but printed "removed" of
    it. Now only what was removed is reported; the entry is forgotten, nothing outside
    changes."""
    import json

    victim = _victim(tmp_path)
    (victim / ".cuda-12.4.1.tmp-999999").write_text("the user's\n")
    (fetched_workdir / "toolkits").symlink_to(victim)
    owned = fetched_workdir / ".kvprefetch-owned.json"
    data = json.loads(owned.read_text())
    data["paths"]["toolkits/.cuda-12.4.1.tmp-999999"] = {"kind": "tmp", "pid": 999999}
    owned.write_text(json.dumps(data))
    before = _snapshot(victim)
    res = kvprefetch_cli("clean", "--workdir", str(fetched_workdir), "--what", "builds")
    assert res.returncode == 0 and "Traceback" not in res.output, res.output
    assert ".cuda-12.4.1.tmp-999999" not in res.output, res.output
    assert _snapshot(victim) == before
    assert "toolkits/.cuda-12.4.1.tmp-999999" not in json.loads(owned.read_text())["paths"]


def test_a_build_log_under_a_swap_loop_is_never_written_outside(tmp_path: Path) -> None:
    """``build/<tree>/<key>`` swapped for a link to a folder outside and back while the build
    writes its logs: ``runner.open_log`` checked only that the log's own folder is no link and
    then opened the log by its whole path, so a swapped folder above it had a real overlay
    build make ``logs/`` outside and append its create-env and install logs there (1 run of
    4). Now a log inside a work directory is opened from the work directory down
    (``confine.open_dir``): each write lands inside or is refused, and nothing outside changes.
    The build's own steps are replaced by 300 appends through ``open_log`` (the overlay's
    install needs 9 GB of wheels); the work directory is made known as the kit makes it
    (``Workdir``)."""
    from kvprefetch.runner import open_log
    from kvprefetch.workspace.workdir import Workdir
    from tests.integration.test_hostile_pass11_t import _SWAPPER

    root = tmp_path / "work"
    Workdir(root)
    bdir = root / "build" / "baseline" / "k"
    (bdir / "logs").mkdir(parents=True)
    victim = _victim(tmp_path)
    (victim / "logs").mkdir()
    before = _snapshot(victim)
    stop = tmp_path / "stop"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(bdir), str(victim),
                                str(stop)], stdout=subprocess.PIPE, text=True)
    refused = written = 0
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        for i in range(300):
            try:
                with open_log(bdir / "logs" / f"{i % 5:02d}-step.log") as f:
                    f.write(f"line {i}\n")
                written += 1
            except KvprefetchError:
                refused += 1
    finally:
        stop.touch()
        swapper.wait(timeout=30)
        if swapper.stdout is not None:
            swapper.stdout.close()
    assert _snapshot(victim) == before
    assert refused and written, (refused, written)


def test_a_stop_during_ensurepip_leaves_nothing_in_the_temp_folder(
        fetched_workdir: Path, tmp_path: Path) -> None:
    """SIGTERM to an overlay build (started with SIGINT ignored, as a script's background
    job is) while its venv backend runs ``ensurepip``: pip's
    temporaries (``pip-build-tracker-*``, ``pip-install-*``, ``tmp*cacert.pem``) were left in
    the user's TMPDIR (3 runs of 4 stopped there), since environment creation ran before the
    build's private TMPDIR. Now every backend command gets a private TMPDIR removed however it
    ends. A real CLI overlay build against a local empty package index (served here: the
    preflight asks that one is reachable; nothing is downloaded)."""
    import functools
    import http.server
    import signal
    import threading
    import time

    served = tmp_path / "index"
    served.mkdir()
    (served / "index.html").write_text("<html></html>")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    temp = tmp_path / "temp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp), PIP_INDEX_URL=url, UV_INDEX_URL=url,
               PYTHONUNBUFFERED="1")
    lines: list[str] = []
    rest, rc, reached = "", None, False
    try:
        with subprocess.Popen(
                # SIGINT ignored, as a script's background job (`kvprefetch build &`, nohup)
                # inherits it: the kit then stops its children without a SIGINT, and pip gets
                # no KeyboardInterrupt to clean up on
                ["sh", "-c", 'trap "" INT; exec "$0" "$@"', sys.executable, "-m", "kvprefetch",
                 "build", "--workdir", str(fetched_workdir), "--mode", "overlay", "--trees",
                 "baseline", "--env-backend", "venv"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True) as proc:
            assert proc.stdout is not None
            deadline = time.monotonic() + 120
            for line in proc.stdout:
                lines.append(line)
                if "ensurepip" in line or time.monotonic() > deadline:
                    reached = "ensurepip" in line
                    break
            if reached:
                time.sleep(0.4)  # into pip's own work
                proc.send_signal(signal.SIGTERM)
            else:
                proc.kill()
            rest = proc.stdout.read()
            rc = proc.wait(timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    if not reached:
        pytest.skip("the build never reached ensurepip: " + "".join(lines)[-500:])
    text = "".join(lines) + rest
    assert "Traceback" not in text, text
    if rc != 128 + signal.SIGTERM:
        pytest.skip(f"ensurepip finished before the stop (exit {rc}): nothing to check")
    assert sorted(os.listdir(temp)) == [], text
