"""``mono-aot selftest``: run the drafter kernels on this machine's GPUs and judge them.

The checks (each prints one verdict):

- ``narrow`` / ``wide``: for every request count the variant serves, a random problem
  (``mono_aot.reference.make_problem``: fp8-exact random model, mixed context lengths
  including ones long enough for split attention, a request with slot -1 tokens, a shorter
  ``seq_len``, blocks in random order, a block table that is a strided view, NaN codes in every
  cache byte no request may read) runs on all TP ranks at once, one GPU each; the output is
  poisoned (NaN) before the launch. Judged against the float64 reference:
  ``||out - ref|| / ||ref|| <= 2e-2`` on every rank, health 0, and the caches afterwards equal
  to the reference's byte for byte (the kernel-numerics reference; a written code may differ
  only where its pre-encode value lies within the accumulated rounding error of an fp8
  rounding boundary, see ``mono_aot.reference.fp8.boundary_distance``), every other byte untouched.
- ``dead-rank``: the last rank never launches; the others must finish (short wait bound),
  each with ``health`` = peer timeout waiting for that rank, then a full step with every rank
  must pass again (stale mailbox contents are never mistaken for current ones).
- ``graph-replay``: one step (launch + ``step += 1``, as the runner does) is captured in a
  HIP graph on every rank and replayed 100 times with no host-side reset; health must stay 0
  and the output and caches must still match the reference.

The ranks are separate processes (``spawn``), one GPU each, sharing their peer buffers through
HIP IPC (uncached device memory, as a real peer buffer), launched through the FlyDSL JIT
launchers (``build_drafter``/``build_wide``): this needs FlyDSL and a ROCm torch. Without a
usable set of GPUs the selftest raises ``NoDevice`` (exit code 3) and claims nothing.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mono_aot.reference.step import KV_BOUNDARY_TOL as KV_BOUNDARY_TOL
from mono_aot.reference.step import compare_caches
from mono_aot.reference.step import norm_rel_error as rel_error
from mono_aot.spec import abi
from mono_aot.spec.errors import MonoError
from mono_aot.spec.layouts import Layout, Variant

CHECKS: tuple[str, ...] = ("narrow", "wide", "dead-rank", "graph-replay")
TOLERANCE = 2e-2  # ||out - ref|| / ||ref||
EXIT_NO_DEVICE = 3
DEAD_RANK_WAIT_S = 0.5  # the wait bound of the dead-rank kernels (seconds)
DEFAULT_REPLAYS = 100
# contexts the problems cycle through: empty, short, around one attention partition, long
CONTEXTS = (0, 23, 255, 256, 700, 3001, 40, 1500)
INIT_TIMEOUT_S = 1800.0  # a rank's JIT compiles
CASE_TIMEOUT_S = 900.0
HIP_DEVICE_MALLOC_UNCACHED = 0x3
HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1


class NoDevice(MonoError):
    """This machine cannot run the selftest (no ROCm GPU, too few, or the wrong kind)."""

    exit_code = EXIT_NO_DEVICE


class SelftestFailure(MonoError):
    """A check could not run to its verdict (a rank crashed or hung)."""


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0
    cases: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "seconds": round(self.seconds, 1),
            "cases": self.cases,
        }


# ---------------------------------------------------------------- problems and verdicts


def request_counts(layout: Layout, variant: Variant) -> list[int]:
    lo, hi = layout.variant_reqs(variant)
    return list(range(lo, hi + 1))


def request_specs(layout: Layout, count: int, salt: int = 0) -> list[Any]:
    """``count`` requests with mixed contexts: one has its last three tokens unwritten (slot
    -1), one attends to fewer positions than its draft block reaches."""
    from mono_aot.reference import RequestSpec

    qpr = layout.serving.qpr
    out = []
    for i in range(count):
        ctx = CONTEXTS[(i + salt) % len(CONTEXTS)]
        written = None
        seq_len = None
        if i % 3 == 1:
            written = tuple(t < qpr - 3 for t in range(qpr))
        if i % 4 == 2 and ctx > 0:
            seq_len = ctx + qpr // 2
        out.append(RequestSpec(context=ctx, written=written, seq_len=seq_len))
    return out


# ---------------------------------------------------------------- HIP (ctypes), in the workers


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _hip() -> ctypes.CDLL:
    """The HIP runtime torch already loaded (never a second copy)."""
    path = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libamdhip64.so" in line:
                path = line.split()[-1]
                break
    lib = ctypes.CDLL(path or "libamdhip64.so")
    for name in ("hipExtMallocWithFlags", "hipIpcGetMemHandle", "hipIpcOpenMemHandle", "hipMemset"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _check_hip(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed with HIP error {rc}")


class PeerBuffers:
    """This rank's uncached mailbox buffer, exported by IPC, and the peers' mapped ones."""

    def __init__(self, nbytes: int) -> None:
        self.lib = _hip()
        self.nbytes = nbytes
        p = ctypes.c_void_p()
        _check_hip(
            self.lib.hipExtMallocWithFlags(
                ctypes.byref(p), ctypes.c_size_t(nbytes), ctypes.c_uint(HIP_DEVICE_MALLOC_UNCACHED)
            ),
            "hipExtMallocWithFlags",
        )
        self.local = int(p.value)
        _check_hip(self.lib.hipMemset(p, 0, ctypes.c_size_t(nbytes)), "hipMemset")
        h = _IpcHandle()
        _check_hip(self.lib.hipIpcGetMemHandle(ctypes.byref(h), p), "hipIpcGetMemHandle")
        self.handle = bytes(h.reserved)
        self.opened: list[int] = []

    def open(self, handles: Sequence[bytes], rank: int) -> list[int]:
        out = []
        for r, hb in enumerate(handles):
            if r == rank:
                out.append(self.local)
                continue
            h = _IpcHandle()
            h.reserved = hb
            p = ctypes.c_void_p()
            _check_hip(
                self.lib.hipIpcOpenMemHandle(
                    ctypes.byref(p), h, ctypes.c_uint(HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
                ),
                f"hipIpcOpenMemHandle(rank {r})",
            )
            self.opened.append(int(p.value))
            out.append(int(p.value))
        return out


# ---------------------------------------------------------------- the rank processes


class _Rank:
    """State of one rank's worker process."""

    def __init__(self, msg: dict[str, Any]) -> None:
        import torch

        from mono_aot.kernels import build_drafter, build_wide, trace_args
        from mono_aot.spec.layouts import parse_layout

        self.torch = torch
        self.rank = msg["rank"]
        self.device = msg["device"]
        torch.cuda.set_device(self.device)
        self.dev = torch.device("cuda", self.device)
        self.layout = lay = parse_layout(msg["layout"], "selftest layout")
        self.arch = msg["arch"]
        ticks = lay.wait_ticks
        short = round(DEAD_RANK_WAIT_S * 1e8)
        self.fns: dict[tuple[str, str], Callable[..., Any]] = {}
        for v in msg["variants"]:
            if v == "narrow":
                self.fns[(v, "normal")] = build_drafter(lay, self.arch, ticks)
            else:
                self.fns[(v, "normal")] = build_wide(lay, self.arch, lay.serving.wide_base, ticks)
        if msg.get("dead_rank"):
            v = lay.variants()[0]
            if v == "narrow":
                self.fns[(v, "short")] = build_drafter(lay, self.arch, short)
            else:
                self.fns[(v, "short")] = build_wide(lay, self.arch, lay.serving.wide_base, short)
        # compile every launcher now (no launch): JIT compile times differ between ranks by
        # tens of seconds, far beyond the wait bound, so no rank may compile at its first launch
        for (v, _), fn in self.fns.items():
            fn._compile_only(*trace_args(v, lay))
        w = torch.load(msg["weights"], weights_only=True)
        self.packed = {k: t.to(self.dev) for k, t in w["packed"].items()}
        self.norms = {k: t.to(self.dev) for k, t in w["norms"].items()}
        self.k_scale = w["k_scale"].to(self.dev)
        self.v_scale = w["v_scale"].to(self.dev)
        self.final_norm = w["final_norm"].to(self.dev)
        self.scratch = {
            v: torch.zeros(lay.scratch_bytes(v), dtype=torch.uint8, device=self.dev)
            for v in lay.variants()
        }
        self.step = torch.zeros(1, dtype=torch.int32, device=self.dev)
        self.health = torch.zeros(abi.HEALTH_WORDS, dtype=torch.int32, device=self.dev)
        self.peers = PeerBuffers(lay.peer_bytes)
        self.pe: list[int] = []

    def run_case(self, msg: dict[str, Any], conn: Any) -> dict[str, Any]:
        """Load the case, tell the parent it is ready, launch when it says go (all ranks
        launch within milliseconds of each other, far inside the wait bound)."""
        torch = self.torch
        lay = self.layout
        case = torch.load(msg["path"], weights_only=True)
        rank_caches = torch.load(msg["caches"][self.rank], weights_only=True)
        n = int(case["n"])
        dev = self.dev
        x = case["x"].to(dev)
        pos = case["positions"].to(dev)
        slots = case["slots"].to(dev)
        seq_lens = case["seq_lens"].to(dev)
        cos_sin = case["cos_sin"].to(dev)
        base = case["bt_base"].to(dev)
        bt = base.as_strided(case["bt_shape"], case["bt_stride"], case["bt_offset"])
        caches = [c.to(dev).contiguous() for c in rank_caches]
        tab = torch.zeros(lay.model.layers, abi.TABLE_SLOTS, dtype=torch.int64)
        for i, kv in enumerate(caches):
            for name, slot in abi.NORM_SLOTS.items():
                tab[i, slot] = self.norms[name][i].data_ptr()
            tab[i, abi.T_K_SCALE] = self.k_scale[i:].data_ptr()
            tab[i, abi.T_V_SCALE] = self.v_scale[i:].data_ptr()
            tab[i, abi.T_CACHE] = kv.data_ptr()
            tab[i, abi.T_NBLK] = kv.shape[0]
        tab = tab.to(dev)
        out = torch.full((n, lay.model.hidden), float("nan"), dtype=torch.bfloat16, device=dev)
        if msg.get("set_step") is not None:
            self.step.fill_(int(msg["set_step"]))
        if msg.get("reset_health"):
            self.health.zero_()
        variant = msg["variant"]
        fn = self.fns[(variant, msg.get("ticks", "normal"))]
        pk = self.packed
        args = (
            x.data_ptr(), out.data_ptr(), tab.data_ptr(),
            pk["qkv_w"].data_ptr(), pk["qkv_s"].data_ptr(), pk["o_w"].data_ptr(),
            pk["o_s"].data_ptr(), pk["gu_w"].data_ptr(), pk["gu_s"].data_ptr(),
            pk["d_w"].data_ptr(), pk["d_s"].data_ptr(), self.final_norm.data_ptr(),
            cos_sin.data_ptr(), bt.data_ptr(), pos.data_ptr(), slots.data_ptr(),
            seq_lens.data_ptr(), self.scratch[variant].data_ptr(), self.peers.local,
            *self.pe, self.step.data_ptr(), self.health.data_ptr(),
            self.rank, bt.stride(0), n,
        )  # fmt: skip
        result: dict[str, Any] = {"rank": self.rank}
        torch.cuda.synchronize()
        conn.send({"ok": True, "ready": True})
        go = conn.recv()
        if go.get("op") != "go":
            raise RuntimeError(f"expected go, got {go!r}")
        t0 = time.perf_counter()
        if msg.get("launch", True):
            stream = torch.cuda.current_stream()
            replays = int(msg.get("replays", 0))
            fn(*args, stream=stream)
            self.step.add_(1)
            if replays:
                torch.cuda.synchronize()
                result["health_before_replay"] = self.health.cpu().tolist()
                result["out_before_replay"] = out.cpu()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn(*args, stream=torch.cuda.current_stream())
                    self.step.add_(1)
                for _ in range(replays):
                    graph.replay()
            torch.cuda.synchronize()
        result["seconds"] = time.perf_counter() - t0
        result["out"] = out.cpu()
        result["caches"] = [c.cpu() for c in caches]
        result["health"] = self.health.cpu().tolist()
        result["step"] = int(self.step.item())
        return result


