"""``verify-kernel``: am I really comparing stock against patched?

For each tree's environment: which library its own python loads (probe, /proc/self/maps,
sha256 against the build manifest), how many UBLKPF each paged-attention instantiation has
in that library's SASS, and -- where a GPU is present -- whether the builds' outputs are
bitwise equal. Every check is ``pass``, ``fail`` or ``not checked``; only checks that ran
can pass, and the verdict passes only when every check that ran passed.

``verify`` first gathers, in parallel: the probes, each library's facts (``facts``: from the
cache, or a worker process that disassembles it) and the GPU identity passes. It then judges
every check one by one in a fixed order from what was gathered, so neither ``jobs`` nor the
cache can change the report."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import VerifyError
from ..hashing import MAX_LIBRARY_BYTES, sha256_file
from ..kernels.policy import TWIN_SHAPES
from ..reading import load_json
from ..runner import run
from ..workspace.ownership import private_dir
from ..workspace.workdir import TAG_FILE, Workdir, write_json_atomic
from .facts import (
    ElfFacts,
    LibraryFacts,
    SassFacts,
    from_entry,
    load_cached,
    tool_identity,
)
from .machine_code import (
    MODULE_CHECK,
    NO_CUOBJDUMP,
    check_gqa_twin,
    check_identical_attention,
    check_launch_bounds,
    check_module_state,
    check_pdl_order,
    check_readonly_path,
    check_sass,
    check_unbounded_copies,
    kernel_changed,
)
from .manifests import (
    manifest_env_path,
    manifest_python,
    newest_manifests,
    python_gone,
    python_problem,
    python_refused,
)
from .numerics import NO_CUDA_DEVICE
from .report import VerifyReport


def _inside(path: str | None, roots: list[str]) -> bool:
    roots = [r for r in roots if r]  # "" would be realpath's current folder
    if not path:
        return False
    rp = os.path.realpath(path)
    return any(rp == os.path.realpath(r) or rp.startswith(os.path.realpath(r) + os.sep)
               for r in roots)


def probe_env(python: str, env_path: str, what: str) -> dict[str, Any]:
    """Run the provenance probe with the env's own python from an empty temp directory."""
    from ..machine.envs import ISOLATION_STRIP

    script = Path(__file__).resolve().parent.parent / "probe" / "provenance.py"
    environ = {k: v for k, v in os.environ.items() if k not in ISOLATION_STRIP}
    environ["PYTHONNOUSERSITE"] = "1"
    with private_dir("probe") as cwd:
        res = run([python, str(script), what], env=environ, cwd=cwd, echo=False, check=False)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        return {"errors": [f"probe exited {res.returncode}: {res.output.strip()[-600:]}"]}
    try:
        data = json.loads(lines[-1])
    except ValueError:
        data = None
    if not isinstance(data, dict):  # a python printing some other '{' line (ninth pass)
        return {"errors": [f"probe printed no record: {lines[-1][:300]}"]}
    return data


def check_provenance(rep: VerifyReport, tree: str, manifest: dict[str, Any], probe: dict[str, Any],
                     tree_path: str) -> str | None:
    """Record the provenance checks for one tree; return the loaded library path."""
    env_path = manifest_env_path(manifest)
    kernels = manifest.get("mode") in ("kernels-only", "overlay")
    loaded_info = probe.get("kernels") if kernels else probe.get("vllm")
    loaded = (loaded_info or {}).get("so_file" if kernels else "c_file")
    rep.add("interpreter inside its env", tree, _inside(probe.get("prefix"), [env_path]),
            f"sys.prefix={probe.get('prefix')} env={env_path}")
    if not loaded:
        rep.add("loads its library", tree, False,
                "nothing loaded: " + "; ".join(probe.get("errors", [])))
        return None
    mapped = loaded in probe.get("mapped", [])
    rep.add("loads its own library", tree, _inside(loaded, [env_path, tree_path]) and mapped,
            f"{loaded} ({'mapped' if mapped else 'NOT in /proc/self/maps'})")
    sha = (loaded_info or {}).get("so_sha256" if kernels else "c_sha256")
    rep.add("library matches the build manifest", tree, sha == manifest.get("so_sha256"),
            f"loaded sha256 {str(sha)[:16]}… manifest {str(manifest.get('so_sha256'))[:16]}…")
    if kernels:
        compiled = (loaded_info or {}).get("compiled_build_info") or {}
        rep.add("library was compiled from this tree", tree,
                compiled.get("tree") == tree and compiled.get("key") == manifest.get("key"),
                f"baked-in build info: tree={compiled.get('tree')} key={compiled.get('key')}")
    return str(loaded)


