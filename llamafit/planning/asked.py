"""The reading stage: the user's server flags as the binary that will run reads them (spellings it does not know
translated, what it would refuse refused now), the request they make, and the drafter options."""

from __future__ import annotations

import os
from dataclasses import dataclass

from llamafit.errors import UsageError
from llamafit.fit.request import Request, build_request, parse_margins
from llamafit.hub.resolve import Hub, is_hub_ref
from llamafit.options import Options
from llamafit.server.args import ServerArgs, parse_server_args
from llamafit.server.capabilities import Capabilities
from llamafit.server.compat import normalize_bare_flash_attn, translate_user_args
from llamafit.speculative import SpecOptions, spec_options


@dataclass(frozen=True)
class Asked:
    """What the user asked for: the server flags as the binary reads them, the request they make, the drafter
    options, and what was translated or resolved on the way."""

    user: ServerArgs
    req: Request
    spec: SpecOptions
    notes: tuple[str, ...] = ()


def read(o: Options, caps: Capabilities, hub: Hub) -> Asked:
    """The server flags of ``o`` read for the binary ``caps`` describes (``hub``: the Hub resolver, used only for
    a drafter named by its repo)."""
    own_rpc = [t for v in o.rpc for t in ("--rpc", v)]
    translated = translate_user_args(normalize_bare_flash_attn([*own_rpc, *o.server_args]), caps)
    args = translated.args
    notes = list(translated.notes)
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
        path = hub.resolve_draft(occ.value or "", kinds=kinds)
        args = [*parse_server_args(args).without(["--spec-draft-hf"]).tokens(), "-md", path]
        notes.append(f"-hfd {occ.value} is passed as -md {path} (llamafit downloads it)")
        user = parse_server_args(args)
    margin, margins = parse_margins(o.margin)
    req = build_request(user, margin=margin, margins=margins, min_ctx=o.min_ctx, cpu_only=o.cpu_only)
    draft = o.draft
    if draft and not os.path.exists(draft) and is_hub_ref(draft):
        draft = hub.resolve_draft(draft, kinds=[o.spec] if o.spec.startswith("draft-") else [])
    return Asked(user, req, spec_options(user, mode=o.spec, prefer=o.prefer, draft=draft), tuple(notes))


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
        "--for-service",
        "--goal",
        "--gpu",
        "--host-bandwidth",
        "--host-cores",
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
        "--replace",
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
