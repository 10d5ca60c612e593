"""``fetch``: two (or three) independent, verified working trees of vLLM v0.10.2.

The pristine source is obtained once (a git clone of tag v0.10.2, the hash-pinned sdist, or a
local mirror), checked (tag commit, sdist sha256, pristine attention header sha256), kept
under ``pristine/``, and copied in full into each tree. Trees never share files: two editable
installs that share files are the seed's "wrong .so loads" trap.

Just past the ~500-line mark on purpose: getting the pristine source, verifying it, and copying
it into a tree checked against that verification are one flow under one lock (issue 41, the
tenth hostile pass added the last check)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import tarfile
import time
import urllib.parse
import zlib
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import upstream
from ..errors import ConfigError, FetchError, PatchError
from ..hashing import (
    INVENTORY_RULES,
    PYCACHE,
    differences,
    inventory,
    manifest_digest,
    sha256_file_of_size,
    sha256_or_size,
    source_manifest,
    tree_inventory,
)
from ..oserrors import mapped
from ..runner import absolute_path, others_stopped
from ..workspace import confine, ownership, treetxn
from ..workspace.locks import locked
from ..workspace.workdir import Workdir, check_tree_name
from .download import check_index_url, ensure_sdist, pinned_bytes, url_parts
from .gitpython import clone_fix, repo_env_cleared
from .gitpython import gitpython as _gitpython
from .gitpython import head as _head
from .local_repo import check_local_repo

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
        actual = (sha256_or_size(root / rel, SDIST_FILE_LIMIT) if (root / rel).is_file()
                  else "missing")
        if actual != pinned:
            raise FetchError(
                f"{what}: {rel} has sha256 {actual}, not pristine v0.10.2's {pinned} "
                "(upstream drifted, or the source is modified)",
                "use the v0.10.2 release itself: --source sdist, or a clone at tag v0.10.2")


# No file of the pinned sdist has more bytes (its largest, a PNG, has 991,484), so a larger
# file in a source that must be the sdist in full makes it differ unread: a sparse 15 TB file
# in a --source folder (a campaign's source, which every build job checks) was hashed for hours
# (issue 41, the twentieth hostile pass)
SDIST_FILE_LIMIT = 64 << 20


def check_full_source(root: Path, what: str) -> str:
    """Every file of ``root`` must be the v0.10.2 sdist's, none missing, none added (not only
    the files the patches touch). Returns the source digest."""
    _check_pristine_header(root, what)
    m = source_manifest(root, limit=SDIST_FILE_LIMIT)
    digest = manifest_digest(m)
    if digest != upstream.SDIST_SOURCE_SHA256:
        raise FetchError(
            f"{what} is not the complete vLLM v0.10.2 source: its {len(m)} files (digest "
            f"{digest[:16]}…) differ from the {upstream.SDIST_SOURCE_FILES} files of the "
            f"pinned sdist (digest {upstream.SDIST_SOURCE_SHA256[:16]}…): files are missing, "
            "added or changed, or it is another version",
            "use the v0.10.2 release itself: --source sdist, the unpacked vllm-0.10.2.tar.gz, "
            "or a clone at tag v0.10.2")
    return digest


def _unpack_sdist(wd: Workdir, sdist: Path, dest: Path) -> None:
    """Unpack the verified sdist as the pristine tree ``dest``. tarfile and git write by path,
    so both unpack and clone in a private folder outside the work directory, and the checked
    tree comes in through ``_place_pristine``: unpacked in ``pristine/.sdist.tmp-<pid>``, a
    ``pristine/`` swapped for a link mid-unpack had part of the tree written into the folder
    the link named and left there (issue 41, the fourteenth hostile pass, 5 runs of 8)."""
    data = pinned_bytes(sdist, upstream.SDIST_SIZE, upstream.SDIST_SHA256,
                        f"vLLM {upstream.VLLM_VERSION} sdist", "fetch downloads it again")
    with ownership.private_dir("sdist", outside=wd.root) as private:
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
                tf.extractall(private, filter="data")  # refuses absolute paths, .., devices
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise FetchError(f"unpacking {sdist.name} was refused: {exc}",
                             "delete the download and fetch again") from None
        except OSError as exc:
            if exc.filename:
                raise
            # a write to a descriptor names no file: a full TMPDIR was told to free space in
            # the work directory (issue 41, the thirty-ninth hostile pass)
            raise OSError(exc.errno, exc.strerror, os.path.join(private, "")) from None
        top = private / upstream.SDIST_TOPDIR
        if top.is_symlink() or not top.is_dir():
            raise FetchError(f"{sdist.name} does not contain {upstream.SDIST_TOPDIR}/",
                             "delete the download and fetch again")
        digest = check_full_source(top, f"the sdist {sdist.name}")
        _place_pristine(wd, top, dest, digest=digest)


def _place_pristine(wd: Workdir, src: Path, dest: Path, **record: str) -> None:
    """Copy the checked tree ``src`` (in a private folder) into a recorded temporary beside
    ``dest`` and move it into place, every act from the work directory down (``confine``)."""
    with ownership.temporary(wd.root, dest.with_name(f".{dest.name}.tmp-{os.getpid()}"),
                             family=FetchError) as tmp:
        confine.ensure_dir(dest.parent, root=wd.root, family=FetchError)
        confine.copy_tree(wd.root, src, tmp, family=FetchError)
        _replace_owned(wd, dest)
        ownership.record(wd.root, dest, "pristine", **record)  # before it exists
        confine.move_file(wd.root, tmp, dest, family=FetchError)


def _replace_owned(wd: Workdir, dest: Path) -> None:
    """Make room for a new ``dest``: remove it if the kit made it, else refuse."""
    if not os.path.lexists(dest):
        confine.ensure_dir(dest.parent, root=wd.root, family=FetchError)
        return
    if ownership.owned(wd.root, dest) is None:
        raise FetchError(f"{dest} exists but kvprefetch did not create it",
                         "move it away (kvprefetch never removes what it did not make), "
                         "then rerun")
    ownership.remove(wd.root, dest)


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def check_repo_url(url: str) -> str:
    """Refuse git's command-running transports (``ext::``, ``fd::``, any ``<helper>::``) and
    anything that would be read as an option."""
    if url.startswith("-") or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*::", url):
        raise ConfigError(f"--repo-url {url!r}: refusing a git transport that runs commands or "
                          "an option-like URL",
                          "use an https://, ssh://, git:// or file:// URL, or a local path")
    if not url.isprintable() or any("\udc80" <= c <= "\udcff" for c in url) \
            or url_parts(url) is None:  # an IPv6 host's bracket unpaired: the twenty-eighth
        # bytes that are no UTF-8 (the shell's argument, escaped) came back in git's error
        # message, which GitPython decodes strictly: a UnicodeDecodeError traceback (pass 19)
        raise ConfigError(f"--repo-url {url!a}: not printable UTF-8 text, or not a URL (a '['"
                          " or ']' of an IPv6 host unpaired)", "use an https://, ssh://, git://"
                          " or file:// URL, or a local path, in UTF-8 without control characters")
    return url


def check_allow_commit(sha: str | None) -> str | None:
    if sha is not None and not _COMMIT.match(sha):
        raise ConfigError(f"--allow-commit {sha!r} is not a full 40-digit lowercase commit id "
                          "(a prefix would accept any commit starting with it)",
                          "pass the whole commit id that the refusal message printed")
    return sha


def _clone(wd: Workdir, url: str, dest: Path, allow_commit: str | None) -> str:
    # GitPython's git, no child of ``runner.run``, ended before its folder is removed
    # (``runner.stop_others`` says why); children this process had before are not its
    with ownership.private_dir("clone", outside=wd.root) as private, others_stopped():
        return _clone_into(wd, url, private / "vllm", dest, allow_commit)


def _clone_into(wd: Workdir, url: str, tmp: Path, dest: Path, allow_commit: str | None) -> str:
    """Clone ``url`` at tag v0.10.2 with GitPython; return the verified commit id."""
    git = _gitpython()

    check_repo_url(url)
    local = Path(url).exists() or url.startswith("file://")
    if local:
        check_local_repo(Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)
                              if url.startswith("file://") else url))
    opts = [] if local else ["--depth=1"]
    try:
        with repo_env_cleared():  # a GIT_WORK_TREE of the user's: gitpython.py says why
            repo = git.Repo.clone_from(url, tmp, branch=upstream.GIT_TAG, multi_options=opts,
                                       env={"GIT_TERMINAL_PROMPT": "0",
                                            "PATH": absolute_path(os.environ.get("PATH", ""))})
    except git.GitCommandError as exc:
        raise FetchError(f"git clone of {url} at tag {upstream.GIT_TAG} failed: "
                         f"{(exc.stderr or str(exc)).strip()}",
                         clone_fix(str(exc.stderr or exc))) from exc
    except UnicodeDecodeError as exc:
        # git's messages (a server's "remote:" lines, a path) that are no UTF-8: GitPython
        # decodes them strictly (issue 41, the nineteenth hostile pass)
        raise FetchError(f"git clone of {url} at tag {upstream.GIT_TAG} failed, and git's "
                         f"message is not UTF-8 text ({exc.reason})",
                         "check the URL and the network, or use --source sdist") from exc
    with repo_env_cleared():  # GitPython reads it with git cat-file
        commit = str(repo.head.commit.hexsha)
    if not (commit == allow_commit if allow_commit
            else commit.startswith(upstream.GIT_COMMIT_PREFIX)):
        repo.close()
        raise FetchError(
            f"tag {upstream.GIT_TAG} of {url} is commit {commit}, but vLLM v0.10.2 is "
            f"{upstream.GIT_COMMIT_PREFIX}… (the tag was moved, or this is not vLLM)",
            "clone from the upstream vLLM repository, or, for a mirror that rewrote history "
            "and that you trust, pass --allow-commit " + commit)
    repo.close()
    _check_pristine_header(tmp, f"the clone of {url}")
    digest = manifest_digest(source_manifest(tmp, skip=(".git",)))
    _place_pristine(wd, tmp, dest, digest=digest, commit=commit)
    return commit


def _network_refused(exc: FetchError) -> bool:
    text = exc.cause.lower()
    return any(s in text for s in ("could not resolve", "unable to access", "connection",
                                   "network is unreachable", "timed out", "failed to connect"))


def _prepare_pristine(wd: Workdir, source: str, repo_url: str, index_url: str | None,
                      allow_commit: str | None, notices: list[str], repair: bool = False
                      ) -> tuple[Path, str, str, str | None]:
    """Return (pristine dir, source kind, origin, commit). ``repair``: a pristine copy the
    ownership record does not list is recorded again once it passes the checks it passed when
    it was made (_readopt)."""
    if source not in SOURCES:
        path = Path(source).expanduser()
        if not path.exists():
            raise ConfigError(f"--source {source}: no such file or directory",
                              "use auto, git, sdist, or the path of a vLLM clone, mirror or sdist")
        if path.is_file():
            _check_sdist_file(path)
            dest = wd.pristine / "sdist"
            if not _kept(wd, dest, repair, notices):
                _unpack_sdist(wd, path, dest)
            return dest, "sdist", str(path.resolve()), None
        if (path / ".git").exists():
            dest = wd.pristine / "git"
            if not _kept(wd, dest, repair, notices, allow_commit):
                return dest, "git", str(path.resolve()), _clone(wd, str(path.resolve()), dest,
                                                               allow_commit)
            return dest, "git", str(path.resolve()), _head(dest, wd.root)
        _refuse_no_folder(path)
        check_full_source(path, f"the directory {path}")
        return path.resolve(), "path", str(path.resolve()), None
    if source in ("auto", "git"):
        dest = wd.pristine / "git"
        if _kept(wd, dest, repair, notices, allow_commit):
            return dest, "git", repo_url, _head(dest, wd.root)
        try:
            return dest, "git", repo_url, _clone(wd, repo_url, dest, allow_commit)
        except FetchError as exc:
            if source == "git" or not _network_refused(exc):
                raise
            notices.append(f"git clone of {repo_url} failed (no network?); "
                           "falling back to the hash-pinned PyPI sdist")
    dest = wd.pristine / "sdist"

    def kit_made(p: Path) -> bool:  # in an adopted directory, the user's file is left alone
        return (ownership.owned(wd.root, p) or {}).get("kind") == "download" \
            or not wd.is_adopted()

    had = os.path.lexists(wd.downloads / upstream.SDIST_NAME)
    sdist = ensure_sdist(wd.downloads, index_url, root=wd.root, may_delete=kit_made,
                         partials=not wd.is_adopted())
    if not had:
        ownership.record(wd.root, sdist, "download")
    if not _kept(wd, dest, repair, notices):
        _unpack_sdist(wd, sdist, dest)
    return dest, "sdist", str(sdist), None


def _check_sdist_file(path: Path) -> None:
    # of the sdist's size first, never read otherwise: a sparse 15 TB file named by --source
    # (or by a campaign's plan, which its build jobs fetch from) was hashed for hours (issue
    # 41, the twentieth hostile pass)
    if sha256_file_of_size(path, upstream.SDIST_SIZE) != upstream.SDIST_SHA256:
        raise FetchError(f"{path} is not the vLLM 0.10.2 sdist (sha256 mismatch)",
                         f"use the file with sha256 {upstream.SDIST_SHA256}")


def _refuse_no_folder(path: Path) -> None:
    """A ``--source`` that is neither a regular file nor a folder (a FIFO, a device, a socket)
    is named as what it is: it was "the directory /dev/zero has no csrc/...", a device called
    a folder (issue 41, the twenty-second hostile pass)."""
    from ..workspace.confine import what_is

    if not path.is_dir():
        raise FetchError(f"--source {path} is {what_is(path)}, neither a vLLM sdist file nor "
                         "a folder", "point --source at a vLLM v0.10.2 sdist file, or a clone, "
                         "mirror or unpacked sdist folder")


def _check_local_source(source: str) -> None:
    """A dry run checks a local ``--source`` as the real run does before it unpacks or copies
    it (a clone's tag is checked only by cloning): an empty folder or a file that is no sdist
    was "would-create", exit 0, where the real run stops (exit 3) (issue 41, the twentieth
    hostile pass)."""
    if source in SOURCES:
        return
    path = Path(source).expanduser()
    if path.is_file():
        _check_sdist_file(path)
    elif not (path / ".git").exists():
        _refuse_no_folder(path)
        check_full_source(path, f"the directory {path}")


def _kept(wd: Workdir, dest: Path, repair: bool = False, notices: list[str] | None = None,
          allow_commit: str | None = None) -> bool:
    """Whether a pristine copy the kit made is already there (it is verified before use)."""
    if not (dest / upstream.ATTENTION_HEADER).is_file():
        return False
    if ownership.owned(wd.root, dest) is not None:
        return True
    return repair and _readopt(wd, dest, notices if notices is not None else [], allow_commit)


def _readopt(wd: Workdir, dest: Path, notices: list[str], allow_commit: str | None) -> bool:
    """``fetch --repair`` with the ownership record gone (moved aside, as its "corrupt" error
    says): record the pristine copy again when it is exactly what the kit makes there (the
    pinned sdist's every file, or a clone at the tag's commit with pristine attention files);
    otherwise it stays the user's (issue 41, class 6: --repair stopped at "pristine/sdist
    exists but kvprefetch did not create it"). Never in an adopted directory, where a
    pristine/ the record does not list may be the user's."""
    if wd.is_adopted() or confine.first_symlink(wd.root, dest) is not None:
        return False
    if dest.name == "sdist":
        digest = manifest_digest(source_manifest(dest, limit=SDIST_FILE_LIMIT))
        if digest != upstream.SDIST_SOURCE_SHA256:
            return False
        ownership.record(wd.root, dest, "pristine", digest=digest)
    elif dest.name == "git" and (dest / ".git").is_dir():
        try:
            commit = _head(dest, wd.root)
        except FetchError:
            return False
        if not (commit == allow_commit if allow_commit
                else commit.startswith(upstream.GIT_COMMIT_PREFIX)):
            return False
        try:
            _check_pristine_header(dest, str(dest))
        except FetchError:
            return False
        digest = manifest_digest(source_manifest(dest, skip=(".git",)))
        ownership.record(wd.root, dest, "pristine", digest=digest, commit=commit)
    else:
        return False
    notices.append(f"recorded {dest} again: it is the verified vLLM {upstream.VLLM_VERSION} "
                   "source")
    return True


def verify_pristine(wd: Workdir, pristine: Path, kind: str) -> dict[str, str] | None:
    """Re-check the kept pristine copy against what was verified when it was made, before a
    single file of it is copied into a tree: an edited pristine/ is not pristine. Its manifest
    (None for the user's own directory, checked in full by check_full_source)."""
    if kind == "path":
        return None  # the user's directory: checked in full just before, by check_full_source
    entry = ownership.owned(wd.root, pristine) or {}
    manifest = source_manifest(pristine, skip=(".git",),
                               limit=SDIST_FILE_LIMIT if kind == "sdist" else None)
    digest = manifest_digest(manifest)
    want = upstream.SDIST_SOURCE_SHA256 if kind == "sdist" else entry.get("digest")
    if digest != want:
        raise FetchError(f"the kept pristine copy {pristine} was changed after kvprefetch "
                         f"verified it (digest {digest[:16]}…, expected {str(want)[:16]}…)",
                         f"move {pristine} away (kvprefetch does not remove it for you); the next "
                         "fetch makes a fresh, verified copy")
    return manifest


def tree_modifications(wd: Workdir, name: str) -> list[str]:
    """What differs in tree ``name`` from what kvprefetch recorded (fetch + apply)."""
    tree = wd.tree(name)
    if tree.is_symlink():
        # the inventory follows a link at the tree's own path, so a tree moved elsewhere and
        # linked back read "unchanged" while apply refused it as missing: a loop (issue 41,
        # the fourth hostile pass). The kit never writes through one; say so.
        return [(f"L {tree} is a symlink -> {os.readlink(tree)}, and kvprefetch never writes "
                 "through one (move it away; fetch then makes the tree again)")]
    state = wd.read_state(name)
    if state is None:
        return [f"? {tree} has no state record (`kvprefetch fetch --repair` records it again)"]
    return differences(state["inventory"], tree_inventory(wd.tree(name), state))


def fetch_trees(workdir: Path, *, source: str = "auto", repo_url: str = upstream.DEFAULT_REPO_URL,
                index_url: str | None = None, names: tuple[str, ...] = upstream.TREE_NAMES,
                force: bool = False, dry_run: bool = False,
                allow_commit: str | None = None, adopt: bool = False,
                repair: bool = False) -> FetchResult:
    wd = Workdir(workdir)
    for n in names:
        check_tree_name(n)
    check_allow_commit(allow_commit)
    check_repo_url(repo_url)
    check_index_url(index_url)
    check_source(source)
    if dry_run:
        wd.check_adoptable(adopt)
        _check_local_source(source)

        def planned(n: str) -> str:
            if not wd.tree(n).exists():
                return "would-create"
            if not tree_modifications(wd, n):
                return "unchanged"
            return "would-replace" if force else "refused (local modifications; --force)"
        trees = [TreeResult(n, wd.tree(n), planned(n)) for n in names]
        return FetchResult(workdir, source, repo_url if source in ("auto", "git") else source,
                           None, trees, [], dry_run=True)
    made = _missing_folders(Path(workdir))
    try:
        return _fetch_into(wd, source=source, repo_url=repo_url, index_url=index_url,
                           names=names, force=force, allow_commit=allow_commit, adopt=adopt,
                           repair=repair)
    except BaseException:
        _remove_new_skeleton(wd, made, names)
        raise


def check_source(source: str) -> str:
    """``--source`` before anything is made: one of auto, git, sdist, or an existing path. An
    empty one would be the current directory (``Path("")``), and a refused source must not
    leave a new, tagged ``--workdir`` behind (issue 41, fourth pass)."""
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"--source {source!r} is empty",
                          "use auto, git, sdist, or the path of a vLLM clone, mirror or sdist "
                          "(./ for the current directory)")
    if source not in SOURCES and not os.path.exists(os.path.expanduser(source)):
        raise ConfigError(f"--source {source}: no such file or directory",
                          "use auto, git, sdist, or the path of a vLLM clone, mirror or sdist")
    return source


