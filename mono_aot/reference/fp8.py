"""fp8 codecs on raw ``uint8`` codes: OCP e4m3fn (gfx950) and e4m3fnuz (gfx942).

The kernels read weights and the paged KV cache as bytes and convert them with the rocdl cvt
ops, whose format depends on the arch (``mono_aot.spec.arch``). Everything on the host side that
produces or checks those bytes goes through this module. The bytes are defined here in plain
arithmetic (``encode(..., exact_arith=True)`` and ``decode``'s table), independent of torch's
float8 dtypes; the tests compare that arithmetic with torch's dtypes bit for bit. ``encode``
by default takes a fast path through torch's float32 -> float8 conversion, which gives the
same bytes (also tested), and falls back to the arithmetic when torch lacks the dtype.

Both formats: 1 sign bit, 4 exponent bits, 3 mantissa bits, no infinities.

- ``e4m3fn`` (OCP): bias 7, max 448, NaN = ``0x7F``/``0xFF``, has a negative zero ``0x80``.
- ``e4m3fnuz``: bias 8, max 240, the only NaN is ``0x80``, no negative zero (``-0.0`` and
  negative values that round to zero encode as ``0x00``).

Encoding rounds to nearest, ties to even, from the exact value of the input (a float64 input is
rounded once, not through float32 as torch's own float64 conversion does). Overflow (a value whose
rounded magnitude exceeds the format's max, and infinities) follows ``saturate``:

- ``saturate=None`` (default): the format's own rule, as torch 2.13 implements it:
  e4m3fn saturates to +-448 (infinities too), e4m3fnuz produces NaN (``0x80``).
- ``saturate=True``: clamp to +-max on both formats (what the kernels do before their cvt op,
  and what every cache and weight writer in this project uses).
- ``saturate=False``: NaN on overflow on both formats.

NaN inputs always encode as NaN (e4m3fn keeps the sign: ``0x7F`` or ``0xFF``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from mono_aot.spec.arch import arch_info
from mono_aot.spec.errors import BadInput


@dataclass(frozen=True)
class FP8Format:
    """One 8-bit float format with 4 exponent and 3 mantissa bits."""

    name: str
    bias: int
    max: float
    torch_dtype_name: str  # the matching torch dtype (tests compare against it)
    overflow_saturates: bool  # the format's default rule (torch's behaviour)

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - 3)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.torch_dtype_name)

    @property
    def nan_code(self) -> int:
        """The positive NaN code."""
        return 0x7F if self.name == "e4m3fn" else 0x80

    @property
    def max_code(self) -> int:
        """The code of +max."""
        return 0x7E if self.name == "e4m3fn" else 0x7F


E4M3FN = FP8Format(
    "e4m3fn", bias=7, max=448.0, torch_dtype_name="float8_e4m3fn", overflow_saturates=True
)
E4M3FNUZ = FP8Format(
    "e4m3fnuz", bias=8, max=240.0, torch_dtype_name="float8_e4m3fnuz", overflow_saturates=False
)
FORMATS: dict[str, FP8Format] = {f.name: f for f in (E4M3FN, E4M3FNUZ)}


def fp8_format(name: str) -> FP8Format:
    """A format by name (``e4m3fn``, ``e4m3fnuz``); ``KeyError`` names the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(
            f"unknown fp8 format {name!r}; known: {', '.join(sorted(FORMATS))}"
        ) from None


def format_for_arch(arch: str) -> FP8Format:
    """The format the arch's ``v_cvt_*_fp8`` instructions read (``mono_aot.spec.arch``)."""
    info = arch_info(arch)
    fmt = fp8_format(info.fp8_format)
    if fmt.max != info.fp8_max:  # the two tables must agree
        raise AssertionError(
            f"{arch}: arch table says fp8 max {info.fp8_max}, {fmt.name} is {fmt.max}"
        )
    return fmt


