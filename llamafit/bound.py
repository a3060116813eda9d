"""Bound a plan by the server binary's own no-alloc measurement where the memory model is not sure of it.

The model mirrors one build's allocations (llamafit.memory.builds) and replays the graphs it has builders
for. Where the compute is the per-phase estimate, or the server is another build, the plan is checked
against what that binary's llama-fit-params measures with ``no_alloc`` (llamafit.server.fitprint).

llama-fit-params cannot be given every server setting: it takes no ``-kvu`` and reserves ``n_batch``
outputs where the server reserves one per slot. It is run at the settings it can reproduce (a unified
cache of S slots becomes S streams of the whole context each: every stream spans what the unified one
does, but for a sliding window: what the server's settings cost more is added from the model), with more
outputs than the server will reserve: an upper bound. For a graph llamafit replays on a build known to
reserve one output per slot, the replay prices those extra outputs and they are taken off; otherwise they
stay, which costs up to (n_ubatch - S) rows of logits on the output device where the output is the
graph's peak. The plan's compute buffers are raised to it where they are below (a scale, applied like a
launch's calibration, never down), the plan made again and measured again until it is within.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from llamafit.errors import LlamafitError
from llamafit.fit import messages
from llamafit.gguf.hparams import ESTIMATED_COMPUTE_ARCHS
from llamafit.gguf.model import ModelInfo
from llamafit.memory.builds import OUTPUTS_PER_SLOT_SINCE, Bound
from llamafit.memory.footprint import LoadSettings, estimate
from llamafit.paths import cache_dir
from llamafit.plan import Plan
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.server.capabilities import probe
from llamafit.server.environment import child_env
from llamafit.server.fitprint import NAME, NoAllocFailed, beside, measure

ROUNDS = 3  # measure, re-plan, measure again: the scale settles in one or two
SLACK = 16 << 10  # the log's two decimals of MiB (5 KiB) and a little more: not a difference
# what the server's argv says that llama-fit-params is told by llamafit or cannot take at all
_SET_HERE = frozenset({"--model", "--ctx-size", "--parallel", "--kv-unified", "--fit-print", "--verbose"})


def reasons(plan: Plan) -> tuple[str, ...]:
    """Why this plan's compute should be held to the binary's own measurement (none: it is replayed for this build)."""
    out = []
    if not plan.footprint.compute_replayed:
        out.append(f"{plan.model.arch}'s compute is estimated, no replay builds its graph")
    b = plan.memory_build
    if b is not None and b.sure in ("unknown", "unmeasured", "measured"):
        said = f"b{b.server}" if b.server is not None else "a build it does not say"
        out.append(f"the server is {said}, the model mirrors b{b.priced}")
    return tuple(out)


def noalloc_context(s: LoadSettings, n_ctx: int) -> list[str]:
    """llama-fit-params' -c/-np for a load with ``s`` at ``n_ctx``: a unified cache of S slots becomes S
    streams of the whole context each (it takes no -kvu), so every stream spans what the unified one does."""
    streams = max(1, s.n_seq)
    c = n_ctx * streams if s.kv_unified and streams > 1 else n_ctx
    return ["-c", str(c), "-np", str(streams)]


def noalloc_args(model_path: str, server_args: Sequence[str], accepts: Callable[[str], bool]) -> list[str]:
    """The server's flags llama-fit-params takes (placement, batch, cache types, ...), after ``-m``."""
    out = ["-m", model_path]
    for o in parse_server_args(server_args).items:
        if o.option is None or o.key in _SET_HERE:
            continue
        if any(accepts(a) for a in o.option.aliases):
            out += list(o.tokens)
    return out


def predicted_compute(model: ModelInfo, plan: Plan, s: LoadSettings) -> dict[str, int]:
    """The memory model's compute buffers for ``s`` on the plan's devices (no calibration)."""
    gpus = [d.device for d in plan.devices]
    fp = estimate(
        model,
        s,
        [g.id for g in gpus],
        free=[g.free for g in gpus],
        limits={g.id: g.max_tensor for g in gpus if g.max_tensor},
    )
    return {b.buft: b.nbytes for b in fp.buffers if b.kind == "compute" and b.context == "target"}


