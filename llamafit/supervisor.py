"""Run llama-server under supervision: stream its log, notice when it is ready, forward signals.

Silent like the rest of the core: what to show is decided by the callbacks the CLI passes. The
server's stdout and stderr are read as one stream, line by line, as they come; ``--log-file`` keeps
every raw line. SIGINT and SIGTERM are forwarded to the server; its exit status is returned the way a
shell reports it (a signal N becomes 128 + N, so SIGABRT is 134).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from llamafit.failures import Failure, classify
from llamafit.logparse import LoadLog, parse

_LEVEL = re.compile(r"^(?:\x1b\[[0-9;]*m)*\d+\.\d{2}\.\d{3}\.\d{3} (?:\x1b\[[0-9;]*m)*(?P<level>[IWED]) ")
_LISTEN = re.compile(r"listening on (?P<url>(?:https?|unix)://\S+)|server is listening on (?P<old>https?://\S+)")
KEY_EVENTS = (
    "loading model", "model loaded", "listening on", "initializing, n_slots", "loading draft model",
    "creating MTP draft context", "speculative decoding context initialized", "loaded multimodal model",
    "exiting due to", "shutting down", "Received second interrupt",
)  # fmt: skip


def line_level(raw: str) -> str:
    """I, W, E or D for a prefixed llama.cpp log line, "" for anything else."""
    m = _LEVEL.match(raw)
    return m.group("level") if m else ""


def is_key_line(raw: str) -> bool:
    """Shown without --verbose: warnings, errors and the events a user waits for."""
    lvl = line_level(raw)
    if lvl in ("W", "E"):
        return True
    if not lvl and raw.strip():
        return "error" in raw.lower() or "warn" in raw.lower()
    return any(k in raw for k in KEY_EVENTS)


@dataclass
class Outcome:
    ready: bool
    url: str | None
    returncode: int
    failure: Failure | None
    log: LoadLog
    lines: list[str] = field(repr=False, default_factory=list)
    interrupted: bool = False


class Supervisor:
    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        log_file: Path | None = None,
        on_line: Callable[[str], None] | None = None,
        on_ready: Callable[[str, LoadLog], None] | None = None,
        predicted: dict[str, int] | None = None,
        usable: dict[str, int] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = env
        self.log_file = log_file
        self.on_line = on_line
        self.on_ready = on_ready
        self.predicted = predicted
        self.usable = usable

    def run(self) -> Outcome:
        proc = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, errors="replace", bufsize=1,
        )  # fmt: skip
        interrupted = False

        def forward(signum: int, _frame: object) -> None:
            nonlocal interrupted
            interrupted = True
            if proc.poll() is None:
                proc.send_signal(signum)

        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        lines: list[str] = []
        ready = False
        url: str | None = None
        sink: IO[str] | None = None
        try:
            if self.log_file is not None:
                sink = open(self.log_file, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
            assert proc.stdout is not None
            for raw in proc.stdout:
                lines.append(raw)
                if sink is not None:
                    sink.write(raw)
                    sink.flush()
                if self.on_line:
                    self.on_line(raw.rstrip("\n"))
                if not ready and (m := _LISTEN.search(raw)):
                    ready = True
                    url = m.group("url") or m.group("old")
                    if self.on_ready:
                        self.on_ready(url, parse(lines))
            rc = proc.wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if sink is not None:
                sink.close()
            if proc.poll() is None:  # pragma: no cover - only on an exception while reading
                proc.kill()
                proc.wait()
        code = 128 - rc if rc < 0 else rc
        failure = None
        if not ready:
            failure = classify(lines, rc, self.predicted, self.usable)
        return Outcome(ready, url, code, failure, parse(lines), lines, interrupted)


def exec_server(argv: Sequence[str], env: dict[str, str]) -> None:  # pragma: no cover - replaces the process
    """Hand the process over to the server (``--exec``): for scripts and service managers."""
    os.execvpe(argv[0], list(argv), env)
