"""``fetch``: two (or three) independent, verified working trees of vLLM v0.10.2.

The pristine source is obtained once (a git clone of tag v0.10.2, the hash-pinned sdist, or a
local mirror), checked (tag commit, sdist sha256, pristine attention header sha256), kept
under ``pristine/``, and copied in full into each tree. Trees never share files: two editable
installs that share files are the seed's "wrong .so loads" trap."""

from __future__ import annotations

import os
import shutil
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import upstream
from .download import ensure_sdist
from .errors import ConfigError, FetchError, PatchError
from .hashing import differences, inventory, sha256_file
from .locks import locked
from .workdir import Workdir, write_json_atomic

SOURCES = ("auto", "git", "sdist")


@dataclass(frozen=True)
class TreeResult:
    name: str
    path: Path
    action: str  # created | unchanged | replaced | would-create | would-replace
    backup: Path | None = None


@dataclass(frozen=True)
class FetchResult:
    workdir: Path
    source: str
    origin: str
    commit: str | None
    trees: list[TreeResult]
    notices: list[str] = field(default_factory=list)
    dry_run: bool = False


def _check_pristine_header(root: Path, what: str) -> None:
    """Every file the patches touch must be byte-identical to the v0.10.2 release."""
    if not (root / upstream.ATTENTION_HEADER).is_file():
        raise FetchError(f"{what} has no {upstream.ATTENTION_HEADER}; it is not a vLLM source tree",
                         "point --source at a vLLM v0.10.2 clone, mirror or unpacked sdist")
    for rel, pinned in upstream.PRISTINE_SHA256.items():
        actual = sha256_file(root / rel) if (root / rel).is_file() else "missing"
        if actual != pinned:
            raise FetchError(
                f"{what}: {rel} has sha256 {actual}, not pristine v0.10.2's {pinned} "
                "(upstream drifted, or the source is modified)",
                "use the v0.10.2 release itself: --source sdist, or a clone at tag v0.10.2")


