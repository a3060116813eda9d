"""Bound a plan by the server binary's own no-alloc measurement where the memory model is not sure of it.

The model mirrors one build's allocations (llamafit.memory.builds) and replays the graphs it has builders
for. Where the compute is the per-phase estimate, or the server is another build, the plan is checked
against what that binary's llama-fit-params measures with ``no_alloc`` (llamafit.server.fitprint).

llama-fit-params cannot be given every server setting: it takes no ``-kvu`` and reserves a whole ubatch of
outputs where the server (from b9464) reserves one per slot. It is run at the settings it can reproduce (a
unified cache as one stream of it, or as S streams of the whole context where the graph has per-sequence
parts: ``noalloc_context``), what the model says the server's own settings cost more is added (a unified
sliding window, a drafter's rows), and the extra outputs are kept: an upper bound, at a cost of up to
(n_ubatch - S) rows of logits on the output device where the output is the graph's peak. The plan's compute
buffers are raised to it where they are below (a scale, applied like a launch's calibration), the plan made
again and measured again until it is within. On a build before b9464 the measurement is that build's own
reservation (``floor_kind``): where nothing was added to it, the plan takes it, lower too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from llamafit.errors import DoesNotFitError, LlamafitError
from llamafit.fit.plan import Plan
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends
from llamafit.memory.build_match import Bound
from llamafit.memory.builds import MIRRORED, OLDEST_READ, OUTPUTS_PER_SLOT_SINCE
from llamafit.memory.footprint import LoadSettings, Pricing, estimate
from llamafit.memory.placement import CPU
from llamafit.paths import cache_dir
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.server.capabilities import probe
from llamafit.server.environment import child_env
from llamafit.units import MiB

ROUNDS = 3  # measure, re-plan, measure again: the scale settles in one or two
SLACK = 16 << 10  # the log's two decimals of MiB (5 KiB) and a little more: not worth a lower plan
LOG_ROUNDING = 5 << 10  # half of the log's 0.01 MiB: above it the measurement is more than the plan
# what the server's argv says that llama-fit-params is told by llamafit, or that would hide the log it is read from
_SET_HERE = frozenset(
    {
        "--model",
        "--ctx-size",
        "--parallel",
        "--kv-unified",
        "--fit-print",
        "--verbose",
        "--verbosity",
        "--log-jsonl",
        "--log-disable",
        "--log-file",
    }
)


def reasons(plan: Plan) -> tuple[str, ...]:
    """Why this plan's compute should be held to the binary's own measurement (none: it is replayed with the
    rules of the server's build, or a launch of it on this machine corrected every compute buffer it has).

    A replayed graph on another build read from source (OLDEST_READ to b11434, or placed in a span of them
    with no rule changing inside) is priced by that build's rules, held to the real servers of the builds the
    accuracy bench ran: no bound. An estimated graph, a build outside that range or one that cannot be placed
    is held to the measurement."""
    target = {b.buft for b in plan.footprint.buffers if b.kind == "compute" and b.context == "target"}
    if target and target <= set(plan.calibrated_compute):
        return ()
    out = []
    if not plan.footprint.compute_replayed:
        out.append(f"{plan.model.arch}'s compute is estimated, no replay builds its graph")
    b = plan.memory_build
    if b is not None and b.sure == "unknown":
        said = f"b{b.server}" if b.server is not None else "a build it does not say"
        out.append(f"the server is {said}, which the rules cannot place (priced as b{MIRRORED})")
    elif b is not None and b.server is not None and not OLDEST_READ <= b.server <= MIRRORED:
        out.append(
            f"the server is b{b.server}, outside the builds the rules were read from (b{OLDEST_READ}-b{MIRRORED})"
        )
    return tuple(out)


def per_sequence(model: ModelInfo) -> bool:
    """The graph has per-sequence parts that S streams of a cache keep apart and one stream would not:
    recurrent state, DeepSeek-V4's compressors."""
    return any(model.hparams.is_recr) or model.hparams.arch == "deepseek4"


def noalloc_context(s: LoadSettings, n_ctx: int, per_seq: bool) -> tuple[int, int]:
    """llama-fit-params' -np and -c for a load with ``s`` at ``n_ctx`` (it takes no -kvu). A unified cache of S
    slots becomes one stream of the whole context where the graph has no per-sequence part (the attention
    spans the same cells; S streams would cost a GPU backend more: 86 against 38 MiB on Vulkan), and S streams
    of the whole context each where it has one (recurrent state, DeepSeek-V4's compressors: one stream is
    under there, 18.17 against 20.17 MiB)."""
    streams = max(1, s.n_seq)
    if not s.kv_unified or streams == 1:
        return streams, n_ctx
    return (streams, n_ctx * streams) if per_seq else (1, n_ctx)


def noalloc_settings(plan: Plan) -> tuple[LoadSettings, list[str]]:
    """The settings llama-fit-params is run at, for the model to price too, and its -c/-np."""
    s = plan.settings
    n_seq, c = noalloc_context(s, plan.n_ctx, per_sequence(plan.model))
    # n_outputs_max 0 is n_batch: common_context_params leave it unset (src/llama-context.cpp:252)
    fp = replace(_undrafted(s), n_ctx=c, n_seq=n_seq, kv_unified=False, n_outputs_max=0)
    return fp, ["-c", str(c), "-np", str(n_seq)]


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
    pricing = Pricing(free=[g.free for g in gpus], limits={g.id: g.max_tensor for g in gpus if g.max_tensor})
    fp = estimate(model, s, [g.id for g in gpus], pricing)
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
    # imported here: most plans are not held to a measurement (``reasons``), and a plan's time counts its imports
    from llamafit.server.fitprint import NAME, NoAllocFailed, beside, measure

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
        at_fp, fp_args = noalloc_settings(plan)
        args = [*noalloc_args(plan.model.path, argv[1:], fit_caps.accepts), *fp_args]
        try:
            m = measure(fitparams, args, env)
        except NoAllocFailed as e:
            return plan, list(argv), replace(last, note=str(e), binary=None)
        pred = plan.footprint.own_compute()  # what the plan priced, before the scale
        seen = dict(m.compute) if m.logged else from_table(m.table, pred, plan)
        floor = held_to(seen, pred, plan, at_fp)
        # an upper bound only raises; a build's own reservation at the server's own settings (nothing added for
        # what llama-fit-params cannot set: -kvu, samplers, a drafter's rows) is the buffer itself, up or down
        own = {b for b, v in floor.items() if kind == "own" and v == seen.get(b)}
        now = {b: pred[b] * scale.get(b, 1.0) for b in floor if pred.get(b)}
        raised = {
            b: floor[b] / pred[b]
            for b, v in now.items()
            if floor[b] > v + LOG_ROUNDING or (b in own and floor[b] < v - SLACK)
        }
        unmatched = sorted(set(seen) - set(pred))
        note = f"buffers the model does not name: {', '.join(unmatched)}" if unmatched else ""
        if not m.logged:
            note = "its log lost the compute lines: its table's whole MiB, one more each" + (
                f"; {note}" if note else ""
            )
        last = Bound(why, fitparams, m.argv, seen, pred, dict(scale), rounds, note, kind, floor)
        if not raised:
            break
        if rounds == ROUNDS:
            return plan, list(argv), replace(last, note=f"still above the plan after {ROUNDS} rounds")
        scale.update({b: f if b in own else max(f, scale.get(b, 1.0)) for b, f in raised.items()})
        try:
            plan, argv = replan(dict(scale))
        except DoesNotFitError as e:  # it fitted as the model priced it: say what made it not
            raised_to = ", ".join(f"{b} {floor[b] / MiB:.2f} MiB" for b in raised)
            raise e.but(message=f"{e.message} (with its compute raised to what {NAME} measured: {raised_to})") from e
    return plan, list(argv), last


def from_table(table: Mapping[str, int], pred: Mapping[str, int], plan: Plan) -> dict[str, int]:
    """The plan's compute buffers from llama-fit-params' table: each device's floored MiB plus one (above
    what it measured); the host's row for the host buffer. A buffer on a device it does not list is left out."""
    names = {v: k for k, v in plan.buffer_aliases.items()}  # device id -> the name llama.cpp gives it (RPC)
    out = {}
    for buft in pred:
        dev = backends.device_of_buffer(buft)
        row = "Host" if dev == CPU else next((r for r in (dev, names.get(dev)) if r in table), None)
        if row is not None and row in table:
            out[buft] = (table[row] + 1) * MiB
    return out


def floor_kind(plan: Plan) -> str:
    """How the measurement stands to the server's compute. ``own``: a build before b9464, whose server
    reserved a whole ubatch of outputs as llama-fit-params does: the measurement is that build's own
    reservation. ``upper``: a later build reserves one output per slot (and one that does not say is taken
    as one), so the measurement is above it by up to the extra rows of logits. Taking the replay's price of
    those rows off would not stay a bound: on b10985 four plans would be 0.6 to 18 % under, where that build
    grew a phase the extra outputs hide (bench/README.md, Drift)."""
    b = plan.memory_build
    return "own" if b is not None and b.build is not None and b.build < OUTPUTS_PER_SLOT_SINCE else "upper"


def held_to(measured: Mapping[str, int], pred: Mapping[str, int], plan: Plan, noalloc: LoadSettings) -> dict[str, int]:
    """What the plan's compute is held to: ``measured`` (at llama-fit-params' settings, ``noalloc``) and what the
    model says the server's settings cost more than those (a unified sliding-window cache spans more cells
    than S streams of it do; a drafter's verification rows), never what they cost less."""
    s = plan.settings
    at_fp = predicted_compute(plan.model, plan, noalloc)
    outs = s.n_outputs_max if s.n_outputs_max >= s.n_batch else min(s.n_batch, s.n_seq)  # pooled: all of a batch
    unspec = predicted_compute(plan.model, plan, replace(_undrafted(s), n_outputs_max=outs))
    # the layer inputs a drafter reads stay alive to the graph's end (graph outputs, src/llama-graph.cpp:1406-1414):
    # an estimate does not place them, so each device holding layers is given them all
    kept = 0 if plan.footprint.compute_replayed else 4 * plan.model.hparams.n_embd * s.n_ubatch * s.extract_hidden
    out = {}
    for b, v in measured.items():
        unified = max(0, unspec.get(b, 0) - at_fp.get(b, 0))
        spec = max(0, pred.get(b, 0) - unspec.get(b, 0))
        out[b] = v + unified + spec + (kept if b in pred else 0)
    return out


def _undrafted(s: LoadSettings) -> LoadSettings:
    """``s`` without what a drafter adds to the target's context (llama-fit-params loads no drafter) and
    without backend samplers (it parses -bs, but only a server sets the slots' chains: b9310's measured 312.75
    MiB where its server took 618.09)."""
    return replace(
        s, n_rs_seq=0, sampled_rows=0, sampler_chain=(), backend_sampling=False, load_nextn=False, extract_hidden=0
    )
