"""Items of the thirty-third to thirty-fifth hostile passes' left-open lists, closed by the lead
(issue 41). Each test failed before its fix:

- ``report --readme F --out X`` rewrote F in place and ignored ``--out`` without a word (as it
  ignored ``--formats``, ``--print``, ``--merge``, and ``--index`` given beside it);
- ``clean`` in a work directory without its ownership record kept everything as "not created
  by kvprefetch", with no word of ``fetch --repair``, the way back;
- a state record whose ``applied`` files named ``../../x`` or an absolute path was taken as
  sound (nothing acted on them; the record is now corrupt, as any record path leaving its
  place is);
- the kernels-only build refused a ``manifest.json`` planted as a link only when it wrote it,
  after compiling;
- a ``<work dir>/ccache`` that is a file or FIFO met ccache's own error mid-build;
- ``slurm plan --dry-run`` showed the scripts for a folder the real plan refuses (another
  user's, or not empty).

Nothing is mocked: the CLI runs as a user runs it, on a work directory made by the real
``fetch --source sdist``; the ccache check is called as the full build calls it (a full build
needs vLLM's wheel-sized downloads here)."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest

from kvprefetch.builds.modes.full import refuse_linked_cache
from kvprefetch.errors import BuildError
from tests.integration.test_reliability import cli, refused


@pytest.mark.parametrize("extra", [["--out", "X"], ["--formats", "md"], ["--print"],
                                   ["--merge"], ["--index", "runs"]])
def test_report_readme_refuses_what_it_would_ignore(tmp_path: Path, extra: list[str]) -> None:
    target = tmp_path / "README.md"
    target.write_text("# nothing to regenerate\n")
    (tmp_path / "X").mkdir()
    (tmp_path / "runs").mkdir()
    args = [str(tmp_path / a) if a in ("X", "runs") else a for a in extra]
    res = cli("report", "--readme", str(target), *args, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert ("does not use " + extra[0]) in res.stderr or "not both" in res.stderr, res.stderr
    assert target.read_text() == "# nothing to regenerate\n"
    assert not any((tmp_path / "X").iterdir())


def test_report_index_refuses_what_it_would_ignore(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    res = cli("report", "--index", str(tmp_path / "runs"), "--formats", "png", timeout=60)
    assert res.returncode == 2 and "--index does not use --formats" in res.stderr, res.stderr


def test_clean_without_an_ownership_record_names_the_repair(fetched_workdir: Path) -> None:
    wd = fetched_workdir
    (wd / ".kvprefetch-owned.json").rename(wd.parent / "owned.json.aside")
    res = cli("clean", "--workdir", str(wd), "--what", "trees", timeout=120)
    assert res.returncode == 0, res.stderr
    text = res.stdout + res.stderr
    assert "fetch --repair" in text, text
    assert (wd / "trees" / "baseline").is_dir()  # kept, as before
    # and the way it names works: the trees are recorded again, and clean removes them
    res = cli("fetch", "--workdir", str(wd), "--repair", timeout=300)
    assert res.returncode == 0, res.stderr
    res = cli("clean", "--workdir", str(wd), "--what", "trees", timeout=300)
    assert res.returncode == 0, res.stderr
    assert not (wd / "trees" / "baseline").exists(), res.stdout


@pytest.mark.parametrize("where", ["files", "headers"])
@pytest.mark.parametrize("rel", ["../../victim.txt", "/etc/hostname", "../x\x01"])
def test_a_state_records_applied_paths_must_stay_in_its_tree(fetched_workdir: Path,
                                                            where: str, rel: str) -> None:
    wd = fetched_workdir
    state = wd / "state" / "patched.json"
    data = json.loads(state.read_text())
    data["applied"] = {"variant": "prefetch", "patch_sha256": "0" * 64, "headers": {},
                       "files": {}}
    data["applied"][where] = {rel: "0" * 64}
    state.write_text(json.dumps(data))
    res = cli("diff-upstream", "--workdir", str(wd), "--tree", "patched", timeout=120)
    refused(res, 4, str(state), repr(rel), "fetch --repair")


def test_a_linked_manifest_is_refused_before_the_kernels_compile(fetched_workdir: Path,
                                                                  tmp_path: Path) -> None:
    wd = fetched_workdir
    sel = ["--workdir", str(wd), "--mode", "kernels-only", "--trees", "baseline",
           "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes", "fp16"]
    res = cli("build", *sel, "--dry-run", "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    build_dir = Path(json.loads(res.stdout)["trees"][0]["build_dir"])
    build_dir.mkdir(parents=True)
    target = tmp_path / "elsewhere.json"
    (build_dir / "manifest.json").symlink_to(target)
    # before the fix it compiled first (minutes), then refused the link: 120 s cannot pass
    res = cli("build", *sel, timeout=120)
    refused(res, 5, "manifest.json", "a symlink")
    assert not (wd / "envs" / "baseline").exists()  # refused before the environment too
    assert not os.path.lexists(target)


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_compiler_cache_that_is_no_folder_is_refused(tmp_path: Path, kind: str) -> None:
    cache = tmp_path / "ccache"
    if kind == "file":
        cache.write_text("")
    else:
        os.mkfifo(cache)
    with pytest.raises(BuildError) as err:
        refuse_linked_cache(tmp_path)
    assert "not a folder" in err.value.cause and "move" in err.value.fix


def test_slurm_plan_dry_run_refuses_what_the_plan_refuses(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep")
    res = cli("slurm", "plan", str(full), "--dry-run", timeout=120)
    refused(res, 2, "not empty")
    assert sorted(p.name for p in full.iterdir()) == ["mine.txt"]
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user 'nobody' to own the folder")
    if os.geteuid() != 0:
        pytest.skip("only root can give a folder to another user here")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, nobody, -1)
    res = cli("slurm", "plan", str(theirs), "--dry-run", timeout=120)
    refused(res, 2, "belongs to")


def test_a_link_another_user_owns_higher_up_the_path_is_never_followed(tmp_path: Path) -> None:
    """Pass 37 a refused another user's link at the named path; one a folder higher up (or
    met inside a link's target) chose the folder just the same."""
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user 'nobody' to own the link")
    if os.geteuid() != 0:
        pytest.skip("only root can plant a link as another user here")
    sticky, chosen, own = tmp_path / "sticky", tmp_path / "chosen", tmp_path / "own"
    for d in (sticky, chosen, own):
        d.mkdir()
    sticky.chmod(0o1777)
    up = sticky / "up"
    up.symlink_to(chosen)
    os.lchown(up, nobody, -1)
    (tmp_path / "via").symlink_to(sticky)  # the user's own link, before theirs
    for path in (up / "work", tmp_path / "via" / "up" / "work"):
        refused(cli("fetch", "--workdir", str(path), "--dry-run", timeout=60), 2,
                f"{up} is a symlink that belongs to nobody")
        refused(cli("slurm", "plan", str(path.parent / "camp"), "--stand-in", "--no-gpu",
                    timeout=60), 2, "belongs to nobody")
    assert not any(chosen.iterdir())
    (tmp_path / "mine").symlink_to(own)  # a link of the user's own is followed as before
    res = cli("slurm", "plan", str(tmp_path / "mine" / "camp"), "--stand-in", "--no-gpu",
              timeout=120)
    assert res.returncode == 0, res.stderr
    assert (own / "camp" / "campaign.json").is_file()
