"""The ``llamafit`` command line (Typer): the commands. Every option is declared in ``cli/options.py``,
every output goes through ``cli/output.py``; core errors are translated once (``handled``).

stdout carries the command's result (a report, JSON, or the argv); progress, hints and errors go to
stderr. Core modules are imported inside the commands so ``--help`` and completion stay fast.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llamafit import __version__
from llamafit.cli.options import (
    CpuOnlyOpt,
    DraftOpt,
    EventsOpt,
    GpuOpt,
    HfFileOpt,
    HostBandwidthOpt,
    HostCoresOpt,
    HostRamOpt,
    JsonOpt,
    LivenessOpt,
    MarginOpt,
    MaxRestartsOpt,
    MetricsOpt,
    MinCtxOpt,
    ModelArg,
    ModelsArg,
    ModelsPresetOpt,
    ModelsPresetOutOpt,
    OfflineOpt,
    Prefer,
    PreferOpt,
    QuantOpt,
    QuantsOpt,
    QuietOpt,
    RestartMode,
    RestartOpt,
    RevisionOpt,
    RpcOpt,
    RpcOptionalOpt,
    ServerOpt,
    SpecMode,
    SpecOpt,
    WatchOpt,
    seconds,
    split_targets,
)
from llamafit.cli.output import (
    handled,
    interrupted_code,
    json_failure,
    note,
    out_console,
    print_json,
    print_report,
    progress_console,
    safe,
    set_json,
    stop_on_signals,
)
from llamafit.errors import ExitCode
from llamafit.options import DEFAULTS, Options

if TYPE_CHECKING:
    from llamafit.planning.prepared import Prepared

app = typer.Typer(
    name="llamafit",
    help="Start llama.cpp's llama-server with the best configuration that fits this machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # plain (click-style) help: rich's help renderer costs ~100 ms per --help
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llamafit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Plan and launch llama-server so the model fits: context, GPU layers, split, drafter."""


def _prepare(model: str, o: Options, json_out: bool = False, quant: str | None = None) -> Prepared:
    """The plan and argv (of the quant asked for with ``:best``/``--quant``); when nothing fits and
    ``json_out``, the plan that could not be made is the error's document (``"fits": false``, exit 3)."""
    from llamafit.errors import DoesNotFitError
    from llamafit.planning.planner import Planner
    from llamafit.quants import prepare_choice, wants_quants

    if wants_quants(model, quant) and o.hf_file:
        from llamafit.errors import UsageError

        raise UsageError("--hf-file names one file; :best and --quant choose among the repo's", hint="give one")
    planner = Planner.for_options(o)
    try:
        if wants_quants(model, quant):
            return prepare_choice(model, quant, o, planner)
        return planner.plan(model, progress=lambda m: note(f"measuring speed: {m}"))
    except DoesNotFitError as e:
        if json_out and e.plan is not None and e.argv is not None:
            from llamafit.plan import to_json

            raise e.but(doc=to_json(e.plan, e.argv)) from e  # printed with the error (cli.output.json_failure)
        raise


def _one_model_options(quant: str | None) -> None:
    """Options that choose for one model are refused with several (never silently ignored)."""
    if quant:
        from llamafit.errors import UsageError

        raise UsageError(
            "--quant chooses the quant of one model; with several, give each one's quant in its name",
            hint="e.g. owner/repo:Q4_K_M",
        )


def _targets(ctx: typer.Context, tokens: list[str] | None) -> tuple[list[str], Options]:
    """The models and the options (with the server flags after them)."""
    refs, server_args = split_targets(tokens)
    o = Options.from_params(ctx.params, server_args=tuple(server_args))
    if not refs and ctx.params.get("models_preset") is None:
        from llamafit.errors import UsageError

        raise UsageError("no MODEL given", hint=f"llamafit {ctx.info_name} MODEL [-- SERVER_ARGS...]; see --help")
    return refs, o


