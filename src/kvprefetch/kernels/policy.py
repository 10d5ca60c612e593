"""The launch policy in Python: the one statement, beside ``rules.py``, of what
``csrc/kvprefetch/launch_policy.cuh`` decides.

Which of vLLM's instantiations a variant changes (the v2 prologue, the v1 launch bounds, the GQA
twins compiled beside them), and what each launch runs: stock's unbounded v1 code or the
bounded kernel (``stock_v1_wins``), which twin ``auto`` picks (``twin_pick``), the staged twins'
ring (``stage_count``) and which reduction follows a v2 twin (``twin_reduces``). verify-kernel
reads its expectations of a binary from here, and the benchmark's reports explain their rows
with it. The numbers come from ``rules.inc`` (``kernels.rules``); the C++ logic is restated
function by function, and ``tests/integration/test_sass.py`` compiles the header into a host
program (``tests/samples/sass/policy_oracle.cu``) and checks that each function here that the
header also has decides as the header does, over generated inputs. Besides the header's rules: the
H200's measured occupancies the reports predict with, and the rules earlier runs were made under
(``legacy_*``, ``wave_guard=False`` ...), so that a result is explained by the rule it ran under."""

from __future__ import annotations

from .rules import rules

_RULES = rules()

# csrc/kvprefetch/launch_policy.cuh's prologue_rule: `prefetch` compiles its prologue only into
# v2 kernels with fp16 caches and at least this head size, or bf16 caches from it up to
# PROLOGUE_MAX_BF16_HEAD_SIZE, where one block's K takes at most PROLOGUE_MAX_K_REGISTERS
# registers per thread (k_registers; rules.inc).
PROLOGUE_MIN_HEAD_SIZE = _RULES.prologue_min_head_size
PROLOGUE_MAX_BF16_HEAD_SIZE = _RULES.prologue_max_bf16_head_size
PROLOGUE_MAX_K_REGISTERS = _RULES.prologue_max_k_registers


def k_registers(head_size: int, block_size: int, cache_bytes: int) -> int:
    """launch_policy.cuh's k_registers: 4-byte registers per thread that one block's K takes
    (the block's K over a warp's 32 lanes)."""
    return head_size * block_size * cache_bytes // (32 * 4)


def prefetches_in(variant: str | None, version: str, kv_cache: str, head_size: int,
                  block_size: int, dtype: str) -> bool:
    """Whether ``variant`` puts a bulk prefetch into this paged_attention instantiation
    (``dtype``: the query's, fp16 | bf16 | fp32); its other attention kernels must stay
    instruction-identical to stock unless a launch bound changes them (verify-kernel)."""
    if variant in (None, "stock", "launch", "control"):
        return False
    if variant == "prefetch":
        return (version == "v2" and kv_cache == "auto" and head_size >= PROLOGUE_MIN_HEAD_SIZE
                and k_registers(head_size, block_size, 2) <= PROLOGUE_MAX_K_REGISTERS
                and (dtype == "fp16"
                     or (dtype == "bf16" and head_size <= PROLOGUE_MAX_BF16_HEAD_SIZE)))
    return True  # paper, and any in-kernel variant of the paper's shape: every kernel


# csrc/kvprefetch/launch_policy.cuh's min_blocks_rule: `prefetch` declares the v1 kernels with
# fp16/bf16 caches and block size 16 __launch_bounds__(128, N), N keyed by head size
# (rules.inc's KVP_V1_MIN_BLOCKS); every other instantiation has no bound and must stay
# instruction-identical to stock.
V1_MIN_BLOCKS = dict(_RULES.v1_min_blocks)
RULE_BLOCK_SIZE = _RULES.rule_block_size


def min_blocks(variant: str | None, version: str, kv_cache: str, head_size: int,
               block_size: int, dtype: str) -> int:
    """The minBlocksPerMultiprocessor ``variant`` declares for this instantiation (0: none)."""
    if (variant != "prefetch" or version != "v1" or block_size != RULE_BLOCK_SIZE
            or kv_cache != "auto"
            or dtype not in ("fp16", "bf16")):
        return 0
    return V1_MIN_BLOCKS.get(head_size, 0)


