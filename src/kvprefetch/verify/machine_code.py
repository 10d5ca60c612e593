"""``verify-kernel``'s checks of the machine code: where the in-kernel prefetch, the launch
bounds and the GQA twins are in each library's SASS and ELF, that every kernel no rule changes
is instruction-identical to stock's, that the K/V loads keep the read-only path, that modules
hold only what their kernels use, and that programmatic dependents wait before they touch
memory. Each check reads the facts ``facts`` extracted (or a listing, in the tests) and adds
its verdict to the report."""

from __future__ import annotations

from collections.abc import Callable

from ..kernels.policy import (
    FUSED_MAX_HEAD_SIZE,
    FUSED_TWINS,
    LAUNCHER_PREFETCH_VARIANTS,
    STAGED_SPLITS,
    changes_kernel,
    has_unbounded_copy,
    min_blocks,
    prefetches_in,
    twin_shapes,
)
from .facts import ElfFacts, SassFacts, elf_facts, sass_facts
from .report import VerifyReport
from .sass import (
    KernelSass,
    arch_number,
    decode_kernel_name,
    decode_unbounded_name,
    judge,
    summarise,
)

NO_CUOBJDUMP = ("cuobjdump not found (install the CUDA toolkit, or `pip install "
                "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`)")


def _sass(listing: str | SassFacts) -> SassFacts:
    """A ``cuobjdump -sass`` listing's facts (facts.py); the checks accept either."""
    return listing if isinstance(listing, SassFacts) else sass_facts(listing)


def _elf(listing: str | ElfFacts) -> ElfFacts:
    return listing if isinstance(listing, ElfFacts) else elf_facts(listing)


def _expects(variant: str | None) -> Callable[[KernelSass], bool]:
    return lambda k: prefetches_in(variant, k.version, k.kv_cache, k.head_size, k.block_size,
                                   k.dtype)


def _rules(name: str, variant: str | None) -> tuple[bool, int, bool] | None:
    """What the variant's rules do to the paged_attention kernel ``name``: (in-kernel prefetch,
    launch-bound minBlocks, changed from stock at all); None for any other function."""
    meta = decode_kernel_name(name)
    if meta is None:
        return None
    version, kv_cache, dtype = str(meta["version"]), str(meta["kv_cache"]), str(meta["dtype"])
    head, block = int(meta["head_size"]), int(meta["block_size"])  # type: ignore[call-overload]
    return (prefetches_in(variant, version, kv_cache, head, block, dtype),
            min_blocks(variant, version, kv_cache, head, block, dtype),
            changes_kernel(variant, version, kv_cache, head, block, dtype))


def _kernel_selected(name: str, variant: str | None, prefetching: bool) -> bool:
    """Whether the variant puts its in-kernel prefetch into kernel ``name`` (== prefetching)."""
    rules = _rules(name, variant)
    return rules is not None and rules[0] == prefetching


def kernel_changed(name: str, variant: str | None, changed: bool) -> bool:
    """Whether the variant compiles kernel ``name`` differently from stock (a prefetch in it or
    a launch bound; == changed)."""
    rules = _rules(name, variant)
    return rules is not None and rules[2] == changed


def check_sass(rep: VerifyReport, tree: str, so: str, variant: str | None,
               text: str | SassFacts) -> SassFacts:
    """Count UBLKPF per instantiation and judge it against the variant; returns the facts."""
    facts = _sass(text)
    patched = variant is not None and variant != "stock"
    kernels = list(facts.kernels)
    expects = _expects(variant)
    verdict = judge(kernels, patched=patched, expects=expects)
    chosen = [k for k in kernels if patched and expects(k)]
    rep.sass[tree] = {"library": so, "variant": variant or "stock", "kernels": verdict.kernels,
                      "with_prefetch": verdict.with_prefetch, "problems": list(verdict.problems),
                      "prefetching_kernels": len(chosen), "table": summarise(kernels)}
    if not chosen:
        expect = "0 UBLKPF in every attention kernel"
    elif len(chosen) == len(kernels):
        expect = "≥2 UBLKPF (K and V) in every sm_90+ kernel"
    else:
        expect = (f"≥2 UBLKPF (K and V) in the {len(chosen)} sm_90+ kernels that carry this "
                  f"variant's in-kernel prefetch, 0 in the other {len(kernels) - len(chosen)}")
    detail = f"{verdict.kernels} kernels, {verdict.with_prefetch} with UBLKPF; expected {expect}"
    if verdict.problems:
        detail += "; " + "; ".join(verdict.problems[:5])
    rep.add("UBLKPF in SASS", tree, verdict.ok, detail)
    if variant in LAUNCHER_PREFETCH_VARIANTS:
        pk = facts.prefetch
        hopper = {k: n for k, n in pk.items() if arch_number(k[0]) >= 90}
        rep.sass[tree]["prefetch_kernels"] = {f"{a} {n}": c for (a, n), c in pk.items()}
        rep.add("L2 prefetch kernel carries UBLKPF", tree,
                bool(hopper) and all(n >= 2 for n in hopper.values()),
                f"{len(hopper)} sm_90+ kv_l2_prefetch_kernel instantiation(s), UBLKPF "
                f"{sorted(set(hopper.values())) or 'none'} (expected >= 2: K and V)")
    return facts


