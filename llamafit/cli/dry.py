"""What ``run`` says of a plan before it launches, and all that ``run --dry-run`` does: the argv (or the plan's
JSON with it) on stdout. Nothing that serving needs is loaded for a dry run (``--dry-run`` is a script's way to
plan)."""

from __future__ import annotations

import os

from llamafit import shellwords
from llamafit.cli.output import note, print_json, print_line, print_report
from llamafit.cli.render import next_row
from llamafit.hub.resolve import downloads_line
from llamafit.planning.prepared import Prepared
from llamafit.server.environment import inherited_settings


def announce(prep: Prepared) -> tuple[tuple[str, str], ...]:
    """The plan's notes and the next row of its trade-off, said before anything else; the whole report."""
    report = prep.report()
    print_report([r for r in report if r[0] == "note"], decisions=False)
    if (other := next_row(prep.plan)) is not None:
        note(f"trade-off: {other} (llamafit plan shows every row)")
    return report


def say_inherited_settings() -> None:
    """Where no launch follows (``plan``, ``run --dry-run``): the ``LLAMA_ARG_*`` variables the plan did not read
    and a launch drops (a launch says so as it starts)."""
    if inherited := inherited_settings(os.environ):
        note(inherited)


def dry_run_one(prep: Prepared, json_out: bool) -> int:
    """The argv, shell-quoted (``--json``: the plan with the argv in it), after the warnings and, of the
    decisions, only a choice left to llamafit (no launch follows)."""
    report = announce(prep)
    say_inherited_settings()
    print_report([r for r in report if r[0] == "warning"], decisions=False)
    if (chosen := prep.plan.decision("quant.best")) is not None:
        note(chosen.message)
    if pending := prep.downloads():
        note(downloads_line(pending, "run would download"))
    if json_out:
        print_json(prep.to_json())
    else:
        print_line(shellwords.join(prep.argv))
    return 0
