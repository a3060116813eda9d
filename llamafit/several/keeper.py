"""The router's instances kept alive while it serves (``run`` with several models).

The router starts each model's llama-server on a loopback port of its own and never starts one again by
itself: an instance that dies is marked unloaded (``on_child_exit``, tools/server/server-models.cpp:246-250)
until a request autoloads it, and one that hangs stays hung. So each ready instance gets what ``run`` gives one
server: a liveness probe on its own port (a real one-token generation, ``llamafit.serving.liveness``), a watch
of its own process's memory against its plan, its requests timed against its plan, and its own metrics labels.
An instance that stops serving is unloaded through the router (which would give it its stop timeout and then
kill it, server-models.cpp:238-244), killed here if it is still there after llamafit's own stop grace, and
loaded again; a resident one that died is loaded again. Both as ``--restart`` says, counted per model; a
model loaded on demand is only unloaded (its next request loads it). Nothing here prints: what happens is
said through ``on_event``.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import psutil

from llamafit.planning.prepared import Prepared
from llamafit.server.endpoint import Endpoint
from llamafit.server.logparse import LoadLog
from llamafit.serving.compare import Row
from llamafit.serving.events import Note, OnEvent
from llamafit.serving.liveness import Watchdog
from llamafit.serving.metrics import Metrics
from llamafit.serving.outcome import exit_reason, record_launch
from llamafit.serving.restarts import Restarts
from llamafit.serving.serve import (
    WEDGED_STOP,
    KeepSettings,
    LastError,
    RequestTimes,
    memory_metrics,
    watch_memory,
)
from llamafit.serving.watch import MemoryWatch
from llamafit.several.router_log import Instance

STOP_WAIT = WEDGED_STOP  # seconds an unloaded wedged instance has to exit before llamafit kills it, as it
# kills one wedged server (the router would wait its own stop timeout, 10 s, for a hung one that cannot exit)
API_WAIT = 10.0  # seconds the router's /models/load and /models/unload have to answer


@dataclass
class _Kept:
    """One ready instance's probes, and its load log (recorded with what they saw when it stops)."""

    port: int
    proc: psutil.Process | None  # held from ready on: a kill never reaches a process that took its pid since
    log: LoadLog
    times: RequestTimes
    dog: Watchdog | None = None
    memory: MemoryWatch | None = None
    last: LastError = field(default_factory=LastError)

    def stop(self) -> None:
        for w in (self.dog, self.memory):
            if w is not None:
                w.stop()