def check_identical_attention(rep: VerifyReport, tree: str, text: str | SassFacts,
                              baseline: str | SassFacts, variant: str | None = "launch") -> None:
    """The attention kernels a variant leaves alone (all of them for `launch`; all but the
    prologue kernels and the launch-bounded v1 kernels for `prefetch`) must be
    instruction-identical to stock: compare each one's SASS with the baseline library's,
    instruction by instruction. The sm_90+ kernels it changes must differ (else the change did
    not take effect: a bound that did not reach the kernel, say; before sm_90 the prologue
    compiles to nothing, so a kernel there may equal stock's). Bodies are compared by the
    sha256 of their instructions (facts.py)."""
    bodies, base_bodies = _sass(text).bodies, _sass(baseline).bodies
    mine = {k: v for k, v in bodies.items() if kernel_changed(k[1], variant, False)}
    base = {k: v for k, v in base_bodies.items() if kernel_changed(k[1], variant, False)}
    common = sorted(mine.keys() & base.keys())
    differing = [k[1][:60] for k in common if mine[k] != base[k]]
    changed = sorted(k for k in bodies.keys() & base_bodies.keys()
                     if kernel_changed(k[1], variant, True) and arch_number(k[0]) >= 90)
    unchanged = [k[1][:60] for k in changed if bodies[k] == base_bodies[k]]
    ok = bool(common or changed) and not differing and not unchanged and mine.keys() == base.keys()
    rep.add("attention kernels identical to stock", tree, ok,
            f"the {len(common)} kernels {variant} leaves stock compared, {len(differing)} differ"
            + (f" (e.g. {differing[0]}…)" if differing else "")
            + f"; of the {len(changed)} it changes, {len(unchanged)} identical to stock"
            + (f" (e.g. {unchanged[0]}…)" if unchanged else "")
            + ("" if mine.keys() == base.keys() else "; the instantiation sets differ"))


UNBOUNDED_CHECK = "stock's code beside every bounded v1 kernel"


def check_unbounded_copies(rep: VerifyReport, tree: str, variant: str | None,
                           text: str | SassFacts, baseline: str | SassFacts) -> None:
    """Stock's unbounded copies (csrc/kvprefetch/stock_v1.cuh unbounded_v1_kernel), which the
    v1 launcher runs where the launch bound would cost a wave: one beside each instantiation
    the variant bounds (policy.has_unbounded_copy) and nowhere else, each
    instruction-identical to the baseline library's kernel of the same instantiation (so what
    runs there is stock's code, schedule included)."""
    def key(arch: str, meta: dict[str, object]) -> tuple[object, ...]:
        return (arch, meta["dtype"], meta["kv_cache"], meta["head_size"], meta["block_size"],
                meta["block_sparse"])
    v1 = {key(a, meta): (body, meta) for (a, n), body in _sass(baseline).bodies.items()
          if (meta := decode_kernel_name(n)) is not None and meta["version"] == "v1"}
    stock = {k: body for k, (body, _) in v1.items()}
    want = {k for k, (_, meta) in v1.items()
            if has_unbounded_copy(variant, "v1", str(meta["kv_cache"]),
                                  int(meta["head_size"]),  # type: ignore[call-overload]
                                  int(meta["block_size"]),  # type: ignore[call-overload]
                                  str(meta["dtype"]))}
    got = {key(a, meta): body for (a, n), body in _sass(text).bodies.items()
           if (meta := decode_unbounded_name(n)) is not None}
    differ = sorted(str(k) for k in got.keys() & want if got[k] != stock.get(k))
    rep.sass.setdefault(tree, {})["unbounded_copies"] = len(got)
    detail = (f"{len(got)} unbounded copies, {len(want)} expected (one per bounded v1 "
              f"instantiation); {len(got.keys() - want)} unexpected, {len(want - got.keys())} "
              f"missing, {len(differ)} not instruction-identical to stock"
              + (f" (e.g. {differ[0]})" if differ else ""))
    rep.add(UNBOUNDED_CHECK, tree, got.keys() == want and not differ, detail)


