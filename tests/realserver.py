"""Run the real llama-server on loopback just long enough to read what it allocated."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from llamafit.logparse import LoadLog
from llamafit.server import ServerBinary, free_port
from llamafit.supervisor import Supervisor


def load_log(server: ServerBinary, model: Path | str, args: Sequence[str] = (), timeout: float = 180) -> LoadLog:
    """Start the server on ``model`` with ``args``, wait until it serves, stop it, parse its log.

    ``--no-warmup`` lets sparse (weightless) shape files load; ``-fit off`` keeps the server from
    changing what the test asked for; ``-lv 4`` shows the buffer lines.
    """
    return run_argv(server, ["-m", str(model), "-fit", "off", *args], timeout)


def run_argv(server: ServerBinary, args: Sequence[str], timeout: float = 180, warmup: bool = False) -> LoadLog:
    """Run exactly ``args`` (what llamafit composed, without the binary) plus loopback test flags.

    ``warmup``: keep the warmup run (a projector reserves its compute buffer only then); small
    sparse models survive it, large shapes need it off."""
    port = free_port()
    argv = [
        server.path, *args, "--host", "127.0.0.1", "--port", str(port), *([] if warmup else ["--no-warmup"]),
        "-lv", "4", "--log-colors", "off",
    ]  # fmt: skip
    running = Supervisor(argv, server.env())
    running.start()
    try:
        running.wait_ready(timeout=timeout)
    finally:
        out = running.stop()
    assert out.log.loaded, "".join(out.lines[-20:])
    assert out.returncode == 0, f"server exit code {out.returncode}"
    return out.log


def read_until(stream: IO[str], marker: str, timeout: float = 120) -> tuple[bool, list[str]]:
    """Lines of ``stream`` up to the first containing ``marker``, without blocking past ``timeout``:
    a server that never gets ready fails the test with its output instead of hanging it."""
    import queue
    import threading

    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)
            if marker in line:
                break
        else:
            q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = q.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            return False, seen
        seen.append(line)
        if marker in line:
            return True, seen
    return False, seen
