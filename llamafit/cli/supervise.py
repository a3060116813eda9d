"""``llamafit run``'s view of serving (``llamafit.serving.serve``): the server's key lines, ready, predicted vs
actual, failures on stderr; the URL, or under ``--json`` the run's document, on stdout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from llamafit import shellwords
from llamafit.cli.dry import announce
from llamafit.cli.events import EventLog, tee
from llamafit.cli.keep import KeepAlive, RunOptions
from llamafit.cli.output import (
    err_console,
    error,
    json_failure,
    note,
    print_json,
    print_line,
    print_report,
    progress_console,
    safe,
    warn,
)
from llamafit.cli.relay import Relay
from llamafit.cli.render import memory_tables, rows_json
from llamafit.paths import named_files
from llamafit.planning.prepared import Prepared
from llamafit.server.args import redacted
from llamafit.server.endpoint import parse_address
from llamafit.serving.before import before_launch
from llamafit.serving.compare import Row
from llamafit.serving.events import AllReady, Event, InstanceReady, Note, Problem, Ready, Served, ServerLine
from llamafit.serving.liveness import Liveness
from llamafit.serving.metrics import Metrics
from llamafit.serving.outcome import RETRIES
from llamafit.serving.restarts import RestartPolicy
from llamafit.serving.serve import NOTHING_KEPT, KeepSettings, serve
from llamafit.several.together import RUN_SET_SCHEMA

SHOWN_LINE = 2000  # characters of one server line shown on the terminal (--log-file keeps it whole)


def kept_with(keep: KeepAlive, model: str, metrics: bool = True) -> KeepSettings:
    """What ``run``'s options say the server is kept with, built once: the restart policy, the probes, the watch
    and the metrics endpoint serving (before the launch: a port that is taken launches nothing; ``metrics``
    False: none, as under ``--exec``); ``model``: the label of a single server's series ("router": each
    instance's series are labelled with its model's name)."""
    endpoint = None
    if keep.metrics is not None and metrics:
        at = parse_address(keep.metrics)
        endpoint = Metrics(model)
        endpoint.serve(at)
        note(f"metrics at http://{at}/metrics")
    return KeepSettings(RestartPolicy(keep.restart, keep.max_restarts), Liveness(keep.liveness), keep.watch, endpoint)


def run_one(prep: Prepared, run: RunOptions, replan: Callable[[], Prepared]) -> int:
    """``run`` with one model, once planned: the downloads and the environment, then the server replacing llamafit
    (``--exec``) or served and watched; ``replan`` makes the plan again (after a download, after a failed load)."""
    report = announce(prep)
    pending = prep.downloads()
    env = before_launch(prep.server, pending, prep.hub, run.log_file, named_files(prep.argv[1:]), note)
    if (held := prep.plan.memory_bound) is not None and held.after_download:
        # the files are here now: the plan is made again and held to the binary's own no-alloc measurement
        prep = replan()
        report = prep.report()
    print_report([r for r in report if r[0] != "note"], decisions=True)
    kept = kept_with(run.keep, prep.plan.model.name, metrics=not run.exec_)
    if run.exec_:
        from llamafit.server.supervisor import exec_server

        note(shellwords.join(redacted(prep.argv)))
        exec_server(prep.argv, env)
    return supervise(prep, env, run, kept, replan)


def supervise(
    prep: Prepared,
    env: dict[str, str],
    run: RunOptions,
    keep: KeepSettings = NOTHING_KEPT,
    replan: Callable[[], Prepared] | None = None,
) -> int:
    """Serve one model as ``run`` says, kept as ``keep`` says, render what happens (and write it to ``run``'s
    events file), and return llamafit's exit code."""
    events = run.keep.events
    log = EventLog(Path(events), named_files(prep.argv[1:])) if events else None
    relay = Relay(View(verbose=run.verbose, json_out=run.json_out))
    try:
        served = serve(
            prep,
            env,
            tee(relay, log),
            log_file=run.log_file,
            ready_timeout=run.ready_timeout,
            replan=replan,
            retries=RETRIES if run.retry else 0,
            keep=keep,
        )
    finally:
        relay.close()
        if log is not None:
            log.close()
    return finish(served)


