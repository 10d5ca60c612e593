"""`kvprefetch fetch` with real sources: the hash-pinned PyPI sdist (downloaded once per test
run, see the ``vllm_sdist`` fixture), a real git clone through GitPython of a local repository
made from that sdist and tagged v0.10.2, the ``auto`` fallback, idempotence, and refusing to
overwrite local modifications."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvprefetch import upstream
from kvprefetch.errors import FetchError
from kvprefetch.hashing import inventory, sha256_file
from kvprefetch.sources.download import configured_index_url, ensure_sdist
from kvprefetch.sources.fetch import fetch_trees, tree_modifications
from kvprefetch.workspace.workdir import Workdir
from tests.integration.helpers import kvprefetch_cli_split, seed_downloads, tree_bytes

SDIST_TREES = ("baseline", "patched")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env.update(extra)
    return env


# --------------------------------------------------------------------------- the sdist


def test_cached_sdist_is_the_pinned_release(vllm_sdist: Path) -> None:
    assert vllm_sdist.name == "vllm-0.10.2.tar.gz"
    assert vllm_sdist.stat().st_size == upstream.SDIST_SIZE
    assert sha256_file(vllm_sdist) == upstream.SDIST_SHA256


def test_sdist_fetch_verifies_and_unpacks_two_independent_trees(fetched_template: Path) -> None:
    wd = Workdir(fetched_template)
    pristine = fetched_template / "pristine" / "sdist"
    assert sha256_file(pristine / upstream.ATTENTION_HEADER) == upstream.ATTENTION_HEADER_SHA256
    assert (pristine / upstream.PAGED_ATTENTION_SOURCES[0]).is_file()
    assert (fetched_template / ".kvprefetch-workdir").is_file()
    ref = inventory(pristine)
    assert len(ref) > 1000  # the whole sdist, not just csrc/
    for name in ("baseline", "patched"):
        tree = wd.tree(name)
        assert inventory(tree) == ref
        state = wd.read_state(name)
        assert state is not None
        assert state["source"] == "sdist" and state["applied"] is None
        assert state["vllm_version"] == "0.10.2"
        assert tree_modifications(wd, name) == []
    # each tree is its own copy: no file shares an inode with the other tree or the pristine copy
    rel = upstream.ATTENTION_HEADER
    inodes = {(wd.tree(n) / rel).stat().st_ino for n in ("baseline", "patched")}
    inodes.add((pristine / rel).stat().st_ino)
    assert len(inodes) == 3
    for dirpath, _, files in os.walk(wd.tree("patched")):
        for f in files:
            p = Path(dirpath, f)
            assert p.is_symlink() or p.stat().st_nlink == 1, p


def test_fetch_source_sdist_through_the_cli_json(tmp_path: Path, vllm_sdist: Path) -> None:
    work = tmp_path / "work"
    seed_downloads(work, vllm_sdist)
    res = kvprefetch_cli_split("fetch", "--workdir", str(work), "--source", "sdist", "--json",
                               env=_env())
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["source"] == "sdist" and data["commit"] is None and data["dry_run"] is False
    assert data["origin"] == str(work / "downloads" / "vllm-0.10.2.tar.gz")
    assert [(t["name"], t["action"]) for t in data["trees"]] == [("baseline", "created"),
                                                                 ("patched", "created")]
    assert data["notices"] == []


def test_tampered_sdist_is_refused_deleted_and_never_unpacked(tmp_path: Path,
                                                              vllm_sdist: Path) -> None:
    work = tmp_path / "work"
    seed_downloads(work, vllm_sdist)
    target = work / "downloads" / vllm_sdist.name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01  # one byte changed
    target.write_bytes(bytes(data))
    res = kvprefetch_cli_split("fetch", "--workdir", str(work), "--source", "sdist", env=_env())
    assert res.returncode == FetchError.exit_code
    assert "has sha256" in res.stderr and upstream.SDIST_SHA256 in res.stderr
    assert "To fix:" in res.stderr
    assert not target.exists()  # deleted
    assert not (work / "pristine").exists() and not (work / "trees").exists()
    assert not (work / "state").exists()
    assert sorted(p.name for p in (work / "downloads").iterdir()) == []


def test_tampered_local_sdist_path_is_refused(tmp_path: Path, vllm_sdist: Path) -> None:
    bad = tmp_path / "vllm-0.10.2.tar.gz"
    data = bytearray(vllm_sdist.read_bytes())
    data[-100] ^= 0xFF
    bad.write_bytes(bytes(data))
    res = kvprefetch_cli_split("fetch", "--workdir", str(tmp_path / "work"), "--source", str(bad),
                               env=_env())
    assert res.returncode == FetchError.exit_code
    assert "sha256 mismatch" in res.stderr and "To fix:" in res.stderr
    assert not (tmp_path / "work" / "trees").exists()


# A local PEP 503 "simple" index, which is what a pip mirror serves: the real download path of
# ensure_sdist (locate, download, hash check, atomic rename) run against it. The real PyPI is
# used by the ``vllm_sdist`` fixture when its cache is empty; a local index is the only way to
# make an index serve a tampered file.


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def local_index(tmp_path: Path, vllm_sdist: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "index"
    (root / "simple" / "vllm").mkdir(parents=True)
    (root / "files").mkdir()
    shutil.copyfile(vllm_sdist, root / "files" / vllm_sdist.name)
    (root / "simple" / "vllm" / "index.html").write_text(
        "<html><body>\n"
        f'<a href="../../files/{vllm_sdist.name}#sha256={upstream.SDIST_SHA256}">'
        f"{vllm_sdist.name}</a>\n</body></html>\n")

    def handler(*args: object, **kw: object) -> _Quiet:
        return _Quiet(*args, directory=str(root), **kw)  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/", root
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_download_from_an_index_is_hash_checked(tmp_path: Path,
                                                local_index: tuple[str, Path]) -> None:
    url, _ = local_index
    got = ensure_sdist(tmp_path / "dl", url)
    assert got == tmp_path / "dl" / upstream.SDIST_NAME
    assert sha256_file(got) == upstream.SDIST_SHA256
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == [upstream.SDIST_NAME]
    # cached: a second call does not download (the server's copy can vanish)
    shutil.rmtree(local_index[1] / "files")
    assert ensure_sdist(tmp_path / "dl", url) == got


def test_tampered_download_is_refused_and_nothing_is_left(tmp_path: Path,
                                                          local_index: tuple[str, Path]) -> None:
    url, root = local_index
    served = root / "files" / upstream.SDIST_NAME
    data = bytearray(served.read_bytes())
    data[12345] ^= 0x10
    served.write_bytes(bytes(data))
    with pytest.raises(FetchError) as exc:
        ensure_sdist(tmp_path / "dl", url)
    assert "deleted and nothing was unpacked" in exc.value.cause
    assert list((tmp_path / "dl").iterdir()) == []  # no temp file, no target


def test_index_advertising_another_hash_is_refused_before_download(
        tmp_path: Path, local_index: tuple[str, Path]) -> None:
    url, root = local_index
    page = root / "simple" / "vllm" / "index.html"
    page.write_text(page.read_text().replace(upstream.SDIST_SHA256, "0" * 64))
    with pytest.raises(FetchError) as exc:
        ensure_sdist(tmp_path / "dl", url)
    assert "advertises sha256 " + "0" * 64 in exc.value.cause
    assert not (tmp_path / "dl").exists()


def test_pip_index_url_is_honoured() -> None:
    assert configured_index_url({"PIP_INDEX_URL": "https://mirror.example/simple/",
                                 "PATH": os.environ.get("PATH", "")}) == \
        "https://mirror.example/simple"


def test_fetch_uses_the_configured_index(tmp_path: Path, local_index: tuple[str, Path]) -> None:
    url, _ = local_index
    res = kvprefetch_cli_split("fetch", "--workdir", str(tmp_path / "work"), "--source", "sdist",
                               "--json", env=_env(PIP_INDEX_URL=url))
    assert res.returncode == 0, res.stderr
    assert (sha256_file(tmp_path / "work" / "downloads" / upstream.SDIST_NAME)
            == upstream.SDIST_SHA256)


# --------------------------------------------------------------------------- git


def test_git_clone_of_a_foreign_tag_commit_is_refused_then_allowed(
        tmp_path: Path, vllm_git_repo: tuple[Path, str]) -> None:
    repo, sha = vllm_git_repo
    assert not sha.startswith(upstream.GIT_COMMIT_PREFIX)
    work = tmp_path / "work"
    res = kvprefetch_cli_split("fetch", "--workdir", str(work), "--source", "git",
                               "--repo-url", str(repo), env=_env())
    assert res.returncode == FetchError.exit_code
    assert f"tag v0.10.2 of {repo} is commit {sha}" in res.stderr
    assert upstream.GIT_COMMIT_PREFIX in res.stderr
    assert "To fix: " in res.stderr and f"--allow-commit {sha}" in res.stderr
    assert not (work / "trees").exists()
    assert not (work / "pristine" / "git").exists()
    assert not list(work.glob("pristine/.*tmp*"))  # the refused clone was removed

    res = kvprefetch_cli_split("fetch", "--workdir", str(work), "--source", "git",
                               "--repo-url", str(repo), "--allow-commit", sha, "--json", env=_env())
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["source"] == "git" and data["commit"] == sha and data["origin"] == str(repo)
    assert [t["action"] for t in data["trees"]] == ["created", "created"]
    wd = Workdir(work)
    import git

    with git.Repo(work / "pristine" / "git") as clone:  # a real clone, at the tag
        assert clone.head.commit.hexsha == sha
        assert [t.name for t in clone.tags] == ["v0.10.2"]
    for name in SDIST_TREES:
        assert (sha256_file(wd.tree(name) / upstream.ATTENTION_HEADER)
                == upstream.ATTENTION_HEADER_SHA256)
        state = wd.read_state(name)
        assert state is not None and state["source"] == "git" and state["commit"] == sha
        assert tree_modifications(wd, name) == []


def test_source_path_of_a_local_clone(tmp_path: Path, vllm_git_repo: tuple[Path, str]) -> None:
    repo, sha = vllm_git_repo
    res = fetch_trees(tmp_path / "work", source=str(repo), allow_commit=sha)
    assert res.source == "git" and res.commit == sha
    assert [t.action for t in res.trees] == ["created", "created"]


def test_auto_falls_back_to_the_sdist_when_git_cannot_reach_the_network(
        tmp_path: Path, vllm_sdist: Path) -> None:
    work = tmp_path / "work"
    seed_downloads(work, vllm_sdist)
    url = "https://github.invalid/vllm.git"  # .invalid never resolves (RFC 6761)
    res = kvprefetch_cli_split("fetch", "--workdir", str(work), "--repo-url", url, "--json",
                               env=_env())
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["source"] == "sdist"
    expected = (f"notice: git clone of {url} failed (no network?); falling back to the "
                "hash-pinned PyPI sdist")
    notices = [ln for ln in res.stderr.splitlines() if ln.startswith("notice:")]
    assert notices == [expected]
    assert data["notices"] == [expected.removeprefix("notice: ")]
    assert not (work / "pristine" / "git").exists()


def test_source_git_does_not_fall_back(tmp_path: Path, vllm_sdist: Path) -> None:
    work = tmp_path / "work"
    seed_downloads(work, vllm_sdist)
    res = kvprefetch_cli_split("fetch", "--workdir", str(work), "--source", "git",
                               "--repo-url", "https://github.invalid/vllm.git", env=_env())
    assert res.returncode == FetchError.exit_code
    assert "Could not resolve host" in res.stderr and "To fix:" in res.stderr
    assert not (work / "trees").exists()


# --------------------------------------------------------------------------- idempotence, --force


def test_refetch_is_idempotent(fetched_workdir: Path) -> None:
    before = tree_bytes(fetched_workdir)
    res = kvprefetch_cli_split("fetch", "--workdir", str(fetched_workdir), "--source", "sdist",
                               "--json", env=_env())
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [(t["name"], t["action"]) for t in data["trees"]] == [
        ("baseline", "unchanged"), ("patched", "unchanged")]
    assert tree_bytes(fetched_workdir) == before


def test_local_modification_is_refused_without_force(fetched_workdir: Path) -> None:
    edited = fetched_workdir / "trees" / "baseline" / "vllm" / "envs.py"
    edited.write_text(edited.read_text() + "# my local experiment\n")
    (fetched_workdir / "trees" / "patched" / "setup.py").unlink()
    (fetched_workdir / "trees" / "patched" / "csrc" / "mine.cu").write_text("// mine\n")
    before = tree_bytes(fetched_workdir)
    res = kvprefetch_cli_split("fetch", "--workdir", str(fetched_workdir), "--source", "sdist",
                               env=_env())
    assert res.returncode == 4
    assert "baseline: M vllm/envs.py" in res.stderr
    assert "patched: D setup.py, A csrc/mine.cu" in res.stderr
    assert "To fix:" in res.stderr and "--force" in res.stderr
    assert tree_bytes(fetched_workdir) == before  # byte-identical, state included


def test_force_moves_the_modified_tree_to_backup(fetched_workdir: Path) -> None:
    edited_rel = "vllm/envs.py"
    edited = fetched_workdir / "trees" / "baseline" / edited_rel
    edited.write_text(edited.read_text() + "# my local experiment\n")
    (fetched_workdir / "trees" / "baseline" / "notes.txt").write_text("mine\n")
    old = tree_bytes(fetched_workdir / "trees" / "baseline")
    patched_before = tree_bytes(fetched_workdir / "trees" / "patched")
    res = kvprefetch_cli_split("fetch", "--workdir", str(fetched_workdir), "--source", "sdist",
                               "--force", "--json", env=_env())
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    by = {t["name"]: t for t in data["trees"]}
    assert by["baseline"]["action"] == "replaced" and by["patched"]["action"] == "unchanged"
    backup = Path(by["baseline"]["backup"])
    assert backup.parent == fetched_workdir / "backup"
    assert tree_bytes(backup) == old  # nothing lost
    wd = Workdir(fetched_workdir)
    assert tree_modifications(wd, "baseline") == []
    assert not (wd.tree("baseline") / "notes.txt").exists()
    assert tree_bytes(fetched_workdir / "trees" / "patched") == patched_before


def test_fetch_dry_run_json_changes_nothing(tmp_path: Path, fetched_workdir: Path) -> None:
    empty = tmp_path / "empty"
    res = kvprefetch_cli_split("fetch", "--workdir", str(empty), "--dry-run", "--json", env=_env())
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["dry_run"] is True
    assert [(t["name"], t["action"]) for t in data["trees"]] == [("baseline", "would-create"),
                                                                 ("patched", "would-create")]
    assert not empty.exists()
    before = tree_bytes(fetched_workdir)
    res = kvprefetch_cli_split("fetch", "--workdir", str(fetched_workdir), "--dry-run", "--json",
                               env=_env())
    data = json.loads(res.stdout)
    assert [t["action"] for t in data["trees"]] == ["unchanged", "unchanged"]
    assert tree_bytes(fetched_workdir) == before


def test_source_directory_with_a_modified_header_is_refused(tmp_path: Path,
                                                            fetched_template: Path) -> None:
    mirror = tmp_path / "mirror"
    shutil.copytree(fetched_template / "pristine" / "sdist", mirror)
    header = mirror / upstream.ATTENTION_HEADER
    header.write_text(header.read_text().replace("\n", " \n", 1))  # one trailing space
    with pytest.raises(FetchError) as exc:
        fetch_trees(tmp_path / "work", source=str(mirror))
    assert "not pristine v0.10.2" in exc.value.cause
    assert not (tmp_path / "work" / "trees").exists()


def test_dry_run_reports_what_force_would_replace(fetched_workdir: Path) -> None:
    """`fetch --dry-run --force` must say which trees the real run would replace (the result
    type documents a "would-replace" action), not "unchanged"."""
    edited = fetched_workdir / "trees" / "baseline" / "setup.py"
    edited.write_text(edited.read_text() + "# local\n")
    before = tree_bytes(fetched_workdir)
    res = kvprefetch_cli_split("fetch", "--workdir", str(fetched_workdir), "--source", "sdist",
                               "--dry-run", "--force", "--json", env=_env())
    assert res.returncode == 0, res.stderr
    actions = {t["name"]: t["action"] for t in json.loads(res.stdout)["trees"]}
    assert tree_bytes(fetched_workdir) == before
    assert actions == {"baseline": "would-replace", "patched": "unchanged"}
