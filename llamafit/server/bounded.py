"""Short child processes with a bound: a probe of a binary that never answers must not hang a plan.

The child gets its own process group, so a timeout kills it and everything it started (a wrapper
script's children too), and ``subprocess.TimeoutExpired`` reaches the caller within the bound.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Sequence


def run_bounded(argv: Sequence[str], *, env: dict[str, str] | None, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with no stdin, capture its output (text), and kill its process group at ``timeout``."""
    proc = subprocess.Popen(
        list(argv),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=2)  # a grandchild that left the group may still hold the pipes
        raise
    except BaseException:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def run_tool(
    argv: Sequence[str], *, env: dict[str, str] | None, timeout: float, fail: Callable[[str], Exception]
) -> subprocess.CompletedProcess[str]:
    """``run_bounded`` for a llama.cpp tool whose failure is the caller's error: ``fail(why)`` is raised when it
    does not finish within ``timeout`` or cannot be started."""
    name = os.path.basename(argv[0])
    try:
        return run_bounded(argv, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise fail(f"{name} did not finish within {timeout:.0f} s") from None
    except OSError as e:
        raise fail(f"{name} could not be started: {e.strerror or e}") from None


def kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()
