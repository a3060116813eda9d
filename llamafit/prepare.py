"""From what the user typed to a plan and the exact argv for one server binary.

The one pipeline ``plan``, ``run`` and ``demo`` share: read the extra args with the option table
(after translating spellings this binary does not know), build the request, discover the devices,
read the model, fit it with its drafter and past calibration, and compose the argv with only flags
the binary accepts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llamafit import bound
from llamafit.calibration import Corrections, corrections, measured_mmproj_compute
from llamafit.devices.described import described_host
from llamafit.devices.machine import Machine, discover
from llamafit.devices.rates import parse_rate
from llamafit.devices.rpc import discover_rpc, same_servers
from llamafit.errors import DoesNotFitError, LlamafitError, UsageError
from llamafit.fit import make_plan
from llamafit.gguf.checks import check_model
from llamafit.gguf.mmproj import read_projector
from llamafit.gguf.model import ModelInfo, load_model, with_kv
from llamafit.hub.remote import HubClient
from llamafit.hub.resolve import Hub, RepoState, is_hub_ref, offline_from_env
from llamafit.hub.select import HubFile
from llamafit.memory.adapters import Adapters, read_adapters
from llamafit.memory.footprint import LoadSettings
from llamafit.options import Options
from llamafit.paths import cache_dir
from llamafit.plan import Decision, Plan, to_json
from llamafit.request import Request, build_request, kv_overrides, parse_margins
from llamafit.server.args import ServerArgs, compose, parse_server_args
from llamafit.server.binary import ServerBinary, find_server
from llamafit.server.capabilities import ASSUMED, Capabilities, probe
from llamafit.server.compat import normalize_bare_flash_attn, supported, translate_user_args
from llamafit.server.environment import ChildEnv, child_env, config_findings
from llamafit.speculative import spec_options
from llamafit.speed.bench import rate_flags
from llamafit.speed.machine import MEASURE_BUDGET, RateSource
from llamafit.tuned import cached_winner


@dataclass(frozen=True)
class Prepared:
    plan: Plan
    argv: list[str]  # binary first
    user: ServerArgs
    server: ServerBinary | None
    caps: Capabilities
    notes: tuple[str, ...] = field(default=())  # translations, dropped flags, config files
    hub: Hub | None = None  # set when files come from the Hub
    rates: RateSource | None = field(default=None, repr=False)  # the devices' speed, as the plan used it

    def report(self) -> tuple[tuple[str, str], ...]:
        """What every command tells the user about this plan, in order: ``("note", text)`` for what was found
        and translated, ``("decision", text)`` for each choice, ``("warning", text)`` for what may go wrong."""
        notes = dict.fromkeys((*self.plan.notes, *self.notes))
        return (
            *(("note", n) for n in notes),
            *(("decision", d.message) for d in self.plan.decisions),
            *(("warning", w) for w in self.plan.warnings),
        )

    def downloads(self) -> list[tuple[RepoState, HubFile]]:
        """The Hub files this plan's argv uses that the cache does not hold yet (none for local models)."""
        if self.hub is None:
            return []
        return self.hub.pending(self.argv[1:])

    def to_json(self) -> dict[str, Any]:
        """The ``llamafit.plan/1`` document, with this preparation's notes and the downloads it needs."""
        doc = to_json(self.plan, self.argv)
        doc["notes"] = [*doc["notes"], *self.notes]
        doc["downloads"] = [{"repo": st.repo, "path": f.path, "size": f.size} for st, f in self.downloads()]
        return doc


def server_and_caps(
    explicit: str | None, environ: dict[str, str] | None = None
) -> tuple[ServerBinary | None, Capabilities]:
    """The binary that would run and what it accepts; ASSUMED (b11434) when there is none."""
    try:
        srv = find_server(explicit, environ)
    except LlamafitError:
        if explicit:
            raise
        return None, ASSUMED
    caps = probe(srv.path, env=srv.env(), cache_dir=cache_dir())
    # a binary that lists no flags did not answer --completion-bash: plan for the reference build
    return srv, caps if caps.flags else ASSUMED


