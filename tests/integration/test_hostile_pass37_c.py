"""Issue 41, the thirty-seventh hostile pass (tester c: this session's changes read as an
attacker, and the README followed as a careless user). Each test fails without its fix (checked
by reverting ``src`` and running it):

- **A fix that moved a folder outside.** The kernels-only build's new early refusal of a taken
  ``manifest.json`` (``builds/sequence.refuse_a_taken_manifest``) looked at it through the
  build folder: a ``build/<tree>/<key>`` planted as a link to a folder outside that holds a
  ``manifest.json`` folder was told "it is a folder ... To fix: move
  <work dir>/build/<tree>/<key>/manifest.json away", and doing as told moved the folder outside
  the work directory; only the rerun named the link. The link on the way is now named first
  (``confine.check_target``).
- **``slurm plan --dry-run`` passed a folder the plan refuses.** The dry run took the
  campaign lock's shortcut (a folder holding ``.kvprefetch-campaign.lock`` is another plan's)
  though it takes no lock: a folder holding that lock beside the user's files passed the dry
  run and was refused by the plan as not empty; a lock that is a symlink, a folder, a FIFO, a
  hard link or a file of the user's data passed the dry run and was refused by the plan's lock
  (``slurm/folder.new_campaign_folder``, ``workspace/locks.refusal``).
- **``fetch --index-url URL`` told to fix PIP_INDEX_URL.** Every index failure's fix ("point
  PIP_INDEX_URL at a reachable mirror", "use an index that mirrors PyPI's vllm
  (PIP_INDEX_URL)") named the setting ``fetch`` reads only without ``--index-url``: set as
  told, nothing changed. Given ``--index-url``, the fix names it
  (``sources/download.ensure_sdist``).

Nothing is mocked: the CLI runs as a user runs it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

LOCK = ".kvprefetch-campaign.lock"


def test_a_build_folder_linked_outside_is_named_before_its_manifest(fetched_workdir: Path,
                                                                    outside: Path) -> None:
    wd = fetched_workdir
    sel = ["--workdir", str(wd), "--mode", "kernels-only", "--trees", "baseline",
           "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes", "fp16"]
    res = cli("build", *sel, "--dry-run", "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    build_dir = Path(json.loads(res.stdout)["trees"][0]["build_dir"])
    build_dir.parent.mkdir(parents=True)
    elsewhere = outside.parent / "elsewhere"
    (elsewhere / "manifest.json").mkdir(parents=True)
    build_dir.symlink_to(elsewhere)
    res = cli("build", *sel, timeout=120)
    refused(res, 5, f"{build_dir} is a symlink", f"replace the symlink {build_dir}")
    # the fix names the link, never the folder outside seen through it
    assert "move " + str(build_dir / "manifest.json") not in res.stderr, res.stderr
    assert (elsewhere / "manifest.json").is_dir()
    assert not (wd / "envs" / "baseline").exists()


@pytest.mark.parametrize("kind", ["beside-files", "symlink", "folder", "fifo", "hard-link",
                                  "data"])
def test_slurm_plan_dry_run_refuses_a_folder_its_lock_does_not_excuse(tmp_path: Path,
                                                                     outside: Path,
                                                                     kind: str) -> None:
    camp = tmp_path / "camp"
    camp.mkdir()
    lock = camp / LOCK
    if kind == "beside-files":
        lock.write_text("")
        (camp / "mine.txt").write_text("keep")
    elif kind == "symlink":
        lock.symlink_to(outside / "notes.txt")
    elif kind == "folder":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "hard-link":
        (tmp_path / "other").write_text("")
        os.link(tmp_path / "other", lock)
    else:
        lock.write_text("my notes\n")
    before = sorted(p.name for p in camp.iterdir())
    dry = cli("slurm", "plan", str(camp), "--dry-run", timeout=120)
    real = cli("slurm", "plan", str(camp), timeout=120)
    code = 2 if kind == "beside-files" else 8
    refused(real, code)  # what the plan refuses, as before
    refused(dry, code, "not empty" if kind == "beside-files" else str(lock))
    assert sorted(p.name for p in camp.iterdir()) == before


def test_slurm_plan_dry_run_still_passes_a_folder_holding_only_a_kit_lock(tmp_path: Path) -> None:
    camp = tmp_path / "camp"
    camp.mkdir()
    (camp / LOCK).write_text("")  # what a plan stopped after taking its lock leaves
    dry = cli("slurm", "plan", str(camp), "--dry-run", timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert sorted(p.name for p in camp.iterdir()) == [LOCK]
    real = cli("slurm", "plan", str(camp), timeout=120)
    assert real.returncode == 0, real.stderr
    assert (camp / "campaign.json").is_file()


@pytest.mark.parametrize("page", ["refused", "unlisted"])
def test_fetch_index_url_failures_name_the_option_not_pip_index_url(tmp_path: Path,
                                                                   page: str) -> None:
    if page == "refused":
        import socket
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}/simple"
    else:  # an index that lists no vllm-0.10.2.tar.gz
        (tmp_path / "index" / "vllm").mkdir(parents=True)
        (tmp_path / "index" / "vllm" / "index.html").write_text("<html><body></body></html>\n")
        url = (tmp_path / "index").as_uri()
    res = cli("fetch", "--workdir", str(tmp_path / "work"), "--source", "sdist",
              "--index-url", url, timeout=180)
    refused(res, 3, url, "--index-url")
    fix = res.stderr[res.stderr.find("To fix:"):]
    assert "PIP_INDEX_URL" not in fix, res.stderr
