"""The work directory's layout, the per-tree state records, and the rules that keep the kit
from adopting or writing through what it did not make.

    <workdir>/
      .kvprefetch-workdir      tag: this directory was created (or adopted) by kvprefetch
      .kvprefetch-owned.json   what the kit created here (ownership.py); clean removes only that
      downloads/               hash-checked sdist cache
      pristine/<source>/       the verified pristine source, copied into each tree
      trees/<name>/            baseline, patched (and paper, ...): independent full copies
      .locks/tree-<name>.lock  the tree's lock, taken by every command that touches the tree
      state/<name>.json        how each tree was made, its file inventory, what was applied
      build/<name>/<key>/      content-addressed builds with manifest.json and logs/
      envs/<name>/             one isolated Python environment per tree
      tmp/<step>-<pid>-<rand>/ a running step's scratch files (ownership.scratch_dir)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import upstream
from ..errors import ConfigError, PatchError
from ..oserrors import other_bytes_on_disk
from ..reading import load_json, read_limited
from . import confine

TAG_FILE = ".kvprefetch-workdir"
# ownership.OWNED_FILE (ownership imports this module): the record of what the kit made
OWNED_RECORD = ".kvprefetch-owned.json"
# Tree names become directory names, lock names and C++ namespaces: no separators, no dots.
_TREE_NAME = upstream.TREE_NAME


def check_tree_name(name: str, option: str = "--tree") -> str:
    """``name`` if it is a valid tree name, else a ConfigError (never a path: ``../x``)."""
    if not _TREE_NAME.match(name):
        raise ConfigError(f"{option} {name!r} is not a tree name (letters, digits and _, "
                          "starting with a letter or _, at most 64 characters)",
                          "pick a name such as patched or exp_d2")
    return name


@dataclass(frozen=True)
class Workdir:
    root: Path

    def __post_init__(self) -> None:
        # the kit's files name it in UTF-8 (build.ninja, logs), so under Shift_JIS, GBK or
        # latin-1 a non-ASCII name would be another folder there: a build beside the work
        # directory (issue 41, the twenty-seventh hostile pass, found by reading)
        if other_bytes_on_disk(str(self.root)):
            raise ConfigError(
                f"the work directory {str(self.root)!a} is, under this locale's encoding "
                f"({sys.getfilesystemencoding()}), other bytes than its UTF-8 text, which the "
                "files kvprefetch writes (build.ninja, logs) would name: another folder",
                "run kvprefetch under a UTF-8 locale (e.g. `LC_ALL=C.UTF-8`), or use a work "
                "directory of ASCII characters")
        # its logs are written from it down (runner.open_log, confine.root_of)
        confine.trust_root(self.root)

    @property
    def downloads(self) -> Path:
        return self.root / "downloads"

    @property
    def pristine(self) -> Path:
        return self.root / "pristine"

    def tree(self, name: str) -> Path:
        return self.root / "trees" / check_tree_name(name)

    def tree_lock(self, name: str) -> Path:
        """One lock per tree, shared by fetch, apply, build and clean."""
        return self.root / ".locks" / f"tree-{check_tree_name(name)}.lock"

    def state_file(self, name: str) -> Path:
        return self.root / "state" / f"{check_tree_name(name)}.json"

    def build_root(self, name: str) -> Path:
        return self.root / "build" / check_tree_name(name)

    def env(self, name: str) -> Path:
        return self.root / "envs" / check_tree_name(name)

    def overlay_env(self, name: str) -> Path:
        """The overlay-mode environment of tree ``name``: ``envs/<tree>-vllm``, beside the
        kernels-only ``envs/<tree>`` (a tree name has no ``-``, so the two never collide)."""
        return self.root / "envs" / f"{check_tree_name(name)}-vllm"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    def is_tagged(self) -> bool:
        tag = self.root / TAG_FILE
        return tag.is_file() and not tag.is_symlink()

    def ensure(self, adopt: bool = False, campaign: bool = False) -> None:
        """Create the work directory, or accept an existing one: a kvprefetch work directory,
        an empty directory, or (``adopt``) a non-empty one the user hands over. ``campaign``:
        a campaign's work folder, which ``slurm prepare`` makes and which has no --adopt."""
        from .confine import make_dirs, write_file
        from .foreign import make_own_folder

        tagged = self.is_tagged()  # before the checks: a tag that comes after is no excuse
        self.check_adoptable(adopt, campaign=campaign)
        adopting = self.root.is_dir() and not self.is_tagged() and any(self.root.iterdir())
        if tagged:
            make_dirs(self.root)
        else:  # made now, or found untagged: the user's, looked at once it is there too
            make_own_folder(self.root, f"the campaign's work folder {self.root}" if campaign
                            else f"--workdir {self.root}")
        if not self.is_tagged():
            how = "adopted" if adopting else "created"
            write_file(self.root / TAG_FILE, f"{how} by kvprefetch; `kvprefetch clean` removes "
                       "only what .kvprefetch-owned.json lists\n", root=self.root)

    def is_adopted(self) -> bool:
        """Whether the directory held the user's files when the kit took it (``--adopt``):
        then only what the ownership record lists is the kit's, even under downloads/."""
        # read bounded and never blocking (reading.read_limited): the tag is data in the work
        # directory, and read whole by path a sparse 15 TB file there was a MemoryError
        # traceback in fetch and clean, and a FIFO swapped in after is_tagged hung them
        # (issue 41, the eighteenth hostile pass). A tag that cannot be read so is taken as
        # adopted, the side on which the kit removes less.
        try:
            return self.is_tagged() and read_limited(self.root / TAG_FILE, 4096).startswith(
                b"adopted")
        except (OSError, ValueError):
            return True

    def check_adoptable(self, adopt: bool = False, campaign: bool = False) -> None:
        """Refuse (ConfigError) a --workdir the kit must not take over; writes nothing.
        ``campaign``: the folder is a campaign's work folder, named as such (not --workdir),
        and the fix offered is not --adopt, which ``slurm prepare`` does not have (issue 41,
        the tenth hostile pass)."""
        if self.root.is_symlink() and not self.root.exists():
            raise ConfigError(f"--workdir {self.root} is a dangling symlink",
                              "point --workdir at a directory")
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"--workdir {self.root} exists and is not a directory",
                              "pick a new or empty directory for --workdir")
        if not os.path.lexists(self.root):
            # the folders `ensure` would make sit under a file: a dry run must refuse what the
            # real run would (issue 41, sixth pass: `fetch --dry-run --workdir FILE/sub` passed)
            above = Path(os.path.abspath(self.root)).parent
            while not os.path.lexists(above) and above != above.parent:
                above = above.parent
            if not above.is_dir():
                raise ConfigError(f"--workdir {self.root} cannot be made: {above} is not a "
                                  "directory", "pick a --workdir under a directory")
        if not self.is_tagged():  # made new, or taken over: the folder is to be the user's
            from .foreign import refuse_foreign
            refuse_foreign(self.root, f"the campaign's work folder {self.root}" if campaign
                           else f"--workdir {self.root}")
        if self.root.is_dir() and not self.is_tagged() and any(self.root.iterdir()) \
                and not adopt:
            shown = ", ".join(sorted(p.name for p in self.root.iterdir())[:6])
            tag = self.root / TAG_FILE
            why = (f"its {TAG_FILE} is a symlink (to {os.readlink(tag)}), which kvprefetch never "
                   "reads as its tag" if tag.is_symlink() else
                   f"its {TAG_FILE} is not a plain file" if os.path.lexists(tag) else
                   f"no {TAG_FILE}")
            if campaign:
                raise ConfigError(
                    f"the campaign's work folder {self.root} is not empty ({shown}) and was not "
                    f"created by kvprefetch ({why}); `slurm prepare` will not take it over",
                    f"move what {self.root} holds out of the campaign (your files stay yours) "
                    "or plan a new campaign, then rerun the prepare job")
            raise ConfigError(
                f"--workdir {self.root} is not empty ({shown}) and was not created by kvprefetch "
                f"({why}); kvprefetch will not take it over as its work directory",
                "pass a new or empty --workdir, or add --adopt to use this one (kvprefetch then "
                "only ever removes what it creates there; your files are kept)")
        owned = self.root / OWNED_RECORD
        if self.root.is_dir() and not self.is_tagged() and os.path.lexists(owned):
            # the record lists what `clean` may remove; one the kit did not write here (copied
            # in, left by a lost work directory, or forged) would make it remove the user's own
            # trees and builds in the directory it adopts (issue 41, the fourth hostile pass)
            raise ConfigError(
                f"--workdir {self.root} holds {OWNED_RECORD}, but kvprefetch did not create this "
                f"directory (no {TAG_FILE}): that record was not written here, and kvprefetch "
                "would remove the paths it lists",
                f"move {owned} out of the directory (your files stay yours), then rerun")

    def read_state(self, name: str) -> dict[str, Any] | None:
        """The tree's state record, checked; None when there is none. A corrupt or foreign
        record is a PatchError naming the file, never a traceback."""
        p = self.state_file(name)
        if not os.path.lexists(p):
            return None
        return validate_state(p, name)

    def resolve_tree(self, name: str) -> str:
        """The tree a user-given ``name`` refers to here (``seed`` and ``paper`` name the
        paper's tree, whichever name this work directory made it under), checked."""
        return check_tree_name(upstream.resolve_tree_name(check_tree_name(name),
                                                          self.existing_trees()))

    def existing_trees(self) -> list[str]:
        d = self.root / "trees"
        if not d.is_dir() or d.is_symlink():
            return []
        return sorted(p.name for p in d.iterdir()
                      if p.is_dir() and not p.is_symlink() and _TREE_NAME.match(p.name))


