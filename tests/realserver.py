"""Run the real llama-server on loopback just long enough to read what it allocated."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llamafit.logparse import LoadLog, parse
from llamafit.server import ServerBinary, free_port, start_background


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
    running = start_background(argv, server.env(), "127.0.0.1", port)
    try:
        running.wait_ready(timeout=timeout)
    finally:
        rc = running.stop()
    log = parse(running.lines)
    assert log.loaded, "".join(running.lines[-20:])
    assert rc == 0, f"server exit code {rc}"
    return log
