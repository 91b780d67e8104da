"""One exception family and the exit codes it maps to: the one home of both.

The library raises these with structured facts (the field and value that were wrong); the CLI
(``mono_aot/cli/``) words them for a terminal and turns them into exit codes.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # an operation failed (compile, check, verify, I/O)
EXIT_BAD_INPUT = 2  # bad input or usage (spec, option, unknown name, a missing extra)
EXIT_NO_DEVICE = 3  # selftest only: no usable GPUs here, nothing was tested
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it
# The kernel may deliver a process's SIGINT to any of its threads, and Python runs the handler
# only when the main thread runs: a main thread waiting for worker threads wakes this often.
SIGNAL_POLL_S = 0.2
EXIT_TERMINATED = 143  # SIGTERM, as shells report it


class MonoError(Exception):
    """A failure the user can act on; ``str()`` is the whole message."""

    exit_code = EXIT_FAILED


class BadInput(MonoError):
    """The user's input (a spec, an option, a name) is wrong.

    ``field`` and ``value`` name what was wrong in the caller's terms (``arch``, ``gfx940``),
    so a front end can point at its own spelling of it (the CLI says ``--arch gfx940``).
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problem: str, *, field: str | None = None, value: object = None) -> None:
        self.problem = problem
        self.field = field
        self.value = value
        super().__init__(f"{field} {value}: {problem}" if field else problem)


class LayoutError(BadInput):
    """A layout spec is invalid: one line per problem, each naming file, field and rule."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ToolchainError(MonoError):
    """A build tool (linker, FlyDSL) is missing or unusable."""


class MissingExtra(BadInput):
    """This install lacks an optional part (``pip install 'mono-aot[EXTRA]'``)."""

    def __init__(self, what: str, extra: str) -> None:
        self.what = what
        self.extra = extra
        super().__init__(f"{what} needs the {extra!r} extra: pip install 'mono-aot[{extra}]'")


class MonoUnsupported(MonoError):
    """The model, device or configuration is outside what the kernels serve."""
