"""A functional emulator of the shipped gfx942 / gfx950 code objects (device-independent).

``decode`` turns a kernel's machine code into structured instructions rendered in LLVM's
assembly syntax; ``listing`` compares that rendering with the compiler's ISA listing; ``flow``
builds the control-flow graph (blocks, dominators, loops, register def/use) and ``syncscan``
checks the sync protocol on it (acquires after poll loops, releases before peer flag stores).
Imports no FlyDSL and needs nothing outside the standard library for decoding.
"""

from mono_aot.emulator.decode import DecodedKernel, DecodeError, Instruction, decode_kernel
from mono_aot.emulator.elf import CodeObject, ElfError

__all__ = ["CodeObject", "DecodeError", "DecodedKernel", "ElfError", "Instruction", "decode_kernel"]
