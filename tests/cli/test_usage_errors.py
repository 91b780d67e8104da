"""Usage errors (click's) are one ``mono-aot: `` line naming the command, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mono_aot", *args],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["build", "--variant", "bogus"], "mono-aot: build: Invalid value for '--variant'"),
        (["build", "-j", "0"], "mono-aot: build: Invalid value for '-j' / '--jobs'"),
        (["cache", "gc", "--max-size", "5X"], "mono-aot: cache gc: Invalid value for '--max-size'"),
        (["layouts", "validate"], "mono-aot: layouts validate: Missing argument"),
        (["nosuch"], "mono-aot: No such command 'nosuch'"),
    ],
)
def test_a_usage_error_is_one_prefixed_line_and_exit_2(args, expect):
    r = run(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expect), r.stderr
    assert "--help')" in lines[0]


def test_a_group_without_a_command_prints_its_help():
    r = run("cache")
    assert r.returncode == 2 and "Commands:" in r.stderr + r.stdout


def test_an_unexpected_os_error_is_one_line_naming_the_path_and_exit_1(capsys):
    # e.g. a store directory the user may not list (PermissionError from os.listdir)
    import click

    from mono_aot.cli._common import run_main

    @click.group()
    def g() -> None:
        pass

    @g.command()
    def ls() -> None:
        raise PermissionError(13, "Permission denied", "/some/store/v1/entries")

    assert run_main(g, ["ls"]) == 1
    err = capsys.readouterr().err
    assert err == "mono-aot: /some/store/v1/entries: Permission denied\n"