@app.command(short_help="The devices llama-server will use, and host RAM.")
def gpus(
    ctx: typer.Context,
    gpu: GpuOpt = None,
    cpu_only: CpuOnlyOpt = False,
    rpc: RpcOpt = None,
    rpc_optional: RpcOptionalOpt = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Show what llamafit sees: each GPU (name, total, free), RPC devices, and host RAM."""
    with handled():
        from llamafit.devices.machine import Machine
        from llamafit.planning.discover import discover_for, machine_with_rpc, server_and_caps

        o = Options.from_params(ctx.params)
        srv = server_and_caps(server)[0] if not (gpu or cpu_only) or rpc else None
        m = discover_for(o, srv)
        if rpc:
            from llamafit.devices.rpc import parse_endpoints, same_servers

            eps, merged = same_servers(parse_endpoints(rpc))
            m, unreachable = machine_with_rpc(m, eps, srv, optional=rpc_optional, cpu_only=cpu_only)
            notes = [*merged, *(f"RPC server {ep} unreachable (--rpc-optional)" for ep in unreachable)]
            m = Machine(m.gpus, m.host, (*m.notes, *notes), m.blind)
        if json_out:
            print_json(m.to_json())
            return
        from llamafit.cli.render import machine_table

        out_console().print(machine_table(m))
        for n in m.notes:
            progress_console().print(f"[dim]note:[/] {safe(n)}")
        for n in m.blind:
            progress_console().print(f"[yellow]note:[/] {safe(n)}: plans leave placement to llama.cpp's --fit")


@app.command(short_help="What a GGUF model holds: layers, heads, KV, tensors.")
def inspect(
    model: ModelArg,
    hf_file: HfFileOpt = None,
    revision: RevisionOpt = None,
    offline: OfflineOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Architecture, layers, heads, KV geometry, tensor bytes and shards of a GGUF model."""
    with handled():
        from llamafit.planning.resolve import load_any_model

        info = load_any_model(model, hf_file=hf_file, revision=revision, offline=offline)
        if json_out:
            print_json(info.to_json())
            return
        from llamafit.cli.render import model_tables

        con = out_console()
        for t in model_tables(info):
            con.print(t)


PLAN_EXAMPLES = """Examples:

\b
  llamafit plan model.gguf
  llamafit plan Qwen/Qwen3-8B-GGUF:Q4_K_M --gpu 24GiB --gpu 24GiB
  llamafit plan model.gguf --json -- -c 32768 -ctk q8_0 -ctv q8_0
  llamafit plan Qwen/Qwen3-8B-GGUF --quants --gpu 8GiB
  llamafit plan chat.gguf embed.gguf --models-preset-out planned.ini
"""
RUN_EXAMPLES = """Examples:

\b
  llamafit run unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M -- --port 8080
  llamafit run model.gguf --dry-run
  llamafit run model.gguf --exec --quiet -- --host 0.0.0.0 --port 8080
  llamafit run Qwen/Qwen3-8B-GGUF:best -- --port 8080
  llamafit run chat.gguf embed.gguf -- --port 8080
"""


@app.command(epilog=PLAN_EXAMPLES, short_help="The memory plan per device, and why. Launches nothing.")
def plan(
    ctx: typer.Context,
    model: ModelsArg = None,
    gpu: GpuOpt = None,
    cpu_only: CpuOnlyOpt = False,
    margin: MarginOpt = DEFAULTS.margin,
    min_ctx: MinCtxOpt = DEFAULTS.min_ctx,
    spec: SpecOpt = SpecMode.auto,
    prefer: PreferOpt = Prefer.balanced,
    draft: DraftOpt = None,
    server: ServerOpt = None,
    hf_file: HfFileOpt = None,
    revision: RevisionOpt = None,
    offline: OfflineOpt = False,
    rpc: RpcOpt = None,
    rpc_optional: RpcOptionalOpt = False,
    host_bandwidth: HostBandwidthOpt = None,
    host_cores: HostCoresOpt = None,
    host_ram: HostRamOpt = None,
    quant: QuantOpt = None,
    models_preset: ModelsPresetOpt = None,
    models_preset_out: ModelsPresetOutOpt = None,
    quants: QuantsOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """The memory plan per device and the decisions behind it. Nothing is launched or downloaded."""
    with handled():
        refs, o = _targets(ctx, model)
        if quants and (len(refs) > 1 or models_preset is not None or o.hf_file):
            from llamafit.errors import UsageError

            raise UsageError("--quants plans every quant of one repo or folder", hint="give one MODEL, no --hf-file")
        if len(refs) > 1 or models_preset is not None:
            _one_model_options(quant)
            from llamafit.cli.several import plan_several

            raise typer.Exit(plan_several(refs, models_preset, o, json_out, models_preset_out))
        if models_preset_out is not None:
            from llamafit.errors import UsageError

            raise UsageError("--models-preset-out is for several models", hint="give two or more, or --models-preset")
        if quants:
            if quant:
                from llamafit.errors import UsageError

                raise UsageError("--quants plans every quant; --quant picks one", hint="give one of them")
            from llamafit.cli.ladder import plan_ladder

            raise typer.Exit(plan_ladder(refs[0], o, json_out))
        prep = _prepare(refs[0], o, json_out, quant)
        # the notes; the decisions and warnings are in the view (and in the JSON)
        print_report([r for r in prep.report() if r[0] == "note"], decisions=False)
        if json_out:
            print_json(prep.to_json())
            return
        from llamafit.cli.render import print_plan

        print_plan(out_console(), prep.plan, prep.argv)


@app.command(epilog=RUN_EXAMPLES, short_help="Plan, then launch llama-server and watch it load.")
def run(
    ctx: typer.Context,
    model: ModelsArg = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the exact argv (shell-quoted) and exit.")] = False,
    exec_: Annotated[
        bool, typer.Option("--exec", help="Replace llamafit with the server (for scripts and service managers).")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Pass every server log line through.")] = False,
    log_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--log-file", help="Also keep the server's raw log in this file.", dir_okay=False),
    ] = None,
    ready_timeout: Annotated[
        float,
        typer.Option(
            "--ready-timeout",
            help="Stop the server if it is not ready after this many seconds (0: wait forever).",
            min=0,
            callback=seconds,
        ),
    ] = 1800,
    no_retry: Annotated[
        bool, typer.Option("--no-retry", help="Stop at the first load that runs out of memory (no new plan).")
    ] = False,
    restart: RestartOpt = RestartMode.on_failure,
    max_restarts: MaxRestartsOpt = 5,
    liveness: LivenessOpt = 10.0,
    watch: WatchOpt = 5.0,
    metrics: MetricsOpt = None,
    events: EventsOpt = None,
    server: ServerOpt = None,
    gpu: GpuOpt = None,
    cpu_only: CpuOnlyOpt = False,
    margin: MarginOpt = DEFAULTS.margin,
    min_ctx: MinCtxOpt = DEFAULTS.min_ctx,
    spec: SpecOpt = SpecMode.auto,
    prefer: PreferOpt = Prefer.balanced,
    draft: DraftOpt = None,
    hf_file: HfFileOpt = None,
    revision: RevisionOpt = None,
    offline: OfflineOpt = False,
    rpc: RpcOpt = None,
    rpc_optional: RpcOptionalOpt = False,
    host_bandwidth: HostBandwidthOpt = None,
    host_cores: HostCoresOpt = None,
    host_ram: HostRamOpt = None,
    quant: QuantOpt = None,
    models_preset: ModelsPresetOpt = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            callback=set_json,
            help="When the server is ready, print the plan and predicted vs actual as JSON (a failure's too).",
        ),
    ] = False,
    quiet: QuietOpt = False,
    for_service: Annotated[
        bool, typer.Option("--for-service", hidden=True, help="A dry run with every check of a launch (service).")
    ] = False,
) -> None:
    """Plan with your llama-server flags, then launch the server and watch it load (or just print the argv).

    A Hub model is downloaded (only the files the plan uses) after the plan says it fits."""
    with handled():
        from llamafit.cli.supervise import KeepAlive, check_upkeep
        from llamafit.errors import UsageError

        refs, o = _targets(ctx, model)
        if for_service and dry_run:
            raise UsageError("--dry-run among a service's arguments: the service would print the argv and stop")
        if (o.gpu or o.host_ram) and (for_service or not dry_run):
            flag = "--gpu" if o.gpu else "--host-ram"
            raise UsageError(
                f"{flag} describes hardware that is not here: a plan for it can be printed, not launched",
                hint=f"drop {flag} to launch on this machine"
                + ("" if for_service else " (or add --dry-run, or use plan, to print it)"),
            )
        keep = KeepAlive(restart.value, max_restarts, liveness, watch, metrics, events)
        check_upkeep(keep, log_file)
        dry_run = dry_run or for_service
        if len(refs) > 1 or models_preset is not None:
            _one_model_options(quant)
            from llamafit.cli.several import run_several

            if exec_:
                raise UsageError("--exec runs one server; several models run under the router that llamafit watches")
            code = run_several(
                refs,
                models_preset,
                o,
                dry_run=dry_run,
                json_out=json_out,
                verbose=verbose,
                log_file=log_file,
                ready_timeout=ready_timeout or None,
                keep=keep,
            )
            raise typer.Exit(code)
        from llamafit.cli.supervise import run_one
        from llamafit.launch import RETRIES

        code = run_one(
            _prepare(refs[0], o, json_out, quant),
            dry_run=dry_run,
            exec_=exec_,
            json_out=json_out,
            verbose=verbose,
            log_file=log_file,
            ready_timeout=ready_timeout or None,
            replan=lambda: _prepare(refs[0], o, json_out, quant),
            retries=0 if no_retry else RETRIES,
            keep=keep,
        )
        raise typer.Exit(code)


