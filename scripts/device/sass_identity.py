"""sass-identity.sh's comparison (issue 45): the machine code of two builds of the same
instantiations, one made with the kit BEFORE a change and one AFTER, function by function.

For each partition, `cuobjdump -sass` and `cuobjdump -res-usage` of both libraries. A function's
SASS is its `.headerflags` line and its instructions with their encodings, as cuobjdump prints
them; what is dropped is only the fatbin header lines around the functions (arch, code version,
host, ...) and blank lines. One thing in a function's NAME differs between two builds of the
same code: the anonymous namespace's id, which cudafe++ derives from the source's path (each
build compiles its own narrowed copy of the launcher), so it is replaced by a fixed string
before names are matched. Functions with the same name in two objects (v1's and v2's copies of
an internal function) are told apart by their order.

Stdlib only: it runs with the device's python3, outside the kit.
Usage: sass_identity.py --results DIR --cuobjdump PATH --kv LIST --full-heads LIST
       --full-blocks LIST --full-kv LIST [--baseline-keys B:A]
       PART=HEADS:BLOCKS:BEFORE_SO:AFTER_SO ...
(HEADS and BLOCKS comma-separated; a missing .so marks the partition not built).
Exit 0: every partition built and every function identical; 1: a difference; 3: a partition
not built (nothing compared for it)."""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# _GLOBAL__N__050cff80_21_paged_attention_v1_cu_d115ef7d: the id hashes, the file name stays
ANON = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_(\d+_[A-Za-z0-9_]+?_cu)_[0-9a-f]{8}")
FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
RES_FUNCTION = re.compile(r"^\s*Function (\S+):\s*$")
RES_COMMON = re.compile(r"^\s*Common:\s*$")  # an object's own globals and constants


def normal_name(name: str) -> str:
    return ANON.sub(r"_GLOBAL__N__ID_\1_ID", name)