def resolve_format(fmt_or_arch: FP8Format | str) -> FP8Format:
    """A format itself, a format name, or an arch name (``gfx942``) -> its format."""
    if isinstance(fmt_or_arch, FP8Format):
        return fmt_or_arch
    if fmt_or_arch in FORMATS:
        return FORMATS[fmt_or_arch]
    try:
        return format_for_arch(fmt_or_arch)
    except KeyError:
        raise KeyError(
            f"{fmt_or_arch!r} is neither an fp8 format ({', '.join(sorted(FORMATS))}) nor a "
            "supported arch"
        ) from None


_as_format = resolve_format


@cache
def _table(name: str) -> torch.Tensor:
    """float64 value of every code (NaN codes are NaN, signed as their code)."""
    fmt = FORMATS[name]
    c = torch.arange(256, dtype=torch.int64)
    sign = torch.where(c >= 128, -1.0, 1.0).to(torch.float64)
    e = (c >> 3) & 0xF
    m = (c & 7).to(torch.float64)
    normal = (1.0 + m / 8.0) * torch.pow(2.0, (e - fmt.bias).to(torch.float64))
    sub = (m / 8.0) * 2.0**fmt.emin
    val = sign * torch.where(e == 0, sub, normal)
    if fmt.name == "e4m3fn":
        nan = (c & 0x7F) == 0x7F
    else:
        nan = c == 0x80
        sign = torch.where(nan, 1.0, sign).to(
            torch.float64
        )  # the one NaN is unsigned (torch: +NaN)
    return torch.where(nan, torch.copysign(torch.full_like(val, torch.nan), sign), val)