def prepare(
    model_path: str,
    o: Options,
    *,
    machine: Machine | None = None,
    server: tuple[ServerBinary | None, Capabilities] | None = None,
    model: ModelInfo | None = None,
    hub: Hub | None = None,
    speed: bool = True,
    progress: Callable[[str], None] | None = None,
    tuned: bool = True,
    measure: float = MEASURE_BUDGET,
    rates: RateSource | None = None,
) -> Prepared:
    """Plan one model. ``machine``, ``server`` and ``hub`` may be shared between calls (planning every
    quant of a repo lists it, probes the binary and discovers the devices once). ``speed``: predict its
    tokens/s (measuring the devices first where nothing is cached: ``progress`` hears what is measured;
    ``rates`` reuses another plan's; ``measure``: the seconds it may spend measuring, 0 for cached measurements
    only). ``tuned``: start
    from the configuration ``llamafit tune`` measured fastest for this model, devices, build and flags,
    when there is one."""
    srv, caps = server if server is not None else server_and_caps(o.server)
    own_rpc = [t for v in o.rpc for t in ("--rpc", v)]
    translated = translate_user_args(normalize_bare_flash_attn([*own_rpc, *o.server_args]), caps)
    args = translated.args
    notes = list(translated.notes)

    def the_hub() -> Hub:
        nonlocal hub
        if hub is None:
            hub = new_hub(o.offline)
        return hub

    user = parse_server_args(args)
    check_unknown(user, caps)
    if user.has("--hf-repo"):
        raise UsageError("give the Hub repo as the model argument, not -hf", hint="llamafit run owner/repo:Q4_K_M")
    for key in ("--model", "--model-url", "--hf-file", "--docker-repo"):
        if (occ := user.last(key)) is not None:
            # one model per plan: a second one among the server flags would be launched but not planned,
            # and its measurements stored as the planned model's
            raise UsageError(
                f"{occ.tokens[0]} among the server flags names a second model; llamafit plans its MODEL argument",
                hint=f"give it as MODEL: llamafit run {occ.value or 'MODEL'} -- <other flags>",
            )
    if (occ := user.last("--spec-draft-hf")) is not None and not user.has("--spec-draft-model"):
        # llama-server downloads a draft repo only when the model is -hf too (docs/server-cli.md §4.5): resolve it here
        kinds = [t for o_ in user.items if o_.key == "--spec-type" for t in (o_.value or "").split(",")]
        path = the_hub().resolve_draft(occ.value or "", kinds=kinds)
        args = [*parse_server_args(args).without(["--spec-draft-hf"]).tokens(), "-md", path]
        notes.append(f"-hfd {occ.value} is passed as -md {path} (llamafit downloads it)")
        user = parse_server_args(args)
    margin, margins = parse_margins(o.margin)
    req = build_request(user, margin=margin, margins=margins, min_ctx=o.min_ctx, cpu_only=o.cpu_only)
    draft = o.draft
    if draft and not os.path.exists(draft) and is_hub_ref(draft):
        draft = the_hub().resolve_draft(draft, kinds=[o.spec] if o.spec.startswith("draft-") else [])
    opts = spec_options(user, mode=o.spec, prefer=o.prefer, draft=draft)
    mach = machine if machine is not None else discover_for(o, srv)
    if req.rpc:
        mach, user, req = _with_rpc(mach, user, req, srv, o, notes)
    projector = read_projector(req.mmproj) if req.mmproj else None
    local = os.path.exists(model_path) or not is_hub_ref(model_path)
    if local and (o.hf_file or o.revision):
        raise UsageError("--hf-file and --revision apply to a Hub repo, not to a local file")
    if model is not None:
        info = model
    elif not local:
        auto_mm = req.mmproj_auto and not req.mmproj and not req.mmproj_url
        hm = the_hub().resolve_model(model_path, hf_file=o.hf_file, revision=o.revision, mmproj=auto_mm)
        info = hm.model
        if hm.mmproj is not None:
            projector = hm.mmproj
            req = replace(req, mmproj=hm.mmproj.path)
    else:
        info = load_model(model_path)

    # --override-kv changes what the loader reads: the memory model reads the same keys
    if overrides := kv_overrides(user):
        info, kv_notes = with_kv(info, overrides)
        notes += kv_notes
    # what llama-server would refuse or abort on, before a plan calls it fitting
    check_model(info.kv, info.hparams, (t.name for t in info.tensors), info.path)

    if speed and rates is None:
        rates = rates_for(mach, info, user, srv, o, progress, measure)

    def argv_of(p: Plan) -> list[str]:
        return compose(srv.path if srv else "llama-server", supported(p.planned, caps)[0], user)

    def plan_with(scale: Mapping[str, float]) -> Plan:
        """The plan, its compute buffers scaled to the binary's no-alloc measurement (llamafit.bound)."""

        def calib(s: LoadSettings, devices: tuple[str, ...]) -> Corrections:
            c = corrections(info, s, devices) if o.calibrate else Corrections()
            return replace(c, measured_scale=dict(scale)) if scale else c

        try:
            return make_plan(
                info,
                mach,
                req,
                opts,
                caps,
                calib if o.calibrate or scale else None,
                mmproj=projector,
                mmproj_measured=measured_mmproj_compute if o.calibrate else None,
                drafter_files=hub,
                rates=rates,
                adapters=adapters_of(user, info),
            )
        except DoesNotFitError as e:
            if e.plan is None:
                raise
            raise e.but(argv=argv_of(e.plan)) from e

    def replan(scale: Mapping[str, float]) -> tuple[Plan, list[str]]:
        p = plan_with(scale)
        return p, argv_of(p)

    plan = plan_with({})
    argv = argv_of(plan)
    if srv is not None and (why := bound.reasons(plan)):
        plan, argv, held = bound.bounded(plan, argv, replan, srv, why)
        plan = replace(plan, memory_bound=held, decisions=(*plan.decisions, Decision("memory.bound", held.message)))
    notes += rates.notes if rates is not None else []
    notes += [*supported(plan.planned, caps)[1], *config_findings(os.environ, parse_server_args(argv[1:]))]
    if hub is not None:
        notes += hub.notes
    prep = Prepared(plan, argv, user, srv, caps, tuple(notes), hub, rates)
    winner = cached_winner(info, plan.devices, srv, user) if tuned and speed else None
    if winner is None:
        return prep
    tuned_flags = " ".join(winner.flags)
    if not winner.flags:  # tune measured the plan as it is fastest: its speed is known, not estimated
        tuned_prep = prep
    else:
        o_ = replace(o, server_args=(*winner.flags, *o.server_args))
        try:
            tuned_prep = prepare(
                model_path,
                o_,
                machine=mach,
                server=(srv, caps),
                model=info,
                hub=hub,
                tuned=False,
                rates=rates,
                progress=progress,
            )
        except LlamafitError as e:
            return replace(
                prep, notes=(*prep.notes, f"llamafit tune's fastest ({tuned_flags}) is not used: {e.message}")
            )
    if not tuned_prep.plan.fits:
        return prep
    if tuned_prep.plan.n_ctx < prep.plan.n_ctx:  # the context is chosen first; speed does not cut it
        cut = f"it would cut the context from {prep.plan.n_ctx} to {tuned_prep.plan.n_ctx} here now"
        return replace(prep, notes=(*prep.notes, f"llamafit tune's fastest ({tuned_flags}) is not used: {cut}"))
    sp = tuned_prep.plan.speed
    sp = replace(sp, pp=winner.pp, tg=winner.tg, source="measured") if sp is not None else None
    d = Decision(
        "speed.tuned",
        f"Starting from what llamafit tune measured fastest here ({winner.when}): "
        f"{' '.join(winner.flags) or 'the plan as it is'} (pp {winner.pp or 0:.1f}, tg {winner.tg or 0:.1f} tok/s).",
    )
    plan = replace(tuned_prep.plan, speed=sp, decisions=(*tuned_prep.plan.decisions, d))
    return replace(tuned_prep, plan=plan, user=user)