def _bad_state(path: Path, why: str) -> PatchError:
    return PatchError(f"the state file {path} {why}",
                      "run `kvprefetch fetch --repair` to rebuild the state from the trees' "
                      "content (or `kvprefetch fetch --force` to start the tree again)")


def _str_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(h, str)
                                       for k, h in v.items())


def validate_state(path: Path, name: str) -> dict[str, Any]:
    if path.is_symlink() or not path.is_file():
        raise _bad_state(path, "is not a regular file")
    try:
        data = load_json(path)
    except ValueError as exc:  # bad bytes, bad JSON, nested too deep, a FIFO swapped in
        raise _bad_state(path, f"is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _bad_state(path, f"holds a JSON {type(data).__name__}, not a state record")
    if data.get("tree") != name or data.get("vllm_version") != upstream.VLLM_VERSION:
        raise _bad_state(path, f"is not kvprefetch's record of tree {name!r} for vLLM "
                               f"{upstream.VLLM_VERSION} (tree {data.get('tree')!r}, "
                               f"version {data.get('vllm_version')!r})")
    if not isinstance(data.get("source"), str) or not _str_map(data.get("inventory")) \
            or not data["inventory"]:
        raise _bad_state(path, "lacks a source or a file inventory")
    applied = data.get("applied")
    if applied is not None:
        ok = (isinstance(applied, dict)
              and upstream.canonical_variant(str(applied.get("variant"))) in upstream.VARIANTS
              and isinstance(applied.get("patch_sha256"), str)
              and _str_map(applied.get("headers") or {}) and _str_map(applied.get("files") or {}))
        if not ok:
            raise _bad_state(path, "has a malformed 'applied' record")
    # the tree's paths it names stay in the tree: nothing acted on an 'applied' file
    # '../../x' or '/etc/x', but the record was taken as sound (issue 41, left open by the
    # thirty-third hostile pass); an inventory path is held to the same (a control character
    # aside: a file a user added to a tree may have one, and --repair records it)
    for what, paths in (("inventory", data["inventory"]),
                        ("'applied' files", (applied or {}).get("files") or {}),
                        ("'applied' headers", (applied or {}).get("headers") or {})):
        for rel in paths:
            # a control character aside: '../x\x01' still leaves the tree
            problem = confine.rel_problem(confine.without_control(rel))
            if problem is not None:
                raise _bad_state(path, f"names a path {rel!r} in its {what} that {problem}, "
                                       "outside its tree")
    return data


def json_text(data: Any) -> str:
    """How the kit writes a JSON record: indented, keys sorted, a final newline."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_json_atomic(path: Path, data: Any, *, root: Path | None = None) -> None:
    """Write JSON via a temp file and rename (confine.write_file: never through a symlinked
    destination or parent, checked from ``root`` down when given), and only when the content
    changes."""
    from .confine import is_plain_file, write_file

    text = json_text(data)
    # what is there is read bounded by the new text's size, never blocking (read_limited): a
    # record swapped for a FIFO or a sparse 15 TB file after its checks hung the kit, or was a
    # MemoryError traceback, when read whole by path (issue 41, the eighteenth hostile pass)
    encoded = text.encode("utf-8")
    if is_plain_file(path):
        try:
            if read_limited(path, len(encoded)) == encoded:
                return
        except (OSError, ValueError):
            pass
    write_file(path, text, root=root)
