"""Serving a plan: llama-server (one model) or its router (several) launched and watched while it loads,
what it allocated held to the plan, a load that ran out of memory planned again and relaunched.

What happens is reported as events while it happens (``on_event``: notes, the server's lines, ready with
the compared buffers as rows) and returned as a ``Served`` (the exit code, and the failure a script reads
under ``--json``); nothing here prints. ``llamafit.cli.supervise`` renders both.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamafit import shellwords
from llamafit.errors import DoesNotFitError, ExitCode
from llamafit.fit.plan import to_json
from llamafit.memory.backends import device_of_buffer, is_device_buffer
from llamafit.planning.prepared import Prepared
from llamafit.server.args import redacted
from llamafit.server.failures import classify
from llamafit.server.logparse import OOM_WORDS, LoadLog, error_text, is_error
from llamafit.server.supervisor import Hooks, Outcome, Supervisor, is_key_line
from llamafit.serving.before import with_buffer_lines
from llamafit.serving.compare import Row
from llamafit.serving.decay import Decay
from llamafit.serving.events import (
    Note,
    OnEvent,
    Problem,
    Ready,
    Served,
    ServerLine,
)
from llamafit.serving.liveness import Liveness, Watchdog
from llamafit.serving.metrics import Metrics
from llamafit.serving.outcome import (
    RETRIES,
    FailedLoad,
    SpeedCheck,
    check_speed,
    compare_all,
    exit_reason,
    failed_load_cap,
    free_drift,
    record_launch,
    remember_failed_load,
)
from llamafit.serving.restarts import RestartPolicy, Restarts
from llamafit.serving.timings import MAX_SERVED, TimingReader
from llamafit.serving.timings import Served as ServedRequest
from llamafit.serving.watch import Allowance, MemoryWatch
from llamafit.units import MiB

NO_RESTART = RestartPolicy("no")
NO_PROBES = Liveness(interval=0)
PAUSE_POLL = 0.05  # seconds between looks at whether an interrupt came during a restart's backoff
WEDGED_STOP = 5.0  # seconds a wedged server is given to stop before SIGKILL (a stopped one ignores the rest)


@dataclass(frozen=True)
class KeepSettings:
    """What a server (or each of the router's instances) is kept with once ready: its restart policy, liveness
    probes, memory watch interval (0: none) and metrics endpoint; built once by ``run`` from its options."""

    restart: RestartPolicy = NO_RESTART
    liveness: Liveness = NO_PROBES
    watch: float = 0.0
    metrics: Metrics | None = None


NOTHING_KEPT = KeepSettings()  # tests and a bare serve(): no restart, no probes, no watch, no metrics


def probe_sized(s: ServedRequest) -> bool:
    """A request no bigger than a liveness probe (a few prompt tokens, one generated): too small to time
    anything, so not a speed measurement."""
    return s.prompt_tokens <= 8 and s.gen_tokens <= 1


def allowance(prep: Prepared) -> Allowance:
    """What the plan lets the server's own host memory reach: its host buffers (not the mapped weights),
    and after the load the checkpoints and the prompt cache (llamafit.fit.runtime)."""
    plan = prep.plan
    buffers = [*plan.footprint.buffers, *(plan.draft_footprint.buffers if plan.draft_footprint else ())]
    planned = sum(b.nbytes for b in buffers if not is_device_buffer(b.buft) and not b.buft.endswith("_Mapped"))
    rt = plan.host.runtime
    if rt is None:
        return Allowance(planned, -1, max(0, plan.host.usable - plan.host.use.total))
    return Allowance(planned, rt.total if rt.prompt_cache >= 0 else -1, rt.room)


class LastError:
    """The last error line a ready server logged, said with the reason it was found wedged (a server that
    cannot allocate at run time can hang rather than die: the allocation's error is the cause)."""

    def __init__(self) -> None:
        self.text: str | None = None

    def feed(self, line: str) -> None:
        if (text := error_text(line)) is not None:
            self.text = text[:300]

    def reason(self, why: str) -> str:
        if self.text is None:
            return why
        oom = " (it ran out of memory)" if any(w in self.text for w in OOM_WORDS) else ""
        return f"{why}; its last error: {self.text}{oom}"


class RequestTimes:
    """Each request a server times in its log, held to the plan's prediction at its depth: said as a note
    (``prefix``: whose), set on ``metrics``, a speed that decays over the server's life warned of. ``checks``:
    the newest requests' checks, for the launch's record."""

    def __init__(self, prep: Prepared, on_event: OnEvent, metrics: Metrics | None, prefix: str = "") -> None:
        self.prep, self.on_event, self.metrics, self.prefix = prep, on_event, metrics, prefix
        self.reader = TimingReader()
        self.decay = Decay()
        self.checks: list[SpeedCheck] = []

    def feed(self, line: str) -> None:
        if (served := self.reader.feed(line)) is None or probe_sized(served):
            return
        check = check_speed(self.prep, served)
        self.checks.append(check)
        del self.checks[:-MAX_SERVED]  # a server that serves for weeks: the newest requests are recorded
        if self.metrics is not None:
            self.metrics.served(served.tg, check.tg, served.pp)
        if (slowed := self.decay.feed(served.tg, check.tg, served.depth)) is not None:
            self.on_event(Note(self.prefix + slowed, "warning"))
        self.on_event(Note(self.prefix + check.message()))


def serve(
    prep: Prepared,
    env: dict[str, str],
    on_event: OnEvent,
    *,
    log_file: Path | None = None,
    ready_timeout: float | None = None,
    replan: Callable[[], Prepared] | None = None,
    retries: int = RETRIES,
    keep: KeepSettings = NOTHING_KEPT,
) -> Served:
    """Run one model's server until it exits. A load that runs out of memory is recorded (what it showed
    the device holds) and, with ``replan``, planned again within that and launched again, at most
    ``retries`` times, each attempt stated with its numbers. A server that was ready and then died or stopped
    serving (``keep.liveness``) is started again as ``keep.restart`` says, each restart stated with its reason.
    Its host memory is sampled every ``keep.watch`` seconds (0: not) and held to the plan
    (``llamafit.serving.watch``); all of it is also set on ``keep.metrics`` (``llamafit.serving.metrics``)."""
    attempt = 0
    restarts = Restarts(keep.restart)
    while True:
        rc, outcome, wedged = _attempt(prep, env, on_event, log_file, ready_timeout, keep)
        if outcome.ready and not outcome.interrupted:
            why = f"stopped serving: {wedged}" if wedged else f"stopped after it was ready: {exit_reason(rc)}"
            if not keep.restart.wants(rc, wedged is not None):
                if rc != 0 or wedged:
                    on_event(Problem(f"llama-server {why}", "run with --verbose (or --log-file) to see its last lines"))
                return Served(rc)
            if (stopped := wait_restart(restarts, f"llama-server {why}", rc, on_event)) is not None:
                return stopped
            if not wedged and replan is not None and (cap := _ran_out(prep, outcome, rc)) is not None:
                # out of memory at run time: planned again within what it showed, as a failed load is
                for why in remember_failed_load(prep, cap):
                    on_event(Note(why, "notice"))
                on_event(Note(f"{cap.message}; planning again within it", "notice"))
                if isinstance(planned := _plan_again(replan, "after running out of memory", on_event), Served):
                    return planned
                prep = planned
            if keep.metrics is not None:
                keep.metrics.restarted()
            continue
        if outcome.ready or outcome.interrupted or outcome.failure is None:
            return _ended(rc, outcome, prep)
        cap = failed_load_cap(prep, outcome.failure, outcome.log)
        if cap is None:
            return _ended(rc, outcome, prep)
        for why in remember_failed_load(prep, cap):
            on_event(Note(why, "notice"))
        if replan is None or attempt == retries:
            if replan is not None:
                on_event(Note(f"gave up after {retries + 1} attempts", "notice"))
            return _ended(rc, outcome, prep)
        attempt += 1
        on_event(
            Note(
                f"{cap.message}; planning again within it (attempt {attempt + 1} of {retries + 1}; "
                "--no-retry stops at the first failure)",
                "notice",
            )
        )
        if isinstance(planned := _plan_again(replan, "after the failed load", on_event), Served):
            return planned
        prep = planned
        for d in prep.plan.decisions:
            if d.code in ("calibration.applied", "context.reduced", "context.train"):
                on_event(Note(d.message))


def _plan_again(replan: Callable[[], Prepared], after: str, on_event: OnEvent) -> Prepared | Served:
    """The plan made again within what a failure showed; the end of serving (exit 3) when nothing fits now."""
    try:
        return replan()
    except DoesNotFitError as e:
        message = f"{after}: {e.message}"
        on_event(Problem(message, e.hint))
        return Served(int(ExitCode.DOES_NOT_FIT), (message, e.hint, None))


def wait_restart(restarts: Restarts, why: str, code: int, on_event: OnEvent) -> Served | None:
    """The backoff before a restart, said with ``why`` (None: go on and start it); how serving ends when the
    window's restarts are spent (the last server's ``code``) or an interrupt came meanwhile."""
    policy = restarts.policy
    delay = restarts.next_delay()
    if delay is None:
        on_event(
            Problem(
                f"{why}; not started again: it was restarted {restarts.recent()} times within {policy.window:.0f} s "
                f"(--max-restarts {policy.max_restarts})",
                "run with --verbose (or --log-file) to see why it keeps stopping",
            )
        )
        return Served(code)
    said = Note(f"{why}; starting it again in {delay:.0f} s ({policy.said()})", "notice")
    if (signum := _pause(delay, functools.partial(on_event, said))) is not None:
        on_event(Note("interrupted before the restart"))
        # as the shell reports a signal: 130 for Ctrl-C, 143 for SIGTERM (a service manager's stop), 129 for SIGHUP
        return Served(int(ExitCode.INTERRUPTED) if signum == signal.SIGINT else 128 + signum)
    restarts.record()
    return None


def device_totals(prep: Prepared) -> tuple[dict[str, int], dict[str, int]]:
    """Each planned device's total and usable bytes, for the failure messages."""
    return {d.device.id: d.use.total for d in prep.plan.devices}, {d.device.id: d.usable for d in prep.plan.devices}


def _ran_out(prep: Prepared, outcome: Outcome, rc: int) -> FailedLoad | None:
    """What a server that died of memory after it was ready showed the device holds (None: another death)."""
    predicted, usable = device_totals(prep)
    return failed_load_cap(prep, classify(outcome.lines, rc, predicted, usable), outcome.log)


def _pause(seconds: float, announce: Callable[[], None]) -> int | None:
    """Say the restart, then wait for it; the signal when an interrupt (SIGINT, SIGTERM, SIGHUP) came meanwhile
    (caught from before it is said, so one sent on reading it is not lost), None when the wait ran out."""
    # the handler only appends (a list is no lock): one that set a threading.Event would take the Event's
    # lock, which this thread may hold inside Event.wait when the signal comes (a deadlock)
    asked: list[int] = []
    handlers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, lambda signum, _frame: asked.append(signum)) for s in handlers}
    try:
        announce()
        end = time.monotonic() + seconds
        while not asked and (left := end - time.monotonic()) > 0:
            time.sleep(min(PAUSE_POLL, left))
        return asked[0] if asked else None
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _ended(rc: int, outcome: Outcome, prep: Prepared) -> Served:
    """A load that failed (or was interrupted) is also a document under ``--json``, with the plan that was
    launched (``_attempt`` said it on stderr)."""
    if outcome.ready:
        return Served(rc)
    f = outcome.failure
    message = "interrupted while loading" if rc == ExitCode.INTERRUPTED or f is None else f.message
    return Served(rc, (message, f.hint if f else None, {"plan": to_json(prep.plan, prep.argv)}))


