"""``llamafit run``: plan, then launch the server and watch it (or print the argv: ``--dry-run``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llamafit.cli.options import (
    CpuOnlyOpt,
    DraftOpt,
    EventsOpt,
    GpuOpt,
    HfFileOpt,
    HostBandwidthOpt,
    HostCoresOpt,
    HostRamOpt,
    LivenessOpt,
    MarginOpt,
    MaxRestartsOpt,
    MetricsOpt,
    MinCtxOpt,
    ModelsArg,
    ModelsPresetOpt,
    OfflineOpt,
    Prefer,
    PreferOpt,
    QuantOpt,
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
)
from llamafit.cli.output import (
    handled,
    set_json,
)
from llamafit.cli.targets import list_rpc_early, one_model_options, prepare_one, targets
from llamafit.options import DEFAULTS

RUN_EXAMPLES = """Examples:

\b
  llamafit run unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M -- --port 8080
  llamafit run model.gguf --dry-run
  llamafit run model.gguf --exec --quiet -- --host 0.0.0.0 --port 8080
  llamafit run Qwen/Qwen3-8B-GGUF:best -- --port 8080
  llamafit run chat.gguf embed.gguf -- --port 8080
"""


def run_command(
    ctx: typer.Context,
    model: ModelsArg = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the exact argv (shell-quoted) and exit.")] = False,
    exec_: Annotated[
        bool, typer.Option("--exec", help="Replace llamafit with the server (for scripts and service managers).")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Pass every server log line through.")] = False,
    log_file: Annotated[
        Path | None,
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
        from llamafit.cli.keep import KeepAlive, RunOptions, check_upkeep
        from llamafit.errors import UsageError

        refs, o = targets(ctx, model)
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
        run = RunOptions(json_out, verbose, log_file, ready_timeout or None, not no_retry, exec_, keep)
        dry_run = dry_run or for_service
        if len(refs) > 1 or models_preset is not None:
            one_model_options(quant)
            from llamafit.cli.several import run_several

            if exec_:
                raise UsageError("--exec runs one server; several models run under the router that llamafit watches")
            raise typer.Exit(run_several(refs, models_preset, o, run, dry_run))
        list_rpc_early(o)  # while what follows is imported
        if dry_run:  # planned and printed: nothing that serving needs is loaded
            from llamafit.cli.dry import dry_run_one

            raise typer.Exit(dry_run_one(prepare_one(refs[0], o, json_out, quant), json_out))
        from llamafit.cli.supervise import run_one

        raise typer.Exit(
            run_one(prepare_one(refs[0], o, json_out, quant), run, lambda: prepare_one(refs[0], o, json_out, quant))
        )