def _register() -> None:
    from llamafit.cli.service import service_app
    from llamafit.cli.tune import TUNE_EXAMPLES, tune_command

    app.command("tune", epilog=TUNE_EXAMPLES, short_help="Measure what fits and keep the fastest.")(tune_command)
    app.add_typer(service_app, name="service", short_help="Start llamafit run on boot (systemd, launchd).")


_register()


@app.command(short_help="The whole pipeline on an embedded tiny model.")
def demo(
    server: ServerOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Run the whole pipeline on an embedded tiny model: plan, launch, one request, predicted vs actual, stop."""
    with handled():
        from llamafit.cli.demo import run_demo

        raise typer.Exit(run_demo(server, json_out))


@app.command(short_help="Past launches: predicted against actual memory.")
def history(
    limit: Annotated[int, typer.Option("-n", "--limit", help="How many of the newest launches.", min=1)] = 20,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Past launches: what was predicted and what llama-server really allocated (the calibration data)."""
    with handled():
        from llamafit.calibration import history_file, read_history

        entries = read_history(limit)
        if json_out:
            print_json({"schema": "llamafit.history-list/1", "file": str(history_file()), "launches": entries})
            return
        from llamafit.cli.render import history_table

        t = history_table(entries, str(history_file()))
        out_console().print(t)
        if not entries:
            progress_console().print("[dim]no launches recorded yet: `llamafit run` records each one[/]")


class Shell(str, Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@app.command(short_help="Print the shell completion script.")
def completion(
    shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish.", show_default=False, metavar="SHELL")],
) -> None:
    """Print the shell completion script (install it, or eval it in your shell's rc file)."""
    with handled():
        from llamafit.cli.completion import script

        sys.stdout.write(script(shell.value, app))


def main() -> None:
    """Console-script entry point (see llamafit.cli.entry for the completion fast path). Click's own
    usage errors (a bad option value, an unknown option) come here rather than exit inside Click, so that
    under ``--json`` they print their document like every other failure."""
    args = sys.argv[1:]
    set_json("--json" in args[: args.index("--")] if "--" in args else "--json" in args)
    stop_on_signals()
    try:
        rv = app(standalone_mode=False)
    except typer.Abort:
        sys.exit(int(ExitCode.INTERRUPTED))
    except KeyboardInterrupt as e:  # a signal outside a command's own handling (Click's parsing)
        sys.exit(interrupted_code(e))
    except SystemExit:
        raise
    except Exception as e:
        if callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int):
            # Click's own usage errors (typer's click, whose classes typer does not export but BadParameter)
            e.show()  # type: ignore[attr-defined]
            json_failure(e.exit_code, e.format_message(), None)  # type: ignore[attr-defined]
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        if os.environ.get("LLAMAFIT_DEBUG"):  # pragma: no cover - last resort; commands handle their own errors
            raise
        print(f"internal error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(int(ExitCode.INTERNAL))
    sys.exit(rv if isinstance(rv, int) else 0)