def _worker(conn: Any) -> None:
    """A rank's process: answer the parent's messages until told to exit."""
    state: _Rank | None = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        try:
            op = msg["op"]
            if op == "exit":
                conn.send({"ok": True})
                return
            if op == "init":
                state = _Rank(msg)
                conn.send({"ok": True, "handle": state.peers.handle})
            elif op == "peers":
                assert state is not None
                state.pe = state.peers.open(msg["handles"], state.rank)
                conn.send({"ok": True})
            elif op == "case":
                assert state is not None
                conn.send({"ok": True, **state.run_case(msg, conn)})
            else:
                conn.send({"ok": False, "error": f"unknown op {op!r}"})
        except Exception:  # noqa: BLE001 - every failure goes back to the parent
            conn.send({"ok": False, "error": traceback.format_exc(limit=12)})


class Cluster:
    """The TP rank processes of one selftest run."""

    def __init__(self, layout: Layout, arch: str, devices: Sequence[int], workdir: Path) -> None:
        self.layout = layout
        self.arch = arch
        self.devices = list(devices)
        self.workdir = workdir
        ctx = mp.get_context("spawn")
        self.conns = []
        self.procs = []
        for _ in self.devices:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child,), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def _ask(
        self, ranks: Sequence[int], msgs: Sequence[dict[str, Any]], timeout: float
    ) -> list[dict[str, Any]]:
        for r, m in zip(ranks, msgs, strict=True):
            self.conns[r].send(m)
        out = []
        deadline = time.monotonic() + timeout
        for r in ranks:
            left = max(0.0, deadline - time.monotonic())
            if not self.conns[r].poll(left):
                self.close(kill=True)
                raise SelftestFailure(
                    f"rank {r} did not answer within {timeout:g} s (hung kernel?)"
                )
            ans = self.conns[r].recv()
            if not ans.get("ok"):
                self.close(kill=True)
                raise SelftestFailure(f"rank {r} failed:\n{ans.get('error')}")
            out.append(ans)
        return out

    def init(self, weights: Sequence[Path], variants: Sequence[str], dead_rank: bool) -> None:
        lay = self.layout
        ranks = list(range(len(self.devices)))
        msgs = [
            {
                "op": "init", "rank": r, "device": self.devices[r], "layout": lay.model_dump(mode="json"),
                "arch": self.arch, "variants": list(variants), "dead_rank": dead_rank,
                "weights": str(weights[r]),
            }
            for r in ranks
        ]  # fmt: skip
        answers = self._ask(ranks, msgs, INIT_TIMEOUT_S)
        handles = [a["handle"] for a in answers]
        self._ask(ranks, [{"op": "peers", "handles": handles}] * len(ranks), 120.0)

    def case(
        self,
        paths: tuple[Path, list[Path]],
        variant: str,
        *,
        launch: Sequence[bool] | None = None,
        **extra: Any,
    ) -> list[dict[str, Any]]:
        """Run one case on every rank: all load it, then all launch together."""
        ranks = list(range(len(self.devices)))
        launch = launch or [True] * len(ranks)
        common, caches = paths
        msgs = [
            {
                "op": "case", "path": str(common), "caches": [str(c) for c in caches],
                "variant": variant, "launch": launch[r], **extra,
            }
            for r in ranks
        ]  # fmt: skip
        self._ask(ranks, msgs, CASE_TIMEOUT_S)
        timeout = CASE_TIMEOUT_S + 5.0 * int(extra.get("replays", 0))
        return self._ask(ranks, [{"op": "go"}] * len(ranks), timeout)

    def close(self, kill: bool = False) -> None:
        for c, p in zip(self.conns, self.procs, strict=True):
            if not kill and p.is_alive():
                try:
                    c.send({"op": "exit"})
                    if c.poll(30):
                        c.recv()
                except (OSError, EOFError):
                    pass
            p.join(timeout=1 if kill else 30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)


