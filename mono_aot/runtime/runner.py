"""The user's ``DrafterRunner`` on prebuilt code objects: one TP rank of the drafter kernels.

Behaviour kept from the user's runner (README, "Serving runtime"): the same ``MonoUnsupported`` checks, packed
weights, pointer table, peer buffers, chunking and launch argument list, with every constant
taken from the Layout. Added: the checks of what the kernels assume and nothing checked before
(every dereferenced pointer-table slot is non-zero, each launch's token count fits its
variant), ``check_health()`` and prebuilt kernels instead of a JIT at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mono_aot.spec import abi
from mono_aot.spec.errors import BadInput, MonoError, MonoUnsupported

if TYPE_CHECKING:
    import torch

    from mono_aot.runtime.device import Device
    from mono_aot.runtime.loader import Launcher
    from mono_aot.spec.layouts import Layout
    from mono_aot.store import Store

DEFAULT_LAYOUT = "minimax-m3.1-dspark-tp4"
# (packed name, attribute path under a draft layer, rows, cols) per fp8 projection
PROJECTIONS: tuple[tuple[str, str], ...] = (
    ("qkv", "self_attn.qkv_proj"),
    ("o", "self_attn.o_proj"),
    ("gu", "mlp.gate_up_proj"),
    ("d", "mlp.down_proj"),
)
# norm weight name (mono_aot.spec.abi.NORM_SLOTS) -> attribute path under a draft layer
NORM_ATTRS = {
    "w_in": "input_layernorm.weight",
    "w_post": "post_attention_layernorm.weight",
    "w_q": "self_attn.q_norm.weight",
    "w_k": "self_attn.k_norm.weight",
}
SCALE_ATTRS = {"k_scale": "self_attn.attn._k_scale", "v_scale": "self_attn.attn._v_scale"}
# slots the kernels dereference (all but the block count, which must be positive)
POINTER_SLOTS = {**abi.NORM_SLOTS, **abi.SCALE_SLOTS, "cache": abi.T_CACHE}


class KernelFault(MonoError):
    """A launch recorded a failure in its health words (a peer or barrier timeout, a bad block)."""


@dataclass(frozen=True)
class TPGroup:
    """This rank's tensor-parallel facts: the vLLM adapter passes vLLM's, tests their own."""

    world_size: int
    rank: int
    cpu_group: Any  # a torch.distributed gloo group over the TP ranks


class MappedPeers(Protocol):
    """The all-reduce mailbox buffers as this rank addresses them: ``pe[r]`` is rank r's, and
    ``pe[rank]`` is ``local``. ``mono_aot.runtime.peer.PeerBuffer`` maps them over HIP IPC."""

    local: int
    pe: list[int]

    def close(self) -> None: ...


@dataclass(frozen=True)
class AttentionContext:
    """What a step reads from vLLM's attention metadata."""

    block_table: torch.Tensor  # int32 [requests, max_blocks] (a strided view is fine)
    seq_lens: torch.Tensor  # int32 [requests]
    slots: torch.Tensor | None  # int64 [tokens] or None (nothing written)


def vllm_tp_group() -> TPGroup:
    """vLLM's TP group (imported only when called: vLLM is optional)."""
    try:
        from vllm.distributed import parallel_state as ps
    except ImportError:
        raise MonoUnsupported(
            "vLLM is not importable: pass tp=TPGroup(world_size, rank, cpu_group)"
        ) from None
    group = ps.get_tp_group()
    return TPGroup(group.world_size, group.rank_in_group, group.cpu_group)


def _attr(obj: Any, path: str, where: str) -> Any:
    for part in path.split("."):
        if not hasattr(obj, part):
            raise MonoUnsupported(f"{where}: the draft model has no {path}")
        obj = getattr(obj, part)
    return obj


def kv_cache_of(layer: Any, where: str = "layer") -> torch.Tensor:
    """vLLM's ``attn.kv_cache``: a list whose [0] is the tensor, or the tensor."""
    import torch

    kv = _attr(layer, "self_attn.attn.kv_cache", where)
    if isinstance(kv, list | tuple):
        if not kv:
            raise MonoUnsupported(f"{where}: self_attn.attn.kv_cache is empty")
        kv = kv[0]
    if not isinstance(kv, torch.Tensor):
        raise MonoUnsupported(f"{where}: self_attn.attn.kv_cache is {type(kv).__name__}")
    return kv


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    import torch

    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