@dataclass
class Keeper:
    """Told what the router's log says (``line``, ``ready``, ``exited``) and where the router is; keeps each
    instance as the module says until ``stop()``."""

    plans: Mapping[str, Prepared]
    resident: frozenset[str]
    keep: KeepSettings
    on_event: OnEvent
    key: str | None = None  # the router's API key (an instance takes none: it listens on loopback only)
    # loads a model again (None: the router's /models/load; with a memory budget, llamafit's front makes room)
    load: Callable[[str], str | None] | None = None
    router: Endpoint | None = None  # the router's own, once it listens (its --api-prefix, its key)
    router_pid: int | None = None
    _kept: dict[str, _Kept] = field(default_factory=dict)
    _restarts: dict[str, Restarts] = field(default_factory=dict)
    _ours: set[str] = field(default_factory=set)  # stopped by llamafit: its exit is not a failure
    _loading: set[str] = field(default_factory=set)  # loaded again by llamafit, not ready yet
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def metrics(self, name: str) -> Metrics | None:
        return self.keep.metrics.of(name) if self.keep.metrics is not None else None

    def line(self, inst: Instance, text: str) -> None:
        kept = self._kept.get(inst.name)
        if kept is not None and kept.port == inst.port:
            kept.times.feed(text)
            kept.last.feed(text)

    def ready(self, inst: Instance, log: LoadLog, rows: tuple[Row, ...]) -> None:
        """``inst`` is ready (``log``: its load, ``rows``: its buffers against the plan): its probes start."""
        name, prep = inst.name, self.plans[inst.name]
        proc = _instance(self.router_pid, inst.port)
        times = RequestTimes(prep, self.on_event, self.metrics(name), prefix=f"{name}: ")
        kept = _Kept(inst.port, proc, log, times)

        def wedged(why: str) -> None:
            self._wedged(name, inst.port, kept.last.reason(why))

        kept.dog = Watchdog(Endpoint(f"http://127.0.0.1:{inst.port}", key=self.key), self.keep.liveness, wedged)
        if proc is not None:
            kept.memory = watch_memory(prep, proc.pid, self.keep.watch, self._warn(name), self.metrics(name))
        with self._lock:
            old = self._kept.pop(name, None)
            self._kept[name] = kept
            self._ours.discard(name)
            self._loading.discard(name)
        if old is not None:
            self._record(name, old)
        kept.dog.start()
        if (m := self.metrics(name)) is not None:
            memory_metrics(m, rows)

    def expect_exit(self, name: str) -> None:
        """``name`` is about to be unloaded on purpose (llamafit's memory budget, a user's /models/unload): its
        exit is not a failure."""
        with self._lock:
            self._ours.add(name)

    def exited(self, inst: Instance) -> None:
        """The router says ``inst`` exited: its probes stop; one that failed is loaded again as the policy says."""
        name, code = inst.name, inst.exit_code or 0
        with self._lock:
            now = self._kept.get(name)
            if now is not None and now.port != inst.port:
                # an instance already replaced (a hung one the router saw exit only after its successor was
                # ready): the one serving now keeps its probes and stays up
                return
            kept = self._kept.pop(name, None)
            ours = name in self._ours
            reload = name in self._loading
            self._loading.discard(name)
        if kept is not None:
            self._record(name, kept)
        if (m := self.metrics(name)) is not None:
            m.serving(False)
        if ours or self._stopping.is_set() or not (inst.ready or kept is not None or reload):
            return  # stopped by llamafit, the router is ending, or a first load's failure (the router's to say)
        how = "stopped after it was ready" if inst.ready else "failed to load again"
        why = f"{name} {how}: {exit_reason(code)}"
        if name not in self.resident:
            self.on_event(Note(f"{why}; the router loads it again at its next request", "notice"))
        elif self.keep.restart.wants(code, False):
            self._start(name, why, unload=None)
        else:
            self.on_event(Note(f"{why}; not loaded again (--restart {self.keep.restart.mode})", "warning"))

    def ending(self) -> None:
        """The router is being stopped (Ctrl-C, SIGTERM): the instances it stops from here did not fail."""
        self._stopping.set()

    def stop(self) -> None:
        """The router is ending: every probe and pending restart stops."""
        self._stopping.set()
        with self._lock:
            kept, self._kept = dict(self._kept), {}
            threads = list(self._threads)
        for name, k in kept.items():
            self._record(name, k)
        for t in threads:
            t.join(timeout=STOP_WAIT + 2 * API_WAIT)

    def _record(self, name: str, kept: _Kept) -> None:
        """Its probes stop; its launch is recorded (each instance teaches the next plan of its model) with the
        requests it timed and its host memory's high-water marks, as one server's is."""
        kept.stop()
        held = kept.memory.summary() if kept.memory is not None else None
        for why in record_launch(self.plans[name], kept.log, kept.times.checks, held):
            self.on_event(Note(f"{name}: {why}"))

    def _warn(self, name: str) -> Callable[[str], None]:
        return lambda text: self.on_event(Note(f"{name}: {text}", "warning"))

    def _wedged(self, name: str, port: int, why: str) -> None:
        """A watchdog's verdict (on its thread): the instance on ``port`` stopped serving."""
        with self._lock:
            kept = self._kept.get(name)
            if kept is None or kept.port != port:
                return
            self._ours.add(name)
        self._start(name, f"{name} stopped serving: {why}", unload=kept.proc)

    def _start(self, name: str, why: str, unload: psutil.Process | None) -> None:
        t = threading.Thread(target=self._restart, args=(name, why, unload), name=f"restart {name}", daemon=True)
        with self._lock:  # started from the log reader and from the watchdogs' threads
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _restart(self, name: str, why: str, proc: psutil.Process | None) -> None:
        """Unload the instance (``proc``: it is still there), then load it again after the backoff, if the
        window allows and the model is resident."""
        if proc is not None:
            self._unload(name, proc)
        restarts = self._restarts.setdefault(name, Restarts(self.keep.restart))
        reloads = name in self.resident and self.keep.restart.mode != "no"
        delay = restarts.next_delay() if reloads else None
        if delay is None:
            tail = (
                f"restarted {restarts.recent()} times within {restarts.policy.window:.0f} s (--max-restarts "
                f"{restarts.policy.max_restarts})"
                if reloads
                else "its next request loads it"
            )
            unloaded = "unloaded, " if proc is not None else ""
            self.on_event(Note(f"{why}; {unloaded}not loaded again: {tail}", "warning"))
            return
        self.on_event(Note(f"{why}; loading it again in {delay:.0f} s ({restarts.policy.said()})", "notice"))
        if self._stopping.wait(delay):
            return
        restarts.record()
        with self._lock:
            self._ours.discard(name)  # from here its exit is the reload's, and a failure
            self._loading.add(name)
        if (m := self.metrics(name)) is not None:
            m.restarted()
        said = self.load(name) if self.load is not None else self._router("/models/load", name)
        if said is not None:
            self.on_event(Note(f"{name} could not be loaded again: {said}", "warning"))

    def _unload(self, name: str, proc: psutil.Process) -> None:
        said = self._router("/models/unload", name)
        try:
            proc.wait(timeout=STOP_WAIT)
            return
        except psutil.TimeoutExpired:
            with contextlib.suppress(psutil.Error):
                proc.kill()  # a stopped process never reads the router's exit command, nor acts on SIGTERM
                proc.wait(timeout=5)
            how = f"the router's unload: {said}" if said else f"it had not stopped {STOP_WAIT:.0f} s after the unload"
            self.on_event(Note(f"{name} was killed ({how})", "notice"))
        except psutil.Error:
            return  # already gone

    def _router(self, path: str, name: str) -> str | None:
        """POST ``path`` to the router for model ``name``; None when it took it, else why not."""
        if self.router is None:
            return "the router's address is not known yet"
        body = json.dumps({"model": name})
        try:
            status, data = self.router.request("POST", path, API_WAIT, body)
        except (OSError, http.client.HTTPException) as e:
            return f"{path} failed ({type(e).__name__}: {e})"
        return None if status == 200 else f"{path} answered HTTP {status}: {data[:200].decode(errors='replace')}"


def _instance(router_pid: int | None, port: int) -> psutil.Process | None:
    """The router's child serving on ``port`` (its command line has ``--port PORT``), or None."""
    if router_pid is None:
        return None
    try:
        for child in psutil.Process(router_pid).children():
            with contextlib.suppress(psutil.Error):
                args = child.cmdline()
                if any(a == "--port" and b == str(port) for a, b in itertools.pairwise(args)):
                    return child
    except psutil.Error:
        return None
    return None