# ---------------------------------------------------------------- devices


def find_devices(layout: Layout) -> tuple[str, list[int]]:
    """``(arch, device indices)`` of ``tp`` GPUs this machine can run the selftest on, or
    ``NoDevice`` saying why not."""
    try:
        import torch
    except ImportError:
        raise NoDevice("torch is not installed") from None
    if not getattr(torch.version, "hip", None):
        raise NoDevice(
            "this torch is not a ROCm build: no AMD GPU can be used (nothing was tested)"
        )
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise NoDevice("no ROCm device is visible (nothing was tested)")
    try:
        import flydsl  # noqa: F401
    except ImportError:
        raise NoDevice(
            "FlyDSL is not installed (pip install 'mono-aot[build]'); nothing was tested"
        ) from None
    from mono_aot.spec.arch import base_arch

    tp = layout.parallel.tp
    by_arch: dict[str, list[int]] = {}
    why = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        arch = base_arch(getattr(props, "gcnArchName", ""))
        if arch not in layout.targets:
            why.append(
                f"GPU {i} is {arch or 'unknown'}, layout {layout.name} targets {', '.join(layout.archs)}"
            )
            continue
        if props.multi_processor_count != layout.ctas(arch):
            why.append(
                f"GPU {i} ({arch}) has {props.multi_processor_count} CUs; the kernels need "
                f"{layout.ctas(arch)} co-resident workgroups"
            )
            continue
        by_arch.setdefault(arch, []).append(i)
    for arch, devs in sorted(by_arch.items()):
        if len(devs) >= tp:
            return arch, devs[:tp]
    found = ", ".join(f"{len(d)} x {a}" for a, d in sorted(by_arch.items())) or "none usable"
    raise NoDevice(
        f"the selftest runs the {tp} TP ranks on {tp} GPUs of one kind; found {found}"
        + (f" ({'; '.join(why)})" if why else "")
    )


