"""Wheel build hook: writes ``mono_aot/_kernel_sources.json`` into the wheel.

The manifest lists the files the served lookup keys hash (``mono_aot.keys.sources``), so an
installed mono-aot computes its keys without parsing its sources at start-up. The isolated build
environment holds hatchling only (no pydantic, no torch), so ``sources.py`` (standard library
only) is loaded by file path, never through ``import mono_aot``. The manifest is generated in a
temporary directory and force-included: nothing is written into the checkout. Editable installs
get no manifest: a checkout parses its sources, so edits to the kernels change the keys at once.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCES_PY = Path("mono_aot") / "keys" / "sources.py"


def _load_sources(root: Path):
    path = root / SOURCES_PY
    spec = importlib.util.spec_from_file_location("_mono_aot_build_sources", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{path}: cannot load the kernel source list module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class KernelSourcesHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        self._tmp = None
        if self.target_name != "wheel" or version == "editable":
            return
        sources = _load_sources(Path(self.root))
        self._tmp = tempfile.mkdtemp(prefix="mono-aot-manifest-")
        manifest = sources.write_manifest(Path(self._tmp))
        build_data["force_include"][str(manifest)] = f"mono_aot/{sources.MANIFEST_NAME}"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