def _attempt(
    prep: Prepared,
    env: dict[str, str],
    on_event: OnEvent,
    log_file: Path | None,
    ready_timeout: float | None,
    keep: KeepSettings,
) -> tuple[int, Outcome, str | None]:
    """One launch, until the server exits; the third value says why it was stopped as wedged (None: not)."""
    liveness, watch, metrics = keep.liveness, keep.watch, keep.metrics
    argv = with_buffer_lines(prep.argv, prep.user, prep.caps)  # the log level the comparison reads
    on_event(Note(shellwords.join(redacted(argv))))  # one line, copyable; no secret
    on_event(Note(f"loading {prep.plan.model.name} ..."))
    times = RequestTimes(prep, on_event, metrics)
    last = LastError()
    wedged: list[str] = []
    dogs: list[Watchdog] = []
    watches: list[MemoryWatch] = []

    def warn(text: str) -> None:
        on_event(Note(text, "warning"))

    served = threading.Event()  # set before "ready" is said: a request sent on it may fail at once

    def on_line(line: str) -> None:
        times.feed(line)
        if served.is_set():  # the load's own errors are not a serving server's last error
            last.feed(line)
        on_event(ServerLine(line, is_key_line(line), is_error(line)))

    def on_ready(url: str, log: LoadLog) -> None:
        # the log is read on another thread than this one (the supervisor's announcer): the lines of a request sent
        # as soon as "ready" is said must reach the last error the watchdog names
        served.set()
        rows = tuple(compare_all(prep, log))
        doc = to_json(prep.plan, argv)
        assert sup.endpoint is not None  # said ready: it answers there
        at = sup.endpoint.shown()  # what a client uses: the URL with the server's --api-prefix
        on_event(Ready(at, rows, tuple(free_drift(prep, log)), tuple(log.fit), dict(log.device_free_mib), doc))
        dogs.append(Watchdog(sup.endpoint, liveness, lambda why: wedged.append(last.reason(why)), on_own=warn).start())
        if sup.pid is not None:
            watches.append(watch_memory(prep, sup.pid, watch, warn, metrics))
        if metrics is not None:
            memory_metrics(metrics, rows)

    hooks = Hooks(on_line, on_ready, warn)
    sup = Supervisor(argv, env, log_file=log_file, hooks=hooks, planned=device_totals(prep))
    outcome = sup.run(ready_timeout, stop_when=lambda: bool(wedged), stop_after=WEDGED_STOP)
    for dog in dogs:
        dog.stop()
    for w in watches:
        w.stop()
    if metrics is not None:
        metrics.serving(False)
    say_killed(outcome, on_event)
    if outcome.ready:
        held = watches[0].summary() if watches else None
        for why in record_launch(prep, outcome.log, times.checks, held):
            on_event(Note(why, "notice"))
        return outcome.returncode, outcome, (wedged[0] if wedged else None)
    f = outcome.failure
    if outcome.interrupted and f is not None and f.kind in ("abort", "unknown"):
        on_event(Note("interrupted while loading"))
        return int(ExitCode.INTERRUPTED), outcome, None
    assert f is not None
    on_event(Problem(f.message, f.hint))
    return int(ExitCode.SERVER_LOAD_FAILED), outcome, None


