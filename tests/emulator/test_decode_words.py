"""The decoder on single encodings: known words render as LLVM prints them, and every word the
decoder does not know is an error naming kernel, offset and bits. Fast (no compile).

Reference encodings: the LLVM MC tests `llvm/test/MC/AMDGPU/gfx950_asm_features.s` and
`mai-gfx950.s` (``; encoding: [...]`` next to LLVM's own rendering), and words assembled by hand
from the microcode formats of the AMD Instinct MI300 (CDNA3) ISA reference guide, chapter 12.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from mono_aot.emulator.decode import DecodeError, Decoder, decode_kernel
from mono_aot.emulator.elf import CodeObject, ElfError
from tests.emulator.elfbuild import code_object, words


def one(arch: str, data: bytes) -> str:
    insts = Decoder(arch).decode(data, "t")
    assert len(insts) == 1 and insts[0].size == len(data)
    return insts[0].text()


@pytest.mark.parametrize(
    ("arch", "data", "text"),
    [
        # LLVM MC tests (gfx950)
        ("gfx950", bytes([0x02, 0xB3, 0x02, 0x7E]), "v_permlane16_swap_b32_e32 v1, v2"),
        ("gfx950", bytes([0xDB, 0xB3, 0xB4, 0x7F]), "v_permlane16_swap_b32_e32 v218, v219"),
        (
            "gfx950",
            bytes([0x01, 0x00, 0x69, 0xD2, 0x02, 0x07, 0x02, 0x00]),
            "v_cvt_scalef32_pk_bf16_fp8 v1, v2, v3",
        ),
        (
            "gfx950",
            bytes([0x00, 0x00, 0xB5, 0xD3, 0x00, 0x01, 0x02, 0x04]),
            "v_mfma_f32_16x16x32_bf16 v[0:3], v[0:3], v[0:3], v[0:3]",
        ),
        # hand-assembled from the CDNA3 microcode formats
        ("gfx942", words(0x80153D04), "s_add_u32 s21, s4, s61"),  # SOP2 op 0
        ("gfx942", words(0xBF810000), "s_endpgm"),  # SOPP op 1
        ("gfx942", words(0xBF8C0070), "s_waitcnt vmcnt(0) lgkmcnt(0)"),  # expcnt 7 = default
        ("gfx942", words(0xBF8CCF7F), "s_waitcnt vmcnt(63) expcnt(7) lgkmcnt(15)"),  # all max
        ("gfx942", words(0x7E0202F2), "v_mov_b32_e32 v1, 1.0"),  # VOP1, inline 242
        ("gfx942", words(0x7E0202FF, 0x12345678), "v_mov_b32_e32 v1, 0x12345678"),  # literal
        ("gfx942", words(0x7E0202C1), "v_mov_b32_e32 v1, -1"),  # inline 193
        ("gfx942", words(0xB0000060), "s_movk_i32 s0, 0x60"),  # SOPK op 0
        ("gfx942", words(0xBE80016A), "s_mov_b64 s[0:1], vcc"),  # SOP1 op 1, src 106 (64-bit)
        ("gfx942", words(0xBE80006A), "s_mov_b32 s0, vcc_lo"),
        ("gfx942", words(0xD86C0010, 0x01000002), "ds_read_b32 v1, v2 offset:16"),
        ("gfx942", words(0xDC508000, 0x017F0002), "global_load_dword v1, v[2:3], off"),
        ("gfx942", words(0xDC528000, 0x017F0002), "global_load_dword v1, v[2:3], off nt"),
        ("gfx942", words(0xE0A00000 | (1 << 15), 0), "buffer_wbl2 sc1"),
    ],
)
def test_known_encodings(arch, data, text):
    assert one(arch, data) == text


def test_branch_targets_are_byte_offsets_in_the_kernel():
    insts = Decoder("gfx942").decode(words(0xBF800000, 0xBF82FFFF, 0xBF85FFFD), "t")
    assert [i.text() for i in insts] == ["s_nop 0", "s_branch 0x4", "s_cbranch_scc1 0x0"]


def bad(arch: str, data: bytes, offset: int) -> DecodeError:
    with pytest.raises(DecodeError) as ei:
        Decoder(arch).decode(data, "my_kernel_0")
    e = ei.value
    assert e.kernel == "my_kernel_0" and e.offset == offset
    msg = str(e)
    assert msg.startswith(f"my_kernel_0: offset 0x{offset:x}: bits 0x{e.words[0]:08x}")
    return e


def test_unknown_encoding_names_kernel_offset_and_bits():
    e = bad("gfx942", words(0xBF800000, 0xFC000000, 0), 4)
    assert e.words[0] == 0xFC000000 and "unknown encoding" in str(e)


def test_unknown_opcode_names_kernel_offset_and_bits():
    e = bad("gfx942", words(0xBF800000, 0xBF800000, 0xBE807F00), 8)  # SOP1 opcode 127
    assert "unknown SOP1 opcode 127" in str(e)


def test_an_opcode_of_the_other_arch_is_unknown():
    e = bad("gfx942", bytes([0x02, 0xB3, 0x02, 0x7E]), 0)
    assert "unknown VOP1 opcode 89 (0x59) for gfx942" in str(e)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (words(0xD1FF0001, 0x000202FF), "literal"),  # VOP3 v_add3_u32 with src0 = 255
        (words(0xD86C0010), "truncated"),  # DS needs two dwords
        (words(0x7E0202FA, 0), "DPP"),  # VOP1 DPP (src0 = 250)
        (words(0xBF8C0080), "reserved"),  # s_waitcnt bit 7
        (words(0xBF8A0001), "simm16 must be 0"),  # s_barrier 1
        (words(0xDC504000, 0x017F0002), "segment 1"),  # scratch_load_dword
    ],
)
def test_encodings_the_decoder_refuses(data, why):
    e = bad("gfx942", data, 0)
    assert why in str(e)


def test_synthetic_code_object_round_trip():
    co = CodeObject(code_object(words(0xBF8C0070, 0xBF810000), "k_0", 0x4F))
    assert co.arch == "gfx950" and co.kernel_names() == ["k_0"]
    dk = decode_kernel(co.data)
    assert dk.text() == ["s_waitcnt vmcnt(0) lgkmcnt(0)", "s_endpgm"]
    assert dk.kernel.descriptor[16:24] == (0x1000 - 0x800).to_bytes(8, "little")


def test_corrupted_word_in_a_code_object_is_reported():
    data = code_object(words(0xBF8C0070, 0xFC00ABCD, 0xBF810000), "k_0")
    with pytest.raises(DecodeError, match=r"^k_0: offset 0x4: bits 0xfc00abcd 0xbf810000: "):
        decode_kernel(data)


def test_branch_outside_the_kernel_is_an_error():
    with pytest.raises(DecodeError, match="outside the kernel"):
        decode_kernel(code_object(words(0xBF820010, 0xBF810000)))


def test_elf_errors():
    with pytest.raises(ElfError, match="not an ELF"):
        CodeObject(b"nope")
    with pytest.raises(ElfError, match="EF_AMDGPU_MACH 0x40"):
        CodeObject(code_object(words(0xBF810000), mach=0x40))
    co = CodeObject(code_object(words(0xBF810000), "k_0"))
    with pytest.raises(ElfError, match=r"no kernel 'other' in the code object \(it has: k_0\)"):
        co.kernel("other")


def test_importing_the_emulator_needs_no_build_tools():
    code = (
        "import sys, mono_aot.emulator\n"
        "bad = ('flydsl', 'elftools', 'msgpack', 'mono_aot.compiler', 'mono_aot.kernels', 'torch')\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in bad "
        "or any(m.startswith(b) for b in bad))))\n"
    )
    p = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == []
