"""The compile subprocess: one kernel, one fresh interpreter, one private FlyDSL cache.

Run as ``python -P -m mono_aot.compiler.worker request.json`` in the output directory by
``mono_aot.compiler.compile``, which builds the whole environment (``COMPILE_ONLY=1``, ``ARCH``,
``FLYDSL_GPU_ARCH``, ``FLYDSL_DEBUG_DUMP_ASM=1``, a private empty ``FLYDSL_RUNTIME_CACHE_DIR``,
``ROCM_PATH``, all paths relative) before this interpreter starts, so it is in place before
FlyDSL is imported. An LLVM abort kills only this process; the parent reports it.

First thing, on Linux, the worker re-executes itself as a process whose memory layout depends
on no path of this machine (``enter_canonical_process``): the base interpreter by its real path,
its import roots as ``/proc/self/fd/N``, address-space randomisation off (``ADDR_NO_RANDOMIZE``
takes effect at ``execve``). LLVM's optimiser orders some work by pointer value; with a fixed
layout and identical inputs (see ``mono_aot.compiler.compile``) the pointers, and so the bytes,
are the same in every build. If the kernel refuses the flag the compile goes on, ``result.json``
says ``address_space: randomized`` and stderr has a warning.

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
CANONICAL_MARK = "--canonical"  # last argument of the re-executed worker (the same in every build)
ROOT_FD = 10  # the compiling process sees its i-th import root at /proc/self/fd/(ROOT_FD + i)
_ASLR_REASON = "MONO_AOT_WORKER_ASLR"  # why the bootstrap could not fix the address space


def canonical_argv(request: str) -> list[str]:
    """The compiling process's argv after the interpreter: the same in every build."""
    return ["-S", "-P", "-m", "mono_aot.compiler.worker", request, CANONICAL_MARK]


def canonical_pythonpath(n_roots: int) -> str:
    return os.pathsep.join(f"/proc/self/fd/{ROOT_FD + i}" for i in range(n_roots))


def _stdlib_paths() -> set[str]:
    import sysconfig

    plat = sysconfig.get_path("platstdlib")
    zipped = f"python{sys.version_info[0]}{sys.version_info[1]}.zip"
    paths = (
        sysconfig.get_path("stdlib"),
        plat,
        os.path.join(plat, "lib-dynload"),
        os.path.join(sys.base_prefix, "lib", zipped),
    )
    return {os.path.realpath(p) for p in paths}


def import_roots(path: list[str]) -> list[str]:
    """The entries of ``path`` the compile imports from, in order: the standard library (which
    the base interpreter finds by itself), missing entries and repeats of one directory left out."""
    skip, seen, roots = _stdlib_paths(), set(), []
    for p in path:
        if not p or not os.path.exists(p):
            continue
        real = os.path.realpath(p)
        if real not in skip and real not in seen:
            seen.add(real)
            roots.append(p)
    return roots


def _personality() -> tuple[object, int]:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.personality.argtypes = [ctypes.c_ulong]
    libc.personality.restype = ctypes.c_int
    return libc, libc.personality(_QUERY_PERSONALITY)


def _disable_aslr() -> str:
    """Ask for ``ADDR_NO_RANDOMIZE`` at the next exec; '' when granted, else why not."""
    try:
        libc, cur = _personality()
    except (OSError, AttributeError) as e:
        return f"no personality() ({e})"
    if cur != -1 and cur & ADDR_NO_RANDOMIZE:
        return ""
    if cur == -1 or libc.personality(cur | ADDR_NO_RANDOMIZE) == -1:  # type: ignore[attr-defined]
        import ctypes

        return f"personality(ADDR_NO_RANDOMIZE) refused ({os.strerror(ctypes.get_errno())})"
    return ""


def _place_roots(roots: list[str]) -> None:
    """Open every root and put it at descriptor ``ROOT_FD + i``, inheritable across exec."""
    import fcntl

    high = []
    for root in roots:  # first above every target, so no open file sits where a root goes
        fd = os.open(root, os.O_RDONLY)
        high.append(fcntl.fcntl(fd, fcntl.F_DUPFD, ROOT_FD + len(roots)))
        os.close(fd)
    for i, fd in enumerate(high):
        os.dup2(fd, ROOT_FD + i, inheritable=True)
        os.close(fd)


def enter_canonical_process(request: str, *, canonical: bool) -> str:
    """Become the compiling process whose memory layout no path of this machine moves; return
    how its address space runs (``fixed`` or ``randomized: why``).

    The first call (the bootstrap, started by whichever interpreter ran the build) re-executes:
    the base interpreter by its real path (``protocol.worker_interpreter``), with site-packages
    off (``-S``) and ``PYTHONPATH`` naming its import roots (mono_aot, site-packages and the
    directories their ``.pth`` files add) as ``/proc/self/fd/N``, and with address-space
    randomisation off. The strings of argv, environment, ``sys.path`` and every module's
    ``__file__`` are then the same wherever the venv, the checkout or the output directory is,
    and so are the heap addresses LLVM's pointer-ordered passes see. Returns only in the
    re-executed process (or where there is no ``/proc``: not Linux).
    """
    if canonical:
        why = os.environ.pop(_ASLR_REASON, "")
        if not why:
            try:
                _, cur = _personality()
                why = "" if cur != -1 and cur & ADDR_NO_RANDOMIZE else "the flag is not in effect"
            except (OSError, AttributeError) as e:
                why = f"no personality() ({e})"
        return f"randomized: {why}" if why else "fixed"
    if not sys.platform.startswith("linux"):
        return "randomized: not Linux"
    from mono_aot.compiler.protocol import worker_interpreter

    roots = import_roots(sys.path)
    _place_roots(roots)
    env = dict(os.environ, PYTHONPATH=canonical_pythonpath(len(roots)))
    why = _disable_aslr()
    if why:
        env[_ASLR_REASON] = why
    interpreter = worker_interpreter()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(interpreter, [interpreter, *canonical_argv(request)], env)
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
    args = [a for a in argv if a != CANONICAL_MARK]
    if len(args) != 1:
        print("usage: python -m mono_aot.compiler.worker REQUEST.json", file=sys.stderr)
        return 2
    # re-execs (does not return) the first time on Linux
    how = enter_canonical_process(args[0], canonical=CANONICAL_MARK in argv)
    return run(Path(args[0]), how)


if __name__ == "__main__":
    sys.exit(main())