def adapters_of(user: ServerArgs, info: ModelInfo) -> Adapters | None:
    """The LoRA adapters and control vectors the server will load (--lora, --lora-scaled FNAME:SCALE, and the
    same for control vectors; comma-separated, every occurrence), priced from their headers."""

    def files(key: str, scaled: bool) -> list[str]:
        out = []
        for occ in user.all(key):
            for item in (x for x in (occ.value or "").split(",") if x):
                out.append(item.rsplit(":", 1)[0] if scaled else item)
        return out

    lora = files("--lora", False) + files("--lora-scaled", True)
    cvec = files("--control-vector", False) + files("--control-vector-scaled", True)
    return read_adapters(lora, cvec, info.hparams.n_embd) if lora or cvec else None


# llamafit's own options, which a user may write after -- by mistake (they would reach llama-server); the ones
# llama-server also has (--draft, --log-file, --metrics, ...) are its own there and never reach this check.
# tests/test_cli.py holds the set to every command's declared options.
LLAMAFIT_OPTIONS = frozenset(
    {
        "--budget",
        "--cpu-only",
        "--dry-run",
        "--events",
        "--exec",
        "--goal",
        "--gpu",
        "--host-bandwidth",
        "--host-ram",
        "--json",
        "--limit",
        "--liveness",
        "--margin",
        "--max-restarts",
        "--min-ctx",
        "--models-preset-out",
        "--no-check",
        "--no-retry",
        "--prefer",
        "--quant",
        "--quants",
        "--quiet",
        "--ready-timeout",
        "--restart",
        "--revision",
        "--rpc-optional",
        "--server",
        "--spec",
        "--watch",
    }
)


