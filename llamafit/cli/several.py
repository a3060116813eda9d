"""``plan``/``run`` with several models: one plan for the set, the router's preset and argv, and the router
supervised with each instance's memory held to its own plan."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamafit import shellwords
from llamafit.cli.events import EventLog, tee
from llamafit.cli.keep import RunOptions
from llamafit.cli.output import (
    note,
    print_json,
    print_line,
)
from llamafit.cli.relay import Relay
from llamafit.cli.supervise import View, finish, kept_with
from llamafit.devices.machine import Machine
from llamafit.errors import DoesNotFitError, ServerNotFoundError, UsageError
from llamafit.hub.resolve import Hub, downloads_line
from llamafit.options import Options
from llamafit.paths import data_dir, named_files
from llamafit.planning.prepared import Prepared
from llamafit.server.binary import GET_SERVER_HINT, ServerBinary
from llamafit.server.capabilities import Capabilities
from llamafit.serving.before import before_launch, with_buffer_lines
from llamafit.several.together import (
    Together,
    entries_from_preset,
    entries_from_refs,
    plan_together,
    summary,
    to_json,
)


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
    from llamafit.planning.planner import Planner
    from llamafit.planning.quants import wants_quants
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
            from llamafit.fit.plan import to_json as plan_json

            raise e.but(
                doc={"model": e.model, "plan": plan_json(e.plan, e.argv)}
            ) from e  # --json: the plan that misses
        raise


def _show(t: Together, argv: list[str], preset_shown: bool) -> None:
    """The decisions and each model's notes on stderr; the preset (unless written to a file) and the
    router's argv on stdout."""
    for d in t.decisions:
        note(d.message)
    for line in summary(t):
        note(line)
    seen: set[str] = set()
    for m in t.members:  # each plan's own notes and warnings, once each (its decisions are the set's, above)
        for kind, text in m.prep.report():
            if kind != "decision" and text not in seen:
                seen.add(text)
                note(f"{m.entry.name}: {text}")
    if preset_shown:
        print_line(t.preset().rstrip("\n"))
        print_line("")
    print_line(shellwords.join(argv))


def plan_several(refs: Sequence[str], models_preset: Path | None, o: Options, json_out: bool, out: Path | None) -> int:
    from llamafit.several.together import write_preset

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


def run_several(refs: Sequence[str], models_preset: Path | None, o: Options, run: RunOptions, dry_run: bool) -> int:
    """``run`` with several models: the router, kept as ``run.keep`` says (``--dry-run``: its argv and preset)."""
    json_out, log_file = run.json_out, run.log_file
    from llamafit.server.args import parse_server_args
    from llamafit.several.router import Launch, serve_router
    from llamafit.several.together import write_preset

    ps = prepare_several(refs, models_preset, o)
    t = ps.together
    # one preset per run: two routers started from one data directory never read each other's
    preset_path = data_dir() / "router" / f"preset-{os.getpid()}.ini"
    argv = ps.argv(str(preset_path))
    front_at = None
    if t.budget is not None:  # llamafit's front takes the user's address; the router answers behind it
        from llamafit.server.binary import free_port
        from llamafit.several.front import behind_front

        front_at, argv = behind_front(argv, free_port())
    pending = list(dict.fromkeys((st, f) for m in t.members for st, f in m.prep.downloads()))
    if dry_run:
        if pending:
            note(downloads_line(pending, "run would download"))
        if json_out:
            print_json(to_json(t, argv, str(preset_path)))
        else:
            _show(t, argv, preset_shown=True)
        return 0
    keep = run.keep
    kept = kept_with(keep, "router")
    inputs: list[str | Path] = [*t.files(), *([models_preset] if models_preset else [])]
    env = before_launch(ps.server, pending, ps.hub, log_file, inputs, note)
    write_preset(t, preset_path)
    argv = with_buffer_lines(argv, parse_server_args(t.router_args), ps.caps)
    plan_doc = to_json(t, argv, str(preset_path))
    relay = Relay(View(verbose=run.verbose, json_out=json_out, models_max=t.models_max, plan_doc=plan_doc))
    log: EventLog | None = None
    try:
        log = EventLog(Path(keep.events), named_files(argv[1:])) if keep.events else None
        launch = Launch(argv, env, plan_doc, front_at)
        served = serve_router(t, launch, tee(relay, log), log_file=log_file, ready_timeout=run.ready_timeout, keep=kept)
    finally:
        relay.close()
        if log is not None:
            log.close()
        preset_path.unlink(missing_ok=True)  # the run's own state goes with the run
    return finish(served)