def finish(served: Served) -> int:
    """The exit code; under ``--json`` a failure is also its document on stdout (said on stderr already)."""
    if served.failure is not None:
        json_failure(served.code, *served.failure)
    return served.code


class View:
    """Renders serving's events; for the router, ``models_max`` and ``plan_doc`` make its document."""

    def __init__(
        self,
        *,
        verbose: bool,
        json_out: bool,
        models_max: int | None = None,
        plan_doc: dict[str, Any] | None = None,
    ) -> None:
        self.verbose, self.json_out = verbose, json_out
        self.models_max, self.plan_doc = models_max, plan_doc
        self.memory: dict[str, Any] = {}  # the router's instances, as they became ready
        self.err = progress_console()

    def __call__(self, e: Event) -> None:
        err = self.err
        if isinstance(e, ServerLine):
            if self.verbose or e.key:
                line = e.text
                if len(line) > SHOWN_LINE:
                    line = line[:SHOWN_LINE] + f" ... ({len(line) - SHOWN_LINE} more characters)"
                # the server's errors even under --quiet
                (err_console() if e.error else err).print(safe(line), highlight=False, soft_wrap=True)
        elif isinstance(e, Note):
            if e.level == "warning":
                warn(e.text)
            elif e.level == "notice":
                err.print(f"[yellow]llamafit: {safe(e.text)}[/]", soft_wrap=True)
            else:
                err.print(f"[dim]llamafit:[/] {safe(e.text)}", soft_wrap=True)
        elif isinstance(e, Problem):
            error(e.message, e.hint)
        elif isinstance(e, Ready):
            self.ready(e)
        elif isinstance(e, InstanceReady):
            self.instance_ready(e)
        else:
            self.all_ready(e)

    def ready(self, e: Ready) -> None:
        err = self.err
        err.print(f"[green]llamafit: ready[/] at {safe(e.url)}")
        if self.json_out:
            server = {"device_free_mib": e.device_free_mib, "fit": list(e.fit)}
            doc = {"schema": "llamafit.run/1", "url": e.url, "plan": e.plan_doc, "memory": rows_json(list(e.rows))}
            print_json({**doc, "server": server})
        else:
            print_line(e.url)  # data: where the server listens, for scripts (also under --quiet)
            for table in memory_tables(list(e.rows)):
                err.print(table)
        for line in e.fit:
            err.print(f"[dim]llamafit: llama.cpp's --fit:[/] {safe(line)}", soft_wrap=True)
        for msg in e.drift:
            err.print(f"[yellow]llamafit: {safe(msg)}[/]", soft_wrap=True)
        for r in e.rows:
            if not r.within:
                err.print(
                    f"[yellow]llamafit: {_off(r)}[/] (beyond its tolerance; the next plan for this model corrects it)"
                )

    def instance_ready(self, e: InstanceReady) -> None:
        err = self.err
        err.print(f"[green]llamafit: {safe(e.name)} ready[/] (port {e.port})")
        if self.json_out:
            self.memory[e.name] = {"port": e.port, "memory": rows_json(list(e.rows))}
        else:
            for table in memory_tables(list(e.rows)):
                table.title = f"{safe(e.name)}: {table.title}"
                err.print(table)
        for r in e.rows:
            if not r.within:
                err.print(f"[yellow]llamafit: {safe(e.name)}: {_off(r)}[/]")

    def all_ready(self, e: AllReady) -> None:
        self.err.print(f"[green]llamafit: ready[/] at {safe(e.url)}: " + ", ".join(e.names) + " loaded")
        if self.json_out:
            doc = {"schema": RUN_SET_SCHEMA, "url": e.url, "models_max": self.models_max, "models": self.memory}
            print_json({**doc, "plan": self.plan_doc})
        else:
            print_line(e.url)  # data: where the router listens, for scripts


def _off(r: Row) -> str:
    return f"{r.context} {r.kind} on {r.buft} is off by {r.diff_mib or 0:+.2f} MiB"
