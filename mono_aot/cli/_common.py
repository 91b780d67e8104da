"""What every subcommand shares: JSON output and the error-to-exit-code mapping."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from mono_aot.spec.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, MonoError

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))


def fail(message: str, code: int = EXIT_FAILED) -> None:
    """Print ``mono-aot: message`` on stderr and exit with ``code``."""
    click.echo(f"mono-aot: {message}", err=True)
    sys.exit(code)


def _one_line(e: click.ClickException) -> str:
    """A usage error as one line naming the command (click prints usage, a hint and "Error:")."""
    msg = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    if ctx is None:
        return msg
    sub = ctx.command_path.partition(" ")[2]
    return f"{sub + ': ' if sub else ''}{msg} (see '{ctx.command_path} --help')"


def run_main(group: click.Group, argv: list[str] | None) -> int:
    """Run ``group``; MonoError becomes its exit code and a message, never a traceback."""
    try:
        group.main(args=argv, prog_name="mono-aot", standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort as e:
        # click turns Ctrl-C into Abort; keep the shell's convention for an interrupt
        if isinstance(e.__context__, KeyboardInterrupt):
            click.echo("mono-aot: interrupted", err=True)
            return EXIT_INTERRUPTED
        click.echo("mono-aot: aborted", err=True)
        return EXIT_FAILED
    except click.exceptions.NoArgsIsHelpError as e:
        e.show()  # a group called without a command: its help, as click prints it
        return EXIT_BAD_INPUT
    except click.ClickException as e:
        click.echo(f"mono-aot: {_one_line(e)}", err=True)
        return EXIT_BAD_INPUT if isinstance(e, click.UsageError) else e.exit_code
    except MonoError as e:
        for line in str(e).splitlines() or [type(e).__name__]:
            click.echo(f"mono-aot: {line}", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        click.echo("mono-aot: interrupted", err=True)
        return EXIT_INTERRUPTED
    except OSError as e:
        # an I/O failure nobody turned into a MonoError (e.g. a store directory the user
        # cannot list): still one line naming the path, not a traceback
        where = f"{e.filename}: " if e.filename else ""
        click.echo(f"mono-aot: {where}{e.strerror or e}", err=True)
        return EXIT_FAILED
    return 0