# csrc/kvprefetch/stock_v1.cuh: beside every instantiation `prefetch` bounds, its launcher has
# stock's code unbounded (unbounded_v1_kernel), and runs it where stock_v1_wins says the bound
# could cost the grid a wave for some lengths. Runs made before that rule (``wave_guard=False``
# below; results without ``meta.wave_guard``) ran stock's code only for CTAs of at most
# LEGACY_SHORT_CHAIN_BLOCKS blocks whose whole grid took a wave more bounded (rules.inc's
# kShortChainBlocks until the graph call was measured).
LEGACY_SHORT_CHAIN_BLOCKS = 8


def has_unbounded_copy(variant: str | None, version: str, kv_cache: str, head_size: int,
                       block_size: int, dtype: str) -> bool:
    """Whether ``variant`` compiles stock's unbounded copy of this instantiation: exactly where
    it declares a launch bound."""
    return min_blocks(variant, version, kv_cache, head_size, block_size, dtype) > 0


def waves(ctas: int, sm_count: int, per_sm: int) -> int:
    """Rounds of ``per_sm`` CTAs on every SM a grid of ``ctas`` CTAs takes."""
    slots = max(sm_count, 1) * max(per_sm, 1)
    return -(-ctas // slots)


def more_waves_for_some(seqs: int, stock_per_seq: int, stock_per_sm: int, var_per_seq: int,
                        var_per_sm: int, sm_count: int) -> bool:
    """launch_policy.cuh's more_waves_for_some: whether, for some number L from 1 to ``seqs``
    of sequences as long as the longest (the rest one block), a variant of ``var_per_seq`` CTAs
    per sequence at ``var_per_sm`` per SM runs the long CTAs in more waves than stock's code
    of ``stock_per_seq`` at ``stock_per_sm``. No verdict (False) where a count is unknown (0).
    Written as the plain search over L; the header's closed form must agree with it (the CPU
    rule test compares them)."""
    if min(seqs, stock_per_seq, stock_per_sm, var_per_seq, var_per_sm) <= 0:
        return False
    sms = max(sm_count, 1)
    return any(waves(n * var_per_seq, sms, var_per_sm) > waves(n * stock_per_seq, sms,
                                                               stock_per_sm)
               for n in range(1, seqs + 1))


def stock_v1_wins(heads: int, seqs: int, sm_count: int, bounded_per_sm: int,
                  stock_per_sm: int) -> bool:
    """launch_policy.cuh's stock_v1_wins: a bounded v1 launch of ``heads`` x ``seqs`` CTAs runs
    stock's unbounded code where the bound holds fewer CTAs per SM than stock's code and some
    number of long sequences would give it more waves (more_waves_for_some)."""
    return (bounded_per_sm > 0 and stock_per_sm > bounded_per_sm
            and more_waves_for_some(seqs, heads, stock_per_sm, heads, bounded_per_sm, sm_count))


def legacy_stock_v1_wins(ctas: int, sm_count: int, bounded_per_sm: int, stock_per_sm: int,
                         cta_blocks: int) -> bool:
    """The rule before the wave guard (results without ``meta.wave_guard``): stock's code where
    the longest CTA has at most LEGACY_SHORT_CHAIN_BLOCKS blocks and the whole grid takes more
    waves bounded."""
    return (cta_blocks <= LEGACY_SHORT_CHAIN_BLOCKS and bounded_per_sm > 0
            and stock_per_sm > bounded_per_sm
            and waves(ctas, sm_count, bounded_per_sm) > waves(ctas, sm_count, stock_per_sm))


def changes_kernel(variant: str | None, version: str, kv_cache: str, head_size: int,
                   block_size: int, dtype: str) -> bool:
    """Whether ``variant`` compiles this instantiation differently from stock (a prefetch in it,
    or a launch bound); the others must be instruction-identical to stock."""
    return (prefetches_in(variant, version, kv_cache, head_size, block_size, dtype)
            or min_blocks(variant, version, kv_cache, head_size, block_size, dtype) > 0)


# csrc/kvprefetch/launch_policy.cuh's twin_rule and kTwins (rules.inc's KVP_TWIN): `prefetch`
# compiles the GQA-grouped twins (csrc/kvprefetch/gqa_twins.cuh: kvprefetch::gqa_decode_kernel
# with G query heads and S times stock's threads per CTA) beside the kernels whose (head size,
# block size) is in TWIN_AT (in v2, and in v1 where its third field says so), not block-sparse,
# with fp16 caches, or bf16 caches in v2 and in the v1 kernels without a launch bound; the
# launchers run one of them instead of vLLM's kernel. vLLM's own kernels are unchanged.
# (G, S, min_ctas_pct): `auto` runs the first twin whose min_ctas_pct the grid reaches, in
# stock CTAs per 100 SMs.
TWIN_SHAPES = tuple((t.group, t.split, t.min_ctas_pct) for t in _RULES.twins)
TWIN_AT = _RULES.twin_at
# gqa_twins.cuh's staged<G, S>: the twins of these S are also compiled staged (a shared-memory
# ring per warp), beside their unstaged instantiation, which the launcher runs where two ring
# slots per warp do not fit. A build with -DKVPREFETCH_TWIN_STAGE=0 has none.
STAGED_SPLITS = (_RULES.staged_split,)
STAGE_SLOTS = _RULES.stage_slots  # slots per warp of the ring
# gqa_twins.cuh's fusable: the v2 twins of these (G, S) are also compiled FUSED (the CTA of a
# (sequence, head group) that finishes last does v2's reduction), beside their plain
# instantiation, at head sizes up to FUSED_MAX_HEAD_SIZE (one thread of a 128-thread group per
# output element). A build with -DKVPREFETCH_TWIN_FUSE=0 has none.
FUSED_TWINS = ((_RULES.fused_group, _RULES.fused_split),)
FUSED_MAX_HEAD_SIZE = 128
_SMEM_PER_CTA = _RULES.smem_system_bytes + _RULES.smem_static_bytes


def twin_reduces(kernel: str, group: int, split: int, twin_ctas: int, sm_count: int) -> bool:
    """launch_policy.cuh's twin_reduces under the default KVPREFETCH_TWIN_FUSE=1: a v2 twin
    in FUSED_TWINS does the reduction itself on grids of more than half and at most all of the
    SMs' count of CTAs (the grids after which kvprefetch's own reduce kernel would not run,
    pdl_reduce_after); elsewhere a reduce kernel follows it."""
    return (kernel == "v2" and (group, split) in FUSED_TWINS
            and 2 * twin_ctas > sm_count and twin_ctas <= sm_count)


def stage_count(ctas: int, sm_count: int, smem_per_sm: int, fixed: int, cta_warps: int,
                chunk_bytes: int, blocks_per_cta: int, max_slots: int = STAGE_SLOTS) -> int:
    """launch_policy.cuh's stage_count: ring slots per warp a staged twin's launch gets (0: the
    launcher runs the unstaged twin). Per CTA the SM's shared memory over the CTAs it holds at
    once (the grid's per SM, at most stage_max_warps warps' worth), less the system's share,
    room for the static part (mbarriers, alignment) and `fixed` (the twin's other dynamic
    shared memory); at most 2 x ceil(blocks / warps) chunks and `max_slots`; fewer than two
    is 0."""
    per_sm = -(-ctas // max(sm_count, 1))
    resident = max(1, min(per_sm, _RULES.stage_max_warps // cta_warps))
    room = (smem_per_sm // resident - _SMEM_PER_CTA - fixed) // (cta_warps * chunk_bytes)
    need = 2 * -(-max(blocks_per_cta, 1) // cta_warps)
    slots = min(room, need, max_slots)
    return slots if slots >= 2 else 0


def twin_stage_slots(batch: int, context: int, kernel: str, group: int, split: int,
                     sm_count: int = 132, smem_per_sm: int = 233472) -> int:
    """Ring slots the launcher gives twin (group, split) on a Llama-3.1-8B decode step (32 query
    heads, 8 kv heads, head 128, block 16, fp16, every sequence `context` tokens), by the
    launchers' sizes: stock's shared memory (v1: the padded context's logits; v2: a partition's,
    or the output scratch if larger) G times, plus the V products of the warps beyond stock's
    (gqa_twins.cuh products_floats). Defaults: the H200."""
    if split not in STAGED_SPLITS:
        return 0
    blocks = -(-context // 16)
    logits = (blocks * 16 if kernel == "v1" else 512) * 4
    stock_smem = max(logits, (4 // 2) * 128 * 4)
    products = (split - 1) * 4 * group * 8 * 32 * 4  # floats -> bytes
    partitions = 1 if kernel == "v1" else -(-context // 512)
    ctas = 32 // group * batch * partitions
    return stage_count(ctas, sm_count, smem_per_sm, group * stock_smem + products, 4 * split,
                       128 * 16 * 2, blocks if kernel == "v1" else 512 // 16)


# The (head size, block size, v1 too) of the twins before rules.inc listed them (KVP_TWIN_AT):
# what a sampled result without its own ``twin_at`` was measured with.
TWIN_AT_BEFORE_LIST = ((128, 16, True),)


def twin_shapes(variant: str | None, version: str, kv_cache: str, head_size: int,
                block_size: int, dtype: str, block_sparse: bool = False,
                at: tuple[tuple[int, int, bool], ...] = TWIN_AT
                ) -> tuple[tuple[int, int], ...]:
    """(G, S) of each twin ``variant`` compiles beside this instantiation (none: empty); ``at``:
    the (head size, block size, v1 too) the twins are compiled at (rules.inc's, by default)."""
    bf16_ok = dtype == "bf16" and (
        version == "v2" or not min_blocks("prefetch", "v1", kv_cache, head_size, block_size, dtype))
    if (variant != "prefetch" or not (dtype == "fp16" or bf16_ok) or block_sparse
            or kv_cache != "auto"
            or not any((h, b) == (head_size, block_size) and (version == "v2" or v1)
                       for h, b, v1 in at)):
        return ()
    return tuple((g, s) for g, s, _ in TWIN_SHAPES)


# launch_policy.cuh's kStockWarps: warps per CTA of the instantiations that have twins.
STOCK_WARPS = 4


def chain_safe(group: int, split: int) -> bool:
    """launch_policy.cuh's chain_safe: the twin's longest chain of dependent block work (G / S
    times stock's) is no longer than stock's."""
    return group <= split


def auto_twin(ctas_pct: int, chain_safe_only: bool = False) -> tuple[int, int]:
    """(G, S) of the twin `auto` takes first for a grid of ``ctas_pct`` CTAs per 100 SMs, among
    the chain-safe twins only when ``chain_safe_only`` (twin_pick may move on from it, below)."""
    shapes = [t for t in TWIN_SHAPES if not chain_safe_only or chain_safe(t[0], t[1])]
    return next(((g, s) for g, s, lo in shapes if ctas_pct >= lo), shapes[-1][:2])


# The H200's SM count and shared memory per SM (cudaDevAttrMaxSharedMemoryPerMultiprocessor),
# and the most dynamic shared memory a CTA may opt into.
H200_SMS, H200_SMEM_PER_SM, H200_MAX_SMEM = 132, 233472, 232448
# CTAs of 128 threads per SM on the H200 of each launch-bounded v1 instantiation (fp16/bf16,
# block 16), by head size: (bounded, stock's code), from their registers (nvcc 13.0
# -res-usage: head 64 80/78 against 55/56, head 128 125/121 against 96, head 256 160/162
# against 164/168). The launcher asks the runtime for them (stock_v1.cuh); the report's
# prediction uses these.
H200_V1_CTAS = {64: (6, 9), 128: (4, 5), 256: (3, 3)}
# CTAs per SM of stock's code on the H200 where the twins are compiled, by (head size, block
# size, cache), what twin_pick compares a twin with (the launcher asks the runtime:
# stock_v1.cuh, gqa_twins.cuh), before shared memory limits them: v1 block 16 from
# H200_V1_CTAS (the unbounded copies), the rest from vLLM's kernels' registers (nvcc 13.0
# -res-usage; v1: head 64 block 32 fp16 50, bf16 96; v2: head 64 block 16 fp16 62, bf16 56,
# block 32 fp16 52, bf16 96, head 128 block 16 96).
H200_STOCK_V1_CTAS = {**{(h, 16, d): c[1] for h, c in H200_V1_CTAS.items()
                         for d in ("fp16", "bf16")},
                      (64, 32, "fp16"): 9, (64, 32, "bf16"): 5}
H200_STOCK_V2_CTAS = {(64, 16, "fp16"): 8, (64, 16, "bf16"): 9, (64, 32, "fp16"): 9,
                      (64, 32, "bf16"): 5, (128, 16, "fp16"): 5, (128, 16, "bf16"): 5}
STOCK_V1_CTAS = H200_STOCK_V1_CTAS[(128, 16, "fp16")]
# launch_policy.cuh's outlasts_stock, rules.inc's numbers: in units of stock's least CTA, a
# twin's least CTA, each further link of stock's longest chain, and an empty v2 CTA (percent).
TWIN_LEAST_CTA_PCT = _RULES.twin_least_cta_pct
CHAIN_LINK_PCT = _RULES.chain_link_pct
EMPTY_CTA_PCT = _RULES.empty_cta_pct


def v1_code_pick(head_size: int, batch: int, num_heads: int, context: int,
                 sm_count: int = H200_SMS, wave_guard: bool = True) -> str:
    """Which code a launch-bounded v1 instantiation runs for a launch (no twin) of ``batch``
    sequences (padded, under graph replay) whose max_seq_len is ``context``: ``stock`` (its
    unbounded copy) where stock_v1_wins says so at the H200's occupancies, lowered by the
    launch's shared memory, else ``bound``. ``wave_guard=False``: the rule before it."""
    bounded, stock = H200_V1_CTAS.get(head_size, (0, 0))
    fit = smem_ctas(H200_SMEM_PER_SM, stock_smem(context, "v1", head_size, RULE_BLOCK_SIZE))
    bounded, stock = min(bounded, fit), min(stock, fit)
    if not wave_guard:
        wins = legacy_stock_v1_wins(batch * num_heads, sm_count, bounded, stock,
                                    -(-context // RULE_BLOCK_SIZE))
    else:
        wins = stock_v1_wins(num_heads, batch, sm_count, bounded, stock)
    return "stock" if wins else "bound"


def twin_bound_ctas(split: int) -> int:
    """launch_policy.cuh's twin_bound_ctas: CTAs of a twin of S = ``split`` that its launch
    bound keeps resident on one SM (twin_bound_threads / (128 S))."""
    return _RULES.twin_bound_threads // (128 * split)


def smem_ctas(smem_per_sm: int, smem: int) -> int:
    """launch_policy.cuh's smem_ctas: CTAs of ``smem`` bytes of dynamic shared memory (plus the
    system's and the static part's share each) one SM of ``smem_per_sm`` bytes holds."""
    return smem_per_sm // (smem + _SMEM_PER_CTA)


def keeps_occupancy(split: int, twin_ctas: int, sm_count: int, smem: int,
                    smem_per_sm: int) -> bool:
    """launch_policy.cuh's keeps_occupancy: an SM holds two CTAs of ``smem`` bytes of dynamic
    shared memory wherever the twin's grid has two per SM to give it and its launch bound
    allows two; else one."""
    per_sm = -(-twin_ctas // max(sm_count, 1))
    return smem_ctas(smem_per_sm, smem) >= min(per_sm, twin_bound_ctas(split), 2)


def v_rows_per_thread(head_size: int, block_size: int) -> int:
    """gqa_twins.cuh's v_rows_per_thread for 16-bit caches: the V rows each lane accumulates
    (vLLM's NUM_ROWS_PER_THREAD: vectors of min(8, block) elements, a row's over the lanes)."""
    vec = min(8, block_size)
    return -(-head_size // (32 // (block_size // vec)))


def stock_smem(context: int, kernel: str, head_size: int = 128, block_size: int = 16) -> int:
    """Dynamic shared memory (bytes) vLLM's launchers give a fp16/bf16 step whose longest
    sequence has ``context`` tokens: the logits (v1: the padded context's; v2: a partition's)
    or the output scratch, whichever is larger."""
    logits = (-(-context // block_size) * block_size if kernel == "v1" else 512) * 4
    return max(logits, (STOCK_WARPS // 2) * head_size * 4)


def twin_smem(group: int, split: int, context: int, kernel: str, head_size: int = 128,
              block_size: int = 16) -> int:
    """Dynamic shared memory (bytes) of twin (group, split), unstaged, for a fp16/bf16 step
    whose longest sequence has ``context`` tokens: G times stock's (stock_smem) plus the V
    products of the warps beyond stock's (gqa_twins.cuh twin_smem_before)."""
    products = (split - 1) * STOCK_WARPS * group * v_rows_per_thread(head_size, block_size) * 32
    return group * stock_smem(context, kernel, head_size, block_size) + 4 * products


def least_waves(ctas: int, sure: int, sm_count: int, per_sm: int) -> int:
    """launch_policy.cuh's least_waves: waves of a grid of ``ctas`` CTAs at ``per_sm`` per SM
    if the ``sure`` ones had one block each and the others none (each EMPTY_CTA_PCT % of one)."""
    slots = 100 * max(sm_count, 1) * per_sm
    return -(-(100 * sure + EMPTY_CTA_PCT * (ctas - sure)) // slots)


def outlasts_stock(stock_ctas: int, stock_sure: int, stock_per_sm: int, twin_ctas: int,
                   twin_sure: int, twin_per_sm: int, sm_count: int, cta_blocks: int) -> bool:
    """launch_policy.cuh's outlasts_stock: whether a twin's grid could take longer than
    stock's code if every CTA but the longest sequence's had the least work. In units of
    stock's least CTA, stock: max(its waves, 1 + CHAIN_LINK_PCT % per further link of the
    longest chain), the twin: TWIN_LEAST_CTA_PCT % of its waves. No verdict (False) where a
    CTA count per SM is unknown (0)."""
    if stock_per_sm <= 0 or twin_per_sm <= 0:
        return False
    links = -(-cta_blocks // STOCK_WARPS)
    stock = max(100 * least_waves(stock_ctas, stock_sure, sm_count, stock_per_sm),
                100 + CHAIN_LINK_PCT * max(links - 1, 0))
    return TWIN_LEAST_CTA_PCT * least_waves(twin_ctas, twin_sure, sm_count, twin_per_sm) > stock


def twin_heads(stock_heads: int, per_kv: int, group: int) -> int:
    """launch_policy.cuh's twin_heads: a twin's CTAs across the heads for stock's ``stock_heads``
    of a model with ``per_kv`` query heads per kv head (each kv head's heads in groups of
    ``group``, the last group holding the rest)."""
    return stock_heads // per_kv * -(-per_kv // group) if per_kv > 0 else 0


def twin_pick(num_heads: int, num_kv_heads: int, batch: int, context: int, kernel: str,
              sm_count: int = H200_SMS, smem_per_sm: int = H200_SMEM_PER_SM,
              max_smem: int = H200_MAX_SMEM, stock_per_sm: int | None = None,
              head_size: int = 128, block_size: int = 16, dtype: str = "fp16",
              partial_groups: bool = True, least_guard: bool = True,
              wave_guard: bool = True) -> tuple[int, int] | None:
    """launch_policy.cuh's twin_pick in `auto` for a decode step of a fp16/bf16 model of
    ``head_size`` and ``block_size`` whose longest sequence has ``context`` tokens (the rule
    reads the grid and that length only); ``stock_per_sm``: CTAs per SM of stock's code
    (default: the H200's for ``dtype`` by its registers, H200_STOCK_V1_CTAS or
    H200_STOCK_V2_CTAS, and by its shared memory). None (vLLM's kernel) where the longest CTA
    has at most STOCK_WARPS blocks; else auto_twin's pick for the CTAs that surely have work
    (heads x (batch + partitions - 1)), among the chain-safe twins only in v1, if its G is at
    most the query heads per kv head (else None), moving on to the next such twin of
    TWIN_SHAPES that can run, keeps two CTAs per SM wherever the pick does not, and whose grid
    could not outlast stock's code if the other sequences were short (outlasts_stock) and
    whose long CTAs take no more waves than stock's for any number of long sequences
    (more_waves_for_some); None past the last. ``batch`` and ``context`` are the LAUNCH's:
    under graph replay the padded bucket and the capture length. The rules a run was made
    under, for runs made before them: ``wave_guard=False``, no wave check over the number of
    long sequences;
    ``partial_groups=False``, G had to divide the heads per kv head; ``least_guard=False``,
    instead of outlasts_stock only v1 short chains (at most LEGACY_SHORT_CHAIN_BLOCKS blocks) were
    checked, for no more waves than stock's code."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        return None
    per_kv = num_heads // num_kv_heads
    if stock_per_sm is None:
        table = H200_STOCK_V1_CTAS if kernel == "v1" else H200_STOCK_V2_CTAS
        stock_per_sm = min(table.get((head_size, block_size, dtype), 0),
                           smem_ctas(smem_per_sm, stock_smem(context, kernel, head_size,
                                                             block_size)))
    partitions = 1 if kernel == "v1" else -(-context // 512)
    blocks = -(-context // block_size)
    cta_blocks = min(blocks, 512 // block_size) if kernel == "v2" else blocks
    if cta_blocks <= STOCK_WARPS:
        return None
    stock_ctas = num_heads * batch * partitions
    sure_ctas = num_heads * (batch + partitions - 1)
    safe_only = kernel == "v1"

    def groups(g: int) -> bool:
        return g <= per_kv and (partial_groups or per_kv % g == 0)

    first = auto_twin(100 * sure_ctas // max(sm_count, 1), safe_only)
    if not groups(first[0]):
        return None
    shapes = [(g, s) for g, s, _ in TWIN_SHAPES]
    short = kernel == "v1" and blocks <= LEGACY_SHORT_CHAIN_BLOCKS and stock_per_sm > 0
    for g, s in shapes[shapes.index(first):]:
        if safe_only and not chain_safe(g, s):
            continue
        smem = twin_smem(g, s, context, kernel, head_size, block_size)
        twin_ctas = twin_heads(stock_ctas, per_kv, g)
        if not (groups(g) and smem <= max_smem
                and keeps_occupancy(s, twin_ctas, sm_count, smem, smem_per_sm)):
            continue
        per_sm = min(twin_bound_ctas(s), smem_ctas(smem_per_sm, smem))
        if least_guard:
            if outlasts_stock(stock_ctas, sure_ctas, stock_per_sm, twin_ctas,
                              twin_heads(sure_ctas, per_kv, g), per_sm, sm_count, cta_blocks):
                continue
        elif short and waves(twin_ctas, sm_count, per_sm) > waves(stock_ctas, sm_count,
                                                                   stock_per_sm):
            continue
        per_seq = num_heads * partitions
        if wave_guard and more_waves_for_some(batch, per_seq, stock_per_sm,
                                              twin_heads(per_seq, per_kv, g), per_sm,
                                              sm_count):
            continue
        return g, s
    return None


# Variants whose launchers (v1 and v2) fire kvprefetch's kv_l2_prefetch_kernel beside small
# steps; `prefetch` fires it before every v2 kernel too.
LAUNCHER_PREFETCH_VARIANTS = ("prefetch", "launch")