MODULE_CHECK = "modules hold only what their kernels use"


def check_module_state(rep: VerifyReport, tree: str, variant: str, elf: str | ElfFacts,
                       baseline_elf: str | ElfFacts) -> None:
    """What a module holds besides its kernels (``cubin.py``): no more modules with a user
    ``__constant__`` bank than stock has, and the prologue's device state only in modules with
    a kernel the variant prefetches in. Instruction-identical kernels measured slower on the
    H200 in modules that broke either rule."""
    mine, base = _elf(elf).modules, _elf(baseline_elf).modules
    banks = sum(m.constant_bank for m in mine)
    stock_banks = sum(m.constant_bank for m in base)
    stray = [m for m in mine if m.holds_state
             and not any(_kernel_selected(k, variant, True) for k in m.kernels)]
    detail = (f"{len(mine)} modules; a user __constant__ bank in {banks} (stock: {stock_banks}); "
              f"prologue state in {sum(m.holds_state for m in mine)}")
    if stray:
        kinds = sorted({f"{meta['version']} head {meta['head_size']}" for m in stray
                        for meta in map(decode_kernel_name, m.kernels) if meta})
        detail += (f", {len(stray)} of them without a kernel that prefetches ({stray[0].arch}: "
                   f"{', '.join(kinds) or 'no attention kernel'})")
    rep.add(MODULE_CHECK, tree, bool(mine) and banks <= stock_banks and not stray, detail)


BOUNDS_CHECK = "launch bounds where the rule puts them"
VLLM_NUM_THREADS = 128  # paged_attention_v1/v2 launch 128 threads per CTA


def check_launch_bounds(rep: VerifyReport, tree: str, variant: str, elf: str | ElfFacts) -> None:
    """Every attention kernel the variant's rule bounds (policy.min_blocks) carries
    ``__launch_bounds__(128, …)`` in its module (``EIATTR_MAX_THREADS`` = 128 in
    ``cuobjdump -elf``), and no other attention kernel carries any: the bound reached the
    binary, and only where it was measured."""
    seen, bounded, wrong = 0, 0, []
    for mod in _elf(elf).modules:
        declared = dict(mod.max_threads)
        for name in mod.kernels:
            rules, meta = _rules(name, variant), decode_kernel_name(name)
            if rules is None or meta is None:
                continue
            seen += 1
            want = rules[1] > 0
            got = declared.get(name)
            bounded += got is not None
            if got != (VLLM_NUM_THREADS if want else None):
                wrong.append(f"{mod.arch} {meta['version']} head {meta['head_size']} block "
                             f"{meta['block_size']} {meta['dtype']}/{meta['kv_cache']}: "
                             f"{'bound ' + str(got) if got is not None else 'no bound'}, "
                             f"expected {'128' if want else 'none'}")
    detail = (f"{seen} attention kernels, {bounded} declared __launch_bounds__; "
              f"{len(wrong)} not as the rule says" + (f" ({wrong[0]})" if wrong else ""))
    rep.add(BOUNDS_CHECK, tree, seen > 0 and not wrong, detail)


def check_readonly_path(rep: VerifyReport, tree: str, variant: str, text: str | SassFacts,
                        baseline: str | SassFacts) -> None:
    """An in-kernel prefetch or a launch bound must not cost the K/V loads their read-only
    path: per kernel the variant changes, as many ``LDG….CONSTANT`` as stock. Required of
    ``prefetch``; for ``seed`` (the paper's asm, which captures the cache pointer) the loss is
    reported, not failed."""
    mine = {k: n for k, n in _sass(text).readonly.items() if kernel_changed(k[1], variant, True)}
    base = _sass(baseline).readonly
    common = sorted(mine.keys() & base.keys())
    lost = [k for k in common if mine[k] < base[k]]
    rep.sass.setdefault(tree, {})["readonly_loads"] = {
        "kernels": len(common), "kernels_with_fewer": len(lost),
        "stock_total": sum(base[k] for k in common), "total": sum(mine[k] for k in common)}
    detail = (f"{len(common)} changed kernels compared; read-only (.CONSTANT) "
              f"loads {sum(mine[k] for k in common)} vs stock {sum(base[k] for k in common)}; "
              f"{len(lost)} kernels have fewer"
              + (f" (e.g. {lost[0][1][:60]}…: {mine[lost[0]]} vs {base[lost[0]]})" if lost else ""))
    if variant in ("paper", "seed"):  # seed: the paper's variant's name before the rename
        rep.add("K/V loads keep the read-only path", tree, None,
                f"not required of the seed variant (its asm captures the cache pointer): {detail}")
        return
    rep.add("K/V loads keep the read-only path", tree, bool(common) and not lost, detail)