# ---------------------------------------------------------------- the checks


class _Run:
    """One selftest run: the model, the references, the cluster."""

    def __init__(
        self,
        layout: Layout,
        arch: str,
        devices: Sequence[int],
        seed: int,
        log: Callable[[str], None],
    ) -> None:
        import torch

        from mono_aot.reference import random_model

        self.torch = torch
        self.layout = layout
        self.arch = arch
        self.seed = seed
        self.log = log
        self.tmp = tempfile.TemporaryDirectory(prefix="mono-aot-selftest-")
        self.dir = Path(self.tmp.name)
        log(f"random fp8-exact model (seed {seed}) ...")
        self.model = random_model(layout, arch, seed)
        self.cases = 0
        self.cluster: Cluster | None = None
        self.devices = list(devices)

    def start(self, variants: Sequence[str], dead_rank: bool) -> None:
        first = self.problem(request_specs(self.layout, 1))
        weights = []
        for r, w in enumerate(first.ranks):
            p = self.dir / f"weights-rank{r}.pt"
            self.torch.save(
                {
                    "packed": dict(w.packed), "norms": dict(w.norms), "k_scale": w.k_scale,
                    "v_scale": w.v_scale, "final_norm": w.final_norm,
                },
                p,
            )  # fmt: skip
            weights.append(p)
        self.log(
            f"starting {len(self.devices)} rank processes on GPUs {self.devices} (JIT compiles) ..."
        )
        self.cluster = Cluster(self.layout, self.arch, self.devices, self.dir)
        self.cluster.init(weights, variants, dead_rank)

    def problem(self, specs: Sequence[Any]) -> Any:
        from mono_aot.reference import make_problem

        self.cases += 1
        return make_problem(
            self.layout, self.arch, specs, seed=self.seed + self.cases, model=self.model
        )

    def save_case(self, prob: Any) -> tuple[Path, list[Path]]:
        """The launch's inputs (one file) and each rank's pre-step caches (one file each)."""
        inp = prob.inputs
        bt = inp.block_table
        base = bt._base if bt._base is not None and bt._base.is_contiguous() else bt.contiguous()
        if base is not bt._base:  # bt itself re-laid out: its own strides
            bt = base
        n = inp.x.shape[0]
        path = self.dir / f"case-{self.cases}.pt"
        self.torch.save(
            {
                "n": n, "x": inp.x, "positions": inp.positions, "slots": inp.slots,
                "seq_lens": inp.seq_lens, "cos_sin": inp.cos_sin, "bt_base": base.contiguous(),
                "bt_shape": tuple(bt.shape), "bt_stride": tuple(bt.stride()),
                "bt_offset": bt.storage_offset() - base.storage_offset(),
            },
            path,
        )  # fmt: skip
        caches = []
        for r, rank_caches in enumerate(prob.caches()):
            p = self.dir / f"case-{self.cases}-rank{r}.pt"
            self.torch.save(rank_caches, p)
            caches.append(p)
        return path, caches

    def reference(self, prob: Any) -> tuple[Any, Any, list[list[Any]]]:
        """(float64 result, kernel-numerics result, the caches after the kernel-numerics step)."""
        from mono_aot.reference import run_tp

        ranks, inputs = prob.ranks, prob.inputs
        ref64 = run_tp(self.layout, self.arch, ranks, prob.caches(), inputs, "float64")
        caches = prob.caches()
        refk = run_tp(self.layout, self.arch, ranks, caches, inputs, "kernel")
        return ref64, refk, caches

    def judge(
        self,
        prob: Any,
        answers: Sequence[dict[str, Any]],
        ranks: Sequence[int] | None = None,
        refs: tuple[Any, Any, list[list[Any]]] | None = None,
    ) -> dict[str, Any]:
        """The verdict on the ranks' answers (``refs``: ``reference(prob)``, computed if not
        given)."""
        ref64, refk, caches = refs if refs is not None else self.reference(prob)
        n = prob.inputs.x.shape[0]
        slots = prob.inputs.slots[:n]
        errs, bad, tol, health = [], 0, 0, []
        for a in answers:
            r = a["rank"]
            if ranks is not None and r not in ranks:
                continue
            errs.append(rel_error(a["out"], ref64.out))
            b, t = compare_caches(
                self.layout, self.arch, a["caches"], caches[r], slots, refk.ranks[r].kv_prequant
            )
            bad += b
            tol += t
            health.append(a["health"])
        ok = (
            all(e <= TOLERANCE for e in errs)
            and bad == 0
            and all(h[0] == abi.STATUS_OK for h in health)
        )
        return {
            "requests": len(prob.requests), "tokens": n, "ok": ok,
            "max_rel_error": max(errs), "kv_bad_bytes": bad, "kv_near_boundary": tol,
            "health": [abi.describe_health(h) for h in health],
        }  # fmt: skip

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        self.tmp.cleanup()


