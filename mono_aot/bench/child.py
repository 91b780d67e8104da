"""One measured process of ``mono-aot bench``: a fresh interpreter that times itself.

Run as a script (``python -P .../mono_aot/bench/child.py MODE ...``), not with ``-m``, so
nothing of ``mono_aot`` is imported before the clock starts. It prints one line
``MONO_AOT_BENCH {json}`` with its own wall (``time.perf_counter``) and CPU
(``time.process_time``) figures; the parent times the whole process from outside.

Modes (the parent sets the environment of each before this interpreter starts):

* ``import MODULE``: torch first (as in a vLLM worker), then ``import MODULE``.
* ``flydsl ARCH LAYOUT REPEATS VARIANT...``: torch, ``import flydsl``, then each variant's
  launcher of the kernel provider built and called with its trace arguments, then called
  ``REPEATS`` more times in the same process (what a serving path that launches through the JIT
  launcher pays every step). With an empty FlyDSL cache and ``COMPILE_ONLY=1`` FlyDSL compiles
  just in time and fills its cache; with ``FLYDSL_RUNTIME_RUN_ONLY=1`` it serves the cache or
  raises. The kernel provider is imported by name here, in this subprocess only: the bench never
  imports the kernels in its own process.
* ``bind ARCH LAYOUT REPEATS HIP LAUNCHES``: torch, the runtime's imports, then both kernels
  bound: keys, lookup, verified bytes, target and kernarg checks and, with ``HIP=stand-in``,
  module load through the stand-in HIP library (``MONO_AOT_HIP_LIBRARY``); with ``HIP=none`` up
  to the driver call. Then ``REPEATS`` more binds in the same process and, with the stand-in,
  ``LAUNCHES`` launches of each kernel through mono-aot's launcher (kernarg packing and the
  ``hipModuleLaunchKernel`` call; the stand-in returns at once).
"""

from __future__ import annotations

import json
import sys
import time

MARK = "MONO_AOT_BENCH "


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t: tuple[float, float]) -> dict[str, float]:
    w, c = _clock()
    return {"wall": w - t[0], "cpu": c - t[1]}


def _emit(doc: dict) -> None:
    sys.stdout.write(MARK + json.dumps(doc) + "\n")
    sys.stdout.flush()


def _torch() -> dict[str, float]:
    t = _clock()
    import torch  # noqa: F401 - a vLLM worker has torch imported before anything else

    return _since(t)


def mode_import(module: str) -> dict:
    import importlib

    torch = _torch()
    t = _clock()
    importlib.import_module(module)
    return {"torch": torch, "import": _since(t)}


def mode_flydsl(arch: str, layout_name: str, repeats: int, variants: list[str]) -> dict:
    import importlib
    import os

    torch = _torch()
    t = _clock()
    import flydsl

    imports = _since(t)
    from mono_aot.keys import REAL_PROVIDER
    from mono_aot.spec.layouts import resolve_layout

    layout = resolve_layout(layout_name)
    t = _clock()
    provider = importlib.import_module(REAL_PROVIDER)
    per_variant, launchers = {}, {}
    for v in variants:
        tv = _clock()
        launchers[v] = provider.launcher_for(v, layout, arch), tuple(provider.trace_args(v, layout))
        ret = launchers[v][0](*launchers[v][1])
        if ret is not None:
            raise SystemExit(f"the {v} launcher returned {ret!r} under COMPILE_ONLY=1")
        per_variant[v] = _since(tv)
    kernels = _since(t)
    repeated: dict[str, list] = {v: [] for v in variants}
    for _ in range(repeats):
        for v, (launcher, args) in launchers.items():
            tv = _clock()
            launcher(*args)
            repeated[v].append(_since(tv))
    cache = os.environ.get("FLYDSL_RUNTIME_CACHE_DIR", "")
    files = sum(len(fs) for _, _, fs in os.walk(cache)) if cache else 0
    return {
        "torch": torch,
        "imports": imports,
        "kernels": kernels,
        "per_variant": per_variant,
        "repeated": repeated,
        "cache_files": files,
        "flydsl_version": flydsl.__version__,
    }


def mode_bind(arch: str, layout_name: str, repeats: int, hip: str, launches: int) -> dict:
    torch = _torch()
    t = _clock()
    import mono_aot.runtime  # noqa: F401

    import_runtime = _since(t)
    t = _clock()
    # what binding uses, imported before the bind is timed (a vLLM worker imports them once)
    import mono_aot.store  # noqa: F401 - the lookup's store, imported lazily by the runtime
    from mono_aot.keys import served_key
    from mono_aot.runtime.device import DeviceFacts, TorchHipDevice
    from mono_aot.runtime.loader import check_kernargs, check_target, load_launcher, unload_all
    from mono_aot.runtime.miss import find_or_build
    from mono_aot.spec.arch import ARCHS
    from mono_aot.spec.layouts import resolve_layout

    imports = _since(t)

    bound = {}

    def bind_stand_in() -> list[str]:
        layout = resolve_layout(layout_name)
        device = TorchHipDevice()
        out = []
        for v in layout.variants():
            launcher = load_launcher(v, layout, device)
            if not launcher.function:
                raise SystemExit(f"the {v} kernel has no function handle")
            out.append(launcher.entry.key)
            bound[v] = launcher
        return out

    def bind_no_hip() -> list[str]:
        # up to the driver call: what load_launcher does before hipModuleLoadData
        layout = resolve_layout(layout_name)
        facts = DeviceFacts(0, f"{arch}:sramecc+:xnack-", layout.ctas(arch))
        out = []
        for v in layout.variants():
            key = served_key(v, layout, arch)
            hit = find_or_build(key, v, layout, arch)
            check_target(hit.data, hit.entry, facts)
            if hit.entry.launch.grid != facts.cus:
                raise SystemExit(f"the {v} kernel's grid is not {facts.cus}")
            check_kernargs(hit.entry, layout.parallel.tp)
            out.append(hit.entry.key)
        return out

    bind = bind_stand_in if hip == "stand-in" else bind_no_hip
    assert ARCHS[arch]  # the arch is one the runtime knows
    t = _clock()
    keys = bind()
    first = _since(t)
    again = []
    for _ in range(repeats):
        if hip == "stand-in":
            unload_all()  # each repeat loads the modules again (not timed)
        t = _clock()
        if bind() != keys:
            raise SystemExit("a repeated bind served other keys")
        again.append(_since(t))
    launched: dict[str, list] = {v: [] for v in bound}
    for v, launcher in bound.items():
        args = (0,) * len(launcher.slots)  # null pointers: the stand-in runs nothing
        for _ in range(launches):
            t = _clock()
            launcher(*args)
            launched[v].append(_since(t))
    return {
        "torch": torch,
        "import_runtime": import_runtime,
        "imports": imports,
        "first": first,
        "repeats": again,
        "keys": keys,
        "launches": launched,
        "mono_aot_from": "wheel" if "site-packages" in mono_aot.runtime.__file__ else "source",
    }


def main(argv: list[str]) -> int:
    mode, args = argv[0], argv[1:]
    if mode == "import":
        doc = mode_import(args[0])
    elif mode == "flydsl":
        doc = mode_flydsl(args[0], args[1], int(args[2]), args[3:])
    elif mode == "bind":
        doc = mode_bind(args[0], args[1], int(args[2]), args[3], int(args[4]))
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    _emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
