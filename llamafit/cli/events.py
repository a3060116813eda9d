"""``run --events FILE``: what happens while the server serves, one JSON object a line (``llamafit.event/1``),
for a script that follows the file while the server runs (``tail -f``): ready with the memory rows, notices
(restarts, replans), warnings (memory growth, a slowing server), errors. The server's own log lines are
not copied (``--log-file`` keeps those). A file that stops taking lines is said once, and serving goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from llamafit.cli.output import warn
from llamafit.cli.render import rows_json
from llamafit.errors import UsageError
from llamafit.paths import check_output
from llamafit.serving.events import AllReady, Event, InstanceReady, Note, OnEvent, Problem, Ready, ServerLine

SCHEMA = "llamafit.event/1"


def as_json(e: Event) -> dict[str, Any] | None:
    """The event as a line's object; None for what is not written (the server's lines)."""
    if isinstance(e, ServerLine):
        return None
    if isinstance(e, Note):
        return {"event": e.level, "text": e.text}
    if isinstance(e, Problem):
        return {"event": "error", "text": e.message, "hint": e.hint}
    if isinstance(e, Ready):
        return {"event": "ready", "url": e.url, "memory": rows_json(list(e.rows))}
    if isinstance(e, InstanceReady):
        return {"event": "instance_ready", "model": e.name, "port": e.port, "memory": rows_json(list(e.rows))}
    if isinstance(e, AllReady):
        return {"event": "all_ready", "url": e.url, "models": list(e.names)}
    return None


class EventLog:
    """Appends events to ``path`` from any thread (the log reader, the probes, the watch)."""

    def __init__(self, path: Path, inputs: Iterable[str | Path] = ()) -> None:
        """``inputs``: the run's own files, which the events file must not be; an existing path that is not a
        regular file (a FIFO would block the open) is refused."""
        check_output(path, inputs, "the events file")
        try:  # created readable by its owner alone: what happens while a server serves is nobody else's
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            self._fh: IO[str] | None = open(fd, "a", encoding="utf-8")  # noqa: SIM115
        except OSError as e:
            raise UsageError(f"cannot write the events file {path}: {e.strerror or e}") from None
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, e: Event) -> None:
        doc = as_json(e)
        if doc is None or self._fh is None:
            return
        line = json.dumps({"schema": SCHEMA, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **doc})
        with self._lock:
            if self._fh is None:
                return
            try:
                self._fh.write(line + "\n")
                self._fh.flush()
            except (OSError, ValueError) as err:
                self._fh = None
                warn(f"the events file {self.path} stopped taking lines ({err}); the server runs on")

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                with contextlib.suppress(OSError):
                    self._fh.close()
                self._fh = None


def tee(view: OnEvent, log: EventLog | None) -> OnEvent:
    if log is None:
        return view

    def both(e: Event) -> None:
        view(e)
        log(e)

    return both