TWIN_CHECK = "GQA twins where the rule puts them"


def check_gqa_twin(rep: VerifyReport, tree: str, variant: str | None,
                   text: str | SassFacts) -> None:
    """The GQA-grouped twins (csrc/kvprefetch/gqa_twins.cuh) are compiled exactly beside the
    attention instantiations policy.twin_shapes names, with those (G, S), and nowhere else; and
    every global load in them takes the read-only path (``LDG….CONSTANT``), as stock's K/V loads do,
    or, in a twin built to launch as a programmatic dependent, is ordered (strong,
    ``LDG….STRONG.SM`` or ``….STRONG.GPU``: the loads of what an earlier kernel may write, kept
    after the wait; see check_pdl_order)."""
    facts = _sass(text)
    want = {(k.arch, k.version, k.dtype, k.kv_cache, k.head_size, k.block_size, g, s)
            for k in facts.kernels if not k.block_sparse
            for g, s in twin_shapes(variant, k.version, k.kv_cache, k.head_size, k.block_size,
                                    k.dtype)}
    twins = facts.twins
    def shapes(keep) -> set[tuple]:
        return {(a, m["version"], m["dtype"], m["kv_cache"], m["head_size"], m["block_size"],
                 m["group"], m["split"]) for (a, _), (m, _, _) in twins.items() if keep(m)}
    plain_twins = shapes(lambda m: not m["staged"] and not m["fused"])
    staged, fused = shapes(lambda m: m["staged"]), shapes(lambda m: m["fused"])
    # A staged twin (its S in STAGED_SPLITS; a build with KVPREFETCH_TWIN_STAGE=0 has none) and
    # a fused one (a v2 twin in FUSED_TWINS up to FUSED_MAX_HEAD_SIZE; none with
    # KVPREFETCH_TWIN_FUSE=0) only beside the plain instantiation.
    stray = ({w for w in staged if w not in want or w[-1] not in STAGED_SPLITS}
             | {w for w in fused if w not in want or w[1] != "v2" or w[-2:] not in FUSED_TWINS
                or w[4] > FUSED_MAX_HEAD_SIZE})
    plain = [n for (_, n), (_, loads, ro) in twins.items() if loads != ro]
    rep.sass.setdefault(tree, {})["gqa_twins"] = len(twins)
    detail = (f"{len(twins)} twin kernels ({len(staged)} staged, {len(fused)} fused), "
              f"{len(want)} expected plain; {len(plain_twins - want)} unexpected, "
              f"{len(want - plain_twins)} missing, {len(stray)} staged or fused off the rule; "
              f"{len(plain)} with a global load off the read-only or ordered path")
    rep.add(TWIN_CHECK, tree, plain_twins == want and not stray and not plain, detail)


PDL_CHECK = "twins wait for the previous kernel before touching memory"


def check_pdl_order(rep: VerifyReport, tree: str, text: str | SassFacts) -> None:
    """kvprefetch's twins and reduce kernels launched as programmatic dependents (ACQBULK in
    their SASS) wait for the stream's previous kernel before their first global memory
    instruction: what makes their early launch safe (csrc/kvprefetch/gqa_twins.cuh, pdl_start).
    Trees without such kernels get no row."""
    got = _sass(text).pdl
    if not got:
        return
    waiting = sum(1 for w, _ in got.values() if w)
    early = sorted(n for (_, n), (w, first) in got.items() if w and not first)
    rep.sass.setdefault(tree, {})["pdl_kernels"] = waiting
    detail = (f"{len(got)} twin/reduce kernels, {waiting} launched as programmatic dependents "
              f"(ACQBULK); {len(early)} touch global memory before waiting"
              + (f" (e.g. {early[0][:60]}…)" if early else ""))
    rep.add(PDL_CHECK, tree, not early, detail)
