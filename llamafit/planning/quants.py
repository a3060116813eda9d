"""Which quant fits: every quant of a Hub repo (or a folder of GGUF files) planned for this machine, and
the best one that fits, found without reading every header.

A quant is one model file of the repo, a split set counting as one. For one model all quants share the
parameter count, so their order by size is their order by bits per weight (precision), whatever their
tags say (``UD-Q4_K_XL``, ``IQ4_NL``, ``MXFP4_MOE``). The fit is monotone in that order: a bigger file never
keeps more on the GPUs at the same settings. ``best`` bisects on it and plans O(log n) quants.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llamafit.errors import BadModelFileError, DoesNotFitError, LlamafitError, ModelNotFoundError, UsageError
from llamafit.fit.plan import Decision, Plan
from llamafit.fit.plan import to_json as plan_to_json
from llamafit.gguf.model import Tensor
from llamafit.gguf.naming import split_info
from llamafit.hub.resolve import Hub, is_hub_ref
from llamafit.hub.select import HubFile, is_first_shard, is_model_file, split_repo_tag
from llamafit.memory.placement import whole_expert_layers
from llamafit.options import Options
from llamafit.planning.planner import Planner
from llamafit.planning.prepared import Prepared
from llamafit.units import fmt_bytes

BEST = "best"
# placements that leave weights of some layers on the CPU although GPUs are there
_PARTIAL = ("placement.cpu_moe", "placement.partial")
_FOLDER_DEPTH = 2  # a folder's quants may sit one directory down (unsloth's BF16/, Q8_0/ for split sets)
_FOLDER_MAX_FILES = 4096


@dataclass(frozen=True)
class Quant:
    tag: str  # what tells it apart from the repo's other quants (UD-Q4_K_XL, Q8_0, ...)
    files: tuple[HubFile, ...]  # its shards, first one first; paths relative to the repo or folder

    @property
    def primary(self) -> str:
        return self.files[0].path

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class QuantSource:
    """A repo or folder and its quants, smallest first."""

    ref: str  # owner/repo, or the folder
    hub: bool
    quants: tuple[Quant, ...]

    def find(self, tag: str) -> Quant | None:
        t = tag.upper()
        return next((q for q in self.quants if q.tag.upper() == t), None) or next(
            (q for q in self.quants if (i := split_info(q.primary)) is not None and i.tag == t), None
        )


@dataclass(frozen=True)
class QuantPlan:
    """One quant planned for this machine: the plan when it fits, the refused plan when it does not,
    the error when it could not be planned at all (a broken or partial upload)."""

    quant: Quant
    prepared: Prepared | None = None
    refused: DoesNotFitError | None = None
    error: LlamafitError | None = None

    @property
    def plan(self) -> Plan | None:
        if self.prepared is not None:
            return self.prepared.plan
        return self.refused.plan if self.refused is not None else None

    @property
    def fits(self) -> bool:
        return self.prepared is not None

    @property
    def tg(self) -> float | None:
        """Generation tokens/s the plan predicts (depth 0) where it fits and has a speed."""
        sp = self.prepared.plan.speed if self.prepared is not None else None
        return sp.tg if sp is not None else None

    @property
    def full(self) -> bool:
        """Fits with every layer on the GPUs at ``--min-ctx`` or more: its plan's placement, or the fastest row of
        its trade-off where the plan traded layers for context (on a machine without GPUs, or with the placement
        pinned by the user's flags, fitting is all there is)."""
        if self.prepared is None:
            return False
        plan = self.prepared.plan
        whole = any(r.settings.n_gpu_layers < 0 and not r.settings.overrides for r in plan.tradeoffs)
        return plan.placement_code not in _PARTIAL or whole

    @property
    def n_params(self) -> int | None:
        p = self.plan
        return None if p is None else p.model.memo("n_params", lambda: _n_params(p.model.tensors))

    @property
    def bpw(self) -> float | None:
        """Bits per weight from the header: tensor bytes over the parameter count of the tensor table."""
        p, n = self.plan, self.n_params
        return None if p is None or not n else 8 * p.model.tensor_bytes / n

    @property
    def cpu_weights(self) -> int | None:
        """Weight bytes the plan leaves in host memory (the input embeddings always stay there)."""
        p = self.plan
        return None if p is None else p.host.use.model

    @property
    def placement(self) -> tuple[str, str]:
        """(decision code, a few words) of where the weights go."""
        p = self.plan
        if p is None:
            return "", ""
        if not self.fits:
            return "none", "does not fit"
        s = p.settings
        code = p.placement_code or "fit.none"
        n_all = p.model.hparams.n_layer_all
        whole, part = whole_expert_layers(s.overrides)
        words = {
            "placement.all_gpu": "all on the GPUs",
            "placement.cpu_moe": f"experts of {whole} layers{' and part of one' if part else ''} on the CPU",
            "placement.partial": f"{s.n_gpu_layers} of {n_all + 1} layers on the GPUs",
            "placement.cpu": "all on the CPU",
            "placement.user": "as your flags pin it",
        }.get(code, "placed by llama.cpp's fit")
        return code, words

    @property
    def speculative(self) -> str | None:
        """The --spec-type that runs, None for none (or when not planned)."""
        p = self.plan
        if p is None or p.speculative is None or p.speculative.chosen == "none":
            return None
        return p.speculative.chosen


def _n_params(tensors: Sequence[Tensor]) -> int:
    """Weights in the tensor table: the product of each tensor's dimensions, summed."""
    n = 0
    for t in tensors:
        k = 1
        for d in t.info.shape:
            k *= int(d)
        n += k
    return n


# -- the quants of a repo or folder ----------------------------------------------------------------


def group(files: Sequence[HubFile]) -> tuple[Quant, ...]:
    """The model files of a listing as quants (split sets kept together), smallest first."""
    firsts = [f for f in files if is_model_file(f.path) and is_first_shard(f)]
    shards: dict[tuple[str, int], list[HubFile]] = {}  # one pass, not one per set: listings run to thousands
    for f in files:
        if (i := split_info(f.path)) is not None and i.count > 1:
            shards.setdefault((i.prefix, i.count), []).append(f)
    sets = [tuple(sorted(_set_of(f, shards), key=_shard_index)) for f in firsts]
    tags = _tags([f.path for f in firsts])
    quants = [Quant(t, s) for t, s in zip(tags, sets, strict=True)]
    return tuple(sorted(quants, key=lambda q: (q.size, q.primary)))


def _set_of(first: HubFile, shards: dict[tuple[str, int], list[HubFile]]) -> list[HubFile]:
    """``split_files`` over the index ``group`` made."""
    i = split_info(first.path)
    return [first] if i is None or i.count <= 1 else shards.get((i.prefix, i.count), [first])


def _shard_index(f: HubFile) -> int:
    info = split_info(f.path)
    return info.index if info else 1


def _tags(paths: Sequence[str]) -> list[str]:
    """What tells each file apart: its name past the part all of them share (``Qwen3-8B-``), so unsloth's
    ``UD-Q4_K_XL`` keeps its prefix; llama.cpp's own tag (the last ``-`` piece) where that leaves nothing
    or repeats; the path where even that repeats (the same quant in two folders)."""
    prefixes = [i.prefix if (i := split_info(p)) else p for p in paths]
    stems = [p.rsplit("/", 1)[-1] for p in prefixes]
    own = [(i.tag if (i := split_info(p)) else "") or s for p, s in zip(paths, stems, strict=True)]
    tags = own
    if len(stems) > 1:
        common = os.path.commonprefix(stems)  # noqa: RUF071 - file names, compared by character
        cut = max(common.rfind("-"), common.rfind(".")) + 1
        tags = [s[cut:] or o for s, o in zip(stems, own, strict=True)]
    seen = Counter(tags)
    return [p if seen[t] > 1 else t for t, p in zip(tags, prefixes, strict=True)]


def folder_files(folder: Path) -> tuple[HubFile, ...]:
    """The GGUF files of a folder (and of its subfolders, one level down) as a listing, by path."""
    out: list[HubFile] = []
    base = len(folder.parts)
    for root, dirs, names in os.walk(folder):
        depth = len(Path(root).parts) - base
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth + 1 < _FOLDER_DEPTH else []
        for n in sorted(names):
            if n.endswith(".gguf"):
                p = Path(root) / n
                try:
                    out.append(HubFile(p.relative_to(folder).as_posix(), p.stat().st_size))
                except OSError:
                    continue
                if len(out) > _FOLDER_MAX_FILES:  # said, not cut: :best would choose among a part
                    raise UsageError(
                        f"{folder} holds more than {_FOLDER_MAX_FILES} GGUF files; llamafit plans at most that many",
                        hint="give the folder of one model's quants",
                    )
    return tuple(out)


def wants_quants(model: str, quant: str | None) -> bool:
    """Whether MODEL (with ``--quant``) asks for a choice among quants: ``owner/repo:best``, a folder, or
    ``--quant best``."""
    return bool(quant) or os.path.isdir(model) or (is_hub_ref(model) and model.lower().endswith(":" + BEST))


def source(model: str, hub: Hub, revision: str | None = None) -> QuantSource:
    """The repo (``owner/repo``, a ``:best`` or other tag ignored) or folder and its quants."""
    if os.path.isdir(model):
        qs = group(folder_files(Path(model)))
        if not qs:
            raise ModelNotFoundError(f"{model} holds no GGUF model files", hint="give a folder of .gguf files")
        return QuantSource(model, False, qs)
    if not is_hub_ref(model):
        raise UsageError(
            f"{model!r} is a file: quants are chosen among a repo's or a folder's files",
            hint="give owner/repo (or a folder of GGUF files), or drop --quants/--quant",
        )
    repo, _ = split_repo_tag(model)
    st = hub.state(repo, revision)
    qs = group(st.files)
    if not qs:
        raise ModelNotFoundError(f"{repo} has no GGUF model files", hint="llama-server loads GGUF models")
    return QuantSource(repo, True, qs)


QuantPlanner = Callable[[str, Options], Prepared]


def plan_quant(src: QuantSource, q: Quant, o: Options, planner: QuantPlanner) -> QuantPlan:
    """Plan one quant with the user's options; a refusal or a broken file is the row's verdict."""
    if src.hub:
        model, o = f"{src.ref}:{q.tag}", replace(o, hf_file=q.primary)
    else:
        model = str(Path(src.ref) / q.primary)
    try:
        return QuantPlan(q, prepared=planner(model, o))
    except DoesNotFitError as e:
        return QuantPlan(q, refused=e)
    except (BadModelFileError, ModelNotFoundError) as e:
        return QuantPlan(q, error=e)  # this file is broken or partly uploaded; the others may be fine


MAX_LADDER = 128  # quants one --quants plans (a header read and a plan each); real repos list under 40


def ladder(src: QuantSource, o: Options, planner: QuantPlanner) -> tuple[QuantPlan, ...]:
    """Every quant planned, smallest first; a listing of more than MAX_LADDER is refused before any is
    planned (``:best`` bisects and plans a few of any number)."""
    if len(src.quants) > MAX_LADDER:
        raise UsageError(
            f"{src.ref} lists {len(src.quants)} quants; --quants plans at most {MAX_LADDER}",
            hint=f"use {src.ref}:best (it plans a few of them), or name one with :QUANT",
        )
    return tuple(plan_quant(src, q, o, planner) for q in src.quants)


@dataclass(frozen=True)
class Choice:
    chosen: QuantPlan
    planned: tuple[QuantPlan, ...]  # the quants planned on the way, smallest first
    decision: Decision


def best(src: QuantSource, o: Options, planner: QuantPlanner) -> Choice:
    """The highest-precision quant whose plan keeps every layer on the GPUs at a context of at least
    ``--min-ctx``; if none does, the one that leaves the fewest weight bytes on the CPU (the smallest that
    fits: a smaller file leaves less). Bisection over the quants by size plans O(log n) of them. A quant
    that cannot be planned (a partial upload) is set aside and the search goes on without it.

    Raises DoesNotFitError (from the smallest quant) when none fits."""
    cands = list(src.quants)
    seen: dict[str, QuantPlan] = {}

    def at(i: int) -> QuantPlan:
        q = cands[i]
        if q.primary not in seen:
            seen[q.primary] = plan_quant(src, q, o, planner)
        return seen[q.primary]

    lo, hi = -1, len(cands)  # invariant: cands[lo] is full (or lo = -1), cands[hi] is not (or hi = n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = at(mid)
        if r.error is not None:
            del cands[mid]
            hi -= 1
            continue
        lo, hi = (mid, hi) if r.full else (lo, mid)
    if lo >= 0:
        chosen, why = at(lo), "full"
    else:
        while cands and at(0).error is not None:
            del cands[0]
        if not cands or not at(0).fits:
            raise none_fits(src, _in_order(src, seen))
        chosen, why = at(0), "smallest"
    planned = _in_order(src, seen)
    return Choice(chosen, planned, _decision(src, chosen, planned, why, o.min_ctx))


def none_fits(src: QuantSource, planned: Sequence[QuantPlan]) -> LlamafitError:
    """The one answer of ``:best`` and ``--quants`` when no quant fits: the smallest refusal (exit 3), or,
    when none could even be planned (every file broken or missing), the first file's error (exit 4)."""
    smallest = next((p for p in planned if p.refused is not None), None)
    if smallest is None or smallest.refused is None:
        err = next((p.error for p in planned if p.error is not None), None)
        return ModelNotFoundError(
            f"no quant of {src.ref} could be planned" + (f": {err.message}" if err else ""),
            hint=err.hint if err else None,
        )
    e = smallest.refused
    # the closest plan, for --json
    return e.but(message=f"no quant of {src.ref} fits; the smallest, {smallest.quant.tag}: {e.message}")


def _in_order(src: QuantSource, seen: dict[str, QuantPlan]) -> tuple[QuantPlan, ...]:
    return tuple(seen[q.primary] for q in src.quants if q.primary in seen)


def _label(p: QuantPlan) -> str:
    bpw = f", {p.bpw:.2f} bpw" if p.bpw else ""
    return f"{p.quant.tag} ({fmt_bytes(p.quant.size)}{bpw})"


def _verdict(p: QuantPlan) -> str:
    if p.error is not None:
        return f"{p.quant.tag}: not usable ({p.error.message})"
    if not p.fits:
        return f"{p.quant.tag}: does not fit"
    return f"{p.quant.tag}: {p.placement[1]}"


def _decision(src: QuantSource, chosen: QuantPlan, planned: Sequence[QuantPlan], why: str, min_ctx: int) -> Decision:
    others = "; ".join(_verdict(p) for p in planned if p is not chosen)
    n = len(src.quants)
    considered = f"{n} quants by size ({src.quants[0].tag} to {src.quants[-1].tag}), {len(planned)} planned"
    if why == "full":
        where = "keeps every layer on the GPUs" if chosen.plan and chosen.plan.devices else "fits"
        text = (
            f"Quant {_label(chosen)}: the highest precision that {where} at a context of at least {min_ctx}. "
            f"Considered {considered}"
        )
    else:
        cpu = chosen.cpu_weights or 0
        text = (
            f"Quant {_label(chosen)}: no quant keeps every layer on the GPUs at a context of at least {min_ctx}; "
            f"this one leaves the fewest weight bytes on the CPU ({fmt_bytes(cpu)}). Considered {considered}"
        )
    text += f" ({others})." if others else "."
    counts = sorted({p.n_params for p in planned if p.n_params})
    if len(counts) > 1:  # the bisection assumes one model: sizes order the quants by precision only then
        text += (
            " The quants planned do not share one parameter count ("
            + ", ".join(f"{n / 1e9:.2f}B" for n in counts)
            + "): the repo holds more than one model, so their sizes may not rank their precision; name a quant."
        )
    return Decision("quant.best", text)


# -- from the command line ------------------------------------------------------------------------


def asked_tag(model: str, quant: str | None) -> str:
    """The quant asked for: ``--quant``, else the ``:TAG`` of ``owner/repo:TAG``."""
    own = model.rsplit(":", 1)[1] if is_hub_ref(model) and ":" in model else ""
    if quant and own and own.lower() != quant.lower():
        raise UsageError(f"{model} names the quant {own} and --quant says {quant}", hint="give one of them")
    if quant or own:
        return quant or own
    raise UsageError(
        f"{model} is a folder: say which of its quants to plan",
        hint="--quant best (the best that fits), --quant Q4_K_M, or plan --quants for the whole ladder",
    )


def quant_planner(p: Planner) -> QuantPlanner:
    """Plans of the command's context (the machine, the server's capabilities and the Hub resolver shared by
    every quant); the speed from cached measurements only (every quant has its own weight types: probing
    each would take seconds a quant)."""

    def plan(model: str, opts: Options) -> Prepared:
        return p.plan(model, opts, measure=0)

    return plan


def prepare_choice(model: str, quant: str | None, o: Options, planner: Planner) -> Prepared:
    """The plan of the quant asked for: ``best``, or a tag (a Hub tag goes the way llama.cpp's ``-hf``
    picks it; a folder's by its file names)."""
    plan, hub = quant_planner(planner), planner.hub
    tag = asked_tag(model, quant)
    if tag.lower() != BEST:
        if not os.path.isdir(model):
            repo = model.rsplit(":", 1)[0]
            return plan(f"{repo}:{tag}", o)
        src = source(model, hub, o.revision)
        q = src.find(tag)
        if q is None:
            raise ModelNotFoundError(
                f"{model} has no {tag} model file", hint="quants there: " + ", ".join(q.tag for q in src.quants)
            )
        return plan(str(Path(src.ref) / q.primary), o)
    c = best(source(model, hub, o.revision), o, plan)
    prep = c.chosen.prepared
    assert prep is not None  # best returns a quant that fits
    return replace(prep, plan=replace(prep.plan, decisions=(c.decision, *prep.plan.decisions)))


QUANTS_SCHEMA = "llamafit.quants/1"


def row_json(r: QuantPlan) -> dict[str, Any]:
    """One quant of ``llamafit.quants/1``: the verdict, and the plan (refused plans too) in ``plan/1``."""
    if r.prepared is not None:
        plan_doc: dict[str, Any] | None = r.prepared.to_json()
    elif r.refused is not None and r.refused.plan is not None:
        plan_doc = plan_to_json(r.refused.plan, r.refused.argv or [])
    else:
        plan_doc = None
    code, words = r.placement
    return {
        "tag": r.quant.tag,
        "files": [f.path for f in r.quant.files],
        "size": r.quant.size,
        "bpw": round(r.bpw, 4) if r.bpw else None,
        "n_params": r.n_params,
        "fits": r.fits,
        "full": r.full,
        "n_ctx": r.plan.n_ctx if r.fits and r.plan else None,
        "tg": round(tg, 2) if (tg := r.tg) is not None else None,
        "placement": {"code": code, "summary": words, "cpu_weights": r.cpu_weights} if code else None,
        "speculative": r.speculative,
        "download": sum(f.size for _, f in r.prepared.downloads()) if r.prepared else None,
        "error": None if r.error is None else {"message": r.error.message, "hint": r.error.hint},
        "plan": plan_doc,
    }


def ladder_json(src: QuantSource, rows: Sequence[QuantPlan]) -> dict[str, Any]:
    return {
        "schema": QUANTS_SCHEMA,
        "source": {"ref": src.ref, "hub": src.hub},
        "quants": [row_json(r) for r in rows],
    }