def check_unknown(user: ServerArgs, caps: Capabilities) -> None:
    """What llama-server would refuse at start (``error: invalid argument``), refused at plan time instead:
    a flag this binary does not list (its ``--completion-bash``), a second ``--``, a stray positional word;
    a llamafit option written after ``--`` gets a hint."""
    for occ in user.items:
        if occ.option is not None:
            continue
        tok = occ.tokens[0]
        if tok in LLAMAFIT_OPTIONS:
            raise UsageError(
                f"{tok} is llamafit's option, written after --: it would go to llama-server",
                hint=f"put {tok} before --",
            )
        if tok == "--":
            raise UsageError("a second -- among the server flags", hint="all after the first -- goes to llama-server")
        if not tok.startswith("-"):
            raise UsageError(f"{tok!r} among the server flags is no flag's value", hint="llama-server would refuse it")
        if caps.flags and not caps.accepts(tok):
            binary = caps.path or "llama-server (b11434)"
            raise UsageError(f"{binary} does not accept {tok}", hint="see llama-server --help for its flags")


def rates_for(
    mach: Machine,
    model: ModelInfo,
    user: ServerArgs,
    srv: ServerBinary | None,
    o: Options,
    progress: Callable[[str], None] | None = None,
    measure: float = MEASURE_BUDGET,
) -> RateSource:
    """The devices' speed for this model, as the server will run it: its thread count, repacking, flash
    attention and cache types (``llamafit.speed.machine``)."""
    threads = None
    if (occ := user.last("--threads")) is not None and (occ.value or "").isdecimal():
        threads = int(occ.value or 0) or None
    flags = rate_flags(user)
    bw = parse_rate(o.host_bandwidth, "--host-bandwidth") if o.host_bandwidth else None
    ub = user.last("--ubatch-size")
    prompt = int(ub.value or 0) if ub is not None and (ub.value or "").isdecimal() else 512
    return RateSource(
        mach,
        model,
        server_path=srv.path if srv else None,
        env=launch_env(srv).env if srv else dict(os.environ),
        threads=threads,
        flags=flags,
        prompt=max(32, min(prompt, 2048)),
        host_bandwidth=bw,
        here=not (o.gpu or o.host_ram),  # described hardware is not measured here
        progress=progress,
        calibrate=o.calibrate,
        measure=measure,
    )


