"""The build manifests ``verify-kernel`` reads (``build/<tree>/<key>/manifest.json``): the
newest per tree, and whether what one says may be acted on. A manifest is data in the work
directory (the threat model in docs/reliability.md): its fields must have the types the kit
writes, and the interpreter it names must be one of the work directory's own environments'."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import VerifyError
from ..reading import load_json
from ..upstream import TREE_NAME
from ..workspace.workdir import Workdir


def newest_manifests(wd: Workdir) -> dict[str, dict[str, Any]]:
    """tree -> the newest build manifest (kernels-only, overlay or full) of that tree. The
    full-mode smoke's (``build/<tree>/full-smoke/``) records objects, not a library any
    environment loads, so it is never the one verified."""
    out: dict[str, tuple[float, dict[str, Any]]] = {}
    for p in wd.root.glob("build/*/*/manifest.json"):
        try:
            m = load_json(p)
        except (OSError, ValueError):  # a FIFO, a folder, JSON nested too deep: no build
            continue
        if not isinstance(m, dict) or m.get("mode") == "full-smoke":
            continue
        check_manifest(p, m)
        t = p.stat().st_mtime
        if m.get("tree") and (m["tree"] not in out or t > out[m["tree"]][0]):
            out[m["tree"]] = (t, m)
    return {k: v for k, (_, v) in sorted(out.items())}


# The fields verify-kernel reads from a build manifest, and the types the kit writes them with
# (absent or null is allowed, as older manifests lack some).
_MANIFEST_TEXT = ("tree", "mode", "so_path", "so_sha256", "key", "variant")
_MANIFEST_ENV_TEXT = ("path", "python")


def check_manifest(path: Path, m: dict[str, Any]) -> None:
    """A build manifest is data in the work directory: a field verify-kernel reads with
    another type than the kit writes (``"tree": ["x"]``, ``"env": 5``, a path with a NUL) is a
    VerifyError naming it. It was a TypeError or AttributeError traceback (a list as a dict
    key, ``5.get``, ``Path([..])``; issue 41, the seventeenth hostile pass)."""
    def bad(field: str, value: Any) -> VerifyError:
        what = "text with a NUL" if isinstance(value, str) else type(value).__name__
        return VerifyError(f"build manifest {path} is corrupt: `{field}` is {what}, "
                           "not a name or path",
                           "rebuild that tree (`kvprefetch build`), or move the manifest's "
                           "folder out of build/")
    for k in _MANIFEST_TEXT:
        v = m.get(k)
        if v is not None and (not isinstance(v, str) or "\0" in v):
            raise bad(k, v)
    tree = m.get("tree")
    if tree and not TREE_NAME.match(tree):
        # the tree's name is a path's part (trees/<tree>): the check of it said "--tree
        # '../x' is not a tree name / To fix: pick a name such as patched", where no --tree
        # was given and the manifest named it (issue 41, the thirty-first hostile pass)
        raise VerifyError(f"build manifest {path} is corrupt: its tree {tree[:80]!r} is not a "
                          "tree name (letters, digits and _)",
                          "rebuild that tree (`kvprefetch build`), or move the manifest's "
                          "folder out of build/")
    env = m.get("env")
    if env is None:
        return
    if not isinstance(env, dict):
        raise bad("env", env)
    for k in _MANIFEST_ENV_TEXT:
        v = env.get(k)
        if v is not None and (not isinstance(v, str) or "\0" in v):
            raise bad(f"env.{k}", v)


def manifest_env(m: dict[str, Any]) -> dict[str, Any]:
    """A build manifest's ``env`` (``{}`` where it is absent or null, which ``check_manifest``
    allows: ``m.get("env", {})`` was None for ``"env": null``, and verify-kernel's
    ``None.get`` a traceback; issue 41, the thirty-fifth hostile pass)."""
    env = m.get("env")
    return env if isinstance(env, dict) else {}


def manifest_env_path(m: dict[str, Any]) -> str:
    """The environment folder a build manifest names; ``""`` where none (``"path": null``
    was ``os.path.realpath(None)``, a TypeError traceback; the thirty-fifth pass)."""
    return str(manifest_env(m).get("path") or "")


def manifest_python(m: dict[str, Any]) -> str:
    """The interpreter a build manifest names: its ``env.python``, else ``env.path``'s
    ``bin/python`` (checked by ``check_manifest`` first)."""
    return str(manifest_env(m).get("python") or Path(manifest_env_path(m)) / "bin" / "python")


def python_problem(python: str, root: Path, what: str = "interpreter") -> str | None:
    """Why the interpreter a build manifest names is not one of the work directory's own
    environments' (None: it is): the kit made every env in ``<workdir>/envs/``, and its
    ``bin/python`` (a venv's link to its base interpreter, or the file) is what it recorded. A
    manifest is data (the threat model): one naming ``/bin/rm`` had verify-kernel run
    ``rm <kit>/probe/provenance.py kernels``, deleting the kit's own file outside the work
    directory (issue 41, the seventeenth hostile pass). ``what``: the file's kind in the
    message, for the other files the kit takes from an environment (an overlay's library)."""
    from ..workspace import confine

    envs = root / "envs"
    path = Path(python)
    if not path.is_absolute() or ".." in path.parts or confine.has_control(python):
        return f"names the {what} {python[:200]!r}, which is no absolute plain path"
    if not confine.inside(envs, path) or path.parent == envs:
        return f"names the {what} {python[:200]}, outside {envs}"
    link = confine.first_symlink(root, path.parent)
    if link is not None:
        return f"names the {what} {python[:200]} through the symlink {link}"
    return None


def python_gone(m: dict[str, Any]) -> str | None:
    """Why the interpreter a build manifest names (one ``python_refused`` let through) cannot
    be run: it is not there, its environment removed (``clean --what envs``) while the build
    stayed; None: it is there. Running it was an OSError, "No such file or directory / To fix:
    check the path and its file system", which ended verify-kernel without a report and sent
    the user to a path the kit had made (issue 41, the thirty-fifth hostile pass)."""
    python = manifest_python(m)
    if os.path.exists(python):
        return None
    return (f"the environment of tree {str(m.get('tree'))[:64]!r} is gone: its build manifest "
            f"names the interpreter {python[:200]}, which is not there (removed by `kvprefetch "
            "clean --what envs`?); rebuild the tree with `kvprefetch build`")


def python_refused(m: dict[str, Any], root: Path) -> str | None:
    """Why verify-kernel runs no probe with the interpreter the build manifest ``m`` names
    (``python_problem``, in the report's words); None: it may. Every probe of a manifest's
    environment asks here first: the overlay checks ran its ``env.python`` unchecked, and a
    manifest of mode ``overlay`` naming ``/usr/bin/touch`` (or ``/bin/rm``) had verify-kernel
    run it on the kit's own ``probe/overlay.py``, outside the work directory (issue 41, the
    thirty-first hostile pass)."""
    problem = python_problem(manifest_python(m), root)
    if problem is None:
        return None
    return (f"the build manifest of tree {str(m.get('tree'))[:64]!r} {problem}; kvprefetch "
            "runs no program a record names outside its environments (rebuild the tree "
            "with `kvprefetch build`)")
