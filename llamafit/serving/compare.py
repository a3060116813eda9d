"""Predicted against actual: line a plan's buffers up with what the server logged."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llamafit.memory.footprint import Footprint
from llamafit.memory.mmproj import MmprojUse
from llamafit.server.logparse import LoadLog
from llamafit.units import MiB

# How far a term may be off before it is flagged. KV, recurrent state, weights and the output buffer
# are modelled exactly (to the log's 0.01 MiB); the compute buffer is replayed or estimated (memory/compute.py).
TOLERANCE = {"model": 0.0, "kv": 0.0, "rs": 0.0, "output": 0.0, "compute": 0.10}


@dataclass(frozen=True)
class Row:
    context: str
    kind: str
    buft: str
    predicted: int  # bytes
    actual_mib: float | None  # as logged; None when the server logged no such buffer
    n_logged: int = 1  # how many logged lines were summed (each is rounded to 0.01 MiB)

    @property
    def diff_mib(self) -> float | None:
        return None if self.actual_mib is None else self.predicted / MiB - self.actual_mib

    @property
    def within(self) -> bool:
        if self.actual_mib is None:
            return self.predicted < 0.005 * MiB
        tol = TOLERANCE.get(self.kind, 0.0)
        err = abs(self.predicted / MiB - self.actual_mib)
        return err <= 0.0051 * max(self.n_logged, 1) or (tol > 0 and err <= tol * max(self.actual_mib, 1e-9))


def compare(
    fp: Footprint,
    log: LoadLog,
    context: str = "target",
    aliases: Mapping[str, str] | None = None,
    logged: str | None = None,
) -> list[Row]:
    """``aliases``: logged buffer names that differ from the plan's device ids (RPC: ``RPC0[host:port]``);
    ``logged``: the context's label in the log where it is not the plan's (an MTP assistant loaded as a draft model)."""
    ctx = log.context(logged or context)
    model = log.model(logged or context)
    observed: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], int] = {}
    names = aliases or {}

    def see(kind: str, buft: str, mib: float) -> None:
        buft = names.get(buft, buft)
        observed[(kind, buft)] = observed.get((kind, buft), 0.0) + mib
        counts[(kind, buft)] = counts.get((kind, buft), 0) + 1

    if model is not None:
        for buft, mib in model.buffers:
            see("model", buft, mib)
    if ctx is not None:
        for buft, mib in ctx.kv:
            see("kv", buft, mib)
        for buft, mib in ctx.rs:
            see("rs", buft, mib)
        for buft, mib in ctx.compute.items():
            see("compute", buft, mib)
        for buft, mib in ctx.output:
            see("output", buft, mib)
    predicted: dict[tuple[str, str], int] = {}
    for b in fp.buffers:
        if b.context == context:
            predicted[(b.kind, b.buft)] = predicted.get((b.kind, b.buft), 0) + b.nbytes
    rows = []
    for key in sorted(set(predicted) | set(observed)):
        kind, buft = key
        rows.append(Row(context, kind, buft, predicted.get(key, 0), observed.get(key), counts.get(key, 1)))
    return rows


def compare_mmproj(m: MmprojUse, log: LoadLog, aliases: Mapping[str, str] | None = None) -> list[Row]:
    """The projector's weights and warmup compute against its clip contexts (vision and audio summed)."""
    names = aliases or {}
    clips = log.mmproj
    weights = [c.weights_mib for c in clips if c.weights_mib is not None]
    rows = [Row("mmproj", "model", m.buft, m.weights, sum(weights) if weights else None, max(len(weights), 1))]
    observed: dict[str, float] = {}
    for c in clips:
        for buft, mib in c.compute.items():
            buft = names.get(buft, buft)
            observed[buft] = observed.get(buft, 0.0) + mib
    if not observed:
        return rows  # --no-warmup: the compute buffer is reserved at the first image, not at load
    for buft in sorted({m.buft} | set(observed)):
        rows.append(Row("mmproj", "compute", buft, m.compute if buft == m.buft else 0, observed.get(buft)))
    return rows