def _with_rpc(
    mach: Machine, user: ServerArgs, req: Request, srv: ServerBinary | None, o: Options, notes: list[str]
) -> tuple[Machine, ServerArgs, Request]:
    """The RPC servers' devices in front of the local GPUs, as llama.cpp orders them; a server named twice
    (two spellings of one address) is used once; an unreachable server under --rpc-optional is left out of
    the plan and of the server's --rpc."""
    once, merged = same_servers(req.rpc)
    notes += merged
    mach, unreachable = machine_with_rpc(mach, once, srv, optional=o.rpc_optional, cpu_only=o.cpu_only)
    if unreachable or merged:
        up = [ep for ep in once if ep not in unreachable]
        if unreachable:
            notes.append(f"RPC server(s) {', '.join(unreachable)} unreachable: planned without them (--rpc-optional)")
        user = parse_server_args([*(["--rpc", ",".join(up)] if up else []), *user.without(["--rpc"]).tokens()])
        req = replace(req, server_args=user, rpc=tuple(up))
    return mach, user, req


def discover_for(o: Options, srv: ServerBinary | None) -> Machine:
    """The machine as the server that will run sees it (its device list, in its environment); the host's RAM
    as ``--host-ram`` describes it, when it does."""
    host = described_host(o.host_ram) if o.host_ram else None
    if o.gpu or o.cpu_only or srv is None:
        return discover(gpu_specs=o.gpu, cpu_only=o.cpu_only, host=host)
    return discover(server=srv.path, server_env=launch_env(srv).env, cache=cache_dir(), host=host)


def machine_and_server(o: Options) -> tuple[Machine, tuple[ServerBinary | None, Capabilities]]:
    """The machine as the server that would run sees it, and that server with what it accepts. A bad
    ``--gpu`` is a usage error before any file or binary is touched."""
    if o.host_ram:
        described_host(o.host_ram)  # a bad --host-ram is a usage error before anything runs, too
    described = discover_for(o, None) if o.gpu else None
    found = server_and_caps(o.server)
    return described or discover_for(o, found[0]), found


def machine_with_rpc(
    mach: Machine, endpoints: Sequence[str], srv: ServerBinary | None, *, optional: bool, cpu_only: bool
) -> tuple[Machine, tuple[str, ...]]:
    """The RPC servers' devices in front of the local GPUs, as llama.cpp orders them (src/llama.cpp:272),
    and the endpoints left out as unreachable (only with ``optional``)."""
    if cpu_only:
        raise UsageError("--cpu-only plans a load without offload devices, RPC ones included", hint="drop one")
    found = discover_rpc(endpoints, srv.path if srv else None, srv.env() if srv else None, optional=optional)
    return Machine((*found.devices, *mach.gpus), mach.host, mach.notes, mach.blind), tuple(found.unreachable)


def new_hub(offline: bool) -> Hub:
    """The Hub resolver: offline with --offline or HF_HUB_OFFLINE, headers cached in the user cache."""
    return Hub(offline=offline or offline_from_env(), client=HubClient(cache_dir=cache_dir()))


def load_any_model(
    ref: str, *, hf_file: str | None = None, revision: str | None = None, offline: bool = False
) -> ModelInfo:
    """A local GGUF, or a Hub repo's model (its headers only), for ``inspect``."""
    if not os.path.exists(ref) and is_hub_ref(ref):
        hub = new_hub(offline)
        return hub.resolve_model(ref, hf_file=hf_file, revision=revision, mmproj=False).model
    if hf_file or revision:
        raise UsageError("--hf-file and --revision apply to a Hub repo, not to a local file")
    return load_model(ref)


def launch_env(srv: ServerBinary) -> ChildEnv:
    """The server's environment: ours without inherited llama.cpp settings, plus its library path."""
    return child_env(srv.env())
