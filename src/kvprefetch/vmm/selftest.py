"""A randomized alloc/step/free workload over a cache, with invariant checks after every step.
Used by ``kvprefetch vmm selftest`` (real or fake driver) and by the GPU stress test, which adds
content writes and checks through the ``on_step``/``on_check`` hooks.

Each op is one of: admit a request (alloc + prefill step), finish one (free), or advance (a decode
step for every active request, or a prefill chunk for one). When a step runs out of memory the
workload preempts the youngest active request, as a scheduler would, and retries."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .cache import VirtualKVCache
from .errors import VmmOutOfMemory, VmmUsageError

OnStep = Callable[[dict[int, tuple[int, int, int]]], None]  # slot -> (request, old len, new len)


@dataclass(frozen=True)
class StressReport:
    ops: int
    steps: int
    admitted: int
    finished: int
    preempted: int
    oom_errors: int
    max_active: int
    max_tokens: int
    counters: dict[str, int] = field(default_factory=dict)


def check_invariants(cache: VirtualKVCache, lens: dict[int, int]) -> None:
    """Every active slot holds at least the pages its length needs, and the cache agrees with the
    workload about which slots are active."""
    active = set(cache.active_slots())
    if active != set(lens):
        raise AssertionError(f"cache thinks slots {sorted(active)} are active, workload has "
                             f"{sorted(lens)}")
    for slot, tokens in lens.items():
        view = cache.slot(slot)
        need = cache.geometry.groups_for_tokens(tokens)
        if view.mapped_groups < need:
            raise AssertionError(f"slot {slot} holds {view.mapped_groups} groups, needs {need}")
        if view.seq_len != tokens:
            raise AssertionError(f"slot {slot} seq_len {view.seq_len} != {tokens}")


def run_stress(cache: VirtualKVCache, ops: int, seed: int = 0, *, max_prompt: int | None = None,
               on_step: OnStep | None = None, on_check: Callable[[], None] | None = None,
               check_every: int = 50) -> StressReport:
    rng = random.Random(seed)
    s_max = cache.spec.max_context
    max_prompt = max_prompt or max(1, s_max // 2)
    lens: dict[int, int] = {}
    request: dict[int, int] = {}
    order: list[int] = []  # admission order, for preempting the youngest
    serial = steps = admitted = finished = preempted = ooms = max_active = max_tokens = 0
    for op in range(ops):
        r = rng.random()
        target: dict[int, int] | None = dict(lens)
        if (r < 0.2 or not lens) and len(lens) < cache.spec.max_batch:
            slot = cache.alloc_reqid()
            lens[slot] = 0
            request[slot] = serial
            serial += 1
            order.append(slot)
            admitted += 1
            target = dict(lens)
            target[slot] = rng.randint(1, max_prompt)
        elif r < 0.35 and lens:
            slot = rng.choice(sorted(lens))
            cache.free_reqid(slot)
            del lens[slot], request[slot]
            order.remove(slot)
            finished += 1
            target = None
        elif r < 0.45:
            slot = rng.choice(sorted(lens))
            target = dict(lens)
            target[slot] = min(s_max, lens[slot] + rng.randint(1, max(1, s_max // 8)))
        else:
            target = {slot: min(s_max, n + 1) for slot, n in lens.items()}
        if target is not None:
            while True:
                try:
                    cache.step(target)
                    break
                except VmmOutOfMemory:
                    ooms += 1
                    victim = order.pop()
                    cache.free_reqid(victim)
                    del lens[victim], request[victim]
                    target.pop(victim, None)
                    preempted += 1
                    if not lens:
                        break
            steps += 1
            changed = {slot: (request[slot], lens[slot], n) for slot, n in target.items()
                       if slot in lens and n != lens[slot]}
            for slot, n in target.items():
                if slot in lens:
                    lens[slot] = n
            if on_step is not None and changed:
                on_step(changed)
        check_invariants(cache, lens)
        if on_check is not None and (op + 1) % check_every == 0:
            on_check()
        max_active = max(max_active, len(lens))
        max_tokens = max(max_tokens, sum(lens.values()))
    if on_check is not None:
        on_check()
    for slot in list(lens):
        cache.free_reqid(slot)
    try:
        cache.free_reqid(0)  # every slot is free now
    except VmmUsageError:
        pass  # double free must be refused; that is all this probes
    else:
        raise AssertionError("a double free was accepted")
    return StressReport(ops=ops, steps=steps, admitted=admitted, finished=finished,
                        preempted=preempted, oom_errors=ooms, max_active=max_active,
                        max_tokens=max_tokens, counters=cache.stats().counters)
