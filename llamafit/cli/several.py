"""``plan``/``run`` with several models: one plan for the set, the router's preset and argv, and the router
supervised with each instance's memory held to its own plan."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamafit import shellwords
from llamafit.cli.output import (
    err_console,
    error,
    failed,
    json_failure,
    note,
    print_json,
    print_line,
    progress_console,
    safe,
    warn,
)
from llamafit.cli.render import memory_tables, rows_json
from llamafit.cli.supervise import SHOWN_LINE, say_killed
from llamafit.devices.machine import Machine
from llamafit.errors import DoesNotFitError, ExitCode, ServerNotFoundError, UsageError
from llamafit.hub.resolve import Hub
from llamafit.launch import before_launch, compare_all, downloads_line, exit_reason, record_launch, with_buffer_lines
from llamafit.options import Options
from llamafit.paths import data_dir
from llamafit.prepare import Prepared
from llamafit.server.binary import GET_SERVER_HINT, ServerBinary
from llamafit.server.capabilities import Capabilities
from llamafit.server.failures import Failure, classify
from llamafit.server.logparse import is_error
from llamafit.server.supervisor import Supervisor, is_key_line
from llamafit.several.plan import (
    RUN_SET_SCHEMA,
    Together,
    entries_from_preset,
    entries_from_refs,
    plan_together,
    summary,
    to_json,
)
from llamafit.several.router_log import RouterLog


@dataclass(frozen=True)
class _Set:
    together: Together
    server: ServerBinary | None
    caps: Capabilities
    hub: Hub

    def argv(self, preset_path: str) -> list[str]:
        binary = self.server.path if self.server else "llama-server"
        return self.together.argv(binary, preset_path)


def prepare_several(refs: Sequence[str], models_preset: Path | None, o: Options) -> _Set:
    """The plan of the set, with the server that would run it and the Hub resolver its files came from."""
    from llamafit.planner import Planner
    from llamafit.quants import wants_quants
    from llamafit.several.preset import load, renamed

    if o.draft or o.hf_file or o.revision:
        raise UsageError("--draft, --hf-file and --revision apply to one model", hint="set them per model in a preset")
    sections = load(models_preset) if models_preset else []
    for sec in sections:
        for line in sec.repeated:
            note(f"{models_preset}:{line}: [{sec.name}] again: llama-server keeps only this later section's keys")
    for text in renamed(sections):
        note(f"{models_preset}: {text}")
    entries = entries_from_preset(sections, str(models_preset)) if models_preset else []
    entries += entries_from_refs(refs, taken=[e.name for e in entries])
    for e in entries:
        if wants_quants(e.ref, None):
            raise UsageError(
                f"{e.name}: :best and folders pick the quant of one model alone; in a set, name the quant",
                hint="llamafit plan owner/repo --quants shows each quant's plan; then give owner/repo:QUANT",
            )
    if not entries:
        raise UsageError("no model given", hint="llamafit run MODEL [MODEL ...], or --models-preset FILE")
    planner = Planner.for_options(o)
    srv, caps, hub = planner.server, planner.caps, planner.hub
    if srv is not None and caps.flags and not caps.accepts("--models-preset"):
        raise ServerNotFoundError(
            f"{srv.path} has no router mode (--models-preset): too old for several models", hint=GET_SERVER_HINT
        )

    def plan(ref: str, opts: Options, m: Machine) -> Prepared:
        # the joint fit plans each model many times, each from the one context (a header read once)
        return planner.plan(ref, opts, machine=m, speed=False)

    try:
        return _Set(plan_together(entries, o, planner.machine, plan), srv, caps, hub)
    except DoesNotFitError as e:
        if e.plan is not None and e.argv is not None:
            from llamafit.plan import to_json as plan_json

            e.doc = {"model": e.model, "plan": plan_json(e.plan, e.argv)}  # --json: the plan that misses
        raise


def _show(t: Together, argv: list[str], preset_shown: bool) -> None:
    """The decisions and each model's notes on stderr; the preset (unless written to a file) and the
    router's argv on stdout."""
    for d in t.decisions:
        note(d.message)
    for line in summary(t):
        note(line)
    seen: set[str] = set()
    for m in t.members:  # each plan's own notes and warnings, once each
        for text in (*m.prep.notes, *m.prep.plan.notes, *m.prep.plan.warnings):
            if text not in seen:
                seen.add(text)
                note(f"{m.entry.name}: {text}")
    if preset_shown:
        print_line(t.preset().rstrip("\n"))
        print_line("")
    print_line(shellwords.join(argv))


def plan_several(refs: Sequence[str], models_preset: Path | None, o: Options, json_out: bool, out: Path | None) -> int:
    from llamafit.several.plan import write_preset

    ps = prepare_several(refs, models_preset, o)
    t, argv = ps.together, ps.argv(str(out) if out else "PRESET.ini")
    if out is not None:
        write_preset(t, out, [models_preset] if models_preset else [])
    if json_out:
        print_json(to_json(t, argv, str(out) if out else None))
        return 0
    if out is not None:
        note(f"preset written to {out}")
    _show(t, argv, preset_shown=out is None)
    return 0


