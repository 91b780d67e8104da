"""Ahead-of-time builds: compile kernels in subprocesses, check the code objects, publish them.

Nothing here is imported by the runtime; FlyDSL is imported only inside the worker subprocess.
"""

from mono_aot.compiler.codeobject import (
    CodeObjectError,
    CodeObjectInfo,
    KernelMeta,
    parse_code_object,
)
from mono_aot.compiler.compile import CompileError, CompileResult, compile_kernel, disassemble

__all__ = [
    "CodeObjectError",
    "CodeObjectInfo",
    "CompileError",
    "CompileResult",
    "KernelMeta",
    "compile_kernel",
    "disassemble",
    "parse_code_object",
]
