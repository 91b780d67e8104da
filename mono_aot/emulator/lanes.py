"""The contract between the executor and the per-lane operation tables.

The executor (``mono_aot.emulator.machine``) fetches operands, applies what the encoding says
about them (SDWA/op_sel word and byte selects, ``neg``/``abs`` source modifiers, inline
constants and literals), calls the operation with plain lane arrays, and writes the result under
EXEC (with ``clamp``/``omod`` and SDWA destination selects applied by the executor too). So an
operation in ``mono_aot.emulator.valu`` (integer, bitwise, f32 arithmetic, compares) or
``mono_aot.emulator.numerics`` (fp8/bf16 conversions and packing, transcendentals, division
helpers, MFMA) is a pure function of arrays and is unit-tested against numpy/torch alone.

Conventions for an operation ``fn(ctx, *srcs)``:

- every source is a ``Lanes``: ``numpy.ndarray`` of dtype ``uint32``, shape ``(64,)``, the raw
  register bits; a 64-bit source (``b64``/``f64``/``pf32`` operand types) has shape ``(64, 2)``
  (low dword first);
- the result is a ``Lanes`` of shape ``(64,)`` or ``(64, 2)`` (64-bit results), or, for
  operations that also produce a per-lane bit (carry-out, ``v_div_scale_f32``'s VCC, VOPC
  compares), a tuple ``(Lanes | None, Mask)``; a compare returns ``(None, mask)``;
- ``ctx.mask`` is the per-lane input bit an operation reads (carry-in of ``v_addc_co_u32``,
  the select of ``v_cndmask_b32``, VCC of ``v_div_fmas_f32``), already taken from VCC or the
  SGPR pair the encoding names;
- the executor masks by EXEC; operations compute every lane;
- an operation is elementwise over lanes and must not assume there are 64 of them: a gang of
  waves (``gang.py``) calls it once with the lanes of all its waves, ``(64 * waves,)`` or
  ``(64 * waves, 2)``, and ``tests/emulator/test_gang.py`` checks every gang-able instruction
  of the kernels gives the same bits that way.

Operation tables map the opcode's base name (``Instruction.base``, e.g. ``v_add_co_u32``,
``v_cvt_pk_fp8_f32``) to the function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LANES = 64
Lanes = np.ndarray  # uint32 (64,) or (64, 2)
Mask = np.ndarray  # bool (64,)


@dataclass(frozen=True)
class OpContext:
    """What an operation needs besides its sources."""

    arch: str  # "gfx942" | "gfx950"
    mask: Mask | None = None  # carry-in / select / VCC input, see the module docstring
    old_dst: Lanes | None = None  # the destination's bits before the write (partial writes)
    dst_word: int = 0  # which 16-bit half of the destination receives a 16-bit result
    clamp: bool = False


Result = Lanes | tuple[Lanes | None, Mask]
LaneOp = Callable[..., Result]


def as_f32(x: Lanes) -> np.ndarray:
    """The same bits seen as float32 (a view, no copy)."""
    return x.view(np.float32)


def as_u32(x: np.ndarray) -> Lanes:
    """float32 (or int32) lanes back as raw uint32 bits (a view when possible)."""
    return np.ascontiguousarray(x).view(np.uint32)
