"""What ``git clone`` of a local repository (``fetch --source DIR``, ``--repo-url file://DIR``)
would read, checked first: files, folders and links to them, nothing git would wait on.

The git folder is walked whole (issue 41, the twenty-sixth hostile pass: a FIFO at
``.git/HEAD`` or ``.git/config`` hung ``git clone`` for ever), and so are the folders git
reaches from it that a plain walk does not enter (the twenty-seventh pass, both hung ``fetch``
past 60 s): a folder of it that is a link (``.git/refs`` -> a folder holding a FIFO
``heads/main``), and the git folder a ``.git`` *file* names (``gitdir: /elsewhere``, a
worktree's or a submodule's), with that folder's ``commondir`` and object ``alternates``.
An alternate's own ``info/alternates`` and a line git reads C-quoted (``"/store"``) are
followed too (the twenty-eighth pass: either one hid a FIFO object from the walk, and ``git
clone`` waited past 60 s)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from ..errors import FetchError
from ..reading import read_limited
from ..workspace import confine

MAX_REPO_ENTRIES = 500_000
_POINTER_BYTES = 64 * 1024  # a .git file, commondir or alternates: a few paths


def check_local_repo(path: Path) -> None:
    """Raise FetchError when ``path``'s git folder, or one git reads through it, holds a FIFO,
    device or socket (a link to one included). Past ``MAX_REPO_ENTRIES`` entries the rest is
    git's own to read."""
    seen = [0]
    done: set[tuple[int, int]] = set()
    roots = [(_git_dir(path), False)]  # (folder, whether it is an object folder)
    while roots and seen[0] <= MAX_REPO_ENTRIES:
        root, objects = roots.pop()
        try:
            st = os.stat(root)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in done:
            continue
        done.add((st.st_dev, st.st_ino))
        roots.extend(_alternates(root) if objects else _pointed_to(root))
        _walk(path, root, seen, done)


def _git_dir(path: Path) -> Path:
    dot = path / ".git"
    if dot.is_file():  # a worktree's or submodule's: "gitdir: <folder>"
        text = _pointer(dot)
        if text.startswith("gitdir:"):
            return (path / text[len("gitdir:"):].strip()).absolute()
    return dot if dot.is_dir() else path


def _pointer(file: Path) -> str:
    try:
        return read_limited(file, _POINTER_BYTES).decode("utf-8", "surrogateescape")
    except (OSError, ValueError):
        return ""  # a FIFO here is found by the walk (the .git file is in the source)


def _pointed_to(git_dir: Path) -> list[tuple[Path, bool]]:
    """The folders git reads from ``git_dir`` beside it: its ``commondir`` and the object
    folders its ``objects/info/alternates`` lists."""
    out = [(git_dir / line, False) for line in
           _pointer(git_dir / "commondir").splitlines()[:1] if line.strip()]
    return out + _alternates(git_dir / "objects")


def _alternates(objects: Path) -> list[tuple[Path, bool]]:
    """The object folders ``objects/info/alternates`` lists, as git reads them: relative ones
    from ``objects``, a line in double quotes C-unquoted, and each one's own alternates in
    turn (the caller walks what this returns, and asks it again)."""
    out = []
    for line in _pointer(objects / "info" / "alternates").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith('"') and line.endswith('"') and len(line) > 1:
            line = _c_unquoted(line[1:-1])
        out.append((objects / line, True))
    return out


_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
              "v": "\v", "\\": "\\", '"': '"'}


def _c_unquoted(text: str) -> str:
    """``text`` with git's C-style escapes (``\\"``, ``\\n``, ``\\ooo`` octal bytes) undone."""
    raw = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 0
    while i < len(raw):
        c = raw[i:i + 1]
        if c != b"\\" or i + 1 >= len(raw):
            out += c
            i += 1
            continue
        digits = raw[i + 1:i + 4]
        if len(digits) == 3 and all(d in b"01234567" for d in digits):
            out.append(int(digits, 8) & 0xFF)
            i += 4
        else:
            nxt = raw[i + 1:i + 2]
            out += _C_ESCAPES.get(nxt.decode("latin-1"), nxt.decode("latin-1")).encode(
                "latin-1")
            i += 2
    return out.decode("utf-8", "surrogateescape")


def _walk(repo: Path, top: Path, seen: list[int], done: set[tuple[int, int]]) -> None:
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            seen[0] += 1
            if seen[0] > MAX_REPO_ENTRIES:
                return
            entry = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                mode = os.stat(entry).st_mode  # a link: what git would read through it
                if stat.S_ISDIR(mode) and os.path.islink(entry):
                    _walk_link(repo, entry, seen, done)
                elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise FetchError(f"the repository {repo} reads {entry}, which is "
                                     f"{confine.kind_of(mode)} (in its git folder, or reached "
                                     "through its links, gitdir or alternates): git clone "
                                     "would wait on it for ever", f"remove or replace {entry}, "
                                                                  "or use --source sdist")


def _walk_link(repo: Path, entry: str, seen: list[int], done: set[tuple[int, int]]) -> None:
    """A folder of the git folder that is a link: walked once (a loop of links ends)."""
    st = os.stat(entry)
    if (st.st_dev, st.st_ino) not in done:
        done.add((st.st_dev, st.st_ino))
        _walk(repo, Path(entry), seen, done)
