"""Suite-wide: tests marked ``rocm`` need a ROCm device and are skipped without one; tests
marked ``background`` judge an emulation the session starts at its first test, and run last."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def rocm_device_reason() -> str | None:
    """None when a ROCm GPU is usable, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not getattr(torch.version, "hip", None):
        return "torch is not a ROCm build (no AMD GPU on this machine)"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "no ROCm device is visible"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the background emulation's judges last: they wait for it while nothing else is left
    items.sort(key=lambda item: "background" in item.keywords)
    reason = rocm_device_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs an AMD GPU: {reason}")
    for item in items:
        if "rocm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def shipped_step(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The shipped layout's one CI launch (``tests/emulator/shipped_step.py``), started in the
    background at the session's first test when a selected test judges it; else None."""
    from tests.emulator.shipped_step import ShippedStep, wanted

    if not wanted(request.session.items):
        yield None
        return
    step = ShippedStep()
    step.start(tmp_path_factory)
    yield step
    step.stop()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """What the background emulation cost, from its judge's ``cost`` property."""
    for reports in terminalreporter.stats.values():
        for r in reports:
            for name, value in getattr(r, "user_properties", ()):
                if name == "cost" and getattr(r, "when", "") == "call":
                    terminalreporter.write_line(f"{r.nodeid}: {value}")


SHIPPED_CASES = [(v, a) for a in ("gfx942", "gfx950") for v in ("narrow", "wide")]
SHIPPED_LAYOUT = "minimax-m3.1-dspark-tp4"
# The emulator's small test layout (layouts/test/): what the emulator runs in CI.
TINY_LAYOUT = "emulator-tiny-tp4"


def _compile_four(layout_name: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """narrow and wide of ``layout_name`` for gfx942 and gfx950, two at a time, each in the
    build's own worker subprocess: ``{(variant, arch): CompileResult}``."""
    from concurrent.futures import ThreadPoolExecutor

    from mono_aot.compiler.compile import compile_kernel
    from mono_aot.keys import real_provider
    from mono_aot.spec.layouts import resolve_layout

    lay = resolve_layout(layout_name)
    prov = real_provider()
    root = tmp_path_factory.mktemp(f"{layout_name}-compiles")

    def one(job: tuple[str, str]):
        variant, arch = job
        return job, compile_kernel(prov, variant, lay, arch, root / f"{variant}-{arch}")

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, SHIPPED_CASES))


@pytest.fixture(scope="session")
def shipped_compiles(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The four shipped kernels (narrow and wide of the shipped layout, gfx942 and gfx950),
    each compiled once per test session: ``{(variant, arch): CompileResult}``, the code object
    and FlyDSL's ISA listing of it. Shared by the kernel and emulator tests, so the session
    compiles them once."""
    return _compile_four(SHIPPED_LAYOUT, tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_compiles(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same for the emulator's small layout (``layouts/test/emulator-tiny-tp4.toml``):
    compiled once per session, only when a test asks for it."""
    return _compile_four(TINY_LAYOUT, tmp_path_factory)


def threads_of(pid: int) -> set[int]:
    """The thread ids of process ``pid`` but its main thread's."""
    from pathlib import Path

    return {int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()} - {pid}


def sigint_to_threads(pid: int, threads: set[int] | None = None) -> set[int]:
    """Send SIGINT to ``threads`` of process ``pid`` (default: all but its main thread), as
    the kernel may deliver a Ctrl-C to any thread while Python handles it only when the main
    thread runs. The threads signalled."""
    import ctypes
    import os
    import signal

    threads = threads_of(pid) if threads is None else threads
    sys_tgkill = {"x86_64": 234, "aarch64": 131}[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    for tid in threads:
        libc.syscall(sys_tgkill, pid, tid, signal.SIGINT)  # a thread that ended meanwhile: ESRCH
    return threads