def _variant_check(run: _Run, variant: Variant) -> CheckResult:
    t0 = time.perf_counter()
    assert run.cluster is not None
    cases = []
    for count in request_counts(run.layout, variant):
        prob = run.problem(request_specs(run.layout, count, salt=count))
        answers = run.cluster.case(run.save_case(prob), variant)
        res = run.judge(prob, answers)
        run.log(
            f"  {variant} {count} request(s): rel err {res['max_rel_error']:.2e}, K/V bad bytes {res['kv_bad_bytes']}"
        )
        cases.append(res)
    ok = all(c["ok"] for c in cases)
    worst = max(c["max_rel_error"] for c in cases)
    detail = (
        f"{len(cases)} request counts ({', '.join(str(c['requests']) for c in cases)}): max rel err "
        f"{worst:.2e} (limit {TOLERANCE:g}), K/V bad bytes {sum(c['kv_bad_bytes'] for c in cases)}, "
        f"near-boundary codes tolerated {sum(c['kv_near_boundary'] for c in cases)}"
    )
    if not ok:
        detail += "; health: " + "; ".join(h for c in cases for h in c["health"] if h != "ok")
    return CheckResult(variant, ok, detail, time.perf_counter() - t0, cases)


def _dead_rank_check(run: _Run) -> CheckResult:
    t0 = time.perf_counter()
    assert run.cluster is not None
    lay = run.layout
    tp = lay.parallel.tp
    variant = lay.variants()[0]
    count = request_counts(lay, variant)[0]
    prob = run.problem(request_specs(lay, count))
    path = run.save_case(prob)
    launch = [r != tp - 1 for r in range(tp)]
    answers = run.cluster.case(path, variant, launch=launch, ticks="short", reset_health=True)
    problems = []
    for a in answers[: tp - 1]:
        h = a["health"]
        want = (abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, tp - 1)  # layer 0's first all-reduce
        if (h[abi.H_STATUS], h[abi.H_WHAT], h[abi.H_PEER]) != want:
            problems.append(f"rank {a['rank']}: health {abi.describe_health(h)}")
        if a["seconds"] > 10 * DEAD_RANK_WAIT_S + 20:
            problems.append(f"rank {a['rank']} took {a['seconds']:.1f} s to give up")
    # everyone back in step: the same step counter on every rank, health cleared
    nxt = max(a["step"] for a in answers) + 1
    prob2 = run.problem(request_specs(lay, count, salt=1))
    answers2 = run.cluster.case(run.save_case(prob2), variant, set_step=nxt, reset_health=True)
    res = run.judge(prob2, answers2)
    if not res["ok"]:
        problems.append(f"the step after the failure: {res}")
    ok = not problems
    took = max(a["seconds"] for a in answers[: tp - 1])
    detail = (
        f"rank {tp - 1} never launched; ranks 0..{tp - 2} gave up after {took:.2f} s with "
        f"'{abi.describe_health(answers[0]['health'])}'; the next full step: rel err "
        f"{res['max_rel_error']:.2e}"
    )
    if problems:
        detail = "; ".join(problems)
    return CheckResult("dead-rank", ok, detail, time.perf_counter() - t0, [res])


