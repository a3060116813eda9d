"""What planning gives a command: the plan, the exact argv for the binary, and what every command tells the
user about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamafit.fit.plan import Plan, to_json
from llamafit.hub.resolve import Hub, RepoState
from llamafit.hub.select import HubFile
from llamafit.server.args import ServerArgs
from llamafit.server.binary import ServerBinary
from llamafit.server.capabilities import Capabilities
from llamafit.speed.rate_source import Measured


@dataclass(frozen=True)
class Prepared:
    plan: Plan
    argv: list[str]  # binary first
    user: ServerArgs
    server: ServerBinary | None
    caps: Capabilities
    notes: tuple[str, ...] = field(default=())  # translations, dropped flags, config files
    hub: Hub | None = None  # set when files come from the Hub
    measured: Measured | None = field(default=None, repr=False)  # the devices' rates, as the plan read them

    def report(self) -> tuple[tuple[str, str], ...]:
        """What every command tells the user about this plan, in order: ``("note", text)`` for what was found
        and translated, ``("decision", text)`` for each choice, ``("warning", text)`` for what may go wrong."""
        notes = dict.fromkeys((*self.plan.notes, *self.notes))
        return (
            *(("note", n) for n in notes),
            *(("decision", d.message) for d in self.plan.decisions),
            *(("warning", w) for w in self.plan.warnings),
        )

    def downloads(self) -> list[tuple[RepoState, HubFile]]:
        """The Hub files this plan's argv uses that the cache does not hold yet (none for local models)."""
        if self.hub is None:
            return []
        return self.hub.pending(self.argv[1:])

    def to_json(self) -> dict[str, Any]:
        """The ``llamafit.plan/1`` document, with this preparation's notes and the downloads it needs."""
        doc = to_json(self.plan, self.argv)
        doc["notes"] = [*doc["notes"], *self.notes]
        doc["downloads"] = [{"repo": st.repo, "path": f.path, "size": f.size} for st, f in self.downloads()]
        return doc
