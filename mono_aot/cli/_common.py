"""What every subcommand shares: JSON output and the error-to-exit-code mapping."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
from collections.abc import Iterator
from typing import Any

import click

from mono_aot.spec.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    BadInput,
    MissingExtra,
    MonoError,
)

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def arch_option(verb: str) -> Any:
    """``--arch A`` (repeatable), as build, pack and coverage take it."""
    return click.option(
        "--arch",
        "archs",
        multiple=True,
        metavar="A",
        help=f"{verb} this arch (repeatable; default: every arch the layouts target).",
    )


def layout_option(default: str = "every shipped layout") -> Any:
    """``--layout NAME|PATH`` (repeatable): a shipped layout's name or a spec file."""
    return click.option(
        "--layout",
        "layouts",
        multiple=True,
        metavar="NAME|PATH",
        help=f"Layout (repeatable; default: {default}).",
    )


jobs_option = click.option(
    "-j",
    "--jobs",
    "parallel",
    type=click.IntRange(min=1),
    default=None,
    help="Compiles at once (default: the number of cores).",
)

# How the library's field names are spelled on the command line.
OPTION_OF_FIELD = {
    "arch": "--arch", "variant": "--variant", "layout": "--layout", "provider": "--provider",
}  # fmt: skip
# Library errors that a command-line option fixes, and the hint that says so.
_HINTS = {"StoreReadOnly": "(or pass --store DIR to a command that takes it)"}


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """SIGTERM ends the command like Ctrl-C, exit 143: the build's workers run in sessions of
    their own, so a SIGTERM to this process alone would leave them compiling as orphans; the
    SystemExit unwinds through the build, which stops every worker."""

    def on_sigterm(signum: int, frame: Any) -> None:
        click.echo("mono-aot: terminated", err=True)
        raise SystemExit(EXIT_TERMINATED)

    old = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def require_module(module: str, what: str, extra: str) -> None:
    """``MissingExtra`` (one line, exit 2) when ``module`` is not installed; never imports it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingExtra(what, extra)


def error_lines(e: MonoError) -> list[str]:
    """The error as the terminal shows it: options in the CLI's spelling, hints appended."""
    if isinstance(e, BadInput) and e.field in OPTION_OF_FIELD:
        text = f"{OPTION_OF_FIELD[e.field]} {e.value}: {e.problem}"
    else:
        text = str(e)
    hint = _HINTS.get(type(e).__name__)
    if hint:
        text = f"{text} {hint}"
    return text.splitlines() or [type(e).__name__]


class _Prefixed(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(f"mono-aot: {line}" for line in super().format(record).splitlines())


def configure_logging() -> None:
    """Library warnings (store damage, lock waits, skipped packs) as ``mono-aot: ...`` lines."""
    logger = logging.getLogger("mono_aot")
    if not any(getattr(h, "_mono_aot_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(_Prefixed("%(message)s"))
        handler._mono_aot_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING)


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
    configure_logging()
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
        for line in error_lines(e):
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


def result_line(res: Any) -> str:
    """One line per build job (``build`` and ``pack`` print the same)."""
    from mono_aot.compiler.run import BUILT, HIT, REBUILT

    name = res.job.name
    if res.status == HIT:
        return f"hit      {name}  {res.job.key[:12]}"
    if res.status in (BUILT, REBUILT):
        extra = f" (stale: {res.reason})" if res.status == REBUILT else ""
        return f"{res.status:<8} {name}  {res.job.key[:12]}  in {res.seconds:.1f} s{extra}"
    return f"failed   {name}: {res.reason}"
