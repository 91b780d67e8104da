"""The one shipped-layout launch CI emulates on every run (issue: the shipped bytes, not only the
small layout's, run to a verdict): the gfx942 narrow step of 1 request. It takes most of
half an hour of one core, so the suite starts it in the background when the session starts
(``tests/conftest.py``, ``shipped_step``) and judges it last
(``tests/emulator/test_shipped_step.py``), while the other tests run on the other core."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest

from tests.conftest import SHIPPED_LAYOUT

ARCH = "gfx942"
ARGS = ("--layout", SHIPPED_LAYOUT, "--arch", ARCH, "--check", "narrow", "--requests", "1")
# the emulation's bound (it takes about 27 minutes beside the suite on 2 cores)
TIMEOUT_S = 3 * 3600


@dataclass
class ShippedStep:
    """The background emulation: its ``Result`` when done (``tests/emulator/conftest.py``),
    and the process while it runs, so an interrupted session kills it."""

    future: Future = field(default_factory=Future)
    proc: subprocess.Popen | None = None
    stopped: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        threading.Thread(
            target=self._run, args=(tmp_path_factory,), name="shipped-step", daemon=True
        ).start()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()

    def _run(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        from tests.emulator.conftest import Result, emulate_env, stored_kernels

        try:
            # both variants: the runner binds narrow and wide, whichever a step launches
            store = stored_kernels(tmp_path_factory, SHIPPED_LAYOUT, ARCH)[0]
            env = emulate_env(tmp_path_factory.mktemp("shipped-step"), [store])
            with self.lock:
                if self.stopped:
                    raise RuntimeError("the session ended before the shipped step started")
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "mono_aot", "emulate", "--json", *ARGS],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                    text=True, env=env,
                )  # fmt: skip
            out, err = self.proc.communicate(timeout=TIMEOUT_S)
            self.future.set_result(Result.of(self.proc.returncode, out, err))
        except BaseException as e:  # noqa: BLE001 - the judging test reports it
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
            self.future.set_exception(e)


def wanted(items: list[pytest.Item]) -> bool:
    """Whether a selected test judges the shipped step (``-m "not slow"`` and ``-k`` drop it)."""
    return any("background" in item.keywords for item in items)
