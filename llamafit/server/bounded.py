"""Short child processes with a bound: a probe of a binary that never answers must not hang a plan, and
one that floods its output must not fill llamafit's memory.

The child gets its own process group, so a timeout kills it and everything it started (a wrapper script's
children too), and ``subprocess.TimeoutExpired`` reaches the caller within the bound; it dies with llamafit
(``llamafit.server.children``). Of its output, the first ``MAX_OUTPUT`` bytes of stdout and the last
``MAX_ERRORS`` of stderr are kept: the answers llamafit reads are at the start, the reasons at the end.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable, Sequence

from llamafit.server.children import die_with_parent, kill_group

MAX_OUTPUT = 8 << 20  # bytes of stdout kept: llama-bench's JSON lines, --help, --completion-bash are far less
MAX_ERRORS = 64 << 10  # bytes of stderr kept, the last ones


def run_bounded(argv: Sequence[str], *, env: dict[str, str] | None, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with no stdin, capture its output (text, bounded), and kill its process group at
    ``timeout``."""
    try:
        return finish_bounded(start_bounded(argv, env=env), time.monotonic() + timeout)
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(list(argv), timeout) from None


def start_bounded(argv: Sequence[str], *, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    """``argv`` started as ``run_bounded`` runs it, for ``finish_bounded`` to read (what it prints stays in its
    pipes meanwhile: a child that prints more than a pipe holds waits for the reader)."""
    return subprocess.Popen(
        list(argv),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )


def finish_bounded(proc: subprocess.Popen[bytes], deadline: float) -> subprocess.CompletedProcess[str]:
    """What a child ``start_bounded`` started printed, once it exits; its process group killed at ``deadline``
    (``time.monotonic()``), then ``subprocess.TimeoutExpired``."""
    argv = list(proc.args) if isinstance(proc.args, list) else [str(proc.args)]
    try:
        out, err = _collect(proc, deadline)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise subprocess.TimeoutExpired(argv, max(0.0, deadline - time.monotonic())) from None
    except BaseException:
        kill_group(proc)
        raise
    text = (out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
    return subprocess.CompletedProcess(argv, proc.returncode, *text)


def _collect(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes]:
    """Read both pipes until the child closes them and exits, keeping the head of stdout and the tail of
    stderr; TimeoutExpired at ``deadline``."""
    assert proc.stdout is not None and proc.stderr is not None
    kept = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    with selectors.DefaultSelector() as sel:
        for f in kept:
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            for key, _ in sel.select(min(left, 1.0)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = kept[key.fileobj]  # type: ignore[index]
                if key.fileobj is proc.stdout:
                    buf += chunk[: max(0, MAX_OUTPUT - len(buf))]
                else:
                    buf += chunk
                    del buf[:-MAX_ERRORS]
    for f in kept:
        f.close()
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(proc.args, 0) from None
    return bytes(kept[proc.stdout]), bytes(kept[proc.stderr])


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