def _unpack_sdist(sdist: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as tf:
        tf.extractall(tmp, filter="data")  # refuses absolute paths, .., device files
    top = tmp / upstream.SDIST_TOPDIR
    if not top.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        raise FetchError(f"{sdist.name} does not contain {upstream.SDIST_TOPDIR}/",
                         "delete the download and fetch again")
    _check_pristine_header(top, f"the sdist {sdist.name}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(top, dest)
    shutil.rmtree(tmp, ignore_errors=True)


def _clone(url: str, dest: Path, allow_commit: str | None) -> str:
    """Clone ``url`` at tag v0.10.2 with GitPython; return the verified commit id."""
    import git  # GitPython; imported here so --help never needs it

    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    local = Path(url).exists() or url.startswith("file://")
    opts = [] if local else ["--depth=1"]
    try:
        repo = git.Repo.clone_from(url, tmp, branch=upstream.GIT_TAG, multi_options=opts,
                                   env={"GIT_TERMINAL_PROMPT": "0"})
    except git.GitCommandError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise FetchError(f"git clone of {url} at tag {upstream.GIT_TAG} failed: "
                         f"{(exc.stderr or str(exc)).strip()}",
                         "check the URL and the network, or use --source sdist") from exc
    commit = repo.head.commit.hexsha
    expected = allow_commit or upstream.GIT_COMMIT_PREFIX
    if not commit.startswith(expected):
        shutil.rmtree(tmp, ignore_errors=True)
        raise FetchError(
            f"tag {upstream.GIT_TAG} of {url} is commit {commit}, but vLLM v0.10.2 is "
            f"{upstream.GIT_COMMIT_PREFIX}… (the tag was moved, or this is not vLLM)",
            "clone from the upstream vLLM repository, or, for a mirror that rewrote history "
            "and that you trust, pass --allow-commit " + commit)
    repo.close()
    _check_pristine_header(tmp, f"the clone of {url}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, dest)
    return commit


def _network_refused(exc: FetchError) -> bool:
    text = exc.cause.lower()
    return any(s in text for s in ("could not resolve", "unable to access", "connection",
                                   "network is unreachable", "timed out", "failed to connect"))


def _prepare_pristine(wd: Workdir, source: str, repo_url: str, index_url: str | None,
                      allow_commit: str | None, notices: list[str]) -> tuple[Path, str, str, str | None]:
    """Return (pristine dir, source kind, origin, commit)."""
    if source not in SOURCES:
        path = Path(source).expanduser()
        if not path.exists():
            raise ConfigError(f"--source {source}: no such file or directory",
                              "use auto, git, sdist, or the path of a vLLM clone, mirror or sdist")
        if path.is_file():
            if sha256_file(path) != upstream.SDIST_SHA256:
                raise FetchError(f"{path} is not the vLLM 0.10.2 sdist (sha256 mismatch)",
                                 f"use the file with sha256 {upstream.SDIST_SHA256}")
            dest = wd.pristine / "sdist"
            if not (dest / upstream.ATTENTION_HEADER).is_file():
                _unpack_sdist(path, dest)
            return dest, "sdist", str(path.resolve()), None
        if (path / ".git").exists():
            dest = wd.pristine / "git"
            if not (dest / ".git").is_dir():
                return dest, "git", str(path.resolve()), _clone(str(path.resolve()), dest, allow_commit)
            return dest, "git", str(path.resolve()), _head(dest)
        _check_pristine_header(path, f"the directory {path}")
        return path.resolve(), "path", str(path.resolve()), None
    if source in ("auto", "git"):
        dest = wd.pristine / "git"
        if (dest / ".git").is_dir():
            return dest, "git", repo_url, _head(dest)
        try:
            return dest, "git", repo_url, _clone(repo_url, dest, allow_commit)
        except FetchError as exc:
            if source == "git" or not _network_refused(exc):
                raise
            notices.append(f"git clone of {repo_url} failed (no network?); "
                           "falling back to the hash-pinned PyPI sdist")
    dest = wd.pristine / "sdist"
    sdist = ensure_sdist(wd.downloads, index_url)
    if not (dest / upstream.ATTENTION_HEADER).is_file():
        _unpack_sdist(sdist, dest)
    else:
        _check_pristine_header(dest, f"the unpacked sdist in {dest}")
    return dest, "sdist", str(sdist), None


def _head(repo_dir: Path) -> str:
    import git

    with git.Repo(repo_dir) as repo:
        return repo.head.commit.hexsha


def tree_modifications(wd: Workdir, name: str) -> list[str]:
    """What differs in tree ``name`` from what kvprefetch recorded (fetch + apply)."""
    state = wd.read_state(name)
    if state is None:
        return [f"? {wd.tree(name)} was not made by kvprefetch (no state record)"]
    return differences(state["inventory"], inventory(wd.tree(name)))


def fetch_trees(workdir: Path, *, source: str = "auto", repo_url: str = upstream.DEFAULT_REPO_URL,
                index_url: str | None = None, names: tuple[str, ...] = upstream.TREE_NAMES,
                force: bool = False, dry_run: bool = False,
                allow_commit: str | None = None) -> FetchResult:
    wd = Workdir(workdir)
    if dry_run:
        def planned(n: str) -> str:
            if not wd.tree(n).exists():
                return "would-create"
            if not tree_modifications(wd, n):
                return "unchanged"
            return "would-replace" if force else "refused (local modifications; --force)"
        trees = [TreeResult(n, wd.tree(n), planned(n)) for n in names]
        return FetchResult(workdir, source, repo_url if source in ("auto", "git") else source,
                           None, trees, [], dry_run=True)
    wd.ensure()
    notices: list[str] = []
    with locked(wd.lock, f"the work directory {workdir}"):
        # Refuse before doing anything if a tree carries changes we did not make.
        dirty = {n: tree_modifications(wd, n) for n in names if wd.tree(n).exists()}
        dirty = {n: d for n, d in dirty.items() if d}
        if dirty and not force:
            lines = [f"  {n}: " + ", ".join(d[:8]) + (" …" if len(d) > 8 else "")
                     for n, d in dirty.items()]
            raise PatchError("these trees have local modifications that kvprefetch did not "
                             "make:\n" + "\n".join(lines),
                             "keep your changes elsewhere, or rerun with --force (the old trees "
                             "are moved to <workdir>/backup/, not deleted)")
        pristine, kind, origin, commit = _prepare_pristine(wd, source, repo_url, index_url,
                                                           allow_commit, notices)
        results = []
        for n in names:
            results.append(_materialise(wd, n, pristine, kind, origin, commit, n in dirty))
    return FetchResult(workdir, kind, origin, commit, results, notices)


def _materialise(wd: Workdir, name: str, pristine: Path, kind: str, origin: str,
                 commit: str | None, replace: bool) -> TreeResult:
    dest = wd.tree(name)
    backup = None
    if dest.exists() and not replace:
        return TreeResult(name, dest, "unchanged")
    if dest.exists():
        backup = wd.root / "backup" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        backup.parent.mkdir(parents=True, exist_ok=True)
        os.rename(dest, backup)
    tmp = dest.with_name(f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(pristine, tmp, symlinks=True)
    state: dict[str, Any] = {
        "tree": name, "source": kind, "origin": origin, "commit": commit,
        "vllm_version": upstream.VLLM_VERSION, "applied": None,
        "inventory": inventory(tmp),
    }
    # The state is written before the rename: a crash in between leaves a state without a
    # tree, which the next fetch simply recreates.
    write_json_atomic(wd.state_file(name), state)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, dest)
    return TreeResult(name, dest, "replaced" if backup else "created", backup)
