"""A serving install has no FlyDSL (nor the build extra's other packages): the store and layout
commands still work, and ``build`` says which extra to install, in one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

BUILD_EXTRA = ("flydsl", "msgpack", "elftools", "ziglang")


def run_hidden(tmp_path, *argv: str, hide=BUILD_EXTRA) -> subprocess.CompletedProcess:
    """``mono-aot ARGV`` in a fresh interpreter where the build extra cannot be imported
    (``sys.modules[name] = None`` makes every import of it fail and ``find_spec`` say None)."""
    code = (
        "import sys\n"
        f"for m in {hide!r}: sys.modules[m] = None\n"
        "from mono_aot.cli import main\n"
        f"try:\n    main({list(argv)!r})\n"
        "finally:\n"
        f"    leaked = [m for m in sys.modules if m.split('.')[0] in {hide!r} and sys.modules[m]]\n"
        "    print('LEAKED', leaked, file=sys.stderr)\n"
    )
    env = {"MONO_AOT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120, env=env
    )


def test_the_hiding_really_hides():
    code = "import sys; sys.modules['flydsl'] = None\nimport flydsl"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "ModuleNotFoundError" in p.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ("layouts", "list", "--json"),
        ("cache", "ls", "--json"),
        ("cache", "--help"),
        ("layouts", "--help"),
        ("doctor", "--help"),
    ],
)
def test_store_and_layout_commands_work_without_the_build_extra(tmp_path, argv):
    p = run_hidden(tmp_path, *argv)
    assert p.returncode == 0, p.stderr
    assert "LEAKED []" in p.stderr
    if "--json" in argv:
        json.loads(p.stdout)


def test_build_names_the_extra_in_one_line_exit_2(tmp_path):
    p = run_hidden(tmp_path, "build", "--arch", "gfx942")
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if not x.startswith("LEAKED")]
    assert lines == [
        "mono-aot: mono-aot build needs the 'build' extra: pip install 'mono-aot[build]'"
    ]
