"""Several models on one machine: planned together, run under llama-server's router.

The router (``llama-server --models-preset FILE --models-max N``) starts one server process per model and
knows nothing about memory. Here every model that must be resident at once is planned against what the
others leave on each device and in host memory, so the sums hold per card, not only for the pool:

* contexts: every model keeps what it gets alone (its training context when that fits) if all fit
  together; else the contexts are cut by one factor of what each gets alone (bisection on the factor,
  never below ``--min-ctx``); a context the user set for a model (``c`` in its section, ``-c``) is kept;
* placement before context: a model that is whole on the GPUs alone stays whole beside the others (the
  contexts are cut first); only when that fails even at ``--min-ctx`` may a model go partly to the CPU;
* order: models are placed in the order given; each one's placement (layers, split, experts on the CPU,
  drafter) is its own plan on what the earlier ones left;
* when they cannot all be resident, ``--models-max N`` for the largest N such that any N of them fit
  together (the router keeps at most N and unloads the least recently used): every model is planned with
  the N-1 largest users of each device already there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llamafit.devices.machine import Machine
from llamafit.errors import DoesNotFitError, UsageError
from llamafit.fit.plan import Decision
from llamafit.gguf.naming import split_info
from llamafit.hub.resolve import is_hub_ref
from llamafit.memory.context import N_CTX_PAD as CTX_PAD
from llamafit.options import Options
from llamafit.paths import named_files, write_output
from llamafit.planning.prepared import Prepared
from llamafit.server.args import ServerArgs, parse_server_args
from llamafit.several.budget import Budget
from llamafit.several.preset import GLOBAL, Section, flag_value, router_name, section_text, to_tokens
from llamafit.units import fmt_bytes

HOST = "host"
NOT_LOADED = "with this it would not load the model on startup"  # what the router makes of another word there
# what stays on the router's own command line: how it listens and logs. Everything else goes into each
# model's section (the router lays its own flags over every model's, so a -c there would undo the plan)
ROUTER_KEYS = frozenset(
    {
        "--host",
        "--port",
        "--api-key",
        "--api-key-file",
        "--ssl-key-file",
        "--ssl-cert-file",
        "--timeout",
        "--threads-http",
        "--path",
        "--api-prefix",
        "--webui",
        "--models-autoload",
        "--metrics",
        "--verbosity",
        "--verbose",
        "--log-disable",
        "--log-file",
        "--log-colors",
        "--log-prefix",
        "--log-timestamps",
    }
)
_MODEL_KEYS = ("--model", "--hf-repo", "--hf-file")
_NOT_HERE = ("--models-preset", "--models-max", "--models-dir")
_FACTOR_STEPS = 7  # bisection steps on the context factor: 1/128 of what each model gets alone


@dataclass(frozen=True)
class Entry:
    """One model of the set: its name in the router, what to load, and its own server flags."""

    name: str
    ref: str  # a GGUF path or owner/repo[:QUANT]
    args: tuple[str, ...] = ()  # its section's flags (the [*] section's first), llama-server spelling
    hf_file: str | None = None
    load_on_startup: bool | None = None  # from its section; None: the plan decides
    extra: tuple[tuple[str, str], ...] = ()  # other preset-only keys of its section, kept as written

    def pinned_ctx(self, user: Sequence[str]) -> bool:
        return parse_server_args([*self.args, *user]).has("--ctx-size")


@dataclass(frozen=True)
class Member:
    entry: Entry
    prep: Prepared
    alone_ctx: int
    resident: bool  # loaded when the router starts (load-on-startup)


@dataclass(frozen=True)
class Together:
    members: tuple[Member, ...]
    models_max: int
    decisions: tuple[Decision, ...]
    machine: Machine
    router_args: tuple[str, ...]  # the user's flags that stay on the router's command line
    # when they cannot all be resident: the memory budget llamafit keeps while the router serves (which models are
    # loaded is llamafit's choice, by their plans: ``llamafit.several.budget``); None: all resident, or by count
    budget: Budget | None = None

    def preset(self) -> str:
        """The planned preset: one section per model with its planned flags."""
        parts = [
            "; planned by llamafit: each section is the plan of one model; `llamafit plan` explains it\n",
            "version = 1\n",
        ]
        for m in self.members:
            extra = [*m.entry.extra, ("load-on-startup", "true" if m.resident else "false")]
            args = parse_server_args(m.prep.argv[1:]).without(ROUTER_KEYS).tokens()
            parts.append("\n" + section_text(m.entry.name, args, extra))
        return "".join(parts)

    def files(self) -> list[str]:
        """The files the members' command lines name."""
        return [f for m in self.members for f in named_files(m.prep.argv[1:])]

    def argv(self, binary: str, preset_path: str) -> list[str]:
        # by the budget llamafit loads and unloads: the router neither loads on its own nor counts (a count of all
        # of them never evicts; 0, unlimited, refuses any load-on-startup: server-models.cpp:885-889)
        count = len(self.members) if self.budget else self.models_max
        limit = ["--models-max", str(count), *(["--no-models-autoload"] if self.budget else [])]
        return [binary, "--models-preset", preset_path, *limit, *self.router_args]


