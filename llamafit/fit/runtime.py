"""Host memory that grows after the load: context checkpoints and the prompt cache, chosen to fit.

llama-server keeps up to ``--ctx-checkpoints`` (default 32) checkpoints per slot for sliding-window,
recurrent and hybrid models and for rollback-capable drafters, each the partial state of one sequence
(target and drafter, server-context.cpp:2513-2575; sized by ``checkpoint_bytes``), and a prompt cache
of saved slot states that it keeps within ``--cache-ram`` MiB (default 8192; room is made before a
state is added, server-task.cpp:1740-1770). After the load both must fit in the host RAM the load
leaves, less the margin; when llama-server's defaults would not, llamafit chooses the largest
``--ctx-checkpoints`` that fits (at least 1 where the model needs them) and gives the prompt cache the
rest. A value the user passes wins and is checked (docs/memory-model.md §5.5).
"""

from __future__ import annotations

from llamafit.fit import messages
from llamafit.fit.plan import RuntimeHost
from llamafit.fit.request import DEFAULT_CACHE_RAM_MIB, DEFAULT_CTX_CHECKPOINTS, Request
from llamafit.fit.search import Search, Trial
from llamafit.gguf.model import ModelInfo
from llamafit.memory.context import checkpoint_bytes, draft_checkpoint_bytes
from llamafit.memory.footprint import Use
from llamafit.memory.placement import CPU
from llamafit.server.args import Planned
from llamafit.speculative import SpecConfig
from llamafit.units import MiB


def plan_runtime(model: ModelInfo, t: Trial, spec: SpecConfig, req: Request, search: Search) -> RuntimeHost:
    hp = model.hparams
    cp = t.fp.context
    needs = (hp.swa_type != "none" and not cp.swa_full) or any(hp.is_recr) or cp.n_rs_seq > 0
    ckpt = checkpoint_bytes(hp, cp) + _drafter_state(spec, t) if needs else 0
    # speculative decoding on a context that cannot remove tokens keeps one more (server-context.cpp:3229-3305)
    extra = 1 if spec.drafter is not None and any(hp.is_recr) else 0
    unified = search.unified_use(t.fp, t.extra)
    room = search.host_usable - (t.fp.host.total + t.extra.get(CPU, Use()).total + unified)
    user_ckpt, user_cache = req.ctx_checkpoints is not None, req.cache_ram_mib is not None
    n = (DEFAULT_CTX_CHECKPOINTS if req.ctx_checkpoints is None else req.ctx_checkpoints) if needs else 0
    slots, cache = cp.n_seq_max, DEFAULT_CACHE_RAM_MIB if req.cache_ram_mib is None else req.cache_ram_mib

    def kept(n: int) -> int:  # checkpoints the server keeps per slot with --ctx-checkpoints n
        return n + extra if n else 0

    def growth(n: int, cache_mib: int) -> int:
        return slots * kept(n) * ckpt + max(cache_mib, 0) * MiB

    flags: list[Planned] = []
    warnings: list[str] = []
    decision = None
    if cache < 0:
        # no limit on the prompt cache: the checkpoints must still fit (what they leave, the cache may take)
        if growth(n, 0) > room and not user_ckpt and needs:
            n_fit = max(1, min(n, room // max(1, slots * ckpt) - extra))
            if n_fit != n:
                flags.append(Planned("ctx-checkpoints", ("--ctx-checkpoints", str(n_fit))))
                decision = messages.runtime_chosen(slots, kept(n_fit), ckpt, -1, room, flags)
            n = n_fit
        if growth(n, 0) > room:
            warnings.append(messages.runtime_over(slots, kept(n), ckpt, 0, room))
        warnings.append(messages.cache_unlimited(max(0, room - growth(n, 0))))
    elif growth(n, cache) > room and not (user_ckpt and user_cache):
        # checkpoints first (they save re-processing whole prompts), the prompt cache takes the rest
        if not user_ckpt and needs:
            left = room - (max(cache, 0) * MiB if user_cache else 0)
            n_fit = max(1, min(n, left // max(1, slots * ckpt) - extra))
            if n_fit != n:
                flags.append(Planned("ctx-checkpoints", ("--ctx-checkpoints", str(n_fit))))
            n = n_fit
        if not user_cache:
            cache_fit = max(0, min(cache, (room - growth(n, 0)) // MiB))
            if cache_fit != cache:
                flags.append(Planned("cache-ram", ("--cache-ram", str(cache_fit))))
            cache = cache_fit
        decision = messages.runtime_chosen(slots, kept(n), ckpt, cache * MiB, room, flags)
    if cache >= 0 and growth(n, cache) > room:
        warnings.append(messages.runtime_over(slots, kept(n), ckpt, cache * MiB, room))
    prompt_cache = cache * MiB if cache >= 0 else -1
    return RuntimeHost(ckpt, kept(n), slots, prompt_cache, room, tuple(flags), decision, tuple(warnings))


def _drafter_state(spec: SpecConfig, t: Trial) -> int:
    """A separate draft model's part of a checkpoint, at its largest (a full context)."""
    d = spec.drafter
    if d is None or d.embedded or d.model is None or t.draft is None:
        return 0
    return draft_checkpoint_bytes(d.model.hparams, t.draft.context)