def decode_table(fmt: FP8Format | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The value of each of the 256 codes, as ``dtype`` (every code is exact in bf16 and up)."""
    return _table(_as_format(fmt).name).to(dtype, copy=True)


def decode(
    codes: torch.Tensor, fmt: FP8Format | str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Values of ``uint8`` codes, shape kept; exact in any dtype from bf16 up."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"fp8 codes must be uint8, got {codes.dtype}")
    table = decode_table(fmt, dtype).to(codes.device)
    flat = codes.reshape(-1).to(torch.int32)
    return table.index_select(0, flat).reshape(codes.shape)


_CHUNK = 1 << 22  # elements per pass: bounds the temporaries of very large tensors
_HALF = 1 << 48  # half a unit of the 3rd mantissa bit of a float64 (bit 49)


def encode(
    x: torch.Tensor, fmt: FP8Format | str, saturate: bool | None = None, exact_arith: bool = False
) -> torch.Tensor:
    """``uint8`` codes of ``x`` (any float dtype), round to nearest even; see the module doc.

    Two implementations give the same bytes (the tests check it on a dense sweep):

    - the arithmetic one (``exact_arith=True``, and whenever torch lacks the float8 dtype)
      works on the float64 bit pattern of ``|x|``: in the normal range the code is the exponent
      and top 3 mantissa bits, rounded half to even (a carry rolls into the exponent); below
      the smallest normal it is ``|x|`` in units of the smallest subnormal, rounded half to
      even. Codes ``0..max_code`` are ordered by magnitude, so an overflow is simply a code past
      ``max_code``;
    - the fast one lets torch's float32 -> float8 conversion (round to nearest even) do the
      work, after clamping to +-max when saturating, marking overflows as NaN when not (torch's
      e4m3fn conversion would saturate); float64 values whose float32 rounding lands exactly on
      an fp8 rounding boundary are re-encoded the arithmetic way (see ``_encode_fast``).
    """
    f = _as_format(fmt)
    if not x.is_floating_point():
        raise TypeError(f"encode needs a floating-point tensor, got {x.dtype}")
    sat = f.overflow_saturates if saturate is None else saturate
    one = _encode_flat if exact_arith or not hasattr(torch, f.torch_dtype_name) else _encode_fast
    flat = x.reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.uint8, device=x.device)
    for i in range(0, flat.numel(), _CHUNK):
        out[i : i + _CHUNK] = one(flat[i : i + _CHUNK], f, sat)
    return out.reshape(x.shape)


def _encode_fast(x: torch.Tensor, f: FP8Format, sat: bool) -> torch.Tensor:
    t = x.to(torch.float32)  # exact for bf16/fp16/fp32; rounded (to nearest even) for float64
    if sat:
        codes = torch.clamp(t, -f.max, f.max).to(f.torch_dtype).view(torch.uint8)  # NaN stays NaN
    else:
        codes = t.to(f.torch_dtype).view(torch.uint8)
        if f.overflow_saturates:  # torch saturates this format: overflows become NaN here
            over_mid = f.max + (f.max - float(_table(f.name)[f.max_code - 1])) / 2
            a = t.abs()
            over = (a > over_mid) | ((a == over_mid) & (f.max_code % 2 == 1))
            nan_code = torch.where(torch.signbit(t), 0xFF, 0x7F).to(torch.uint8)
            codes = torch.where(over, nan_code, codes)
    if f.name == "e4m3fn":
        # the sign of a NaN, from the input itself (torch's fp16 -> fp32 drops it)
        nan = torch.isnan(x)
        if bool(nan.any()):
            codes = torch.where(
                nan, torch.where(torch.signbit(x), 0xFF, 0x7F).to(torch.uint8), codes
            )
    if x.dtype == torch.float64:
        # Rounding to float32 is monotonic and every fp8 rounding boundary is a float32, so the
        # detour can only go wrong where it lands exactly on a boundary from an inexact value:
        # normal-range midpoints (mantissa bit 19 set, bits 0..18 clear, the overflow midpoint
        # included) and anything in the subnormal range. Those few go the arithmetic way.
        bits = t.view(torch.int32)
        cand = ((bits & 0xFFFFF) == 0x80000) | (t.abs() < f.min_normal)
        if bool(cand.any()):
            idx = torch.nonzero(cand).reshape(-1)
            idx = idx[x[idx] != t[idx].to(torch.float64)]
            if idx.numel():
                codes[idx] = _encode_flat(x[idx], f, sat)
    return codes


def _encode_flat(x: torch.Tensor, f: FP8Format, sat: bool) -> torch.Tensor:
    x = x.to(torch.float64)
    neg = x.view(torch.int64) < 0  # the sign bit, also of -0.0 and NaNs
    a = x.abs()
    bits = a.view(torch.int64)  # non-negative, so ordered like the values; NaN/inf are largest
    # round half to even at the 3rd mantissa bit: add just under half a unit plus the kept
    # lowest bit, then drop the 49 bits below it (a carry rolls into the exponent)
    code = ((bits >> 49) & 1).add_(bits).add_(_HALF - 1).bitwise_right_shift_(49)
    code.sub_((1023 - f.bias) << 3)
    small = a < f.min_normal  # subnormal codes: |x| in units of the smallest subnormal
    if bool(small.any()):
        code = torch.where(small, torch.round(a * 2.0 ** (3 - f.emin)).to(torch.int64), code)
    over = code > f.max_code  # includes infinities and NaNs
    code.clamp_(max=f.max_code)
    if f.name == "e4m3fn":
        code.bitwise_or_(neg.to(torch.int64) << 7)
        nan_code = torch.where(neg, 0xFF, 0x7F)
    else:
        code.bitwise_or_((neg & (code != 0)).to(torch.int64) << 7)  # no negative zero
        nan_code = torch.full_like(code, 0x80)
    if not sat:
        code = torch.where(over, nan_code, code)
    nan = torch.isnan(a)
    if bool(nan.any()):
        code = torch.where(nan, nan_code, code)
    return code.to(torch.uint8)


def quantize_dequantize(
    x: torch.Tensor, fmt: FP8Format | str, saturate: bool | None = True
) -> torch.Tensor:
    """``decode(encode(x))`` in float64: the value an fp8 store then load gives back."""
    return decode(encode(x, fmt, saturate), fmt, torch.float64)


def code_distance(a: torch.Tensor, b: torch.Tensor, fmt: FP8Format | str) -> torch.Tensor:
    """How many representable steps apart two code tensors are (int64; 0 = equal value).

    Codes are sign-magnitude, so ``+-(code & 0x7F)`` orders them; both zeros of e4m3fn are 0
    apart. A NaN code on either side is 1000 apart from everything.
    """
    f = _as_format(fmt)

    def ordinal(c: torch.Tensor) -> torch.Tensor:
        c = c.to(torch.int64)
        mag = c & 0x7F
        return torch.where(c >= 0x80, -mag, mag)

    def isnan(c: torch.Tensor) -> torch.Tensor:
        return (c & 0x7F) == 0x7F if f.name == "e4m3fn" else c == 0x80

    d = (ordinal(a) - ordinal(b)).abs()
    return torch.where(isnan(a) | isnan(b), 1000, d)


def boundary_gap(x: torch.Tensor, fmt: FP8Format | str) -> torch.Tensor:
    """Absolute distance of each value from the nearest rounding boundary of ``encode``.

    A boundary is a midpoint between two adjacent magnitudes (including the overflow midpoint
    past the max). Two computations of one quantity that differ by ``d`` can encode differently
    only where this is below ``d``, so byte-exact comparisons of independently computed fp8
    data (kernel against reference) mask out the values under a tolerance. float64; ``inf`` for
    NaN and infinite inputs.
    """
    f = _as_format(fmt)
    a = x.to(torch.float64).abs()
    special = torch.isnan(a) | torch.isinf(a)
    a = torch.where(special, 0.0, a)
    _, ex = torch.frexp(a)
    e = torch.clamp(ex.to(torch.int64) - 1, min=f.emin)
    quantum = torch.pow(2.0, (e - 3).to(torch.float64))
    # the midpoints around a in its binade, and the last midpoint of the binade below
    below = (torch.floor(a / quantum - 0.5) + 0.5) * quantum
    d = torch.minimum((a - below).abs(), (a - below - quantum).abs())
    edge = torch.pow(2.0, e.to(torch.float64)) - quantum / 4
    d = torch.where(e > f.emin, torch.minimum(d, (a - edge).abs()), d)
    return torch.where(special, torch.inf, d)


def boundary_distance(x: torch.Tensor, fmt: FP8Format | str) -> torch.Tensor:
    """``boundary_gap`` relative to the value itself (its magnitude, at least the smallest
    subnormal): where a computation's error is relative to what it computes."""
    f = _as_format(fmt)
    a = x.to(torch.float64).abs().nan_to_num(0.0, 0.0, 0.0)
    return boundary_gap(x, f) / torch.clamp(a, min=f.min_subnormal)


E8M0_BIAS = 127
E8M0_NAN = 0xFF  # the one E8M0 byte that is not a power of two


def e8m0_decode(scales: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """OCP MX E8M0 scale bytes (uint8) as the powers of two ``2**(byte - 127)`` they stand for;
    ``0xFF`` is NaN. Exact in float32 and float64 (``2**-127`` is a float32 subnormal)."""
    if scales.dtype != torch.uint8:
        raise BadInput(f"E8M0 scales: dtype {scales.dtype}, expected torch.uint8")
    e = scales.to(torch.int32) - E8M0_BIAS
    out = torch.ldexp(torch.ones(e.shape, dtype=torch.float64), e).to(dtype)
    return torch.where(scales == E8M0_NAN, torch.tensor(float("nan"), dtype=dtype), out)


__all__ = [
    "E4M3FN",
    "E4M3FNUZ",
    "E8M0_BIAS",
    "E8M0_NAN",
    "FORMATS",
    "FP8Format",
    "boundary_distance",
    "boundary_gap",
    "code_distance",
    "decode",
    "decode_table",
    "e8m0_decode",
    "encode",
    "format_for_arch",
    "fp8_format",
    "quantize_dequantize",
    "resolve_format",
]
