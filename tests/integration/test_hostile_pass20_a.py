"""Issue 41, the twentieth hostile pass, tester a (the work directory's commands).

- **A mount point inside a folder clean removes** (``confine.refuse_mounts``). ``clean``
  removed a kit-made folder with ``shutil.rmtree``, which walks into a mount point below it (a
  disk, a container's volume, a folder of elsewhere bind-mounted there) and deletes what the
  mount shows, which lives outside the work directory, before the mount point's own ``rmdir``
  fails: ``clean --what builds`` with a folder bind-mounted at ``build/patched/cache`` emptied
  that folder, then said "cache: Device or resource busy / To fix: check the path and its file
  system" (1 run of 1 by hand; ``clean --what trees --discard-edits`` and a mount in a tree the
  same by reading). Now the removal is refused before anything goes, naming the mount point and
  ``umount`` (exit 2), and a bind mount of the same file system is told by its mount id, not
  only by its device.
- **An apply journal entry without "before" or "after"** (``treetxn._journal_files``). The
  check took a missing key for a null one, and the rollback then read ``f["before"]``: a
  ``KeyError`` traceback from ``apply``, ``fetch`` and ``clean --what trees`` alike, on every
  run after it (1 of 1 forged journals by hand, after its entry's link was moved away as the
  previous message said). Now the journal is corrupt, named with its fix (exit 4).
- **fetch --repair on a tree that moves** (``repair._refuse_a_moving_tree``). The repair reads
  the tree twice, its inventory and then which variant its patched files carry; a swap loop
  exchanging ``trees/patched/csrc/attention`` with a link had the inventory see the link and the
  variant check the patched files: a ``KeyError`` traceback (1 run of 2 under the loop). The
  test stands the two reads' disagreement in without a loop (the variant check says
  "prefetch" of a tree whose patched file is gone). Now one FetchError (exit 3) naming the
  tree and the file.
- **A user's folder in an adopted work directory's envs/** (``cleaning._kit_env``). ``clean
  --what envs`` removed every folder of ``envs/`` holding a file named ``.kvprefetch-env.json``,
  the ownership record unread: in a work directory adopted with the user's files, their
  ``envs/mine/`` (an environment copied from elsewhere, a marker of any content) went with
  everything in it (2 of 2 adopted directories; the nineteenth pass left it open, found by
  reading). The kit now records the environments it makes (kind ``env``); in an adopted work
  directory only those are removed, the user's are listed as kept. A work directory the kit
  created empty still goes by the marker (environments made before the record kept them).
  Making an environment there (``build``) did the same to a user's folder at the
  environment's own path when ``--force`` was given, the marker named other options, or a file
  named like the creation stamp was beside it (1 of 1 by hand, the stamp); now refused, naming
  the folder (``Env._refuse_a_users_folder``).
- **export-header -o /dev/stdout** (``cli.common.output_file``): refused with "To fix: move the
  symlink /dev/stdout away", advice that breaks the machine if followed (1 of 1 by hand; a wrong-
  way message). Now a usage error saying it is a link to a terminal, pipe or device and that the
  kit writes only a regular file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes

_REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path))
    return env


def _kv(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)


def _own(wd: Path, rel: str, kind: str) -> None:
    """Record ``rel`` in the work directory's ownership record, as the kit does when it makes
    it (a build folder)."""
    p = wd / ".kvprefetch-owned.json"
    record = json.loads(p.read_text())
    record["paths"][rel] = {"kind": kind}
    p.write_text(json.dumps(record))


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[list[Path]]:
    """Bind-mounts ``outside`` wherever the test asks (needs root, as test_reliability's
    tmpfs); every mount below ``tmp_path`` is taken down afterwards, wherever it is now (a
    clean without the fix renames the folder holding it)."""
    made: list[Path] = []
    yield made
    for _ in made:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            points = [line.split()[1] for line in f]
        for m in reversed([p for p in points if p.startswith(f"{tmp_path}/")]):
            subprocess.run(["umount", "-l", m], check=False)


def _bind(made: list[Path], src: Path, at: Path) -> None:
    at.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "--bind", str(src), str(at)], capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")
    made.append(at)


@pytest.mark.parametrize("case", ["inside-a-build", "a-build-itself", "inside-an-edited-tree"])
def test_clean_never_deletes_across_a_mount_point(
        fetched_workdir: Path, outside: Path, mounted: list[Path], tmp_path: Path,
        case: str) -> None:
    wd = fetched_workdir
    if case == "inside-an-edited-tree":
        at = wd / "trees" / "patched" / "cache"
        args = ["--what", "trees", "--discard-edits"]
    else:
        (wd / "build" / "patched").mkdir(parents=True)
        _own(wd, "build/patched", "build")
        at = wd / "build" / "patched" / ("cache" if case == "inside-a-build" else "")
        args = ["--what", "builds"]
    # a mount at the build folder itself is a place the user chose for it (as a linked build/,
    # built through on purpose): clean's lock may go there, so a disk of its own stands in
    src = outside
    if case == "a-build-itself":
        src = tmp_path / "disk"
        (src / "mine").mkdir(parents=True)
        (src / "mine" / "data.bin").write_bytes(b"not the kit's")
    _bind(mounted, src, at)
    res = _kv(tmp_path, "clean", "--workdir", str(wd), *args)
    text = res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == 2 and "To fix:" in text, (res.returncode, text)
    assert f"{at.as_posix().rstrip('/')} is a mount point" in text, text
    assert "umount" in text, text
    # the outside fixture checks that everything mounted there is still there
    assert case != "a-build-itself" or (at / "mine" / "data.bin").read_bytes() == b"not the kit's"


@pytest.mark.parametrize("missing", ["before", "after"])
@pytest.mark.parametrize("command", [["apply"], ["fetch"], ["clean", "--what", "trees"]])
def test_an_apply_journal_entry_without_before_or_after_is_corrupt_not_a_traceback(
        fetched_workdir: Path, tmp_path: Path, missing: str, command: list[str]) -> None:
    wd = fetched_workdir
    stage = wd / "trees" / ".patched.apply"
    stage.mkdir()
    entry = {"rel": "csrc/attention/attention_kernels.cuh", "before": None, "after": None}
    del entry[missing]
    (stage / "journal.json").write_text(json.dumps({"files": [entry], "state": None}))
    before = (wd / "trees" / "patched" / entry["rel"]).read_bytes()
    res = _kv(tmp_path, *command, "--workdir", str(wd))
    text = res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == 4 and "To fix:" in text, (res.returncode, text)
    assert f"{stage / 'journal.json'} is corrupt" in text, text
    assert (wd / "trees" / "patched" / entry["rel"]).read_bytes() == before


def test_fetch_repair_of_a_tree_that_changes_between_its_two_reads_is_one_message(
        fetched_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch import upstream
    from kvprefetch.errors import FetchError
    from kvprefetch.sources import patching, repair
    from kvprefetch.workspace.workdir import Workdir

    wd = fetched_workdir
    own = upstream.patched_paths("prefetch")
    (wd / "trees" / "patched" / own[0]).unlink()
    # what the variant check saw before the swap: the patched files, through the real folder
    monkeypatch.setattr(patching, "carried_variant", lambda tree: "prefetch")
    with pytest.raises(FetchError) as err:
        repair.repair_states(Workdir(wd), ["patched"], wd / "pristine" / "sdist", "sdist",
                             "test", None)
    assert f"{wd / 'trees' / 'patched'} changed while `fetch --repair` read it" in str(err.value)
    assert own[0] in str(err.value)


def test_clean_keeps_a_users_env_folder_in_an_adopted_work_directory(
        tmp_path: Path, fetched_template: Path) -> None:
    from kvprefetch.machine.envs import VenvEnv

    wd = tmp_path / "mine"
    (wd / "envs" / "mine").mkdir(parents=True)
    (wd / "envs" / "mine" / ".kvprefetch-env.json").write_text('{"kind": "venv", "state": "ready"}')
    (wd / "envs" / "mine" / "results.csv").write_text("a year of runs\n")
    sdist = fetched_template / "downloads" / "vllm-0.10.2.tar.gz"
    res = _kv(tmp_path, "fetch", "--adopt", "--source", str(sdist), "--workdir", str(wd))
    assert res.returncode == 0, res.stderr
    # an environment the kit makes there is recorded, and still removed
    VenvEnv(wd / "envs" / "patched").create(owner=wd)
    res = _kv(tmp_path, "clean", "--what", "envs", "--workdir", str(wd))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert (wd / "envs" / "mine" / "results.csv").read_text() == "a year of runs\n"
    assert f"kept {wd / 'envs' / 'mine'}: not in the ownership record" in res.stderr, res.stderr
    assert not (wd / "envs" / "patched").exists()


@pytest.mark.parametrize("case", ["force", "stamp"])
def test_making_an_env_never_removes_a_users_folder_at_its_path_in_an_adopted_work_directory(
        tmp_path: Path, fetched_template: Path, case: str) -> None:
    from kvprefetch.errors import ConfigError
    from kvprefetch.machine.envs import VenvEnv

    wd = tmp_path / "mine"
    env = wd / "envs" / "patched"
    env.mkdir(parents=True)
    (env / ".kvprefetch-env.json").write_text('{"kind": "venv", "state": "ready", "options": {}}')
    (env / "results.csv").write_text("a year of runs\n")
    if case == "stamp":
        (wd / "envs" / ".patched.creating").write_text("my notes\n")
    sdist = fetched_template / "downloads" / "vllm-0.10.2.tar.gz"
    res = _kv(tmp_path, "fetch", "--adopt", "--source", str(sdist), "--workdir", str(wd))
    assert res.returncode == 0, res.stderr
    with pytest.raises(ConfigError) as err:
        VenvEnv(env).create(owner=wd, force=case == "force")
    assert f"{env} is not an environment kvprefetch made here" in str(err.value)
    assert (env / "results.csv").read_text() == "a year of runs\n"
    assert case != "stamp" or (wd / "envs" / ".patched.creating").read_text() == "my notes\n"


@pytest.mark.parametrize("target", ["/dev/stdout", "/dev/stderr"])
def test_export_header_to_dev_stdout_is_not_told_to_move_dev_stdout(
        fetched_workdir: Path, tmp_path: Path, target: str) -> None:
    res = _kv(tmp_path, "export-header", "--workdir", str(fetched_workdir), "-o", target)
    text = res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == 2 and "To fix:" in text, (res.returncode, text)
    assert "move the symlink" not in text, text
    assert "is a link to a terminal, pipe or device, not a file" in text, text
