"""One command's planning context: the machine, the server with what it accepts, and the Hub resolver,
found once and shared by every plan the command makes (each quant of a repo, each model of a set, each
candidate ``tune`` measures). A local model's header is read once per command, and its derived values
are memoized on that one ``ModelInfo``."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from llamafit.devices.machine import Machine
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.hub.resolve import Hub
from llamafit.options import Options
from llamafit.prepare import Prepared, machine_and_server, new_hub, prepare
from llamafit.server.binary import ServerBinary
from llamafit.server.capabilities import Capabilities
from llamafit.speed.machine import MEASURE_BUDGET, RateSource


@dataclass
class Planner:
    options: Options
    machine: Machine
    server: ServerBinary | None
    caps: Capabilities
    hub: Hub
    models: dict[str, ModelInfo] = field(default_factory=dict)

    @classmethod
    def for_options(cls, o: Options) -> Planner:
        """The machine as the server that would run sees it, that server, and a Hub resolver."""
        machine, (srv, caps) = machine_and_server(o)
        return cls(o, machine, srv, caps, new_hub(o.offline))

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
        rates: RateSource | None = None,
    ) -> Prepared:
        """``prepare`` one model with this context (``o``: other options than the command's, such as a
        set member's flags; ``machine``: what is left of it beside other models; the rest as ``prepare``)."""
        return prepare(
            model,
            o or self.options,
            machine=machine or self.machine,
            server=(self.server, self.caps),
            hub=self.hub,
            model=self._local(model),
            speed=speed,
            progress=progress,
            tuned=tuned,
            measure=measure,
            rates=rates,
        )

    def _local(self, ref: str) -> ModelInfo | None:
        if not os.path.isfile(ref):
            return None  # a Hub model: the Hub resolver keeps its headers
        if ref not in self.models:
            self.models[ref] = load_model(ref)
        return self.models[ref]