def _missing_folders(root: Path) -> list[Path]:
    """``root`` and those of its parents that do not exist yet (what ``ensure`` will make),
    deepest first."""
    out = []
    p = Path(os.path.abspath(root))
    while not os.path.lexists(p) and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def _remove_new_skeleton(wd: Workdir, made: list[Path], names: tuple[str, ...]) -> None:
    """After a fetch that failed in a work directory it created (``made``: the folders that did
    not exist before it), remove what it put there before anything else: the tag, the released
    (empty) locks and those folders, if that is all there is. Anything more (a download, a
    pristine copy, a record) is kept: a rerun uses it, ``clean`` removes it."""
    if not made:
        return
    from ..workspace.workdir import TAG_FILE

    def kit_made(path: Path) -> bool:
        if path.is_symlink() or not path.is_file():
            return False
        if path.name == TAG_FILE:
            return path.read_text(errors="replace").startswith("created by")
        return path.stat().st_size == 0  # a lock the kit released

    skeleton = [wd.root / TAG_FILE, wd.lock, *(wd.tree_lock(n) for n in names)]
    try:
        # anything else there (a download, a pristine copy, a record): the directory stays
        # whole, tag included, so that the next fetch takes it as the kit's
        if {p.name for p in wd.root.iterdir()} - {TAG_FILE, wd.lock.name, ".locks"} or (
                (wd.root / ".locks").is_dir() and {p.name for p in (wd.root / ".locks").iterdir()}
                - {p.name for p in skeleton[2:]}) or not all(
                kit_made(p) for p in skeleton if os.path.lexists(p)):
            return
    except OSError:
        return
    for path in skeleton:
        with contextlib.suppress(OSError):
            path.unlink()
    for folder in (wd.root / ".locks", *made):
        with contextlib.suppress(OSError):
            # one another user made as this run began (refused as theirs: foreign.py) is
            # theirs to remove, not the kit's (issue 41, the thirty-sixth hostile pass)
            if os.lstat(folder).st_uid == os.geteuid():
                folder.rmdir()  # only an empty folder goes


