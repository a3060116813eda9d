"""From what the user typed to a plan and the exact argv for one server binary.

The one pipeline ``plan``, ``run`` and ``demo`` share: read the extra args with the option table
(after translating spellings this binary does not know), build the request, discover the devices,
read the model, fit it with its drafter and past calibration, and compose the argv with only flags
the binary accepts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llamafit.argv import ServerArgs, compose, parse_server_args
from llamafit.calibration import Corrections, corrections, measured_mmproj_compute
from llamafit.capabilities import ASSUMED, Capabilities, probe
from llamafit.compat import normalize_bare_flash_attn, supported, translate_user_args
from llamafit.demo import cache_dir
from llamafit.devices import Machine, discover
from llamafit.environment import ChildEnv, child_env, config_findings
from llamafit.errors import LlamafitError
from llamafit.fit import make_plan
from llamafit.gguf.mmproj import read_projector
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.memory.footprint import LoadSettings
from llamafit.plan import Plan
from llamafit.request import build_request
from llamafit.server import ServerBinary, find_server
from llamafit.speculative import spec_options
from llamafit.units import parse_size


@dataclass(frozen=True)
class Options:
    """llamafit's own options of plan/run/demo."""

    server_args: Sequence[str] = ()
    gpu: Sequence[str] = ()
    cpu_only: bool = False
    margin: str = "1024"
    min_ctx: int = 4096
    spec: str = "auto"
    prefer: str = "context"
    draft: str | None = None
    server: str | None = None
    calibrate: bool = True


@dataclass(frozen=True)
class Prepared:
    plan: Plan
    argv: list[str]  # binary first
    user: ServerArgs
    server: ServerBinary | None
    caps: Capabilities
    notes: tuple[str, ...] = field(default=())  # translations, dropped flags, config files


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
    extra_notes: Callable[[ServerArgs], list[str]] | None = None,
) -> Prepared:
    srv, caps = server if server is not None else server_and_caps(o.server)
    translated = translate_user_args(normalize_bare_flash_attn(list(o.server_args)), caps)
    user = parse_server_args(translated.args)
    req = build_request(user, margin=parse_size(o.margin), min_ctx=o.min_ctx, cpu_only=o.cpu_only)
    opts = spec_options(user, mode=o.spec, prefer=o.prefer, draft=o.draft)
    mach = machine if machine is not None else discover(gpu_specs=o.gpu, cpu_only=o.cpu_only)
    info = model if model is not None else load_model(model_path)

    def calib(s: LoadSettings, devices: tuple[str, ...]) -> Corrections:
        return corrections(info, s, devices)

    projector = read_projector(req.mmproj) if req.mmproj else None
    plan = make_plan(
        info, mach, req, opts, caps, calib if o.calibrate else None, mmproj=projector,
        mmproj_measured=measured_mmproj_compute if o.calibrate else None,
    )  # fmt: skip
    planned, dropped = supported(plan.planned, caps)
    argv = compose(srv.path if srv else "llama-server", planned, user)
    notes = [*translated.notes, *dropped, *config_findings(os.environ, parse_server_args(argv[1:]))]
    if extra_notes:
        notes += extra_notes(user)
    return Prepared(plan, argv, user, srv, caps, tuple(notes))


def launch_env(srv: ServerBinary) -> ChildEnv:
    """The server's environment: ours without inherited llama.cpp settings, plus its library path."""
    return child_env(srv.env())
