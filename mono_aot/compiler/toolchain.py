"""The linker FlyDSL's last step runs: find one that understands code object v6, fingerprint it.

FlyDSL links with ``$ROCM_PATH/llvm/bin/ld.lld`` and passes ``abi=600``, which LLD 19 and newer
accept. The linker's version string ends up in the code object (``.comment``), so its identity
(version and the sha256 of the binary that really runs) is a build input.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from mono_aot.spec.errors import ToolchainError
from mono_aot.spec.util import file_sha256

MIN_LLD_MAJOR = 19
_VERSION_RE = re.compile(r"LLD (\d+)\.(\d+)(?:\.(\d+))?")

HOW_TO_GET_A_LINKER = (
    "install the build extra (pip install 'mono-aot[build]', which brings the ziglang wheel "
    "and its LLD), or Debian's lld-19 or newer (apt-get install lld-22, then put ld.lld on "
    "PATH or set MONO_AOT_LLD), or set ROCM_PATH to a ROCm install"
)


@dataclass(frozen=True)
class Linker:
    """An ``ld.lld`` that was found and run: how to call it and what it is."""

    source: str  # MONO_AOT_LLD, ROCM_PATH, PATH or ziglang
    argv: tuple[str, ...]  # the command that links (extra arguments follow)
    binary: Path  # the executable that really runs (zig for the wheel)
    version: str  # first line of --version
    major: int
    sha256: str

    def identity(self) -> dict[str, str]:
        """What enters the build inputs: the bytes that run and what they say they are."""
        return {"version": self.version, "sha256": self.sha256}


@dataclass
class Discovery:
    """The linker chosen and why every earlier candidate was passed over."""

    linker: Linker | None
    skipped: list[str] = field(default_factory=list)


def probe(argv: tuple[str, ...], binary: Path, source: str) -> Linker:
    """Run ``argv --version``; ``ToolchainError`` says why it is unusable."""
    try:
        proc = subprocess.run(
            [*argv, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"{source}: {' '.join(argv)} does not run: {e}") from None
    text = (proc.stdout or "") + (proc.stderr or "")
    m = _VERSION_RE.search(text)
    if proc.returncode != 0 or not m:
        first = text.strip().splitlines()[:1] or ["no output"]
        raise ToolchainError(f"{source}: {' '.join(argv)} is not ld.lld ({first[0]})")
    major = int(m.group(1))
    version = next(line for line in text.splitlines() if _VERSION_RE.search(line)).strip()
    if major < MIN_LLD_MAJOR:
        raise ToolchainError(
            f"{source}: {binary} is LLD {major}; code object v6 needs LLD {MIN_LLD_MAJOR} or newer"
        )
    return Linker(source, tuple(argv), binary, version, major, file_sha256(binary))


def _ziglang_zig() -> Path | None:
    try:
        import ziglang  # noqa: PLC0415 - optional build dependency
    except ImportError:
        return None
    zig = Path(ziglang.__file__).resolve().parent / "zig"
    return zig if zig.is_file() else None


def discover(env: dict[str, str] | None = None) -> Discovery:
    """Find ``ld.lld`` in order: MONO_AOT_LLD, $ROCM_PATH/llvm/bin, PATH (LLD >= 19), ziglang.

    An explicit ``MONO_AOT_LLD`` that does not work is an error, never silently replaced.
    """
    env = dict(os.environ if env is None else env)
    found = Discovery(None)

    explicit = env.get("MONO_AOT_LLD")
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise ToolchainError(f"MONO_AOT_LLD={explicit}: no such file")
        found.linker = probe((str(p),), p.resolve(), "MONO_AOT_LLD")
        return found

    candidates: list[tuple[str, Path]] = []
    if env.get("ROCM_PATH"):
        candidates.append(("ROCM_PATH", Path(env["ROCM_PATH"]) / "llvm" / "bin" / "ld.lld"))
    on_path = shutil.which("ld.lld", path=env.get("PATH", os.defpath))
    if on_path:
        candidates.append(("PATH", Path(on_path)))
    for source, path in candidates:
        if not path.is_file():
            found.skipped.append(f"{source}: {path} does not exist")
            continue
        try:
            found.linker = probe((str(path),), path.resolve(), source)
            return found
        except ToolchainError as e:
            found.skipped.append(str(e))

    zig = _ziglang_zig()
    if zig is None:
        found.skipped.append("ziglang: the ziglang wheel is not installed")
        return found
    try:
        found.linker = probe((str(zig), "ld.lld"), zig, "ziglang")
    except ToolchainError as e:
        found.skipped.append(str(e))
    return found


def find_linker(env: dict[str, str] | None = None) -> Linker:
    """The linker to build with, or ``ToolchainError`` listing what was tried and the fix."""
    d = discover(env)
    if d.linker is None:
        tried = "; ".join(d.skipped) or "nothing to try"
        raise ToolchainError(
            f"no ld.lld that understands code object v6 (LLD >= {MIN_LLD_MAJOR}) was found "
            f"(tried: {tried}). To get one: {HOW_TO_GET_A_LINKER}"
        )
    return d.linker


def prepare_rocm_dir(linker: Linker, root: Path) -> Path:
    """Make ``root/llvm/bin/ld.lld`` run ``linker`` and return ``root``, for ``ROCM_PATH``.

    FlyDSL's serializer calls exactly that path. The file is written to a temp name and renamed,
    so concurrent builds sharing ``root`` never see half a script.
    """
    bindir = root / "llvm" / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    target = bindir / "ld.lld"
    quoted = " ".join(shlex.quote(a) for a in linker.argv)
    script = f'#!/bin/sh\nexec {quoted} "$@"\n'
    if target.is_file() and target.read_text(errors="replace") == script:
        return root
    tmp = bindir / f".ld.lld.{os.getpid()}.tmp"
    tmp.write_text(script)
    tmp.chmod(0o755)
    os.replace(tmp, target)
    return root
