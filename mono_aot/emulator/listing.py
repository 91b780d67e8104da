"""Compare a decoded kernel with the ISA listing the compiler printed for the same compile.

FlyDSL's ISA dump is LLVM's assembly printer output for the module that was assembled into the
code object, so every instruction line must equal the decoder's rendering of the bytes at the
same position. What is normalised, and nothing else:

* whitespace: each line is stripped and runs of spaces/tabs collapse to one space;
* comments: text from ``;`` to the end of a line (LLVM's AMDGPU comment character);
* branch targets: the listing names them by label (``.LBB0_7``); each label is resolved to the
  byte offset of the instruction that follows it, and the decoder prints branch targets as that
  byte offset (``0x1a4``, from the kernel's first byte);
* ``.p2align N[, fill[, max]]`` inside the body: the assembler pads with ``s_nop 0`` up to the next
  ``2**N``-byte boundary (none when that needs more than ``max`` bytes); exactly those padding
  instructions are taken from the decoded stream and each must be ``s_nop 0``;
* inline assembly (between ``;;#ASMSTART`` and ``;;#ASMEND``) is printed as the kernel author
  wrote it, not by LLVM's printer: there a mnemonic without an encoding suffix matches the
  decoder's ``_e32`` form of the same instruction (``v_mov_b32`` = ``v_mov_b32_e32``).

Any other directive inside the function body is a mismatch, as is a listing that ends before or
after the decoded code does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mono_aot.emulator.decode import DecodedKernel

_LABEL = re.compile(r"^([.\w$]+):$")
_LABEL_REF = re.compile(r"\.L[\w$]+")
# a long branch's halves of (target - after s_getpc_b64), once its labels are offsets
_LONG_BRANCH_HALF = re.compile(r"\((0x[0-9a-f]+)-(0x[0-9a-f]+)\)(&4294967295|>>32)")


def _long_branch_half(m: re.Match[str]) -> str:
    """The literal the assembler wrote for ``(A-B)&4294967295`` or ``(A-B)>>32`` (64-bit)."""
    delta = (int(m.group(1), 16) - int(m.group(2), 16)) % (1 << 64)
    return f"0x{(delta if m.group(3).startswith('&') else delta >> 32) & 0xFFFFFFFF:x}"


@dataclass(frozen=True)
class Mismatch:
    index: int  # instruction number in the decoded kernel (-1: structure)
    offset: int
    expected: str  # the listing's line, normalised
    got: str  # the decoder's rendering

    def __str__(self) -> str:
        return (
            f"#{self.index} @0x{self.offset:x}: listing {self.expected!r} != decoded {self.got!r}"
        )


@dataclass(frozen=True)
class _Line:
    text: str
    inline_asm: bool


def function_body(isa: str, name: str) -> list[str]:
    """The lines of ``name``'s body in an LLVM AMDGPU assembly listing: after ``name:`` up to
    its ``.Lfunc_end`` label."""
    lines = isa.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == f"{name}:")
    except StopIteration:
        raise ValueError(f"the listing has no label {name}:") from None
    for j in range(start + 1, len(lines)):
        if lines[j].strip().startswith(".Lfunc_end"):
            return lines[start + 1 : j]
    raise ValueError(f"the listing has no .Lfunc_end label after {name}:")


def _items(body: list[str]) -> list[tuple[str, object]]:
    """("label", name) | ("align", (n, max)) | ("inst", _Line) in order."""
    out: list[tuple[str, object]] = []
    in_asm = False
    for raw in body:
        stripped = raw.strip()
        if stripped.startswith(";;#ASMSTART"):
            in_asm = True
            continue
        if stripped.startswith(";;#ASMEND"):
            in_asm = False
            continue
        s = " ".join(raw.split(";", 1)[0].split())
        if not s:
            continue
        m = _LABEL.match(s)
        if m:
            out.append(("label", m.group(1)))
        elif s.startswith(".p2align"):
            args = [a.strip() for a in s[len(".p2align") :].split(",")]
            n = int(args[0])
            mx = int(args[2]) if len(args) > 2 and args[2] else None
            out.append(("align", (n, mx)))
        elif s.startswith("."):
            out.append(("directive", s))
        else:
            out.append(("inst", _Line(s, in_asm)))
    return out


def compare(decoded: DecodedKernel, isa: str) -> list[Mismatch]:
    """Every difference between the decoded kernel and its listing (empty: they agree)."""
    insts = decoded.instructions
    base = decoded.kernel.address
    items = _items(function_body(isa, decoded.kernel.name))
    bad: list[Mismatch] = []
    # pass 1: pair listing lines with decoded instructions, place labels and padding
    pairs: list[tuple[int, _Line]] = []
    labels: dict[str, int] = {}
    i = 0

    def offset_of(k: int) -> int:
        return insts[k].offset if k < len(insts) else len(decoded.kernel.code)

    for kind, val in items:
        if kind == "label":
            labels[str(val)] = offset_of(i)
        elif kind == "align":
            n, mx = val  # type: ignore[misc]
            pad = -(base + offset_of(i)) % (1 << n)
            if mx is not None and pad > mx:
                pad = 0
            for _ in range(pad // 4):
                if i >= len(insts) or insts[i].text() != "s_nop 0":
                    got = insts[i].text() if i < len(insts) else "<end of code>"
                    bad.append(Mismatch(i, offset_of(i), f"padding s_nop 0 ({val})", got))
                    return bad
                i += 1
        elif kind == "directive":
            bad.append(Mismatch(i, offset_of(i), str(val), "<unexpected directive in the body>"))
            return bad
        else:
            if i >= len(insts):
                bad.append(Mismatch(i, offset_of(i), val.text, "<end of code>"))  # type: ignore[union-attr]
                return bad
            pairs.append((i, val))  # type: ignore[arg-type]
            i += 1
    if i != len(insts):
        bad.append(Mismatch(i, offset_of(i), "<end of listing>", insts[i].text()))
    # pass 2: compare
    for k, line in pairs:
        want = _LABEL_REF.sub(lambda m: f"0x{labels[m.group(0)]:x}" if m.group(0) in labels
                              else m.group(0), line.text)  # fmt: skip
        want = _LONG_BRANCH_HALF.sub(_long_branch_half, want)
        got = insts[k].text()
        if want == got:
            continue
        if line.inline_asm:
            mn, _, rest = want.partition(" ")
            gmn, _, grest = got.partition(" ")
            if gmn == mn + "_e32" and rest == grest:
                continue
        bad.append(Mismatch(k, insts[k].offset, want, got))
    return bad