def _identity_run(workdir: Path, trees: list[str], extra_env: dict[str, str] | None
                  ) -> tuple[dict[str, Any] | None, str]:
    with private_dir("identity") as td:
        out = Path(td) / "identity.json"
        argv = [sys.executable, "-m", "kvprefetch.verify.numerics", "--workdir", str(workdir),
                "--json", str(out)]
        for t in trees:
            argv += ["--tree", t]
        env = {**os.environ, **extra_env} if extra_env else None
        res = run(argv, env=env, echo=False, check=False, cwd=td)
        data = load_json(out) if out.is_file() else None
    return data, f"exit {res.returncode}: {res.output.strip()[-400:]}"


IdentityResult = tuple[dict[str, Any] | None, str]


def _twin_env(twin: str | None) -> dict[str, str] | None:
    return {"KVPREFETCH_GQA": twin} if twin else None


def check_gpu(rep: VerifyReport, workdir: Path, trees: list[str], no_gpu: bool,
              twin: str | None = None, result: IdentityResult | None = None) -> None:
    """Bitwise-equal outputs across the builds (kvprefetch.verify.numerics). ``twin`` (e.g. "2x2"):
    a pass with KVPREFETCH_GQA=<twin>, so the launchers run that GQA-grouped twin for every case
    it can take (in `auto` each identity case reaches only the twin its grid picks). ``result``:
    that pass's ``_identity_run`` when it already ran (verify starts them early, in parallel)."""
    name = (f"bitwise-equal outputs on the GPU, twin {twin} forced (KVPREFETCH_GQA={twin})"
            if twin else "bitwise-equal outputs on the GPU")
    if no_gpu:
        rep.add(name, "all", None, "skipped (--no-gpu)")
        return
    data, crash = result if result is not None else _identity_run(workdir, trees, _twin_env(twin))
    if data is None:
        rep.add(name, "all", False, f"the identity check crashed ({crash})")
        return
    if twin:
        rep.gpu_twins[twin] = data
    else:
        rep.gpu = data
    status = data.get("status")
    if status == "not checked":
        rep.add(name, "all", None, data.get("reason") or "no GPU")
        return
    rep.add(name, "all", status == "passed",
            f"{data.get('checked')} cases checked, {data.get('failed')} failed, "
            f"{data.get('not_checked')} not compiled in; device {data.get('device')}")


def check_hot_path(rep: VerifyReport, manifests: dict[str, dict[str, Any]]) -> None:
    full = [t for t, m in manifests.items() if m.get("mode") in ("full", "overlay")]
    if not full:
        rep.add("V0 + XFORMERS dispatch reaches paged_attention", "all", None,
                "kernels-only builds have no vLLM engine; run it with full builds")
    else:
        rep.add("V0 + XFORMERS dispatch reaches paged_attention", "all", None,
                "needs a GPU and full or overlay builds: run `kvprefetch bench e2e`, which sets "
                "VLLM_USE_V1=0 VLLM_ATTENTION_BACKEND=XFORMERS")
    # The warning is about running vLLM from this shell; kernels-only builds have no vLLM to run.
    if full and (os.environ.get("VLLM_USE_V1", "") != "0"
                 or os.environ.get("VLLM_ATTENTION_BACKEND") != "XFORMERS"):
        rep.envs["warning"] = ("without VLLM_USE_V1=0 and VLLM_ATTENTION_BACKEND=XFORMERS a vLLM "
                               "run never calls paged_attention_v1/v2: the patched kernel would be "
                               "bypassed")


