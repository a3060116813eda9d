"""What ``run`` shows, written on a thread of its own, so that a stderr nobody reads never stops the server.

A pipe that fills (a paused pager, a reader that stopped) blocks every write to it. Written on the thread
that reads the server's output, that write stops the reading; the server's own log writes then block (its
log worker writes under its lock), its task loop with them, the liveness probes fail and a server that was
serving well is restarted. So the view runs behind a queue on a writer thread: the lines that come with
every request (the server's own, llamafit's speed notes) beyond ``bound`` waiting are dropped and counted
(said once the writer catches up); warnings, errors and ready wait their turn.
"""

from __future__ import annotations

import queue
import threading

from llamafit.serving.events import Event, Note, OnEvent, ServerLine

BOUND = 10_000  # lines waiting to be shown before more are dropped (a few MiB at most)
CLOSE_WAIT = 5.0  # seconds the last events are given to be written when llamafit ends


class Relay:
    """``view`` behind a queue: call it from any thread; ``close()`` writes what waits (bounded) and ends."""

    def __init__(self, view: OnEvent, bound: int = BOUND) -> None:
        self.view, self.bound = view, bound
        self.dropped = {"server": 0, "notes": 0}
        self._lines = 0  # droppable lines waiting
        self._lock = threading.Lock()
        self._q: queue.SimpleQueue[Event | None] = queue.SimpleQueue()  # None: the end
        self._thread = threading.Thread(target=self._loop, name="llamafit output", daemon=True)
        self._thread.start()

    def __call__(self, e: Event) -> None:
        if (kind := _droppable(e)) is not None:
            with self._lock:
                if self._lines >= self.bound:
                    self.dropped[kind] += 1
                    return
                self._lines += 1
        self._q.put(e)

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        self._q.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while (e := self._q.get()) is not None:
            with self._lock:
                if _droppable(e) is not None:
                    self._lines -= 1
                dropped, self.dropped = self.dropped, {"server": 0, "notes": 0}
            for what, n in (("of llama-server's lines", dropped["server"]), ("speed notes", dropped["notes"])):
                if n:
                    self.view(Note(f"{n} {what} were not shown: stderr was not read as fast as they came", "notice"))
            self.view(e)


def _droppable(e: Event) -> str | None:
    """Which steady stream ``e`` is part of (the server's log, each request's note), or None: a warning, an
    error or ready is never dropped."""
    if isinstance(e, ServerLine):
        return "server"
    return "notes" if isinstance(e, Note) and e.level == "info" else None
