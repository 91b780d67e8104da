"""Pack wheels: one read-only store per arch, shipped as the distribution ``mono-aot-kernels-<arch>``.

``build_packs`` first builds into the store whatever the selected layouts need and is missing
(or stale: built by another toolchain), then, per arch, generates a tiny hatchling project in a
temporary directory::

    pyproject.toml                      name mono-aot-kernels-<arch>, version = mono-aot's,
                                        dependency mono-aot==<version>, the mono_aot.packs
                                        entry point <arch> = "mono_aot_kernels_<arch>:STORE_ROOT"
    mono_aot_kernels_<arch>/__init__.py STORE_ROOT, ARCH, MONO_AOT_VERSION, KERNEL_SOURCES, LAYOUTS
    mono_aot_kernels_<arch>/store/pack.json            the index (mono_aot.store.packs)
    mono_aot_kernels_<arch>/store/v1/entries/..        the entry files, byte for byte
    mono_aot_kernels_<arch>/store/v1/blobs/..          their verified blobs

and builds it with the standard front end (``python -m build --wheel --no-isolation``: no
network) under a fixed ``SOURCE_DATE_EPOCH``. Hatchling's reproducible mode fixes every member's
timestamp and permissions and sorts the members, so the same store gives a byte-identical wheel
(with the same hatchling). The wheel lands in the output directory by temp file and rename.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mono_aot import __version__
from mono_aot.compiler.compile import DEFAULT_TIMEOUT_S
from mono_aot.compiler.plan import Job, current_toolchain, plan_jobs, select_layouts
from mono_aot.compiler.run import FAILED, JobResult, run_jobs
from mono_aot.keys import real_provider, served_key
from mono_aot.keys.sources import kernel_source_digest
from mono_aot.spec.arch import SUPPORTED_ARCHS
from mono_aot.spec.errors import BadInput, MonoError
from mono_aot.spec.layouts import Layout
from mono_aot.spec.util import file_sha256
from mono_aot.store import Store
from mono_aot.store.packs import PACK_INDEX, PackIndex
from mono_aot.store.paths import PACK_ENTRY_POINT_GROUP

# 2020-02-02T00:00:00Z, hatchling's own default: any fixed value makes the archive reproducible.
SOURCE_DATE_EPOCH = "1580601600"
BUILD_TIMEOUT_S = 600


def pack_dist_name(arch: str) -> str:
    return f"mono-aot-kernels-{arch}"


def pack_module_name(arch: str) -> str:
    return f"mono_aot_kernels_{arch}"


def wheel_name(arch: str, version: str = __version__) -> str:
    return f"{pack_module_name(arch)}-{version}-py3-none-any.whl"


@dataclass
class PackedWheel:
    arch: str
    path: Path
    size: int
    sha256: str
    index: PackIndex

    def as_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "dist": pack_dist_name(self.arch),
            "version": __version__,
            "wheel": str(self.path),
            "size": self.size,
            "sha256": self.sha256,
            "kernel_sources": self.index.kernel_sources,
            "layouts": list(self.index.layouts),
            "entries": list(self.index.entries),
        }


@dataclass
class PackReport:
    results: list[JobResult] = field(default_factory=list)
    wheels: list[PackedWheel] = field(default_factory=list)


def select(arches: Sequence[str], names: Sequence[str]) -> tuple[list[str], list[Layout]]:
    """The archs and layouts to pack. Without ``--layout``: the shipped layouts that target each
    arch (an arch none targets is bad input); without ``--arch``: every arch they target."""
    for a in arches:
        if a not in SUPPORTED_ARCHS:
            raise BadInput(
                f"unknown arch (supported: {', '.join(SUPPORTED_ARCHS)})", field="arch", value=a
            )
    lays = select_layouts(names)
    if not names and arches:
        lays = [lay for lay in lays if any(a in lay.targets for a in arches)]
        for a in arches:
            if not any(a in lay.targets for lay in lays):
                raise BadInput("no shipped layout targets it", field="arch", value=a)
    archs = list(dict.fromkeys(arches)) or list(dict.fromkeys(a for lay in lays for a in lay.archs))
    return archs, lays


def build_packs(
    arches: Sequence[str],
    layout_names: Sequence[str],
    store: Store,
    out_dir: Path,
    *,
    parallel: int = 1,
    timeout: float = DEFAULT_TIMEOUT_S,
    on_result: Callable[[JobResult], None] | None = None,
) -> PackReport:
    """Build what is missing into ``store``, then one pack wheel per arch into ``out_dir``."""
    archs, lays = select(arches, layout_names)
    provider = real_provider()
    toolchain = current_toolchain()
    per_arch: dict[str, list[Job]] = {}
    for a in archs:
        # the layouts that target this arch (named ones must: plan_jobs says which does not)
        mine = [lay for lay in lays if a in lay.targets] if not layout_names else lays
        per_arch[a] = plan_jobs(mine, [a], [], provider, toolchain)
    jobs = [j for a in archs for j in per_arch[a]]
    report = PackReport()
    report.results = run_jobs(
        jobs, store, provider, toolchain, parallel=parallel, timeout=timeout, on_result=on_result
    )
    failed = [r for r in report.results if r.status == FAILED]
    if failed:
        raise MonoError(
            f"{len(failed)} of {len(jobs)} builds failed, no pack written: "
            + ", ".join(f"{r.job.name} ({r.reason})" for r in failed)
        )
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"--out {out_dir}: cannot create the directory: {e.strerror or e}") from None
    for a in archs:
        report.wheels.append(write_pack(a, per_arch[a], store, out_dir))
    return report


_PYPROJECT = """\
[build-system]
requires = ["hatchling>=1.21"]
build-backend = "hatchling.build"

