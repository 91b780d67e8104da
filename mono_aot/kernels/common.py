"""The device-side context every phase of the drafter kernels receives, and small helpers.

Imported only inside kernel tracing (it imports FlyDSL). A phase is a ``@flyc.jit`` function
called from the kernel body: FlyDSL inlines it, so its arguments are ordinary Python objects
-- DSL values (``Int32``/``Int64``/``Float32``/pointers), Python ints known at compile time, and
the ``KernelCtx`` below that carries both. See the interface notes for the calling convention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir.dialects import llvm
from flydsl.expr.typing import T

from mono_aot.spec import abi
from mono_aot.spec.arch import arch_info
from mono_aot.spec.layouts import Layout
from mono_aot.spec.plans import (  # noqa: F401 (PlanError, ProjectionRows: re-exported)
    TABLE_SCALARS,
    PlanError,
    ProjectionRows,
    table_addrs,
)

GLOBAL = fx.AddressSpace.Global
SHARED = fx.AddressSpace.Shared
WAVE = 64
AGENT = "agent"  # LLVM AMDGPU sync scope of one GPU
SYSTEM = None  # LLVM's default (system) scope: every GPU and the host
# What the LDS table carries from the prologue to every phase (KernelCtx.publish/fresh)
TABLE_ADDRS = table_addrs(4)


def _width_bytes(dtype: Any) -> int:
    return max(1, dtype.width // 8)


def gptr(dtype: Any, addr: Any, align: int | None = None) -> Any:
    """A typed global pointer at byte address ``addr`` (Int64); ``align`` defaults to the
    element size. Declare 16 to get ``global_load_dwordx4`` for 16-byte vectors."""
    return fx.inttoptr(fx.Pointer[dtype, GLOBAL, align or _width_bytes(dtype)].ir_type, addr)


def i64(v: Any) -> Any:
    return fx.Int64(v)


def now() -> Any:
    """``s_memrealtime``: the constant 100 MHz clock (Int64 ticks)."""
    return fx.Int64(llvm.call_intrinsic(T.i64, "llvm.amdgcn.s.memrealtime", [], [], []))


def uniform(v: Any) -> Any:
    """An Int32 that is the same in every lane, moved to a scalar register."""
    return fx.Int32(fx.rocdl.readfirstlane(T.i32, fx.Int32(v).ir_value()))


def opaque(v: Any, sgpr: bool = True) -> Any:
    """A copy of ``v`` (Int32/Int64) the compiler cannot see through: values computed from it
    are not hoisted out of the enclosing loop or merged with earlier copies. Each phase works
    on fresh copies of the kernel's ids and addresses, so its setup is recomputed where it
    runs instead of staying live in registers across the whole kernel."""
    raw = v.ir_value()
    wide = v.width == 64
    if sgpr:
        asm, cons = ("s_mov_b64 $0, $1" if wide else "s_mov_b32 $0, $1"), "=s,s"
    else:
        asm, cons = ("v_mov_b64 $0, $1" if wide else "v_mov_b32 $0, $1"), "=v,v"
    out = llvm.InlineAsmOp(raw.type, [raw], asm, cons, has_side_effects=True).result
    return type(v)(out)


def bf16_lo(word: Any) -> Any:
    """Low bf16 of a packed 32-bit word as f32 (exact)."""
    return (fx.Int32(word) << 16).bitcast(fx.Float32)


def bf16_hi(word: Any) -> Any:
    """High bf16 of a packed 32-bit word as f32 (exact)."""
    return (fx.Int32(word) & fx.Int32(-65536)).bitcast(fx.Float32)


def bf16_pack(a: Any, b: Any) -> Any:
    """Two f32 -> one Int32 word (bf16(a) low, bf16(b) high), round to nearest even."""
    v = fx.Vector.from_elements([fx.Float32(a), fx.Float32(b)], fx.Float32).to(fx.BFloat16)
    return v.bitcast(fx.Int32)[0]


def fn_as_fnuz(word: Any) -> Any:
    """Four e4m3fn codes in the form an e4m3fnuz arch reads as half their values (mxfp8 on
    gfx942; the scale doubles, ``e8m0_to_f32``): the one finite code whose meaning differs is
    fn's -0 (0x80, fnuz's NaN), so every byte whose low 7 bits are zero loses its sign bit.
    fn's NaNs (0x7F, 0xFF) the runner refuses at bind time (mono_aot/runtime/runner.py)."""
    w = fx.Int32(word)
    nonzero = ((w & 0x7F7F7F7F) + 0x7F7F7F7F) & -0x7F7F7F80  # bit 7 of a byte: low 7 bits != 0
    return w & (nonzero | 0x7F7F7F7F)


