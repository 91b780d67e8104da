"""Ahead-of-time builds: compile kernels in subprocesses, check the code objects, publish them.

Nothing here is imported by the runtime; FlyDSL is imported only inside the worker subprocess
(``mono_aot/compiler/worker.py``). This file imports nothing, so that ``mono-aot doctor`` can use
``mono_aot.compiler.toolchain`` on an install without the build extra (no msgpack, no
pyelftools): import the submodules (``compile``, ``plan``, ``run``, ``codeobject``) directly.
"""
