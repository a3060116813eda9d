"""The ``llamafit`` command line (Typer): the commands. Every option is declared in ``cli/options.py``,
every output goes through ``cli/output.py``; core errors are translated once (``handled``).

stdout carries the command's result (a report, JSON, or the argv); progress, hints and errors go to
stderr. Core modules are imported inside the commands so ``--help`` and completion stay fast.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer

from llamafit import __version__
from llamafit.cli.options import (
    CpuOnlyOpt,
    GpuOpt,
    HfFileOpt,
    JsonOpt,
    ModelArg,
    OfflineOpt,
    QuietOpt,
    RevisionOpt,
    RpcOpt,
    RpcOptionalOpt,
    ServerOpt,
)
from llamafit.cli.output import (
    handled,
    interrupted_code,
    json_failure,
    out_console,
    print_json,
    progress_console,
    safe,
    set_json,
    stop_on_signals,
)
from llamafit.errors import ExitCode
from llamafit.options import Options

if TYPE_CHECKING:
    pass

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


def _register() -> None:
    from llamafit.cli.plan_command import PLAN_EXAMPLES, plan_command
    from llamafit.cli.run_command import RUN_EXAMPLES, run_command
    from llamafit.cli.service import service_app
    from llamafit.cli.tune import TUNE_EXAMPLES, tune_command

    app.command("plan", epilog=PLAN_EXAMPLES, short_help="The memory plan per device, and why. Launches nothing.")(
        plan_command
    )
    app.command("run", epilog=RUN_EXAMPLES, short_help="Plan, then launch llama-server and watch it load.")(run_command)
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
        from llamafit.memory.calibration import history_file, read_history

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
