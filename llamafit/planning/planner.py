"""One command's planning context and its stages: the machine, the server with what it accepts, the Hub
resolver and the models read, found once and shared by every plan the command makes (each quant of a repo,
each model of a set, each candidate ``tune`` measures); ``Planner.plan`` runs the stages of one plan
(``llamafit.planning``) in order."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from llamafit.devices.machine import Machine
from llamafit.fit.speed import priced
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.hub.resolve import Hub
from llamafit.options import Options
from llamafit.planning import measure as measuring
from llamafit.planning.asked import read
from llamafit.planning.discover import machine_and_server, machine_for, new_hub, server_and_caps
from llamafit.planning.fitting import fit
from llamafit.planning.numa import numa_note
from llamafit.planning.prepared import Prepared
from llamafit.planning.resolve import resolve
from llamafit.planning.tuned import start_from_winner
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.server.capabilities import Capabilities
from llamafit.server.compat import supported
from llamafit.server.environment import config_findings
from llamafit.speed.rate_source import MEASURE_BUDGET, Measured


@dataclass
class Planner:
    options: Options
    machine: Machine
    server: ServerBinary | None
    caps: Capabilities
    hub: Hub
    models: dict[str, ModelInfo] = field(default_factory=dict)

    @classmethod
    def for_options(
        cls,
        o: Options,
        *,
        machine: Machine | None = None,
        server: tuple[ServerBinary | None, Capabilities] | None = None,
    ) -> Planner:
        """The machine as the server that would run sees it, that server, and a Hub resolver (``machine``,
        ``server``: given instead of found)."""
        if machine is None:
            machine, found = machine_and_server(o)
            server = server or found
        elif server is None:
            server = server_and_caps(o.server)
        return cls(o, machine, server[0], server[1], new_hub(o.offline))

    def plan(
        self,
        model: str,
        o: Options | None = None,
        *,
        machine: Machine | None = None,
        speed: bool = True,
        progress: Callable[[str], None] | None = None,
        tuned: bool = True,
        measure: float = MEASURE_BUDGET,
        measured: Measured | None = None,
    ) -> Prepared:
        """Plan one model with this context. ``o``: other options than the command's (a set member's flags);
        ``machine``: what is left of the machine beside other models; ``speed``: predict its tokens/s
        (``progress`` hears what is measured, ``measure`` the seconds measuring may take, 0 for cached
        measurements only; ``measured``: another plan's rates, read instead); ``tuned``: start from what
        ``llamafit tune`` measured fastest here, when it did."""
        o = o or self.options
        base = machine or self.machine
        srv, caps = self.server, self.caps
        asked = read(o, caps, self.hub)
        mach, asked = machine_for(base, asked, srv, o)
        res = resolve(model, o, asked, self.hub, self._local(model))
        source = measuring.rate_source(mach, res, srv, o, progress, measure) if speed and measured is None else None
        before = measuring.before_fit(source, mach, res) if source is not None else measured
        plan, argv = fit(res, mach, srv, caps, o, hub=self.hub, rates=before.rates if before else None)
        after = measuring.after_fit(source, plan) if source is not None else measured
        if after is not None:
            plan = priced(plan, after.rates)
        notes = [*res.asked.notes, *(after.notes if after is not None else ())]
        notes += [*supported(plan.planned, caps)[1], *config_findings(os.environ, parse_server_args(argv[1:]))]
        notes += [n] if (n := numa_note(plan, res.asked.user, os.environ, o)) else []
        notes += self.hub.notes
        prep = Prepared(plan, argv, res.asked.user, srv, caps, tuple(notes), self.hub, after)
        if not (tuned and speed):
            return prep

        def with_winner(flags: tuple[str, ...]) -> Prepared:
            o_ = replace(o, server_args=(*flags, *o.server_args))
            return self.plan(model, o_, machine=base, tuned=False, measured=after, progress=progress)

        return start_from_winner(prep, with_winner)

    def _local(self, ref: str) -> ModelInfo | None:
        if not os.path.isfile(ref):
            return None  # a Hub model: the Hub resolver keeps its headers
        if ref not in self.models:
            self.models[ref] = load_model(ref)
        return self.models[ref]


def prepare(
    model: str,
    o: Options,
    *,
    machine: Machine | None = None,
    server: tuple[ServerBinary | None, Capabilities] | None = None,
    speed: bool = True,
    progress: Callable[[str], None] | None = None,
    tuned: bool = True,
    measure: float = MEASURE_BUDGET,
) -> Prepared:
    """One plan with a planning context of its own (a command that makes several keeps one ``Planner``)."""
    planner = Planner.for_options(o, machine=machine, server=server)
    return planner.plan(model, speed=speed, progress=progress, tuned=tuned, measure=measure)
