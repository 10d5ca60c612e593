"""Isolated Python environments behind one small interface (nox style): ``Env`` with
``create()``, ``python``, ``environ()``, ``site_packages()``; backends ``venv`` (stdlib), ``uv``
and ``conda`` (conda / mamba / micromamba, ``--prefix`` environments).

What this module guarantees:

- An environment is reused only when its marker file (``<env>/.kvprefetch-env.json``) says it
  was made by kvprefetch, by the same backend, with the same options, and finished.
- Creation never leaves something half-made that would later be reused: venv/uv envs are built
  in ``<path>.tmp-<pid>`` and renamed into place; a ``.<name>.creating`` stamp next to the env
  marks the whole creation, so a killed create is detected and redone from scratch. The marker
  is written last. A non-blocking file lock guards each env path.
- The env's own python must resolve inside the env (``sys.prefix`` is checked), else an error.
- ``environ()`` strips what breaks isolation or silently swaps binaries (PYTHONPATH,
  PYTHONHOME, another env's prefix, VLLM_USE_PRECOMPILED, pip's user/target overrides).

Past the ~500-line mark as one module: the creation protocol (lock, stamp, recorded temporary,
private build folder, marker) and the three backends that plug into it are read together."""

from __future__ import annotations

import abc
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from .. import __version__
from ..errors import BuildError, ConfigError, KvprefetchError
from ..reading import load_json
from ..runner import NEUTRAL_CWD, run, which
from ..workspace import confine, ownership
from ..workspace.confine import write_file
from ..workspace.locks import locked
from .torch_probe import probe_answer
from .uvconfig import uv_config_args

ST_NOSYMFOLLOW = 0x2000  # statvfs's flag for a mount of `nosymfollow` (Linux 5.10; not in os)

MARKER = ".kvprefetch-env.json"

# Removed from every child environment: they make the env's python import foreign code, run a
# foreign startup file, or make pip install somewhere else than the env. PYTHONIOENCODING: the
# kit reads what those pythons print (the environment probe's record); a user's utf-16 made
# `build` say its own interpreter was none (issue 41, the twenty-third hostile pass).
ISOLATION_STRIP = (
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONEXECUTABLE", "PYTHONUSERBASE",
    "PYTHONIOENCODING", "__PYVENV_LAUNCHER__", "PIP_USER", "PIP_TARGET", "PIP_PREFIX",
    "PIP_ROOT",
)
# Activation state of venv/uv and conda. Each backend sets its own and drops the rest.
VENV_VARS = ("VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT")
CONDA_VARS = ("CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CONDA_SHLVL", "CONDA_PROMPT_MODIFIER")
# vLLM's setup.py replaces every compiled extension with one from a prebuilt wheel when these
# are set (vllm/envs.py L261-263, setup.py L608-637), silently: the build "succeeds" and the
# patch is not in the binary. VLLM_TEST_USE_PRECOMPILED_NIGHTLY_WHEEL only picks that wheel.
PRECOMPILED_VARS = ("VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_LOCATION",
                    "VLLM_TEST_USE_PRECOMPILED_NIGHTLY_WHEEL")

_PROBE = ("import json, sys, sysconfig; print(json.dumps({'prefix': sys.prefix, "
          "'base_prefix': sys.base_prefix, 'executable': sys.executable, "
          "'version': '%d.%d.%d' % sys.version_info[:3], "
          "'purelib': sysconfig.get_paths()['purelib'], "
          "'platlib': sysconfig.get_paths()['platlib'], "
          "'scripts': sysconfig.get_paths()['scripts']}))")


