"""``llamafit plan``: the memory plan per device and the decisions behind it; several models, the quant ladder."""

from __future__ import annotations

import typer

from llamafit.cli.options import (
    CpuOnlyOpt,
    DraftOpt,
    GpuOpt,
    HfFileOpt,
    HostBandwidthOpt,
    HostCoresOpt,
    HostRamOpt,
    JsonOpt,
    MarginOpt,
    MinCtxOpt,
    ModelsArg,
    ModelsPresetOpt,
    ModelsPresetOutOpt,
    OfflineOpt,
    Prefer,
    PreferOpt,
    QuantOpt,
    QuantsOpt,
    QuietOpt,
    RevisionOpt,
    RpcOpt,
    RpcOptionalOpt,
    ServerOpt,
    SpecMode,
    SpecOpt,
)
from llamafit.cli.output import (
    handled,
    out_console,
    print_json,
    print_report,
)
from llamafit.cli.targets import one_model_options, prepare_one, targets
from llamafit.options import DEFAULTS

PLAN_EXAMPLES = """Examples:

\b
  llamafit plan model.gguf
  llamafit plan Qwen/Qwen3-8B-GGUF:Q4_K_M --gpu 24GiB --gpu 24GiB
  llamafit plan model.gguf --json -- -c 32768 -ctk q8_0 -ctv q8_0
  llamafit plan Qwen/Qwen3-8B-GGUF --quants --gpu 8GiB
  llamafit plan chat.gguf embed.gguf --models-preset-out planned.ini
"""


def plan_command(
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
        refs, o = targets(ctx, model)
        if quants and (len(refs) > 1 or models_preset is not None or o.hf_file):
            from llamafit.errors import UsageError

            raise UsageError("--quants plans every quant of one repo or folder", hint="give one MODEL, no --hf-file")
        if len(refs) > 1 or models_preset is not None:
            one_model_options(quant)
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
        prep = prepare_one(refs[0], o, json_out, quant)
        # the notes; the decisions and warnings are in the view (and in the JSON)
        print_report([r for r in prep.report() if r[0] == "note"], decisions=False)
        from llamafit.cli.dry import say_inherited_settings

        say_inherited_settings()
        if json_out:
            print_json(prep.to_json())
            return
        from llamafit.cli.render import print_plan

        print_plan(out_console(), prep.plan, prep.argv)
