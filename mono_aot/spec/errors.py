"""One exception family, so the CLI maps every failure to a documented exit code."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # an operation failed (compile, check, verify, I/O)
EXIT_BAD_INPUT = 2  # bad input or usage (spec, option, unknown name)
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it


class MonoError(Exception):
    """A failure the user can act on; ``str()`` is the whole message."""

    exit_code = EXIT_FAILED


class BadInput(MonoError):
    """The user's input (a spec, an option, a name) is wrong."""

    exit_code = EXIT_BAD_INPUT


class LayoutError(BadInput):
    """A layout spec is invalid: one line per problem, each naming file, field and rule."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ToolchainError(MonoError):
    """A build tool (linker, FlyDSL) is missing or unusable."""


class MonoUnsupported(MonoError):
    """The model, device or configuration is outside what the kernels serve."""
