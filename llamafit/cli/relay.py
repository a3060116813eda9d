"""What ``run`` shows, written on a thread of its own, so that a stderr nobody reads never stops the server.

A pipe that fills (a paused pager, a reader that stopped) blocks every write to it. Written on the thread
that reads the server's output, that write stops the reading; the server's own log writes then block (its
log worker writes under its lock), its task loop with them, the liveness probes fail and a server that was
serving well is restarted. So the view runs behind a queue on a writer thread: the server's lines beyond
``bound`` waiting are dropped and counted (said once the writer catches up), every other event waits its turn.
"""

from __future__ import annotations

import queue
import threading

from llamafit.serving import Event, Note, OnEvent, ServerLine

BOUND = 10_000  # server lines waiting to be shown before more are dropped (a few MiB at most)
CLOSE_WAIT = 5.0  # seconds the last events are given to be written when llamafit ends


class Relay:
    """``view`` behind a queue: call it from any thread; ``close()`` writes what waits (bounded) and ends."""

    def __init__(self, view: OnEvent, bound: int = BOUND) -> None:
        self.view, self.bound = view, bound
        self.dropped = 0
        self._lines = 0  # server lines waiting
        self._lock = threading.Lock()
        self._q: queue.SimpleQueue[Event | None] = queue.SimpleQueue()  # None: the end
        self._thread = threading.Thread(target=self._loop, name="llamafit output", daemon=True)
        self._thread.start()

    def __call__(self, e: Event) -> None:
        if isinstance(e, ServerLine):
            with self._lock:
                if self._lines >= self.bound:
                    self.dropped += 1
                    return
                self._lines += 1
        self._q.put(e)

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        self._q.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while (e := self._q.get()) is not None:
            with self._lock:
                if isinstance(e, ServerLine):
                    self._lines -= 1
                dropped, self.dropped = self.dropped, 0
            if dropped:
                said = f"{dropped} of llama-server's lines were not shown: stderr was not read as fast as they came"
                self.view(Note(said, "notice"))
            self.view(e)
