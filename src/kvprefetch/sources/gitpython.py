"""GitPython for ``fetch``'s clone of tag v0.10.2, and the environment the git it runs sees.

GitPython hands git this process's whole environment (``os.environ``, then its own names),
with no way to leave a name out. So a ``GIT_WORK_TREE`` of the user's (a dotfiles setup's
``$HOME``) had ``fetch --source DIR`` check vLLM's 3,436 files out into that folder, outside
the work directory, over any of the user's files of the same names, and a ``GIT_INDEX_FILE``
had git write its index there (issue 41, the twenty-eighth hostile pass); a
``GIT_OBJECT_DIRECTORY`` made the clone fail as "check the URL and the network". The names
that say where a repository, its work tree, index and objects are (git's own
``git rev-parse --local-env-vars``, less the user's configuration ``GIT_CONFIG_*``) are left
out of ``os.environ`` while GitPython runs (``repo_env_cleared``); ``git apply`` gets no
``GIT_*`` name at all (``patching``). The network's (``GIT_SSH_COMMAND``, a proxy) stay."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FetchError
from ..gitenv import REPO_ENV
from ..oserrors import child_limit_fix, process_limit


@contextmanager
def repo_env_cleared() -> Iterator[None]:
    """``os.environ`` without ``REPO_ENV``'s names for the block, as it was after it."""
    kept = {name: os.environ.pop(name) for name in REPO_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(kept)


def gitpython() -> Any:
    """GitPython (imported here so --help never needs it), its ``git`` the absolute path this
    process's PATH names from its own folder (``runner.which``). GitPython runs a bare ``git``
    in the repository it reads, so a relative PATH entry (an empty one: ``PATH=:$PATH``, or
    ``.``) was looked up there: a ``git`` planted in ``pristine/git/`` of the work directory ran
    on every ``fetch`` of it, as ``git cat-file`` (issue 41, the twenty-fifth hostile pass; the
    seventh pass's rule for ``git apply``). A ``GIT_PYTHON_GIT_EXECUTABLE`` of the user's is
    kept, made absolute the same way. GitPython's import runs ``git version`` itself, by the
    name in ``GIT_PYTHON_GIT_EXECUTABLE`` or a bare ``git``, in the caller's folder: it is
    given the absolute path for that run too (the twenty-sixth pass: with ``PATH=:$PATH``, ``cd
    W`` and a ``git`` planted there, the import ran it before the refresh)."""
    from ..runner import which

    named = os.environ.get("GIT_PYTHON_GIT_EXECUTABLE")
    where = (f"GIT_PYTHON_GIT_EXECUTABLE={named!r}" if named
             else "git on PATH (its absolute entries: a relative one names the current "
                  "folder, which kvprefetch never runs programs from)")
    fix = ("point GIT_PYTHON_GIT_EXECUTABLE at git, or unset it" if named
           else "install git or put its folder on PATH") + ", or use --source sdist"
    exe = which(named or "git")
    if exe is None:
        raise ConfigError(f"{where} was not found", fix)
    os.environ["GIT_PYTHON_GIT_EXECUTABLE"] = exe
    try:
        import git
    except ImportError as exc:
        if "Failed to initialize" not in str(exc):
            raise
        if os.strerror(errno.EAGAIN) in str(exc):  # its `git version` not forked: `ulimit -u`
            raise ConfigError(f"cannot start {exe}: {exc}", process_limit()) from None
        raise ConfigError(f"{where} ({exe}) is not a working git: {exc}",
                          _CONFIG_FIX if _config_broken(str(exc)) else fix) from None
    finally:
        if named is None:
            del os.environ["GIT_PYTHON_GIT_EXECUTABLE"]
        else:
            os.environ["GIT_PYTHON_GIT_EXECUTABLE"] = named
    if exe != git.Git.GIT_PYTHON_GIT_EXECUTABLE:
        git.refresh(exe)
    return git


# A ref name the kit's clone can hold (git check-ref-format's rules, narrowed): below refs/,
# no part that starts with a dot or ends in .lock, no "..", no control or special character.
_REF_NAME = re.compile(r"refs(/(?!\.)[A-Za-z0-9._+@-]+(?<!\.lock))+")
_HEXSHA = re.compile(r"[0-9a-f]{40}")
_REF_BYTES = 4096  # a loose ref or HEAD: a line
_PACKED_REFS_BYTES = 64 << 20  # packed-refs: a line a ref (vLLM's tags and branches: < 1 MiB)


def head(repo_dir: Path, root: Path | None = None) -> str:
    """The commit id of ``repo_dir``'s HEAD, never another repository's (``REPO_ENV``), read
    from its refs (``.git/HEAD``, ``refs/``, ``packed-refs``) by the kit itself, with no git
    run. ``repo_dir`` is the work directory's ``pristine/git``, whose ``.git`` is data like
    every file there: ``repo.head.commit`` ran ``git cat-file``, and a config that made the
    clone a partial one (``extensions.partialClone``, ``remote.<name>.promisor``) with HEAD
    naming a missing commit had git fetch it lazily, running the program that config's
    ``remote.<name>.uploadpack`` names, as the user, on every plain ``fetch`` (issue 41, the
    forty-second hostile pass). GitPython's own reader (``dereference_recursive``) was no
    better for data: a ref that is a FIFO blocked ``fetch`` for ever, a huge or endless one
    (``/dev/zero`` by a link in ``packed-refs``' place) was read whole, a ``packed-refs`` of
    an unknown kind raised a TypeError blamed on the git module, and ``.git`` as a file
    (``gitdir:``) or a ``commondir`` had refs read from any folder (the forty-third pass). Each
    file is read inside ``.git`` (``confine.read_file``: no link followed, no FIFO or device
    read, a size limit), a symbolic ref five deep at most, as git does; from the work
    directory ``root`` down (``pristine`` linked to a folder outside had HEAD read there)."""
    from ..workspace.confine import read_file

    git_dir = repo_dir / ".git"
    fix = f"move {repo_dir} out of the work directory (fetch clones again), then rerun"

    def refuse(why: str, how: str | None = None) -> FetchError:
        return FetchError(f"the HEAD of the clone {repo_dir} cannot be read ({why})", how or fix)

    def read(rel: str, limit: int) -> str | None:
        try:
            data = read_file(root or repo_dir, git_dir / rel, limit=limit, family=FetchError)
        except FileNotFoundError:
            return None
        except FetchError as exc:
            raise refuse(exc.cause, exc.fix) from None  # a link's fix names the link
        except OSError as exc:
            raise refuse(os.strerror(exc.errno) if exc.errno else str(exc)) from None
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise refuse(f"{git_dir / rel} is not UTF-8 text") from None

    if os.path.islink(git_dir) or not git_dir.is_dir():
        raise refuse(f"{git_dir} is not a folder: kvprefetch's clone has its .git folder there")
    ref = "HEAD"
    for _ in range(5):
        text = read(ref, _REF_BYTES)
        if text is None and ref != "HEAD":
            packed = read("packed-refs", _PACKED_REFS_BYTES) or ""
            text = next((line.split(" ", 1)[0] for line in packed.splitlines()
                         if line.endswith(" " + ref)), None)
        if text is None:
            raise refuse(f"{ref} does not exist")
        value = text.strip()
        if _HEXSHA.fullmatch(value):
            return value
        if not value.startswith("ref:"):
            raise refuse(f"{ref} is neither a commit id nor a symbolic ref")
        ref = value[4:].strip()
        if not _REF_NAME.fullmatch(ref) or ".." in ref:
            raise refuse(f"{ref[:100]!r} is no ref name below refs/")
    raise refuse("more than five symbolic refs in a chain")


def clone_fix(message: str) -> str:
    """The "To fix" of a failed clone, from git's ``message``. A local repository that another
    user owns is refused by git itself (``safe.directory``: "detected dubious ownership"); the
    kit said "check the URL and the network", which no URL or network fixes (issue 41, the
    twenty-ninth hostile pass)."""
    if _config_broken(message):
        return _CONFIG_FIX
    if "dubious ownership" in message:
        return ("the repository belongs to another user, and git reads such a repository "
                "only once you trust it: if you do, run the `git config --global --add "
                "safe.directory ...` that git's message names, then rerun; or use --source "
                "sdist")
    if re.search(r"transport '[^']*' not allowed", message):
        # git's protocol policy (GIT_ALLOW_PROTOCOL, GIT_PROTOCOL_FROM_USER=0, a
        # protocol.<name>.allow setting) refused the URL's transport: no URL or network fixes
        # that (issue 41, the thirty-sixth hostile pass)
        return ("git's protocol policy refuses the URL's transport (GIT_ALLOW_PROTOCOL, "
                "GIT_PROTOCOL_FROM_USER or a protocol.<name>.allow setting in the environment "
                "or git's configuration): allow that transport or unset them, then rerun; or "
                "use --source sdist")
    # `ulimit -u`: "cannot fork() for git-upload-pack" is not the URL's (the twenty-ninth pass)
    return child_limit_fix(message) or "check the URL and the network, or use --source sdist"


# git's own words when it cannot read its configuration: a line of ~/.gitconfig it cannot
# parse ("bad config line 1 in file"), a GIT_CONFIG_COUNT without its KEY_n or a malformed
# GIT_CONFIG_PARAMETERS ("unable to parse command-line config"), a GIT_CONFIG_GLOBAL naming a
# folder. The kit said "install git" or "check the URL and the network" (issue 41, the
# twenty-ninth hostile pass)
_CONFIG_WORDS = ("bad config", "command-line config", "reading the configuration files")
_CONFIG_FIX = ("git cannot read its configuration (the file or GIT_CONFIG_* variable its "
               "message names): correct or unset it, then rerun; or use --source sdist")


def _config_broken(message: str) -> bool:
    return any(w in message for w in _CONFIG_WORDS)