# The largest E8M0 byte the kernels serve exactly: 448 * 2**(246 - 127) < 2**128 stays inside
# f32 and bf16 (the wide kernel rounds scaled weights to bf16; mono_aot/kernels/mfma.py).
MX_MAX_SCALE_BYTE = 246


def _mx_weight(w: torch.Tensor, s: torch.Tensor, layout: Layout, what: str) -> tuple:
    """An mxfp8 weight's codes and E8M0 bytes as the kernels read them, unchanged (no copy):
    e4m3fn codes with no NaN (on gfx942 a NaN code would read as a finite e4m3fnuz value) and
    scale bytes up to ``MX_MAX_SCALE_BYTE``."""
    rows, cols = w.shape
    blocks = cols // layout.weights.block
    if s.element_size() != 1 or tuple(s.shape) != (rows, blocks):
        raise MonoUnsupported(
            f"{what}.weight_scale is {s.dtype} {tuple(s.shape)}; the kernels read one E8M0 "
            f"byte per {layout.weights.block} inputs ({rows}, {blocks})"
        )
    codes, scales = _as_bytes(w).contiguous(), _as_bytes(s).contiguous()
    nan = (codes & 0x7F) == 0x7F
    if bool(nan.any()):
        at = nan.nonzero()[0].tolist()
        raise MonoUnsupported(
            f"{what}.weight has a NaN code (0x{int(codes[tuple(at)]):02x}) at {at}"
        )
    big = scales > MX_MAX_SCALE_BYTE
    if bool(big.any()):
        at = big.nonzero()[0].tolist()
        raise MonoUnsupported(
            f"{what}.weight_scale has byte {int(scales[tuple(at)])} at {at}; the kernels serve "
            f"E8M0 bytes up to {MX_MAX_SCALE_BYTE} (larger ones overflow f32 and bf16)"
        )
    return codes, scales


def layer_weights(layer: Any, layout: Layout, where: str) -> dict[str, torch.Tensor]:
    """One draft layer's tensors under the packed names; ``MonoUnsupported`` names a wrong one."""
    import torch

    m = layout.model
    out: dict[str, torch.Tensor] = {}
    shapes = {
        "qkv": (layout.qkv_rows_per_rank, m.hidden),
        "o": (m.hidden, layout.o_cols_per_rank),
        "gu": (layout.gu_rows_per_rank, m.hidden),
        "d": (m.hidden, layout.mlp_per_rank),
    }
    for name, path in PROJECTIONS:
        w = _attr(layer, f"{path}.weight", where)
        s = _attr(layer, f"{path}.weight_scale", where)
        rows, cols = shapes[name]
        if w.element_size() != 1 or tuple(w.shape) != (rows, cols):
            raise MonoUnsupported(
                f"{where}: {path}.weight is {w.dtype} {tuple(w.shape)}; the kernels read fp8 "
                f"codes ({rows}, {cols})"
            )
        if layout.weights.format == "mxfp8":
            out[f"{name}_w"], out[f"{name}_s"] = _mx_weight(w, s, layout, f"{where}: {path}")
            continue
        if s.dtype != torch.float32 or s.numel() != rows:
            raise MonoUnsupported(
                f"{where}: {path}.weight_scale is {s.dtype} {tuple(s.shape)}; the kernels read "
                f"one float32 scale per output row ({rows})"
            )
        out[f"{name}_w"] = _as_bytes(w).contiguous()
        out[f"{name}_s"] = s.reshape(rows).contiguous()
    for name, path in NORM_ATTRS.items():
        w = _attr(layer, path, where)
        n = m.head_dim if name in ("w_q", "w_k") else m.hidden
        if w.dtype != torch.bfloat16 or tuple(w.shape) != (n,) or not w.is_contiguous():
            raise MonoUnsupported(
                f"{where}: {path} is {w.dtype} {tuple(w.shape)}; the kernels read contiguous "
                f"bfloat16 ({n},)"
            )
        out[name] = w
    for name, path in SCALE_ATTRS.items():
        s = _attr(layer, path, where)
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.numel() != 1:
            raise MonoUnsupported(f"{where}: {path} must be a one-element float32 tensor")
        out[name] = s
    return out


