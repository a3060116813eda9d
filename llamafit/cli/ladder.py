"""``plan --quants``: the quant ladder of a repo or folder, planned for this machine."""

from __future__ import annotations

from llamafit.cli.output import note, out_console, print_json
from llamafit.options import Options


def plan_ladder(model: str, o: Options, json_out: bool) -> int:
    """``plan --quants``: every quant planned; when none fits, the table (or the ladder's JSON, with the
    error in it) and the answer ``:best`` gives (``quants.none_fits``)."""
    from llamafit.planning.planner import Planner
    from llamafit.planning.quants import ladder, ladder_json, none_fits, quant_planner, source

    planner = Planner.for_options(o)
    src = source(model, planner.hub, o.revision)
    rows = ladder(src, o, quant_planner(planner))
    fits = any(r.fits for r in rows)
    if json_out and fits:
        print_json(ladder_json(src, rows))
    elif not json_out:
        from llamafit.cli.render import quants_table

        out_console().print(quants_table(src, rows))
    for n in dict.fromkeys(n for r in rows if r.prepared for n in r.prepared.notes):
        note(n)
    if not fits:
        raise none_fits(src, rows).but(doc=ladder_json(src, rows) if json_out else None)
    return 0