def run_several(
    refs: Sequence[str],
    models_preset: Path | None,
    o: Options,
    *,
    dry_run: bool,
    json_out: bool,
    verbose: bool,
    log_file: Path | None,
    ready_timeout: float | None,
) -> int:
    from llamafit.server.args import parse_server_args
    from llamafit.several.plan import write_preset

    ps = prepare_several(refs, models_preset, o)
    t = ps.together
    # one preset per run: two routers started from one data directory never read each other's
    preset_path = data_dir() / "router" / f"preset-{os.getpid()}.ini"
    argv = ps.argv(str(preset_path))
    pending = list(dict.fromkeys((st, f) for m in t.members for st, f in m.prep.downloads()))
    if dry_run:
        if pending:
            note(downloads_line(pending, "run would download"))
        if json_out:
            print_json(to_json(t, argv, str(preset_path)))
        else:
            _show(t, argv, preset_shown=True)
        return 0
    inputs: list[str | Path] = [*t.files(), *([models_preset] if models_preset else [])]
    env = before_launch(ps.server, pending, ps.hub, log_file, inputs, note)
    write_preset(t, preset_path)
    argv = with_buffer_lines(argv, parse_server_args(t.router_args), ps.caps)
    try:
        return supervise_router(
            t,
            argv,
            env,
            verbose=verbose,
            log_file=log_file,
            json_out=json_out,
            ready_timeout=ready_timeout,
            plan_doc=to_json(t, argv, str(preset_path)),
        )
    finally:
        preset_path.unlink(missing_ok=True)  # the run's own state goes with the run


@dataclass
class _Watch:
    url: str | None = None
    failed: tuple[str, Failure] | None = None
    reported: set[str] = field(default_factory=set)
    done: bool = False
    memory: dict[str, Any] = field(default_factory=dict)


def supervise_router(
    t: Together,
    argv: list[str],
    env: dict[str, str],
    *,
    verbose: bool,
    log_file: Path | None,
    json_out: bool,
    ready_timeout: float | None,
    plan_doc: dict[str, Any] | None = None,
) -> int:
    """Run the router; as each resident instance becomes ready, hold its buffers to its plan; when all are
    ready, print the router's URL. A resident instance that fails to load stops the router (exit 5)."""
    err = progress_console()
    err.print(f"[dim]llamafit:[/] {safe(shellwords.join(argv))}", soft_wrap=True)
    plans = {m.entry.name: m for m in t.members}
    resident = {m.entry.name for m in t.members if m.resident}
    rl = RouterLog()
    w = _Watch()
    started = time.monotonic()

    def finish_if_all_ready() -> None:
        if w.done or w.url is None or not resident <= w.reported:
            return
        w.done = True
        err.print(f"[green]llamafit: ready[/] at {safe(w.url)}: " + ", ".join(sorted(resident)) + " loaded")
        if json_out:
            doc = {"schema": RUN_SET_SCHEMA, "url": w.url, "models_max": t.models_max, "models": w.memory}
            print_json({**doc, "plan": plan_doc})
        else:
            print_line(w.url)  # data: where the router listens, for scripts

    def on_line(line: str) -> None:
        inst, text, event = rl.feed(line)
        if verbose or is_key_line(text) or event == "exited":
            shown = line if len(line) <= SHOWN_LINE else line[:SHOWN_LINE] + " ..."
            (err_console() if is_error(text) else err).print(safe(shown), highlight=False, soft_wrap=True)
        if inst is None or inst.name not in plans:
            return
        m = plans[inst.name]
        if event == "ready" and inst.name not in w.reported:
            log = inst.log()
            rows = compare_all(m.prep, log)
            for why in record_launch(m.prep, log):  # each instance teaches the next plan of its model
                note(f"{m.entry.name}: {why}")
            w.reported.add(inst.name)
            err.print(f"[green]llamafit: {safe(inst.name)} ready[/] (port {inst.port})")
            if json_out:
                w.memory[inst.name] = {"port": inst.port, "memory": rows_json(rows)}
            else:
                for table in memory_tables(rows):
                    table.title = f"{safe(inst.name)}: {table.title}"
                    err.print(table)
            for r in rows:
                if not r.within:
                    err.print(
                        f"[yellow]llamafit: {safe(inst.name)}: {r.context} {r.kind} on {r.buft} is off by "
                        f"{r.diff_mib or 0:+.2f} MiB[/]"
                    )
            finish_if_all_ready()
        elif event == "exited" and not inst.ready and inst.name in resident and w.failed is None:
            pred = {d.device.id: d.use.total for d in m.prep.plan.devices}
            usable = {d.device.id: d.usable for d in m.prep.plan.devices}
            w.failed = (inst.name, classify(inst.lines, inst.exit_code or 1, pred, usable))

    def on_ready(url: str, _log: object) -> None:
        w.url = url
        finish_if_all_ready()

    def stop_when() -> bool:
        late = bool(ready_timeout) and not w.done and time.monotonic() - started > (ready_timeout or 0)
        return w.failed is not None or late

    sup = Supervisor(argv, env, log_file=log_file, on_line=on_line, on_ready=on_ready, probe="/models", on_warning=warn)
    outcome = sup.run(ready_timeout, stop_when=stop_when)
    say_killed(outcome)
    if w.done:
        if outcome.returncode != 0 and not outcome.interrupted:
            error(f"llama-server's router stopped after it was ready: {exit_reason(outcome.returncode)}")
        return outcome.returncode
    if outcome.interrupted:  # before a failure: the instances the router stopped on Ctrl-C did not fail
        err.print("[dim]llamafit: interrupted while loading[/]")
        json_failure(int(ExitCode.INTERRUPTED), "interrupted while loading", None, {"plan": plan_doc})
        return int(ExitCode.INTERRUPTED)
    if w.failed is not None:
        name, f = w.failed
        return failed(ExitCode.SERVER_LOAD_FAILED, f"{name} failed to load: {f.message}", f.hint, plan_doc)
    if outcome.ready or outcome.failure is None:
        return failed(
            ExitCode.SERVER_LOAD_FAILED,
            f"the models were not all ready after {ready_timeout or 0:.0f} s and the router was stopped",
            "raise --ready-timeout, or run with --verbose",
            plan_doc,
        )
    return failed(ExitCode.SERVER_LOAD_FAILED, outcome.failure.message, outcome.failure.hint, plan_doc)
