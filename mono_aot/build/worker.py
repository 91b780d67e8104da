"""The compile subprocess: one kernel, one fresh interpreter, one private FlyDSL cache.

Run as ``python -m mono_aot.build.worker REQUEST.json`` by ``mono_aot.build.compile``, which
sets the compile environment (``COMPILE_ONLY=1``, ``ARCH``, ``FLYDSL_GPU_ARCH``, a private empty
``FLYDSL_RUNTIME_CACHE_DIR``, ``ROCM_PATH``) before this interpreter starts, so it is in place
before FlyDSL is imported. An LLVM abort kills only this process; the parent reports it.

The request names a provider module (``KERNEL_NAMES``, ``launcher_for``, ``trace_args``), the
variant, the layout (its model dump), the arch, an output directory and a mode:
``compile`` writes ``code.hsaco`` (the code object from FlyDSL's cache entry) and ``result.json``;
``isa`` compiles with FlyDSL's ISA dump on and writes ``isa.s`` instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from mono_aot.build.protocol import (
    CODE_FILE,
    EXIT_PYTHON_ERROR,
    ISA_FILE,
    RESULT_FILE,
    WORKER_PROTOCOL,
)


class WorkerFailure(Exception):
    """A failure the worker describes in result.json (the parent turns it into a job failure)."""


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _check_environment(arch: str) -> None:
    if "flydsl" in sys.modules:
        raise WorkerFailure("FlyDSL was imported before the compile environment was checked")
    want = {"COMPILE_ONLY": "1", "ARCH": arch, "FLYDSL_GPU_ARCH": arch}
    for k, v in want.items():
        if os.environ.get(k) != v:
            raise WorkerFailure(f"environment {k}={os.environ.get(k)!r}, expected {v!r}")
    cache = os.environ.get("FLYDSL_RUNTIME_CACHE_DIR", "")
    if not cache or (Path(cache).exists() and any(Path(cache).iterdir())):
        raise WorkerFailure(
            f"FLYDSL_RUNTIME_CACHE_DIR={cache!r} must name a private empty directory"
        )
    if not os.environ.get("ROCM_PATH"):
        raise WorkerFailure("ROCM_PATH is not set (the toolchain folder with llvm/bin/ld.lld)")


def _provider(module_name: str, search_path: str | None):
    import importlib

    if search_path:
        sys.path.insert(0, search_path)
    mod = importlib.import_module(module_name)
    for attr in ("KERNEL_NAMES", "launcher_for", "trace_args"):
        if not hasattr(mod, attr):
            raise WorkerFailure(
                f"provider {module_name} has no {attr} (see the kernel provider protocol)"
            )
    return mod


def _trace(req: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from mono_aot.layouts import parse_layout

    layout = parse_layout(req["layout"], source=f"layout {req['layout'].get('name')}")
    variant, arch = req["variant"], req["arch"]
    mod = _provider(req["module"], req.get("search_path"))
    names = dict(mod.KERNEL_NAMES)
    if variant not in names:
        raise WorkerFailure(
            f"provider {req['module']} has no kernel for variant {variant!r} (it has {sorted(names)})"
        )
    info: dict[str, Any] = {"kernel_function": names[variant]}
    if hasattr(mod, "expected_kernargs"):
        info["expected_kernargs"] = [list(t) for t in mod.expected_kernargs(variant, layout)]
    t0 = time.perf_counter()
    launcher = mod.launcher_for(variant, layout, arch)
    args = tuple(mod.trace_args(variant, layout))
    ret = launcher(*args)
    info["compile_seconds"] = round(time.perf_counter() - t0, 3)
    if ret is not None:
        raise WorkerFailure(
            f"the launcher returned {type(ret).__name__} under COMPILE_ONLY=1, expected None"
        )
    return launcher, info


def _extract(out: Path, info: dict[str, Any], arch: str) -> None:
    from mono_aot.build.extract import artifact_ir_text, gpu_objects, launches, read_artifact_state

    cache = Path(os.environ["FLYDSL_RUNTIME_CACHE_DIR"])
    pickles = sorted(cache.rglob("*.pkl"))
    if len(pickles) != 1:
        raise WorkerFailure(
            f"expected one FlyDSL cache entry after the compile, found {len(pickles)}"
            + (f": {', '.join(p.name for p in pickles)}" if pickles else "")
        )
    state = read_artifact_state(pickles[0])
    for field in ("processor_refs", "link_libs"):
        if state.get(field):
            raise WorkerFailure(
                f"the artifact needs {field} {state[field]!r}: a code object alone cannot run it"
            )
    if state.get("uses_explicit_module"):
        raise WorkerFailure("the artifact uses an explicit (extern-linked) module")
    text = artifact_ir_text(state)
    objs = gpu_objects(text)
    if len(objs) != 1:
        raise WorkerFailure(f"expected one GPU object in the compiled module, found {len(objs)}")
    obj = objs[0]
    if obj.chip != arch:
        raise WorkerFailure(f"the GPU object targets chip {obj.chip!r}, not {arch}")
    info["chip"] = obj.chip
    info["target_attrs"] = obj.target_attrs
    info["launches"] = [
        {
            "kernel": la.kernel,
            "grid": list(la.grid),
            "block": list(la.block),
            "dynamic_lds": la.dynamic_lds,
        }
        for la in launches(text)
    ]
    tmp = out / (CODE_FILE + ".tmp")
    tmp.write_bytes(obj.binary)
    os.replace(tmp, out / CODE_FILE)
    info["code_bytes"] = len(obj.binary)


def _isa(out: Path) -> None:
    dump = Path(os.environ["FLYDSL_DUMP_DIR"])
    found = sorted(dump.rglob("*.s"))
    if not found:
        raise WorkerFailure("FlyDSL wrote no ISA dump (*.s) under FLYDSL_DUMP_DIR")
    (out / ISA_FILE).write_text("\n".join(p.read_text(errors="replace") for p in found))


def run(request_path: Path) -> int:
    req = json.loads(Path(request_path).read_text())
    out = Path(req["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"protocol": WORKER_PROTOCOL, "ok": False}
    try:
        if req.get("protocol") != WORKER_PROTOCOL:
            raise WorkerFailure(
                f"request protocol {req.get('protocol')!r}, worker speaks {WORKER_PROTOCOL}"
            )
        _check_environment(req["arch"])
        _, info = _trace(req)
        import flydsl

        info["flydsl_version"] = flydsl.__version__
        if req.get("mode", "compile") == "isa":
            _isa(out)
        else:
            _extract(out, info, req["arch"])
        result.update(info, ok=True)
        _write_json(out / RESULT_FILE, result)
        return 0
    except Exception as e:  # noqa: BLE001 - every failure becomes the job's report
        result["error"] = f"{type(e).__name__}: {e}" if not isinstance(e, WorkerFailure) else str(e)
        result["traceback"] = traceback.format_exc(limit=20)
        _write_json(out / RESULT_FILE, result)
        print(result["traceback"], file=sys.stderr)
        return EXIT_PYTHON_ERROR


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m mono_aot.build.worker REQUEST.json", file=sys.stderr)
        return 2
    return run(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