[project]
name = "{dist}"
version = "{version}"
description = "Prebuilt mono-aot drafter kernels for {arch} (a read-only mono-aot store)"
requires-python = ">=3.11"
dependencies = ["mono-aot=={version}"]

[project.entry-points."{group}"]
{arch} = "{module}:STORE_ROOT"

[tool.hatch.build.targets.wheel]
packages = ["{module}"]
"""

_INIT = '''"""Prebuilt mono-aot kernels for {arch}: a read-only store mono-aot serves from.

Generated by ``mono-aot pack``; found through the ``{group}`` entry point group.
"""

from pathlib import Path

STORE_ROOT = Path(__file__).resolve().parent / "store"
ARCH = {arch!r}
MONO_AOT_VERSION = {version!r}
KERNEL_SOURCES = {digest!r}
LAYOUTS = {layouts!r}
'''


def write_pack(arch: str, jobs: Sequence[Job], store: Store, out_dir: Path) -> PackedWheel:
    """The wheel of ``arch`` holding the entries of ``jobs`` (each must be in ``store``)."""
    digest = kernel_source_digest()
    module = pack_module_name(arch)
    with tempfile.TemporaryDirectory(prefix=f"mono-aot-pack-{arch}-") as tmp:
        project = Path(tmp) / "project"
        root = project / module / "store"
        entries, layouts = [], {}
        for job in sorted(jobs, key=lambda j: j.key):
            key = served_key(job.variant, job.layout, arch)
            if key != job.key:  # the build's provider is the installed real kernels
                raise MonoError(f"{job.name}: built key {job.key} is not the served key {key}")
            hit = store.lookup(job.key, accept=lambda e, j=job: e.build_inputs == j.build_inputs)
            if hit is None:
                raise MonoError(f"{job.name}: {store.miss_message(job.key)} after building it")
            rel_entry = hit.entry_path.relative_to(hit.layer.root)
            rel_blob = hit.blob_path.relative_to(hit.layer.root)
            _write(root / rel_entry, hit.entry_path.read_bytes())
            _write(root / rel_blob, hit.data)
            layouts[job.layout.name] = {"name": job.layout.name, "digest": job.layout.digest}
            entries.append(
                {
                    "key": job.key,
                    "layout": job.layout.name,
                    "variant": job.variant,
                    "arch": arch,
                    "ctas": job.layout.ctas(arch),
                    "blob_sha256": hit.entry.blob.sha256,
                    "blob_size": hit.entry.blob.size,
                }
            )
        # the entry file must still be the one whose blob was verified
        for e in entries:
            again = Store.at(root, writable=False).lookup(e["key"])
            if again is None or again.entry.blob.sha256 != e["blob_sha256"]:
                raise MonoError(f"{arch}: entry {e['key']} changed while it was being packed")
        index = PackIndex(
            arch=arch,
            mono_aot_version=__version__,
            kernel_sources=digest,
            layouts=tuple(layouts[n] for n in sorted(layouts)),
            entries=tuple(entries),
        )
        _write(
            root / PACK_INDEX,
            (json.dumps(index.as_json(), indent=2, sort_keys=True) + "\n").encode(),
        )
        fields = {
            "dist": pack_dist_name(arch),
            "version": __version__,
            "arch": arch,
            "module": module,
            "group": PACK_ENTRY_POINT_GROUP,
            "digest": digest,
            "layouts": tuple(sorted(layouts)),
        }
        _write(project / "pyproject.toml", _PYPROJECT.format(**fields).encode())
        _write(project / module / "__init__.py", _INIT.format(**fields).encode())
        built = _run_build(project, Path(tmp) / "dist", arch)
        final = out_dir / built.name
        partial = out_dir / f".tmp-{built.name}.{os.getpid()}"
        try:
            shutil.copyfile(built, partial)
            os.replace(partial, final)
        except OSError as e:
            partial.unlink(missing_ok=True)
            raise MonoError(f"cannot write {final}: {e.strerror or e}") from None
    return PackedWheel(arch, final, final.stat().st_size, file_sha256(final), index)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _run_build(project: Path, dist: Path, arch: str) -> Path:
    """``python -m build --wheel --no-isolation`` on the generated project; the wheel's path."""
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), "."]
    try:
        p = subprocess.run(
            cmd, cwd=project, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise MonoError(f"the {arch} pack wheel build took over {BUILD_TIMEOUT_S} s") from None
    if p.returncode != 0:
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-5:])
        raise MonoError(f"the {arch} pack wheel build failed (exit {p.returncode}): {tail}")
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1 or wheels[0].name != wheel_name(arch):
        raise MonoError(f"the {arch} pack build made {[w.name for w in wheels]}, not one wheel")
    return wheels[0]
