"""Loading the compiled paged-attention ops and calling them exactly the way vLLM 0.10.2 does.

A kernels-only build (``kvprefetch build --kernels-only``) leaves one shared library per tree,
``<workdir>/build/<tree>/<key>/kvprefetch_<tree>_C.so``, with a ``manifest.json`` beside it. Each
library registers ``torch.ops.kvprefetch_<tree>.paged_attention_v1/_v2`` with vLLM's own schemas
(csrc/torch_bindings.cpp L45-69), so several trees load into one process side by side.

This module owns:
- ``BuiltOps`` / ``find_builds``: the manifests on disk (no torch needed);
- ``PagedOps`` / ``load_ops``: one loaded variant, its schema checked against vLLM's;
- ``choose_kernel`` / ``forward_decode``: vLLM's ``PagedAttention.forward_decode``
  (vllm/attention/ops/paged_attn.py L122-212) with an optional ``force`` of v1 or v2.

torch is imported inside functions only, so importing this module never touches CUDA.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BenchError
from ..hashing import MAX_LIBRARY_BYTES, sha256_file
from ..reading import load_json
from ..upstream import TREE_NAME, resolve_tree_name

# vLLM: "Should be the same as PARTITION_SIZE in `paged_attention_v2_launcher`" (paged_attn.py L21).
PARTITION_SIZE = 512
# vLLM: "For context len > 8192, use V2 kernel to avoid shared memory shortage." (L131-133)
V1_MAX_SEQ_LEN = 8192
# vLLM: use v1 when "the number of sequences or heads is large" (num_seqs * num_heads > 512).
V1_MIN_PARALLEL_WORK = 512

TREE_ORDER = ("baseline", "patched", "paper", "seed")

# The argument lists of csrc/torch_bindings.cpp L45-69 as (type, name); "Tensor!" = mutated.
_COMMON_ARGS: tuple[tuple[str, str], ...] = (
    ("Tensor", "query"), ("Tensor", "key_cache"), ("Tensor", "value_cache"),
    ("int", "num_kv_heads"), ("float", "scale"), ("Tensor", "block_tables"),
    ("Tensor", "seq_lens"), ("int", "block_size"), ("int", "max_seq_len"),
    ("Tensor?", "alibi_slopes"), ("str", "kv_cache_dtype"), ("Tensor", "k_scale"),
    ("Tensor", "v_scale"), ("int", "tp_rank"), ("int", "blocksparse_local_blocks"),
    ("int", "blocksparse_vert_stride"), ("int", "blocksparse_block_size"),
    ("int", "blocksparse_head_sliding_step"),
)
V1_SCHEMA_ARGS: tuple[tuple[str, str], ...] = (("Tensor!", "out"), *_COMMON_ARGS)
V2_SCHEMA_ARGS: tuple[tuple[str, str], ...] = (
    ("Tensor!", "out"), ("Tensor!", "exp_sums"), ("Tensor!", "max_logits"), ("Tensor!", "tmp_out"),
    *_COMMON_ARGS,
)

# kv_cache_dtype strings vLLM's DISPATCH_BY_KV_CACHE_DTYPE accepts, and what each one means.
KV_CACHE_DTYPE_ALIASES = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3",
                          "fp8_e5m2": "fp8_e5m2"}


def vllm_schema(name: str, args: Sequence[tuple[str, str]]) -> str:
    """The schema string vLLM registers (whitespace-normalised)."""
    return f"{name}(" + ", ".join(f"{t} {n}" for t, n in args) + ") -> ()"


V1_SCHEMA = vllm_schema("paged_attention_v1", V1_SCHEMA_ARGS)
V2_SCHEMA = vllm_schema("paged_attention_v2", V2_SCHEMA_ARGS)


def parse_schema_args(schema: str) -> list[tuple[str, str]]:
    """``ns::op(Tensor(a!) out, Tensor? x, int n) -> ()`` -> ``[("Tensor!", "out"), ...]``.
    torch prints mutation as an alias annotation (``Tensor(a!)``, or ``Tensor($0! -> )`` for a
    schema declared with a bare ``Tensor!``); vLLM writes ``Tensor!``."""
    m = re.search(r"\((.*)\)\s*->", schema, re.DOTALL)
    if m is None:
        raise ValueError(f"not an operator schema: {schema!r}")
    out: list[tuple[str, str]] = []
    for part in (p.strip() for p in m.group(1).split(",")):
        if not part:
            continue
        typ, _, name = part.rpartition(" ")
        typ = re.sub(r"\([^()]*!.*?\)", "!", typ.replace(" ", ""))
        typ = re.sub(r"\([^()]*\)", "", typ)
        out.append((typ, name.split("=")[0]))
    return out


def schema_mismatch(schema: str, expected: Sequence[tuple[str, str]]) -> str | None:
    """None when ``schema`` has exactly vLLM's arguments, else a one-line description."""
    got = parse_schema_args(schema)
    if got == list(expected):
        return None
    # strict=False: the counts may differ; a differing argument in the common prefix is named
    # first, else the count is
    for i, (g, e) in enumerate(zip(got, expected, strict=False)):
        if g != e:
            return f"argument {i}: expected '{e[0]} {e[1]}', found '{g[0]} {g[1]}'"
    return f"expected {len(expected)} arguments, found {len(got)}"