def _keyed(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """name -> value, a repeated name numbered by its order (name#2, name#3, ...)."""
    out: dict[str, object] = {}
    seen: dict[str, int] = {}
    for name, value in pairs:
        seen[name] = seen.get(name, 0) + 1
        out[name if seen[name] == 1 else f"{name}#{seen[name]}"] = value
    return out


def sass_functions(text: str) -> dict[str, list[str]]:
    """Each function's lines (its .headerflags and instructions), by normalised name. The lines
    between functions (fatbin headers: arch, code version, host, compile size, `code for`,
    `.target`) belong to no function and are dropped, as are blank lines."""
    pairs: list[tuple[str, object]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        m = FUNCTION.match(line)
        if m:
            current = []
            pairs.append((normal_name(m.group(1)), current))
            continue
        stripped = line.strip()
        if current is None or not stripped:
            continue
        if stripped.startswith(("Fatbin ", "=====", "arch =", "code version", "host =",
                                "compile_size", "compressed", "identifier", "code for ",
                                ".target", "producer", "ptxasOptions")):
            current = None  # a new fatbin section: the function ended
            continue
        current.append(line.rstrip())
    return _keyed(pairs)  # type: ignore[return-value]


def res_usage(text: str) -> dict[str, str]:
    """Each function's resource line (REG, STACK, SHARED, LOCAL, CONSTANT, ...), by name, and
    each object's `Common:` line (its globals and constants) as `<common>`."""
    pairs: list[tuple[str, object]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = RES_FUNCTION.match(line)
        name = normal_name(m.group(1)) if m else "<common>" if RES_COMMON.match(line) else None
        if name is not None and i + 1 < len(lines):
            pairs.append((name, " ".join(lines[i + 1].split())))
    return _keyed(pairs)  # type: ignore[return-value]


def dump(cuobjdump: str, flag: str, so: str, where: Path) -> str:
    """cuobjdump FLAG SO, also kept in ``where`` (the work dir: far too large for the results)."""
    res = subprocess.run([cuobjdump, flag, so], capture_output=True, text=True, check=False)
    where.write_text(res.stdout)
    if res.returncode != 0:
        raise RuntimeError(f"{cuobjdump} {flag} {so}: exit {res.returncode}: {res.stderr[-500:]}")
    return res.stdout


def compare_part(name: str, before: str, after: str, cuobjdump: str, dumps: Path) -> dict:
    """One partition's comparison: counts, and each difference (function, what differs)."""
    sass, res = {}, {}
    for side, so in (("before", before), ("after", after)):
        sass[side] = sass_functions(dump(cuobjdump, "-sass", so, dumps / f"{name}.{side}.sass"))
        res[side] = res_usage(dump(cuobjdump, "-res-usage", so, dumps / f"{name}.{side}.res"))
    diffs: list[dict[str, str]] = []
    names = sorted(set(sass["before"]) | set(sass["after"]))
    identical = 0
    for fn in names:
        b, a = sass["before"].get(fn), sass["after"].get(fn)
        if b is None or a is None:
            only = "after" if b is None else "before"
            diffs.append({"function": fn, "what": "sass", "detail": f"only {only}"})
        elif b != a:
            # strict=False: the listings may differ in length; past the shorter one's end the
            # first difference is where the shorter one stops
            pairs = enumerate(zip(b, a, strict=False))
            at = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
            diffs.append({"function": fn, "what": "sass",
                          "detail": f"{len(b)} vs {len(a)} lines; first at line {at}: "
                                    f"{(b[at] if at < len(b) else '').strip()[:120]!r} vs "
                                    f"{(a[at] if at < len(a) else '').strip()[:120]!r}"})
        else:
            identical += 1
    res_names = sorted(set(res["before"]) | set(res["after"]))
    res_identical = 0
    for fn in res_names:
        b, a = res["before"].get(fn), res["after"].get(fn)
        if b == a:
            res_identical += 1
        else:
            diffs.append({"function": fn, "what": "res-usage", "detail": f"{b!r} vs {a!r}"})
    digest = hashlib.sha256("\n".join(f"{fn}\n" + "\n".join(sass["after"][fn])
                                      for fn in sorted(sass["after"])).encode()).hexdigest()
    return {"built": True, "functions": len(names), "identical": identical,
            "res_usage_functions": len(res_names), "res_usage_identical": res_identical,
            "differences": diffs, "sass_sha256_after": digest}


def _ints(text: str) -> list[int]:
    return sorted(int(x) for x in text.split(",") if x)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, type=Path)
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("--dumps", type=Path, help="where the dumps go (default: RESULTS/../dumps)")
    ap.add_argument("--kv", required=True, help="the kv dtypes every partition was built with")
    # the default build's set (kvprefetch.kernels.selection: HEAD_SIZES, BLOCK_SIZES, KV_DTYPES)
    ap.add_argument("--full-heads", required=True)
    ap.add_argument("--full-blocks", required=True)
    ap.add_argument("--full-kv", required=True)
    ap.add_argument("--baseline-keys", default="", help="BEFORE_KEY:AFTER_KEY of the baseline tree")
    ap.add_argument("parts", nargs="+", help="NAME=HEADS:BLOCKS:BEFORE_SO:AFTER_SO")
    args = ap.parse_args(argv)
    dumps = args.dumps or args.results.parent / "dumps"
    dumps.mkdir(parents=True, exist_ok=True)
    parts = []
    for spec in args.parts:
        name, rest = spec.split("=", 1)
        heads, blocks, before, after = rest.split(":", 3)
        parts.append({"name": name, "head_sizes": _ints(heads), "block_sizes": _ints(blocks),
                      "before_so": before, "after_so": after})
    covered = {(h, b) for p in parts for h in p["head_sizes"] for b in p["block_sizes"]}
    want = {(h, b) for h in _ints(args.full_heads) for b in _ints(args.full_blocks)}
    overlap = sum(len(p["head_sizes"]) * len(p["block_sizes"]) for p in parts) != len(covered)
    all_kv = set(args.kv.split(",")) == set(args.full_kv.split(","))
    full = covered == want and not overlap and all_kv
    built = [p for p in parts if os.path.isfile(p["before_so"]) and os.path.isfile(p["after_so"])]
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(16, max(1, len(built)))) as pool:
        futures = {p["name"]: pool.submit(compare_part, p["name"], p["before_so"], p["after_so"],
                                          args.cuobjdump, dumps) for p in built}
        for p in parts:
            if p["name"] in futures:
                p.update(futures[p["name"]].result())
            else:
                p.update({"built": False, "functions": 0, "identical": 0,
                          "res_usage_functions": 0, "res_usage_identical": 0, "differences": []})
    diffs = [dict(d, partition=p["name"]) for p in parts for d in p["differences"]]
    not_built = [p["name"] for p in parts if p.get("built") is False]
    keys = args.baseline_keys.split(":") if args.baseline_keys else []
    baseline_same = len(keys) == 2 and keys[0] == keys[1] and keys[0] != ""
    if keys and not baseline_same:  # baseline's build must not see the kit's headers at all
        diffs.append({"partition": "baseline", "what": "build key", "function": "-",
                      "detail": f"{args.baseline_keys!r}"})
    summary = {
        "what": "cuobjdump -sass and -res-usage of every function, kit before vs after",
        "kv_dtypes": args.kv.split(","), "full_set": full,
        "full_set_is": {"head_sizes": _ints(args.full_heads),
                        "block_sizes": _ints(args.full_blocks),
                        "kv_dtypes": args.full_kv.split(",")},
        "functions_compared": sum(p["functions"] for p in parts),
        "identical": sum(p["identical"] for p in parts),
        "res_usage_compared": sum(p["res_usage_functions"] for p in parts),
        "res_usage_identical": sum(p["res_usage_identical"] for p in parts),
        "differences": diffs, "not_built": not_built,
        "baseline_build_key": {"before": keys[0] if keys else None,
                               "after": keys[1] if len(keys) > 1 else None,
                               "same": baseline_same},
        "partitions": parts,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    key = summary["baseline_build_key"]
    md = ["# SASS identity: kit before vs after (issue 45)", "",
          (f"full set: {'yes' if full else 'NO'} (kv dtypes {args.kv}); functions compared "
           f"{summary['functions_compared']}, identical {summary['identical']}; res-usage "
           f"compared {summary['res_usage_compared']}, identical "
           f"{summary['res_usage_identical']}; differences {len(diffs)}; not built: "
           f"{', '.join(not_built) or 'none'}"),
          (f"baseline build key before/after: {key['before']} / {key['after']} "
           f"({'same' if baseline_same else 'NOT the same'})"),
          "", "| partition | heads | blocks | functions | identical | res-usage | identical |",
          "|---|---|---|---|---|---|---|"]
    md += [f"| {p['name']} | {','.join(map(str, p['head_sizes']))} | "
           f"{','.join(map(str, p['block_sizes']))} | {p['functions']} | {p['identical']} | "
           f"{p['res_usage_functions']} | {p['res_usage_identical']} |" for p in parts]
    if diffs:
        md += ["", "## Differences", ""]
        md += [f"- {d['partition']} {d['what']} `{d['function']}`: {d['detail']}"
               for d in diffs[:200]]
    (args.results / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[:4]))
    if diffs:
        return 1
    return 3 if not_built or not summary["functions_compared"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