def refuse_precompiled(environ: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError when the environment asks vLLM for precompiled binaries."""
    environ = os.environ if environ is None else environ
    use = environ.get("VLLM_USE_PRECOMPILED", "").strip()
    wheel = environ.get("VLLM_PRECOMPILED_WHEEL_LOCATION", "").strip()
    found = []
    if use and use.lower() not in ("0", "false", "no", "off"):
        found.append(f"VLLM_USE_PRECOMPILED={use}")
    if wheel:
        found.append(f"VLLM_PRECOMPILED_WHEEL_LOCATION={wheel}")
    if found:
        raise ConfigError(
            f"{' and '.join(found)} is set: vLLM's setup.py would then skip compiling and copy "
            "_C.abi3.so and the other extensions out of a prebuilt wheel, so the build would "
            "silently contain stock kernels instead of the patched ones",
            "unset them (`unset VLLM_USE_PRECOMPILED VLLM_PRECOMPILED_WHEEL_LOCATION`) and rerun",
        )


def _drop_path_entries(path_value: str, prefixes: Sequence[str]) -> list[str]:
    bins = {os.path.realpath(os.path.join(p, "bin")) for p in prefixes if p}
    return [e for e in path_value.split(os.pathsep)
            if e and os.path.realpath(e) not in bins]


E = TypeVar("E", bound="Env")


class Env(abc.ABC):
    """One isolated Python environment at ``path``. Subclasses set ``kind`` and implement
    ``_build`` (make the env at a given directory) and ``_activate`` (the backend's variables)."""

    kind: ClassVar[str]
    # Whether the env may be built elsewhere and renamed into place (venv: yes; conda bakes
    # its prefix into files, so it is built where it lives).
    relocatable: ClassVar[bool] = True

    def __init__(self, path: str | os.PathLike[str], *, log: str | os.PathLike[str] | None = None
                 ) -> None:
        self.path = Path(os.path.abspath(path))
        self.log = Path(log) if log is not None else None
        self._info: dict[str, Any] | None = None

    # ------------------------------------------------------------------ layout
    @property
    def bin_dir(self) -> Path:
        return self.path / "bin"

    @property
    def python(self) -> Path:
        return self.bin_dir / "python"

    @property
    def marker_path(self) -> Path:
        return self.path / MARKER

    @property
    def lock_path(self) -> Path:
        return self.path.parent / f".{self.path.name}.lock"

    @property
    def stamp_path(self) -> Path:
        """Exists exactly while a creation is in progress (or was killed)."""
        return self.path.parent / f".{self.path.name}.creating"

    def options(self) -> dict[str, Any]:
        """What must match for an existing env to be reused."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    # ------------------------------------------------------------------ state
    def read_marker(self) -> dict[str, Any] | None:
        try:
            data = load_json(self.marker_path)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def exists(self) -> bool:
        """True when a finished kvprefetch env of this kind is at ``path``."""
        m = self.read_marker()
        return (m is not None and m.get("kind") == self.kind and m.get("state") == "ready"
                and self.python.exists() and not self.stamp_path.exists())

    # ------------------------------------------------------------------ environment
    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for commands run in this env: ``base`` (default os.environ) minus
        the isolation breakers and precompiled-binary switches, other envs' activation removed
        (their ``bin`` dropped from PATH), this env's ``bin`` first on PATH and its own
        activation variables set. PYTHONNOUSERSITE=1 hides ~/.local site-packages."""
        env = dict(os.environ if base is None else base)
        foreign = [env.get(v, "") for v in ("VIRTUAL_ENV", "CONDA_PREFIX")]
        for var in ISOLATION_STRIP + VENV_VARS + CONDA_VARS + PRECOMPILED_VARS:
            env.pop(var, None)
        for var in [k for k in env if k.startswith("CONDA_PREFIX_")]:
            env.pop(var)
        entries = _drop_path_entries(env.get("PATH", os.defpath),
                                     [p for p in foreign if p and Path(p) != self.path])
        own = str(self.bin_dir)
        # An env that inherits its creator's packages also needs the creator's scripts (ninja,
        # cmake from pip) even when that creator's VIRTUAL_ENV was just dropped: they go last.
        tail = [t for t in self._path_tail() if t not in entries and t != own]
        env["PATH"] = os.pathsep.join([own] + [e for e in entries if e != own] + tail)
        env["PYTHONNOUSERSITE"] = "1"
        env.update(self._activate())
        return env

    def _path_tail(self) -> list[str]:
        """Folders that go last on the env's PATH: none, unless a backend's env inherits
        another python's packages (``VenvEnv``)."""
        return []

    @abc.abstractmethod
    def _activate(self) -> dict[str, str]:
        """The backend's activation variables."""

    # ------------------------------------------------------------------ probing
    def info(self, *, refresh: bool = False) -> dict[str, Any]:
        """Ask the env's python where it lives (prefix, executable, version, site dirs)."""
        if self._info is None or refresh:
            if not self.python.exists():
                raise ConfigError(*self._no_python())
            done = run([str(self.python), "-c", _PROBE], env=self.environ(), echo=False,
                       log=self.log, timeout=120, cwd=NEUTRAL_CWD)
            self._info = probe_answer(done.output, self.python)
        return self._info

    def _no_python(self) -> tuple[str, str]:
        """(cause, fix) when the env's python cannot be reached. A venv's ``bin/python`` is a
        link to its creator's, which a file system mounted ``nosymfollow`` never follows: a
        build there said "envs/<tree> has no bin/python / recreate it: rerun with --force",
        and every rerun made the env and failed the same way (issue 41, the thirty-sixth
        hostile pass, on a loop-mounted ext4)."""
        rel = self.python.relative_to(self.path)
        if not os.path.islink(self.python):
            return (f"{self.path} has no {rel}",
                    f"recreate it: rerun with --force, or remove {self.path}")
        with suppress(OSError):
            if os.statvfs(self.python.parent).f_flag & ST_NOSYMFOLLOW:
                cause = (f"{self.python} is a symlink (as every venv's python is), and the "
                         f"file system holding {self.path} is mounted nosymfollow, so no "
                         "program can follow it")
                fix = ("put the work directory on a file system that follows symlinks "
                       f"(`findmnt -T {self.path.parent}` shows its options; `mount -o "
                       "remount,symfollow` on it, as root), or pass --workdir on another, "
                       "then rerun")
                return cause, fix
        target = "?"
        with suppress(OSError):
            target = os.readlink(self.python)
        cause = (f"{self.python} is a symlink to {target}, which cannot be run from here "
                 "(gone, or a link loop)")
        return cause, f"recreate the environment: rerun with --force, or remove {self.path}"

    def site_packages(self) -> Path:
        return Path(self.info()["purelib"])

    def check_python_inside(self) -> None:
        """The env's python must report ``sys.prefix`` == the env itself (real paths)."""
        info = self.info(refresh=True)
        if os.path.realpath(info["prefix"]) != os.path.realpath(self.path):
            raise ConfigError(
                f"the python of environment {self.path} resolves outside it: sys.prefix is "
                f"{info['prefix']} (executable {info['executable']}), so builds would install "
                "into and load from somewhere else",
                f"remove {self.path} and recreate it (rerun with --force); check that "
                f"{self.python} is not a wrapper or a link to another environment's python",
            )

    # ------------------------------------------------------------------ creation
    def create(self: E, *, force: bool = False,  # noqa: PYI019 (typing.Self is 3.11+)
               owner: Path | None = None) -> E:
        """Create the env, or reuse an existing one of the same kind and options. ``force``
        replaces an existing kvprefetch env (of any kind). Holds the env's lock throughout.
        ``owner``: the kit work directory the env lives in; its temporary directory is then
        recorded there before it exists, so that a killed creation's leftover is removed by the
        next fetch or clean as well as by the next creation. Every removal, folder and marker
        acts inside ``owner`` (else the env's folder) through ``confine``: never through a
        symlink, even one swapped in for ``envs/`` while the env is made (issue 41, the twelfth
        hostile pass: a swap loop on ``envs/`` had a half-made env's stamp remove a folder
        outside, in 3 runs of 11)."""
        root = owner if owner is not None else self.path.parent
        with locked(self.lock_path, f"environment {self.path}"):
            confine.check_target(root, self.path, what="make the environment",
                                 family=BuildError)
            if owner is not None:
                self._refuse_a_users_folder(owner)
            self._clear_debris(root, owner is not None)
            if os.path.lexists(self.path):
                if self._reusable(force):
                    self.check_python_inside()
                    return self
                confine.remove_path(root, self.path, family=BuildError)
            self._create_fresh(root, recorded=owner is not None)
            if owner is not None:
                # listed as the kit's: in an adopted work directory only what the record
                # lists is removed by clean (a marker file alone is anybody's to write)
                ownership.record(root, self.path, "env")
        return self

    def _refuse_a_users_folder(self, owner: Path) -> None:
        """In a work directory adopted with the user's files, a folder at the environment's
        path that the ownership record does not list is the user's, whatever marker or stamp
        is beside it: ``--force``, a marker of other options, or a file named like the
        creation stamp had it removed with all it held (issue 41, the twentieth hostile
        pass)."""
        from ..workspace.workdir import Workdir

        if not (os.path.lexists(self.path) or os.path.lexists(self.stamp_path)):
            return
        if (ownership.owned(owner, self.path) or {}).get("kind") == "env" \
                or not Workdir(owner).is_adopted():
            return
        raise ConfigError(
            f"{self.path} is not an environment kvprefetch made here (the ownership record "
            f"does not list it, and kvprefetch adopted {owner} with your files in it)",
            f"move {self.path} (and {self.stamp_path}, if it is there) out of "
            f"{self.path.parent}; kvprefetch does not remove what it did not make; then rerun")

    def _clear_debris(self, root: Path, recorded: bool) -> None:
        """Under the lock no other creator is alive, so a temporary the ownership record names
        as a dead run's is debris; a stamp means a creation was killed and whatever is at
        ``path`` is half-made by us. A folder of the user's named like a temporary
        (``envs/<tree>.tmp-mine``), and not in the record, is left (issue 41, the twelfth
        hostile pass: every ``<tree>.tmp-*`` was removed, the user's files in it too)."""
        for tmp in self._debris(root, recorded):
            if os.path.lexists(tmp):
                confine.remove_path(root, tmp, family=BuildError)
            if recorded:
                ownership.forget(root, tmp)
        if os.path.lexists(self.stamp_path):
            confine.remove_path(root, self.path, family=BuildError)
            confine.remove_path(root, self.stamp_path, family=BuildError)

    def _reusable(self, force: bool) -> bool:
        m = self.read_marker()
        if m is None:
            raise ConfigError(
                f"{self.path} exists but was not created by kvprefetch (no {MARKER})",
                "pass a different environment path, or move that directory away yourself; "
                "kvprefetch does not delete what it did not create",
            )
        if force:
            return False
        if m.get("kind") != self.kind:
            raise ConfigError(
                f"{self.path} is a {m.get('kind')!r} environment, but a {self.kind!r} one was "
                "asked for",
                f"rerun with --force to replace it, use --env-backend {m.get('kind')}, or pass "
                "a different environment path",
            )
        if m.get("options") != self.options():
            raise ConfigError(
                f"{self.path} was created with options {m.get('options')}, not {self.options()}",
                "rerun with --force to recreate it, or pass a different environment path",
            )
        return m.get("state") == "ready"

    def _debris(self, root: Path, recorded: bool) -> list[Path]:
        """A killed creation's temporaries: those the work directory's ownership record names
        as a dead run's; outside a work directory (no record), ``<name>.tmp-<pid>`` of a pid
        that no longer runs."""
        prefix = f"{self.path.name}.tmp-"
        if recorded:
            return [t for t in ownership.orphans(root)
                    if t.parent == self.path.parent and t.name.startswith(prefix)]
        return [t for t in self.path.parent.glob(f"{prefix}*")
                if t.name[len(prefix):].isdigit() and t.name[len(prefix):].isascii()
                and not ownership.pid_alive(int(t.name[len(prefix):]))]

    def _create_fresh(self, root: Path, *, recorded: bool) -> None:
        from contextlib import nullcontext

        confine.ensure_dir(self.path.parent, root=root, family=BuildError)
        write_file(self.stamp_path, json.dumps({"pid": os.getpid(), "kind": self.kind}),
                   root=root, family=BuildError)
        tmp = self.path.parent / f"{self.path.name}.tmp-{os.getpid()}"
        with (ownership.temporary(root, tmp, family=BuildError) if recorded
              else nullcontext(tmp)):
            self._build_into(root, tmp)
        confine.remove_path(root, self.stamp_path, family=BuildError)

    def _build_into(self, root: Path, tmp: Path) -> None:
        try:
            if self.relocatable:
                # the backend's program (venv, uv) writes by path: it builds in a private
                # folder outside the work directory, which the kit then copies into its
                # temporary and moves into place relative to folders opened O_NOFOLLOW (issue
                # 41, the twelfth hostile pass: ``envs/`` swapped for a link while venv ran)
                confine.ensure_dir(tmp, root=root, family=BuildError)
                with ownership.private_dir(f"env-{self.path.name}") as private:
                    self._build(private / self.path.name)
                    confine.copy_tree(root, private / self.path.name, tmp / self.path.name,
                                      family=BuildError)
                confine.move_file(root, tmp / self.path.name, self.path, family=BuildError)
                confine.remove_path(root, tmp, family=BuildError)
            else:
                self._build(self.path)
            # ensurepip (and conda's own installer above) write the environment by path, at
            # its final place: refused when a folder of it is a link now; a swap while it runs
            # is not caught (issue 41, the thirteenth hostile pass: the residual window)
            for p in (self.path, self.bin_dir, self.path / "lib"):
                if os.path.lexists(p):
                    confine.check_target(root, p, what="install into", family=BuildError)
            self._after_build()
            self._info = None
            self.check_python_inside()
            self._write_marker(root)
        except BaseException:
            for made in (tmp, self.path, self.stamp_path):
                with suppress(OSError, KvprefetchError):
                    confine.remove_path(root, made, family=BuildError)
            raise

    def _write_marker(self, root: Path) -> None:
        data = {
            "kind": self.kind, "state": "ready", "creator": f"kvprefetch {__version__}",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "options": self.options(), "python_version": self.info()["version"],
        }
        write_file(self.marker_path, json.dumps(data, indent=2) + "\n", root=root,
                   family=BuildError)

    @abc.abstractmethod
    def _build(self, target: Path) -> None:
        """Create the environment at ``target``."""

    # An optional hook, a no-op unless a backend overrides it (hence not abstract).
    def _after_build(self) -> None:  # noqa: B027
        """Steps that must run at the final path (e.g. installing pip, whose scripts embed it)."""

    def _run(self, argv: Sequence[str | os.PathLike[str]],
             env: Mapping[str, str] | None = None) -> None:
        # a TMPDIR of its own, removed however the step ends: ensurepip and pip stopped by a
        # signal left their temporaries (pip-build-tracker-*, pip-install-*, *cacert.pem) in the
        # user's temp folder (issue 41, the thirteenth hostile pass)
        child = dict(env if env is not None else self.environ())
        with ownership.private_dir(f"env-tmp-{self.path.name}") as tmp:
            child["TMPDIR"] = str(tmp)
            run(argv, env=child, log=self.log, cwd=NEUTRAL_CWD)


def _base_python_info(python: str | os.PathLike[str]) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if k not in ISOLATION_STRIP}
    done = run([str(python), "-c", _PROBE], env=clean, echo=False, timeout=120, cwd=NEUTRAL_CWD)
    return probe_answer(done.output, python)



def _write_inherit_pth(site_packages: Path, dirs: Sequence[str]) -> None:
    """Make ``dirs`` importable after the env's own site-packages (the env's packages win)."""
    write_file(site_packages / "_kvprefetch_inherit.pth", "".join(f"{d}\n" for d in dirs),
               family=BuildError)


class VenvEnv(Env):
    """A stdlib ``venv``. ``system_site_packages`` lets the env see the packages of the python
    that created it (a kernels-only env then reuses a 5 GB torch instead of reinstalling it).
    When that python is itself a venv, ``venv --system-site-packages`` would expose only the
    *base* installation, so the creator's site-packages are added through a .pth file instead.
    pip is installed at the final path (``ensurepip``) because its scripts embed that path."""

    kind = "venv"

    def __init__(self, path: str | os.PathLike[str], *,
                 python: str | os.PathLike[str] | None = None,
                 system_site_packages: bool = False, with_pip: bool = True,
                 log: str | os.PathLike[str] | None = None) -> None:
        super().__init__(path, log=log)
        self.base_python = str(python or sys.executable)
        self.system_site_packages = system_site_packages
        self.with_pip = with_pip
        self._creator_scripts: str | None = None  # the creator's scripts folder, asked once

    def options(self) -> dict[str, Any]:
        return {"base_python": self.base_python, "system_site_packages": self.system_site_packages,
                "with_pip": self.with_pip}

    def _activate(self) -> dict[str, str]:
        return {"VIRTUAL_ENV": str(self.path)}

    def _path_tail(self) -> list[str]:
        """An env that inherits its creator's packages also needs the creator's scripts (ninja,
        cmake from pip): the scripts folder of ``base_python``, this run's own option, asked
        of it. Never read back from the marker: the marker is data in the work directory, and
        a ``path_tail`` there put any folder, outside the work directory too, on the build's
        PATH (issue 41, the thirty-second hostile pass)."""
        if not self.system_site_packages:
            return []
        if self._creator_scripts is None:
            self._creator_scripts = _base_python_info(self.base_python)["scripts"]
        return [self._creator_scripts]

    def _build(self, target: Path) -> None:
        base = _base_python_info(self.base_python) if self.system_site_packages else None
        in_venv = bool(base and base["prefix"] != base["base_prefix"])
        argv = [self.base_python, "-m", "venv", "--without-pip"]
        if self.system_site_packages and not in_venv:
            argv.append("--system-site-packages")
        self._run([*argv, str(target)], env={k: v for k, v in os.environ.items()
                                             if k not in ISOLATION_STRIP + VENV_VARS})
        if base:
            self._creator_scripts = base["scripts"]
        if base and in_venv:
            # The new env's site-packages lives at the same relative spot as the base's.
            rel = os.path.relpath(base["purelib"], base["prefix"])
            dirs = list(dict.fromkeys([base["purelib"], base["platlib"]]))
            _write_inherit_pth(target / rel, dirs)

    def _after_build(self) -> None:
        if self.with_pip:
            self._run([str(self.python), "-m", "ensurepip", "--upgrade", "--default-pip"])


class UvEnv(Env):
    """A ``uv venv`` (``--relocatable``, so it may be renamed into place); packages go in with
    ``uv pip install --python <env python>``. Only offered when uv is on PATH."""

    kind = "uv"

    def __init__(self, path: str | os.PathLike[str], *,
                 python: str | os.PathLike[str] | None = None,
                 system_site_packages: bool = False, with_pip: bool = False,
                 uv: str | os.PathLike[str] | None = None,
                 log: str | os.PathLike[str] | None = None) -> None:
        super().__init__(path, log=log)
        self.base_python = str(python or sys.executable)
        self.system_site_packages = system_site_packages
        self.with_pip = with_pip
        found = str(uv) if uv else which("uv")
        if found is None:
            raise ConfigError("the uv backend was asked for, but uv is not on PATH",
                              "install uv (`pip install uv`) or use --env-backend venv")
        self.uv = found

    def options(self) -> dict[str, Any]:
        return {"base_python": self.base_python, "system_site_packages": self.system_site_packages,
                "with_pip": self.with_pip}

    def _activate(self) -> dict[str, str]:
        return {"VIRTUAL_ENV": str(self.path)}

    def _build(self, target: Path) -> None:
        argv = [self.uv, *uv_config_args(os.environ), "venv", "--relocatable", "--python",
                self.base_python]
        if self.system_site_packages:
            argv.append("--system-site-packages")
        if self.with_pip:
            argv.append("--seed")
        env = {k: v for k, v in os.environ.items() if k not in ISOLATION_STRIP + VENV_VARS}
        self._run([*argv, str(target)], env=env)


CONDA_FLAVOURS = ("micromamba", "mamba", "conda")


def find_conda(environ: Mapping[str, str] | None = None) -> Path | None:
    """conda, mamba or micromamba: $CONDA_EXE / $MAMBA_EXE first, then PATH."""
    environ = os.environ if environ is None else environ
    for var in ("CONDA_EXE", "MAMBA_EXE"):
        exe = environ.get(var)
        if exe and Path(exe).is_file():
            return Path(exe)
    for name in CONDA_FLAVOURS[::-1]:  # prefer conda, then mamba, then micromamba
        found = which(name, environ)
        if found:
            return Path(found)
    return None


class CondaEnv(Env):
    """A ``--prefix`` environment made by conda, mamba or micromamba (as the seed did). Conda
    bakes the prefix into files, so it is created in place; the ``.creating`` stamp still
    makes a killed creation detectable and redone."""

    kind = "conda"
    relocatable = False

    def __init__(self, path: str | os.PathLike[str], *, python: str = "3.11",
                 channels: Sequence[str] | None = None, exe: str | os.PathLike[str] | None = None,
                 system_site_packages: bool = False,
                 log: str | os.PathLike[str] | None = None) -> None:
        super().__init__(path, log=log)
        if system_site_packages:
            raise ConfigError("conda environments cannot inherit another environment's packages",
                              "use --env-backend venv for a kernels-only build that reuses torch")
        found = Path(exe) if exe else find_conda()
        if found is None:
            raise ConfigError("the conda backend was asked for, but none of conda, mamba or "
                              "micromamba was found ($CONDA_EXE, $MAMBA_EXE, PATH)",
                              "install miniforge or micromamba, or use --env-backend venv")
        self.exe = found
        self.python_spec = python
        if channels is None:  # micromamba has no default channel
            channels = ("conda-forge",) if "micromamba" in self.exe.name else ()
        self.channels = tuple(channels)

    def options(self) -> dict[str, Any]:
        return {"python": self.python_spec, "channels": list(self.channels)}

    def _activate(self) -> dict[str, str]:
        return {"CONDA_PREFIX": str(self.path), "CONDA_DEFAULT_ENV": str(self.path),
                "CONDA_SHLVL": "1"}

    def _build(self, target: Path) -> None:
        argv: list[str] = [str(self.exe), "create", "--yes", "--prefix", str(target)]
        for ch in self.channels:
            argv += ["-c", ch]
        argv.append(f"python={self.python_spec}")
        env = {k: v for k, v in os.environ.items() if k not in ISOLATION_STRIP}
        self._run(argv, env=env)


BACKENDS: dict[str, type[Env]] = {"venv": VenvEnv, "uv": UvEnv, "conda": CondaEnv}


def available_backends(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The backends usable here: venv always, uv when on PATH, conda when found."""
    out = ["venv"]
    if which("uv", environ if environ is not None else os.environ):
        out.append("uv")
    if find_conda(environ) is not None:
        out.append("conda")
    return tuple(out)


def make_env(kind: str, path: str | os.PathLike[str], **opts: Any) -> Env:
    """The ``Env`` of backend ``kind`` at ``path`` (not created yet; call ``create()``)."""
    cls = BACKENDS.get(kind)
    if cls is None:
        raise ConfigError(f"unknown environment backend {kind!r}",
                          f"use one of: {', '.join(BACKENDS)}")
    return cls(path, **opts)