def _graph_check(run: _Run, replays: int) -> CheckResult:
    t0 = time.perf_counter()
    assert run.cluster is not None
    lay = run.layout
    variant: Variant = "wide"
    count = lay.variant_reqs(variant)[0]
    prob = run.problem(request_specs(lay, count, salt=3))
    answers = run.cluster.case(run.save_case(prob), variant, replays=replays, reset_health=True)
    res = run.judge(prob, answers)
    first = [rel_error(a["out_before_replay"], answers[0]["out"]) for a in answers]
    steps = {a["step"] for a in answers}
    ok = res["ok"] and len(steps) == 1 and all(h[0] == 0 for a in answers for h in [a["health"]])
    detail = (
        f"{replays} replays of a captured {count}-request wide step on every rank, no host reset: "
        f"health {res['health'][0]}, rel err {res['max_rel_error']:.2e}, K/V bad bytes "
        f"{res['kv_bad_bytes']}, step counters {sorted(steps)}, first vs last output "
        f"{max(first):.1e}"
    )
    return CheckResult("graph-replay", ok, detail, time.perf_counter() - t0, [res])


def run_selftest(
    layout: Layout,
    checks: Sequence[str] = CHECKS,
    *,
    seed: int = 0,
    replays: int = DEFAULT_REPLAYS,
    log: Callable[[str], None] = lambda s: None,
) -> list[CheckResult]:
    """Run ``checks`` on this machine's GPUs; ``NoDevice`` when they cannot run here."""
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        from mono_aot.spec.errors import BadInput

        raise BadInput(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    wanted = [c for c in CHECKS if c in checks]
    wanted = [c for c in wanted if c not in ("narrow",) or "narrow" in layout.variants()]
    arch, devices = find_devices(layout)
    log(f"{len(devices)} x {arch}: GPUs {devices}")
    run = _Run(layout, arch, devices, seed, log)
    results: list[CheckResult] = []
    try:
        run.start(layout.variants(), "dead-rank" in wanted)
        for c in wanted:
            log(f"check {c} ...")
            if c in ("narrow", "wide"):
                results.append(_variant_check(run, c))  # type: ignore[arg-type]
            elif c == "dead-rank":
                results.append(_dead_rank_check(run))
            else:
                results.append(_graph_check(run, replays))
    finally:
        run.close()
    return results
