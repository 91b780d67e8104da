"""The ``mono-aot`` command line. Exit codes live in ``mono_aot/spec/errors.py``.

Commands load lazily from ``COMMANDS``: ``mono-aot layouts|cache|doctor`` start without
importing torch, FlyDSL or the kernels, and work on a serving install without the build extra;
commands that need the compiler say which extra to install.
"""

from __future__ import annotations

import importlib
import sys

import click

from mono_aot import __version__
from mono_aot.cli._common import run_main

# name -> "module:attribute" of its click command, in the order ``--help`` lists them
COMMANDS: dict[str, str] = {
    "layouts": "mono_aot.cli.layouts:layouts",
    "build": "mono_aot.cli.build:build",
    "pack": "mono_aot.cli.pack:pack",
    "cache": "mono_aot.cli.cache:cache",
    "coverage": "mono_aot.cli.coverage:coverage",
    "doctor": "mono_aot.cli.doctor:doctor",
    "selftest": "mono_aot.cli.selftest:selftest",
    "bench": "mono_aot.cli.bench:bench",
    "emulate": "mono_aot.cli.emulate:emulate",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when one is run or its help is shown."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mono-aot")
def cli() -> None:
    """Ahead-of-time builds and a verified artifact store for the drafter megakernels."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the group and maps failures to exit codes."""
    sys.exit(run_main(cli, argv))
