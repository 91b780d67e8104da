"""Compile one kernel in a fresh subprocess and bring back its code object, metadata and ISA.

``compile_kernel`` is the library entry point the build command and the kernel authors use.
It spawns ``python -m mono_aot.compiler.worker`` in the output directory with an environment built
from scratch (nothing inherited but the interpreter), a private empty FlyDSL cache, and
``ROCM_PATH`` pointing at a folder whose ``llvm/bin/ld.lld`` runs the chosen linker.

Why the bytes are reproducible (README, "Why builds are reproducible"). FlyDSL's LLVM optimisation pipeline (O1 and up; O0 is
stable) orders some work by pointer value, so the same MLIR gives different register assignments
when the heap sits at different addresses: repeating ``gpu-module-to-binary`` on one parsed
module inside one process gives several different code objects. No FlyDSL or LLVM option turns
that off, so the build removes the variation from the process instead:

* the worker re-executes itself with address-space randomisation off
  (``personality(ADDR_NO_RANDOMIZE)``), so every mapping starts at the same address, as the base
  interpreter by its real path with its import roots at ``/proc/self/fd/N``, so no string in
  the process depends on how the build was started or where the venv and the checkout are
  (``mono_aot.compiler.worker.enter_canonical_process``);
* the worker's inputs are byte-identical for identical build inputs wherever the output
  directory is: the same argv (``request.json``, relative), an environment made here from
  constants (every path in it relative to the working directory), no ``sys.path`` entry for the
  working directory (``-P``), and no bytecode cache (``PYTHONPYCACHEPREFIX`` names a directory
  that never has any and ``PYTHONDONTWRITEBYTECODE``), so each module is compiled from source
  the same way rather than from a ``.pyc`` one time and from source the next.

A single-threaded process (FlyDSL turns MLIR threading off) with a fixed address-space layout
and identical inputs makes the same allocations at the same addresses, so LLVM sees the same
pointers and emits the same bytes. Where the kernel refuses ``ADDR_NO_RANDOMIZE`` (some
container seccomp profiles) the worker still compiles, reports ``address_space: randomized``
and warns on stderr: the blob is valid but not guaranteed reproducible.

Every compile also runs FlyDSL's ISA dump (``FLYDSL_DEBUG_DUMP_ASM``), so one compile gives the
code object (from the in-memory artifact) and the ISA text.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mono_aot.compiler.codeobject import CodeObjectError, CodeObjectInfo, parse_code_object
from mono_aot.compiler.protocol import (
    CODE_FILE,
    ISA_FILE,
    RESULT_FILE,
    WORKER_PROTOCOL,
    worker_interpreter,
)
from mono_aot.compiler.toolchain import Linker, find_linker, prepare_rocm_dir
from mono_aot.compiler.worker import canonical_argv
from mono_aot.keys import Provider
from mono_aot.spec.errors import MonoError
from mono_aot.spec.layouts import Layout

DEFAULT_TIMEOUT_S = 1800.0  # a worker that runs longer is killed and its job fails

# Paths in the worker's environment, relative to its working directory (the output directory),
# so the environment does not depend on where that directory is.
CACHE_DIR = "flydsl-cache"
ROCM_DIR = "rocm"
DUMP_DIR = "isa-dump"
TMP_DIR = "tmp"
NO_PYC_DIR = "no-pyc"  # never created: Python finds no bytecode and writes none
REQUEST_FILE = "request.json"


def compile_options(arch: str) -> dict[str, str]:
    """The worker's environment apart from ``PYTHONPATH``: constants and relative paths only.

    Everything here can change the bytes or the process layout, so all of it is in the build
    inputs; nothing is inherited from the caller's shell.
    """
    return {
        "COMPILE_ONLY": "1",
        "ARCH": arch,
        "FLYDSL_GPU_ARCH": arch,
        "FLYDSL_COMPILE_BACKEND": "rocm",
        "FLYDSL_COMPILE_OPT_LEVEL": "2",
        "FLYDSL_DEBUG_ENABLE_DEBUG_INFO": "0",
        "FLYDSL_DEBUG_DUMP_ASM": "1",  # FlyDSL's per-fragment pipeline plus the ISA text
        "FLYDSL_DUMP_DIR": DUMP_DIR,
        "FLYDSL_RUNTIME_ENABLE_CACHE": "0",  # the artifact is taken from memory
        "FLYDSL_RUNTIME_CACHE_DIR": CACHE_DIR,  # private, stays empty
        "ROCM_PATH": ROCM_DIR,
        "TMPDIR": TMP_DIR,  # the serializer's temporary link files
        "HOME": ".",
        "PATH": os.defpath,
        "LC_ALL": "C",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPYCACHEPREFIX": NO_PYC_DIR,
    }


def options_identity(arch: str) -> dict[str, Any]:
    """What enters the build inputs for the compile options."""
    return {
        "env": compile_options(arch),
        "worker_protocol": WORKER_PROTOCOL,
        "worker_argv": canonical_argv(REQUEST_FILE),
        # the compiling interpreter: its path is in every module name of the standard library,
        # so it moves bytes; recorded as a digest (entries carry no paths of the build host)
        "interpreter": {
            "version": sys.version,
            "path_sha256": hashlib.sha256(worker_interpreter().encode()).hexdigest(),
        },
        "address_space": "fixed",  # the worker runs with ADDR_NO_RANDOMIZE (Linux)
        "device_libs": "none",  # ROCM_PATH holds only the linker: no ocml/ockl bitcode
    }


def _worker_argv() -> list[str]:
    # the bootstrap: this interpreter, so the worker finds what this process imports; it
    # re-executes as the canonical process (mono_aot.compiler.worker.enter_canonical_process).
    # -P: no sys.path entry for the working directory
    return [sys.executable, "-P", "-m", "mono_aot.compiler.worker", REQUEST_FILE]


class CompileError(MonoError):
    """A compile job failed: the worker aborted, timed out, raised, or produced no code."""

    def __init__(self, message: str, stderr: str = "", seconds: float = 0.0) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.seconds = seconds


@dataclass(frozen=True)
class CompileResult:
    code_object: bytes
    metadata: CodeObjectInfo
    stderr: str
    seconds: float
    worker: dict[str, Any] = field(default_factory=dict)  # result.json of the worker
    isa: str = ""  # FlyDSL's ISA dump of the same compile

    @property
    def reproducible(self) -> bool:
        """Whether the worker ran with a fixed address-space layout (see the module doc)."""
        return self.worker.get("address_space") == "fixed"


def one_line(text: str) -> str:
    """A message as one line (a failure is reported as one line; the worker's stderr holds the
    rest)."""
    return " ".join(text.split())


_DIAGNOSTIC = ("error", "Assertion", "LLVM ERROR", "Error:", "abort")


def diagnostic_line(stderr: str) -> str:
    """The last stderr line that reads like a diagnostic (an LLVM assertion or error), else the
    last non-empty line; never Python source lines of a traceback."""
    kept = [
        ln.strip()
        for ln in stderr.splitlines()
        if ln.strip() and not ln.startswith("    ") and not ln.startswith("  File ")
    ]
    diag = [ln for ln in kept if any(d in ln for d in _DIAGNOSTIC)]
    return (diag or kept or [""])[-1]


def _child_env(arch: str) -> dict[str, str]:
    env = compile_options(arch)
    # the worker must import this same mono_aot, wherever it is installed or checked out (the
    # one absolute path: it is the same for every build with this install)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


def compile_kernel(
    provider: Provider,
    variant: str,
    layout: Layout,
    arch: str,
    out_dir: Path,
    *,
    linker: Linker | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> CompileResult:
    """Compile ``variant`` of ``provider`` for ``layout`` on ``arch`` in a subprocess.

    ``out_dir`` (created, should be empty) receives the worker's files: the request,
    ``code.hsaco``, ``isa.s``, ``result.json``, ``stderr.txt``, the ISA dump and an empty FlyDSL
    cache. Raises ``CompileError`` (one line; its ``stderr`` is the worker's whole stderr) when
    the worker fails in any way. One compile gives the code object, its metadata and the ISA.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    linker = linker or find_linker()
    prepare_rocm_dir(linker, out / ROCM_DIR)
    (out / CACHE_DIR).mkdir(exist_ok=True)
    (out / TMP_DIR).mkdir(exist_ok=True)
    request = {
        "protocol": WORKER_PROTOCOL,
        "module": provider.module,
        "search_path": str(provider.search_path) if provider.search_path else None,
        "variant": variant,
        "layout": layout.model_dump(mode="json"),
        "arch": arch,
        "out_dir": ".",  # the worker's working directory; relative so the request is the same
    }
    req_path = out / REQUEST_FILE
    req_path.write_text(json.dumps(request, indent=1, sort_keys=True))
    err_path = out / "stderr.txt"
    t0 = time.perf_counter()
    with open(err_path, "wb") as err, open(out / "stdout.txt", "wb") as so:
        env = _child_env(arch)
        with _LIVE_LOCK:  # spawn and register as one step, so an interrupt kills every worker
            if _STOPPING.is_set():
                raise CompileError(f"{provider.module} {variant} for {arch}: the build was stopped")
            proc = subprocess.Popen(
                _worker_argv(),
                stdin=subprocess.DEVNULL,
                stdout=so,
                stderr=err,
                env=env,
                cwd=out,
                start_new_session=True,  # a timeout kill takes the worker's children too
            )
            _LIVE.add(proc)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    seconds = time.perf_counter() - t0
    stderr = err_path.read_text(errors="replace")
    what = f"{provider.module} {variant} for {arch}"
    if rc is None:
        raise CompileError(
            f"{what}: the compile did not finish within {timeout:g} s and was killed",
            stderr,
            seconds,
        )
    result: dict[str, Any] = {}
    if (out / RESULT_FILE).is_file():
        result = json.loads((out / RESULT_FILE).read_text())
    if rc != 0 or not result.get("ok"):
        if rc is not None and rc < 0:
            # LLVM aborts the process: its last diagnostic line says why (the rest is in the
            # worker's stderr, which the job's JSON carries)
            how = f"the compiler process died with signal {-rc}"
            why = diagnostic_line(stderr)
            how += f": {why}" if why else ""
        elif result.get("error"):
            how = result["error"]  # a finding (the rule and its numbers) or "Type: message"
        else:
            how = f"the compiler process exited with status {rc}"
            why = diagnostic_line(stderr)
            how += f": {why}" if why else ""
        raise CompileError(one_line(f"{what}: {how}"), stderr, seconds)
    code = (out / CODE_FILE).read_bytes()
    try:
        meta = parse_code_object(code)
    except CodeObjectError as e:
        raise CompileError(f"{what}: the code object is unreadable: {e}", stderr, seconds) from None
    return CompileResult(code, meta, stderr, seconds, result, (out / ISA_FILE).read_text())


_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def kill_running_workers(*, stop: bool = True) -> int:
    """Kill every compile worker this process has running (an interrupted build) and, with
    ``stop``, refuse to start more until ``allow_workers()``; returns how many were killed."""
    with _LIVE_LOCK:
        if stop:
            _STOPPING.set()
        procs = list(_LIVE)
    for proc in procs:
        _kill_group(proc)
    return len(procs)


def allow_workers() -> None:
    _STOPPING.clear()


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def disassemble(
    provider: Provider, variant: str, layout: Layout, arch: str, out_dir: Path, **kw: Any
) -> str:
    """The ISA text FlyDSL prints for the kernel (``FLYDSL_DEBUG_DUMP_ASM``), for tests that
    look at instructions. ``compile_kernel(...).isa`` has the same text with the code object."""
    return compile_kernel(provider, variant, layout, arch, out_dir, **kw).isa
