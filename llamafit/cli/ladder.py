"""``plan --quants``: the quant ladder of a repo or folder, planned for this machine."""

from __future__ import annotations

from llamafit.cli.output import note, out_console, print_json
from llamafit.options import Options


def plan_ladder(model: str, o: Options, json_out: bool) -> int:
    """``plan --quants``: every quant planned; exit 3 when none fits (the table is printed first)."""
    from llamafit.errors import DoesNotFitError
    from llamafit.prepare import machine_and_server, new_hub
    from llamafit.quants import ladder, ladder_json, planner, source

    machine, found = machine_and_server(o)
    hub = new_hub(o.offline)
    src = source(model, hub, o.revision)
    rows = ladder(src, o, planner(hub, machine, found))
    if json_out:
        print_json(ladder_json(src, rows))
    else:
        from llamafit.cli.render import quants_table

        out_console().print(quants_table(src, rows))
    for n in dict.fromkeys(n for r in rows if r.prepared for n in r.prepared.notes):
        note(n)
    if not any(r.fits for r in rows):
        fitted = [r for r in rows if r.refused is not None]
        raise DoesNotFitError(
            f"no quant of {src.ref} fits this machine"
            + (f"; the smallest misses: {fitted[0].refused.message}" if fitted and fitted[0].refused else ""),
            hint="try a smaller --min-ctx, -ctk q8_0 -ctv q8_0, or another machine (--gpu)",
        )
    return 0
