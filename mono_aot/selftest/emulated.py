"""The selftest's checks on emulated devices: ``mono-aot emulate``.

The stored code objects run, byte for byte, on ``tp`` devices of ``mono_aot.emulator`` in this
process, bound by the runtime's own ``DrafterRunner`` and launchers exactly as on a GPU: the
runner sees an ``EmulatedDevice`` whose HIP calls (module load, occupancy, launch) the
emulator answers. Tensors are CPU torch tensors; the emulator's global memory is a map of their
storages at their real addresses, so whatever the kernels write lands in them and an access
outside every mapped tensor is an error naming the instruction, lane and address.

Stream order is kept: each rank runs its step in a thread of its own, and a launch returns only
after the emulator ran it, which it does once every rank still stepping has launched (the
ranks' kernels run together, exchanging through each other's peer buffers). A rank that plays
dead simply does not step. The problems, references and verdicts are the selftest's
(``mono_aot.selftest.cases``), so a check means the same here as on four GPUs, except for what
the emulator does not model (README, "Emulator").
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mono_aot.runtime.device import DeviceFacts
from mono_aot.selftest import CheckResult, Session
from mono_aot.spec.errors import SIGNAL_POLL_S, BadInput, MonoError

if TYPE_CHECKING:
    import numpy as np
    import torch

    from mono_aot.emulator.machine import Machine
    from mono_aot.reference import Problem
    from mono_aot.spec.layouts import Layout

CHECKS: tuple[str, ...] = ("narrow", "wide", "multi-launch", "dead-rank")
# The dead-rank kernels' wait bound, in the emulator's virtual time: far above the few
# hundred microseconds a small layout's launch takes, and cheap to spin through.
EMULATED_WAIT_S = 0.002
# The emulated time a launch of a small layout may take at most (the small layout's take
# 0.1-0.3 ms): a rank gives up on a dead peer within its wait bound plus this.
EMULATED_LAUNCH_S = 0.001
# What a launch costs the emulator, measured on the shipped layout's kernels on this project's
# 2-core build host (README, "Emulator"): wave-instructions per byte of one rank's fp8 weights
# (4 ranks; a 1-request narrow step 440 M on gfx942 and 419 M on gfx950, a 3-request wide step
# 236 M and 181 M), wave-instructions a second on one core (narrow 1.29-1.53 M, wide 0.50-0.56
# M) and resident bytes per model weight (peak 5.7-7.2 GB at 1.67 G weights, the model held as
# fp8 codes and scales: reference.random_packed_model).
INSTRUCTIONS_PER_WEIGHT_BYTE = {"narrow": 0.264, "wide": 0.142}
INSTRUCTIONS_PER_SECOND = {"narrow": 1_300_000, "wide": 520_000}
BYTES_PER_WEIGHT = 4.5
PROGRESS_EVERY = 5_000_000  # wave-instructions between two progress lines on a terminal
TEST_LAYOUT = "emulator-tiny-tp4"  # the small layout shipped for the emulator (layouts/)


class EmulationFailed(MonoError):
    """The emulator stopped a launch (a fault it detected: out-of-bounds access, a register
    read before its load retired, an unknown encoding)."""


@dataclass
class Totals:
    """What the emulator did: wave-instructions executed, host and virtual seconds, and its
    runs (one a step's launch: each rank's launch runs side by side with its peers')."""

    instructions: int = 0
    seconds: float = 0.0
    virtual_seconds: float = 0.0
    runs: int = 0
    longest_run_s: float = 0.0

    def add(self, stats: Any) -> None:
        self.instructions += int(stats.instructions)
        self.seconds += float(stats.seconds)
        self.virtual_seconds += float(stats.virtual_seconds)
        self.runs += 1
        self.longest_run_s = max(self.longest_run_s, float(stats.seconds))

    @staticmethod
    def peak_memory_bytes() -> int:
        """This process's peak resident memory (Linux reports kilobytes)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    @property
    def per_second(self) -> float:
        return self.instructions / self.seconds if self.seconds > 0 else 0.0


class LaunchGate:
    """Runs the emulator once every stepping rank has launched; a launch returns after it ran.

    A rank thread ``enter``s before its step and ``leave``s after it; ``launch`` queues the
    kernel and waits. The last rank to arrive (or to leave while others wait) runs the machine
    with the lock held: the others are all waiting, so nothing else touches it.
    """

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.cv = threading.Condition()
        self.active = 0
        self.waiting = 0
        self.generation = 0
        self.error: BaseException | None = None
        self.totals = Totals()

    def enter(self) -> None:
        with self.cv:
            self.active += 1

    def leave(self) -> None:
        with self.cv:
            self.active -= 1
            self._run_if_all_waiting()

    def launch(self, queue: Callable[[], Any]) -> None:
        with self.cv:
            queue()
            self.waiting += 1
            generation = self.generation
            self._run_if_all_waiting()
            while self.generation == generation:
                self.cv.wait()
            if self.error is not None:
                raise EmulationFailed(str(self.error))

    def _run_if_all_waiting(self) -> None:
        if not self.waiting or self.waiting < self.active:
            return
        self.error = None
        try:
            self.totals.add(self.machine.run())
        except Exception as e:  # noqa: BLE001 - every waiting rank reports it
            self.error = e
        self.waiting = 0
        self.generation += 1
        self.cv.notify_all()


class EmulatedHip:
    """The HIP calls of ``mono_aot.runtime.loader`` answered by the emulator for one device."""

    def __init__(
        self,
        machine: Machine,
        gate: LaunchGate,
        device: int,
        arch: str,
        replace: dict[str, bytes] | None = None,
    ) -> None:
        self.machine = machine
        self.replace = dict(replace or {})  # kernel symbol -> the code object run in its place
        self.gate = gate
        self.device = device
        self.arch = arch
        self.path = f"mono-aot emulator {id(machine):#x}"
        self._modules: dict[int, bytes] = {}
        self._functions: dict[int, Any] = {}

    def get_device(self) -> int:
        return self.device

    def set_device(self, device: int) -> None:
        if device != self.device:
            raise BadInput(f"emulated device {self.device} cannot switch to device {device}")

    def module_load_data(self, image: bytes, what: str) -> int:
        handle = len(self._modules) + 1
        self._modules[handle] = bytes(image)
        return handle

    def module_get_function(self, module: int, symbol: str) -> int:
        handle = len(self._functions) + 1
        image = self.replace.get(symbol, self._modules[module])
        self._functions[handle] = self.machine.load(image, symbol)
        return handle

    def module_unload(self, module: int) -> None:
        self._modules.pop(module, None)

    def occupancy(self, function: int, block: int, dynamic_lds: int, what: str) -> int:
        """Workgroups of ``block`` threads one CU holds, from the descriptor's resources and the
        arch's register file and LDS (``mono_aot.spec.arch.ArchInfo``)."""
        from mono_aot.spec.arch import ARCHS
        from mono_aot.spec.util import ceil_div

        info = ARCHS[self.arch]
        kernel = self._functions[function]
        waves_per_simd = ceil_div(ceil_div(block, info.wavefront_size), info.simds_per_cu)
        by_vgprs = info.vgprs_per_simd // (kernel.vregs * waves_per_simd)
        lds = kernel.descriptor.group_segment_fixed_size + dynamic_lds
        by_lds = info.lds_bytes_per_cu // lds if lds else by_vgprs
        return min(by_vgprs, by_lds)

    def launch(
        self,
        function: int,
        grid: int,
        block: int,
        dynamic_lds: int,
        stream: int,
        kernargs: ctypes.Array[ctypes.c_char],
        what: str,
    ) -> None:
        kernel = self._functions[function]
        args = bytes(kernargs)
        self.gate.launch(
            lambda: self.machine.launch(
                self.device, kernel, grid, block, args, dynamic_lds=dynamic_lds
            )
        )


@dataclass
class EmulatedDevice:
    """One emulated GPU as the runtime's ``Device`` protocol sees it."""

    hip: EmulatedHip
    arch: str
    cus: int

    def facts(self) -> DeviceFacts:
        return DeviceFacts(self.hip.device, f"{self.arch}:sramecc+:xnack-", self.cus)

    def stream_handle(self, stream: Any = None) -> int:
        return 0

    def capturing(self) -> bool:
        return False


@dataclass
class EmulatedPeers:
    """Every rank's peer buffer in the one address space: ``pe[r]`` is rank r's."""

    local: int
    pe: list[int]

    def close(self) -> None:
        pass  # the session owns the buffers


@dataclass
class HostMemory:
    """The torch storages mapped into the emulator's memory, by base address."""

    machine: Machine
    mapped: dict[int, Any] = field(default_factory=dict)

    def map(self, t: torch.Tensor, name: str, device: int) -> None:
        """Map ``t``'s whole storage (views read their neighbours, as on a GPU) once."""
        import numpy as np

        st = t.untyped_storage()
        base, n = st.data_ptr(), st.nbytes()
        if base in self.mapped or n == 0:
            return
        buf: np.ndarray = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(base))
        self.machine.memory.map(base, buf, name, device)
        self.mapped[base] = st  # keeps the storage alive while mapped

    def unmap_all(self, bases: Sequence[int]) -> None:
        for b in bases:
            if self.mapped.pop(b, None) is not None:
                self.machine.memory.unmap(b)