def _fetch_into(wd: Workdir, *, source: str, repo_url: str, index_url: str | None,
                names: tuple[str, ...], force: bool, allow_commit: str | None, adopt: bool,
                repair: bool) -> FetchResult:
    workdir = wd.root
    # where: the trees come in through descriptors, so a full disk names a bare file name;
    # its fix said `df -h .`, the caller's folder (issue 41, the twenty-sixth hostile pass)
    with mapped(FetchError, f"fetch into {workdir}", where=workdir):
        wd.ensure(adopt=adopt)
        notices: list[str] = []
        with ExitStack() as stack:
            stack.enter_context(locked(wd.lock, f"the work directory {workdir}"))
            # the same per-tree locks as apply, build and clean: no step interleaves with fetch
            for n in names:
                stack.enter_context(locked(wd.tree_lock(n), f"the tree {n}"))
            for orphan in ownership.remove_orphans(wd.root):
                notices.append(f"removed {orphan}, left by a kvprefetch run that was killed")
            for n in names:
                done = treetxn.recover(wd, n)
                if done:
                    notices.append(done)
            if repair:
                from .repair import repair_states

                pristine, kind, origin, commit = _prepare_pristine(
                    wd, source, repo_url, index_url, allow_commit, notices, repair=True)
                verify_pristine(wd, pristine, kind)
                notices += repair_states(wd, [n for n in names if wd.tree(n).is_dir()],
                                         pristine, kind, origin, commit)
            # Refuse before doing anything if a tree carries changes we did not make.
            dirty = {n: tree_modifications(wd, n) for n in names if os.path.lexists(wd.tree(n))}
            dirty = {n: d for n, d in dirty.items() if d}
            if dirty and not force and not repair:
                lines = [f"  {n}: " + ", ".join(d[:8]) + (" …" if len(d) > 8 else "")
                         for n, d in dirty.items()]
                raise PatchError("these trees have local modifications that kvprefetch did not "
                                 "make:\n" + "\n".join(lines),
                                 "keep your changes elsewhere, or rerun with --force (the old "
                                 "trees are moved to <workdir>/backup/, not deleted)")
            if not repair:
                pristine, kind, origin, commit = _prepare_pristine(
                    wd, source, repo_url, index_url, allow_commit, notices)
            manifest = (verify_pristine(wd, pristine, kind) if any(
                (force and n in dirty) or not os.path.lexists(wd.tree(n)) for n in names) else None)
            results = [_materialise(wd, n, pristine, kind, origin, commit, force and n in dirty,
                                    manifest)
                       for n in names]
    return FetchResult(workdir, kind, origin, commit, results, notices)


