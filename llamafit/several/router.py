"""Serving several models: llama-server's router launched and watched while its instances load, each one's
buffers held to its own plan as it becomes ready, every instance kept alive while the router serves
(``llamafit.several.keeper``), and the router started again when it dies after all were ready.

Reported as ``llamafit.serving.serve``'s events; nothing here prints.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamafit import shellwords
from llamafit.errors import ExitCode, UsageError
from llamafit.server.args import redacted
from llamafit.server.endpoint import Endpoint, api_key, endpoint_of
from llamafit.server.failures import Failure, classify
from llamafit.server.logparse import is_error
from llamafit.server.supervisor import Hooks, Supervisor, is_key_line
from llamafit.serving.compare import Row
from llamafit.serving.events import AllReady, InstanceReady, Note, OnEvent, Problem, Served, ServerLine
from llamafit.serving.outcome import compare_all, exit_reason
from llamafit.serving.restarts import Restarts
from llamafit.serving.serve import NOTHING_KEPT, KeepSettings, device_totals, say_killed, wait_restart
from llamafit.several.front import Front
from llamafit.several.keeper import Keeper
from llamafit.several.router_log import Instance, RouterLog
from llamafit.several.together import Together


@dataclass
class _Watch:
    url: str | None = None
    failed: tuple[str, Failure] | None = None
    done: bool = False


@dataclass(frozen=True)
class Launch:
    """The router as it is started: its argv and environment, the run's plan document (beside a failure), and
    with a memory budget the user's address where llamafit's front answers for it (``front_at``)."""

    argv: list[str]
    env: dict[str, str]
    plan_doc: dict[str, Any] | None = None
    front_at: tuple[str, int] | None = None


def serve_router(
    t: Together,
    launch: Launch,
    on_event: OnEvent,
    *,
    log_file: Path | None = None,
    ready_timeout: float | None = None,
    keep: KeepSettings = NOTHING_KEPT,
) -> Served:
    """Run the router; as each instance becomes ready, hold its buffers to its plan; when all the resident ones
    are, say so. A resident instance that fails its first load stops the router (exit 5). While it serves, each
    instance is kept as ``keep`` says; a router that dies after all were ready is started again as its restart
    policy says. ``launch.front_at``: with a memory budget (``t.budget``), the user's address, where llamafit's front
    answers for the router (its argv has it on loopback behind it: ``llamafit.several.front.behind_front``)."""
    restart = keep.restart
    restarts = Restarts(restart)
    while True:
        attempt = _router_attempt(t, launch, on_event, log_file, ready_timeout, keep)
        served, all_ready, interrupted = attempt
        if not all_ready or interrupted or not restart.wants(served.code, False):
            if all_ready and served.code != 0 and not interrupted:
                on_event(Problem(f"llama-server's router stopped after it was ready: {exit_reason(served.code)}"))
            return served
        why = f"llama-server's router stopped after it was ready: {exit_reason(served.code)}"
        if keep.metrics is not None:
            for m in t.members:
                keep.metrics.of(m.entry.name).restarted()
        if (stopped := wait_restart(restarts, why, served.code, on_event)) is not None:
            return stopped


def _router_attempt(
    t: Together,
    launch: Launch,
    on_event: OnEvent,
    log_file: Path | None,
    ready_timeout: float | None,
    keep: KeepSettings,
) -> tuple[Served, bool, bool]:
    """One start of the router, until it exits: how it ended, whether all were ready, whether interrupted."""
    argv, env = launch.argv, launch.env
    on_event(Note(shellwords.join(redacted(argv))))
    attempt = _Attempt(t, argv, env, on_event, ready_timeout, keep, launch.front_at)
    hooks = Hooks(attempt.on_line, attempt.on_ready, lambda text: on_event(Note(text, "warning")))
    sup = attempt.sup = Supervisor(argv, env, log_file=log_file, hooks=hooks, probe="/models")
    try:
        outcome = sup.run(ready_timeout, stop_when=attempt.stop_when)
    finally:
        attempt.keeper.stop()
        if attempt.front is not None:
            attempt.front.stop()
    say_killed(outcome, on_event)
    w = attempt.w
    if w.done:
        return Served(outcome.returncode), True, outcome.interrupted
    plan = {"plan": launch.plan_doc}
    if outcome.interrupted:  # before a failure: the instances the router stopped on Ctrl-C did not fail
        on_event(Note("interrupted while loading"))
        return Served(int(ExitCode.INTERRUPTED), ("interrupted while loading", None, plan)), False, True
    if w.failed is not None:
        name, f = w.failed
        message, hint = f"{name} failed to load: {f.message}", f.hint
    elif outcome.ready or outcome.failure is None:
        message = f"the models were not all ready after {ready_timeout or 0:.0f} s and the router was stopped"
        hint = "raise --ready-timeout, or run with --verbose"
    else:
        message, hint = outcome.failure.message, outcome.failure.hint
    on_event(Problem(message, hint))
    return Served(int(ExitCode.SERVER_LOAD_FAILED), (message, hint, plan)), False, False


class _Attempt:
    """What one start of the router keeps while it runs: the router's log per instance, the instances kept
    alive (``keeper``), llamafit's front with a memory budget, and the supervisor's callbacks."""

    sup: Supervisor

    def __init__(
        self,
        t: Together,
        argv: list[str],
        env: dict[str, str],
        on_event: OnEvent,
        ready_timeout: float | None,
        keep: KeepSettings,
        front_at: tuple[str, int] | None,
    ) -> None:
        self.argv, self.env, self.on_event, self.ready_timeout = argv, env, on_event, ready_timeout
        self.plans = {m.entry.name: m for m in t.members}
        self.resident = frozenset(m.entry.name for m in t.members if m.resident)
        self.rl = RouterLog()
        self.w = _Watch()
        # the instances whose InstanceReady has been said; AllReady follows the last of them, once: the log's
        # reader (an instance ready) and the announcer (the router listening) each may finish, so under a lock
        self.reported: set[str] = set()
        self.finishing = threading.Lock()
        self.failures: dict[str, str] = {}  # why a model's last load failed, as its log says (for a waiting request)
        self.keeper = Keeper(
            {n: m.prep for n, m in self.plans.items()}, self.resident, keep, on_event, api_key(argv, env)
        )
        self.front: Front | None = None
        if t.budget is not None and front_at is not None:
            # bound now (a taken port launches nothing), answering once the router listens
            self.front = _front(front_at, t, on_event, keep, ready_timeout, self.failures.get, self.keeper.expect_exit)
            self.keeper.resident = frozenset(self.plans)  # any loaded model that dies is loaded again, by the budget
            front = self.front
            self.keeper.load = lambda name: front.ensure(name).error
        self.started = time.monotonic()

    def finish_if_all_ready(self) -> None:
        w = self.w
        with self.finishing:
            if w.done or w.url is None or not self.resident <= self.reported:
                return
            w.done = True
        self.on_event(AllReady(w.url, tuple(sorted(self.resident))))

    def instance_ready(self, inst: Instance) -> None:
        log = inst.log()
        rows: tuple[Row, ...] = tuple(compare_all(self.plans[inst.name].prep, log))
        self.failures.pop(inst.name, None)
        if self.front is not None:
            self.front.loaded(inst.name)
        self.keeper.router_pid = self.sup.pid
        # kept first (its watchdog, memory watch and `up` series in place), then said: whoever reads the event
        # finds the instance's metrics saying what the event does
        self.keeper.ready(inst, log, rows)
        self.on_event(InstanceReady(inst.name, inst.port, rows))
        with self.finishing:  # reported only once said: the router's readiness must not finish before it
            self.reported.add(inst.name)
        self.finish_if_all_ready()

    def on_line(self, line: str) -> None:
        inst, text, event = self.rl.feed(line)
        self.on_event(ServerLine(line, is_key_line(text) or event == "exited", is_error(text)))
        if inst is None or inst.name not in self.plans:
            return
        if event == "exited":
            self.exited(inst)
        if event == "ready":
            self.instance_ready(inst)
        elif event == "exited" and (self.w.done or inst.ready):  # a first load's failure stops the router (below)
            self.keeper.exited(inst)
        elif event == "exited" and not inst.ready and inst.name in self.resident and self.w.failed is None:
            self.w.failed = (inst.name, self.why(inst))
        elif event == "":
            self.keeper.line(inst, text)

    def exited(self, inst: Instance) -> None:
        """An instance exited: on Ctrl-C or SIGTERM the router stops them (not failures); a first load's
        failure is kept for the request that waits for it; the front no longer counts it as loaded."""
        if self.sup.interrupted:
            self.keeper.ending()
        if not inst.ready:
            self.failures[inst.name] = self.why(inst).message
        if self.front is not None:
            self.front.gone(inst.name, "crashed" if inst.exit_code else "requested")

    def why(self, inst: Instance) -> Failure:
        pred, usable = device_totals(self.plans[inst.name].prep)
        return classify(inst.lines, inst.exit_code or 1, pred, usable)

    def on_ready(self, url: str, _log: object) -> None:
        self.keeper.router = endpoint_of(url, self.argv, self.env)
        self.w.url = url
        if self.front is not None:
            self.front.router = self.keeper.router
            self.front.start()
            host, port = self.front.address
            self.w.url = f"http://{host}:{port}{self.keeper.router.prefix}"
        self.finish_if_all_ready()

    def stop_when(self) -> bool:
        late = (
            bool(self.ready_timeout) and not self.w.done and time.monotonic() - self.started > (self.ready_timeout or 0)
        )
        return self.w.failed is not None or late


def _front(
    at: tuple[str, int],
    t: Together,
    on_event: OnEvent,
    keep: KeepSettings,
    ready_timeout: float | None,
    why_failed: Callable[[str], str | None],
    on_unload: Callable[[str], None],
) -> Front:
    """llamafit's front on the user's address (bound now: a port that is taken is a usage error before the router
    starts), for the budget ``t`` keeps."""
    assert t.budget is not None
    try:
        return Front(
            at,
            Endpoint("http://127.0.0.1:0"),  # the router's, once it listens
            t.budget,
            on_event,
            metrics=lambda name: keep.metrics.of(name) if keep.metrics is not None else None,
            load_wait=ready_timeout or 1800.0,
            why_failed=why_failed,
            on_unload=on_unload,
        )
    except OSError as e:
        raise UsageError(
            f"cannot answer on {at[0]}:{at[1]}: {e.strerror or e}", hint="give another --port, or stop what holds it"
        ) from None
