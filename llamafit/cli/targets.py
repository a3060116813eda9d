"""What ``plan`` and ``run`` share: the models and options a command line names, and the plan of one model (of
the quant asked for)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from llamafit.cli.options import split_targets
from llamafit.cli.output import note
from llamafit.options import Options

if TYPE_CHECKING:
    from llamafit.planning.prepared import Prepared


def list_rpc_early(o: Options) -> None:
    """The ``--rpc`` servers' devices listed while the command goes on importing and reading what a plan needs
    (``devices.rpc.start_listing``); nothing when the listing cannot be started here (the plan's own says why)."""
    if not o.rpc or o.cpu_only:
        return
    from llamafit.devices.rpc import parse_endpoints, start_listing
    from llamafit.errors import LlamafitError
    from llamafit.server.binary import find_server

    try:
        srv = find_server(o.server)
        endpoints = parse_endpoints(o.rpc)
    except LlamafitError:
        return
    # as written, not resolved: the plan resolves them once (``same_servers``); where it merges two spellings of
    # one server, its endpoints differ from these and this listing is killed unread
    start_listing(endpoints, srv.path, srv.env())


def prepare_one(model: str, o: Options, json_out: bool = False, quant: str | None = None) -> Prepared:
    """The plan and argv (of the quant asked for with ``:best``/``--quant``); when nothing fits and
    ``json_out``, the plan that could not be made is the error's document (``"fits": false``, exit 3)."""
    list_rpc_early(o)
    from llamafit.errors import DoesNotFitError
    from llamafit.planning.planner import Planner
    from llamafit.planning.quants import prepare_choice, wants_quants

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
            from llamafit.fit.plan import to_json

            raise e.but(doc=to_json(e.plan, e.argv)) from e  # printed with the error (cli.output.json_failure)
        raise


def one_model_options(quant: str | None) -> None:
    """Options that choose for one model are refused with several (never silently ignored)."""
    if quant:
        from llamafit.errors import UsageError

        raise UsageError(
            "--quant chooses the quant of one model; with several, give each one's quant in its name",
            hint="e.g. owner/repo:Q4_K_M",
        )


def targets(ctx: typer.Context, tokens: list[str] | None) -> tuple[list[str], Options]:
    """The models and the options (with the server flags after them)."""
    refs, server_args = split_targets(tokens)
    o = Options.from_params(ctx.params, server_args=tuple(server_args))
    if not refs and ctx.params.get("models_preset") is None:
        from llamafit.errors import UsageError

        raise UsageError("no MODEL given", hint=f"llamafit {ctx.info_name} MODEL [-- SERVER_ARGS...]; see --help")
    return refs, o