def _materialise(wd: Workdir, name: str, pristine: Path, kind: str, origin: str,
                 commit: str | None, replace: bool,
                 manifest: dict[str, str] | None = None) -> TreeResult:
    dest = wd.tree(name)
    backup = None
    if os.path.lexists(dest) and not replace:
        return TreeResult(name, dest, "unchanged")
    sp = wd.state_file(name)
    # adoption: the kit never overwrites, moves or deletes what it did not create
    for path, want in ((dest, "tree"), (sp, "state")):
        if os.path.lexists(path) and (ownership.owned(wd.root, path) or {}).get("kind") != want:
            raise FetchError(f"{path} exists but kvprefetch did not create it; it is left as it "
                             "is (kvprefetch never overwrites, moves or deletes what it did not "
                             "make)",
                             f"move {path} away, then rerun (or, for a tree the kit made before "
                             "it kept a record, `kvprefetch fetch --repair` records it again)")
    if os.path.lexists(dest):
        backup = wd.root / "backup" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        confine.ensure_dir(backup.parent, root=wd.root, family=FetchError)
        confine.check_target(wd.root, dest, what="move", family=FetchError)
        if os.path.lexists(backup):
            raise FetchError(f"{backup} is in the way", "move it away, then rerun")
        confine.move_file(wd.root, dest, backup, family=FetchError)
        ownership.record(wd.root, backup, "backup", tree=name)
        ownership.forget(wd.root, dest)
    with ownership.temporary(wd.root, dest.with_name(f".{name}.tmp-{os.getpid()}"),
                             family=FetchError) as tmp:
        # Python's bytecode cache is left out (the sdist ships one): the inventory skips
        # __pycache__ because the kit never puts one into a tree (hashing.PYCACHE)
        # relative to folders opened O_NOFOLLOW from the work directory down: a temporary
        # swapped for a symlink while it is filled gets nothing written behind the link
        confine.copy_tree(wd.root, pristine, tmp, skip=frozenset({PYCACHE}), family=FetchError)
        inv = inventory(tmp)
        # only what the verified copy held: a folder of it swapped for a link while it was
        # listed put the link into the tree, recorded as pristine (issue 41, tenth pass)
        extra = [k for k, v in inv.items() if manifest is not None and manifest.get(k) != v]
        if extra:
            raise FetchError(f"the copy of {pristine} differs from the verified pristine copy "
                             f"in {', '.join(extra[:4])}{' …' if len(extra) > 4 else ''}: "
                             "another process changed it while it was copied; nothing was "
                             "put in place", "stop whatever else writes there, then rerun")
        state: dict[str, Any] = {
            "tree": name, "source": kind, "origin": origin, "commit": commit,
            "vllm_version": upstream.VLLM_VERSION, "applied": None, "inventory": inv,
            "inventory_rules": INVENTORY_RULES,
        }
        # The state is written before the rename: a crash in between leaves a state without a
        # tree, which the next fetch simply recreates.
        ownership.record(wd.root, sp, "state")
        ownership.write_record(wd.root, sp, state)
        confine.ensure_dir(dest.parent, root=wd.root, family=FetchError)
        ownership.record(wd.root, dest, "tree", digest=ownership.inventory_digest(inv))
        confine.move_file(wd.root, tmp, dest, family=FetchError)
    return TreeResult(name, dest, "replaced" if backup else "created", backup)
