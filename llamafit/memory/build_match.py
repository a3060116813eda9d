"""How the build a plan is priced for relates to the server's (``BuildMatch``, said in the plan's
``memory_model``), and what the no-alloc check of ``llamafit.planning.bound`` did (``Bound``): the records the rules of
``llamafit.memory.builds`` end in."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llamafit.memory.builds import MIRRORED, OLDEST_READ, UNKNOWN, differences, known, placed, settled
from llamafit.units import MiB

# builds held to the accuracy bench (bench/accuracy.py --server, bench/results/accuracy-b<build>.json): what
# the b11434 model gives on them
MEASURED_DRIFT = {
    9310: "weights, KV caches, recurrent state, output buffers and checkpoints exact with its rules; compute "
    "median 0.00 %, none under, at most 8 % over (gpt-oss)",
    10173: "weights, KV caches, recurrent state, output buffers, checkpoints and the MTP contexts exact with "
    "its rules; compute at most 0.04 % off, none under",
    10985: "weights, KV caches, recurrent state, output buffers and checkpoints exact with its rules; every "
    "replayed compute within 0.04 % (DeepSeek-V4 and its DSpark drafter included), none under",
}


@dataclass(frozen=True)
class BuildMatch:
    priced: int  # the build whose rules price the plan (b11434's model, that build's allocation rules)
    server: int | None  # the build the server reports (None: it does not say, or there is no server)
    sure: str  # exact | measured | unmeasured | unknown | assumed (no server to ask)
    differences: tuple[str, ...] = ()  # what the priced build allocates otherwise than b11434 (differences())
    placed: tuple[int, int] | None = None  # the builds its ggml version shipped in (a server that does not say)
    ggml: tuple[int, int, int] | None = None

    @property
    def rules(self) -> int:
        """The build a plan's settings carry: the server's own number (the rules clamp it to the builds read;
        calibration keys its records by it), the one its ggml version settles on, or UNKNOWN."""
        if self.sure == "unknown":
            return UNKNOWN
        return self.server if self.server is not None else self.priced

    @property
    def build(self) -> int | None:
        """The server's build as far as it is known: what it says, or the one its ggml version settles on."""
        if self.server is not None:
            return self.server
        return self.priced if self.placed is not None and self.sure == "placed" else None

    @property
    def message(self) -> str | None:
        """What the plan says when it is not priced for the build that runs; None when it is."""
        if self.sure in ("exact", "assumed"):
            return None
        compute = (
            "compute buffers change most between builds: the plan checks them with the binary's no-alloc load "
            "where llama-fit-params is beside it, else the margin covers a difference until your first launch "
            "calibrates it"
        )
        if self.placed is not None and self.ggml is not None:
            lo, hi = self.placed
            span = f"at b{lo}-b{hi}" if lo < hi else f"at b{lo}" if OLDEST_READ < lo < MIRRORED else None
            span = span or (
                f"before b{OLDEST_READ}, the oldest build read" if lo <= OLDEST_READ else f"after b{MIRRORED}"
            )
            where = f"its ggml {'.'.join(map(str, self.ggml))} places it {span}"
            if self.sure == "placed":
                what = "; ".join(self.differences) or "as b11434 allocates"
                said = f"this llama-server does not say its build; {where}"
                return f"{said}: priced with b{self.priced}'s rules ({what}); {compute}"
            return (
                f"this llama-server does not say its build; {where}, and what llama.cpp allocates changed between "
                f"those: llamafit priced b{self.priced}'s allocations (an MTP context's cache in the larger of -ctk "
                f"and -ctkd); {compute}"
            )
        if self.server is None:
            return (
                f"this llama-server does not say its build; llamafit priced llama.cpp b{self.priced}'s allocations "
                f"(an MTP context's cache in the larger of -ctk and -ctkd, as builds differ there); {compute}"
            )
        age = "older" if self.server < MIRRORED else "newer"
        head = f"this llama-server is b{self.server}, {age} than the b{MIRRORED} llamafit mirrors"
        if self.differences:
            head += f"; priced with what b{self.priced} allocates otherwise: " + "; ".join(self.differences)
        elif self.priced != self.server:
            head += f"; priced with b{self.priced}'s rules, the nearest build whose source was read"
        if self.sure == "measured":
            return f"{head}; measured on b{self.server}: {MEASURED_DRIFT[self.server]}"
        return f"{head}; {compute}"


def match(
    server_build: int | None,
    probed: bool = True,
    arch: str = "",
    ggml: tuple[int, int, int] | None = None,
    nextn: bool = True,
) -> BuildMatch:
    """How the build a plan is priced for relates to the server's (``probed``: a server was asked) for a
    model of ``arch`` (``nextn``: with NextN layers); ``ggml``: the library version beside a server that does
    not say its build."""
    if not probed:
        return BuildMatch(MIRRORED, None, "assumed")
    if server_build is None and ggml is not None:
        span = placed(ggml)
        if (b := settled(*span, arch, nextn)) == UNKNOWN:
            return BuildMatch(MIRRORED, None, "unknown", placed=span, ggml=ggml)
        return BuildMatch(known(b), None, "placed", differences(b, arch, nextn), span, ggml)
    if server_build is None:
        return BuildMatch(MIRRORED, None, "unknown")
    if server_build == MIRRORED:
        return BuildMatch(MIRRORED, server_build, "exact")
    sure = "measured" if server_build in MEASURED_DRIFT else "unmeasured"
    return BuildMatch(known(server_build), server_build, sure, differences(server_build, arch, nextn))


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
    kind: str = ""  # upper | own (llamafit.planning.bound.floor_kind)
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
        scaled = ", ".join(f"{b} x {f:.3f}, {(f - 1) * 100:+.0f} % over the model's own" for b, f in self.scale.items())
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
