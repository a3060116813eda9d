"""Every process llamafit starts dies with it: llama-server, its router and the instances the router starts,
llama-bench, llama-fit-params, the probes of a binary.

Each child runs in a session of its own (the terminal's Ctrl-C reaches llamafit alone, which decides what to
forward) and asks Linux to kill it when llamafit dies, even by SIGKILL (``PR_SET_PDEATHSIG``). A child that
starts children of its own (the router's model instances) also gets a guardian: a shell that waits on a pipe
only llamafit holds and, when llamafit is gone without saying so, kills the child's whole process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable


def die_with_parent() -> Callable[[], None] | None:
    """A preexec function asking Linux to kill the child when llamafit dies (PR_SET_PDEATHSIG); None
    elsewhere. SIGKILL, not SIGTERM: llama-server's SIGTERM handler calls exit() and can deadlock there
    (malloc's lock held by the interrupted thread), leaving an orphan that holds its port and memory; a
    llamafit that dies cannot wait to see. It runs between fork and exec, so it only calls prctl and getppid."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # llamafit died before prctl took effect
            os._exit(1)

    return preexec


def kill_group(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGKILL to the child's process group (it leads one: ``start_new_session``), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=REAP_WAIT)  # SIGKILL cannot be caught: only a process stuck in the kernel outlives it


REAP_WAIT = 10.0  # seconds to reap a killed child or a guardian stood down

# waits for a line (llamafit stood it down) or for end of file (llamafit is gone): then kills the group
_GUARD = 'read -r _ || kill -s KILL -- "-$0" 2>/dev/null'


class Guardian:
    """Kills process group ``pgid`` if llamafit dies without ``release()``: for a child whose own children
    (the router's instances) are not tied to llamafit's life. Best effort: without a shell, nothing guards."""

    def __init__(self, pgid: int) -> None:
        self._write: int | None = None
        self._shell: subprocess.Popen[bytes] | None = None
        try:
            read, write = os.pipe()  # both ends close-on-exec: no other child inherits the write end
        except OSError:
            return
        try:
            self._shell = subprocess.Popen(
                ["/bin/sh", "-c", _GUARD, str(pgid)],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # the terminal's Ctrl-C is llamafit's to handle, not the guardian's
            )
            self._write = write
        except OSError:
            os.close(write)
        finally:
            os.close(read)

    def release(self) -> None:
        """The group is dealt with: the guardian exits without killing anything."""
        if self._write is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._write, b"done\n")
        with contextlib.suppress(OSError):
            os.close(self._write)
        self._write = None
        if self._shell is not None:  # reaped, not left a zombie for as long as llamafit runs
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._shell.wait(timeout=REAP_WAIT)