_QUERY_TOKENS = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def compiled_combos(kv_dtypes: Iterable[str]) -> frozenset[tuple[str, str]]:
    """The (query dtype, canonical kv_cache_dtype) pairs a build's ``kv_dtypes`` stand for, in
    the build's vocabulary (kvprefetch.kernels.selection): ``fp16``/``bf16``/``fp32`` = that query
    dtype with an ``auto`` cache; ``fp8`` (= ``fp8_e4m3``) and ``fp8_e5m2`` = an fp8 cache for each
    selected query dtype (fp16 and bf16 when none is selected). ``auto`` in the list means an
    ``auto`` cache for every query dtype."""
    toks = {"fp8" if k == "fp8_e4m3" else k for k in kv_dtypes}
    queries = [q for t, q in _QUERY_TOKENS.items() if t in toks] or ["float16", "bfloat16"]
    out = {(q, "auto") for t, q in _QUERY_TOKENS.items() if t in toks}
    if "auto" in toks:
        out |= {(q, "auto") for q in _QUERY_TOKENS.values()}
    if "fp8" in toks:
        out |= {(q, "fp8_e4m3") for q in queries}
    if "fp8_e5m2" in toks:
        out |= {(q, "fp8_e5m2") for q in queries}
    return frozenset(out)


@dataclass(frozen=True)
class BuiltOps:
    """One kernels-only build on disk, as its manifest.json describes it."""

    tree: str
    variant: str
    namespace: str
    so_path: Path
    so_sha256: str
    head_sizes: tuple[int, ...]
    block_sizes: tuple[int, ...]
    kv_dtypes: tuple[str, ...]
    manifest_path: Path

    def supports(self, head_size: int, block_size: int, kv_cache_dtype: str,
                 dtype: str | None = None) -> bool:
        """Whether this build instantiates the kernel for that shape and dtype pair."""
        kv = KV_CACHE_DTYPE_ALIASES.get(kv_cache_dtype, kv_cache_dtype)
        combos = compiled_combos(self.kv_dtypes)
        dtype_ok = any(k == kv and (dtype is None or q == dtype) for q, k in combos)
        return head_size in self.head_sizes and block_size in self.block_sizes and dtype_ok

    def to_dict(self) -> dict[str, Any]:
        return {"tree": self.tree, "variant": self.variant, "namespace": self.namespace,
                "so_path": str(self.so_path), "so_sha256": self.so_sha256,
                "head_sizes": list(self.head_sizes), "block_sizes": list(self.block_sizes),
                "kv_dtypes": list(self.kv_dtypes), "manifest_path": str(self.manifest_path)}