def scale_byte(word: Any, shift: Any) -> Any:
    """Byte ``shift / 8`` of an Int32 word of E8M0 scale bytes."""
    return (fx.Int32(word) >> shift) & 0xFF


def e8m0_to_f32(byte: Any, fnuz: bool) -> Any:
    """``2**(byte - 127)`` as f32; on an e4m3fnuz arch ``2**(byte - 126)`` (its codes read
    e4m3fn values halved, ``fn_as_fnuz``). Byte 0 is ``2**-127``, a denormal; byte 255 (NaN)
    and bytes whose product with 448 leaves f32 the runner refuses."""
    b = fx.Int32(byte)
    if fnuz:
        return ((b + 1) << 23).bitcast(fx.Float32)
    return (b == 0).select(fx.Int32(0x00400000), b << 23).bitcast(fx.Float32)


def fp8x4_to_f32(word: Any) -> list[Any]:
    """Four fp8 codes of one Int32 word -> four f32, by ``v_cvt_pk_f32_fp8`` (the arch's
    format: e4m3fnuz on gfx942, e4m3fn on gfx950)."""
    lo = fx.Vector(fx.rocdl.cvt_pk_f32_fp8(T.vec(2, T.f32), fx.Int32(word), False))
    hi = fx.Vector(fx.rocdl.cvt_pk_f32_fp8(T.vec(2, T.f32), fx.Int32(word), True))
    return [lo[0], lo[1], hi[0], hi[1]]


