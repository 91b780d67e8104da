"""What the build parent and its worker subprocess agree on (file names, protocol version)."""

import os
import sys

# 3: the worker re-executes the base interpreter with its import roots as /proc/self/fd paths
WORKER_PROTOCOL = 3
RESULT_FILE = "result.json"
CODE_FILE = "code.hsaco"
ISA_FILE = "isa.s"
EXIT_PYTHON_ERROR = 3  # the worker caught an exception and described it in result.json


def worker_interpreter() -> str:
    """The interpreter the compile runs in: the base install behind any venv, symlinks resolved.

    Started as ``python``, ``python3.11``, an absolute path or the console script, a build
    compiles in the same file under the same name (``mono_aot.compiler.worker``).
    """
    base = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    # a relocated install may name a base that is not there: then this interpreter's own file
    return base if os.access(base, os.X_OK) else os.path.realpath(sys.executable)
