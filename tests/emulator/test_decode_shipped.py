"""The decoder against the compiler: for each shipped kernel (narrow and wide of the shipped
layout, gfx942 and gfx950) and each kernel of the emulator's small layout, decoding the code object's bytes and rendering every instruction in
LLVM syntax gives FlyDSL's ISA listing of the same compile, instruction for instruction (what is
normalised is listed in ``mono_aot.emulator.listing``). The kernels come from the session's
compiles (``conftest.py``: ``shipped``, ``compiled``).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mono_aot.emulator.decode import DecodedKernel, DecodeError, decode_kernel
from mono_aot.emulator.elf import CodeObject
from mono_aot.emulator.listing import compare, function_body
from tests.emulator.conftest import CASES, LAYOUT_CASES, compiled
from tests.emulator.elfbuild import code_object

pytestmark = pytest.mark.slow

# FlyDSL writes its ISA dump from a second LLVM codegen of the same IR (``_dump_isa`` in
# flydsl/compiler/jit_function.py re-parses the module and runs gpu-module-to-binary with
# format=isa after the binary was made), and LLVM's scheduling and register allocation depend
# on heap addresses: the listing can differ from the binary (seen with FlyDSL 0.4.2: 20 of
# 14,512 instructions of wide gfx950 reordered; with 0.5.0: reordered windows and other
# registers in the shipped narrow gfx942 kernel). So the oracle is the listing assembled by
# LLVM's own assembler: the decoder must render those bytes as the very lines they came from.


E_FLAGS = {"gfx942": 0x4C, "gfx950": 0x4F}  # the code objects' EF_AMDGPU_MACH (and features)


def assembled(isa: str, name: str, arch: str, tmp: Path) -> DecodedKernel:
    """The listing's body of ``name`` assembled by LLVM's assembler (the clang of the ziglang
    wheel, ``-cc1as``) and decoded: the bytes of the very lines the listing prints, whatever
    codegen printed them."""
    src = tmp / f"{name}.s"
    src.write_text(
        "\t.text\n\t.p2align 8\n" + f"{name}:\n" + "\n".join(function_body(isa, name)) + "\n"
    )
    obj = tmp / f"{name}.o"
    argv = [sys.executable, "-m", "ziglang", "clang", "-cc1as", "-triple", "amdgcn-amd-amdhsa",
            "-target-cpu", arch, "-filetype", "obj", "-o", str(obj), str(src)]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    from elftools.elf.elffile import ELFFile

    with open(obj, "rb") as f:
        text = ELFFile(f).get_section_by_name(".text").data()
    return decode_kernel(code_object(text, name, E_FLAGS[arch]))


@pytest.mark.parametrize(("layout", "variant", "arch"), LAYOUT_CASES)
def test_rendering_equals_the_compilers_listing(request, tmp_path, layout, variant, arch):
    """The decoder renders the bytes of every line of FlyDSL's listing as the listing prints
    it (the listing assembled: an exact oracle), and decodes the binary's own bytes whole:
    every word known, the instructions tiling the code, every encoding family present."""
    b = compiled(request, layout)[(variant, arch)]
    dk = decode_kernel(b.code_object)
    assert dk.kernel.arch == arch
    assert dk.kernel.name == f"mono_drafter_{variant}_0"
    exact = assembled(b.isa, dk.kernel.name, arch, tmp_path)
    said = "\n".join(map(str, compare(exact, b.isa)[:20]))
    assert not compare(exact, b.isa), said
    assert len(exact.instructions) > 8_000
    insts = dk.instructions
    assert len(insts) > 8_000  # every kernel of both layouts has more (tiny gfx950 narrow: 8,921)
    # the instructions tile the kernel's code exactly
    assert insts[0].offset == 0
    assert all(a.offset + a.size == b_.offset for a, b_ in zip(insts, insts[1:], strict=False))
    assert insts[-1].offset + insts[-1].size == len(dk.kernel.code)
    assert insts[-1].name == "s_endpgm"
    # every encoding family the kernels use was decoded (and so compared)
    fmts = {i.fmt for i in insts}
    assert fmts >= {"SOP1", "SOP2", "SOPC", "SOPK", "SOPP", "SMEM", "VOP1", "VOP2", "VOPC",
                    "SDWA", "VOP3", "VOP3P", "MAI", "DS", "FLAT", "MUBUF"}  # fmt: skip


@pytest.mark.parametrize(("variant", "arch"), CASES[:1])
def test_the_comparison_fails_on_a_changed_listing_line(shipped, tmp_path, variant, arch):
    b = shipped[(variant, arch)]
    dk = assembled(b.isa, f"mono_drafter_{variant}_0", arch, tmp_path)
    k = next(i for i in dk.instructions if i.name == "global_load_dwordx4")
    line = "\t" + b.isa.split("\tglobal_load_dwordx4 ", 1)[1].split("\n", 1)[0]
    changed = b.isa.replace(
        "\tglobal_load_dwordx4 " + line[1:], "\tglobal_load_dwordx2 " + line[1:], 1
    )
    bad = compare(dk, changed)
    assert (
        len(bad) == 1
        and bad[0].offset == k.offset
        and bad[0].expected.startswith("global_load_dwordx2")
    )
    # a listing with one instruction fewer than the code
    first = "\t" + dk.instructions[0].text() + "\n"
    assert first in b.isa
    assert compare(dk, b.isa.replace(first, "", 1))


def _patched(code_object: bytes, kernel: str, offset: int, word: int) -> bytes:
    co = CodeObject(code_object)
    k = co.kernel(kernel)
    text = co.section(".text")
    at = text.offset + (k.address - text.addr) + offset
    return code_object[:at] + struct.pack("<I", word) + code_object[at + 4 :]


@pytest.mark.parametrize(("variant", "arch"), [("wide", "gfx950")])
def test_corrupted_and_unknown_words_name_kernel_offset_and_bits(shipped, variant, arch):
    b = shipped[(variant, arch)]
    dk = decode_kernel(b.code_object)
    name = dk.kernel.name
    target = dk.instructions[100]
    bad_word = 0xFC000000 | (target.words[0] & 0xFFFF)  # encoding bits 31:26 = 0b111111
    with pytest.raises(DecodeError) as ei:
        decode_kernel(_patched(b.code_object, name, target.offset, bad_word))
    e = ei.value
    assert (e.kernel, e.offset, e.words[0]) == (name, target.offset, bad_word)
    assert str(e).startswith(f"{name}: offset 0x{target.offset:x}: bits 0x{bad_word:08x}")
    # an MFMA with an opcode no table has (VOP3P 0x7f)
    mfma = next(i for i in dk.instructions if i.fmt == "MAI")
    unknown = (mfma.words[0] & ~(0x7F << 16)) | (0x7F << 16)
    with pytest.raises(DecodeError) as ei:
        decode_kernel(_patched(b.code_object, name, mfma.offset, unknown))
    assert ei.value.offset == mfma.offset and "unknown VOP3P opcode 127" in str(ei.value)
    assert f"bits 0x{unknown:08x} 0x{mfma.words[1]:08x}" in str(ei.value)


def test_one_wrong_encoding_fails_everywhere_it_is_used(shipped, tmp_path):
    """A decoder that renders one opcode wrongly (simulated by renaming that opcode in the
    listing) disagrees at every use of it, and nowhere else."""
    b = shipped[("narrow", "gfx942")]
    dk = assembled(b.isa, "mono_drafter_narrow_0", "gfx942", tmp_path)
    wrong = b.isa.replace("v_lshlrev_b32_e32", "v_lshlrev_b16_e32")
    bad = compare(dk, wrong)
    uses = sum(1 for i in dk.instructions if i.name == "v_lshlrev_b32_e32")
    assert uses > 10 and len(bad) == uses
    assert all(m.got.startswith("v_lshlrev_b32_e32") for m in bad)