MANIFEST_KEYS = ("tree", "variant", "namespace", "so_path", "so_sha256", "head_sizes",
                 "block_sizes", "kv_dtypes")


MANIFEST_FIX = ("rebuild the tree with `kvprefetch build --kernels-only` (or move that build "
                "folder out of build/)")


MAX_MANIFEST_BYTES = 16 << 20


def _load_manifest(path: Path) -> Any:
    """The JSON in ``path``, read as a regular file of bounded size (a FIFO, device or
    /dev/zero symlink never hangs or fills memory); ValueError otherwise."""
    try:
        return load_json(Path(path), MAX_MANIFEST_BYTES)
    except OSError as exc:
        raise ValueError(str(exc)) from None


def _typed(path: Path, data: dict[str, Any], key: str, kind: type) -> Any:
    """``data[key]`` when it is a ``kind`` (a list: of ``kind`` items), else a BenchError."""
    value = data[key]
    items = value if isinstance(value, list) else None
    ok = (items is not None and all(isinstance(v, kind) and not isinstance(v, bool)
                                    for v in items)) if key in _LIST_KEYS else \
        isinstance(value, kind)
    if not ok:
        want = (f"a list of {_KIND_NAMES[kind][0]}" if key in _LIST_KEYS
                else _KIND_NAMES[kind][1])
        raise BenchError(f"build manifest {path} is corrupt: {key!r} is not {want}",
                         MANIFEST_FIX)
    return value


_LIST_KEYS = ("head_sizes", "block_sizes", "kv_dtypes")
_KIND_NAMES = {int: ("whole numbers", "a whole number"), str: ("strings", "a string")}


