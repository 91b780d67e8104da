"""Compile one kernel in a fresh subprocess and bring back its code object and metadata.

``compile_kernel`` is the library entry point the build command and the kernel authors use.
It spawns ``python -m mono_aot.build.worker`` with a scrubbed environment (no inherited
``FLYDSL_*``), the compile variables set before the interpreter starts, a private empty FlyDSL
cache, and ``ROCM_PATH`` pointing at a folder whose ``llvm/bin/ld.lld`` runs the chosen linker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mono_aot.build.codeobject import CodeObjectError, CodeObjectInfo, parse_code_object
from mono_aot.build.protocol import CODE_FILE, ISA_FILE, RESULT_FILE, WORKER_PROTOCOL
from mono_aot.errors import MonoError
from mono_aot.keys import Provider
from mono_aot.layouts import Layout
from mono_aot.toolchain import Linker, find_linker, prepare_rocm_dir

DEFAULT_TIMEOUT_S = 1800.0  # a worker that runs longer is killed and its job fails
STDERR_TAIL_LINES = 25

# Environment variables dropped from the inherited environment: anything that steers FlyDSL,
# the target or the ROCm install must come from the build, never from the caller's shell.
_SCRUB_PREFIXES = ("FLYDSL_", "MLIR_", "LLVM_", "AMD_", "HIP_", "ROC", "HSA_")
_SCRUB_NAMES = {"COMPILE_ONLY", "ARCH", "ROCM_PATH", "ROCM_HOME", "PYTHONPATH", "PYTHONHASHSEED"}


def compile_options(arch: str) -> dict[str, str]:
    """The compile environment that can change the bytes (paths excluded: they cannot)."""
    return {
        "COMPILE_ONLY": "1",
        "ARCH": arch,
        "FLYDSL_GPU_ARCH": arch,
        "FLYDSL_COMPILE_BACKEND": "rocm",
        "FLYDSL_COMPILE_OPT_LEVEL": "2",
        "FLYDSL_DEBUG_ENABLE_DEBUG_INFO": "0",
        "FLYDSL_RUNTIME_ENABLE_CACHE": "1",
        "PYTHONHASHSEED": "0",
    }


def options_identity(arch: str) -> dict[str, Any]:
    """What enters the build inputs for the compile options."""
    return {
        "env": compile_options(arch),
        "worker_protocol": WORKER_PROTOCOL,
        "device_libs": "none",  # ROCM_PATH holds only the linker: no ocml/ockl bitcode
    }


class CompileError(MonoError):
    """A compile job failed: the worker aborted, timed out, raised, or produced no code."""

    def __init__(self, message: str, stderr: str = "", seconds: float = 0.0) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.seconds = seconds


@dataclass(frozen=True)
class CompileResult:
    code_object: bytes
    metadata: CodeObjectInfo | None  # None in isa mode
    stderr: str
    seconds: float
    worker: dict[str, Any] = field(default_factory=dict)  # result.json of the worker
    isa: str | None = None


def stderr_tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    kept = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def _child_env(arch: str, cache_dir: Path, rocm_dir: Path, dump_dir: Path | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _SCRUB_NAMES and not k.startswith(_SCRUB_PREFIXES)
    }
    env.update(compile_options(arch))
    env["FLYDSL_RUNTIME_CACHE_DIR"] = str(cache_dir)
    env["ROCM_PATH"] = str(rocm_dir)
    env["FLYDSL_DUMP_DIR"] = str(dump_dir or cache_dir.parent / "dump")
    if dump_dir is not None:
        env["FLYDSL_DEBUG_DUMP_ASM"] = "1"
    # the worker must import this same mono_aot, wherever it is installed or checked out
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
    mode: Literal["compile", "isa"] = "compile",
) -> CompileResult:
    """Compile ``variant`` of ``provider`` for ``layout`` on ``arch`` in a subprocess.

    ``out_dir`` (created, should be empty) receives the worker's files: the FlyDSL cache, the
    request, ``code.hsaco``, ``result.json``, ``stderr.txt``. Raises ``CompileError`` with the tail
    of the worker's stderr when the worker fails in any way.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    linker = linker or find_linker()
    rocm = prepare_rocm_dir(linker, out / "rocm")
    cache = out / "flydsl-cache"
    cache.mkdir(exist_ok=True)
    dump = out / "isa-dump" if mode == "isa" else None
    request = {
        "protocol": WORKER_PROTOCOL,
        "module": provider.module,
        "search_path": str(provider.search_path) if provider.search_path else None,
        "variant": variant,
        "layout": layout.model_dump(mode="json"),
        "arch": arch,
        "out_dir": str(out),
        "mode": mode,
    }
    req_path = out / "request.json"
    req_path.write_text(json.dumps(request, indent=1, sort_keys=True))
    err_path = out / "stderr.txt"
    t0 = time.perf_counter()
    with open(err_path, "wb") as err, open(out / "stdout.txt", "wb") as so:
        env = _child_env(arch, cache, rocm, dump)
        with _LIVE_LOCK:  # spawn and register as one step, so an interrupt kills every worker
            if _STOPPING.is_set():
                raise CompileError(f"{provider.module} {variant} for {arch}: the build was stopped")
            proc = subprocess.Popen(
                [sys.executable, "-m", "mono_aot.build.worker", str(req_path)],
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
        lines = STDERR_TAIL_LINES
        if rc is not None and rc < 0:
            how = f"the compiler process died with signal {-rc}"
        elif result.get("error"):
            how, lines = result["error"], 6  # the message says it; the tail shows where
        else:
            how = f"the compiler process exited with status {rc}"
        tail = stderr_tail(stderr, lines)
        raise CompileError(f"{what}: {how}" + (f"\n{tail}" if tail else ""), stderr, seconds)
    if mode == "isa":
        return CompileResult(b"", None, stderr, seconds, result, (out / ISA_FILE).read_text())
    code = (out / CODE_FILE).read_bytes()
    try:
        meta = parse_code_object(code)
    except CodeObjectError as e:
        raise CompileError(f"{what}: the code object is unreadable: {e}", stderr, seconds) from None
    return CompileResult(code, meta, stderr, seconds, result)


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
    look at instructions. A separate compile: dumping bypasses FlyDSL's cache."""
    return compile_kernel(provider, variant, layout, arch, out_dir, mode="isa", **kw).isa or ""