@dataclass
class KernelCtx:
    """What every phase receives (built once at the top of the kernel body).

    Compile-time (Python): ``lay`` (the Layout), ``arch``, ``variant``, ``nwg`` (workgroups =
    the layout's CTA count), ``threads``, ``waves``, ``n_max`` (the variant's most tokens),
    ``splan``/``peer`` (``abi`` BufferPlans: byte offsets of named regions), ``lds_bytes``
    (the shared arena's size), ``wait_ticks``, ``fp8_max``.

    Runtime (DSL): ``bid``, ``tid``, ``lane``, ``wave`` (Int32), ``rank``, ``n`` (tokens of this
    launch), ``n_req`` (= n / qpr), ``bt_stride`` (Int32), every contract address by its
    ``abi.kernel_args`` name as Int64 (``x``, ``out``, ``tab``, ``qkv_w`` ... ``health``), ``pe``
    (list of the peers' mailbox addresses, index = rank), ``epoch`` (Int32 tag of this launch),
    ``lds`` (a ``Pointer[Uint8, Shared, 16]`` to the arena).
    """

    lay: Layout
    arch: str
    variant: str
    nwg: int
    threads: int
    n_max: int
    splan: abi.BufferPlan
    peer: abi.BufferPlan
    lds_bytes: int
    wait_ticks: int
    addr: dict[str, Any] = field(default_factory=dict)
    rt: dict[str, Any] = field(default_factory=dict)

    # ---- FlyDSL control flow: the context is static (never reassigned inside a runtime
    # if/while/for), so it carries no values through scf regions ----
    def __extract_to_ir_values__(self) -> list[Any]:
        return []

    @classmethod
    def __construct_from_ir_values__(cls, values: list[Any], exemplar: Any = None) -> Any:
        return exemplar

    def fresh(self) -> KernelCtx:
        """A context for one phase: ids as opaque copies, addresses and scalars read back from
        the LDS table (see ``publish`` below), moved to scalar registers."""
        tab = self.rt["table"]
        rt = dict(self.rt)
        rt["bid"] = opaque(self.rt["bid"], sgpr=True)
        rt["tid"] = opaque(self.rt["tid"], sgpr=False)
        addr = {}
        for i, name in enumerate(TABLE_ADDRS):
            lo = fx.Int64(uniform(tab[2 * i])) & fx.Int64(0xFFFFFFFF)
            hi = fx.Int64(uniform(tab[2 * i + 1])) << 32
            addr[name] = hi | lo
        for j, name in enumerate(TABLE_SCALARS):
            rt[name] = uniform(tab[2 * len(TABLE_ADDRS) + j])
        return KernelCtx(
            self.lay, self.arch, self.variant, self.nwg, self.threads, self.n_max, self.splan,
            self.peer, self.lds_bytes, self.wait_ticks, addr=addr, rt=rt,
        )  # fmt: skip

    @property
    def sync(self) -> Any:
        """Int64 address of this launch's half of the scratch ``sync`` region."""
        return self.scr("sync") + fx.Int64(self.rt["par"]) * abi.SYNC_HALF

    # ---- attribute access to runtime values and addresses ----
    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name in d.get("rt", {}):
            return d["rt"][name]
        if name in d.get("addr", {}):
            return d["addr"][name]
        raise AttributeError(name)

    @property
    def waves(self) -> int:
        return self.threads // WAVE

    @property
    def fp8_max(self) -> float:
        return arch_info(self.arch).fp8_max

    @property
    def pe(self) -> list[Any]:
        return [self.addr[f"pe{r}"] for r in range(self.lay.parallel.tp)]

    # ---- addresses ----
    def scr(self, region: str, byte_off: Any = 0) -> Any:
        """Int64 address of a scratch region (``abi.scratch_plan``) plus ``byte_off``."""
        base = self.addr["scratch"] + fx.Int64(self.splan.offset(region))
        return base if isinstance(byte_off, int) and byte_off == 0 else base + fx.Int64(byte_off)

    def peer_addr(self, base: Any, region: str, byte_off: Any = 0) -> Any:
        """Int64 address of a peer-buffer region (``abi.peer_plan``) in the buffer at ``base``."""
        a = base + fx.Int64(self.peer.offset(region))
        return a if isinstance(byte_off, int) and byte_off == 0 else a + fx.Int64(byte_off)

    def tab_at(self, layer: Any, slot: int) -> Any:
        """The Int64 in the pointer table at ``tab[layer, slot]``."""
        return gptr(
            fx.Int64, self.addr["tab"] + fx.Int64(layer) * (abi.TABLE_SLOTS * 8) + slot * 8
        ).load()

    def stacked(self, name: str, layer: Any, bytes_per_layer: int) -> Any:
        """Address of layer ``layer``'s slab of a weight stacked over layers."""
        return self.addr[name] + fx.Int64(layer) * bytes_per_layer

    def lds_ptr(self, dtype: Any, byte_off: int = 0, align: int | None = None) -> Any:
        """A typed shared pointer ``byte_off`` bytes into the arena (compile-time offset)."""
        if byte_off < 0 or byte_off >= self.lds_bytes:
            raise ValueError(f"LDS offset {byte_off} outside the {self.lds_bytes}-byte arena")
        p = fx.recast_iter(fx.Pointer[fx.Uint8, SHARED, 16].ir_type, self.rt["lds"])
        if byte_off:
            p = p + byte_off
        return fx.recast_iter(fx.Pointer[dtype, SHARED, align or _width_bytes(dtype)].ir_type, p)


@flyc.jit
def publish(self: KernelCtx) -> None:
    """Thread 0 writes every address and scalar of this context to the LDS table (then a
    workgroup barrier). Phases read them back through ``fresh``: the kernel arguments are
    then dead after the prologue instead of occupying 50+ scalar registers for the whole
    kernel, and nothing a phase derives from them can be hoisted out of the layer loop."""
    tab = self.rt["table"]
    if self.rt["tid"] == 0:
        for i, name in enumerate(TABLE_ADDRS):
            v = fx.Int64(self.addr[name])
            tab[2 * i] = fx.Int32(v)
            tab[2 * i + 1] = fx.Int32(v >> 32)
        for j, name in enumerate(TABLE_SCALARS):
            tab[2 * len(TABLE_ADDRS) + j] = fx.Int32(self.rt[name])
    fx.gpu.barrier()