def read_manifest(path: Path) -> BuiltOps:
    """Parse one kernels-only manifest. ``so_path`` may be relative to the manifest's folder.
    A manifest that is unreadable, not a JSON object, or has a field of the wrong type is a
    BenchError naming the file (never a traceback)."""
    try:
        data = _load_manifest(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BenchError(f"cannot read build manifest {path}: {exc}", MANIFEST_FIX) from None
    if not isinstance(data, dict):
        raise BenchError(f"build manifest {path} is corrupt: not a JSON object", MANIFEST_FIX)
    missing = [k for k in MANIFEST_KEYS if k not in data]
    if missing:
        raise BenchError(f"build manifest {path} lacks {', '.join(missing)}",
                         "rebuild with `kvprefetch build --kernels-only`")
    strs = {k: _typed(path, data, k, str)
            for k in ("tree", "variant", "namespace", "so_path", "so_sha256")}
    if not strs["so_path"] or "\0" in strs["so_path"]:
        raise BenchError(f"build manifest {path} is corrupt: 'so_path' is not a path",
                         MANIFEST_FIX)
    if not TREE_NAME.match(strs["tree"]):
        # the tree's name becomes a file name: bench ncu's ncu-<shape>-<tree>.log and .csv,
        # and a `tree` of ../../../../x had the log appended, and ncu's CSV written, in a
        # folder outside the work directory (issue 41, the twenty-third hostile pass)
        raise BenchError(f"build manifest {path} is corrupt: its tree {strs['tree'][:80]!r} "
                         "is not a tree name (letters, digits and _)", MANIFEST_FIX)
    so = Path(strs["so_path"])
    if not so.is_absolute():
        so = Path(path).parent / so
    return BuiltOps(
        tree=strs["tree"], variant=strs["variant"], namespace=strs["namespace"],
        so_path=so, so_sha256=strs["so_sha256"],
        head_sizes=tuple(_typed(path, data, "head_sizes", int)),
        block_sizes=tuple(_typed(path, data, "block_sizes", int)),
        kv_dtypes=tuple(_typed(path, data, "kv_dtypes", str)), manifest_path=Path(path),
    )


def _tree_rank(tree: str) -> tuple[int, str]:
    return (TREE_ORDER.index(tree) if tree in TREE_ORDER else len(TREE_ORDER), tree)


def _check_library_inside(workdir: Path, manifest: Path, so_path: Path) -> None:
    """A BenchError unless the library a manifest names is a file of the work directory (real
    paths: a link out of it is outside). A manifest is data (the threat model): one naming
    ``/tmp/x/evil.so`` with its sha256 had ``bench kernel`` load it, running its constructors,
    from outside the work directory (issue 41, the thirty-second hostile pass). A ``build/``
    that is a link (a user's larger disk, which the build builds through) is the work
    directory's too: whoever could point it elsewhere could as well plant the library inside."""
    real, root = os.path.realpath(so_path), os.path.realpath(workdir)
    homes = {root, os.path.realpath(os.path.join(workdir, "build"))}
    if not any(real.startswith(h.rstrip("/") + "/") for h in homes):
        raise BenchError(f"build manifest {manifest} is corrupt: it names the library "
                         f"{str(so_path)[:200]!r}, outside the work directory {root}; kvprefetch "
                         "loads no library a record names outside it", MANIFEST_FIX)


def find_builds(workdir: Path, trees: Iterable[str] | None = None) -> list[BuiltOps]:
    """The kernels-only builds under ``<workdir>/build/*/*/manifest.json`` whose library exists:
    the newest manifest per tree, baseline first, then patched, paper, the rest by name.
    A wanted ``seed`` or ``paper`` finds the paper's tree under either name.
    Manifests without a ``namespace`` (full builds) are not kernels-only builds and are skipped,
    and so is one that cannot be read as JSON (not a regular file, too large, nested too deep,
    not JSON), as it always was; a kernels-only manifest with a field of the wrong type is a
    BenchError naming it (as one lacking a field is)."""
    newest: dict[str, tuple[float, BuiltOps]] = {}
    for path in sorted(Path(workdir).glob("build/*/*/manifest.json")):
        try:
            raw = _load_manifest(path)
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(raw, dict) or "namespace" not in raw or "so_path" not in raw:
            continue
        built = read_manifest(path)
        try:
            present = built.so_path.is_file()
        except OSError as exc:
            # a name past NAME_MAX/PATH_MAX (ENAMETOOLONG) or a folder on the way that cannot
            # be entered: `is_file` raises those, and the command line's fix for a long path
            # sent the user to shorten the --workdir or campaign folder they typed (issue 41,
            # the twenty-third hostile pass), where the manifest named it
            raise BenchError(f"build manifest {path} names the library "
                             f"{str(built.so_path)[:200]!r}, which cannot be looked at "
                             f"({exc.strerror})", MANIFEST_FIX) from None
        if not present:
            continue
        _check_library_inside(Path(workdir), path, built.so_path)
        mtime = path.stat().st_mtime
        if built.tree not in newest or mtime > newest[built.tree][0]:
            newest[built.tree] = (mtime, built)
    wanted = ({resolve_tree_name(t, newest) for t in trees} if trees is not None else None)
    found = [b for _, b in newest.values() if wanted is None or b.tree in wanted]
    return sorted(found, key=lambda b: _tree_rank(b.tree))


@dataclass(frozen=True)
class PagedOps:
    """One loaded variant: the two ops plus where they came from."""

    name: str
    namespace: str
    v1: Callable[..., Any] = field(repr=False)
    v2: Callable[..., Any] = field(repr=False)
    build: BuiltOps | None = None

    def supports(self, head_size: int, block_size: int, kv_cache_dtype: str,
                 dtype: str | None = None) -> bool:
        """Ops without a manifest (registered in-process) are assumed complete."""
        return self.build is None or self.build.supports(head_size, block_size,
                                                         kv_cache_dtype, dtype)


def ops_from_namespace(namespace: str, name: str | None = None,
                       build: BuiltOps | None = None) -> PagedOps:
    """Wrap ``torch.ops.<namespace>.paged_attention_v1/_v2`` after checking both schemas."""
    import torch

    ns = getattr(torch.ops, namespace)
    found: list[Any] = []
    for op_name, expected in (("paged_attention_v1", V1_SCHEMA_ARGS),
                              ("paged_attention_v2", V2_SCHEMA_ARGS)):
        try:
            packet = getattr(ns, op_name)
        except (AttributeError, RuntimeError) as exc:
            raise BenchError(f"torch.ops.{namespace} has no {op_name}",
                             "rebuild with `kvprefetch build --kernels-only`; the library must "
                             f"register TORCH_LIBRARY({namespace}, ...)") from exc
        problem = schema_mismatch(str(packet.default._schema), expected)
        if problem is not None:
            raise BenchError(f"torch.ops.{namespace}.{op_name} does not have vLLM 0.10.2's "
                             f"schema ({problem})",
                             "rebuild; the registration source must copy csrc/torch_bindings.cpp")
        found.append(packet)
    return PagedOps(name=name or namespace, namespace=namespace, v1=found[0], v2=found[1],
                    build=build)


_LOADED: dict[str, Path] = {}


def load_library(so_path: Path, namespace: str, name: str | None = None,
                 build: BuiltOps | None = None) -> PagedOps:
    """``torch.ops.load_library(so_path)`` and wrap its ops. Loading the same file twice is a
    no-op; a second file claiming an already-loaded namespace is refused (torch would abort).
    Both refusals come before torch is imported: they are about the files, not torch."""
    so_path = Path(so_path).resolve()
    if not so_path.is_file():
        raise BenchError(f"kernel library {so_path} does not exist",
                         "run `kvprefetch build --kernels-only` first")
    prev = _LOADED.get(namespace)
    if prev is not None and prev != so_path:
        raise BenchError(f"namespace {namespace} is already loaded from {prev}, not {so_path}",
                         "give each tree its own namespace (kvprefetch_<tree>)")
    if prev is None:
        import torch

        try:
            # torch declares load_library without annotations (torch/_ops.py)
            torch.ops.load_library(str(so_path))  # type: ignore[no-untyped-call]
        except (OSError, RuntimeError) as exc:
            raise BenchError(f"cannot load {so_path}: {exc}",
                             "rebuild it against this python's torch "
                             f"({torch.__version__}); a .so built for another torch won't load") \
                from exc
        _LOADED[namespace] = so_path
    return ops_from_namespace(namespace, name=name, build=build)


def load_build(built: BuiltOps, check_hash: bool = True) -> PagedOps:
    """Load a manifest's library after checking its sha256 against the manifest."""
    if check_hash and built.so_path.is_file():
        try:  # bounded: a sparse 15 TB library was hashed for hours (the nineteenth pass)
            actual = sha256_file(built.so_path, limit=MAX_LIBRARY_BYTES)
        except OSError as exc:
            raise BenchError(f"cannot hash {built.so_path}: {exc.strerror}",
                             "rebuild that tree: a library is a regular file of at most a "
                             "few GiB") from None
        if actual != built.so_sha256:
            raise BenchError(f"{built.so_path} has sha256 {actual}, its manifest says "
                             f"{built.so_sha256}",
                             "the library changed after the build; rebuild that tree")
    return load_library(built.so_path, built.namespace, name=built.tree, build=built)


def load_builds(workdir: Path, trees: Iterable[str] | None = None) -> list[PagedOps]:
    builds = find_builds(workdir, trees)
    if not builds:
        raise BenchError(f"no kernels-only builds found under {Path(workdir) / 'build'}",
                         "run `kvprefetch build --kernels-only` (on this machine, against this "
                         "python's torch)")
    return [load_build(b) for b in builds]


def num_partitions(max_seq_len: int) -> int:
    return (max_seq_len + PARTITION_SIZE - 1) // PARTITION_SIZE


def choose_kernel(max_seq_len: int, num_seqs: int, num_heads: int) -> str:
    """vLLM 0.10.2's rule (paged_attn.py L122-135): v1 when ``max_seq_len <= 8192`` and either a
    single partition or ``num_seqs * num_heads > 512``; otherwise v2."""
    use_v1 = max_seq_len <= V1_MAX_SEQ_LEN and (
        num_partitions(max_seq_len) == 1 or num_seqs * num_heads > V1_MIN_PARALLEL_WORK)
    return "v1" if use_v1 else "v2"


@dataclass(frozen=True)
class DecodeArgs:
    """Everything ``PagedAttention.forward_decode`` takes, in vLLM's order."""

    query: Any
    key_cache: Any
    value_cache: Any
    block_tables: Any
    seq_lens: Any
    max_seq_len: int
    kv_cache_dtype: str
    num_kv_heads: int
    scale: float
    alibi_slopes: Any
    k_scale: Any
    v_scale: Any


def forward_decode(ops: PagedOps, args: DecodeArgs, *, force: str | None = None,
                   out: Any = None,
                   workspace: tuple[Any, Any, Any] | None = None) -> tuple[Any, str]:
    """Mirror of vLLM's ``PagedAttention.forward_decode`` (non-block-sparse, tp_rank 0).
    Returns ``(output, "v1"|"v2")``. ``out`` and the v2 ``workspace`` (tmp_output, exp_sums,
    max_logits) may be preallocated, e.g. to keep allocations out of a CUDA graph capture."""
    import torch

    q = args.query
    output = torch.empty_like(q) if out is None else out
    block_size = args.value_cache.shape[3]
    num_seqs, num_heads, head_size = q.shape
    if force not in (None, "v1", "v2"):
        raise BenchError(f"force must be v1 or v2, not {force!r}", "pass --force-kernel v1|v2")
    kernel = force or choose_kernel(args.max_seq_len, num_seqs, num_heads)
    tail = (args.block_tables, args.seq_lens, block_size, args.max_seq_len, args.alibi_slopes,
            args.kv_cache_dtype, args.k_scale, args.v_scale, 0, 0, 0, 64, 0)
    if kernel == "v1":
        ops.v1(output, q, args.key_cache, args.value_cache, args.num_kv_heads, args.scale, *tail)
        return output, kernel
    if PARTITION_SIZE % block_size != 0:
        raise BenchError(f"block size {block_size} does not divide PARTITION_SIZE {PARTITION_SIZE}",
                         "use block size 8, 16 or 32")
    if workspace is None:
        workspace = v2_workspace(num_seqs, num_heads, head_size, args.max_seq_len,
                                 output.dtype, output.device)
    tmp_output, exp_sums, max_logits = workspace
    ops.v2(output, exp_sums, max_logits, tmp_output, q, args.key_cache, args.value_cache,
           args.num_kv_heads, args.scale, *tail)
    return output, kernel


def v2_workspace(num_seqs: int, num_heads: int, head_size: int, max_seq_len: int,
                 dtype: Any, device: Any) -> tuple[Any, Any, Any]:
    """v2's scratch tensors exactly as vLLM allocates them: tmp_output (output dtype),
    exp_sums and max_logits (float32), all ``[num_seqs, num_heads, max_num_partitions, ...]``."""
    import torch

    parts = num_partitions(max_seq_len)
    tmp_output = torch.empty((num_seqs, num_heads, parts, head_size), dtype=dtype, device=device)
    exp_sums = torch.empty((num_seqs, num_heads, parts), dtype=torch.float32, device=device)
    max_logits = torch.empty_like(exp_sums)
    return tmp_output, exp_sums, max_logits