def _driver_stub(wd: Workdir, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """None where an NVIDIA driver is loadable; else the no-device libcuda.so.1 built for the
    driver imports of the env's vllm/_C.abi3.so (overlay.driverstub)."""
    from ..overlay.driverstub import driver_loadable, ensure_stub

    if driver_loadable():
        return None
    so_path = str(manifest.get("so_path") or "")
    # the env's files only: a relative so_path was globbed from the working folder, and one
    # outside the work directory had nm read a library there (issue 41, the thirty-second
    # hostile pass)
    problem = python_problem(so_path, wd.root, what="library")
    if problem is not None:
        raise VerifyError(f"the build manifest of tree {str(manifest.get('tree'))[:64]!r} "
                          f"{problem}; kvprefetch reads no library a record names outside its "
                          "environments", "rerun `kvprefetch build --mode overlay`")
    site = Path(so_path).parent.parent
    vllm_c = next(iter(sorted(site.glob("vllm/_C*.so"))), None)
    if vllm_c is None:
        raise VerifyError(f"no vllm/_C*.so in {site} (the overlay env of "
                          f"{manifest.get('tree')})", "rerun `kvprefetch build --mode overlay`")
    d, symbols = ensure_stub(vllm_c, wd.root / "verify" / "driver-stub", root=wd.root)
    return {"dir": str(d), "symbols": symbols, "for": str(vllm_c)}


Progress = Callable[[str], None]


@dataclass(frozen=True)
class _Library:
    """A library some tree loads, to disassemble once however many trees load it."""

    path: str      # as the probe saw it loaded
    sha256: str


def _library_facts(lib: _Library, cache_dir: Path, tools: Mapping[str, str | None]
                   ) -> tuple[LibraryFacts | str, bool]:
    """The library's facts from the cache, else from a worker process
    (``python -m kvprefetch.verify.facts``, which stores them in the cache); or why there are
    none. Second: whether the cache answered."""
    cached = load_cached(cache_dir, lib.sha256, tools)
    if cached is not None:
        return cached, True
    with private_dir("facts") as td:
        out = Path(td) / "facts.json"
        res = run([sys.executable, "-m", "kvprefetch.verify.facts", lib.path, "--out", str(out),
                   "--cache", str(cache_dir), "--root", str(cache_dir.parent.parent)],
                  echo=False, check=False, cwd=td)
        try:
            data = load_json(out)
        except (OSError, ValueError):
            data = None
    facts = from_entry(data, lib.sha256, tools) if data is not None else None
    if facts is None:
        return (f"the disassembly worker for {lib.path} failed (exit {res.returncode}): "
                f"{res.output.strip()[-300:]}"), False
    return facts, False


def _no_cuda_device(data: dict[str, Any] | None) -> bool:
    """Whether an identity pass stopped at numerics.run_identity's first question."""
    return (data is not None and data.get("status") == "not checked"
            and str(data.get("reason", "")).startswith(NO_CUDA_DEVICE))


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    t0 = time.monotonic()
    return fn(*args), time.monotonic() - t0


def _probe_checked(m: dict[str, Any], root: Path) -> dict[str, Any]:
    """``_probe_tree``, for a manifest whose interpreter is one of the work directory's own
    environments' (``_python_problem``); else the probe's error, and nothing is run."""
    why = python_refused(m, root)
    return {"errors": [why]} if why else _probe_tree(m)


def _probe_tree(m: dict[str, Any]) -> dict[str, Any]:
    gone = python_gone(m)
    if gone:
        return {"errors": [gone]}
    return probe_env(manifest_python(m), manifest_env_path(m),
                     "kernels" if m.get("mode") in ("kernels-only", "overlay") else "vllm")


def _loaded_library(tree: str, m: dict[str, Any], probe: dict[str, Any], tree_path: str
                    ) -> _Library | None:
    """The library the probe saw loaded (what check_provenance returns), hashed."""
    so = check_provenance(VerifyReport(""), tree, m, probe, tree_path)
    if not so:
        return None
    try:  # bounded: a sparse 15 TB library was hashed for hours (the nineteenth pass)
        return _Library(so, sha256_file(so, limit=MAX_LIBRARY_BYTES))
    except OSError as exc:
        raise VerifyError(f"cannot hash {so}, the library {tree}'s environment loaded: "
                          f"{exc.strerror}",
                          f"rebuild {tree}: a library is a regular file of at most a few "
                          "GiB") from None


def _unknown_trees(wd: Workdir, unknown: list[str], built: list[str]) -> VerifyError:
    """``--trees`` named a tree with no build: a name the work directory does not know (a typo:
    list the known ones), or a fetched tree not built yet (build it)."""
    fetched = [t for t in unknown if t in wd.existing_trees()]
    typos = [t for t in unknown if t not in fetched]
    if typos:
        return VerifyError(
            f"unknown tree{'s' if len(typos) > 1 else ''} {', '.join(map(repr, typos))}: the "
            f"trees built in {wd.root} are {', '.join(built) or 'none'}",
            f"pass built trees to --trees ({','.join(built) or 'build some first'}), or leave "
            "--trees out to verify every built tree")
    return VerifyError(f"the tree{'s' if len(fetched) > 1 else ''} {', '.join(fetched)} "
                       f"{'were' if len(fetched) > 1 else 'was'} fetched but never built in "
                       f"{wd.root}", "run `kvprefetch build` first")


def verify(workdir: Path, *, trees: list[str] | None = None, no_gpu: bool = False,
           jobs: int | None = None, progress: Progress | None = None) -> VerifyReport:
    """Run every check and write ``<workdir>/verify/report.json``.

    The slow parts run first, at most ``jobs`` at a time (default: one per CPU): the probes,
    then one disassembly worker per library not in the cache, and the GPU identity passes. The
    checks are then judged one by one in a fixed order from what those gathered, so the report
    does not depend on ``jobs`` or on the cache. ``progress`` receives one line per step."""
    from ..machine.toolchain import find_cuobjdump

    say: Progress = progress or (lambda _msg: None)
    t_start = time.monotonic()
    # its folders above resolved, its own name never followed (the command line followed a
    # link the user named already): a campaign's work/ swapped for a link after that had the
    # report written into the folder the link named (issue 41, the nineteenth hostile pass);
    # confine refuses the link now
    named = Path(os.path.abspath(workdir))
    wd = Workdir(Path(os.path.realpath(named.parent)) / named.name)
    manifests = newest_manifests(wd)
    if trees:
        wanted = [wd.resolve_tree(t) for t in trees]
        unknown = [t for t in wanted if t not in manifests]
        if unknown:
            raise _unknown_trees(wd, unknown, list(manifests))
        manifests = {t: m for t, m in manifests.items() if t in wanted}
    if not manifests and not wd.is_tagged():
        # it said to build, which builds into a new work directory there: the wrong way for a
        # --workdir that named another folder (issue 41, the thirty-first hostile pass)
        raise VerifyError(f"{wd.root} is not a kvprefetch work directory (no {TAG_FILE}): "
                          "verify-kernel reads the builds of one",
                          "pass --workdir the folder `kvprefetch fetch` and `kvprefetch build` "
                          "used")
    if "baseline" not in manifests or len(manifests) < 2:
        raise VerifyError(f"verify-kernel needs built baseline and patched trees; found builds "
                          f"for {sorted(manifests) or 'none'} in {wd.root}",
                          "run `kvprefetch build` (or `kvprefetch build --kernels-only`) first")
    rep = VerifyReport(str(wd.root))
    jobs = max(1, jobs or os.cpu_count() or 1)
    overlay_trees = [t for t, m in manifests.items() if m.get("mode") == "overlay"]
    tools = find_cuobjdump(dict(os.environ))
    tool_id = tool_identity(tools) if tools is not None else {}
    cache_dir = wd.root / "verify" / "cache"
    identity: dict[str | None, IdentityResult] = {}
    facts: dict[str, LibraryFacts | str] = {}
    probes: dict[str, dict[str, Any]] = {}
    libraries: dict[str, _Library | None] = {}
    say(f"verify-kernel: {len(manifests)} trees ({', '.join(manifests)}), {jobs} job(s) at a time")

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        # 1. Probes, each tree's own python; a library goes to its disassembly worker as soon
        # as the first tree that loads it has been probed.
        t0 = time.monotonic()
        pending: dict[Future[Any], tuple[str, str]] = {
            pool.submit(_timed, _probe_checked, m, wd.root): ("probe", t)
            for t, m in manifests.items()}
        run_identity = not overlay_trees and not no_gpu
        if run_identity:
            pending[pool.submit(_timed, _identity_run, wd.root, list(manifests), None)] = (
                "identity", "")
        submitted: set[str] = set()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                kind, what = pending.pop(fut)
                result, secs = fut.result()
                if kind == "probe":
                    probes[what] = result
                    lib = _loaded_library(what, manifests[what], result, str(wd.tree(what)))
                    libraries[what] = lib
                    loads = f"loads {lib.path}" if lib else "loads no library"
                    say(f"  probed {what} ({secs:.1f} s): {loads}")
                    if lib is not None and tools is not None and lib.sha256 not in submitted:
                        submitted.add(lib.sha256)
                        pending[pool.submit(_timed, _library_facts, lib, cache_dir, tool_id)] = (
                            "facts", lib.sha256)
                elif kind == "facts":
                    got, hit = result
                    facts[what] = got
                    who = ", ".join(t for t, lb in libraries.items() if lb and lb.sha256 == what)
                    how = ("from the cache" if hit else
                           "cuobjdump -sass/-elf and parsed" if not isinstance(got, str) else
                           "FAILED")
                    say(f"  machine code of {who}: {how} ({secs:.1f} s)")
                else:
                    identity[None] = result
                    say("  GPU identity check: no CUDA device here, not checked "
                        f"({secs:.1f} s)" if _no_cuda_device(result[0]) else
                        f"  GPU identity check ran ({secs:.1f} s)")
        rep.timing["gather_s"] = round(time.monotonic() - t0, 1)

        # 2. The forced-twin identity passes, for builds with twins (known from their SASS).
        twins_built = any(not isinstance(f, str) and f.sass is not None and f.sass.twins
                          for f in facts.values())
        if run_identity and twins_built:
            t0 = time.monotonic()
            names = [f"{g}x{s}" for g, s, _ in TWIN_SHAPES]
            base = identity.get(None, (None, ""))[0]
            if _no_cuda_device(base):
                # The pass found no CUDA device in this (the kit's) python before loading any
                # build; the forced-twin passes differ only in KVPREFETCH_GQA, which nothing
                # reads until a kernel launches, so they would find the same: reuse its answer
                # (5 torch imports cost ~20 s of CPU on 2 cores, for one fact).
                assert base is not None
                identity.update({n: identity[None] for n in names})
                say("  GPU identity check, forced twins: no CUDA device here either")
            else:
                for n in names:  # one at a time on the GPU, as before
                    identity[n] = _identity_run(wd.root, list(manifests), _twin_env(n))
                    say(f"  GPU identity check, twin {n} forced, ran")
            rep.timing["identity_twins_s"] = round(time.monotonic() - t0, 1)

    # 3. Judge, in a fixed order.
    _judge(rep, wd, manifests, probes, libraries, facts, identity, tools is not None, no_gpu)
    rep.timing["total_s"] = round(time.monotonic() - t_start, 1)
    write_json_atomic(rep.report_path, rep.to_dict(), root=wd.root)
    return rep


def _judge(rep: VerifyReport, wd: Workdir, manifests: dict[str, dict[str, Any]],
           probes: dict[str, dict[str, Any]], libraries: dict[str, _Library | None],
           facts: dict[str, LibraryFacts | str], identity: dict[str | None, IdentityResult],
           have_tools: bool, no_gpu: bool) -> None:
    loaded: dict[str, tuple[str, str]] = {}
    sass_facts_: dict[str, SassFacts] = {}
    elf_facts_: dict[str, ElfFacts] = {}
    for tree, m in manifests.items():
        probe = probes[tree]
        rep.envs[tree] = probe
        so = check_provenance(rep, tree, m, probe, str(wd.tree(tree)))
        lib = libraries.get(tree)
        if so and lib is not None:
            loaded[tree] = (os.path.realpath(so), lib.sha256)
            variant = None if tree == "baseline" else str(m.get("variant") or "prefetch")
            got = facts.get(lib.sha256)
            if not have_tools:
                rep.add("UBLKPF in SASS", tree, None, NO_CUOBJDUMP)
                rep.add(MODULE_CHECK, tree, None, NO_CUOBJDUMP)
            elif got is None or isinstance(got, str):
                rep.add("UBLKPF in SASS", tree, False, got or "no disassembly")
                rep.add(MODULE_CHECK, tree, False, got or "no disassembly")
            else:
                if got.sass is not None:
                    sass_facts_[tree] = check_sass(rep, tree, so, variant, got.sass)
                else:
                    rep.add("UBLKPF in SASS", tree, False, str(got.sass_error))
                if got.elf is not None:
                    elf_facts_[tree] = got.elf
                else:
                    rep.add(MODULE_CHECK, tree, False, str(got.elf_error))
        else:
            rep.add("UBLKPF in SASS", tree, None, "no library was loaded")
    for tree, m in manifests.items():
        if tree == "baseline" or tree not in sass_facts_ or "baseline" not in sass_facts_:
            continue
        variant = str(m.get("variant") or "prefetch")
        mine, base = sass_facts_[tree], sass_facts_["baseline"]
        check_identical_attention(rep, tree, mine, base, variant)
        if any(kernel_changed(k[1], variant, True) for k in mine.bodies):
            check_readonly_path(rep, tree, variant, mine, base)
        if tree in elf_facts_ and "baseline" in elf_facts_:
            check_module_state(rep, tree, variant, elf_facts_[tree], elf_facts_["baseline"])
            check_launch_bounds(rep, tree, variant, elf_facts_[tree])
        check_gqa_twin(rep, tree, variant, mine)
        check_unbounded_copies(rep, tree, variant, mine, base)
        check_pdl_order(rep, tree, mine)
    overlay_trees = [t for t, m in manifests.items() if m.get("mode") == "overlay"]
    if overlay_trees:
        from ..overlay.verify import check_overlay

        stub = _driver_stub(wd, manifests[overlay_trees[0]])
        for tree in overlay_trees:
            check_overlay(rep, tree, manifests[tree], stub, manifest_python(manifests[tree]),
                          python_refused(manifests[tree], wd.root))
    files = [v[0] for v in loaded.values()]
    shas = [v[1] for v in loaded.values()]
    if len(loaded) >= 2:
        rep.add("environments load different libraries", "all",
                len(set(files)) == len(files) and len(set(shas)) == len(shas),
                "; ".join(f"{t}: {f} ({s[:12]}…)" for t, (f, s) in loaded.items()))
    trees = list(manifests)
    if overlay_trees:
        # The overlay libraries are built against the environments' torch 2.8.0 and cannot
        # load into this (the kit's) interpreter, where the identity check runs.
        rep.add("bitwise-equal outputs on the GPU", "all", None,
                "not run for overlay environments (their libraries are built against the "
                "envs' torch 2.8.0); run it on kernels-only builds, or `kvprefetch bench e2e`")
    else:
        check_gpu(rep, wd.root, trees, no_gpu, result=identity.get(None))
    if not overlay_trees and any(rep.sass.get(t, {}).get("gqa_twins") for t in manifests):
        for g, s, _ in TWIN_SHAPES:
            n = f"{g}x{s}"
            check_gpu(rep, wd.root, trees, no_gpu, twin=n, result=identity.get(n))
    check_hot_path(rep, manifests)