def say_killed(outcome: Outcome, on_event: OnEvent) -> None:
    if outcome.killed_after is not None:
        on_event(
            Note(
                f"llama-server had not stopped {outcome.killed_after:.0f} s after the interrupt and was killed "
                "(its signal handler can hang in exit(); nothing of it is left running)",
                "notice",
            )
        )


def watch_memory(
    prep: Prepared, pid: int, interval: float, warn: Callable[[str], None], metrics: Metrics | None
) -> MemoryWatch:
    """A started watch of server ``pid``'s host memory (and its cards' memory) against ``prep``'s plan."""
    plan = prep.plan
    cards = {d.device.nvml_index: (d.device.id, d.use.total) for d in plan.devices if d.device.nvml_index is not None}
    on_sample = metrics.host_memory if metrics is not None else None
    return MemoryWatch(pid, allowance(prep), interval, warn, on_sample=on_sample, cards=cards).start()


def memory_metrics(metrics: Metrics, rows: Sequence[Row]) -> None:
    """A ready server's buffers, predicted and logged, on ``metrics``; the server is up."""
    metrics.memory(
        ((device_of_buffer(r.buft), r.kind, r.predicted) for r in rows),
        ((device_of_buffer(r.buft), r.kind, round(r.actual_mib * MiB)) for r in rows if r.actual_mib),
    )
    metrics.serving(True)