class DrafterRunner:
    """The drafter kernels of one TP rank for one ``MiniMaxM3DSparkModel``.

    Built outside graph capture (the peer buffers' IPC exchange is collective and kernels are
    loaded then); a re-bound KV cache (``stale()``) needs a new runner.
    """

    def __init__(
        self,
        model: Any,
        layout: Layout | str = DEFAULT_LAYOUT,
        *,
        tp: TPGroup | Callable[[], TPGroup] | None = None,
        device: Device | None = None,
        attention_context: Callable[[str], AttentionContext] | None = None,
        store: Store | None = None,
        env: dict[str, str] | None = None,
        peers: MappedPeers | None = None,
    ) -> None:
        from mono_aot.runtime.peer import PeerBuffer, agree
        from mono_aot.spec.layouts import resolve_layout

        lay = resolve_layout(layout) if isinstance(layout, str) else layout
        self.layout = lay
        group = tp if isinstance(tp, TPGroup) else (tp or vllm_tp_group)()
        if group.world_size != lay.parallel.tp:
            raise MonoUnsupported(
                f"TP {group.world_size}: the kernels are built for TP {lay.parallel.tp}"
            )
        self.rank = group.rank
        # Construction is collective and all-or-nothing: a rank whose own checks or kernel
        # loads fail still joins the agreement, so no peer waits for it in the IPC exchange
        # and every rank raises the same MonoUnsupported naming it.
        reason = ""
        try:
            self._prepare(model, device, attention_context, store, env)
        except Exception as e:  # noqa: BLE001 - reported to every rank
            reason = f"{type(e).__name__}: {e}" if not isinstance(e, MonoError) else str(e)
        if peers is not None:
            # mapped by the caller for every rank at once (the emulator's one address space):
            # no exchange, so nothing collective to agree on either
            if reason:
                raise MonoUnsupported(f"drafter runner on rank {self.rank}: {reason}")
            if len(peers.pe) != group.world_size or peers.pe[self.rank] != peers.local:
                raise BadInput(
                    f"peers: {len(peers.pe)} addresses with rank {self.rank}'s at "
                    f"{peers.local:#x}; expected {group.world_size} with this rank's own"
                )
            self.peers: MappedPeers = peers
        else:
            agree(not reason, reason, "drafter runner", group.cpu_group)
            self.peers = PeerBuffer(
                lay.peer_bytes, group.cpu_group, self.rank, group.world_size, self.device.hip
            )
        self.pe = [int(a) for a in self.peers.pe]

    def _prepare(
        self,
        model: Any,
        device: Device | None,
        attention_context: Callable[[str], AttentionContext] | None,
        store: Store | None,
        env: dict[str, str] | None,
    ) -> None:
        """This rank's checks, tensors and kernels: everything before the collective."""
        import torch

        from mono_aot.runtime.device import TorchHipDevice
        from mono_aot.runtime.loader import load_launcher
        from mono_aot.spec.arch import base_arch

        lay = self.layout
        m, s = lay.model, lay.serving
        self.device = device if device is not None else TorchHipDevice(env=env)
        facts = self.device.facts()
        arch = base_arch(facts.arch_name)
        if arch not in lay.targets:
            raise MonoUnsupported(
                f"device {facts.index} is {facts.arch_name}; layout {lay.name} targets "
                f"{', '.join(lay.archs)}"
            )
        if facts.cus != lay.ctas(arch):
            raise MonoUnsupported(
                f"{facts.cus} CUs: the kernels need all {lay.ctas(arch)} CTAs co-resident"
            )
        if len(model.layers) != m.layers:
            raise MonoUnsupported(f"{len(model.layers)} draft layers: the kernels run {m.layers}")
        cos_sin = _attr(model, "_rope_cos_sin_cache", "the backbone (set by its weight loading)")
        if (
            cos_sin.dtype != torch.bfloat16
            or cos_sin.dim() != 2
            or cos_sin.shape[-1] != m.rotary_dim
            or not cos_sin.is_contiguous()
        ):
            raise MonoUnsupported(
                f"rope cache {cos_sin.dtype} {tuple(cos_sin.shape)}: the kernels read a "
                f"contiguous bfloat16 [max_pos, {m.rotary_dim}] cos|sin cache"
            )
        self.cos_sin = cos_sin
        self.layers = [layer_weights(x, lay, f"layer {i}") for i, x in enumerate(model.layers)]
        self.final_norm = model.norm.weight
        if self.final_norm.dtype != torch.bfloat16 or tuple(self.final_norm.shape) != (m.hidden,):
            raise MonoUnsupported(
                f"model.norm.weight is {self.final_norm.dtype} {tuple(self.final_norm.shape)}; "
                f"the kernels read bfloat16 ({m.hidden},)"
            )
        self.layer_names = [
            _attr(x, "self_attn.attn.layer_name", f"layer {i}") for i, x in enumerate(model.layers)
        ]
        self._layers = model.layers
        self.caches = [kv_cache_of(x, f"layer {i}") for i, x in enumerate(model.layers)]
        for i, kv in enumerate(self.caches):
            if kv.numel() == 0 or tuple(kv.shape[1:]) != (1, s.kv_block, lay.kv_entry_bytes):
                raise MonoUnsupported(
                    f"draft KV cache of layer {i} {tuple(kv.shape)}: the kernels read "
                    f"[blocks, 1, {s.kv_block}, {lay.kv_entry_bytes}]"
                )
            if kv.element_size() != 1 or not kv.is_contiguous():
                raise MonoUnsupported(
                    f"draft KV cache of layer {i} {kv.dtype}"
                    + ("" if kv.is_contiguous() else " (not contiguous)")
                    + ": the kernels read contiguous fp8 bytes"
                )
        dev = self.caches[0].device
        self.packed = {
            f"{p}_{k}": torch.stack([w[f"{p}_{k}"] for w in self.layers]).contiguous()
            for p, _ in PROJECTIONS
            for k in ("w", "s")
        }
        self.tab = self._pointer_table().to(dev)
        self.scratch = {
            v: torch.zeros(lay.scratch_bytes(v), dtype=torch.uint8, device=dev)
            for v in lay.variants()
        }
        self.health = torch.zeros(abi.HEALTH_WORDS, dtype=torch.int32, device=dev)
        self.step = torch.zeros(1, dtype=torch.int32, device=dev)
        self.no_slots = torch.full((s.qpr * s.max_reqs,), -1, dtype=torch.int64, device=dev)
        self._attention_context = attention_context
        # the kernels before the collective: a rank that cannot load them is named there,
        # before any peer has mapped its buffer
        self.launchers: dict[str, Launcher] = {
            v: load_launcher(v, lay, self.device, store=store, env=env) for v in lay.variants()
        }

    def _pointer_table(self) -> torch.Tensor:
        """``tab[layer, slot]``; every slot a kernel dereferences must be a real address."""
        import torch

        tab = torch.zeros(self.layout.model.layers, abi.TABLE_SLOTS, dtype=torch.int64)
        for i, (w, kv) in enumerate(zip(self.layers, self.caches, strict=True)):
            for name, slot in {**abi.NORM_SLOTS, **abi.SCALE_SLOTS}.items():
                tab[i, slot] = w[name].data_ptr()
            tab[i, abi.T_CACHE] = kv.data_ptr()
            tab[i, abi.T_NBLK] = kv.shape[0]
        for i in range(tab.shape[0]):
            for name, slot in POINTER_SLOTS.items():
                if int(tab[i, slot]) == 0:
                    raise MonoUnsupported(
                        f"layer {i}: pointer-table slot {slot} ({name}) is a null address"
                    )
            if int(tab[i, abi.T_NBLK]) <= 0:
                raise MonoUnsupported(f"layer {i}: the KV cache has no blocks")
        return tab

    def variant_for(self, requests: int) -> str:
        """The variant a launch of ``requests`` requests takes."""
        return "wide" if requests >= self.layout.serving.wide_base else "narrow"

    def chunks(self, requests: int) -> list[tuple[int, int, str]]:
        """``(first request, requests, variant)`` of each launch of a step."""
        c = self.layout.serving.chunk_reqs
        return [
            (r0, min(c, requests - r0), self.variant_for(min(c, requests - r0)))
            for r0 in range(0, requests, c)
        ]

    def stale(self) -> bool:
        """Whether vLLM re-bound the draft KV caches since the build."""
        now = [kv_cache_of(x).data_ptr() for x in self._layers]
        return now != [kv.data_ptr() for kv in self.caches]

    def close(self) -> None:
        self.peers.close()

    def check_health(self) -> None:
        """Raise ``KernelFault`` naming rank, layer, phase and peer or status when a launch
        recorded a failure (this synchronises with the device)."""
        words = [int(w) for w in self.health.tolist()]
        if words[abi.H_STATUS] != abi.STATUS_OK:
            raise KernelFault(f"rank {self.rank}: drafter kernel: {abi.describe_health(words)}")

    def _launch(
        self,
        variant: str,
        x: torch.Tensor,
        out: torch.Tensor,
        bt: torch.Tensor,
        pos: torch.Tensor,
        slots: torch.Tensor,
        seq_lens: torch.Tensor,
        n: int,
        stream: Any,
    ) -> None:
        q = self.layout.serving.qpr
        cap = self.layout.variant_tokens(variant)  # type: ignore[arg-type]
        if n <= 0 or n % q or n > cap:
            raise BadInput(
                f"a {variant} launch of {n} tokens: it takes a multiple of {q} up to {cap}"
            )
        pk = self.packed
        self.launchers[variant](
            x.data_ptr(), out.data_ptr(), self.tab.data_ptr(),
            pk["qkv_w"].data_ptr(), pk["qkv_s"].data_ptr(), pk["o_w"].data_ptr(),
            pk["o_s"].data_ptr(), pk["gu_w"].data_ptr(), pk["gu_s"].data_ptr(),
            pk["d_w"].data_ptr(), pk["d_s"].data_ptr(), self.final_norm.data_ptr(),
            self.cos_sin.data_ptr(), bt.data_ptr(), pos.data_ptr(), slots.data_ptr(),
            seq_lens.data_ptr(), self.scratch[variant].data_ptr(), int(self.peers.local),
            *self.pe, self.step.data_ptr(), self.health.data_ptr(),
            self.rank, bt.stride(0), n,
            stream=stream,
        )  # fmt: skip

    def forward(
        self,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor,
        context: AttentionContext | None = None,
        *,
        stream: Any = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The layers and the final norm of a draft step: ``(n, hidden)`` bf16, written into
        ``out`` when given (contiguous bf16 ``(n, hidden)`` on the caches' device; a buffer
        kept across steps, e.g. one a CUDA graph captured, or a poisoned one in a test)."""
        import torch

        lay = self.layout
        if context is None:
            if self._attention_context is None:
                raise MonoUnsupported(
                    "no attention context: pass context= or attention_context= to the runner"
                )
            context = self._attention_context(self.layer_names[0])
        n = inputs_embeds.shape[0]
        q = lay.serving.qpr
        if n % q or n // q > lay.serving.max_reqs:
            raise BadInput(
                f"{n} tokens: a step carries whole requests of {q} tokens, at most "
                f"{lay.serving.max_reqs} requests"
            )
        if (
            tuple(inputs_embeds.shape[1:]) != (lay.model.hidden,)
            or inputs_embeds.dtype != torch.bfloat16
        ):
            raise BadInput(
                f"inputs_embeds {inputs_embeds.dtype} {tuple(inputs_embeds.shape)}: expected "
                f"bfloat16 (n, {lay.model.hidden})"
            )
        slots = context.slots if context.slots is not None else self.no_slots[:n]
        bt = context.block_table
        x = inputs_embeds.contiguous()
        if out is None:
            out = torch.empty((n, lay.model.hidden), dtype=torch.bfloat16, device=x.device)
        elif (
            tuple(out.shape) != (n, lay.model.hidden)
            or out.dtype != torch.bfloat16
            or out.device != x.device
            or not out.is_contiguous()
        ):
            raise BadInput(
                f"out {out.dtype} {tuple(out.shape)} on {out.device}: expected contiguous "
                f"bfloat16 ({n}, {lay.model.hidden}) on {x.device}"
            )
        # a request reads only its own rows and cache and every GEMV row is per token, so a
        # step splits into independent launches (each takes a fresh tag in the kernels)
        for r0, k, variant in self.chunks(n // q):
            a, b = r0 * q, (r0 + k) * q
            self._launch(
                variant, x[a:b], out[a:b], bt[r0:], positions[a:], slots[a:],
                context.seq_lens[r0:], b - a, stream,
            )  # fmt: skip
        self.step.add_(1)
        return out
