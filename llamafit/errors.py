"""Typed errors of the core. Each carries what happened, what to try next and an exit code.

The CLI translates them once, at the edge (``llamafit.cli.app``); nothing in the core prints.
"""

from __future__ import annotations

import copy
from enum import IntEnum
from typing import Any, TypeVar


class ExitCode(IntEnum):
    """Process exit codes. Documented in docs/usage.md ("Exit codes"); tools rely on them."""

    OK = 0
    INTERNAL = 1  # a bug: unexpected exception (LLAMAFIT_DEBUG=1 shows the traceback)
    USAGE = 2  # bad option or argument (same code Typer uses for usage errors)
    DOES_NOT_FIT = 3  # no placement fits the devices and host RAM
    MODEL_NOT_FOUND = 4  # file, shard, repo or quant not found
    SERVER_LOAD_FAILED = 5  # llama-server exited before it was ready
    SERVER_NOT_FOUND = 6  # no usable llama-server binary
    BAD_MODEL_FILE = 7  # not a GGUF, truncated, hostile or inconsistent header
    NETWORK = 8  # Hub unreachable, timeout, gated repo
    INTERRUPTED = 130  # Ctrl-C before the server was running
    OUTPUT_CLOSED = 141  # stdout closed before the output was written (128 + SIGPIPE, as a piped tool)


_E = TypeVar("_E", bound="LlamafitError")


class LlamafitError(Exception):
    """Base of every error the CLI knows how to explain."""

    exit_code: ExitCode = ExitCode.INTERNAL
    # what the command prints under --json when it fails this way (the plan that does not fit), if anything
    doc: dict[str, Any] | None = None

    def __init__(self, message: str, hint: str | None = None, *, doc: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.doc = doc

    def but(self: _E, **changes: Any) -> _E:
        """A new error like this one with ``changes`` (any of its fields: message, hint, doc, ...): a caller
        that knows more raises it from this one, never changes an error already raised."""
        unknown = sorted(k for k in changes if not hasattr(self, k))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no {', '.join(unknown)}")
        new = copy.copy(self)
        new.__dict__.update(changes)
        new.args = (new.message,)
        return new


class UsageError(LlamafitError):
    exit_code = ExitCode.USAGE


class DoesNotFitError(LlamafitError):
    """``plan``: the plan that could not be made (the closest one tried), for --json; ``argv`` its
    command line once composed; ``model``: of several models planned together, the one that does not fit
    alone."""

    exit_code = ExitCode.DOES_NOT_FIT

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        plan: Any = None,
        argv: list[str] | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.plan, self.argv, self.model = plan, argv, model


class ModelNotFoundError(LlamafitError):
    exit_code = ExitCode.MODEL_NOT_FOUND


class BadModelFileError(LlamafitError):
    exit_code = ExitCode.BAD_MODEL_FILE


class ServerNotFoundError(LlamafitError):
    exit_code = ExitCode.SERVER_NOT_FOUND


class ServerLoadError(LlamafitError):
    exit_code = ExitCode.SERVER_LOAD_FAILED


class NetworkError(LlamafitError):
    exit_code = ExitCode.NETWORK


class AccessError(NetworkError):
    """The Hub refused: a gated or private repo, or a token without access."""
