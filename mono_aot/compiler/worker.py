"""The compile subprocess: one kernel, one fresh interpreter, one private FlyDSL cache.

Run as ``python -P -m mono_aot.compiler.worker request.json`` in the output directory by
``mono_aot.compiler.compile``, which builds the whole environment (``COMPILE_ONLY=1``, ``ARCH``,
``FLYDSL_GPU_ARCH``, ``FLYDSL_DEBUG_DUMP_ASM=1``, a private empty ``FLYDSL_RUNTIME_CACHE_DIR``,
``ROCM_PATH``, all paths relative) before this interpreter starts, so it is in place before
FlyDSL is imported. An LLVM abort kills only this process; the parent reports it.

First thing, on Linux, the worker turns off address-space randomisation for itself: it sets
``ADDR_NO_RANDOMIZE`` in its personality and re-executes itself with the same argv and
environment (the flag takes effect at ``execve``). LLVM's optimiser orders some work by pointer
value; with a fixed layout and identical inputs (see ``mono_aot.compiler.compile``) the pointers,
and so the bytes, are the same in every build. If the kernel refuses the flag the compile goes
on, ``result.json`` says ``address_space: randomized`` and stderr has a warning.

The request names a provider module (``KERNEL_NAMES``, ``launcher_for``, ``trace_args``), the
variant, the layout (its model dump), the arch and the output directory. The worker writes
``code.hsaco`` (the code object of the in-memory artifact of that one compile), ``isa.s`` (FlyDSL's
ISA dump of the same compile) and ``result.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from mono_aot.compiler.protocol import (
    CODE_FILE,
    EXIT_PYTHON_ERROR,
    ISA_FILE,
    RESULT_FILE,
    WORKER_PROTOCOL,
)
from mono_aot.spec.errors import MonoError

ADDR_NO_RANDOMIZE = 0x0040000  # linux/personality.h
_QUERY_PERSONALITY = 0xFFFFFFFF
FIXED_MARK = "--address-space-fixed"  # argv of the re-executed worker (the same for every build)


def _personality() -> tuple[object, int]:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.personality.argtypes = [ctypes.c_ulong]
    libc.personality.restype = ctypes.c_int
    return libc, libc.personality(_QUERY_PERSONALITY)


def fix_address_space(argv: list[str]) -> str:
    """Re-exec this process with address-space randomisation off; return how it runs.

    ``fixed``: ``ADDR_NO_RANDOMIZE`` is in effect. ``randomized: why``: it could not be set; the
    caller warns. Returns only when no re-exec happens.
    """
    if not sys.platform.startswith("linux"):
        return "randomized: not Linux"
    try:
        libc, cur = _personality()
    except (OSError, AttributeError) as e:
        return f"randomized: no personality() ({e})"
    if cur != -1 and cur & ADDR_NO_RANDOMIZE:
        return "fixed"
    if FIXED_MARK in argv:  # re-executed, yet the flag did not stick: never loop
        return "randomized: the flag was set but is not in effect"
    if cur == -1 or libc.personality(cur | ADDR_NO_RANDOMIZE) == -1:  # type: ignore[attr-defined]
        import ctypes

        return f"randomized: personality(ADDR_NO_RANDOMIZE) refused ({os.strerror(ctypes.get_errno())})"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:], FIXED_MARK])
    raise AssertionError("unreachable")  # pragma: no cover


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
    if os.environ.get("FLYDSL_DEBUG_DUMP_ASM") != "1" or not os.environ.get("FLYDSL_DUMP_DIR"):
        raise WorkerFailure("FLYDSL_DEBUG_DUMP_ASM=1 and FLYDSL_DUMP_DIR must be set (the ISA)")
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
    from mono_aot.spec.layouts import parse_layout

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


def _artifact_state(launcher: Any) -> dict[str, Any]:
    """The state FlyDSL would pickle for the launcher's one compile (``_last_compiled``: the
    in-memory artifact; FlyDSL writes no cache entry when it dumps)."""
    last = getattr(launcher, "_last_compiled", None)
    if not (isinstance(last, tuple) and len(last) == 2) or not hasattr(last[1], "__getstate__"):
        raise WorkerFailure(
            "the launcher has no compiled artifact (_last_compiled): is it a @flyc.jit function?"
        )
    state = last[1].__getstate__()
    if not isinstance(state, dict):
        raise WorkerFailure("the compiled artifact's state is not a dict")
    return state


def _extract(out: Path, info: dict[str, Any], arch: str, state: dict[str, Any]) -> None:
    from mono_aot.compiler.extract import artifact_ir_text, gpu_objects, launches

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
    tmp = out / (ISA_FILE + ".tmp")
    tmp.write_text("\n".join(p.read_text(errors="replace") for p in found))
    os.replace(tmp, out / ISA_FILE)


def run(request_path: Path, address_space: str = "fixed") -> int:
    req = json.loads(Path(request_path).read_text())
    out = Path(req["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"protocol": WORKER_PROTOCOL, "ok": False}
    result["address_space"] = "fixed" if address_space == "fixed" else "randomized"
    if address_space != "fixed":
        result["address_space_reason"] = address_space.split(": ", 1)[-1]
        print(
            f"warning: address-space randomisation is on ({result['address_space_reason']}): "
            "this code object is valid but not guaranteed byte-reproducible",
            file=sys.stderr,
        )
    try:
        if req.get("protocol") != WORKER_PROTOCOL:
            raise WorkerFailure(
                f"request protocol {req.get('protocol')!r}, worker speaks {WORKER_PROTOCOL}"
            )
        _check_environment(req["arch"])
        launcher, info = _trace(req)
        import flydsl

        info["flydsl_version"] = flydsl.__version__
        _extract(out, info, req["arch"], _artifact_state(launcher))
        _isa(out)
        result.update(info, ok=True)
        _write_json(out / RESULT_FILE, result)
        return 0
    except Exception as e:  # noqa: BLE001 - every failure becomes the job's report
        if isinstance(e, WorkerFailure | MonoError):
            # the worker's own finding, or the kernels' (a plan rule with its numbers, an
            # unsupported layout): the message is the whole story, no traceback
            result["error"], result["error_is_finding"] = str(e), True
            print(f"mono-aot worker: {e}", file=sys.stderr)
        else:
            result["error"] = " ".join(f"{type(e).__name__}: {e}".split())
            result["traceback"] = traceback.format_exc(limit=20)
            print(result["traceback"], file=sys.stderr)
        _write_json(out / RESULT_FILE, result)
        return EXIT_PYTHON_ERROR


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    how = fix_address_space(argv)  # re-execs (does not return) the first time on Linux
    args = [a for a in argv if a != FIXED_MARK]
    if len(args) != 1:
        print("usage: python -m mono_aot.compiler.worker REQUEST.json", file=sys.stderr)
        return 2
    return run(Path(args[0]), how)


if __name__ == "__main__":
    sys.exit(main())
