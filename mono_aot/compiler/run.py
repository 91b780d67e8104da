"""Run a build plan: compile each miss in its own subprocess, check it, publish it.

Jobs run on a thread pool of ``-j`` threads, each thread waiting on its own worker subprocess.
Publishing goes through ``Store.get_or_build``, whose per-key lock makes concurrent builds of one
store (threads or processes) compile each key once.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mono_aot import __version__
from mono_aot.compiler.checks import Expectation, Violation, check
from mono_aot.compiler.compile import (
    DEFAULT_TIMEOUT_S,
    CompileError,
    CompileResult,
    allow_workers,
    compile_kernel,
    kill_running_workers,
)
from mono_aot.compiler.plan import Job, Toolchain, contract_kernargs, stale_reason
from mono_aot.keys import Provider
from mono_aot.spec.errors import SIGNAL_POLL_S, MonoError
from mono_aot.spec.util import sha256_hex
from mono_aot.store import Entry, Store
from mono_aot.store.entry import BlobRef, ElfInfo, KernargSlot, Launch, Provenance, Resources

HIT, BUILT, REBUILT, FAILED = "hit", "built", "rebuilt", "failed"


class CheckFailed(MonoError):
    """The code object broke a publish rule; nothing was published."""

    def __init__(self, violations: list[Violation], seconds: float = 0.0) -> None:
        self.violations = violations
        self.seconds = seconds
        super().__init__("; ".join(str(v) for v in violations))


@dataclass
class JobResult:
    job: Job
    status: str  # hit, built, rebuilt, failed
    seconds: float = 0.0
    compiled: bool = False  # this process ran a compile for the job
    reason: str = ""  # failure message, or why an entry was stale
    violations: list[Violation] = field(default_factory=list)
    stderr: str = ""  # a failed compile: the worker's whole stderr (in --json only)
    blob_sha256: str | None = None
    layer: str | None = None
    entry: Entry | None = field(default=None, repr=False)

    def as_json(self) -> dict[str, Any]:
        return {
            **self.job.as_json(),
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "compiled": self.compiled,
            "reason": self.reason or None,
            "violations": [v.as_json() for v in self.violations],
            "stderr": self.stderr or None,
            "blob_sha256": self.blob_sha256,
            "layer": self.layer,
        }


def make_entry(
    job: Job, res: CompileResult, kernargs: Sequence[tuple[str, int, int]], toolchain: Toolchain
) -> Entry:
    """The entry document for a checked compile result (every field from the code object)."""
    assert res.metadata is not None
    meta = res.metadata
    k = meta.kernels[0]
    return Entry(
        key=job.key,
        variant=job.variant,
        arch=job.arch,
        layout=job.layout.name,
        lookup_inputs=job.lookup_inputs,
        build_inputs=job.build_inputs,
        blob=BlobRef(sha256=sha256_hex(res.code_object), size=len(res.code_object)),
        symbol=k.name,
        launch=Launch(
            grid=job.layout.ctas(job.arch),
            block=job.layout.kernel.threads,
            dynamic_lds=_dynamic_lds(res.worker, k.name),
        ),
        kernarg_segment_size=k.kernarg_segment_size,
        kernargs=[
            KernargSlot(name=name, offset=a.offset, size=a.size, value_kind=a.value_kind)
            for (name, _, _), a in zip(kernargs, k.args, strict=True)
        ],
        resources=Resources(
            vgpr=k.vgpr,
            agpr=k.agpr,
            sgpr=k.sgpr,
            lds=k.lds,
            scratch=k.scratch,
            vgpr_spill=k.vgpr_spill,
            sgpr_spill=k.sgpr_spill,
            wavefront_size=k.wavefront_size,
            max_flat_workgroup_size=k.max_flat_workgroup_size,
            code_bytes=meta.text_bytes,
        ),
        elf=ElfInfo(
            machine=meta.machine,
            osabi=meta.osabi,
            abi_version=meta.abi_version,
            e_flags=meta.e_flags,
        ),
        provenance=Provenance(
            mono_aot_version=__version__,
            flydsl_version=str(res.worker.get("flydsl_version", toolchain.flydsl_version)),
            linker_version=toolchain.linker.version,
            built_at=datetime.now(UTC).isoformat(timespec="seconds"),
            build_seconds=round(res.seconds, 3),
            address_space="fixed" if res.reproducible else "randomized",
        ),
    )


def _dynamic_lds(worker: dict[str, Any], kernel: str) -> int:
    mine = [la for la in worker.get("launches", []) if la.get("kernel") == kernel]
    return int(mine[0]["dynamic_lds"]) if mine else 0


def compile_and_check(
    job: Job,
    provider: Provider,
    toolchain: Toolchain,
    work_dir: Path,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> tuple[Entry, bytes]:
    """Compile ``job`` and return its entry and blob, or raise CompileError / CheckFailed."""
    res = compile_kernel(
        provider,
        job.variant,
        job.layout,
        job.arch,
        work_dir,
        linker=toolchain.linker,
        timeout=timeout,
    )
    assert res.metadata is not None
    kernargs = contract_kernargs(provider, job.layout, res.worker)
    # FlyDSL names a kernel ``<function>_0``, or exactly ``name`` given to @flyc.kernel(name=...)
    base = str(res.worker.get("kernel_function"))
    present = {k.name for k in res.metadata.kernels}
    kernel = next((n for n in (base, f"{base}_0") if n in present), f"{base}_0")
    exp = Expectation(
        kernel=kernel,
        arch=job.arch,
        ctas=job.layout.ctas(job.arch),
        threads=job.layout.kernel.threads,
        kernargs=kernargs,
    )
    bad = check(exp, res.code_object, res.metadata, res.stderr, res.worker.get("launches", []))
    if bad:
        raise CheckFailed(bad, res.seconds)
    return make_entry(job, res, kernargs, toolchain), res.code_object


def run_jobs(
    jobs: Sequence[Job],
    store: Store,
    provider: Provider,
    toolchain: Toolchain,
    *,
    parallel: int,
    force: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    on_result: Callable[[JobResult], None] | None = None,
) -> list[JobResult]:
    """Build every job (at most ``parallel`` compiles at once); results in plan order."""
    lock = threading.Lock()
    stopping = threading.Event()  # interrupted: the killed jobs' reports are noise

    def one(job: Job) -> JobResult:
        try:
            res = _run_one(job, store, provider, toolchain, force=force, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - one job's failure never stops the others
            res = JobResult(job, FAILED, reason=f"{type(e).__name__}: {e}")
        if on_result is not None and not stopping.is_set():
            with lock:
                on_result(res)
        return res

    allow_workers()
    ex = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="mono-aot-build")
    try:
        futures = [ex.submit(one, job) for job in jobs]
        # wait in slices: the kernel may deliver Ctrl-C to a pool thread, and Python runs the
        # handler only when the main thread wakes; a wait with no timeout would sleep through
        # it until a job finished (the hang fixture's: never)
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=SIGNAL_POLL_S)
        return [f.result() for f in futures]
    except BaseException:  # Ctrl-C: the workers run in their own sessions, stop them here
        stopping.set()
        ex.shutdown(wait=False, cancel_futures=True)
        kill_running_workers()
        raise
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _run_one(
    job: Job, store: Store, provider: Provider, toolchain: Toolchain, *, force: bool, timeout: float
) -> JobResult:
    current = store.lookup(job.key, accept=lambda e: e.build_inputs == job.build_inputs)
    before = current or store.lookup(job.key)
    if current is not None and not force:
        return JobResult(
            job,
            HIT,
            blob_sha256=before.entry.blob.sha256,
            layer=before.layer.label,
            entry=before.entry,
        )
    stale = ""
    if before is not None and before.entry.build_inputs != job.build_inputs:
        stale = stale_reason(before.entry.build_inputs, job.build_inputs)
    seen = before.entry if before is not None else None

    def accept(e: Entry) -> bool:
        if e.build_inputs != job.build_inputs:
            return False
        return not (force and seen is not None and e == seen)  # --force: not the one we saw

    compiled = False  # whether this process ran the compile (counted in --json)

    def build() -> tuple[Entry, bytes]:
        nonlocal compiled
        compiled = True
        with tempfile.TemporaryDirectory(prefix="mono-aot-build-") as tmp:
            return compile_and_check(job, provider, toolchain, Path(tmp), timeout=timeout)

    try:
        hit, built = store.get_or_build(job.key, build, accept=accept)
    except CheckFailed as e:
        return JobResult(
            job, FAILED, seconds=e.seconds, compiled=True, reason=str(e), violations=e.violations
        )
    except CompileError as e:
        return JobResult(
            job, FAILED, seconds=e.seconds, compiled=compiled, reason=str(e), stderr=e.stderr
        )
    if not built:  # another builder published it while we waited for the key's lock
        return JobResult(
            job, HIT, blob_sha256=hit.entry.blob.sha256, layer=hit.layer.label, entry=hit.entry
        )
    status = REBUILT if (stale or (force and seen is not None)) else BUILT
    return JobResult(
        job,
        status,
        seconds=hit.entry.provenance.build_seconds,
        compiled=True,
        reason=stale or ("--force" if status == REBUILT else ""),
        blob_sha256=hit.entry.blob.sha256,
        layer=hit.layer.label,
        entry=hit.entry,
    )
