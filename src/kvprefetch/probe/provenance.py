"""Provenance probe: run with an environment's OWN python from a neutral working directory
(a ./vllm folder in the cwd would shadow an editable install). Imports what that env has --
vLLM's ``vllm._C`` (full builds) and/or ``kvprefetch_kernels`` (kernels-only builds) -- and
reports as JSON which files the process really mapped (/proc/self/maps), with sha256.
Stdlib only, plus whatever the env itself provides; it never imports kvprefetch."""

import hashlib
import json
import os
import sys


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def mapped_files():
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    p = parts[5].strip()
                    if p not in out:
                        out.append(p)
    except OSError:
        pass
    return out


def interesting(path):
    name = os.path.basename(path)
    return (name.startswith(("_C.", "_C-", "kvprefetch_", "libtorch", "libc10", "libcudart"))
            or "/vllm/" in path or "/kvprefetch_kernels/" in path)


errors: list = []
report: dict = {"executable": sys.executable, "prefix": sys.prefix, "cwd": os.getcwd(),
          "version": sys.version.split()[0], "vllm": None, "kernels": None, "errors": errors}

what = sys.argv[1] if len(sys.argv) > 1 else "auto"

if what in ("auto", "vllm"):
    try:
        import vllm
        import vllm._C as vc

        report["vllm"] = {"version": getattr(vllm, "__version__", None),
                          "package_file": os.path.realpath(vllm.__file__),
                          "c_file": os.path.realpath(vc.__file__),
                          "c_sha256": sha256(os.path.realpath(vc.__file__))}
    except Exception as exc:  # noqa: BLE001 -- report, never crash: the host decides
        errors.append(f"vllm: {type(exc).__name__}: {exc}")

if what in ("auto", "kernels"):
    try:
        import kvprefetch_kernels as kk

        ns = kk.load()
        so = os.path.realpath(kk.SO_PATH)
        info = None
        try:
            info = json.loads(ns.build_info())
        except Exception as exc:  # noqa: BLE001
            errors.append(f"build_info: {exc}")
        report["kernels"] = {"package_file": os.path.realpath(kk.__file__), "so_file": so,
                             "so_sha256": sha256(so), "namespace": kk.NAMESPACE,
                             "build": kk.BUILD, "compiled_build_info": info,
                             "ops": [op for op in ("paged_attention_v1", "paged_attention_v2")
                                     if hasattr(ns, op)]}
    except Exception as exc:  # noqa: BLE001
        errors.append(f"kvprefetch_kernels: {type(exc).__name__}: {exc}")

report["mapped"] = [p for p in mapped_files() if interesting(p)]
print(json.dumps(report))