# -- the set of models ----------------------------------------------------------------------------


def entries_from_refs(refs: Sequence[str], taken: Sequence[str] = ()) -> list[Entry]:
    """Models given on the command line, named as llama-server names a file (its name without .gguf;
    a repo by its name and quant), unique among themselves and the ``taken`` names (a preset's)."""
    out: list[Entry] = []
    names = set(taken)
    for ref in refs:
        out.append(Entry(_unique(router_name(_name_of(ref)), names), ref))
        names.add(out[-1].name)
    return out


def _name_of(ref: str) -> str:
    if is_hub_ref(ref) and not os.path.exists(ref):
        return ref.split("/", 1)[1]
    info = split_info(ref)  # a file: its name without the shard numbers and .gguf, as llama.cpp shows it
    return os.path.basename(info.prefix if info else ref.rstrip("/"))


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name-2``, ``-3``, ... (before a ``:TAG``, which the router would read the number into)."""
    name = re.sub(r"[\]\r\n]", "_", name) or "model"
    head, colon, tag = name.rpartition(":") if ":" in name else (name, "", "")
    out, k = name, 2
    while out in taken:
        out, k = f"{head}-{k}{colon}{tag}", k + 1
    return out


def entries_from_preset(sections: Sequence[Section], source: str) -> list[Entry]:
    """The model sections of a user's preset, with ``[*]`` under each (llama.cpp's cascade)."""
    glob = next((s for s in sections if s.name == GLOBAL), None)
    out: dict[str, Entry] = {}  # by the router's name: of two sections it names alike, it keeps the later
    for s in sections:
        if s.name in (GLOBAL, ""):
            continue
        # [*]'s options under the section's own: an option the section sets wins whatever its key's spelling
        g_tokens, g_only = to_tokens(glob.values if glob else {}, f"{source} [{GLOBAL}]")
        s_tokens, only = to_tokens(s.values, f"{source} [{s.name}]")
        tokens, only = [*g_tokens, *s_tokens], {**g_only, **only}
        args = parse_server_args(tokens)
        for key in _NOT_HERE:
            if args.has(key):
                raise UsageError(f"{source} [{s.name}]: {key} belongs on the router's command line, not in a model")
        model, repo, hf_file = (o.value if (o := args.last(k)) else None for k in _MODEL_KEYS)
        ref = model or repo
        if not ref:
            raise UsageError(f"{source} [{s.name}]: no model (model = FILE, or hf-repo = owner/repo[:QUANT])")
        rest = tuple(args.without(_MODEL_KEYS).tokens())
        said = only.pop("load-on-startup", None)
        startup = None if said is None else flag_value("load-on-startup", said, f"{source} [{s.name}]", NOT_LOADED)
        name = router_name(s.name)
        out[name] = Entry(name, ref, rest, hf_file, startup, tuple(only.items()))
    if not out:
        raise UsageError(f"{source} has no model sections", hint="[name] then model = FILE")
    return list(out.values())


# -- planning them together ------------------------------------------------------------------------


MemberPlanner = Callable[[str, Options, Machine], Prepared]


SET_SCHEMA = "llamafit.plan-set/1"  # one shape per schema name: a set's plan is not one model's
RUN_SET_SCHEMA = "llamafit.run-set/1"
MAX_MODELS = 128  # models planned together: each is planned some tens of times in the joint fit


def plan_together(entries: Sequence[Entry], o: Options, machine: Machine, plan: MemberPlanner) -> Together:
    """Plan ``entries`` to share ``machine`` (see the module's docstring)."""
    if len(entries) > MAX_MODELS:
        raise UsageError(
            f"{len(entries)} models to plan together; llamafit plans at most {MAX_MODELS}",
            hint="split them over several presets (routers), or give the ones this machine should serve",
        )
    user = parse_server_args(list(o.server_args))
    for key in _NOT_HERE:
        if user.has(key):
            raise UsageError(f"{key} is planned by llamafit for several models", hint="drop it")
    router_args = tuple(t for x in user.items if x.key in ROUTER_KEYS for t in x.tokens)
    by_memory = swappable(parse_server_args(list(router_args)))
    model_args = tuple(user.without(ROUTER_KEYS).tokens())
    o = replace(o, server_args=model_args)

    def one(e: Entry, ctx: int | None, on: Machine) -> Prepared:
        extra = [] if ctx is None else ["-c", str(ctx)]
        opts = replace(o, server_args=(*e.args, *model_args, *extra), hf_file=e.hf_file or o.hf_file)
        return plan(e.ref, opts, on)

    alone: list[Prepared] = []
    for e in entries:
        try:
            alone.append(one(e, None, machine))
        except DoesNotFitError as err:
            raise err.but(
                message=f"{e.name} does not fit this machine even alone: {err.message}", model=e.name
            ) from err
        except UsageError as err:  # a flag of this model's (its preset section's): say whose
            raise err.but(message=f"{e.name}: {err.message}") from err
    pinned = [e.pinned_ctx(model_args) for e in entries]
    alone_ctx = [p.plan.n_ctx for p in alone]
    n = len(entries)
    limits = _limits(alone[0], machine)

    whole = [p.plan.placement_code == "placement.all_gpu" for p in alone]

    def attempt(k: int, f: float, strict: bool) -> list[Prepared] | None:
        """Every model at factor ``f`` of its alone context, with room for any ``k`` resident at once;
        ``strict``: a model whole on the GPUs alone stays whole (contexts give way before placement)."""
        done: list[Prepared] = []
        for i, e in enumerate(entries):
            ctx = None if pinned[i] else max(min(o.min_ctx, alone_ctx[i]), _pad(f * alone_ctx[i]))
            if ctx is not None and ctx >= alone_ctx[i]:
                ctx = alone_ctx[i]
            try:
                p = one(e, ctx, _residual(machine, done, k - 1))
            except DoesNotFitError:
                return None
            if strict and whole[i] and p.plan.placement_code != "placement.all_gpu":
                return None
            done.append(p)
        return done if k >= n or _any_k_fit(done, k, limits) else None

    modes = (True, False) if any(whole) else (False,)
    counts = resident_counts(n, lambda k: attempt(k, 0.0, False) is not None)
    for k, strict in ((k, strict) for k in counts for strict in modes):
        f, got = 1.0, attempt(k, 1.0, strict)
        if got is None:
            # the largest factor that fits, keeping the plans of the last one that did
            lo, hi, got = 0.0, 1.0, attempt(k, 0.0, strict)
            if got is None:
                continue
            for _ in range(_FACTOR_STEPS):
                mid = (lo + hi) / 2
                if (trial := attempt(k, mid, strict)) is not None:
                    lo, got = mid, trial
                else:
                    hi = mid
            f = lo
        members = tuple(
            Member(e, p, alone_ctx[i], e.load_on_startup if e.load_on_startup is not None else i < k)
            for i, (e, p) in enumerate(zip(entries, got, strict=True))
        )
        if sum(m.resident for m in members) > k:
            raise UsageError(
                f"{sum(m.resident for m in members)} models ask for load-on-startup but only {k} fit together",
                hint="set load-on-startup = false on the others",
            )
        budget = Budget(limits, {m.entry.name: footprint(m.prep) for m in members}) if k < n and by_memory else None
        decisions = _decisions(members, k, f, pinned, budget)
        if machine.blind:
            # llama.cpp's own fit places each instance on what it sees free at its load, one at a time
            decisions += (
                Decision(
                    "models.blind",
                    "Some devices cannot be sized here (" + "; ".join(machine.blind) + "): each instance's "
                    "placement is left to llama.cpp's fit at its load, which sees what the instances before it "
                    "took, but the sum is not planned.",
                ),
            )
        return Together(members, k, decisions, machine, router_args, budget)
    raise AssertionError("every model fits alone, so one at a time fits")  # k = 1 is each alone


def swappable(router: ServerArgs) -> bool:
    """Whether llamafit can keep the memory budget: its front answers the user's address over plain HTTP (a
    router on https or a unix socket keeps llama.cpp's count, ``--models-max``)."""
    host = router.last("--host")
    return not router.has("--ssl-key-file") and not (host is not None and (host.value or "").endswith(".sock"))


def resident_counts(n: int, fits: Callable[[int], bool]) -> list[int]:
    """The numbers of resident models worth trying, most first: all ``n``, else the largest ``k`` for which
    ``fits(k)`` (the models at ``--min-ctx``) found by bisection: room for more resident models never grows
    as ``k`` does, and a scan down from ``n`` would plan a preset of hundreds of models ``n`` times over.
    ``k = 1`` always fits (each model fits alone)."""
    if n <= 1 or fits(n):
        return [n]
    lo, hi = 1, n  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return [lo]


def _pad(ctx: float) -> int:
    return int(ctx) // CTX_PAD * CTX_PAD


def _uses(p: Prepared) -> dict[str, int]:
    out = {d.device.id: d.use.total for d in p.plan.devices}
    out[HOST] = p.plan.host.use.total + p.plan.host.unified
    return out


def footprint(p: Prepared) -> dict[str, int]:
    """What a model holds while it is loaded: its load on each device and in host memory, and what grows in host
    memory while it serves (checkpoints, the prompt cache its plan allows)."""
    out = _uses(p)
    runtime = p.plan.host.runtime
    out[HOST] += runtime.total if runtime is not None and runtime.prompt_cache >= 0 else 0
    return out


def _residual(machine: Machine, planned: Sequence[Prepared], k: int) -> Machine:
    """The machine less, on each device and in host memory, the ``k`` largest uses among ``planned``."""
    if k <= 0 or not planned:
        return machine
    taken = {dev: _top([_uses(p).get(dev, 0) for p in planned], k) for dev in [*(g.id for g in machine.gpus), HOST]}
    gpus = tuple(replace(g, free=max(0, g.free - taken[g.id])) for g in machine.gpus)
    host = replace(machine.host, available=max(0, machine.host.available - taken[HOST]))
    return Machine(gpus, host, machine.notes, machine.blind)


def _top(values: Sequence[int], k: int) -> int:
    return sum(sorted(values, reverse=True)[:k])


def _limits(p: Prepared, machine: Machine) -> dict[str, int]:
    """What the models may use together on each device and in host memory: free less the margin."""
    out = {d.device.id: d.usable for d in p.plan.devices}
    out[HOST] = p.plan.host.usable
    for g in machine.gpus:
        out.setdefault(g.id, g.free)
    return out


def _any_k_fit(plans: Sequence[Prepared], k: int, limits: dict[str, int]) -> bool:
    return all(_top([_uses(p).get(dev, 0) for p in plans], k) <= lim for dev, lim in limits.items())


def _decisions(
    members: Sequence[Member], k: int, f: float, pinned: Sequence[bool], budget: Budget | None
) -> tuple[Decision, ...]:
    n = len(members)
    ctxs = ", ".join(
        f"{m.entry.name} {m.prep.plan.n_ctx}"
        + (" (set)" if pinned[i] else f" (alone {m.alone_ctx})" if m.prep.plan.n_ctx != m.alone_ctx else "")
        for i, m in enumerate(members)
    )
    if f >= 1.0:
        ctx = Decision("models.context", f"Every model keeps the context it gets alone: {ctxs}.")
    else:
        ctx = Decision(
            "models.context",
            f"Contexts cut to {f:.0%} of what each model gets alone so that they fit together "
            f"(never below --min-ctx; a context you set is kept): {ctxs}.",
        )
    if k >= n:
        res = Decision("models.resident", f"All {n} models resident at once (--models-max {n}).")
    elif budget is not None:
        sets = budget.resident_sets([m.entry.name for m in members])
        together = "; ".join(" + ".join(s) for s in sets or [])
        res = Decision(
            "models.budget",
            f"All {n} models do not fit together; llamafit keeps a memory budget instead of a count: a model asked "
            "for is loaded once the least recently used ones that keep it from fitting are unloaded, and models "
            "that fit together stay together"
            + (f" (resident together at most: {together})" if together else "")
            + "; loaded at start: "
            + ", ".join(m.entry.name for m in members if m.resident)
            + ".",
        )
    else:
        res = Decision(
            "models.max",
            f"--models-max {k}: all {n} models do not fit together even at --min-ctx; any {k} of them do. The "
            "router loads the others on demand and unloads the least recently used; loaded at start: "
            + ", ".join(m.entry.name for m in members if m.resident)
            + ".",
        )
    return (res, ctx)


# -- JSON -------------------------------------------------------------------------------------------


def to_json(t: Together, argv: Sequence[str], preset_path: str | None) -> dict[str, Any]:
    """``llamafit.plan-set/1``, the plan of several models: the router's argv and preset, each model's own plan under
    ``models``, and the shared budgets: each device's and the host's need (the sum of the ``models_max``
    largest users) against what is usable."""
    limits = _limits(t.members[0].prep, t.machine)
    k = t.models_max
    plans = [m.prep for m in t.members]

    def budget(dev: str, lim: int) -> dict[str, Any]:
        need = _top([_uses(p).get(dev, 0) for p in plans], k)
        return {"usable": lim, "need": need, "fits": need <= lim}

    devices = [{"id": dev, **budget(dev, lim)} for dev, lim in limits.items() if dev != HOST]
    host = budget(HOST, limits[HOST])
    return {
        "schema": SET_SCHEMA,
        "argv": list(argv),
        "preset_path": preset_path,
        "preset": t.preset(),
        "models_max": k,
        "policy": _policy_json(t),
        "fits": host["fits"] and all(d["fits"] for d in devices),
        "devices": devices,
        "host": host,
        "decisions": [{"code": d.code, "message": d.message} for d in t.decisions],
        "models": [_member_json(m) for m in t.members],
    }


def _policy_json(t: Together) -> dict[str, Any]:
    """How the models share the machine: all resident; by count (the router's ``--models-max``); or by memory
    (llamafit's budget per device, each model's footprint, the largest sets that fit together)."""
    n = len(t.members)
    if t.budget is None:
        return {"kind": "all" if t.models_max >= n else "count", "models_max": t.models_max}
    names = [m.entry.name for m in t.members]
    sets = t.budget.resident_sets(names)
    return {
        "kind": "budget",
        "budget": dict(t.budget.limits),
        "footprints": {name: dict(t.budget.uses[name]) for name in names},
        "resident_sets": [list(s) for s in sets] if sets is not None else None,
    }


def _member_json(m: Member) -> dict[str, Any]:
    return {
        "name": m.entry.name,
        "ref": m.entry.ref,
        "resident": m.resident,
        "alone_ctx": m.alone_ctx,
        **m.prep.to_json(),
    }


def summary(t: Together) -> list[str]:
    """A few lines for people: each model, where it goes, its context."""
    out = []
    for m in t.members:
        p = m.prep.plan
        where = ", ".join(f"{d.device.id} {fmt_bytes(d.use.total)}" for d in p.devices if d.use.total)
        out.append(
            f"{m.entry.name}: context {p.n_ctx}, {where or 'CPU only'}, host {fmt_bytes(p.host.use.total)}"
            + ("" if m.resident else " (on demand)")
        )
    return out


def write_preset(t: Together, path: Path, inputs: Sequence[str | Path] = ()) -> None:
    """The planned preset into ``path`` (atomically), never over one of the files the set reads: the
    ``inputs`` (a preset given) and every file a member's command line names."""
    write_output(path, t.preset(), [*inputs, *t.files()], "the preset")
