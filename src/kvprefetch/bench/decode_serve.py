"""The serving side of ``bench decode``, pure Python: request lengths drawn from a named
distribution, a paged block allocator, a continuous-batching scheduler that turns requests into
decode steps (sequence lengths, block tables, the slot each new token's K/V goes to).

vLLM V0's CUDA-graph buckets, pad rows and capture length are bench/vllm_call.py's; here a
padded row writes its K/V to a scratch block no request owns (vLLM's ``PAD_SLOT_ID`` writes
nowhere).

Prompt K/V is never computed: the bench fills the cache directly and times decode steps only.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError

DISTRIBUTIONS = ("fixed", "uniform", "longtail")


@dataclass(frozen=True)
class LengthDist:
    """Prompt and output lengths of the requests, in tokens.

    - ``fixed``: every request ``prompt`` tokens of prompt and ``output`` tokens out;
    - ``uniform``: prompt uniform in [prompt / 2, prompt x 3 / 2], output likewise;
    - ``longtail``: a ShareGPT-like long tail: prompt lognormal around ``prompt`` (sigma 1), with
      one request in 20 a further 10-100x longer; output lognormal around ``output`` (sigma 0.7).
    Every length is clamped to [1, ``max_len``] (prompt + output)."""

    kind: str = "fixed"
    prompt: int = 1024
    output: int = 128
    max_len: int = 32768
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in DISTRIBUTIONS:
            raise ConfigError(f"unknown length distribution '{self.kind}'",
                              f"use one of: {', '.join(DISTRIBUTIONS)}")
        if self.prompt < 1 or self.output < 1 or self.prompt + self.output > self.max_len:
            raise ConfigError(f"prompt {self.prompt} + output {self.output} must be positive and "
                              f"at most the model length {self.max_len}",
                              "pick shorter lengths or raise --max-model-len")

    def sample(self, n: int) -> list[tuple[int, int]]:
        """``n`` (prompt, output) pairs, the same for the same seed."""
        rng = random.Random(self.seed)
        out = []
        for _ in range(n):
            if self.kind == "fixed":
                p, o = self.prompt, self.output
            elif self.kind == "uniform":
                p = rng.randint(max(1, self.prompt // 2), self.prompt * 3 // 2)
                o = rng.randint(max(1, self.output // 2), self.output * 3 // 2)
            else:
                p = int(rng.lognormvariate(0.0, 1.0) * self.prompt)
                if rng.random() < 0.05:
                    p *= rng.randint(10, 100)
                o = int(rng.lognormvariate(0.0, 0.7) * self.output)
            o = min(max(1, o), self.max_len - 1)
            p = min(max(1, p), self.max_len - o)
            out.append((p, o))
        return out


class BlockAllocator:
    """Physical KV blocks ``0 .. num_blocks - 1``; the last one is the scratch block padded rows
    write to, never handed out."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2:
            raise ConfigError("the KV cache needs at least two blocks",
                              "give the bench more memory or fewer, shorter requests")
        self.block_size = block_size
        self.scratch = num_blocks - 1
        self._free: deque[int] = deque(range(num_blocks - 1))

    @property
    def free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise ConfigError(f"{n} KV blocks wanted, {len(self._free)} free",
                              "lower the batch or the lengths")
        return [self._free.popleft() for _ in range(n)]

    def release(self, blocks: Sequence[int]) -> None:
        self._free.extend(blocks)


@dataclass
class Request:
    rid: int
    prompt: int
    output: int
    blocks: list[int] = field(default_factory=list)
    generated: int = 0

    @property
    def length(self) -> int:
        """Tokens whose K/V are in the cache once this step's token is written."""
        return self.prompt + self.generated + 1

    @property
    def done(self) -> bool:
        return self.generated >= self.output


@dataclass(frozen=True)
class Step:
    """One decode step: per sequence its length (this step's token included), its block table,
    the slot its new token's K/V goes to and that token's position."""

    seq_lens: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    slots: tuple[int, ...]
    positions: tuple[int, ...]
    new_prompts: tuple[tuple[int, ...], ...] = ()  # block lists whose prompt K/V is new this step

    @property
    def batch(self) -> int:
        return len(self.seq_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens)


class Scheduler:
    """Continuous batching as vLLM's scheduler does it for decode: up to ``max_batch`` requests
    run at once; a waiting request is admitted (its prompt's blocks allocated, its prompt K/V
    taken as already there) as soon as a slot and its blocks are free; each step appends one
    token to every running request (a new block when it crosses a block boundary); a request
    leaves when its output is done, and its blocks go back to the pool."""

    def __init__(self, lengths: Sequence[tuple[int, int]], max_batch: int,
                 allocator: BlockAllocator) -> None:
        if max_batch < 1:
            raise ConfigError("the batch must hold at least one request", "pass --batch >= 1")
        self.waiting = deque(Request(i, p, o) for i, (p, o) in enumerate(lengths))
        self.running: list[Request] = []
        self.max_batch = max_batch
        self.alloc = allocator

    def _admit(self) -> list[tuple[int, ...]]:
        bs = self.alloc.block_size
        admitted = []
        while self.waiting and len(self.running) < self.max_batch:
            r = self.waiting[0]
            need = -(-(r.prompt + 1) // bs)
            if need > self.alloc.free:
                if not self.running:
                    raise ConfigError(f"request {r.rid} needs {need} KV blocks, the cache has "
                                      f"{self.alloc.free}", "give the cache more blocks")
                break
            self.waiting.popleft()
            r.blocks = self.alloc.allocate(need)
            self.running.append(r)
            admitted.append(tuple(r.blocks))
        return admitted

    def steps(self) -> Iterator[Step]:
        bs = self.alloc.block_size
        while self.waiting or self.running:
            admitted = self._admit()
            for r in self.running:
                if -(-r.length // bs) > len(r.blocks):
                    r.blocks += self.alloc.allocate(1)
            yield Step(
                seq_lens=tuple(r.length for r in self.running),
                block_tables=tuple(tuple(r.blocks) for r in self.running),
                slots=tuple(r.blocks[(r.length - 1) // bs] * bs + (r.length - 1) % bs
                            for r in self.running),
                positions=tuple(r.length - 1 for r in self.running),
                new_prompts=tuple(admitted))
            for r in self.running:
                r.generated += 1
            for r in [r for r in self.running if r.done]:
                self.alloc.release(r.blocks)
            self.running = [r for r in self.running if not r.done]


def blocks_needed(lengths: Sequence[tuple[int, int]], max_batch: int, block_size: int) -> int:
    """KV blocks the scheduler needs at most for these requests (the largest ``max_batch`` total
    lengths at once, an upper bound), plus the scratch block."""
    per = sorted((-(-(p + o) // block_size) for p, o in lengths), reverse=True)
    return sum(per[:max_batch]) + 1
