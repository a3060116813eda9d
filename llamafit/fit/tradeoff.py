"""The context-speed trade-off as a plan shows it: the rows the choice weighed (``llamafit.fit.choice``) as
llama-server flags, where the weights go and the device with the least room, and the words of the decisions the
choice made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llamafit.fit.plan import Decision, Tradeoff
from llamafit.fit.search import Search, Trial
from llamafit.memory.placement import CPU, whole_expert_layers
from llamafit.server.args import Planned
from llamafit.speed.prediction import Speed

FlagsOf = Callable[[Trial], list[Planned]]  # a trial's placement as the flags a plan would pass


@dataclass(frozen=True)
class Row:
    """One context the choice weighed: the ladder and step of its fastest placement (``llamafit.fit.choice``)."""

    ladder: str
    step: int
    trial: Trial
    chosen: bool


PLACEMENT_FAMILIES = ("ctx", "ngl", "split", "overrides")  # the flags a row differs by


def placement_ffn(m: int, n_layer: int, output_on_cpu: bool, on: str) -> Decision:
    out = " and the output tensor" if output_on_cpu else ""
    return Decision(
        "placement.ffn",
        f"The FFN weights (up, gate, down) of the first {m} of {n_layer} layers{out} on the CPU (--n-cpu-ffn {m}); "
        f"attention and its cache, and everything else, on {on}.",
    )


def placement_layers_cmoe(ngl: int, units: int, on: str) -> Decision:
    return Decision(
        "placement.partial",
        f"Every expert on the CPU, and {ngl} of {units} layers' other weights on {on} (-ngl {ngl}); the rest run on "
        "the CPU.",
    )


def host_end(d: Decision, gpus_end: str, gpus_tg: float, tg: float, on: str) -> Decision:
    """``d``, a placement that keeps more on the CPU than the GPUs hold, and why: it is predicted faster."""
    return Decision(
        d.code,
        f"{d.message} Predicted faster than the most {on} holds here ({gpus_end}: {gpus_tg:.1f} tok/s against "
        f"{tg:.1f}): what would move there runs slower on it than on the host, or costs more to reach than it saves.",
    )


def context_for_speed(
    n_ctx: int, largest: int, tg: float, fastest: tuple[float, int], prefer: str, share: float
) -> Decision:
    """The context is below what the machine holds because speed chose it: by how much, and the other ends."""
    if prefer == "speed":
        text = (
            f"Context {n_ctx}: the largest the fastest placement holds (--prefer speed: {tg:.1f} tok/s predicted); "
            f"this machine holds {largest} with more on the CPU (--prefer context)."
        )
    else:
        text = (
            f"Context {n_ctx} of the {largest} this machine holds: the largest at which generation keeps "
            f"{share:.0%} of the fastest placement's speed ({tg:.1f} against {fastest[0]:.1f} tok/s at "
            f"{fastest[1]}); --prefer context takes {largest}, --prefer speed the fastest."
        )
    return Decision("context.reduced", text)


def short_where(r: Row, search: Search) -> str:
    """Where a row's weights go, in a few words."""
    hp = search.model.hparams
    s, units = r.trial.settings, hp.n_layer_all + 1
    ngl = s.n_gpu_layers if s.n_gpu_layers >= 0 else units
    if r.ladder == "experts":
        return f"experts of {_whole_experts(r.trial)} of {hp.n_layer} layers on the CPU"
    if r.ladder in ("ffn", "ffn-out"):
        return f"FFN of {r.step} of {hp.n_layer} layers{' and the output' if ngl < units else ''} on the CPU"
    if r.ladder == "layers-cmoe":
        return f"every expert and {units - ngl} of {units} layers on the CPU"
    return "all on the GPUs" if ngl >= units else f"{ngl} of {units} layers on the GPUs"


def _whole_experts(t: Trial) -> int:
    return whole_expert_layers(t.settings.overrides)[0]


def tightest(t: Trial, search: Search) -> tuple[str, int]:
    """The device with the least room left under the load (host RAM as ``host``), and that room."""
    rooms = [(g, search.usable[g] - t.total(g)) for g in search.ids]
    rooms.append(("host", search.host_usable - t.total(CPU) - search.unified_use(t.fp, t.extra)))
    return min(rooms, key=lambda r: r[1])


def rows(
    weighed: Sequence[Row], final: Trial, search: Search, flags_of: FlagsOf, speed_of: Callable[[Trial], Speed]
) -> tuple[Tradeoff, ...]:
    """The plan's trade-off rows, each with its speed as the choice weighed it (the planner's last stage prices them
    again with what was measured since); the chosen one carries the plan's own final trial (its split made faster, a
    drafter beside it, its context cut for the drafter under --prefer speed)."""
    out = []
    for r in weighed:
        t = final if r.chosen else r.trial
        dev, room = tightest(t, search)
        words = tuple(w for p in flags_of(t) if p.family in PLACEMENT_FAMILIES for w in p.tokens)
        where = short_where(Row(r.ladder, r.step, t, r.chosen), search)
        out.append(Tradeoff(t.fp.context.n_ctx, where, words, dev, room, r.chosen, t.settings, t.fp, speed_of(t)))
    return tuple(sorted(out, key=lambda x: x.n_ctx))
