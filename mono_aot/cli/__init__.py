"""The ``mono-aot`` command line. Exit codes: 0 ok, 1 an operation failed, 2 bad input or usage."""

from __future__ import annotations

import sys

import click

from mono_aot import __version__
from mono_aot.cli._common import run_main
from mono_aot.cli.build import build
from mono_aot.cli.cache import cache
from mono_aot.cli.doctor import doctor
from mono_aot.cli.layouts import layouts
from mono_aot.cli.selftest import selftest


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mono-aot")
def cli() -> None:
    """Ahead-of-time builds and a verified artifact store for the drafter megakernels."""


cli.add_command(layouts)
cli.add_command(build)
cli.add_command(doctor)
cli.add_command(cache)
cli.add_command(selftest)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the group and maps failures to exit codes."""
    sys.exit(run_main(cli, argv))
