"""What verify-kernel reads from one library's machine code, and the cache that keeps it.

Every SASS and module check asks a few facts per function: the paged-attention kernels with
their UBLKPF counts (``sass.parse_sass``), a digest of each function's instructions for the
comparisons with stock (``sass.function_bodies``), the read-only loads, the GQA twins, the
programmatic-dependent waits, the L2 prefetch kernels, and the modules of ``cuobjdump -elf``
(``cubin.parse_elf``). ``sass_facts`` and ``elf_facts`` compute them from the listings with
those same functions; the checks in ``kernel`` judge only these facts.

Why a cache: the listing of a library with vLLM's full instantiation set is about 550 MB, and
``cuobjdump -sass`` alone spends about 27 s of CPU on it, so four trees took minutes. The
facts of a library are a function of its bytes, of cuobjdump/nvdisasm and of the parsing code,
so they are kept as ``<workdir>/verify/cache/<sha256 of the library>.json``, written
atomically by the worker (``python -m kvprefetch.verify.facts``) that computed them. An entry
is used only when its library sha256, kit version, parser version (a hash of this module,
``sass.py`` and ``cubin.py``), tool identity (sha256 of the cuobjdump and nvdisasm binaries)
and payload digest all match; anything else is a miss, recomputed and rewritten. A failed
disassembly is never cached."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import VerifyError
from ..hashing import sha256_file
from ..reading import load_json
from ..workspace.confine import write_file
from .cubin import Module, parse_elf
from .sass import (
    KernelSass,
    function_bodies,
    parse_sass,
    pdl_waits,
    prefetch_kernels,
    readonly_loads,
    twin_kernels,
)

Key = tuple[str, str]  # (arch, mangled function name)
FORMAT = 1


@dataclass(frozen=True)
class SassFacts:
    """What the checks read from one ``cuobjdump -sass`` listing. Each mapping keeps the order
    of the function it was computed with (the report's JSON lists them in that order)."""

    kernels: tuple[KernelSass, ...]            # parse_sass
    bodies: Mapping[Key, str]                  # sha256 of each function_bodies value
    readonly: Mapping[Key, int]                # readonly_loads
    twins: Mapping[Key, tuple[dict[str, Any], int, int]]  # twin_kernels
    pdl: Mapping[Key, tuple[bool, bool]]       # pdl_waits
    prefetch: Mapping[Key, int]                # prefetch_kernels

    def to_dict(self) -> dict[str, Any]:
        def rows(m: Mapping[Key, Any]) -> list[list[Any]]:
            return [[a, n, list(v) if isinstance(v, tuple) else v] for (a, n), v in m.items()]
        return {"kernels": [dataclasses.asdict(k) for k in self.kernels],
                "bodies": rows(self.bodies), "readonly": rows(self.readonly),
                "twins": rows(self.twins), "pdl": rows(self.pdl), "prefetch": rows(self.prefetch)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SassFacts:
        def rows(name: str, conv: Any = lambda v: v) -> dict[Key, Any]:
            return {(_is(a, str), _is(n, str)): conv(v) for a, n, v in d[name]}
        return cls(kernels=tuple(_kernel(k) for k in d["kernels"]),
                   bodies=rows("bodies", lambda v: _is(v, str)),
                   readonly=rows("readonly", lambda v: _is(v, int)),
                   twins=rows("twins", lambda v: (_twin(v[0]), _is(v[1], int),
                                                  _is(v[2], int))),
                   pdl=rows("pdl", lambda v: (_is(v[0], bool), _is(v[1], bool))),
                   prefetch=rows("prefetch", lambda v: _is(v, int)))


def _is(value: Any, kind: type) -> Any:
    """``value`` when it is exactly of JSON's ``kind`` (a bool is no int here), else TypeError:
    a cache entry is data in the work directory, and one with a recomputed digest but a count
    of text, a list or Infinity was a hit, or an OverflowError (issue 41, sixth pass)."""
    if type(value) is not kind:
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    if type(value) is int and not -_INT_BOUND <= value < _INT_BOUND:
        raise ValueError("a number past 64 bits")
    return value


# A count or size in a listing fits 64 bits: an entry's number of 4,300 digits (JSON's most)
# summed with another was past Python's limit on digits, and verify-kernel's message of the
# sum a ValueError traceback (issue 41, the thirty-seventh hostile pass).
_INT_BOUND = 1 << 63


_KERNEL_TYPES = {"str": str, "int": int, "bool": bool}


def _kernel(k: Mapping[str, Any]) -> KernelSass:
    """A KernelSass whose every field has its declared type."""
    names = {f.name: _KERNEL_TYPES[str(f.type)] for f in dataclasses.fields(KernelSass)}
    if set(_is(k, dict)) != set(names):
        raise KeyError("the fields of a kernel")
    return KernelSass(**{n: _is(k[n], t) for n, t in names.items()})


# sass.decode_twin_name's template arguments, as the twin check reads them
_TWIN_TYPES = {"version": str, "dtype": str, "kv_cache": str, "head_size": int,
               "block_size": int, "group": int, "split": int, "staged": bool, "fused": bool}


def _twin(t: Any) -> dict[str, Any]:
    """A twin's template arguments with exactly ``_TWIN_TYPES``' fields and types: a cache
    entry with a recomputed digest whose twin held ``{}`` or a list was a KeyError or TypeError
    traceback in verify-kernel's twin check (issue 41, the thirty-sixth hostile pass)."""
    if set(_is(t, dict)) != set(_TWIN_TYPES):
        raise KeyError("the fields of a twin")
    return {n: _is(t[n], kind) for n, kind in _TWIN_TYPES.items()}


@dataclass(frozen=True)
class ElfFacts:
    """The modules of one ``cuobjdump -elf`` listing (``cubin.parse_elf``)."""

    modules: tuple[Module, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"modules": [dataclasses.asdict(m) for m in self.modules]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ElfFacts:
        def names(v: Any) -> tuple[str, ...]:
            if not isinstance(v, (list, tuple)):
                raise TypeError("expected a list of names")
            return tuple(_is(n, str) for n in v)
        return cls(tuple(Module(_is(m["arch"], str), names(m["kernels"]),
                                _is(m["constant_bank"], bool), names(m["state_symbols"]),
                                tuple((_is(k, str), _is(v, int)) for k, v in m["max_threads"]))
                         for m in d["modules"]))


def sass_facts(text: str) -> SassFacts:
    """The facts of a ``cuobjdump -sass`` listing, by sass.py's own parsers."""
    bodies = function_bodies(text)
    return SassFacts(
        kernels=tuple(parse_sass(text)),
        bodies={k: hashlib.sha256(v.encode()).hexdigest() for k, v in bodies.items()},
        readonly=readonly_loads(text), twins=twin_kernels(text), pdl=pdl_waits(text),
        prefetch=prefetch_kernels(text))


def elf_facts(text: str) -> ElfFacts:
    return ElfFacts(tuple(parse_elf(text)))


@functools.lru_cache(maxsize=1)
def parser_version() -> str:
    """A hash of the code that turns listings into facts: any change to it invalidates every
    cache entry, with no version number to remember to bump."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256(f"format {FORMAT}\n".encode())
    for name in ("facts.py", "sass.py", "cubin.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


def tool_identity(tools: Any) -> dict[str, str | None]:
    """The kit's version and the sha256 of the cuobjdump and nvdisasm that make the listings."""
    return {"kit": __version__, "cuobjdump": sha256_file(tools.cuobjdump),
            "nvdisasm": sha256_file(tools.nvdisasm) if tools.nvdisasm else None}


def _digest(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class LibraryFacts:
    """One library's facts, or why a listing could not be made (never cached)."""

    sha256: str
    sass: SassFacts | None
    elf: ElfFacts | None
    sass_error: str | None = None
    elf_error: str | None = None

    @property
    def complete(self) -> bool:
        return self.sass is not None and self.elf is not None


def entry(facts: LibraryFacts, tools: Mapping[str, str | None]) -> dict[str, Any]:
    payload = {"sass": facts.sass.to_dict() if facts.sass else None,
               "elf": facts.elf.to_dict() if facts.elf else None,
               "sass_error": facts.sass_error, "elf_error": facts.elf_error}
    return {"format": FORMAT, "sha256": facts.sha256, "parser": parser_version(),
            "tools": dict(tools), "digest": _digest(payload), "payload": payload}


def from_entry(data: Any, sha256: str, tools: Mapping[str, str | None]) -> LibraryFacts | None:
    """The facts in a cache entry or a worker's answer, or None when it does not belong to this
    library, this parser and these tools, or does not hold together (a torn or edited file)."""
    try:
        if (data["format"] != FORMAT or data["sha256"] != sha256
                or data["parser"] != parser_version() or data["tools"] != dict(tools)):
            return None
        payload = data["payload"]
        if data["digest"] != _digest(payload):
            return None
        return LibraryFacts(sha256,
                            SassFacts.from_dict(payload["sass"]) if payload["sass"] else None,
                            ElfFacts.from_dict(payload["elf"]) if payload["elf"] else None,
                            _error(payload["sass_error"]), _error(payload["elf_error"]))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError):
        return None


def _error(value: Any) -> str | None:
    return None if value is None else _is(value, str)


def cache_path(cache_dir: Path, sha256: str) -> Path:
    return cache_dir / f"{sha256}.json"


def load_cached(cache_dir: Path, sha256: str, tools: Mapping[str, str | None]
                ) -> LibraryFacts | None:
    """A complete, matching cache entry for the library with this sha256, or None."""
    path = cache_path(cache_dir, sha256)
    try:  # bounded, never a FIFO or device: an entry is data in the work directory (issue 41)
        data = load_json(path)
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    facts = from_entry(data, sha256, tools)
    return facts if facts is not None and facts.complete else None


def _write_atomic(path: Path, data: Mapping[str, Any], root: Path | None = None) -> None:
    """confine.write_file: never through a symlinked folder or file, checked from ``root`` (the
    work directory) down when given: ``verify/`` and ``verify/cache`` are in the work
    directory, which anyone who writes there may have swapped for a link (issue 41)."""
    write_file(path, json.dumps(data, separators=(",", ":")) + "\n", root=root,
               family=VerifyError)


def disassemble(so: str, tools: Any) -> LibraryFacts:
    """``cuobjdump -sass`` and ``-elf`` of ``so``, turned into facts; a listing that fails keeps
    the tail of cuobjdump's output as its error (what the checks report)."""
    from ..runner import run

    sha = sha256_file(so)
    from ..workspace.ownership import private_dir

    out: dict[str, Any] = {}
    for what, parse in (("-sass", sass_facts), ("-elf", elf_facts)):
        # cuobjdump's tmpxft_* files in a folder of its own, removed however it ends (a second
        # Ctrl-C SIGKILLs it; issue 41, the twelfth hostile pass)
        with private_dir("cuobjdump") as tmp:
            env = {**tools.environ(dict(os.environ)), "TMPDIR": str(tmp)}
            res = run([str(tools.cuobjdump), what, so], env=env, echo=False, check=False)
        if res.returncode != 0:
            out[what] = (None, f"cuobjdump failed: {res.output.strip()[-300:]}")
        else:
            out[what] = (parse(res.output), None)
        del res
        function_bodies.cache_clear()  # it keeps the last listings (~550 MB each) alive
    return LibraryFacts(sha, out["-sass"][0], out["-elf"][0], out["-sass"][1], out["-elf"][1])


def main(argv: list[str] | None = None) -> int:
    """``python -m kvprefetch.verify.facts SO --out FILE [--cache DIR]``: one library's facts as
    a worker process (verify-kernel runs one per library, in parallel). The answer goes to
    ``--out``; a complete answer is also stored in ``--cache``."""
    from ..machine.toolchain import find_cuobjdump

    ap = argparse.ArgumentParser(prog="python -m kvprefetch.verify.facts")
    ap.add_argument("so")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--root", type=Path, default=None,
                    help="the work directory holding --cache (nothing is written through a "
                         "symlink below it)")
    args = ap.parse_args(argv)
    tools = find_cuobjdump(dict(os.environ))
    if tools is None:
        print("cuobjdump not found", file=sys.stderr)
        return 2
    facts = disassemble(args.so, tools)
    data = entry(facts, tool_identity(tools))
    _write_atomic(args.out, data)
    if args.cache is not None and facts.complete:
        try:
            _write_atomic(cache_path(args.cache, facts.sha256), data, root=args.root)
        except (OSError, VerifyError) as exc:  # a read-only work directory, a symlinked
            # cache folder: the answer stands, uncached
            print(f"not cached: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