def waves_per_device(layout: Layout, arch: str) -> int:
    from mono_aot.spec.util import ceil_div

    return layout.ctas(arch) * ceil_div(layout.kernel.threads, 64)


class EmulatedSession(Session):
    """A selftest session whose ranks are emulated devices in this process (same problems,
    references, verdicts and checks as ``mono_aot.selftest.Session``)."""

    dead_rank_wait_s = EMULATED_WAIT_S

    @property
    def dead_rank_give_up_s(self) -> float:  # type: ignore[override]
        """On the virtual clock there is no host overhead: one wait bound plus one launch."""
        return self.short_wait_s + EMULATED_LAUNCH_S

    @property
    def dead_rank_requests(self) -> int:  # type: ignore[override]
        """The cheapest step to emulate: the wide kernel's smallest (its MFMA GEMMs take a
        third of the narrow GEMV's wave-instructions on the small layout: 7M against 20M)."""
        return self.layout.serving.wide_base if "wide" in self.layout.variants() else 1

    def __init__(
        self,
        layout: Layout,
        arch: str,
        *,
        seed: int = 0,
        shuffle: bool = False,
        max_requests: int | None = None,
        dead_rank: bool = False,
        log: Callable[[str], None] = lambda s: None,
        env: dict[str, str] | None = None,
        replace: dict[str, bytes] | None = None,
        progress: bool = False,
    ) -> None:
        """``replace``: code objects run in place of the served kernels of the same symbol (a
        kernel provider's build, ``mono-aot emulate --provider``); the runner still loads,
        checks and binds the served entries, so a replacement must keep the kernel contract.
        ``progress``: log a line every few million wave-instructions of a run (``_progress``)."""
        import tempfile
        from pathlib import Path

        import torch

        from mono_aot.emulator.machine import Machine
        from mono_aot.reference import random_packed_model, rope_cache
        from mono_aot.reference.fp8 import resolve_format
        from mono_aot.runtime.peer import PAGE_BYTES
        from mono_aot.runtime.runner import DrafterRunner, TPGroup
        from mono_aot.selftest import artifacts
        from mono_aot.selftest.cases import cache_blocks, max_position
        from mono_aot.selftest.rank import draft_model
        from mono_aot.spec.util import align_up

        self.torch = torch
        self.layout = layout
        self.arch = arch
        self.seed = seed
        self.log = log
        self.cases = 0
        self.cluster = None
        self._tmp = tempfile.TemporaryDirectory(prefix="mono-aot-emulate-")
        self.dir = Path(self._tmp.name)
        tp = layout.parallel.tp
        self.devices = list(range(tp))
        self.short = (
            artifacts.short_wait_layout(layout, self.dead_rank_wait_s) if dead_rank else None
        )
        status = artifacts.ensure_kernels(
            artifacts.needs(layout, self.short), arch, self.dir, log=log, env=env
        )
        log("kernels: " + ", ".join(f"{k} {v}" for k, v in status.items()))
        self.machine = Machine(arch, devices=tp, seed=seed, shuffle=shuffle)
        if progress:
            self.machine.progress = self._progress
        self.gate = LaunchGate(self.machine)
        self.host = HostMemory(self.machine)
        self.model = random_packed_model(layout, arch, seed)
        self.rope = rope_cache(max_position(layout), layout.model.rotary_dim)
        self.max_requests = max_requests or layout.serving.chunk_reqs
        blocks = cache_blocks(layout, self.max_requests)
        self.nan_code = resolve_format(arch).nan_code
        peer_bytes = align_up(layout.peer_bytes, PAGE_BYTES)
        self.peer_buffers = [torch.zeros(peer_bytes, dtype=torch.uint8) for _ in range(tp)]
        pe = [b.data_ptr() for b in self.peer_buffers]
        self.ranks: list[dict[str, Any]] = []
        # the runner looks the kernels up in this process's store layers (ensured above)
        strict = {**(os.environ if env is None else env), "MONO_AOT_STRICT": "1"}
        for r, w in enumerate(self.model):
            weights = {
                "packed": dict(w.packed), "norms": dict(w.norms), "k_scale": w.k_scale,
                "v_scale": w.v_scale, "final_norm": w.final_norm,
            }  # fmt: skip
            shape = (blocks, layout.kv_heads_per_rank, layout.serving.kv_block,
                     layout.kv_entry_bytes)  # fmt: skip
            caches = [
                torch.full(shape, self.nan_code, dtype=torch.uint8)
                for _ in range(layout.model.layers)
            ]
            model = draft_model(weights, caches, self.rope)
            hip = EmulatedHip(self.machine, self.gate, r, arch, replace)
            device = EmulatedDevice(hip, arch, layout.ctas(arch))
            group = TPGroup(tp, r, None)
            peers = EmulatedPeers(pe[r], pe)
            runners = {
                "normal": DrafterRunner(
                    model, layout, tp=group, device=device, peers=peers, env=strict
                )
            }
            if self.short is not None:
                runners["short"] = DrafterRunner(
                    model, self.short, tp=group, device=device, peers=peers, env=strict
                )
            for name, t in _tensors(weights, caches, self.rope, runners):
                self.host.map(t, f"rank {r} {name}", r)
            self.host.map(self.peer_buffers[r], f"rank {r} peer buffer", r)
            self.ranks.append({"runners": runners, "caches": caches})

    def _progress(self, executed: int, seconds: float) -> None:
        """One line: the run's wave-instructions and rate, and the grid barriers rank 0's
        launches have passed (the generation words of its scratch's sync region, by variant:
        about one a phase, ``mono_aot.spec.abi``)."""
        from mono_aot.spec import abi

        barriers = []
        for v, t in self.ranks[0]["runners"]["normal"].scratch.items():
            at = abi.scratch_plan(self.layout, v).offset("sync")
            words = t[at : at + abi.SYNC_BYTES].view(self.torch.int32)
            gen = max(int(words[h // 4]) for h in (abi.SYNC_GEN, abi.SYNC_HALF + abi.SYNC_GEN))
            barriers.append(f"{v} {gen}")
        rate = executed / seconds if seconds > 0 else 0.0
        self.log(
            f"  ... {executed / 1e6:,.0f} M wave-instructions in {seconds / 60:.1f} min "
            f"({rate / 1e3:,.0f} k/s); rank 0 grid barriers passed: {', '.join(barriers)}"
        )

    def step(
        self, prob: Problem, *, launch: Sequence[bool] | None = None, **extra: Any
    ) -> list[dict[str, Any]]:
        """Run ``prob`` as one step on every emulated rank (``extra`` as in
        ``mono_aot.selftest.rank.run_step``; no graph replays here)."""
        from mono_aot.selftest import case_inputs
        from mono_aot.selftest.rank import stage_step

        if extra.get("replays"):
            raise BadInput("the emulator does not capture graphs (no graph-replay check)")
        reqs = len(prob.requests)
        if reqs > self.max_requests:
            raise BadInput(f"a step of {reqs} requests; this session holds {self.max_requests}")
        tp = self.layout.parallel.tp
        launch = list(launch) if launch is not None else [True] * tp
        case = case_inputs(prob)
        dev = self.torch.device("cpu")
        staged, mapped = [], []
        for r, (st, pre) in enumerate(zip(self.ranks, prob.caches(), strict=True)):
            runner = st["runners"][extra.get("runner", "normal")]
            # each rank its own copies, as each GPU has its own
            own = {k: v.clone() if hasattr(v, "clone") else v for k, v in case.items()}
            s = stage_step(runner, st["caches"], self.nan_code, own, pre, dev, extra)
            for name, t in (
                ("x", s.x), ("out", s.out), ("positions", s.positions),
                ("block table", s.context.block_table), ("seq_lens", s.context.seq_lens),
                ("slots", s.context.slots),
            ):  # fmt: skip
                base = t.untyped_storage().data_ptr()
                if base not in self.host.mapped:
                    self.host.map(t, f"rank {r} {name}", r)
                    mapped.append(base)
            staged.append(s)
        errors: dict[int, BaseException] = {}
        virtual: dict[int, float] = {}

        def run(r: int) -> None:
            t0 = self.gate.totals.virtual_seconds
            try:
                staged[r].run()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors[r] = e
            finally:
                virtual[r] = self.gate.totals.virtual_seconds - t0
                self.gate.leave()

        threads = []
        for r in range(tp):
            if launch[r]:
                self.gate.enter()
                # daemons: after a Ctrl-C the process exits without waiting for the emulation
                threads.append(
                    threading.Thread(target=run, args=(r,), name=f"rank {r}", daemon=True)
                )
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # in slices: the main thread sees a Ctrl-C another thread got
                t.join(SIGNAL_POLL_S)
        try:
            if errors:
                r, e = min(errors.items())
                raise EmulationFailed(f"rank {r}: {e}") from e
            return [
                {
                    "rank": r,
                    "seconds": virtual.get(r, 0.0),
                    **staged[r].result(st["caches"], self.nan_code),
                }
                for r, st in enumerate(self.ranks)
            ]
        finally:
            self.host.unmap_all(mapped)

    def close(self) -> None:
        self.host.unmap_all(list(self.host.mapped))
        self._tmp.cleanup()


def _tensors(
    weights: dict[str, Any], caches: list[Any], rope: Any, runners: dict[str, Any]
) -> list[tuple[str, Any]]:
    """Every tensor of a rank the kernels may address: the model's, and each runner's own."""
    out = [(f"packed {k}", t) for k, t in weights["packed"].items()]
    out += [(f"norm {k}", t) for k, t in weights["norms"].items()]
    out += [(k, weights[k]) for k in ("k_scale", "v_scale", "final_norm")]
    out += [(f"KV cache {i}", kv) for i, kv in enumerate(caches)]
    out.append(("rope cache", rope))
    for name, r in runners.items():
        out += [(f"{name} runner {k}", t) for k, t in r.packed.items()]
        out += [(f"{name} runner scratch {v}", t) for v, t in r.scratch.items()]
        out += [
            (f"{name} runner {k}", getattr(r, k))
            for k in ("tab", "health", "step", "no_slots", "final_norm", "cos_sin")
        ]
    return out


def check_emulable(layout: Layout, arch: str) -> None:
    """Refuse an arch the layout does not target, saying which it does."""
    if arch not in layout.targets:
        raise BadInput(
            f"layout {layout.name} targets {', '.join(layout.archs)}",
            field="arch",
            value=arch,
        )


@dataclass(frozen=True)
class LaunchCost:
    """What one launch of a variant is expected to cost the emulator (``INSTRUCTIONS_*``)."""

    variant: str
    waves: int  # per device
    instructions: int  # all devices
    seconds: float  # on one idle core
    memory_bytes: int  # the whole process: model, reference, packed weights, registers

    def describe(self) -> str:
        return (
            f"{self.variant}: {self.waves:,} waves a device, about "
            f"{self.instructions / 1e6:,.0f} M wave-instructions a launch "
            f"(~{self.seconds / 60:,.1f} min of one core), peak memory about "
            f"{self.memory_bytes / 1e9:,.1f} GB"
        )


def launch_costs(layout: Layout, arch: str) -> list[LaunchCost]:
    """The expected cost of a launch of each of the layout's variants on ``arch``."""
    from mono_aot.spec.plans import rank_weight_bytes

    tp = layout.parallel.tp
    weights = rank_weight_bytes(layout)  # one byte a weight: the model has tp times as many
    memory = int(BYTES_PER_WEIGHT * tp * weights)
    out = []
    for v in layout.variants():
        n = int(tp * weights * INSTRUCTIONS_PER_WEIGHT_BYTE[v])
        out.append(
            LaunchCost(v, waves_per_device(layout, arch), n, n / INSTRUCTIONS_PER_SECOND[v], memory)
        )
    return out


def run_emulation(
    layout: Layout,
    arch: str,
    checks: Sequence[str] = CHECKS,
    *,
    seed: int = 0,
    shuffle: bool = False,
    log: Callable[[str], None] = lambda s: None,
    env: dict[str, str] | None = None,
    replace: dict[str, bytes] | None = None,
    requests: Sequence[int] = (),
    progress: bool = False,
) -> tuple[list[CheckResult], Totals]:
    """The ``checks`` on ``tp`` emulated devices of ``arch``; their verdicts and the totals.
    ``requests``: the narrow, wide and multi-launch checks run only these request counts (a
    count one launch serves goes to its variant's check, a larger one is a multi-launch step)."""
    from mono_aot.selftest import (
        _dead_rank_check,
        _multi_launch_check,
        _variant_check,
        multi_launch_counts,
        request_counts,
    )

    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise BadInput(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    check_emulable(layout, arch)
    served = {n for v in layout.variants() for n in request_counts(layout, v)}
    several = [n for n in requests if layout.serving.chunk_reqs < n <= layout.serving.max_reqs]
    unserved = [n for n in requests if n not in served and n not in several]
    if unserved:
        raise BadInput(
            f"layout {layout.name}'s steps hold 1..{layout.serving.max_reqs} requests (one "
            f"launch {min(served)}..{max(served)}, more are multi-launch steps)",
            field="requests",
            value=",".join(map(str, unserved)),
        )
    wanted = [c for c in CHECKS if c in checks]
    wanted = [c for c in wanted if c != "narrow" or "narrow" in layout.variants()]
    biggest = max(
        [layout.serving.chunk_reqs]
        + ((several or multi_launch_counts(layout)) if "multi-launch" in wanted else [])
    )
    for cost in launch_costs(layout, arch):  # every input is valid: say what it will cost
        log(f"expected on {arch}, {cost.describe()}")
    results: list[CheckResult] = []
    with EmulatedSession(
        layout,
        arch,
        seed=seed,
        shuffle=shuffle,
        max_requests=biggest,
        dead_rank="dead-rank" in wanted,
        log=log,
        env=env,
        replace=replace,
        progress=progress,
    ) as s:
        for c in wanted:
            log(f"check {c} ...")
            t0 = time.perf_counter()
            try:
                if c in ("narrow", "wide"):
                    only = [n for n in requests if n in request_counts(layout, c)]  # type: ignore[arg-type]
                    if requests and not only:
                        continue  # none of the counts asked for is this variant's
                    results.append(_variant_check(s, c, only))  # type: ignore[arg-type]
                elif c == "multi-launch":
                    if requests and not several:
                        continue  # only single-launch counts were asked for
                    results.append(_multi_launch_check(s, several))
                else:
                    results.append(_dead_rank_check(s))
            except EmulationFailed as e:
                results.append(CheckResult(c, False, str(e), time.perf_counter() - t0))
        return results, s.gate.totals
