"""The families of placements the choice by speed weighs (``llamafit.fit.choice``), each a ladder of steps from
the fastest to the most offloaded: the GPUs hold less along it, the host more.

* ``layers``: whole layers on the CPU, the first ones first (``-ngl N``, down to ``-ngl 0``);
* ``ffn``: every layer on the GPUs, the dense FFN weights (up, gate, down) of the first m layers on the CPU
  (``--n-cpu-ffn m``), attention and its cache staying on the GPUs (the order llama.cpp PR #26622 measured to keep
  the most speed); ``ffn-out`` the same with the output tensor on the CPU too;
* ``experts``: the experts of the first k layers on the CPU (``--n-cpu-moe k``), everything else on the GPUs;
* ``layers-cmoe``: every expert on the CPU and whole layers too (a MoE whose attention does not fit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from llamafit.fit.search import Search
from llamafit.memory.footprint import LoadSettings
from llamafit.memory.placement import experts_on_cpu, n_cpu_ffn_overrides


@dataclass(frozen=True)
class Ladder:
    """One family of placements: step ``x`` from ``first`` (the fastest) to ``last`` (the most offloaded)."""

    name: str
    first: int
    last: int
    at: Callable[[LoadSettings, int], tuple[LoadSettings, int]]  # (settings with its overrides, GPU layers)


def ladders(search: Search) -> list[Ladder]:
    """The families that apply to the model: layers always; FFN first for a dense model; experts for a MoE."""
    hp = search.model.hparams
    units = hp.n_layer_all + 1  # the output counts as one (llama.cpp's -ngl)

    def layers(s: LoadSettings, x: int) -> tuple[LoadSettings, int]:
        return replace(s, overrides=()), units - x

    out = [Ladder("layers", 0, units, layers)]
    if hp.n_expert > 0:

        def experts(s: LoadSettings, x: int) -> tuple[LoadSettings, int]:
            return replace(s, overrides=experts_on_cpu(x)), units

        def layers_cmoe(s: LoadSettings, x: int) -> tuple[LoadSettings, int]:
            return replace(s, overrides=experts_on_cpu(hp.n_layer)), units - x

        out += [Ladder("experts", 1, hp.n_layer, experts), Ladder("layers-cmoe", 1, units, layers_cmoe)]
    elif any(t.layer is not None and _dense_ffn(t.name) for t in search.model.tensors):

        def ffn(s: LoadSettings, x: int) -> tuple[LoadSettings, int]:
            return replace(s, overrides=n_cpu_ffn_overrides(x)), units

        def ffn_out(s: LoadSettings, x: int) -> tuple[LoadSettings, int]:
            return replace(s, overrides=n_cpu_ffn_overrides(x)), units - 1

        out += [Ladder("ffn", 1, hp.n_layer, ffn), Ladder("ffn-out", 0, hp.n_layer, ffn_out)]
    return out


def _dense_ffn(name: str) -> bool:
    return any(f".ffn_{p}." in name for p in ("up", "gate", "down"))