def bounded(
    plan: Plan,
    argv: Sequence[str],
    replan: Callable[[Mapping[str, float]], tuple[Plan, list[str]]],
    srv: ServerBinary,
    why: tuple[str, ...],
) -> tuple[Plan, list[str], Bound]:
    """Hold ``plan`` (made with no scale, composed as ``argv``) to the measurement of the llama-fit-params
    beside ``srv``. ``replan(scale)`` makes the plan again with its compute buffers scaled."""
    if not os.path.isfile(plan.model.path):
        note = "the model is not downloaded yet (run measures it once it is)"
        return plan, list(argv), Bound(why, note=note, after_download=True)
    fitparams = beside(srv.path)
    if fitparams is None:
        return plan, list(argv), Bound(why, note=f"there is no {NAME} beside {srv.path}")
    env = child_env(srv.env()).env
    try:
        fit_caps = probe(fitparams, env=env, cache_dir=cache_dir())
    except LlamafitError as e:
        return plan, list(argv), Bound(why, note=f"{fitparams} did not answer: {e.message}")
    kind = floor_kind(plan)
    scale: dict[str, float] = {}
    last = Bound(why)
    for rounds in range(1, ROUNDS + 1):
        args = [*noalloc_args(plan.model.path, argv[1:], fit_caps.accepts), *noalloc_context(plan.settings, plan.n_ctx)]
        try:
            m = measure(fitparams, args, env)
        except NoAllocFailed as e:
            return plan, list(argv), replace(last, note=str(e), binary=None)
        pred = predicted_compute(plan.model, plan, plan.settings)
        floor = held_to(kind, m.compute, pred, plan)
        raised = {b: v / pred[b] for b, v in floor.items() if pred.get(b) and v > pred[b] * scale.get(b, 1.0) + SLACK}
        unmatched = sorted(set(m.compute) - set(pred))
        note = f"buffers the model does not name: {', '.join(unmatched)}" if unmatched else ""
        last = Bound(why, fitparams, m.argv, dict(m.compute), pred, dict(scale), rounds, note, kind, floor)
        if not raised:
            break
        if rounds == ROUNDS:
            return plan, list(argv), replace(last, note=f"still above the plan after {ROUNDS} rounds")
        scale.update({b: max(f, scale.get(b, 1.0)) for b, f in raised.items()})
        plan, argv = replan(dict(scale))
    return _without_estimate_warning(plan), list(argv), last


def floor_kind(plan: Plan) -> str:
    """``transferred``: the measurement less what its extra outputs cost, priced by the replay (a build known to
    reserve one output per slot, as b11434 does); ``upper``: the measurement with its extra outputs kept, an
    upper bound (a graph the model only estimates, a build that does not say, or one that reserves every
    token's outputs as llama-fit-params does)."""
    b = plan.memory_build
    if not plan.footprint.compute_replayed or b is None or b.server is None:
        return "upper"
    return "transferred" if b.server >= OUTPUTS_PER_SLOT_SINCE else "upper"


def held_to(kind: str, measured: Mapping[str, int], pred: Mapping[str, int], plan: Plan) -> dict[str, int]:
    """What the plan's compute is held to: ``measured`` (at llama-fit-params' settings) moved to the server's
    by the model's own difference between the two. ``transferred`` takes the whole difference; ``upper``
    only what the server's settings cost more (a unified sliding-window cache spans more cells than S
    streams of it do), never what they cost less."""
    s_fp = replace(
        plan.settings,
        n_ctx=int(noalloc_context(plan.settings, plan.n_ctx)[1]),
        kv_unified=False,
        n_outputs_max=0,  # n_batch: common_context_params leave it unset (src/llama-context.cpp:252)
        n_rs_seq=0,
        sampled_rows=0,
        sampler_chain=(),
        load_nextn=False,
    )
    at_fp = predicted_compute(plan.model, plan, s_fp)
    out = {}
    for b, v in measured.items():
        more = pred.get(b, 0) - at_fp.get(b, 0)
        out[b] = v + (more if kind == "transferred" else max(0, more))
    return out


def _without_estimate_warning(plan: Plan) -> Plan:
    """Held to the binary's measurement, the estimated compute no longer needs the margin's cover."""
    if (measured := ESTIMATED_COMPUTE_ARCHS.get(plan.model.arch)) is None:
        return plan
    said = messages.estimated_compute(plan.model.arch, measured)
    return replace(plan, warnings=tuple(w for w in plan.warnings if w != said))
