"""The default build's programmatic dependent launch (csrc/kvprefetch/gqa_twins.cuh,
KVPREFETCH_TWIN_PDL=2 unless a build says otherwise: the GQA twins and kvprefetch's reduce kernel
launched as programmatic dependents), built for REAL: the session's kernels-only build (the
``kernels_build`` fixture: fetch (sdist) -> apply -> `kvprefetch build --kernels-only` with no
define, killed and resumed, fp16 and fp32 at head 128 / block 16) -> `verify-kernel --no-gpu` and
`cuobjdump -res-usage`. Sharing that build (rather than compiling the same trees again) saves CI
some six minutes of compile.
What the early launch needs from the machine code, checked on what ships:

- every twin and reduce kernel waits (ACQBULK) before its first global memory instruction (an
  early-launched kernel that read q, seq_lens or a block table before the wait could see the
  previous kernel's data half written; ptxas did move such a load once: tuning doc row 43);
- every twin, staged (the S = 2 twins' shared-memory ring) or not, fused (v2's reduction in
  the 2x2 twin) or not, stays at <= 128 registers
  (four 128-thread CTAs per SM, two of 256), so that the
  next layer's CTAs can be placed beside the running ones: the H200 lost 10% at b8 x 512 with
  the 2x2 twin at 139 (row 44), and up to 30% at batch 64-128 with the 4x1 twin at 179-185
  (row 45);
- every staged twin requests its ring in two steps (KVPREFETCH_TWIN_STAGE_SPLIT=1): a bulk copy
  before the query's barrier and one after it, before the first wait on a slot; requested at
  once, the copies the warps need first waited in a 16 MB burst (b8 x 1k 1.37x instead of
  1.42x, rows 58-59).

Nothing here runs a kernel (no GPU on this machine): the machine code is the evidence."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from kvprefetch.machine.toolchain import find_cuobjdump
from kvprefetch.runner import run
from kvprefetch.verify.sass import decode_twin_name, function_bodies
from tests.integration.helpers import kvprefetch_cli_split

pytestmark = pytest.mark.slow  # one real kernels-only build of two trees (minutes)

PDL_CHECK = "twins wait for the previous kernel before touching memory"
TWIN_CHECK = "GQA twins where the rule puts them"
_FUNC = re.compile(r"Function (\S+):")
_REG = re.compile(r"REG:(\d+)")
# A bulk copy into a ring slot, a CTA barrier, a wait on a slot's mbarrier (try_wait).
_RING_OPS = re.compile(r"^(UBLKCP|BAR\.SYNC|SYNCS\.PHASECHK)")


@pytest.fixture(scope="module")
def pdl_built(kernels_build) -> Path:
    """The session's real kernels-only build (shared with test_kernels_build and test_verify;
    read here, never changed: verify-kernel only adds its report and cache under verify/)."""
    assert kernels_build.resumed["returncode"] == 0, kernels_build.resumed["stderr"][-3000:]
    return kernels_build.workdir.resolve()


@pytest.fixture(scope="module")
def checks(pdl_built: Path) -> dict[tuple[str, str], dict]:
    """verify-kernel --no-gpu --json on the build: its checks by (name, tree)."""
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    res = kvprefetch_cli_split("verify-kernel", "--workdir", str(pdl_built), "--no-gpu",
                               "--json", env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return {(c["name"], c["tree"]): c for c in json.loads(res.stdout)["checks"]}


def test_every_twin_and_reduce_kernel_waits_before_touching_memory(
        checks: dict[tuple[str, str], dict]) -> None:
    order = checks[(PDL_CHECK, "patched")]
    assert order["status"] == "pass", order["detail"]
    # every twin and reduce kernel the build holds, however many the design selects
    m = re.match(r"(\d+) twin/reduce kernels, (\d+) launched as programmatic dependents",
                 order["detail"])
    assert m is not None and int(m[1]) == int(m[2]) > 0, order["detail"]
    assert "0 touch global memory before waiting" in order["detail"]
    assert (PDL_CHECK, "baseline") not in checks  # stock has no twins


def test_twins_stay_at_128_registers(pdl_built: Path,
                                     checks: dict[tuple[str, str], dict]) -> None:
    (manifest,) = pdl_built.glob("build/patched/*/manifest.json")
    built = json.loads(manifest.read_text())
    assert built["inputs"]["defines"] == []  # the default build, as shipped
    lib = Path(built["build_so_path"])
    tools = find_cuobjdump()
    assert tools is not None, "cuobjdump is needed (verify-kernel needs it too)"
    out = run([str(tools.cuobjdump), "-res-usage", str(lib)], env=tools.environ(), echo=False,
              capture=True).output
    regs: dict[str, int] = {}  # twin kernel's mangled name -> registers
    name = None
    for line in out.splitlines():
        if m := _FUNC.search(line):
            name = m.group(1)
        elif name and (m := _REG.search(line)):
            if decode_twin_name(name) is not None:
                regs[name] = int(m.group(1))
            name = None
    # verify-kernel found exactly the twins the build's rule selects (staged and fused ones
    # included); every one of them has a register count here, and none is above 128
    twins = checks[(TWIN_CHECK, "patched")]
    assert twins["status"] == "pass", twins["detail"]
    counted = re.match(r"(\d+) twin kernels", twins["detail"])
    assert counted is not None and len(regs) == int(counted[1]) > 0, (twins["detail"], regs)
    assert all(r <= 128 for r in regs.values()), regs


def _built_lib(wd: Path) -> Path:
    (manifest,) = wd.glob("build/patched/*/manifest.json")
    return Path(json.loads(manifest.read_text())["build_so_path"])


def test_staged_twins_request_their_ring_in_two_steps(pdl_built: Path) -> None:
    """Each staged twin (the S = 2 twins' shared-memory ring) copies a warp's first chunk before
    the query's barrier (the kernel's first BAR.SYNC) and its second after that barrier, before
    the first wait on a slot. With KVPREFETCH_TWIN_STAGE_SPLIT=0 (both before the query load)
    no copy lies between the barrier and that wait (checked on a local build of both)."""
    tools = find_cuobjdump()
    assert tools is not None, "cuobjdump is needed (verify-kernel needs it too)"
    text = run([str(tools.cuobjdump), "-sass", str(_built_lib(pdl_built))],
               env=tools.environ(), echo=False, capture=True).output
    staged = {name: body for (_, name), body in function_bodies(text).items()
              if (meta := decode_twin_name(name)) is not None and meta["staged"]}
    assert staged, "the default build holds no staged twin"
    for name, body in staged.items():
        ops = [m.group(1) for line in body.splitlines() if (m := _RING_OPS.match(line))]
        barrier, first_wait = ops.index("BAR.SYNC"), ops.index("SYNCS.PHASECHK")
        assert barrier < first_wait, name
        assert "UBLKCP" in ops[:barrier], name  # the first chunk, before the query's barrier
        assert "UBLKCP" in ops[barrier + 1:first_wait], name  # the second, after it

