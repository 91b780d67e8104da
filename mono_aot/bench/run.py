"""``mono-aot bench``: every figure measured in this run, in real fresh processes.

Each measured process is a new interpreter started here and timed from outside
(``time.perf_counter`` around it; CPU from ``RUSAGE_CHILDREN``, which includes the process's own
waited-for children such as build workers). Processes of ``mono_aot/bench/child.py`` also report
their own wall and CPU figures from inside, after torch is imported. Ratios are quotients of
medians of figures of this same run. Nothing here asserts a speed; targets are reported as met
or missed.

Every child runs with ``MONO_AOT_CACHE_DIR`` in the bench's temporary directory, so the user's
cache is never read or written, and with FlyDSL's variables scrubbed and set per process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mono_aot.spec.errors import MonoError
from mono_aot.spec.layouts import VARIANTS

SCHEMA = "mono-aot.bench/1"
ARCHS = ("gfx942", "gfx950")
QUICK_ARCH = "gfx942"
STAND_IN = "stand-in HIP (not a GPU)"
CHILD = Path(__file__).with_name("child.py")
STAND_IN_SOURCE = Path(__file__).with_name("stand_in_hip.c")
MARK = "MONO_AOT_BENCH "
# Stand-in device facts per arch: the shipped layout's CTA count is the CU count it needs.
STAND_IN_ARCH_NAME = {"gfx942": "gfx942:sramecc+:xnack-", "gfx950": "gfx950:sramecc+:xnack-"}
_SCRUB = ("FLYDSL_", "HIP_", "ROC", "HSA_", "AMD_", "MONO_AOT_")
_SCRUB_EXACT = ("ARCH", "COMPILE_ONLY", "ROCM_PATH", "PYTHONPATH")

# The serving start-up targets the bench reports against (per rank; measured per arch).
TARGET_BIND_CPU_S = 0.002
# in-process bind repeats: each loads 2 modules, and the stand-in HIP library holds 64
BIND_REPEATS = 30
TARGET_BIND_SPEEDUP = 10.0
TARGET_NOOP_OVER_START_S = 0.5
TARGET_IMPORT_RUNTIME_S = 0.050

NOT_MEASURED = [
    {
        "what": "module load on a GPU (hipModuleLoadData of both code objects on a device)",
        "why": "no AMD GPU here: mono-aot's bind stops at the stand-in HIP library's "
        "hipModuleLoadData, which checks the ELF header and copies the bytes",
    },
    {
        "what": "kernel time (narrow and wide launches, a draft step)",
        "why": "no AMD GPU here",
    },
    {
        "what": "FlyDSL's warm cache past the artifact read (MLIR parse, host ExecutionEngine, "
        "module load, first launch)",
        "why": "with COMPILE_ONLY=1 and FLYDSL_RUNTIME_RUN_ONLY=1 FlyDSL returns right after "
        "unpickling the cached artifact and decompressing its lowered MLIR (the code object is "
        "still an escaped string in that text); building the execution engine needs the HIP "
        "runtime. Its warm figure is therefore a lower bound of what a rank pays",
    },
]


class BenchError(MonoError):
    """A measured process failed: the bench reports it rather than a number."""


# --- figures ----------------------------------------------------------------------------------


def stats(xs: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


@dataclass
class Figure:
    label: str
    item: str  # the table's section: jit, flydsl-warm, bind, build, imports, calls, baseline
    wall: list[float] = field(default_factory=list)
    cpu: list[float] | None = field(default_factory=list)
    skipped: str | None = None
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        if self.skipped is not None or not self.wall:
            return {
                "label": self.label,
                "item": self.item,
                "unit": "s",
                "runs": 0,
                "wall": None,
                "cpu": None,
                "skipped": self.skipped or "no runs",
                "note": self.note,
            }
        return {
            "label": self.label,
            "item": self.item,
            "unit": "s",
            "runs": len(self.wall),
            "wall": stats(self.wall),
            "cpu": stats(self.cpu) if self.cpu else None,
            "skipped": None,
            "note": self.note,
        }


@dataclass
class Proc:
    wall: float
    cpu: float  # user + system of the process and its waited-for children
    rc: int
    stdout: str
    stderr: str

    def doc(self) -> dict[str, Any]:
        for line in self.stdout.splitlines():
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        raise BenchError(f"a measured process printed no result: {self.tail()}")

    def tail(self) -> str:
        lines = (self.stderr or self.stdout).strip().splitlines()[-3:]
        return " | ".join(line.strip() for line in lines) or f"exit code {self.rc}"


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_proc(
    argv: Sequence[str], env: dict[str, str], *, cwd: Path | None = None, timeout: float = 3600
) -> Proc:
    """One process, timed from outside; measured processes run one at a time."""
    c0 = _children_cpu()
    t0 = time.perf_counter()
    p = subprocess.run(
        list(argv),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t0
    return Proc(wall, _children_cpu() - c0, p.returncode, p.stdout, p.stderr)


def _checked(p: Proc, what: str) -> Proc:
    if p.rc != 0:
        raise BenchError(f"{what} failed: {p.tail()}")
    return p


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Plan:
    quick: bool
    archs: tuple[str, ...]
    layout: str
    jobs: int
    cheap: int  # runs of processes that take well under a second or two
    mid: int  # runs of warm-cache and bind processes
    heavy: int  # runs of the cold just-in-time compile
    bind_repeats: int  # in-process repeats of the bind
    store: Path | None  # a store to bind from (filled first when anything is missing)
    call_repeats: int = 2  # repeated calls of each FlyDSL JIT launcher per warm process
    launches: int = 200  # launches of each kernel through mono-aot's launcher per bind process
    flydsl_pythons: tuple[str, ...] = ()  # interpreters with other FlyDSL versions

    @classmethod
    def make(
        cls,
        quick: bool,
        layout: str,
        jobs: int | None,
        store: Path | None,
        flydsl_pythons: Sequence[str] = (),
    ) -> Plan:
        n = jobs or os.cpu_count() or 1
        others = tuple(flydsl_pythons)
        if quick:
            return cls(True, (QUICK_ARCH,), layout, n, 3, 2, 1, 15, store, 1, 50, others)
        return cls(False, ARCHS, layout, n, 5, 3, 2, BIND_REPEATS, store, 2, 200, others)


class Bench:
    def __init__(self, plan: Plan, tmp: Path, log: Callable[[str], None]) -> None:
        self.plan = plan
        self.tmp = tmp
        self.log = log
        self.figures: dict[str, Figure] = {}
        self.notes: list[str] = []
        self.sizes: dict[str, Any] = {
            "mono_aot_wheel": None,
            "serving_install": None,
            "runtime_deps": None,
            "pack_wheels": {a: None for a in ARCHS},
            "skipped": {},
        }
        self._venv: Path | None | bool = False
        self.hip = "none"
        self.bind_from = "-"
        self._n = 0
        self.user_cache = tmp / "user-cache"  # the digest cache and nothing else
        self.base_env = self._base_env()

    # environment ------------------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(_SCRUB) and k not in _SCRUB_EXACT
        }
        # children import this same mono_aot, wherever it is installed or checked out
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
        env["MONO_AOT_CACHE_DIR"] = str(self.user_cache)
        return env

    def _dir(self, name: str) -> Path:
        self._n += 1
        d = self.tmp / f"{self._n:03d}-{name}"
        d.mkdir(parents=True)
        return d

    def fig(self, name: str, label: str, item: str, *, cpu: bool = True, note: str = "") -> Figure:
        f = Figure(label, item, cpu=[] if cpu else None, note=note)
        self.figures[name] = f
        return f

    def skip(self, name: str, label: str, item: str, why: str) -> None:
        self.figures[name] = Figure(label, item, skipped=why, cpu=None)

    # baseline ---------------------------------------------------------------------------------

    def baseline(self) -> None:
        f = self.fig("interpreter_start", "python -c pass", "baseline")
        for _ in range(self.plan.cheap):
            p = _checked(run_proc([sys.executable, "-c", "pass"], self.base_env), "python")
            f.wall.append(p.wall)
            f.cpu.append(p.cpu)

    # builds (item 4) ------------------------------------------------------------------------

    def _build_argv(self, store: Path, archs: Sequence[str], jobs: int) -> list[str]:
        argv = [sys.executable, "-m", "mono_aot", "build", "--layout", self.plan.layout]
        for a in archs:
            argv += ["--arch", a]
        return argv + ["--store", str(store), "-j", str(jobs), "--json"]

    def _build(self, store: Path, archs: Sequence[str], jobs: int, env=None) -> tuple[Proc, dict]:
        p = run_proc(self._build_argv(store, archs, jobs), env or self.base_env)
        _checked(p, f"mono-aot build -j {jobs}")
        try:
            summary = json.loads(p.stdout)["summary"]
        except (ValueError, KeyError) as e:
            raise BenchError(f"mono-aot build --json printed no summary ({e})") from None
        if summary.get("failed"):
            raise BenchError(f"mono-aot build -j {jobs}: {summary['failed']} jobs failed")
        return p, summary

    def builds(self) -> Path:
        """Cold full-matrix builds (full mode), then the no-op rebuilds; returns the store the
        warm bind reads."""
        n = self.plan.jobs
        names = (("build_cold_j1", 1), ("build_cold_jN", n))
        store: Path | None = None
        if self.plan.quick:
            for name, j in names:
                self.skip(
                    name,
                    f"cold build, full matrix, -j {j}",
                    "build",
                    "skipped in --quick",
                )
        else:
            for name, j in names:
                f = self.fig(name, f"cold build, full matrix ({len(ARCHS)} archs), -j {j}", "build")
                self.log(f"bench: cold build of the full matrix with -j {j}")
                s = self._dir(f"store-j{j}")
                shutil.rmtree(self.user_cache, ignore_errors=True)  # cold: no digest cache
                p, summary = self._build(s, ARCHS, j)
                if summary.get("compiles") != summary.get("jobs"):
                    raise BenchError(f"a cold build compiled {summary.get('compiles')} of "
                                     f"{summary.get('jobs')} jobs")  # fmt: skip
                f.wall.append(p.wall)
                f.cpu.append(p.cpu)
                store = s
        if self.plan.store is not None or store is None:
            store = self.plan.store or self._dir("store")
            self.log(f"bench: preparing the store for {', '.join(self.plan.archs)} (not timed)")
            t0 = time.perf_counter()
            _, summary = self._build(store, self.plan.archs, n)
            self.notes.append(
                f"store prepared before the warm figures with mono-aot build -j {n} "
                f"({summary.get('compiles', 0)} compiles, {time.perf_counter() - t0:.1f} s; "
                "not a figure)"
            )
        # no-op rebuilds of the store just built: all hits
        archs = self.plan.archs
        warm = self.fig("build_noop", "no-op rebuild (all hits)", "build")
        cold = self.fig(
            "build_noop_digest_cold",
            "no-op rebuild, FlyDSL digest not cached (every run before this change)",
            "build",
        )
        self.log("bench: no-op rebuilds")
        self._build(store, archs, n)  # fills the digest cache
        for _ in range(self.plan.cheap):
            p, summary = self._build(store, archs, n)
            if summary.get("compiles") or summary.get("hit") != summary.get("jobs"):
                raise BenchError(f"a no-op rebuild was not all hits: {summary}")
            warm.wall.append(p.wall)
            warm.cpu.append(p.cpu)
            shutil.rmtree(self.user_cache / "toolchain", ignore_errors=True)
            p, summary = self._build(store, archs, n)
            if summary.get("compiles"):
                raise BenchError(f"a no-op rebuild compiled: {summary}")
            cold.wall.append(p.wall)
            cold.cpu.append(p.cpu)
        return store

    # FlyDSL just in time (item 1) and warm cache (item 2) ----------------------------------------

    def _flydsl_env(self, arch: str, cache: Path, rocm: Path, run_only: bool) -> dict[str, str]:
        env = dict(self.base_env)
        env.update(
            COMPILE_ONLY="1",
            ARCH=arch,
            FLYDSL_GPU_ARCH=arch,
            FLYDSL_COMPILE_OPT_LEVEL="2",
            FLYDSL_RUNTIME_CACHE_DIR=str(cache),
            ROCM_PATH=str(rocm),
        )
        if run_only:
            env["FLYDSL_RUNTIME_RUN_ONLY"] = "1"
        return env

    def _variants(self) -> list[str]:
        from mono_aot.spec.layouts import resolve_layout

        return list(resolve_layout(self.plan.layout).variants())

    def _flydsl_version(self, python: str) -> str:
        argv = [python, "-c", "import importlib.metadata as m; print(m.version('flydsl'))"]
        p = _checked(run_proc(argv, self.base_env), f"{python}: FlyDSL's version")
        return p.stdout.strip()

    def flydsl(self) -> None:
        """FlyDSL's just-in-time compile and warm cache in fresh processes, and its launcher's
        first and repeated calls in one process, for this interpreter's FlyDSL and for each
        ``--flydsl-python`` (another FlyDSL version): FlyDSL 0.5 traces the kernel on every
        call of a ``@flyc.jit`` launcher, 0.4 only on the first."""
        from mono_aot.compiler.toolchain import find_linker, prepare_rocm_dir

        rocm = prepare_rocm_dir(find_linker(), self._dir("rocm"))
        variants = self._variants()
        pythons = [sys.executable, *self.plan.flydsl_pythons]
        versions = [self._flydsl_version(py) for py in pythons]
        for i, (python, version) in enumerate(zip(pythons, versions, strict=True)):
            suffix = "" if i == 0 else f"@{version}"  # this interpreter's names stay as before
            for arch in ARCHS:
                self._flydsl_arch(python, f"FlyDSL {version}", suffix, arch, variants, rocm)

    def _flydsl_arch(
        self, python: str, fly: str, suffix: str, arch: str, variants: list[str], rocm: Path
    ) -> None:
        both = "+".join(variants)
        names = {
            "jit_cold": f"{fly} just in time, empty cache, {both} ({arch})",
            "jit_cold_process": f"  the whole process, torch import included ({arch})",
            "flydsl_warm": f"{fly} warm disk cache, {both} ({arch})",
            "flydsl_warm_process": f"  the whole process, torch import included ({arch})",
        }
        calls = {}
        for v in variants:
            calls[f"flydsl_call_first{suffix}/{arch}/{v}"] = (
                f"{fly} JIT launcher, first call, warm cache, {v} ({arch})"
            )
            calls[f"flydsl_call_repeat{suffix}/{arch}/{v}"] = (
                f"{fly} JIT launcher, repeated call in the process, {v} ({arch})"
            )
        if arch not in self.plan.archs:
            for k, label in names.items():
                item = "jit" if k.startswith("jit") else "flydsl-warm"
                self.skip(f"{k}{suffix}/{arch}", label, item, "skipped in --quick (one arch)")
            for k, label in calls.items():
                self.skip(k, label, "calls", "skipped in --quick (one arch)")
            return
        jit = self.fig(f"jit_cold{suffix}/{arch}", names["jit_cold"], "jit")
        jitp = self.fig(f"jit_cold_process{suffix}/{arch}", names["jit_cold_process"], "jit")
        cache = None
        argv = [python, "-P", str(CHILD), "flydsl", arch, self.plan.layout]
        for i in range(self.plan.heavy if not suffix else 1):
            self.log(f"bench: {fly} just-in-time compile, {arch}, run {i + 1}")
            cache = self._dir(f"flydsl-cache-{arch}")
            env = self._flydsl_env(arch, cache, rocm, run_only=False)
            p = _checked(run_proc([*argv, "0", *variants], env, cwd=cache.parent), "FlyDSL JIT")
            d = p.doc()
            if not d["cache_files"]:
                raise BenchError(f"{fly}'s just-in-time compile wrote nothing to its cache")
            jit.wall.append(d["imports"]["wall"] + d["kernels"]["wall"])
            jit.cpu.append(d["imports"]["cpu"] + d["kernels"]["cpu"])
            jitp.wall.append(p.wall)
            jitp.cpu.append(p.cpu)
        warm = self.fig(f"flydsl_warm{suffix}/{arch}", names["flydsl_warm"], "flydsl-warm")
        warmp = self.fig(
            f"flydsl_warm_process{suffix}/{arch}", names["flydsl_warm_process"], "flydsl-warm"
        )
        figs = {k: self.fig(k, label, "calls") for k, label in calls.items()}
        self.log(f"bench: {fly} warm cache and repeated calls, {arch}")
        repeats = str(self.plan.call_repeats)
        for _ in range(self.plan.mid):
            env = self._flydsl_env(arch, cache, rocm, run_only=True)
            p = run_proc([*argv, repeats, *variants], env, cwd=cache.parent)
            d = _checked(p, "FlyDSL warm cache").doc()
            warm.wall.append(d["imports"]["wall"] + d["kernels"]["wall"])
            warm.cpu.append(d["imports"]["cpu"] + d["kernels"]["cpu"])
            warmp.wall.append(p.wall)
            warmp.cpu.append(p.cpu)
            for v in variants:
                first = figs[f"flydsl_call_first{suffix}/{arch}/{v}"]
                first.wall.append(d["per_variant"][v]["wall"])
                first.cpu.append(d["per_variant"][v]["cpu"])
                again = figs[f"flydsl_call_repeat{suffix}/{arch}/{v}"]
                for r in d["repeated"][v]:
                    again.wall.append(r["wall"])
                    again.cpu.append(r["cpu"])

    # mono-aot's warm bind (item 3) ----------------------------------------------------------

    def stand_in(self) -> Path | None:
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            self.notes.append(
                "no C compiler: the warm bind is measured up to the driver call (lookup, verify, "
                "target, CU and kernarg checks), without module load"
            )
            return None
        out = self._dir("stand-in-hip") / "libamdhip64.so"
        p = run_proc(
            [cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(STAND_IN_SOURCE), "-lrt"],
            self.base_env,
        )
        if p.rc != 0:
            self.notes.append(
                f"the stand-in HIP library did not compile ({p.tail()}): the warm bind is "
                "measured up to the driver call"
            )
            return None
        return out

    def bind(self, store: Path) -> None:
        from mono_aot.spec.layouts import resolve_layout

        lib = self.stand_in()
        self.hip = STAND_IN if lib else "none (up to the driver call)"
        venv = self.serving_venv()
        python = str(venv / "bin" / "python") if venv else sys.executable
        if venv:
            self.notes.append(
                "the warm bind runs mono-aot as installed from its wheel (a fresh venv, "
                "--no-deps, lent this environment's torch and other packages by a .pth line)"
            )
        else:
            self.notes.append("the warm bind runs mono-aot from this source tree (no wheel)")
        layout = resolve_layout(self.plan.layout)
        upto = "module load through the stand-in HIP" if lib else "the driver call"
        for arch in ARCHS:
            names = {
                "mono_serve": f"mono-aot: runtime imports + bind of both, up to {upto} ({arch})",
                "mono_imports": f"  runtime imports (after torch) ({arch})",
                "mono_bind": f"  bind of both after imports, first in the process ({arch})",
                "mono_bind_repeat": f"  bind of both, in-process repeat ({arch})",
                "mono_bind_process": f"  the whole process, torch import included ({arch})",
            }
            if arch not in self.plan.archs:
                for k, label in names.items():
                    self.skip(f"{k}/{arch}", label, "bind", "skipped in --quick (one arch)")
                for v in layout.variants():
                    why = "skipped in --quick (one arch)"
                    self.skip(f"mono_launch/{arch}/{v}", _launch_label(v, arch), "calls", why)
                continue
            figs = {k: self.fig(f"{k}/{arch}", label, "bind") for k, label in names.items()}
            env = dict(self.base_env)
            if venv:
                env.pop("PYTHONPATH", None)  # the wheel's mono_aot, not this tree's
            env.update(
                MONO_AOT_PATH=str(store),
                MONO_AOT_STRICT="1",  # a miss is an error here, never a compile
                MONO_AOT_CACHE_DIR=str(self._dir(f"empty-user-cache-{arch}")),
            )
            if lib:
                env.update(
                    MONO_AOT_HIP_LIBRARY=str(lib),
                    MONO_AOT_STANDIN_ARCH=STAND_IN_ARCH_NAME[arch],
                    MONO_AOT_STANDIN_CUS=str(layout.ctas(arch)),
                )
            self.log(f"bench: mono-aot warm bind, {arch}")
            argv = [python, "-P", str(CHILD), "bind", arch, self.plan.layout]
            argv += [str(self.plan.bind_repeats), "stand-in" if lib else "none"]
            argv += [str(self.plan.launches)]
            launch = {
                v: self.fig(f"mono_launch/{arch}/{v}", _launch_label(v, arch), "calls")
                for v in layout.variants()
            }
            if not lib:
                for f in launch.values():
                    f.skipped = "no stand-in HIP library (no C compiler) to launch through"
            for _ in range(self.plan.mid):
                p = _checked(run_proc(argv, env, cwd=self.tmp), "the mono-aot warm bind")
                d = p.doc()
                self.bind_from = d.get("mono_aot_from", "?")
                parts = (d["import_runtime"], d["imports"], d["first"])
                figs["mono_serve"].wall.append(sum(x["wall"] for x in parts))
                figs["mono_serve"].cpu.append(sum(x["cpu"] for x in parts))
                imp = (d["import_runtime"], d["imports"])
                figs["mono_imports"].wall.append(sum(x["wall"] for x in imp))
                figs["mono_imports"].cpu.append(sum(x["cpu"] for x in imp))
                figs["mono_bind"].wall.append(d["first"]["wall"])
                figs["mono_bind"].cpu.append(d["first"]["cpu"])
                for r in d["repeats"]:
                    figs["mono_bind_repeat"].wall.append(r["wall"])
                    figs["mono_bind_repeat"].cpu.append(r["cpu"])
                figs["mono_bind_process"].wall.append(p.wall)
                figs["mono_bind_process"].cpu.append(p.cpu)
                for v, runs in d["launches"].items():
                    launch[v].wall.extend(r["wall"] for r in runs)
                    launch[v].cpu.extend(r["cpu"] for r in runs)

    # imports (item 5) -----------------------------------------------------------------------

    def imports(self) -> None:
        torch = self.fig("torch_import", "import torch (fresh process)", "imports")
        for name, module in (
            ("import_mono_aot_runtime", "mono_aot.runtime"),
            ("import_flydsl", "flydsl"),
            ("import_flydsl_compiler", "flydsl.compiler"),
        ):
            f = self.fig(name, f"import {module} (torch already imported)", "imports")
            if importlib.util.find_spec(module.partition(".")[0]) is None:
                f.skipped = f"{module} is not installed"
                continue
            for _ in range(self.plan.cheap):
                p = run_proc([sys.executable, "-P", str(CHILD), "import", module], self.base_env)
                d = _checked(p, f"import {module}").doc()
                f.wall.append(d["import"]["wall"])
                f.cpu.append(d["import"]["cpu"])
                torch.wall.append(d["torch"]["wall"])
                torch.cpu.append(d["torch"]["cpu"])

    # sizes (item 6) -------------------------------------------------------------------------

    def serving_venv(self) -> Path | None:
        """The mono-aot wheel built from this tree and installed with ``--no-deps`` into a fresh
        venv (its size is the serving install); for the warm bind, a ``.pth`` line then lends
        it this environment's packages (torch, pydantic, ...), so mono-aot runs as a wheel
        install does. None, with the reason in ``sizes.skipped``, when that cannot be done."""
        if self._venv is not False:
            return self._venv
        self._venv = None
        skipped = self.sizes["skipped"]
        root = Path(__file__).resolve().parents[2]
        wheel = None
        if not (root / "pyproject.toml").is_file():
            skipped["mono_aot_wheel"] = "no source tree here (an installed package)"
        elif importlib.util.find_spec("build") is None:
            skipped["mono_aot_wheel"] = "the 'build' package is not installed (build extra)"
        else:
            self.log("bench: building the mono-aot wheel and a serving venv")
            out = self._dir("dist")
            argv = [sys.executable, "-m", "build", "--wheel", "--no-isolation"]
            p = run_proc(argv + ["--outdir", str(out), str(root)], self.base_env, cwd=out)
            found = sorted(out.glob("mono_aot-*.whl"))
            if p.rc != 0 or not found:
                skipped["mono_aot_wheel"] = f"the wheel build failed: {p.tail()}"
            else:
                wheel = found[0]
                self.sizes["mono_aot_wheel"] = wheel.stat().st_size
        if wheel is None:
            skipped["serving_install"] = "no mono-aot wheel to install"
            return None
        venv = self._dir("serving-venv") / "venv"
        p = run_proc([sys.executable, "-m", "venv", "--without-pip", str(venv)], self.base_env)
        py = venv / "bin" / "python"
        argv = [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet"]
        argv += ["--no-deps", "--no-index", "--disable-pip-version-check", str(wheel)]
        q = run_proc(argv, self.base_env) if p.rc == 0 else p
        if q.rc != 0:
            skipped["serving_install"] = f"pip install of the wheel failed: {q.tail()}"
            return None
        site = next(venv.glob("lib/python*/site-packages"))
        self.sizes["serving_install"] = _tree_bytes(site)
        paths = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
        (site / "zz_mono_aot_bench_deps.pth").write_text("".join(f"{d}\n" for d in paths))
        self._venv = venv
        return venv

    def size_figures(self, store: Path) -> None:
        self.serving_venv()
        self.sizes["runtime_deps"] = runtime_dep_sizes()
        skipped = self.sizes["skipped"]
        if importlib.util.find_spec("mono_aot.compiler.pack") is None:
            for a in ARCHS:
                skipped[f"pack_wheel/{a}"] = "not available in this install"
            return
        for a in ARCHS:
            if a not in self.plan.archs:
                skipped[f"pack_wheel/{a}"] = "skipped in --quick (one arch)"
                continue
            self.log(f"bench: pack wheel {a}")
            out = self._dir(f"pack-{a}")
            argv = [sys.executable, "-m", "mono_aot", "pack", "--arch", a, "--layout"]
            argv += [self.plan.layout, "--store", str(store), "--out", str(out), "--json"]
            p = run_proc(argv, self.base_env)
            wheels = sorted(out.glob("*.whl"))
            if p.rc != 0 or not wheels:
                skipped[f"pack_wheel/{a}"] = f"mono-aot pack failed: {p.tail()}"
            else:
                self.sizes["pack_wheels"][a] = wheels[0].stat().st_size


def _launch_label(variant: str, arch: str) -> str:
    return f"mono-aot launcher, one launch through the stand-in HIP, {variant} ({arch})"


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                total += p.stat().st_size
    return total


_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_dep_sizes(dist: str = "mono-aot") -> dict[str, Any]:
    """Bytes on disk of mono-aot's runtime dependencies (no extras), transitively, as installed
    in the current environment (RECORD-listed files)."""
    from importlib import metadata

    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - pip and build bring packaging
        Requirement = None  # noqa: N806

    def deps(name: str) -> list[str]:
        out = []
        for req in metadata.requires(name) or []:
            if Requirement is not None:
                r = Requirement(req)
                if r.marker is not None and not r.marker.evaluate({"extra": ""}):
                    continue
                out.append(r.name)
            elif "extra ==" not in req:
                m = _NAME.match(req)
                if m:
                    out.append(m.group(1))
        return out

    seen: dict[str, int] = {}
    missing: list[str] = []
    todo = deps(dist)
    while todo:
        name = todo.pop()
        key = _canon(name)
        if key in seen or key in missing:
            continue
        try:
            d = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(key)
            continue
        size = 0
        for f in d.files or []:
            p = Path(f.locate())
            if p.is_file() and not p.is_symlink():
                size += p.stat().st_size
        seen[key] = size
        todo.extend(deps(name))
    return {
        "total": sum(seen.values()),
        "by_dist": dict(sorted(seen.items(), key=lambda kv: -kv[1])),
        "not_installed": sorted(missing),
        "basis": "installed in the environment running the bench (transitive, no extras)",
    }


# --- ratios and targets ---------------------------------------------------------------------


def _median(figs: dict[str, dict], name: str, basis: str) -> float | None:
    f = figs.get(name)
    if not f or f["skipped"] is not None or not f.get(basis):
        return None
    return f[basis]["median"]


def ratios(figs: dict[str, dict]) -> dict[str, dict]:
    defs: list[tuple[str, str, str, str, str]] = []
    for a in ARCHS:
        defs += [
            (f"jit_cold_over_mono_serve/{a}", f"jit_cold/{a}", f"mono_serve/{a}", "wall",
             f"FlyDSL JIT / mono-aot imports+bind, after torch ({a})"),
            (f"flydsl_warm_over_mono_serve/{a}", f"flydsl_warm/{a}", f"mono_serve/{a}", "cpu",
             f"FlyDSL warm cache / mono-aot imports+bind, CPU, after torch ({a})"),
            (f"flydsl_warm_over_mono_bind/{a}", f"flydsl_warm/{a}", f"mono_bind/{a}", "cpu",
             f"FlyDSL warm cache (after torch) / mono-aot bind after imports, CPU ({a})"),
            (f"mono_bind_over_repeat/{a}", f"mono_bind/{a}", f"mono_bind_repeat/{a}", "wall",
             f"mono-aot first bind / in-process repeat ({a})"),
        ]  # fmt: skip
        for v in VARIANTS:
            defs.append((f"flydsl_call_repeat_over_mono_launch/{a}/{v}",
                         f"flydsl_call_repeat/{a}/{v}", f"mono_launch/{a}/{v}", "wall",
                         f"FlyDSL JIT launcher's repeated call / mono-aot's launch, {v} ({a})"))  # fmt: skip
    defs += [
        ("build_j1_over_jN", "build_cold_j1", "build_cold_jN", "wall",
         "cold full-matrix build -j 1 / -j N"),
        ("noop_digest_cold_over_noop", "build_noop_digest_cold", "build_noop", "wall",
         "no-op rebuild without / with the digest cache"),
        ("noop_over_interpreter_start", "build_noop", "interpreter_start", "wall",
         "no-op rebuild / interpreter start"),
        ("import_flydsl_over_runtime", "import_flydsl", "import_mono_aot_runtime", "wall",
         "import flydsl / import mono_aot.runtime"),
        ("import_flydsl_compiler_over_runtime", "import_flydsl_compiler",
         "import_mono_aot_runtime", "wall", "import flydsl.compiler / import mono_aot.runtime"),
    ]  # fmt: skip
    out = {}
    for name, num, den, basis, label in defs:
        n, d = _median(figs, num, basis), _median(figs, den, basis)
        ok = n is not None and d is not None and d > 0
        out[name] = {
            "label": label,
            "numerator": num,
            "denominator": den,
            "basis": basis,
            "value": n / d if ok else None,
            "skipped": None if ok else "a figure it divides was not measured in this run",
        }
    return out


def targets(figs: dict[str, dict], rats: dict[str, dict]) -> list[dict]:
    out = []

    def add(name: str, text: str, value: float | None, limit: float, ok_if_le: bool) -> None:
        met = None if value is None else (value <= limit if ok_if_le else value >= limit)
        out.append(
            {
                "name": name,
                "target": text,
                "value": value,
                "limit": limit,
                "met": met,
                "skipped": None if value is not None else "not measured in this run",
            }
        )

    for a in ARCHS:
        add(f"bind_cpu/{a}", f"warm bind of both kernels after imports <= 2 ms CPU ({a})",
            _median(figs, f"mono_bind/{a}", "cpu"), TARGET_BIND_CPU_S, True)  # fmt: skip
        # the target: the bind after imports against FlyDSL's warm cache after torch
        # (its imports included); the ratio with mono-aot's imports included is printed too
        add(f"bind_vs_flydsl_warm/{a}",
            f"warm bind after imports >= 10x faster (CPU) than FlyDSL's warm cache ({a})",
            rats[f"flydsl_warm_over_mono_bind/{a}"]["value"], TARGET_BIND_SPEEDUP, False)  # fmt: skip
    noop, start = _median(figs, "build_noop", "wall"), _median(figs, "interpreter_start", "wall")
    add("noop_rebuild", "no-op rebuild <= 0.5 s over interpreter start",
        None if noop is None or start is None else noop - start, TARGET_NOOP_OVER_START_S, True)  # fmt: skip
    add("import_runtime", "import mono_aot.runtime <= 50 ms with torch imported",
        _median(figs, "import_mono_aot_runtime", "wall"), TARGET_IMPORT_RUNTIME_S, True)  # fmt: skip
    return out


def machine() -> dict[str, Any]:
    gpu = "none found"
    if Path("/dev/kfd").exists():
        gpu = "/dev/kfd present (not used: the bench measures host-side costs only)"
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "gpu": gpu,
        "load_average_1min_at_start": load,
    }


def run_bench(
    *,
    quick: bool,
    layout: str,
    jobs: int | None = None,
    store: Path | None = None,
    flydsl_pythons: Sequence[str] = (),
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    plan = Plan.make(quick, layout, jobs, store, flydsl_pythons)
    started = time.perf_counter()
    mach = machine()
    with tempfile.TemporaryDirectory(prefix="mono-aot-bench-") as tmp:
        b = Bench(plan, Path(tmp), log)
        b.baseline()
        bind_store = b.builds()
        b.flydsl()
        b.bind(bind_store)
        b.imports()
        b.size_figures(bind_store)
    figs = {k: f.as_json() for k, f in b.figures.items()}
    rats = ratios(figs)
    return {
        "schema": SCHEMA,
        "mode": "quick" if quick else "full",
        "machine": mach,
        "layout": layout,
        "archs": list(plan.archs),
        "jobs": plan.jobs,
        "hip": b.hip,
        "bind_mono_aot_from": b.bind_from,
        "runs": {
            "cheap": plan.cheap,
            "mid": plan.mid,
            "heavy": plan.heavy,
            "bind_repeats": plan.bind_repeats,
            "call_repeats": plan.call_repeats,
            "launches": plan.launches,
        },  # fmt: skip
        "figures": figs,
        "figure_order": list(b.figures),
        "ratios": rats,
        "targets": targets(figs, rats),
        "sizes": b.sizes,
        "not_measured": NOT_MEASURED,
        "notes": b.notes,
        "seconds": time.perf_counter() - started,
    }
