"""``llamafit tune``: measure the configurations that fit and keep the fastest (``llamafit.tune``)."""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer

from llamafit import shellwords
from llamafit.cli.options import (
    CpuOnlyOpt,
    DraftOpt,
    HfFileOpt,
    HostRamOpt,
    JsonOpt,
    MarginOpt,
    MinCtxOpt,
    ModelsArg,
    OfflineOpt,
    Prefer,
    PreferOpt,
    QuietOpt,
    RevisionOpt,
    RpcOpt,
    RpcOptionalOpt,
    ServerOpt,
    SpecMode,
    SpecOpt,
    seconds,
    split_targets,
)
from llamafit.cli.output import handled, note, out_console, print_json, print_line, safe
from llamafit.errors import ExitCode
from llamafit.options import DEFAULTS, Options

TUNE_EXAMPLES = """Examples:

\b
  llamafit tune model.gguf
  llamafit tune Qwen/Qwen3-8B-GGUF:Q4_K_M --budget 300 -- -c 32768
  llamafit tune model.gguf --goal tg --json
"""


def tune_command(
    ctx: typer.Context,
    model: ModelsArg = None,
    budget: Annotated[
        float,
        typer.Option("--budget", metavar="SECONDS", help="Stop measuring after this long.", min=1, callback=seconds),
    ] = 180,
    goal: Annotated[
        str,
        typer.Option(
            "--goal",
            metavar="request|tg|pp",
            help="What fastest means: one request of a 512-token prompt and 64 generated tokens (request), "
            "generation alone (tg) or prompts alone (pp).",
        ),
    ] = "request",
    cpu_only: CpuOnlyOpt = False,
    host_ram: HostRamOpt = None,
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
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Measure the configurations that fit (ubatch, threads, flash attention) with llama-bench, fastest
    predicted first, and keep the fastest: plan and run then start from it."""
    with handled():
        from llamafit.errors import UsageError
        from llamafit.tune import tune

        refs, server_args = split_targets(model)
        if len(refs) != 1:
            raise UsageError("tune takes one MODEL", hint="llamafit tune MODEL [-- SERVER_ARGS...]")
        if goal not in ("request", "tg", "pp"):
            raise UsageError(f"--goal {goal!r}: request, tg or pp")
        if not math.isfinite(budget):
            raise UsageError(f"--budget {budget}: a number of seconds", hint="e.g. --budget 300")
        o = Options.from_params(ctx.params, server_args=tuple(server_args))
        result = tune(refs[0], o, budget=budget, goal=goal, progress=lambda m: note(m))
        for n in result.base.notes:
            note(n)
        if json_out:
            print_json(result.as_dict())
        else:
            out_console().print(_table(result.as_dict()))
        if result.stopped:
            note(f"stopped measuring ({'the --budget ran out' if result.stopped == 'time' else 'interrupted'})")
        if result.best is not None and result.best.prepared is not None and not json_out:
            note(f"fastest: {result.best.why}; plan and run start from it")
            print_line(shellwords.join(result.best.prepared.argv))
        if result.stopped == "interrupted":
            raise typer.Exit(int(ExitCode.INTERRUPTED))


def _table(doc: dict[str, Any]) -> Any:
    from rich.table import Table

    def f(x: object) -> str:
        return "-" if not isinstance(x, int | float) else f"{x:.1f}"

    t = Table(title=f"Configurations measured (goal: {doc['goal']})", title_justify="left")
    for col in ("configuration", "pp pred", "tg pred", "pp", "tg", "note"):
        t.add_column(col, justify="left" if col in ("configuration", "note") else "right")
    best = doc["best"]["flags"] if doc["best"] else None
    for c in doc["candidates"]:
        mark = " *" if best is not None and c["flags"] == best else ""
        t.add_row(
            safe(c["why"]) + mark,
            f(c["predicted"]["pp"]),
            f(c["predicted"]["tg"]),
            f(c["pp"]),
            f(c["tg"]),
            safe(c["error"] or ("" if c["pp"] or c["tg"] else "not measured")),
        )
    return t
