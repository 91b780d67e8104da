"""The emulator's negative fixture: the small test layout (``emulator-tiny-tp4``) built by a
kernel provider with one deliberately wrong index
(``tests/emulator/fixtures/wrong_index/wrong_index_kernels.py`` says which and why it must be
caught). The emulator's check must FAIL on these code objects where it passes on the real ones.

How a test gets them: ask for the session fixture ``wrong_index_build`` (defined in
``tests/emulator/conftest.py``; one build per session), or call ``build_wrong_index(root)``.
Either gives a ``WrongIndexBuild``: ``store`` is a store root holding only these entries,
``keys[(arch, variant)]`` their lookup keys (the provider's sources are keyed, so they are not
the keys the runtime serves the real kernels under: look them up by these keys, e.g.
``Store.at(build.store).lookup(build.keys[("gfx942", "narrow")])``), and
``code_object(arch, variant)`` the verified bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mono_aot.compiler.inputs import directory_provider
from mono_aot.keys import Provider, lookup_key
from mono_aot.spec.layouts import Layout, resolve_layout
from mono_aot.store import Store

PROVIDER_DIR = Path(__file__).resolve().parent / "fixtures" / "wrong_index"
PROVIDER_MODULE = "wrong_index_kernels"
LAYOUT = "emulator-tiny-tp4"


def wrong_index_provider() -> Provider:
    """The fixture provider as the build keys it (its file plus every project module it
    imports, the real kernels included)."""
    return directory_provider(PROVIDER_DIR, PROVIDER_MODULE)


@dataclass(frozen=True)
class WrongIndexBuild:
    store: Path
    layout: Layout
    keys: dict[tuple[str, str], str]  # (arch, variant) -> lookup key in ``store``

    def code_object(self, arch: str, variant: str) -> bytes:
        """The stored bytes of (arch, variant), checked against their entry's digest."""
        hit = Store.at(self.store).lookup(self.keys[(arch, variant)])
        if hit is None:
            raise LookupError(f"{self.store}: no wrong-index entry for {arch}/{variant}")
        return hit.data


def build_wrong_index(
    root: Path,
    archs: Sequence[str] = ("gfx942",),
    variants: Sequence[str] = ("narrow", "wide"),
    jobs: int = 2,
) -> WrongIndexBuild:
    """``mono-aot build --provider DIR:MODULE`` of the small layout into the store ``root``
    (the command users run, publish checks included); ``AssertionError`` with the command's
    output if it does not build, or if its keys are not the provider's."""
    cmd = [sys.executable, "-m", "mono_aot", "build", "--json", "-j", str(jobs),
           "--provider", f"{PROVIDER_DIR}:{PROVIDER_MODULE}", "--layout", LAYOUT,
           "--store", str(root)]  # fmt: skip
    for a in archs:
        cmd += ["--arch", a]
    for v in variants:
        cmd += ["--variant", v]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise AssertionError(
            f"the wrong-index build failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}"
        )
    doc = json.loads(p.stdout)
    keys = {(r["arch"], r["variant"]): r["key"] for r in doc["results"]}
    lay = resolve_layout(LAYOUT)
    prov = wrong_index_provider()
    want = {(a, v): lookup_key(prov, v, lay, a) for a in archs for v in variants}
    if keys != want:
        raise AssertionError(f"the build's keys {keys} are not the provider's {want}")
    return WrongIndexBuild(Path(root), lay, keys)
